"""Uneven inputs: a rank that runs out of batches shadows the others' collectives instead of hanging.

Like torch's ``DDP.join()`` (``torch.distributed.algorithms.Join``):

    with model.join():                  # model = minidist.DDP(...)
        for x, y in my_batches:         # ranks may have different numbers of batches
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

Without it, the rank that finishes first leaves the loop while the others
enter their next all_reduce, which then waits for it forever (gloo: until the
process group's timeout).

How. Inside the block every DDP forward starts with one agreement: an
all_reduce (SUM) of N + 2 int32, where each rank that still has a batch sets
its own slot of an N-long "active" bitmap and adds 1 to "grad enabled" and to
"a synced backward follows". A rank that has left the loop (Join.finish)
contributes zeros, one agreement per iteration of the others, and then
repeats what their iteration does collectively: the one-time
bucket rebuild, the buffer broadcast, and, when a synced backward follows,
every bucket's reduction with zero gradients (Reducer.shadow_backward). When an
agreement finds no active rank, every rank has joined and the loop ends on all
of them at once. Cost: one small blocking all_reduce per forward (one
latency alpha; a host read of N + 2 integers), only inside ``join()``.

What the average divides by. Joined ranks contribute zero gradients. With
``divide_by_initial_world_size=True`` (torch's default) every reduction still
divides by N, the size of the process group: p.grad = (sum over the ranks with
inputs of their gradient) / N, so a step taken by fewer ranks is smaller, as if
the missing ranks had a batch with zero gradient. With ``False`` it divides by
the number of ranks with inputs in that iteration: p.grad is their mean.

Where state comes from. The rank that rebuilds buckets or broadcasts buffers
is the lowest-ranked one with inputs (group rank 0 until it joins). A joined
rank takes no optimizer steps; when all have joined, the parameters and buffers
of the lowest rank among those active in the last iteration are broadcast to
every rank, so the block ends with identical replicas (torch does the same).
Optimizer state on the joined ranks is left as it was when they joined. A
joined rank's p.grad is not meaningful.

Limits. Every forward inside the block must be DDP's (other collectives in
the model's forward, e.g. SyncBatchNorm, are not shadowed), and each armed
forward must be followed by its backward, as torch requires. A hook's state is
advanced by the shadow reductions as by real ones (PowerSGD's error memory on a
joined rank is fed zeros plus its old error). An exception inside the block
ends the block on that rank without shadowing (the error is what the user must see): the others then wait until the
process group's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from minidist import comm


@dataclass(frozen=True)
class Agreement:
    """What the ranks agreed on at the start of one iteration under join()."""

    active: tuple[bool, ...]
    """Group ranks that still have an input this iteration."""
    grad_enabled: bool
    """Their forward runs with grad enabled (a bucket rebuild may be due)."""
    require_backward_grad_sync: bool
    """And a synced backward follows (require_backward_grad_sync, not no_sync)."""

    @property
    def n_active(self) -> int:
        return sum(self.active)

    @property
    def source(self) -> int:
        """The group rank whose state the others take this iteration: the lowest one with inputs."""
        return self.active.index(True) if any(self.active) else 0


def agree(group: dist.ProcessGroup | None, device: torch.device, *, grad_enabled: bool | None,
          require_backward_grad_sync: bool = False) -> Agreement:
    """One all_reduce of N + 2 int32: who is active, and what their iteration will do.

    A joined rank passes grad_enabled=None and contributes zeros.
    """
    world = dist.get_world_size(group)
    t = torch.zeros(world + 2, dtype=torch.int32)
    if grad_enabled is not None:
        t[dist.get_rank(group)] = 1
        t[world] = int(grad_enabled)
        t[world + 1] = int(grad_enabled and require_backward_grad_sync)
    t = t.to(device)  # NCCL only moves device tensors
    comm.all_reduce(t, comm.ReduceOp.SUM, group=group)
    v = t.tolist()
    return Agreement(tuple(x > 0 for x in v[:world]), v[world] > 0, v[world + 1] > 0)


class Joinable(Protocol):
    """What Join needs of the module it serves (minidist.DDP)."""

    process_group: dist.ProcessGroup | None

    def join_device(self) -> torch.device: ...

    def join_main_hook(self, agreement: Agreement) -> None:
        """On a joined rank: the collectives of one iteration of the active ranks."""

    def join_post_hook(self, source: int) -> None:
        """Once every rank has joined: take group rank `source`'s parameters and buffers."""


class Join:
    """The context manager returned by DDP.join(); see the module docstring for the semantics."""

    def __init__(self, joinable: Joinable, *, divide_by_initial_world_size: bool = True):
        self.joinable = joinable
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.last_source: int | None = None
        """Lowest active rank of the latest iteration that had one: the final state's owner."""

    def notify(self, *, grad_enabled: bool, require_backward_grad_sync: bool) -> Agreement:
        """An active rank's forward: take part in this iteration's agreement."""
        return self._agree(grad_enabled=grad_enabled, require_backward_grad_sync=require_backward_grad_sync)

    def divisor(self, agreement: Agreement) -> int | None:
        """What the coming average divides by: None for the group size N, else the active count."""
        return None if self.divide_by_initial_world_size else agreement.n_active

    def _agree(self, **kw) -> Agreement:
        a = agree(self.joinable.process_group, self.joinable.join_device(), **kw)
        if a.n_active:
            self.last_source = a.source
        return a

    def finish(self) -> None:
        """This rank is out of inputs: shadow the others' iterations until every rank is, then sync."""
        while True:
            a = self._agree(grad_enabled=None)
            if not a.n_active:
                break
            self.joinable.join_main_hook(a)
        if self.last_source is not None:
            self.joinable.join_post_hook(self.last_source)


__all__ = ["Agreement", "Join", "Joinable", "agree"]
