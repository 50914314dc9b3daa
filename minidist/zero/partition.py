"""Whole-parameter owners, for the owner-broadcast variant (owner_broadcast.py).

torch's ZeroRedundancyOptimizer (and CS336's sharded-optimizer exercise) give
each parameter to one rank, which keeps its optimizer state, updates it and
broadcasts it to the others. The paper's ZeRO partitions elements instead
(bucket_shards.py): whole parameters cannot balance a model whose few largest tensors
exceed 1/N of it (an embedding), and leave ranks with nothing when there are
fewer parameters than ranks.

Balance matters because the slowest rank sets the pace (its step() does the
most arithmetic) and the largest shard sets peak memory. Greedy
"largest first onto the least-loaded rank" (LPT scheduling) keeps every
rank within one parameter's numel of the mean, and is deterministic: ties
break by parameter position and by lowest rank, so every rank computes the
same partition without any communication.
"""

from __future__ import annotations

from typing import Sequence

import torch


def partition_by_numel(params: Sequence[torch.Tensor], world_size: int, load: list[int] | None = None) -> list[int]:
    """owner[i] = the rank that keeps optimizer state for params[i].

    `load`: elements each rank already owns (earlier parameter groups), updated in place.
    """
    load = [0] * world_size if load is None else load
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner
