"""Step 3: start each gradient's all_reduce the moment autograd has produced it.

Backward computes the last layer's gradients first. A hook on each parameter
(register_post_accumulate_grad_hook: it runs once p.grad holds this backward's
gradient) launches an async all_reduce and backward carries on with the earlier
layers while it travels. Only what is still in flight when backward ends adds to the
step. Same bytes as steps 1 and 2, but back to one call (one latency) per tensor.

Why this is safe: every rank runs the same backward graph, so the hooks fire in the
same order everywhere and the ranks issue matching all_reduces in the same order
(gloo and NCCL pair collectives by issue order).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.tutorial.ddp_naive import broadcast_from_rank0


# --8<-- [start:overlap]
class OverlapDDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_from_rank0(module)
        self.world = dist.get_world_size()
        self.handles: list = []      # the all_reduces in flight
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        """Runs inside backward, as soon as p.grad is complete."""
        p.grad.div_(self.world)      # divide first: the sum is then the mean
        self.handles.append(comm.all_reduce(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for handle in self.handles:  # only what is still in flight costs time
            handle.wait()
        self.handles.clear()
# --8<-- [end:overlap]
