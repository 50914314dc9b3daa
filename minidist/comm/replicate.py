"""Start every rank from one rank's values: broadcast many tensors, all launched before any wait.

    comm.broadcast_tensors(params + buffers, group=group)             # group rank 0's values, everywhere
    comm.broadcast_tensors(buffers, group=group, group_src=source)    # DDP.join: the last active rank's

The one broadcast-from-rank-0 of minidist: DDP (its parameters and buffers at construction,
its buffers before each forward, everything after join), ShardedOptimizer (the parameters
it is given) and FSDP's load_full_state_dict(broadcast_from_rank0=True) call it.

Why launch all, then wait: each broadcast of a small tensor is mostly latency (alpha per
call, a tree of log N hops); issued back to back they queue on the backend's threads and
their latencies overlap, where a wait after each would pay them one after another. Cost:
one broadcast per tensor, S (N-1)/N bytes per rank on average (minidist.comm.trace).

A collective: every rank of `group` calls it with the same tensors (shapes and dtypes), in
the same order as its other collectives. Nothing happens in a group of one.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from minidist.comm.collectives import Group, broadcast


@torch.no_grad()
def broadcast_tensors(tensors: Sequence[torch.Tensor], *, group: Group = None, group_src: int = 0) -> None:
    """Overwrite every tensor of `tensors` (in place) with group rank `group_src`'s; returns when all arrived."""
    if dist.get_world_size(group) == 1:
        return
    works = [broadcast(t.detach(), group=group, group_src=group_src, async_op=True) for t in tensors]
    for w in works:
        w.wait()
