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
