"""The trainer with pipeline parallelism (strategy.pp_size): every layout ends at one process's model and loss,
and its checkpoints resume at another pp, dp or tp, or refuse in one line.

The global batch (8 sequences) and the seed are the same everywhere, so every run reads the same samples and
must end where one process (strategy=single) ends, after 4 steps of a 4-block GPT:

    world  run                                                    checks
    1      single                                                 the reference
    4      ddp, dp 2 x pp 2, gpipe, 2 micro-batches               weights, val loss, the logged train loss
    4      full_shard, tp 2 x pp 2, interleaved_1f1b (v 2)        the same (two FSDP engines per rank)
    4      ddp, dp 4, resumed from the first at step 2 (pp 2)     the whole model.pt assembled over pp
    4      full_shard, tp 2, pp 1, from the second's shards       refused in one line
    8      full_shard, dp 2 x tp 2 x pp 2, interleaved, resumed   FSDP's shards of each stage resharded
           from the second's shards (dp 1 -> 2) at step 2         over dp, the optimizer's too
"""

from __future__ import annotations

import contextlib
import io

import pytest

from minidist import runtime
from minidist.train import train
from minidist.train.checkpoint import CheckpointError
from minidist.train.metrics import read_metrics
from tests.harness import compose_once

BASE = ["experiment=gpt_tiny", "model.n_layer=4", "trainer.eval_interval=2", "trainer.eval_batches=2",
        "trainer.log_interval=2", "data.max_bytes=200000", "data.val_percent=4", "trainer.steps=4",
        "trainer.ckpt_interval=2", "trainer.sample_bytes=0"]
GLOBAL_BATCH = 8
INTERLEAVED = ("strategy.pp_schedule=interleaved_1f1b", "strategy.pp_virtual=2", "trainer.microbatches=2")


def _run(out: str, name: str, strategy: str, *, pp: int = 1, tp: int = 1, cp: int = 1, extra: tuple[str, ...] = (),
         base: list[str] = BASE) -> dict:
    """train() on every rank; the main process's whole model, validation loss, and the last logged row's loss,
    clipped norm and traffic (comm/*)."""
    topo = runtime.init("gloo")
    batch = GLOBAL_BATCH * pp * tp * cp // topo.world_size  # per data-parallel rank: the same global batch
    degrees = [f"strategy.{k}_size={n}" for k, n in (("pp", pp), ("tp", tp), ("cp", cp)) if n > 1]
    cfg = compose_once(base + [f"out_dir={out}", f"name={name}", f"strategy={strategy}", f"trainer.batch_size={batch}",
                                 *degrees, *extra])
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        result = train(cfg, topo)
    if "model_state" not in result:  # not the main process
        return {}
    last = [r for r in read_metrics(result["run_dir"] + "/metrics.jsonl") if "train/loss" in r][-1]
    return {"state": result["model_state"], "val": result["val/loss"], "loss": last["train/loss"],
            "norm": last.get("train/grad_norm"), "comm": {k: v for k, v in last.items() if k.startswith("comm/")},
            "log": log.getvalue()}


def _compared(got: dict, ref: dict) -> dict:
    if not got:
        return {}
    return {"weights": max((got["state"][k] - v).abs().max().item() for k, v in ref["state"].items()),
            "val": abs(got["val"] - ref["val"]), "loss": abs(got["loss"] - ref["loss"]), "log": got["log"]}


def _one_process(out: str) -> dict:
    return _run(out, "single", "single")


def _at_world_4(out: str, ref: dict) -> dict:
    dp_pp = _run(out, "ddp-pp2", "ddp", pp=2, extra=("strategy.pp_schedule=gpipe", "trainer.microbatches=2"))
    tp_pp = _run(out, "fsdp-tp2-pp2", "full_shard", pp=2, tp=2, extra=INTERLEAVED)
    resumed = _run(out, "from-pp2", "ddp", extra=(f"resume={out}/ddp-pp2/checkpoints/step_0000002",))
    with pytest.raises(CheckpointError) as refused:
        _run(out, "refused", "full_shard", tp=2, extra=(f"resume={out}/fsdp-tp2-pp2/checkpoints/step_0000002",))
    return {"dp2 x pp2": _compared(dp_pp, ref), "tp2 x pp2": _compared(tp_pp, ref),
            "pp2 -> dp4": _compared(resumed, ref), "refused": str(refused.value)}


def _at_world_8(out: str, ref: dict) -> dict:
    return _compared(_run(out, "from-tp2-pp2", "full_shard", pp=2, tp=2, extra=(
        *INTERLEAVED, f"resume={out}/fsdp-tp2-pp2/checkpoints/step_0000002")), ref)


def test_pipelined_runs_end_at_one_process_and_resume_across_pp(run_dist, tmp_path):
    ref = run_dist(1, _one_process, str(tmp_path), timeout=180)[0]
    ref = {k: ref[k] for k in ("state", "val", "loss")}
    four = run_dist(4, _at_world_4, str(tmp_path), ref, timeout=400)
    main = four[0]
    for run in ("dp2 x pp2", "tp2 x pp2", "pp2 -> dp4"):
        got = main[run]
        assert got["weights"] < 1e-5 and got["val"] < 1e-5 * ref["val"], (run, got)
        assert got["loss"] < 1e-5 * ref["loss"], (run, got)  # logged on the main process, a stage without the loss
    assert "resumed from step 2" in main["pp2 -> dp4"]["log"] and "(pp 2)" in main["pp2 -> dp4"]["log"]
    line = main["refused"]
    assert all(r["refused"] == line for r in four) and "\n" not in line
    assert "at strategy.pp_size=2, in shards per pipeline stage; resume with strategy.pp_size=2" in line, line
    eight = run_dist(8, _at_world_8, str(tmp_path), ref, timeout=400)[0]
    assert eight["weights"] < 1e-5 and eight["val"] < 1e-5 * ref["val"], eight
    assert "resumed from step 2" in eight["log"], eight["log"]
