"""ZeRO stage 1, the owner-broadcast variant, in CS336's shape: ShardedOptimizer(params, optimizer_cls, **kwargs).

Adam keeps two fp32 tensors per parameter (exp_avg, exp_avg_sq): 8 bytes per
parameter, twice the model. Here each parameter, whole, has one owner rank (the least
loaded so far), and only the owner keeps its optimizer state and updates it; after the
step each owner broadcasts its updated parameters to the others. Per rank: optimizer
state of at most 8 (P/N + the largest parameter) bytes instead of 8P (fp32 AdamW; the
greedy assignment keeps every rank within one parameter of the average P/N); per step,
on top of DDP's gradient all_reduce, the updated parameters travel once from their
owners: each rank receives the (N-1)/N of them it does not own, 1.5x DDP's bytes in all.
The paper's cut (zero1.py: equal partitions, reduce_scatter + all_gather) sends DDP's.

It subclasses torch.optim.Optimizer so that anything that reads param_groups (an lr
scheduler, zero_grad, add_param_group) works: the outer groups hold every parameter,
the wrapped optimizer holds this rank's share of each group.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from minidist import comm


# --8<-- [start:init]
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls: type, **kwargs: Any):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.load = [0] * self.world      # elements owned by each rank so far
        self.owner: dict[torch.Tensor, int] = {}
        self.local: torch.optim.Optimizer | None = None  # this rank's share
        super().__init__(params, kwargs)  # calls add_param_group per group
# --8<-- [end:init]

    # --8<-- [start:add_param_group]
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Also after construction: each parameter to the least-loaded rank."""
        super().add_param_group(param_group)  # the whole group, with defaults
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world), key=lambda r: self.load[r])
            self.owner[p] = owner
            self.load[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        local_group = {**group, "params": mine}  # same hyperparameters, my share
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.kwargs)
        else:
            self.local.add_param_group(local_group)
    # --8<-- [end:add_param_group]

    # --8<-- [start:step]
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        for outer, inner in zip(self.param_groups, self.local.param_groups):
            # outer -> inner: an lr scheduler edits the outer groups
            inner.update({k: v for k, v in outer.items() if k != "params"})
        loss = self.local.step(closure, **kwargs)  # updates my share only
        handles = [comm.broadcast(p, src=self.owner[p], async_op=True)
                   for group in self.param_groups for p in group["params"]]
        for handle in handles:
            handle.wait()
        return loss
    # --8<-- [end:step]
