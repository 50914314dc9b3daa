"""Emulated accelerator compute: time proportional to FLOPs that passes without using a core.

    x, kernel = emulated.begin(x, rate)       # a module's input
    ...                                       # its real forward
    return emulated.end(y, kernel, flops, x)  # forward ends flops / rate after begin, backward 2 x that

Why: on a GPU, forward and backward are kernels on the device while the CPU and the network are
free, so communication hides behind them and a step's time is its FLOPs over the device's rate. On
two CPU cores shared by four ranks, real matmuls fight gloo's threads (and each other) for the cores:
nothing hides, and the step time measures the machine's contention, not the layout. A sleep occupies
time without occupying a core, as a kernel does (PyTorch's own FSDP tests inject delays alike). With
GPTConfig.emulate_flops_per_s = R > 0 the GPT's matmuls each sleep their FLOPs / R, so that a
planner told R (minidist.compare.plan) can be checked against measured step times.

A kernel spans a module: its forward ends flops / R after the module began and its backward 2 flops / R after
the backward reached it, the module's own CPU time inside those spans (an accelerator runs the kernels while the
host launches the next ones), so the step pays the host's work only where it outlasts the kernels.

A backward costs two forwards (the input's gradient and the weight's, each a matmul of the forward's
size): the backward sleeps 2 x. Under activation recompute the forward runs again inside the
backward, and sleeps again (the planner's 4/3): each kernel saves its output for backward so that
torch's checkpoint, which stops recomputing after the last saved tensor, replays it (with emulation
on, a module's output is held until its backward: b s h per module more than without).
"""

from __future__ import annotations

import time

import torch


class EmulatedCompute(torch.autograd.Function):
    """Identity that sleeps `seconds` in forward and twice that in backward (backward ~ 2x forward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        time.sleep(2 * ctx.seconds)
        return grad, None


class Kernel:
    """One emulated kernel over a module's span: when its forward started, and when its backward must end."""

    def __init__(self, rate: float):
        self.rate, self.started, self.seconds, self.deadline = rate, time.perf_counter(), 0.0, None


def _until(t: float) -> None:
    time.sleep(max(0.0, t - time.perf_counter()))


class _Begin(torch.autograd.Function):
    """At a module's input: its backward (the module's last) sleeps until the kernel's backward deadline."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: Kernel) -> torch.Tensor:
        ctx.kernel = kernel
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        _until(ctx.kernel.deadline)
        return grad, None


class _End(torch.autograd.Function):
    """At a module's output: the forward sleeps until `seconds` after the span began; its backward (the module's
    first) sets the deadline 2 x `seconds` on, or sleeps all of it where no gradient flows back to the input."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, kernel: Kernel, seconds: float, to_input: bool) -> torch.Tensor:
        ctx.kernel, ctx.seconds, ctx.to_input = kernel, seconds, to_input
        ctx.save_for_backward(y)  # unused, but saved: activation recompute (early stop) must replay this sleep
        _until(kernel.started + seconds)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.saved_tensors  # unpacked first: a recompute runs here, before the backward's kernel starts
        if ctx.to_input:
            ctx.kernel.deadline = time.perf_counter() + 2 * ctx.seconds
        else:
            time.sleep(2 * ctx.seconds)
        return grad, None, None, None


def begin(x: torch.Tensor, rate: float) -> tuple[torch.Tensor, Kernel | None]:
    """A module's input, and the kernel its matmuls run as (None: rate <= 0, no emulation, x itself)."""
    if rate <= 0:
        return x, None
    kernel = Kernel(rate)
    return (_Begin.apply(x, kernel) if x.requires_grad else x), kernel


def end(y: torch.Tensor, kernel: Kernel | None, flops: float, x: torch.Tensor | None = None) -> torch.Tensor:
    """The module's output `y` once its kernel of `flops` has run: the forward ends flops / rate after begin()
    (the module's own CPU time inside it, as a GPU kernel hides its launches), the backward 2 x that after it
    starts. x: the module's input as begin() returned it (whether a gradient flows back to it)."""
    if kernel is None:
        return y
    return _End.apply(y, kernel, flops / kernel.rate, x is not None and x.requires_grad)
