"""Column- and row-parallel Linear: one matmul's weight split over the tp ranks, Megatron-LM's pair.

y = x A^T + b with A of shape (out, in). Split A two ways over N ranks:

    column-parallel   A_r = rows r of A (out/N, in)    y_r = x A_r^T + b_r      x whole, y split by feature
    row-parallel      A_r = columns r (out, in/N)      y = sum_r x_r A_r^T + b  x split by feature, y summed

Chained column -> (elementwise) -> row, the split output of the first is exactly the split
input of the second, so a pair needs no communication in the middle: only f before the
column-parallel layer (identity forward, all_reduce of dL/dx backward) and g after the
row-parallel one (all_reduce forward, identity backward), minidist.tp.conjugates. The bias of
a row-parallel layer is added once, after the sum.

With sequence_parallel the input of a column-parallel layer arrives as this rank's chunk of
the sequence and is all_gathered (backward: reduce_scatter); a row-parallel layer
reduce_scatters its partial sums along the sequence (backward: all_gather), and its bias,
replicated but now applied to 1/N of the tokens on each rank, enters through f so that its
gradient is summed over the ranks. The gathered input is what the column-parallel matmul
saves for backward (Megatron instead saves the chunk and gathers it again in backward: one
more all_gather per layer for b*s*h*(N-1)/N less memory; minidist keeps SP's bytes equal to TP's).

Both are built from a full nn.Linear that every rank holds alike (e.g. built from the same
seed), keep their rank's slice, and declare it (minidist.sharding, over "tp") under the names
`weight` and `bias`, so state_dict keys do not change.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from minidist.tp.conjugates import copy_to_tp, gather_sequence, reduce_from_tp, reduce_scatter_sequence
from minidist.tp.placement import sharded_parameter, sharding_of, tp_group


class ColumnParallelLinear(nn.Module):
    """This rank's output features of `linear` (all inputs); output split by feature.

    parts: the output features are `parts` equal blocks (q | k | v), each split over the ranks.
    """

    def __init__(self, linear: nn.Linear, device_mesh: DeviceMesh, *, parts: int = 1, sequence_parallel: bool = False):
        super().__init__()
        self.group, rank, size = tp_group(device_mesh)
        self.in_features, self.out_features = linear.in_features, linear.out_features // size
        self.sequence_parallel = sequence_parallel
        self.weight = sharded_parameter(linear.weight, 0, rank, size, parts)
        self.bias = None if linear.bias is None else sharded_parameter(linear.bias, 0, rank, size, parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = gather_sequence(x, self.group) if self.sequence_parallel else copy_to_tp(x, group=self.group)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (this rank's), "
                f"bias={self.bias is not None}, sequence_parallel={self.sequence_parallel}, "
                f"{sharding_of(self.weight)}")


class RowParallelLinear(nn.Module):
    """This rank's input features of `linear` (all outputs); input split by feature, output summed over ranks."""

    def __init__(self, linear: nn.Linear, device_mesh: DeviceMesh, *, sequence_parallel: bool = False):
        super().__init__()
        self.group, rank, size = tp_group(device_mesh)
        self.in_features, self.out_features = linear.in_features // size, linear.out_features
        self.sequence_parallel = sequence_parallel
        self.weight = sharded_parameter(linear.weight, 1, rank, size)
        self.bias = linear.bias  # replicated: the same Parameter, added once after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)  # this rank's partial sum
        if self.sequence_parallel:
            y = reduce_scatter_sequence(y, self.group)
            return y if self.bias is None else y + copy_to_tp(self.bias, group=self.group)
        y = reduce_from_tp(y, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank's), out_features={self.out_features}, "
                f"bias={self.bias is not None}, sequence_parallel={self.sequence_parallel}, "
                f"{sharding_of(self.weight)}")
