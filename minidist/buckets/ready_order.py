"""The order gradients became ready in, recorded once, from which the buckets are rebuilt once.

Why: the initial buckets follow reverse registration order, only a guess of
the order backward produces gradients in; a bucket whose parameters are ready
late holds back every later bucket (they launch in bucket order). The first
synced backward records the real order; before the next forward the buckets
are rebuilt from one rank's record (rank 0's, or under join the first rank
still with inputs), broadcast so that every rank builds the same buckets.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm


class ReadyOrder:
    """Records parameter indices during the first synced backward; hands them out once for the rebuild."""

    def __init__(self, n_params: int):
        self.n_params = n_params
        self.order: list[int] = []
        self.recorded = False
        """A whole synced backward was recorded; the next forward rebuilds."""
        self.rebuilds = 0

    def note(self, i: int) -> None:
        if self.rebuilds == 0 and not self.recorded:
            self.order.append(i)

    def backward_done(self) -> None:
        self.recorded = self.rebuilds == 0

    def backward_abandoned(self) -> None:
        if not self.recorded:
            self.order = []  # a partial record; the next synced backward records afresh

    @property
    def rebuild_due(self) -> bool:
        return self.rebuilds == 0 and self.recorded

    def agree(self, device: torch.device, group: dist.ProcessGroup | None, source: int) -> list[int]:
        """Group rank `source`'s record, on every rank (a collective: every rank calls it)."""
        assert self.rebuild_due, "the ready order is agreed once, after a recorded backward"
        order = torch.tensor(self.order or [0] * self.n_params, dtype=torch.int64).to(device)  # NCCL: device tensors
        comm.broadcast(order, group=group, group_src=source)
        self.rebuilds += 1
        self.order = []
        return order.tolist()
