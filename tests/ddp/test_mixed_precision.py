"""DDP(mp_policy=MixedPrecisionPolicy(...)): forward and backward in bf16/fp16 on copies of the fp32
parameters, gradients reduced in reduce_dtype, fp32 gradients for the optimizer. K steps (with no_sync
accumulation) stay within a stated tolerance of an fp32 run in one process; an fp16 sum that would
overflow at N = 4 does not; an evaluation forward leaves the fp32 masters in place."""

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.ddp import DDP
from minidist.precision import MixedPrecisionPolicy
from tests.ddp.helpers import batches
from tests.zero.helpers import fresh_mlp, max_diff, train

TOLERANCE = {torch.bfloat16: 2e-3, torch.float16: 3e-4}
"""max |parameter - fp32 one-process reference| after 3 SGD steps (lr 0.1, momentum 0.9): the masters stay
fp32, so only the low-precision forward and backward differ (bf16 measured ~2.4e-4, fp16 ~2.4e-5)."""


class _Loop:
    """DDP and its optimizer behind the interface tests.zero.helpers.train drives."""

    def __init__(self, model: DDP, opt: torch.optim.Optimizer):
        self.model, self.opt = model, opt

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        self.opt.step()

    def no_sync(self):
        return self.model.no_sync()


def _vs_fp32() -> dict:
    data = batches(3, 12, 13, 5)
    ref = fresh_mlp()
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), data, shard=False)
    out = {}
    for pd, rd in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float16, torch.float16)):
        model = DDP(fresh_mlp(), mp_policy=MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train(model, _Loop(model, opt), data, shard=True, micro=2)  # one no_sync micro-batch per step
        bucket_dtypes = {b.flat.dtype for b in model.reducer.buckets}
        with torch.no_grad():
            model(torch.randn(2, 13))  # an evaluation forward
        out[(pd, rd)] = {"diff": max_diff(model.module, ref), "buckets": bucket_dtypes == {rd},
                         "fp32 after eval": all(p.dtype == torch.float32 for p in model.parameters()),
                         "fp32 grads": all(p.grad.dtype == torch.float32 for p in model.parameters())}
    return out


def test_ddp_mixed_precision_close_to_fp32(run_dist):
    for r in run_dist(2, _vs_fp32):
        for (pd, rd), m in r.items():
            assert m["diff"] < TOLERANCE[pd], (pd, rd, m["diff"])
            assert m["buckets"], "gradients are reduced in reduce_dtype"
            assert m["fp32 after eval"] and m["fp32 grads"], "the optimizer sees fp32 parameters and gradients"


def _overflow() -> dict:
    """Every rank's gradient is 30000: their fp16 sum at N = 4 (120000) exceeds fp16's 65504."""
    control = torch.full((8,), 30000.0, dtype=torch.float16)
    comm.all_reduce(control)
    lin = nn.Linear(8, 1, bias=False)
    nn.init.ones_(lin.weight)
    model = DDP(lin, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
    model(torch.full((1, 8), 30000.0)).sum().backward()
    return {"control": bool(torch.isinf(control).any()), "grad": model.module.weight.grad.flatten().tolist()}


def test_ddp_fp16_reduction_does_not_overflow(run_dist):
    for r in run_dist(4, _overflow):
        assert r["control"], "a plain fp16 sum of the four gradients overflows"
        assert r["grad"] == [30000.0] * 8, r["grad"]
