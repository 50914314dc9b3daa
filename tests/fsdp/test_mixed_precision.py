"""Gradients reduced in reduce_dtype, fp16 divided before and after the sum (minidist.precision).

World 4, fp16 compute and fp16 reduction, every rank's gradients up to ~30000: the four ranks'
gradients summed as they are exceed fp16's largest value (65504), which the test checks; FSDP
divides by 2 before the reduce_scatter and by 2 after (divide_factors(4) = (2, 2)), so the
averaged gradients stay finite and equal those of an fp32 run within FP16_TOL. Asked for an fp32
reduction (reduce_dtype=float32), the reduce_scatter carries fp32 and matches too; hybrid_shard
(2 x 2) divides the same way across its reduce_scatter and replica all_reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm, runtime
from minidist.fsdp import FSDP
from minidist.precision import MixedPrecisionPolicy as MP
from minidist.mesh import hybrid_mesh
from tests.common import rank_slice

FP16_TOL = 4e-3
"""Relative to the largest gradient: fp16 rounds each value to 2^-11 relative (4.9e-4), in the
forward, the backward and the reduction; a missing pre-division gives inf, a missing
post-division a factor of 2."""
TARGET = 30000.0
"""Largest local gradient: four of them sum past 65504."""


class Positive(nn.Module):
    """Two linear units with positive weights and inputs: every rank's gradients share signs, so they add up."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 6), nn.Linear(6, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(0.05, 0.15)

    def forward(self, x):
        return self.b(self.a(x))


def _scale(x: torch.Tensor) -> float:
    """Loss scale that makes the largest local gradient TARGET (the same on every rank)."""
    torch.manual_seed(0)
    probe = Positive()
    probe(x).sum().backward()
    m = torch.stack([p.grad.abs().max() for p in probe.parameters()]).max().reshape(1)
    dist.all_reduce(m, dist.ReduceOp.MAX)
    return TARGET / m.item()


def _grads(x: torch.Tensor, scale: float, **kw) -> tuple[list[torch.Tensor], set]:
    torch.manual_seed(0)
    model = FSDP(Positive(), wrap={nn.Linear}, **kw)
    with comm.trace() as tr:
        (model(x).float().sum() * scale).backward()
    return [p.grad.float() for p in model.parameters()], {r.dtype for r in tr.records if r.op != "all_gather"}


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max |a - b| / max |b| over this rank's gradients (some may be empty: a rank past the last row)."""
    a, b = torch.cat([t.reshape(-1) for t in a]), torch.cat([t.reshape(-1) for t in b])
    return ((a - b).abs().max() / b.abs().max()).item()


def body_fp16() -> dict:
    g = torch.Generator().manual_seed(3)
    x = rank_slice(torch.rand(16, 8, generator=g) + 0.5)
    scale = _scale(x)
    # the fp16 gradients each rank computes, summed without any division: past fp16's range
    torch.manual_seed(0)
    local = Positive().half()
    (local(x.half()).float().sum() * scale).backward()
    summed = torch.cat([p.grad.float().reshape(-1) for p in local.parameters()])
    dist.all_reduce(summed)
    ref, _ = _grads(x, scale)
    fp16, dtypes16 = _grads(x, scale, mp_policy=MP(param_dtype=torch.float16))
    fp32r, dtypes32 = _grads(x, scale, mp_policy=MP(param_dtype=torch.float16, reduce_dtype=torch.float32))
    mesh = hybrid_mesh(runtime.init("gloo"), shard=2)
    hybrid, _ = _grads(x, scale, mp_policy=MP(param_dtype=torch.float16), mesh=mesh)
    hybrid_ref, _ = _grads(x, scale, mesh=mesh)
    return {"plain_sum_max": summed.abs().max().item(), "local_max": max(p.grad.abs().max().item() for p in local.parameters()),
            "finite": all(torch.isfinite(t).all() for t in fp16 + hybrid),
            "fp16": _rel(fp16, ref), "fp32_reduce": _rel(fp32r, ref), "hybrid": _rel(hybrid, hybrid_ref),
            "dtypes16": dtypes16, "dtypes32": dtypes32}


def test_fp16_reduction_cannot_overflow(run_dist):
    for r in run_dist(4, body_fp16):
        assert r["local_max"] <= 65504 and r["plain_sum_max"] > 65504, r  # a plain fp16 sum would overflow
        assert r["finite"], r
        assert r["fp16"] < FP16_TOL and r["hybrid"] < FP16_TOL, r
        assert r["fp32_reduce"] < FP16_TOL, r
        assert r["dtypes16"] == {"float16"} and r["dtypes32"] == {"float32"}, r
