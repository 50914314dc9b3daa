"""What is split where: the global gradient norm over any layout, and the whole model from its slices.

The norm tests shard parameters by hand, mixing every kind of declaration in one model: each rank
holds a slice of a seeded whole tensor and declares it (minidist.sharding.shard_param), exactly
what a tensor-parallel layer does. The references are whole tensors on one process.
"""

import math

import torch
import torch.nn as nn

from minidist import runtime, strategies
from minidist.mesh import DP, TP, ParallelDims
from minidist.sharding import Split, cut, join, shard_param, sharded_over
from minidist.models import Block
from minidist.parallel.parallelize import build_layout, build_optimizer, clip_grad_norm_, parallelize, unwrap
from minidist import clip
from tests.harness import compose_once

WHOLE = {"col": (6, 5), "row": (4, 6), "norm": (5,), "both": (8, 3)}
"""A column-parallel weight (split over tp along dim 0), a row-parallel one (dim 1), a replicated
norm, and a parameter split over tp (dim 0) and then over dp as a 1-D shard (FSDP on top of TP)."""


def _whole(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*shape, generator=g) for k, shape in WHOLE.items()}


def _hand_sharded(layout) -> nn.ParameterDict:
    """This rank's slices of _whole(), as parameters whose gradients are the same slices of _whole(1)."""
    tp, dp = layout.coordinate.get(TP, 0), layout.coordinate.get(DP, 0)
    n_tp, n_dp = layout.size(TP), layout.size(DP)

    def cut(t: dict) -> dict:
        both = t["both"].chunk(n_tp, 0)[tp].reshape(-1)
        return {"col": t["col"].chunk(n_tp, 0)[tp], "row": t["row"].chunk(n_tp, 1)[tp], "norm": t["norm"],
                "both": both.chunk(n_dp)[dp]}
    params = nn.ParameterDict({k: nn.Parameter(v.clone()) for k, v in cut(_whole(0)).items()})
    for k, g in cut(_whole(1)).items():
        params[k].grad = g.clone()
    shard_param(params["col"], TP, 0)
    shard_param(params["row"], TP, 1)
    shard_param(shard_param(params["both"], TP, 0), DP, None)
    return params


def global_norm(params, layout, norm_type=2.0):
    return clip.global_norm(clip.norm_groups((p, p.grad) for p in params), layout, layout.device, norm_type)


def _norms() -> dict:
    runtime.init("gloo")
    layout = ParallelDims.infer(4, tp=2).build("cpu")  # dp 2 x tp 2
    params = _hand_sharded(layout)
    out = {"l2": global_norm(list(params.values()), layout).item(),
           "inf": global_norm(list(params.values()), layout, math.inf).item()}
    before = {k: p.grad.clone() for k, p in params.items()}
    out["returned"] = clip_grad_norm_(params, 1.0, layout, strategy=strategies.get("single")).item()
    out["after"] = global_norm(list(params.values()), layout).item()
    out["scale"] = [(p.grad / before[k]).flatten().tolist() for k, p in params.items() if p.grad.numel()]
    return out


def test_norm_sums_slices_over_their_dimensions_and_replicas_once(run_dist):
    grads = torch.cat([g.flatten() for g in _whole(1).values()])
    want_l2, want_inf = grads.norm().item(), grads.abs().max().item()
    for got in run_dist(4, _norms):
        assert math.isclose(got["l2"], want_l2, rel_tol=1e-6), (got["l2"], want_l2)
        assert got["inf"] == want_inf
        assert math.isclose(got["returned"], want_l2, rel_tol=1e-6)
        assert math.isclose(got["after"], 1.0, rel_tol=1e-5)  # clipped to max_norm, over the whole model
        scale = [s for per_param in got["scale"] for s in per_param]
        assert max(scale) - min(scale) < 1e-6 and math.isclose(scale[0], 1.0 / want_l2, rel_tol=1e-5)


STRATEGIES = {"ddp": [], "zero1": [], "full_shard": [], "no_shard": [],
              "hybrid_shard": ["strategy.shard_size=2"]}


