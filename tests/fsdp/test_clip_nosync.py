"""clip_grad_norm_ returns and applies the global norm of the unsharded gradients; no_sync
accumulates locally (no reduction) and the synced backward reduces the sum."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm
from minidist import runtime
from minidist.fsdp import FSDP
from minidist.mesh import hybrid_mesh
from tests.common import rank_slice
from tests.fsdp.helpers import WRAPS, fsdp2_args, loss_of, make_batches, make_model, make_opt, max_diff, reference, train


def _ref_grads(kind: str, x, y, world: int, micro: int = 1):
    model = make_model(kind)
    for m in range(micro):
        xm, ym = x.chunk(micro)[m], y.chunk(micro)[m]
        for r in range(world):
            loss_of(kind, model, rank_slice(xm, r, world), rank_slice(ym, r, world)).backward()
    return model, [p.grad / world for p in model.parameters() if p.grad is not None]


def _norm_case(kind: str, norm_type: float, **kw) -> tuple[float, float]:
    world = dist.get_world_size()
    model = FSDP(make_model(kind), wrap=WRAPS[kind], **kw)
    x, y = make_batches(kind, steps=1)[0]
    loss_of(kind, model, rank_slice(x), rank_slice(y)).backward()
    ours = model.clip_grad_norm_(1e-3, norm_type).item()
    _, grads = _ref_grads(kind, x, y, world)
    ref = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]),
                                   norm_type).item()
    return ours, ref


def _args(strategy: str) -> dict:
    if strategy == "hybrid_shard":
        return {"mesh": hybrid_mesh(runtime.init("gloo"), shard=2)}
    return fsdp2_args(strategy)


def body_clip(strategies: list[str]) -> dict:
    out = {}
    for i, kw in enumerate(map(_args, strategies)):
        for kind in ("mlp", "tied"):
            for norm_type in (2.0, float("inf")):
                out[(i, kind, norm_type)] = _norm_case(kind, norm_type, **kw)
    # clipped training == clipped reference (the scaling is applied, with the global norm)
    model = FSDP(make_model("gpt"), wrap=WRAPS["gpt"], **_args(strategies[0]))
    train("gpt", model, make_batches("gpt"), shard=True, clip=0.05)
    out["train"] = max_diff(model.full_state_dict(rank0_only=False), reference("gpt", dist.get_world_size(), clip=0.05))
    return out


def _check_clip(results):
    for per_rank in results:
        assert per_rank.pop("train") < 1e-6
        for cfg, (ours, ref) in per_rank.items():
            assert abs(ours - ref) <= 1e-5 * ref, (cfg, ours, ref)


def test_clip_world2(run_dist):
    _check_clip(run_dist(2, body_clip, ["full_shard", "no_shard"]))


def test_clip_hybrid_world4(run_dist):
    _check_clip(run_dist(4, body_clip, ["hybrid_shard"]))


def body_no_sync(strategy: str) -> dict:
    kind, world = "gpt", dist.get_world_size()
    model = FSDP(make_model(kind), wrap=WRAPS[kind], **fsdp2_args(strategy))
    opt = make_opt(model.parameters())
    x, y = make_batches(kind, steps=1)[0]
    xs, ys = rank_slice(x).chunk(2), rank_slice(y).chunk(2)
    with comm.trace() as tr:
        with model.no_sync():
            loss_of(kind, model, xs[0], ys[0]).backward()
    during_no_sync = {r.op for r in tr.records}
    assert all(p.grad is None for p in model.parameters()), "no_sync must not produce sharded grads"
    loss_of(kind, model, xs[1], ys[1]).backward()
    opt.step()
    # reference: rank r's two micro-batches are rank_slice(chunk m) of a re-ordered batch
    ref = make_model(kind)
    for m in range(2):
        for r in range(world):
            xr, yr = rank_slice(x, r, world).chunk(2)[m], rank_slice(y, r, world).chunk(2)[m]
            loss_of(kind, ref, xr, yr).backward()
    for p in ref.parameters():
        p.grad.div_(world)
    make_opt(ref.parameters()).step()
    return {"diff": max_diff(model.full_state_dict(rank0_only=False), ref.state_dict()),
            "ops": during_no_sync}


def test_no_sync_accumulates(run_dist):
    for strategy in ("full_shard", "no_shard"):
        for r in run_dist(2, body_no_sync, strategy):
            assert r["diff"] < 1e-6, (strategy, r)
            assert "reduce_scatter" not in r["ops"] and "all_reduce" not in r["ops"], (strategy, r)
