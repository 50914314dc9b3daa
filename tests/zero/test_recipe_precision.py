"""The recipes' trainer.precision sets the engines' dtypes (not autocast alone): parameters and reductions
in bf16/fp16 for DDP, ZeRO and FSDP, fp32 masters; an fp16 ZeRO-2 run trains with loss scaling, checkpoints
the scaler, and resumes from it."""

from pathlib import Path

import torch

from minidist import runtime
from minidist.train import train
from minidist.train.checkpoint import load_file
from minidist.parallel.parallelize import build_layout, build_optimizer, parallelize, precision_policy
from minidist.train.task import make_task
from tests.harness import compose_once

TINY = ["experiment=gpt_tiny", "trainer.eval_interval=0", "trainer.log_interval=2", "data.max_bytes=200000",
        "trainer.sample_bytes=0", "logger.mode=disabled", "trainer.progress_bar=false"]


def _engines() -> dict:
    topo = runtime.init("gloo")
    out = {}
    for strategy, precision, extra in (("ddp", "fp16", []), ("zero2", "bf16", []), ("zero1", "bf16", ["strategy.reduce_dtype=fp32"]),
                                       ("full_shard", "bf16", [])):
        cfg = compose_once(TINY + [f"strategy={strategy}", f"trainer.precision={precision}"] + extra)
        layout = build_layout(cfg.strategy, topo)
        policy = precision_policy(cfg.trainer, cfg.strategy)
        model, blocks = make_task(cfg.model).build()
        model = parallelize(model, layout, cfg.strategy, blocks, policy)
        opt = build_optimizer(model, layout, cfg.strategy, cfg.optim, policy)
        if strategy == "ddp":
            got = (model.mixed.param_dtype, model.reducer.reduce_dtype, {p.dtype for p in model.parameters()})
        elif strategy.startswith("zero"):
            got = ({p.dtype for p in model.parameters()}, {b.reduce_dtype for b in opt.engine.buckets},
                   {t.dtype for g in opt.param_groups for t in g["params"]})
        else:
            got = (policy.param_dtype, policy.reduce_dtype)
        out[strategy] = got
    return out


def test_precision_sets_the_engines_dtypes(run_dist):
    r = run_dist(2, _engines)[0]
    assert r["ddp"] == (torch.float16, torch.float16, {torch.float32}), "fp16 copies and reduction, fp32 masters"
    assert r["zero2"] == ({torch.bfloat16}, {torch.bfloat16}, {torch.float32})
    assert r["zero1"] == ({torch.bfloat16}, {torch.float32}, {torch.float32}), "strategy.reduce_dtype wins"
    assert r["full_shard"] == (torch.bfloat16, None)


def _fp16_run(out: str) -> dict:
    base = TINY + [f"out_dir={out}", "name=fp16", "strategy=zero2", "trainer.precision=fp16", "trainer.ckpt_interval=4"]
    first = train(compose_once(base + ["trainer.steps=4"]), runtime.init("gloo"))
    ckpt = Path(first["run_dir"]) / "checkpoints" / "step_0000004"
    scaler = load_file(ckpt / "state_dp0.pt").get("scaler")
    rest = train(compose_once(base + ["trainer.steps=8", "resume=auto"]), runtime.init("gloo"))
    return {"scale": None if scaler is None else scaler["scale"], "loss": rest.get("val/loss"), "step": rest["step"]}


def test_fp16_zero2_trains_with_a_checkpointed_loss_scale(run_dist, tmp_path):
    for r in run_dist(2, _fp16_run, str(tmp_path), timeout=240):
        assert r["scale"] is not None and r["scale"] > 1, "the scaler's state is in the checkpoint"
        assert r["step"] == 8 and r["loss"] is not None and r["loss"] < 6, r