def _engine_norms() -> dict:
    """Each strategy's clip_grad_norm_ after one backward on this rank's quarter of a global batch."""
    topo = runtime.init("gloo")
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 256, (8, 17), generator=g)
    x, y = idx[:, :-1], idx[:, 1:]
    out = {}
    for name, extra in STRATEGIES.items():
        cfg = compose_once(["experiment=gpt_tiny", f"strategy={name}", "model.block_size=16", *extra])
        torch.manual_seed(0)
        plain = _gpt(cfg)
        if name == "ddp":  # the reference: one process, the whole batch
            plain(x, y)[1].backward()
            out["one process"] = torch.nn.utils.get_total_norm([p.grad for p in plain.parameters()]).item()
        layout = build_layout(cfg.strategy, topo)
        torch.manual_seed(0)
        model = parallelize(_gpt(cfg), layout, cfg.strategy, (Block,))
        opt = build_optimizer(model, layout, cfg.strategy, cfg.optim)  # ZeRO's hooks and partitions live here
        r = slice(2 * layout.dp_rank, 2 * layout.dp_rank + 2)
        model(x[r], y[r])[1].backward()
        record = strategies.get(name)
        out[name] = clip_grad_norm_(model, 1e9, layout, opt, strategy=record).item()
        out[name + " sharded"] = sorted({tuple(getattr(p, "sharded_over", {}))
                                         for p in unwrap(model, record).parameters()})
    return out


def _gpt(cfg):
    from minidist.train.task import make_task
    return make_task(cfg.model).build()[0]


def test_every_strategy_clips_the_whole_models_norm(run_dist):
    for got in run_dist(4, _engine_norms):
        for name in STRATEGIES:
            assert math.isclose(got[name], got["one process"], rel_tol=1e-5), (name, got[name], got["one process"])
        assert got["full_shard sharded"] == [("dp",)] and got["hybrid_shard sharded"] == [("shard",)]
        assert got["ddp sharded"] == [()] and got["no_shard sharded"] == [()]


def _fsdp_declarations() -> dict:
    from minidist import FSDP
    from minidist.mesh import data_parallel_mesh, hybrid_mesh
    topo = runtime.init("gloo")
    out = {}
    for strategy, mesh in (("full_shard", data_parallel_mesh(topo)), ("no_shard", hybrid_mesh(topo, shard=1))):
        net = nn.Linear(4, 4)
        shard_param(net.weight, TP, 0)  # a tensor-parallel slice, declared before wrapping
        model = FSDP(net, mesh=mesh)
        out[strategy] = {n: sharded_over(p) for n, p in model.module.named_parameters()}
    model(torch.ones(2, 4)).sum().backward()
    try:  # FSDP's own clip sums over its shard group only: it cannot be right for a tp slice
        model.clip_grad_norm_(1.0)
    except ValueError as exc:
        out["clip"] = str(exc)
    return out


def test_fsdp_keeps_a_declaration_on_the_parameters_it_makes_and_adds_its_own(run_dist):
    got = run_dist(2, _fsdp_declarations)[0]
    assert got["full_shard"] == {"weight": {TP: Split(0), DP: Split(0)}, "bias": {DP: Split(0)}}
    assert got["no_shard"] == {"weight": {TP: Split(0)}, "bias": {}}  # replicas split nothing
    assert "also split over ['tp']: use minidist.parallel.parallelize.clip_grad_norm_" in got["clip"]


def test_a_fused_qkv_slice_is_joined_block_by_block():
    """q | k | v split over 2 ranks: rank r holds q_r | k_r | v_r; joining end to end would mix them."""
    whole = torch.arange(12.0).view(6, 2)  # q rows 0-1, k rows 2-3, v rows 4-5
    qkv = Split(0, parts=3)
    slices = [cut(whole, qkv, r, 2) for r in range(2)]
    assert slices[0][:, 0].tolist() == [0.0, 4.0, 8.0]  # q's, k's and v's first row
    assert torch.equal(join(slices, qkv), whole)
