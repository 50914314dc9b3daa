"""Rung 1, DDP at its simplest: after backward, average each gradient with a blocking all_reduce.

    model = NaiveDDP(module)         # every rank: the same module class, any initial values
    loss_fn(model(my_slice)).backward()
    model.finish_gradient_synchronization()
    optimizer.step()                 # the same step on every rank: the replicas stay equal

The checker (python -m minidist.tutorial.check ddp_naive mine.py) holds you to:
  * after construction every rank holds rank 0's parameters (ranks start from different seeds);
  * K steps at N ranks, each on its 1/N of the batch, equal one process on the whole batch;
  * one all_reduce per parameter tensor per step (counted by torch's profiler);
  * 2 S (N-1)/N bytes written per rank and step (S: the gradients' bytes), counted by the kernel;
  * no more extra memory during the synchronisation than the largest gradient (torch's MemTracker).

Use minidist.comm (its calls take torch.distributed's arguments and are traced) or
torch.distributed directly: the checks count what the process does, not which module it called.
"""

from __future__ import annotations

import torch
import torch.nn as nn


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module) -> None:
    """Every replica starts from rank 0's parameters and buffers (a broadcast per tensor, in place)."""
    raise NotImplementedError("broadcast_from_rank0: broadcast every parameter and buffer from rank 0")


class NaiveDDP(nn.Module):
    def __init__(self, module: nn.Module):
        """Keep `module` as self.module and make every rank start from rank 0's values."""
        super().__init__()
        raise NotImplementedError("NaiveDDP.__init__")

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, unchanged."""
        raise NotImplementedError("NaiveDDP.forward")

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """After loss.backward(): every p.grad becomes the mean over the ranks (all_reduce sums)."""
        raise NotImplementedError("NaiveDDP.finish_gradient_synchronization")
