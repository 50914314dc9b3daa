"""The model every step of the track is timed on: Linear layers whose backward sleeps.

Why sleep: on a GPU, backward is kernels on the device while the CPU and the network
are free, so communication can hide behind it. On two CPU cores shared by two ranks,
real matmuls would fight gloo's threads for the cores and nothing could hide. A sleep
occupies time without occupying a core, as a GPU kernel does (PyTorch's own FSDP tests
emulate compute the same way).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.models.emulated import EmulatedCompute  # identity; sleeps s forward, 2 s backward


class Layer(nn.Module):
    """Linear(width, width) and tanh, after `seconds` of emulated compute (0: none)."""

    def __init__(self, width: int, seconds: float = 0.0):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds > 0:
            x = EmulatedCompute.apply(x, self.seconds)
        return torch.tanh(self.linear(x))


def make_model(width: int = 256, depth: int = 8, seconds: float = 0.0, seed: int = 0) -> nn.Sequential:
    """`depth` layers of `width`; the same values on every rank for one seed."""
    torch.manual_seed(seed)
    return nn.Sequential(*[Layer(width, seconds) for _ in range(depth)])
