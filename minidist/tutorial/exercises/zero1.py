"""Rung 5, ZeRO stage 1 as the paper does it: equal partitions, reduce_scatter + all_gather, DDP's bytes.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)   # CS336's shape
    loss.backward()          # a plain backward, no DDP wrapper: the gradients are this rank's own
    opt.step()               # reduce_scatter the gradients, step on my partition, all_gather

Lay each parameter group's parameters end to end in one flat vector, padded to N equal
partitions of k = ceil(numel / N) elements; rank r owns elements [r k, (r+1) k). In step():
reduce_scatter the flat gradients (rank r receives the sum of its partition; divide by N), let
the wrapped optimizer update an fp32 copy of the partition, all_gather every rank's updated
partition and write it back into the parameters. Use minidist.comm.reduce_scatter (on gloo a
ring, S (N-1)/N; gloo's own reduce_scatter is an all_reduce inside and sends twice that).

It must behave as optimizer_cls(params, **kwargs) would, parameter groups, add_param_group after
construction and an lr scheduler (which edits self.param_groups) included.

The checker (python -m minidist.tutorial.check zero1 mine.py) holds you to:
  * K steps at N ranks equal torch's optimizer on one process and the whole batch (two parameter
    groups, one added after construction, a scheduler that halves the lr);
  * no all_reduce; 2 S (N-1)/N bytes per rank and step, kernel-counted: DDP's bytes, 1.0x;
  * the optimizer's construction and first step leave at most 12 psi / N bytes allocated per rank
    (AdamW's 8 psi / N and the partition's fp32 copy, 4 psi / N; torch.optim.AdamW keeps 8 psi),
    counted by torch's MemTracker.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls: type, **kwargs: Any):
        """Remember optimizer_cls and kwargs, then super().__init__(params, kwargs): it calls
        add_param_group once per group, which does the partitioning."""
        raise NotImplementedError("ShardedOptimizer.__init__")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """super().add_param_group(param_group), then lay the group flat, keep this rank's partition
        (an fp32 copy) and hand it to the wrapped optimizer with the group's hyperparameters."""
        raise NotImplementedError("ShardedOptimizer.add_param_group")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        """Copy the groups' hyperparameters inwards; reduce_scatter the gradients; step the wrapped
        optimizer; all_gather the partitions into the parameters."""
        raise NotImplementedError("ShardedOptimizer.step")
