"""The conjugate pairs: autograd functions whose forward is one collective and whose backward is its dual.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits a matmul's weight over the tp
ranks. A column-parallel linear (output features split) needs its whole input on every rank;
a row-parallel linear (input features split) leaves each rank a partial sum of the output.
Two functions move activations across that boundary, and each is the other's transpose:

    f  copy_to_tp          forward: identity      backward: all_reduce    (enter a TP region)
    g  reduce_from_tp      forward: all_reduce    backward: identity      (leave a TP region)

f's backward sums the input gradient because every rank's slice of the next layer used the
same input, so each holds one term of its gradient. g's backward is the identity because the
all_reduced output is the same tensor on every rank, and so is its gradient.

Sequence parallelism (Korthikanti et al. 2022) keeps the activations *between* TP regions
split along the sequence instead of whole on every rank. An all_reduce is a reduce_scatter
followed by an all_gather, and SP moves the all_gather to the start of the next region:

    gather_sequence        forward: all_gather    backward: reduce_scatter   (replaces f)
    reduce_scatter_sequence forward: reduce_scatter backward: all_gather     (replaces g)
    scatter_sequence       forward: keep my chunk backward: all_gather       (enter SP from replicated)

Bytes per rank (b batch, s sequence, h width, N = tp ranks, S = b*s*h*element size): an
all_reduce sends 2 S (N-1)/N; a reduce_scatter or an all_gather S (N-1)/N. So a transformer
block, whose attention and MLP each enter through f and leave through g, sends 2 all_reduces
forward and 2 backward = 8 S (N-1)/N per step; under SP, 4 all_gathers and 4 reduce_scatters:
the same 8 S (N-1)/N.

Every collective goes through minidist.comm (traced). Reductions work on a copy: autograd may
hand the same gradient tensor to several consumers (an add passes one tensor to both branches).
The sequence is dimension `dim` (1 for minidist's (batch, time, width) activations); gathering
along it costs one reordering copy (Megatron keeps the sequence first and gathers along dim 0).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm


def _all_reduce(t: torch.Tensor, group) -> torch.Tensor:
    out = t.clone(memory_format=torch.contiguous_format)
    comm.all_reduce(out, group=group)
    return out


def _all_gather(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's `t`, concatenated along `dim` in rank order."""
    n = dist.get_world_size(group)
    t = t.contiguous()
    out = torch.empty(n * t.numel(), dtype=t.dtype, device=t.device)
    comm.all_gather(out, t.view(-1), group=group)
    return torch.cat(out.view(n, *t.shape).unbind(0), dim=dim)


def _reduce_scatter(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum over ranks of `t`, of which this rank keeps chunk `rank` along `dim`."""
    n = dist.get_world_size(group)
    _check_splits(t, dim, n)
    chunks = torch.stack(t.chunk(n, dim=dim))  # chunk r first: reduce_scatter splits along dim 0
    out = torch.empty(chunks.shape[1:], dtype=t.dtype, device=t.device)
    comm.reduce_scatter(out.view(-1), chunks.view(-1), group=group)
    return out


def _split(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's chunk along `dim`, as a tensor of its own (a view would keep the whole alive)."""
    n = dist.get_world_size(group)
    _check_splits(t, dim, n)
    return t.chunk(n, dim=dim)[dist.get_rank(group)].clone(memory_format=torch.contiguous_format)


def _check_splits(t: torch.Tensor, dim: int, n: int) -> None:
    if t.shape[dim] % n:
        raise ValueError(f"sequence parallelism: a sequence of {t.shape[dim]} does not split over tp={n} ranks; "
                         f"use a sequence length divisible by {n}")


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all_reduce backward (several tensors: one coalesced all_reduce)."""

    @staticmethod
    def forward(ctx, group, *tensors):
        ctx.group = group
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        if len(grads) == 1:
            return None, _all_reduce(grads[0], ctx.group)
        out = [g.clone(memory_format=torch.contiguous_format) for g in grads]
        comm.all_reduce_coalesced(out, group=ctx.group)
        return (None, *out)


class _ReduceFromTP(torch.autograd.Function):
    """g: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, t, group):
        return _all_reduce(t, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherSequence(torch.autograd.Function):
    """all_gather forward; backward reduce_scatter (consumers hold partial gradients) or split (whole ones)."""

    @staticmethod
    def forward(ctx, t, dim, group, grad_is_partial):
        ctx.dim, ctx.group, ctx.partial = dim, group, grad_is_partial
        return _all_gather(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.partial:
            return _reduce_scatter(grad, ctx.dim, ctx.group), None, None, None
        return _split(grad, ctx.dim, ctx.group), None, None, None


class _ReduceScatterSequence(torch.autograd.Function):
    """reduce_scatter forward, all_gather backward."""

    @staticmethod
    def forward(ctx, t, dim, group):
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class _ScatterSequence(torch.autograd.Function):
    """Keep this rank's chunk forward, all_gather backward."""

    @staticmethod
    def forward(ctx, t, dim, group):
        ctx.dim, ctx.group = dim, group
        return _split(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


def copy_to_tp(*tensors: torch.Tensor, group):
    """f: the tensors unchanged; in backward their gradients are summed over `group` (one all_reduce).

    Applied to an activation entering a column-parallel layer, and under sequence parallelism
    to a replicated parameter (a norm's weight) that each rank used on its part of the sequence.
    """
    return _CopyToTP.apply(group, *tensors)


def reduce_from_tp(t: torch.Tensor, group) -> torch.Tensor:
    """g: `t` summed over `group` (all_reduce); gradients pass through unchanged."""
    return _ReduceFromTP.apply(t, group)


def gather_sequence(t: torch.Tensor, group, dim: int = 1, grad_is_partial: bool = True) -> torch.Tensor:
    """The whole sequence from every rank's chunk (all_gather along `dim`).

    Backward: with `grad_is_partial` (the consumer is column-parallel, each rank holds one
    term of the gradient) reduce_scatter; without (a replicated consumer computed the same
    gradient everywhere) keep this rank's chunk, no communication.
    """
    return _GatherSequence.apply(t, dim, group, grad_is_partial)


def reduce_scatter_sequence(t: torch.Tensor, group, dim: int = 1) -> torch.Tensor:
    """Partial sums in, this rank's chunk of the sum along `dim` out (reduce_scatter); backward all_gather."""
    return _ReduceScatterSequence.apply(t, dim, group)


def scatter_sequence(t: torch.Tensor, group, dim: int = 1) -> torch.Tensor:
    """A tensor whole on every rank in, this rank's chunk along `dim` out; backward all_gather."""
    return _ScatterSequence.apply(t, dim, group)
