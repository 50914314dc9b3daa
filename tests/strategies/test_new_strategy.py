"""A new strategy registered in one place trains, compares, estimates and projects, with no other edit.

The strategy: DDP whose gradient buckets travel in bfloat16 (minidist.ddp.comm_hooks.bf16_compress_hook),
`ddp_bf16`. Everything about it is the record below (DDP's, with its own schema, formula and plan);
nothing in minidist, configs/ or recipes/ names it. Registered, it is a choice of the strategy group
(strategy=ddp_bf16, trained at world 2 in the pool), a row of the comparison (its bytes as the kernel
counted them: half DDP's), a row of `--estimate` and of the projection.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from minidist import strategies
from minidist.strategies import ddp
from minidist.strategies.ddp import DDPStrategy

NAME = "ddp_bf16"


@dataclass
class DDPBf16Strategy(DDPStrategy):
    """minidist.DDP with the bf16 compression hook: the mean of the gradients all-reduced in bfloat16."""

    name: str = NAME
    """Strategy name (set by the preset; do not override)."""
    comm_hook: Optional[str] = "minidist.ddp.comm_hooks:bf16_compress_hook"
    """'module:function' of the DDP communication hook: bf16, half the bytes."""


def _bf16_all_reduces(shape, wire, world, group, grad_clip):
    """DDP's bucket all_reduces, 2 bytes per element: S (N-1)/N per rank, S the fp32 gradients' bytes."""
    return ddp.bucket_all_reduces(shape, dataclasses.replace(wire, itemsize=2), world)


DDP_BF16 = dataclasses.replace(
    strategies.get("ddp"), name=NAME, summary="nothing; gradients sent in bf16",
    engine="minidist.DDP over \"dp\", bf16_compress_hook", schema=DDPBf16Strategy, closed_form="S(N-1)/N",
    collectives=_bf16_all_reduces, default_rows=())
"""The one place: register(DDP_BF16) and the strategy exists."""


@pytest.fixture
def registered():
    strategies.register(DDP_BF16)
    yield DDP_BF16
    strategies.unregister(NAME)


def on_a_worker(body: str, *args):
    """Run `body` (a function of this module, by name) on a pool worker with the strategy registered there
    too, and gone afterwards (the pool's workers live on)."""
    strategies.register(DDP_BF16)
    try:
        return globals()[body](*args)
    finally:
        strategies.unregister(NAME)


TRAIN = ["experiment=gpt_tiny", "trainer.steps=8", "trainer.eval_interval=0", "trainer.log_interval=4",
         "data.max_bytes=200000"]
COMPARE = ["model.n_layer=4", "model.n_embd=64", "model.n_head=2", "model.block_size=32", "data=synthetic",
           "data.train_samples=512", "data.val_samples=8", "trainer.batch_size=32", "warmup_steps=2", "steps=2",
           "replay_repeats=2", "memory=false", f"strategies=[ddp,{NAME}]"]


def _train(out: str) -> dict:
    from minidist import runtime
    from minidist.train import train
    from minidist.train.metrics import read_metrics
    from tests.harness import compose_once

    topo, got = runtime.init("gloo"), {}
    for name in ("ddp", NAME):
        r = train(compose_once(TRAIN + [f"strategy={name}", f"out_dir={out}", f"name={name}"]), topo)
        if topo.is_main:
            rows = read_metrics(Path(r["run_dir"]) / "metrics.jsonl")
            got[name] = (r["val/loss"], [row["train/loss"] for row in rows if "train/loss" in row])
    return got


def _measure(overrides: list[str]) -> list[dict]:
    from minidist import runtime
    from minidist.compare.rows import row_strategy
    from minidist.compare.measure import measure_strategy
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    cfg, topo = compose(overrides), runtime.init("gloo")
    train_ds, t0 = build_datasets(cfg, topo)[0], time.perf_counter()
    return [measure_strategy(cfg, row_strategy(cfg, s), topo, train_ds, t0, s) for s in cfg.strategies]


def test_it_trains_at_world_2(run_dist, tmp_path, registered):
    got = run_dist(2, on_a_worker, "_train", str(tmp_path), timeout=240)[0]
    (val, losses), (ddp_val, _) = got[NAME], got["ddp"]
    assert losses[-1] < 0.9 * losses[0], losses
    assert abs(val - ddp_val) < 0.02, (val, ddp_val)  # DDP's training, its mean rounded to bf16 on the wire


def test_it_compares_estimates_and_projects(run_dist, tmp_path, registered, capsys):
    from minidist.comm import CostModel, kernel_io
    from minidist.compare.run import estimate_table, report
    from recipes.compare import compose

    cfg = compose(COMPARE, world=(2, 2))
    per_rank = run_dist(2, on_a_worker, "_measure", COMPARE, timeout=300)
    result = report(cfg, tmp_path, [list(raws) for raws in zip(*per_rank)], CostModel(1e-4, 1e-9))
    rows = {r["strategy"]: r for r in result["rows"]}
    mine, ref = rows[NAME]["bytes"], rows["ddp"]["bytes"]
    assert mine["trace"] == pytest.approx(mine["formula"]) and rows[NAME]["closed_form"] == "S(N-1)/N"
    assert mine["trace"] == pytest.approx(ref["trace"] / 2, rel=1e-3)  # half DDP's payload
    if kernel_io.available():  # what the kernel saw each process write
        assert abs(mine["kernel"] / mine["trace"] - 1) <= 0.01, (mine["kernel"], mine["trace"])
        assert mine["kernel"] / ref["kernel"] == pytest.approx(0.5, rel=0.02)
    assert NAME in capsys.readouterr().out

    proj = {(r["model"], r["cluster"], r["strategy"], r["ranks"]): r for r in result["projection"]}
    big = [k for k in proj if k[2] == NAME and proj[k]["memory_GB"] is not None]
    assert big, "no projection row"
    for model, cluster, _, n in big:  # the same states as DDP's; at the projection's bf16, DDP's gradients are
        theirs = proj[model, cluster, "ddp", n]  # bf16 already: the hook sends what DDP sends
        assert proj[model, cluster, NAME, n]["memory_GB"] == theirs["memory_GB"]
        assert proj[model, cluster, NAME, n]["comm_s"] == pytest.approx(theirs["comm_s"])
    here = [k for k in proj if k[2] == NAME and "this machine" in k[0]]  # the measured fp32 model: half the bytes
    assert here and all(proj[k]["comm_s"] < proj[k[0], k[1], "ddp", k[3]]["comm_s"] for k in here)

    small = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=8", "trainer.batch_size=2",
             "estimate.worlds=[1,2]", f"strategies=[ddp,{NAME}]"]
    lines = {line.split()[0]: line for line in estimate_table(compose(small, estimate=True)).splitlines()[2:]}
    states = lambda name: [cell.split("]")[0] for cell in lines[name].split("[")[1:]]  # noqa: E731
    assert states(NAME) == states("ddp")  # the model states are DDP's; the peak adds the hook's bucket copies
