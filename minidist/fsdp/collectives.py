"""The three collectives of FSDP, as stateless functions on a unit's flat buffers.

    unshard:  all_gather      shard (shard_size,)  ->  full (padded,)       S (N-1)/N sent per rank
    reduce:   reduce_scatter  grads (padded,)      ->  grad shard (shard_size,)  S (N-1)/N
    hybrid:   all_reduce      grad shard           across replicas         2 (S/N) (R-1)/R
    no_shard: all_reduce      grads (padded,)      across all ranks        2 S (N-1)/N

(S = bytes of the padded flat buffer.) Per step, full_shard gathers twice (forward,
and again in backward because it freed the parameters after forward) and reduces
once: 3 S (N-1)/N, 1.5x DDP's 2 S (N-1)/N, the price of keeping only 1/N of the
parameters between uses. shard_grad_op keeps the forward's gather for backward:
2 S (N-1)/N, like DDP.

Everything goes through minidist.comm so traces see it. The functions return the
Work handle (async_op=True) and never wait: the unit that owns the buffers waits
on it, then frees or reads them. With NCCL an async collective runs on the process
group's internal stream, ordered after the work already queued on the current
stream, and Work.wait() makes the current stream wait for it without blocking the
host; the caller keeps input and output alive until that wait (keep-alive rather
than record_stream). On gloo the work proceeds on gloo's threads.

Reductions are SUM; the caller divides once by the number of contributing ranks
(gloo has no PREMUL_SUM, and one divide after the last sum is also the most exact).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm


def all_gather_shard(full: torch.Tensor, shard: torch.Tensor, group: dist.ProcessGroup | None,
                     async_op: bool = True):
    """Fill `full` (padded,) with every rank's `shard` (padded / N,), rank r at r * shard_size."""
    return comm.all_gather(full, shard, group=group, async_op=async_op)


def reduce_scatter_grad(out: torch.Tensor, flat_grad: torch.Tensor, group: dist.ProcessGroup | None,
                        async_op: bool = True):
    """Sum `flat_grad` (padded,) over the group; leave this rank's (padded / N,) chunk in `out`."""
    return comm.reduce_scatter(out, flat_grad, comm.ReduceOp.SUM, group=group, async_op=async_op)


def all_reduce_grad(grad: torch.Tensor, group: dist.ProcessGroup | None, async_op: bool = True):
    """Sum `grad` over the group (replicas in hybrid_shard, every rank in no_shard), in place."""
    return comm.all_reduce(grad, comm.ReduceOp.SUM, group=group, async_op=async_op)


def broadcast_flat(flat: torch.Tensor, group: dist.ProcessGroup | None, src_group_rank: int = 0) -> None:
    """Copy `flat` from group rank `src_group_rank` to every member of `group` (state dict loading)."""
    comm.broadcast(flat, group=group, group_src=src_group_rank)


def all_gather_flat(full: torch.Tensor, shard: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Blocking all_gather, for state dicts (outside the training hot path)."""
    comm.all_gather(full, shard, group=group)
