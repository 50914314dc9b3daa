"""Checkpoints of tensor-parallel runs resume at another tp or dp degree, or refuse in one line.

The data-parallel degree is kept at 2 where the tp degree changes (the world changes with it), and
the global batch is kept where dp changes, so a resumed run reads the same samples as one that never
stopped and must end at its weights:

    written (world 4)                      resumed                                path
    full_shard, dp 2 x tp 2                full_shard, dp 1 x tp 2 (world 2)      FSDP's own shards, resharded over dp
    full_shard, dp 2 x tp 2                full_shard, tp 1 (world 2)             refused: shards per tp slice
    ddp, dp 2 x tp 2 (whole model.pt)      full_shard, dp 2 x tp 1 (world 2)      whole: the slices joined (q|k|v)
    ddp, dp 4 x tp 1 (whole model.pt)      full_shard, dp 2 x tp 2 (world 4)      whole: cut into tp slices, then shards
"""

import contextlib
import io

import pytest

import minidist
from minidist import runtime
from minidist.train import train
from minidist.train.checkpoint import CheckpointError
from tests.harness import compose_once

BASE = ["experiment=gpt_tiny", "trainer.eval_interval=0", "trainer.log_interval=2", "data.max_bytes=200000", "data.val_percent=4",
        "trainer.steps=4", "trainer.ckpt_interval=2"]
GLOBAL_BATCH = 8


def _run(out: str, name: str, strategy: str, tp: int, *extra: str, degree: str = "tp") -> dict:
    """train() at strategy.<degree>_size=tp (tp or cp: their ranks share each batch) on GLOBAL_BATCH rows."""
    topo = runtime.init("gloo")
    batch = GLOBAL_BATCH * tp // topo.world_size  # per data shard: the same global batch at any layout
    cfg = compose_once(BASE + [f"out_dir={out}", f"name={name}", f"strategy={strategy}",
                                 f"strategy.{degree}_size={tp}", f"trainer.batch_size={batch}", *extra])
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        result = train(cfg, topo)
    return result | {"log": log.getvalue()}


def _diff(a: dict, b: dict) -> float:
    return max((a["model_state"][k] - v).abs().max().item() for k, v in b["model_state"].items())


def _at_world_4(out: str) -> dict:
    ref = _run(out, "ref", "full_shard", 2)
    _run(out, "fsdp-tp2", "full_shard", 2, "trainer.steps=2")
    _run(out, "ddp-tp2", "ddp", 2, "trainer.steps=2")
    _run(out, "ddp-tp1", "ddp", 1, "trainer.steps=2")
    into_tp = _run(out, "ddp-tp1", "full_shard", 2, "resume=auto")
    main = runtime.init("gloo").rank == 0
    # its model.pt (written from the same full state dict) loads into the plain GPT whole: q|k|v joined
    saved = minidist.models.load(ref["run_dir"]).state_dict() if main else None
    return {"ref": ref["model_state"] if main else None, "whole -> tp2": _diff(into_tp, ref) if main else None,
            "log": into_tp["log"], "model.pt": _diff({"model_state": saved}, ref) if main else None}


def _at_world_2(out: str, ref: dict) -> dict:
    main = runtime.init("gloo").rank == 0
    got = {}
    for name, strategy, tp in (("fsdp-tp2", "full_shard", 2), ("ddp-tp2", "full_shard", 1)):
        r = _run(out, name, strategy, tp, "resume=auto")
        got[f"{name} -> tp{tp}"] = _diff(r, {"model_state": ref}) if main else None
    with pytest.raises(CheckpointError) as refused:
        _run(out, "fsdp-tp2", "full_shard", 1, "trainer.steps=6", "resume=auto")
    return got | {"refused": str(refused.value)}


def test_tp_checkpoints_resume_at_another_degree_or_refuse(run_dist, tmp_path):
    first = run_dist(4, _at_world_4, str(tmp_path), timeout=300)
    assert first[0]["whole -> tp2"] < 1e-5, first[0]["whole -> tp2"]
    assert first[0]["model.pt"] == 0.0, first[0]["model.pt"]  # full_shard over dp 2 x tp 2, as the recipe writes it
    assert "resumed from step 2" in first[0]["log"]
    second = run_dist(2, _at_world_2, str(tmp_path), first[0]["ref"], timeout=300)
    main = second[0]
    assert main["fsdp-tp2 -> tp2"] < 1e-5, main  # dp 2 -> 1 at tp 2: FSDP reshards each tp slice's shards
    assert main["ddp-tp2 -> tp1"] < 1e-5, main  # the whole model from tp slices, AdamW's moments too
    line = main["refused"]
    assert all(r["refused"] == line for r in second) and "\n" not in line
    assert "at strategy.tp_size=2, in shards per tensor-parallel slice; resume with strategy.tp_size=2" in line, line
