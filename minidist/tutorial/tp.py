"""Tensor parallelism, Megatron-LM's pair: a column-parallel Linear, then a row-parallel one.

Split the layers instead of the batch: every rank of the group sees the same tokens and holds
1/N of each weight. For y = x A^T + b with A of shape (out, in):

    column-parallel   rank r keeps rows r of A and b (out/N features)   y_r = x A_r^T + b_r   x whole, y split
    row-parallel      rank r keeps columns r of A (in/N features)       y = sum_r x_r A_r^T + b   x split, y summed

Chained (column, an elementwise GELU, row: a transformer's MLP, or its attention split by
heads), the first's split output is the second's split input: no communication in between.
Two conjugate functions (Shoeybi et al. 2019, "f" and "g") are all it needs:

    f  enter the pair   forward: identity     backward: all_reduce the input's gradient
    g  leave the pair   forward: all_reduce   backward: identity

f's backward sums because each rank's slice of the column-parallel layer used the same x and
holds one term of dL/dx; g's forward sums the row-parallel partial products. Per pair and step,
b s h activations of e bytes: one all_reduce forward, one backward, 2 x 2 b s h e (N-1)/N bytes
per rank, growing with the tokens, not with the parameters; nothing hides them (the next layer
needs the result). Memory per rank: 1/N of the two weights and of the hidden activations
(b s 4h); the pair's input and output stay whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minidist import comm


# --8<-- [start:conjugates]
class CopyToTP(torch.autograd.Function):
    """f: identity forward; backward, the sum over the ranks of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()           # autograd may hand the same tensor to several consumers
        comm.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    """g: forward, the sum over the ranks; identity backward."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        y = y.clone()
        comm.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad
# --8<-- [end:conjugates]


# --8<-- [start:linear]
def my_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's equal piece of `t` along `dim`, as a tensor of its own (a view would keep t alive)."""
    n, r = dist.get_world_size(), dist.get_rank()
    if t.shape[dim] % n:
        raise ValueError(f"{t.shape[dim]} features do not split over {n} ranks")
    return t.detach().chunk(n, dim=dim)[r].clone()


class ColumnParallelLinear(nn.Module):
    """This rank's output features of `linear`; the input whole, the output split by feature."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(my_rows(linear.weight, 0))
        self.bias = None if linear.bias is None else nn.Parameter(my_rows(linear.bias, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(CopyToTP.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input features of `linear`; the input split by feature, the output summed."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(my_rows(linear.weight, 1))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ReduceFromTP.apply(F.linear(x, self.weight))   # partial sums in, the sum out
        return y if self.bias is None else y + self.bias   # the bias once, after the sum
# --8<-- [end:linear]


# --8<-- [start:mlp]
class ParallelMLP(nn.Module):
    """A transformer's MLP, Linear(h, 4h) -> GELU -> Linear(4h, h), split over the ranks."""

    def __init__(self, fc: nn.Linear, proj: nn.Linear):
        super().__init__()
        self.fc, self.proj = ColumnParallelLinear(fc), RowParallelLinear(proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))
# --8<-- [end:mlp]
