"""ZeRO stage 1 as the paper does it: equal partitions, reduce_scatter the gradients, all_gather the parameters.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)   # CS336's shape
    loss.backward()          # plain backward: no DDP wrapper, the gradients are this rank's own
    opt.step()               # reduce_scatter, step on my partition, all_gather

An all_reduce is a reduce_scatter followed by an all_gather (lesson rs_ag_is_all_reduce). The
paper (Rajbhandari et al. 2020, stage P_os) runs the optimizer between the two halves. Each
parameter group's parameters are laid end to end in one flat vector of psi_g elements, padded
to N equal partitions of k = ceil(psi_g / N); rank r owns elements [r k, (r+1) k):

    reduce_scatter    the gradients: rank r receives the sum of its partition only   S (N-1)/N bytes
    step              the wrapped optimizer updates an fp32 copy of the partition
    all_gather        every rank's updated partition, back into every parameter      S (N-1)/N bytes

DDP's 2 S (N-1)/N per step and rank, 1.0x DDP, in two collectives per group. Memory per rank:
the optimizer's state of k elements (AdamW: 8 k bytes, 8 psi / N up to padding, where
torch.optim.AdamW keeps 8 psi) plus the partition's copy (4 psi / N); the parameters and
gradients stay whole (4 psi each). The owner-broadcast variant (sharded_optimizer.py) keeps
DDP's all_reduce and adds a broadcast per parameter instead: 1.5x DDP's bytes.

Why a flat partition is exact: AdamW, SGD and Adam update each element from its own gradient
and state alone, so stepping a slice of the concatenation is stepping the parameters. An
optimizer that looks at a whole tensor (a norm per row, Shampoo, Muon) needs whole parameters:
the owner-broadcast variant. A parameter whose .grad is None steps with a zero gradient here
(torch's optimizers would skip it).

Use minidist.comm.reduce_scatter: on gloo it runs a ring (S (N-1)/N); gloo's own
reduce_scatter is an all_reduce inside and would send twice that.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from minidist import comm


# --8<-- [start:partition]
class Partition:
    """One parameter group laid flat: `params` end to end, padded to N * k; this rank owns `shard`."""

    def __init__(self, params: list[torch.Tensor], rank: int, world: int):
        self.params, self.world = params, world
        self.numel = sum(p.numel() for p in params)
        self.k = -(-self.numel // world)                 # ceil: the last partition is padded
        flat = torch.zeros(self.k * world)
        flat[:self.numel] = torch.cat([p.detach().reshape(-1) for p in params]) if params else flat[:0]
        self.shard = torch.nn.Parameter(flat[rank * self.k:(rank + 1) * self.k].clone())

    def flat_grads(self) -> torch.Tensor:
        flat = torch.zeros(self.k * self.world)
        if self.params:
            flat[:self.numel] = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.reshape(-1)
                                           for p in self.params])
        return flat

    @torch.no_grad()
    def write_back(self, flat: torch.Tensor) -> None:
        for p, piece in zip(self.params, flat[:self.numel].split([p.numel() for p in self.params])):
            p.copy_(piece.view_as(p))
# --8<-- [end:partition]


# --8<-- [start:optimizer]
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls: type, **kwargs: Any):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.partitions: list[Partition] = []            # one per parameter group
        self.local: torch.optim.Optimizer | None = None  # steps this rank's shards only
        super().__init__(params, kwargs)                 # calls add_param_group per group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)             # the whole group, with defaults
        group = self.param_groups[-1]
        part = Partition(group["params"], self.rank, self.world)
        self.partitions.append(part)
        local_group = {**group, "params": [part.shard]}  # same hyperparameters, my partition
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.kwargs)
        else:
            self.local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner, part in zip(self.param_groups, self.local.param_groups, self.partitions):
            inner.update({k: v for k, v in outer.items() if k != "params"})  # an lr scheduler edits outer
            grad = torch.empty(part.k)
            comm.reduce_scatter(grad, part.flat_grads())   # the sum of my partition, S (N-1)/N
            part.shard.grad = grad.div_(self.world)        # the mean over the ranks
        self.local.step(**kwargs)                          # my partition only
        for part in self.partitions:
            part.shard.grad = None                         # 4 psi / N bytes less until the next step
            flat = torch.empty(part.k * self.world)
            comm.all_gather(flat, part.shard.detach())     # every partition, S (N-1)/N
            part.write_back(flat)
        return loss
# --8<-- [end:optimizer]
