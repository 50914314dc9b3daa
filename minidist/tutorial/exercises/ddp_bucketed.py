"""Rung 4: buckets. Overlap as in rung 3, with few collectives as in rung 2.

    model = BucketedDDP(module, bucket_size_mb=25); loss.backward(); model.finish_gradient_synchronization()

Group the parameters, from the last to the first (backward's order), into buckets of at most
`bucket_size_mb` MiB (a larger parameter gets a bucket of its own). A gradient hook counts its
bucket down; when its last gradient is in, flatten the bucket and launch one asynchronous
all_reduce. finish_gradient_synchronization() waits and copies the results into p.grad.

The checker (python -m minidist.tutorial.check ddp_bucketed mine.py) holds you to:
  * every rank starts from rank 0's parameters; K steps equal one process on the whole batch;
  * all_reduces per step (torch's profiler): more than one and fewer than the tensors with a
    small cap (4 KiB); one or two with a cap larger than the model;
  * with a small cap, the first all_reduce starts while backward still has layers to compute;
  * 2 S (N-1)/N bytes per rank and step (the kernel's count);
  * at most one copy of the gradients (S) of extra memory.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from minidist.tutorial.ddp_naive import broadcast_from_rank0  # noqa: F401 - rung 1's (or your own)


def assign_buckets(params: list, bucket_bytes: float) -> list[list]:
    """Consecutive parameters, from the last to the first, in buckets of at most bucket_bytes."""
    raise NotImplementedError("assign_buckets")


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float):
        """Keep `module` as self.module, start from rank 0's values, plan the buckets, hook every parameter."""
        super().__init__()
        raise NotImplementedError("BucketedDDP.__init__")

    def forward(self, *args, **kwargs):
        raise NotImplementedError("BucketedDDP.forward")

    @torch.no_grad()
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        """Count p's bucket down; when it is full, flatten it and launch its async all_reduce."""
        raise NotImplementedError("BucketedDDP._on_grad_ready")

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket in flight and copy its mean back into each p.grad; reset the counts."""
        raise NotImplementedError("BucketedDDP.finish_gradient_synchronization")
