"""minidist FSDP == torch's fully_shard (FSDP2) on the same GPT, wrapped per Block, in every strategy.

    full_shard     fully_shard(mesh 1-D)
    shard_grad_op  fully_shard(mesh 1-D, reshard_after_forward=False)
    no_shard       fully_shard(mesh 2-D (N, 1)): HSDP with shards of one rank = replication
    hybrid_shard   fully_shard(mesh 2-D (2, 2)), world 4

fp32 to 1e-6; bf16 compute (param_dtype=bf16) against fully_shard with the same
MixedPrecisionPolicy, within a bf16 tolerance, and the trace shows the dtypes used.
torch's fully_shard may warn on CPU/gloo, so these bodies allow warnings.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.fsdp import FSDP
from minidist.precision import MixedPrecisionPolicy as MP
from minidist.mesh import REPLICATE, SHARD, hybrid_mesh
from minidist.models.gpt import Block
from tests.fsdp.helpers import make_batches, make_model, max_diff, train

BF16_TOL = 1e-4
"""Both engines cast the same way (bf16 all_gather and compute, fp32 reduction and master
weights); observed identical bit for bit. The margin covers a different fp32 summation
order; a wrong cast (e.g. bf16 master weights) moves parameters by ~1e-2 (bf16 vs fp32 here)."""


def _torch_fsdp(mp: bool = False, mesh_shape: tuple[int, ...] | None = None, reshard_after_forward: bool = True):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    n = dist.get_world_size()
    names = (REPLICATE, SHARD) if mesh_shape else None
    mesh = init_device_mesh("cpu", mesh_shape or (n,), mesh_dim_names=names)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp else MixedPrecisionPolicy()
    model = make_model("gpt")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    train("gpt", model, make_batches("gpt"), shard=True)
    return {k: v.full_tensor().detach() if hasattr(v, "full_tensor") else v.detach()
            for k, v in model.state_dict().items()}


def _ours(**kw):
    model = FSDP(make_model("gpt"), wrap={Block}, **kw)
    with comm.trace() as tr:
        train("gpt", model, make_batches("gpt"), shard=True)
    dtypes = {(r.op, r.dtype) for r in tr.records}
    return model.full_state_dict(rank0_only=False), dtypes


def body_parity() -> dict:
    ours32, _ = _ours()
    ours16, dtypes = _ours(mp_policy=MP(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    ours16r, dtypes16r = _ours(mp_policy=MP(param_dtype=torch.bfloat16))  # reduce_dtype None: reduce in bf16 too
    ref32 = _torch_fsdp()
    n = dist.get_world_size()
    return {"fp32": max_diff(ours32, ref32), "bf16": max_diff(ours16, _torch_fsdp(mp=True)),
            "bf16_vs_fp32": max_diff(ours16, ref32), "dtypes": dtypes,
            "bf16_reduce_vs_fp32_reduce": max_diff(ours16r, ours16), "dtypes_bf16_reduce": dtypes16r,
            "shard_grad_op": max_diff(_ours(reshard_after_forward=False)[0],
                                      _torch_fsdp(reshard_after_forward=False)),
            "no_shard": max_diff(_ours(mesh=hybrid_mesh(runtime.init("gloo"), shard=1))[0],
                                 _torch_fsdp(mesh_shape=(n, 1)))}


def test_matches_torch_fully_shard(run_dist):
    for r in run_dist(2, body_parity, allow_warnings=True):
        assert r["fp32"] < 1e-6 and r["shard_grad_op"] < 1e-6 and r["no_shard"] < 1e-6, r
        assert r["bf16"] < BF16_TOL, r
        assert r["bf16_vs_fp32"] > 1e-6, "bf16 compute should not be bit-identical to fp32"
        assert r["dtypes"] == {("all_gather", "bfloat16"), ("reduce_scatter", "float32")}, r["dtypes"]
        assert r["dtypes_bf16_reduce"] == {("all_gather", "bfloat16"), ("reduce_scatter", "bfloat16")}, r
        # reducing in bf16 rounds the gradients once more: a small change, not none
        assert 1e-7 < r["bf16_reduce_vs_fp32_reduce"] < 1e-2, r


def body_hybrid() -> float:
    ours, _ = _ours(mesh=hybrid_mesh(runtime.init("gloo"), shard=2))
    return max_diff(ours, _torch_fsdp(mesh_shape=(2, 2)))


def test_hybrid_matches_torch_hsdp(run_dist):
    for diff in run_dist(4, body_hybrid, allow_warnings=True):
        assert diff < 1e-6, diff
