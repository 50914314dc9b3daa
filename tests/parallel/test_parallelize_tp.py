"""Tensor parallelism inside every data-parallel engine, on a dp 2 x tp 2 mesh (world 4): K steps equal
one process on the whole batch (losses, clipped global gradient norms and the whole model after the
steps, fp32, 1e-5), built exactly as the recipes build them (build_layout, parallelize, build_optimizer,
clip_grad_norm_, full_state_dict). Each data-parallel rank reads its half of the batch, both tp ranks of
it the same half. The clip threshold is below the norm, so a norm summed over the wrong ranks changes
every update. SGD with momentum (sharded like any optimizer state): AdamW's first steps divide each
gradient element by its own magnitude, which turns the last bits of a near-zero gradient into 1e-4 of
an update, a property of Adam, not of the parallelism."""

from __future__ import annotations

import pytest
import torch

from minidist import runtime, strategies
from minidist.mesh import TP
from minidist.models import Block
from minidist.parallel.parallelize import (build_layout, build_optimizer, clip_grad_norm_, full_state_dict,
                                        local_batch, optimizer_class, parallelize)
from minidist.train.data import IGNORE
from minidist.train.task import make_task
from tests.harness import compose_once

STEPS, ROWS, MAX_NORM = 3, 4, 0.5
MODEL = ["experiment=gpt_tiny", "model.block_size=16", "model.vocab_size=64", "optim=sgd", "optim.lr=0.5"]
CASES = {  # the engines, and TP's options spread over them so that each runs once under some engine
    "ddp": [],
    "zero1 +sp +vocab": ["strategy.sequence_parallel=true", "strategy.vocab_parallel=true"],
    "full_shard +sp +checkpointing": ["strategy.sequence_parallel=true", "model.activation_checkpointing=true"],
    "zero2": [],
    "zero1_broadcast +vocab": ["strategy.vocab_parallel=true"],
    "shard_grad_op": [],
    "no_shard": [],
    "hybrid_shard (replicate 2 x shard 1 x tp 2)": ["strategy.shard_size=1"],
}


def _batches():
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 64, (STEPS, ROWS, 17), generator=g)
    targets = idx[..., 1:].clone()
    targets[..., :3] = IGNORE  # scored by nobody (strided validation windows): the vocabulary-parallel loss too
    return idx[..., :-1], targets


def _reference() -> dict:
    """One process, the whole batch: the plain GPT, torch's clip_grad_norm_, the same optimizer."""
    cfg = compose_once(MODEL)
    torch.manual_seed(0)
    model = make_task(cfg.model).build()[0]
    cls, kwargs = optimizer_class(cfg.optim)
    opt = cls(model.parameters(), **kwargs)
    xs, ys = _batches()
    losses, norms = [], []
    for x, y in zip(xs, ys):
        loss = model(x, y)[1]
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms, "state": model.state_dict()}


def _run(case: str, extra: list[str], topo, degrees: tuple[str, ...] = ("strategy.tp_size=2",)) -> dict:
    """The case as the trainer builds it; each rank its data shard's rows, (under cp) its tokens of them."""
    strategy = case.split()[0]
    cfg = compose_once(MODEL + [f"strategy={strategy}", *degrees, *extra])
    layout = build_layout(cfg.strategy, topo)
    torch.manual_seed(0)
    model = parallelize(make_task(cfg.model).build()[0], layout, cfg.strategy, (Block,))
    opt = build_optimizer(model, layout, cfg.strategy, cfg.optim)
    xs, ys = _batches()
    rows = slice(layout.dp_rank * ROWS // layout.dp_size, (layout.dp_rank + 1) * ROWS // layout.dp_size)
    losses, norms = [], []
    for x, y in zip(xs, ys):
        loss = model(*local_batch([x[rows], y[rows]], layout, cfg.strategy))[1]
        loss.backward()
        norms.append(clip_grad_norm_(model, MAX_NORM, layout, opt, strategy=strategies.get(strategy)).item())
        opt.step()
        opt.zero_grad()
        losses.append(layout.all_reduce(loss.detach().clone()).item() / layout.dp_size)
    if hasattr(opt, "wait_for_params"):
        opt.wait_for_params()
    whole = full_state_dict(model, layout, strategies.get(strategy))
    return {"mesh": dict(zip(layout.names, layout.mesh.shape)), "losses": losses, "norms": norms,
            "whole": whole, "tp_sliced": sum(TP in getattr(p, "sharded_over", {}) for p in model.parameters()),
            "split_over": sorted({d for p in model.parameters() for d in getattr(p, "sharded_over", {})}),
            "modules": {type(m).__name__ for m in model.modules()}}


def _compose_and_train(cases: dict | None = None, degrees: tuple[str, ...] = ("strategy.tp_size=2",)) -> dict:
    """Every case (default: CASES) against one reference, in one pooled world."""
    topo = runtime.init("gloo")
    ref = _reference()
    out = {}
    for case, extra in (cases or CASES).items():
        got = _run(case, extra, topo, degrees)
        whole = got.pop("whole")
        got["state_diff"] = max((whole[k] - v).abs().max().item() for k, v in ref["state"].items()) if whole else None
        got["state_keys"] = sorted(whole) == sorted(ref["state"]) if whole else None
        out[case] = got
    return out | {"reference": {k: v for k, v in ref.items() if k != "state"}}


@pytest.fixture(scope="module")
def composed(_pools):
    return _pools.run(4, _compose_and_train, timeout=400)


def assert_equals_one_process(composed: list, case: str) -> dict:
    """Every rank's losses and clipped norms, and the main process's whole model, are the reference's; the
    main process's result."""
    ref = composed[0]["reference"]
    for rank, per_rank in enumerate(composed):
        got = per_rank[case]
        for name in ("losses", "norms"):
            for step, (a, b) in enumerate(zip(got[name], ref[name])):
                assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (case, rank, name, step, a, b)
    main = composed[0][case]
    assert main["state_keys"] and main["state_diff"] <= 1e-5, (case, main["state_diff"])
    assert all(r[case]["state_diff"] is None for r in composed[1:])  # the whole model on the main process only
    assert ref["norms"][0] > MAX_NORM  # the clip was active
    return main


@pytest.mark.parametrize("case", list(CASES))
def test_tp_inside_each_engine_equals_one_process(composed, case):
    assert all(per_rank[case]["tp_sliced"] > 0 for per_rank in composed), "the model was not split"
    main = assert_equals_one_process(composed, case)
    hsdp = case.split()[0] in ("hybrid_shard", "no_shard")  # FSDP2's 2-D mesh, shards of one rank
    shape = {"replicate": 2, "shard": 1, "tp": 2} if hsdp else {"dp": 2, "tp": 2}
    assert main["mesh"] == shape
