"""Step 1: DDP at its simplest. After backward, average each gradient with a blocking all_reduce.

Cost per step: one all_reduce per parameter tensor, 2 S (N-1)/N bytes sent per rank in
all (S = bytes of the gradients), every one of them after backward has finished, so
the whole communication time adds to the step; each call also pays the collective's
fixed latency, once per tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm


# --8<-- [start:broadcast]
@torch.no_grad()
def broadcast_from_rank0(module: nn.Module) -> None:
    """Every replica starts from rank 0's parameters and buffers."""
    for t in [*module.parameters(), *module.buffers()]:
        comm.broadcast(t, src=0)
# --8<-- [end:broadcast]


# --8<-- [start:naive]
class NaiveDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """After loss.backward(): every p.grad becomes the mean over the ranks."""
        world = dist.get_world_size()
        for p in self.module.parameters():
            if p.requires_grad:
                comm.all_reduce(p.grad)  # in place: the SUM over ranks; blocks
                p.grad.div_(world)       # sum of N per-rank means / N = the mean
# --8<-- [end:naive]
