"""Emulated accelerator compute for the overlap benchmarks: time that passes without using the CPU.

On 2 CPU cores gloo's threads compete with real compute, so real compute hides nothing; a layer
whose forward sleeps `seconds` and whose backward sleeps twice that (a backward costs about two
forwards) leaves the cores to the collectives, as a GPU kernel would (PyTorch's own FSDP tests
inject delays the same way).
"""

from __future__ import annotations

import time

import torch


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds: float):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.seconds)
        return grad, None


def sleep(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """x unchanged; the forward sleeps `seconds`, its backward 2 x `seconds`."""
    return _Sleep.apply(x, seconds)


class _SleepBackward(torch.autograd.Function):
    """Identity that sleeps `seconds` in forward (when forward_too) and in backward."""

    @staticmethod
    def forward(ctx, x, seconds: float, forward_too: bool):
        ctx.seconds = seconds
        if forward_too:
            time.sleep(seconds)
        return x.clone()  # not a view: torch.distributed.pipelining detaches a stage's output in place

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None, None


class SleepyLinear(torch.nn.Module):
    """Linear(width, width) whose forward sleeps `seconds`, and whose backward sleeps `seconds` on the output's
    path (which the input's gradient follows) and `seconds` on the weight's: a backward of twice the
    forward, as `sleep`, split the way a zero-bubble schedule splits it (minidist.pp.backward: BI runs
    the first sleep, BW the second). The sleeps sit on the output and the weight, not the input, so
    that a first stage, whose input (token ids, data) needs no gradient, sleeps its whole backward too."""

    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.lin, self.seconds = torch.nn.Linear(width, width), seconds

    def forward(self, x):
        weight = _SleepBackward.apply(self.lin.weight, self.seconds, False)
        return _SleepBackward.apply(torch.nn.functional.linear(x, weight, self.lin.bias), self.seconds, True)
