"""Resume a run under another strategy (issue 20.3), at the recipe level at world 2: a whole
checkpoint into any strategy (the optimizer state included, cut into FSDP's shards), sharded
files into another sharded layout, and otherwise one line saying which strategy wrote the
checkpoint and how to go on."""

import contextlib
import io
from pathlib import Path

import pytest

from minidist import runtime
from minidist.train import train
from minidist.train.checkpoint import CheckpointError
from minidist.train.metrics import read_metrics
from tests.harness import compose_once

TINY = ["experiment=gpt_tiny", "trainer.eval_interval=0", "trainer.log_interval=2", "data.max_bytes=200000",
        "trainer.steps=8", "trainer.ckpt_interval=4", "trainer.batch_size=4"]


def _diff(a: dict, b: dict) -> float:
    return max((a["model_state"][k] - b["model_state"][k]).abs().max().item() for k in a["model_state"])


def _switches(out: str) -> dict:
    topo = runtime.init("gloo")
    base = TINY + [f"out_dir={out}"]

    def run(name: str, *extra: str) -> dict:
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            result = train(compose_once(base + [f"name={name}", *extra]), topo)
        return result | {"log": log.getvalue()}

    got = {}
    ddp = run("ddp-whole", "strategy=ddp")
    run("a", "strategy=ddp", "trainer.steps=4")
    got["ddp -> full_shard"] = run("a", "strategy=full_shard", "resume=auto")
    run("b", "strategy=full_shard", "trainer.steps=4")
    got["full_shard -> hybrid_shard"] = run("b", "strategy=hybrid_shard", "strategy.shard_size=1", "resume=auto")
    run("c", "strategy=zero1", "trainer.steps=4")
    got["zero1 -> ddp"] = run("c", "strategy=ddp", "resume=auto")
    metrics = Path(out) / "a" / "metrics.jsonl"
    marks = [r for r in read_metrics(metrics) if "layout" in r] if topo.rank == 0 else None  # curves.png's marker
    before = metrics.read_bytes() if topo.rank == 0 else None
    with pytest.raises(CheckpointError) as refused:  # run "a" now ends in a full_shard checkpoint
        run("a", "strategy=ddp", "trainer.steps=10", "resume=auto")
    out_ = {k: {"diff": _diff(v, ddp) if topo.rank == 0 else None, "log": v["log"], "step": v["step"]}
            for k, v in got.items()}
    return out_ | {"refused": str(refused.value), "untouched": metrics.read_bytes() == before if before else None,
                   "usage": isinstance(refused.value, runtime.UsageError), "marks": marks}


def test_resume_under_another_strategy(run_dist, tmp_path):
    ranks = run_dist(2, _switches, str(tmp_path), timeout=300)
    main = ranks[0]
    # whole -> sharded: weights and AdamW's moments cut into FSDP's shards; equal to never switching
    # (restarting the moments instead would differ by ~5e-2 here)
    assert main["ddp -> full_shard"]["diff"] < 1e-5, main["ddp -> full_shard"]
    log = main["ddp -> full_shard"]["log"]  # what changed, and the marker on the curves where it did
    assert "strategy.name: ddp in the run, full_shard now: continuing under the new strategy" in log, log
    assert "resumed from step 4" in log and "written by ddp at 2 ranks, continuing as full_shard at 2 ranks" in log
    assert main["marks"] == [{"step": 4, "layout": "full_shard at 2 ranks", "was": "ddp at 2 ranks"}], main["marks"]
    assert main["full_shard -> hybrid_shard"]["diff"] < 1e-5, main["full_shard -> hybrid_shard"]
    zero = main["zero1 -> ddp"]  # ZeRO-1's optimizer shards only its engine reads: weights on, optimizer afresh
    assert zero["step"] == 8 and "the optimizer state starts afresh: strategy=zero1 saved it in ZeRO-1's shards" \
        in zero["log"], zero["log"]
    line = main["refused"]  # a bad input (exit 64), the same on every rank
    assert all(r["refused"] == line and r["usage"] for r in ranks) and "\n" not in line
    assert "was written by strategy=full_shard, which keeps the model in per-rank shards only; strategy=ddp " \
        "needs the whole model: resume with one of shard_grad_op, full_shard, no_shard, hybrid_shard" in line, line
    assert main["untouched"]
