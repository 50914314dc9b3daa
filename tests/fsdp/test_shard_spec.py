"""The per-parameter layout (minidist.fsdp.shard_spec): every parameter sharded on its own along dim 0.

At world 2, 3 and 4 on a GPT whose sizes the worlds do not divide: named_parameters() keeps the
plain names; each rank's piece is exactly rows [r c, min((r + 1) c, R)) of the original
(c = ceil(R / N)) with its trailing dimensions; `p.shard_spec` says so (global shape, dtype,
mesh dimensions by name with torch placements, storage device). hybrid_shard reads its groups
from the mesh by dimension name, whatever their order; a mesh without those names is refused in
one line. CPU offload (CPUOffloadPolicy) trains bitwise like the same run without it, with
shards, gradients and optimizer state in host memory (storage and compute are both the CPU
here: the device copies it adds are exercised by checks/cuda_check.py on a GPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

from minidist.fsdp import FSDP, CPUOffloadPolicy
from minidist.mesh import DP, REPLICATE, SHARD
from minidist.models.gpt import Block
from tests.fsdp.helpers import fsdp2_args, loss_of, make_batches, make_model, max_diff, reference, train


def _pieces(model: FSDP) -> dict:
    return {name: (tuple(p.shape), p.detach().clone(), p.shard_spec) for name, p in model.module.named_parameters()}


def body_rows() -> dict:
    n, r = dist.get_world_size(), dist.get_rank()
    plain = dict(make_model("gpt").named_parameters())
    model = FSDP(make_model("gpt"), wrap={Block})
    out = {"names": sorted(n_ for n_, _ in model.module.named_parameters()) == sorted(plain), "bad": []}
    for name, (shape, value, spec) in _pieces(model).items():
        full = plain[name]
        c = -(-full.shape[0] // n)
        start, end = min(r * c, full.shape[0]), min((r + 1) * c, full.shape[0])
        if (shape != (end - start, *full.shape[1:]) or not torch.equal(value, full.detach()[start:end])
                or spec.global_shape != full.shape or spec.dtype != full.dtype or spec.fqn != name
                or spec.mesh_dims != (DP,) or spec.placements != (Shard(0),)
                or spec.storage_device != torch.device("cpu") or spec.row_range() != (start, end)):
            out["bad"].append((name, shape, tuple(full.shape), spec))
    return out


def test_each_rank_holds_dim0_rows(run_dist):
    for world in (2, 3, 4):
        for r in run_dist(world, body_rows):
            assert r["names"] and not r["bad"], (world, r)


def body_mesh_by_name() -> dict:
    # (shard, replicate) instead of hybrid_mesh's (replicate, shard): the names decide, not the order
    swapped = init_device_mesh("cpu", (2, 2), mesh_dim_names=(SHARD, REPLICATE))
    model = FSDP(make_model("gpt"), wrap={Block}, mesh=swapped)
    shard_ranks = sorted(dist.get_process_group_ranks(model.mesh_info.shard_group))
    spec = next(model.parameters()).shard_spec
    train("gpt", model, make_batches("gpt"), shard=True)
    out = {"shard_ranks": shard_ranks, "expected": sorted(dist.get_process_group_ranks(swapped[SHARD].get_group())),
           "dims": (spec.mesh_dims, spec.placements),
           "diff": max_diff(model.full_state_dict(rank0_only=False), reference("gpt", 4))}
    try:
        FSDP(make_model("gpt"), mesh=init_device_mesh("cpu", (2, 2)))
        out["unnamed"] = "no error"
    except ValueError as e:
        out["unnamed"] = str(e)
    return out


def test_hybrid_reads_the_mesh_by_name(run_dist):
    for r in run_dist(4, body_mesh_by_name):
        assert r["shard_ranks"] == r["expected"], r
        assert r["dims"] == ((REPLICATE, SHARD), (Replicate(), Shard(0))), r["dims"]
        assert r["diff"] < 1e-6, r
        assert REPLICATE in r["unnamed"] and SHARD in r["unnamed"] and "\n" not in r["unnamed"], r


def body_offload() -> dict:
    out = {}
    for strategy in ("full_shard", "no_shard"):
        runs = {}
        for offload in (None, CPUOffloadPolicy()):
            model = FSDP(make_model("gpt"), wrap={Block}, offload_policy=offload, **fsdp2_args(strategy))
            opt = train("gpt", model, make_batches("gpt"), shard=True)
            loss_of("gpt", model, *make_batches("gpt")[0]).backward()  # leave gradients to inspect
            runs[offload is not None] = model
            if offload is not None:
                tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()] + \
                          [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
                out[strategy, "devices"] = {t.device.type for t in tensors}
                out[strategy, "storage"] = {p.shard_spec.storage_device.type for p in model.parameters()}
        out[strategy] = max_diff(runs[True].full_state_dict(rank0_only=False), runs[False].full_state_dict(rank0_only=False))
    return out


def test_cpu_offload_trains_alike(run_dist):
    for r in run_dist(2, body_offload):
        for strategy in ("full_shard", "no_shard"):
            assert r[strategy] == 0.0, r
            assert r[strategy, "devices"] == {"cpu"} and r[strategy, "storage"] == {"cpu"}, r
