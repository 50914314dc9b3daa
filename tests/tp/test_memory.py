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


def body_saved_inputs() -> dict[str, list[int]]:
    """Tokens in the activations the column-parallel layers (qkv, fc) save for backward, under TP and under SP."""
    import torch
    from minidist.tp import ColumnParallelLinear
    out = {}
    for name, plan in (("tp", {}), ("sp", dict(sequence_parallel=True))):
        _, model, cfg = models()
        model = parallel(model, **plan)
        (idx, y), = batches(1, batch=4, seq=16)
        saved, inside = [], []
        columns = [m for m in model.modules() if isinstance(m, ColumnParallelLinear)]
        hooks = [h for m in columns for h in (m.register_forward_pre_hook(lambda m, a: inside.append(m) and None),
                                              m.register_forward_hook(lambda m, a, o: inside.pop() and None))]

        def pack(t):
            if inside and t is not inside[-1].weight and t.shape[-1] == cfg["n_embd"]:  # the input, not the weight
                saved.append(t.numel() // cfg["n_embd"])   # tokens
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx, y)
        for h in hooks:
            h.remove()
        out[name] = saved
    return out


def test_sequence_parallel_keeps_the_gathered_input_of_each_column_parallel_layer(run_dist):
    """docs/tp.md: minidist's SP keeps the qkv's and fc's input whole (s b h each, 2 per layer), where Megatron
    keeps the chunk: what a column-parallel layer saves under SP is the all_gathered, whole sequence."""
    for shapes in run_dist(2, body_saved_inputs):
        assert shapes["sp"] == shapes["tp"] and len(shapes["sp"]) == 2 * 2, shapes  # 2 layers x (qkv, fc)
        assert all(tokens == 4 * 16 for tokens in shapes["sp"]), shapes  # the whole sequence, not 16 / N of it
