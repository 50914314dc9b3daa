"""Checkpoints resume across context parallelism, cp 2 -> cp 1 (its ranks become data parallel) and back,
and end at the weights of the run that never stopped.

cp holds no state of its own: its ranks hold the same weights, so a checkpoint holds the whole model
(ddp: model.pt) or shards over the engine's ranks, dp x cp ("dp0_cp1": full_shard's, zero2's optimizer
state), resharded by the engine at the other layout like any change of world. At 2 processes the global batch is kept (cp 2:
one data shard of 8 rows; cp 1: two of 4), so every layout reads the same samples:

    written (world 2)            resumed                  compared with
    ddp, cp 2 (2 steps)          ddp, cp 1 = dp 2         ddp at cp 2 for 4 steps, uninterrupted
    full_shard, cp 1 = dp 2      full_shard, cp 2         the same
    zero2, cp 2                  zero2, cp 1 = dp 2       the same
    hybrid_shard, cp 2           hybrid_shard, cp 1       the same (shards over shard x cp, then over shard)

SGD: cp and its absence differ by rounding, which AdamW's first steps scale up on near-zero gradients
(tests/cp/test_equivalence.py says why); the comparison is of the resumed weights, 1e-5. Each run is
tests/train/test_checkpoint_tp.py's (the same data and steps), at strategy.cp_size.
"""

from __future__ import annotations

import functools

from tests.train.test_checkpoint_tp import _run as run_at

SGD = ("optim=sgd", "optim.lr=0.3")
PATHS = [("ddp", 2, 1), ("full_shard", 1, 2), ("zero2", 2, 1), ("hybrid_shard", 2, 1)]
"""(strategy, cp written at, cp resumed at): the whole model out of cp, FSDP's shards into it, ZeRO's
optimizer shards (over dp x cp) out of it, hybrid FSDP's shards over ("replicate", "shard_cp") out of it."""
_run = functools.partial(run_at, degree="cp")


def _resume_across_cp(out: str) -> dict:
    ref = _run(out, "ref", "ddp", 2, *SGD)
    got = {}
    for strategy, written, resumed in PATHS:
        name = f"{strategy}-cp{written}"
        _run(out, name, strategy, written, *SGD, "trainer.steps=2")
        r = _run(out, name, strategy, resumed, *SGD, "resume=auto")
        if r.get("model_state") is not None:  # the main process
            diff = max((r["model_state"][k] - v).abs().max().item() for k, v in ref["model_state"].items())
            got[f"{name} -> cp{resumed}"] = (diff, r["log"])
    return got | {"ref loss": ref.get("val/loss")}


def test_checkpoints_resume_across_cp_at_the_uninterrupted_weights(run_dist, tmp_path):
    main = run_dist(2, _resume_across_cp, str(tmp_path), timeout=300)[0]
    assert len(main) == len(PATHS) + 1, main
    for path, (diff, log) in ((k, v) for k, v in main.items() if k != "ref loss"):
        assert diff < 1e-5, (path, diff)
        assert "resumed from step 2" in log, (path, log)
        assert ("(cp 2)" in log) and ("continuing as" in log), (path, log)  # the layout change is named
