"""Sequence parallelism divides the activation memory of the norms and dropouts by tp, measured by
torch's profiler (profile_memory: bytes each operator allocated), not by minidist.

Without SP every tp rank keeps the whole (b, s, h) input and statistics of each layer norm
and the whole output and mask of each dropout between TP regions, as one process does;
with SP each keeps its 1/tp of the sequence. The attention's own dropout (inside the heads)
is left out: TP already splits it by heads, SP does not change it.
"""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerActivity, profile, record_function

from tests.tp.helpers import batches, models, parallel

DROPOUT = 0.1  # so that the dropouts allocate masks


def _forward_memory(model) -> dict[str, int]:
    """Bytes allocated in one training forward: by top-level layer norms, by top-level dropouts, in all (net)."""
    (idx, y), = batches(1, batch=4, seq=16)
    model.train()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            out = model(idx, y)  # kept: the graph, and the activations it saved, live on
    del out
    forward = next(e for e in prof.events() if e.name == "forward")
    by_name = lambda name: sum(e.cpu_memory_usage for e in forward.cpu_children if e.name == name)  # noqa: E731
    return {"layer_norm": by_name("aten::layer_norm"), "dropout": by_name("aten::dropout"),
            "net": forward.cpu_memory_usage}  # allocated less freed: what the forward leaves alive


def body_memory() -> dict[str, dict[str, int]]:
    out = {}
    for name, plan in (("plain", None), ("tp", {}), ("sp", dict(sequence_parallel=True))):
        ref, model, _ = models(dropout=DROPOUT)
        out[name] = _forward_memory(ref if plan is None else parallel(model, **plan))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_divides_norm_and_dropout_memory(run_dist, world):
    for rank, m in enumerate(run_dist(world, body_memory)):
        plain, tp, sp = m["plain"], m["tp"], m["sp"]
        assert plain["layer_norm"] > 0 and plain["dropout"] > 0, m
        for what in ("layer_norm", "dropout"):
            assert tp[what] == plain[what], (rank, what, m)  # TP alone: replicated, as one process
            assert sp[what] * world == plain[what], (rank, what, m)  # SP: 1/tp of the sequence
        assert sp["net"] < tp["net"] < plain["net"], (rank, m)
    print(f"tp={world}: forward bytes {m}")
