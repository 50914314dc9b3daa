"""Step 4: buckets. Overlap as in step 3, with few collectives as in step 2.

The parameters are grouped, in reverse order (backward reaches the last layers
first), into buckets of about `bucket_size_mb`. A gradient hook counts its bucket
down; when the last gradient of a bucket is in, the bucket is flattened and one async
all_reduce launches. At the end of backward each result is copied back into p.grad.

The bucket size trades the two costs: a bucket must fill before it can travel, so
one huge bucket starts only when backward is over (step 2, no overlap); tiny buckets
pay a latency each (step 3). Same bytes as every other step: 2 S (N-1)/N per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.tutorial.ddp_naive import broadcast_from_rank0


# --8<-- [start:assign]
def assign_buckets(params: list, bucket_bytes: float) -> list[list]:
    """Consecutive parameters, from the last to the first, in buckets of at most
    bucket_bytes (a larger parameter gets a bucket of its own)."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets
# --8<-- [end:assign]


# --8<-- [start:bucketed]
class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float):
        super().__init__()
        self.module = module
        broadcast_from_rank0(module)
        self.world = dist.get_world_size()
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(params, bucket_size_mb * 2**20)
        self.bucket_of = {p: b for b, ps in enumerate(self.buckets) for p in ps}
        self.waiting = [len(ps) for ps in self.buckets]  # gradients to come
        self.in_flight: list = []        # (bucket index, flat buffer, handle)
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        b = self.bucket_of[p]
        self.waiting[b] -= 1
        if self.waiting[b] == 0:         # the bucket is full: flatten, send
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[b]])
            flat.div_(self.world)
            handle = comm.all_reduce(flat, async_op=True)
            self.in_flight.append((b, flat, handle))

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        for b, flat, handle in self.in_flight:
            handle.wait()
            grads = [q.grad for q in self.buckets[b]]
            pieces = flat.split([g.numel() for g in grads])
            for g, piece in zip(grads, pieces):
                g.copy_(piece.view_as(g))
        self.in_flight.clear()
        self.waiting = [len(ps) for ps in self.buckets]
# --8<-- [end:bucketed]
