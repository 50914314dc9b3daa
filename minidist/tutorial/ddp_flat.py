"""Step 2: one all_reduce for all the gradients, flattened into one buffer.

Same bytes as step 1 (2 S (N-1)/N per rank), but one collective instead of one per
tensor: the fixed latency is paid once. The price: a flat copy of every gradient (S
more bytes of memory) and two copies per step (in and out). Still nothing overlaps:
communication starts only after backward has finished.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.tutorial.ddp_naive import broadcast_from_rank0


# --8<-- [start:flat]
class FlatDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        params = [p for p in self.module.parameters() if p.requires_grad]
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # copy in: S bytes
        comm.all_reduce(flat)                   # one collective for everything
        flat.div_(dist.get_world_size())
        pieces = flat.split([g.numel() for g in grads])
        for g, piece in zip(grads, pieces):
            g.copy_(piece.view_as(g))           # copy out, into each p.grad
# --8<-- [end:flat]
