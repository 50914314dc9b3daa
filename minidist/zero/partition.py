"""Which rank owns which parameter's optimizer state.

ZeRO stage 1 splits the *optimizer state* (Adam's exp_avg and exp_avg_sq: 2x
the parameters in fp32) across N ranks, so each rank holds ~1/N of it. Each
rank then updates only the parameters it owns and sends them to the others.

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


def partition_by_numel(params: Sequence[torch.Tensor], world_size: int) -> list[int]:
    """owner[i] = the rank that keeps optimizer state for params[i]."""
    load = [0] * world_size
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += params[i].numel()
    return owner
