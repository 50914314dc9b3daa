"""Rung 7, tensor parallelism: Megatron-LM's column- and row-parallel Linear, and the MLP they make.

    mlp = ParallelMLP(fc, proj)       # fc = Linear(h, 4h), proj = Linear(4h, h): the same on every rank
    y = mlp(x)                        # every rank: the same x, the same y

Every rank of the group sees the same tokens and keeps 1/N of each weight. A column-parallel
Linear keeps rows r of the weight (and of the bias): its output is split by feature. A
row-parallel Linear keeps columns r: each rank's product is a partial sum of the output. Chained
(column, GELU, row), the first's split output is the second's split input; two autograd
functions do all the communication (Shoeybi et al. 2019):

    f = CopyToTP       forward: identity     backward: all_reduce (sum) the gradient
    g = ReduceFromTP   forward: all_reduce   backward: identity

The row-parallel bias is kept whole on every rank and added once, after the sum.

The checker (python -m minidist.tutorial.check tp mine.py) holds you to:
  * output, input gradient and every weight's gradient (its slice) equal one process's, in fp32;
  * each rank's parameters are 1/N of the two weights and of fc's bias (plus proj's bias, whole);
  * one all_reduce forward and one backward (torch's profiler), 2 x 2 b s h e (N-1)/N bytes per
    rank (the kernel's count): the activations' size, never the weights';
  * the forward leaves 1/N of the hidden activations (b s 4h) alive for backward (torch's MemTracker).
"""

from __future__ import annotations

import torch
import torch.nn as nn


class CopyToTP(torch.autograd.Function):
    """f: identity forward; backward, the sum over the ranks of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("CopyToTP.forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("CopyToTP.backward")


class ReduceFromTP(torch.autograd.Function):
    """g: forward, the sum over the ranks; identity backward."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ReduceFromTP.forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ReduceFromTP.backward")


class ColumnParallelLinear(nn.Module):
    """This rank's output features of `linear` (weight rows, bias entries); input whole, output split."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        raise NotImplementedError("ColumnParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ColumnParallelLinear.forward")


class RowParallelLinear(nn.Module):
    """This rank's input features of `linear` (weight columns); input split, output summed, bias once."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        raise NotImplementedError("RowParallelLinear.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("RowParallelLinear.forward")


class ParallelMLP(nn.Module):
    """Linear(h, 4h) -> GELU -> Linear(4h, h), as self.fc (column-parallel) and self.proj (row-parallel)."""

    def __init__(self, fc: nn.Linear, proj: nn.Linear):
        super().__init__()
        raise NotImplementedError("ParallelMLP.__init__")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ParallelMLP.forward")
