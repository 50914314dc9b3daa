"""Rung 8, pipeline parallelism: one stage per rank, micro-batches, GPipe and 1F1B over send and recv.

    pipe = Pipeline(stage, microbatches=8, schedule="1f1b")   # stage: this rank's block; rank r is stage r
    loss = pipe.step(x, target, loss_fn)    # every rank passes the same batch; the mean loss on the last
    optimizer.step()                        # over stage.parameters(): their gradients are in p.grad

Cut x and target into m equal micro-batches (torch.chunk). Two kinds of action, run on each rank in
the order its schedule gives:

    F(i)   rank 0 runs the stage on x's piece i; rank r > 0 receives micro-batch i's activation from
           r-1 into a buffer of the piece's shape (every stage maps (rows, h) to (rows, h)) and runs
           the stage on it; the last rank returns loss_fn(output, target's piece i) / m, the others
           send the output to r+1. Keep what B(i) needs.
    B(i)   backward of F(i): the last rank from its loss, the others from the gradient received from
           r+1; rank r > 0 sends its input's gradient to r-1.

    gpipe  F(0) .. F(m-1), then B(0) .. B(m-1)
    1f1b   min(N-1-r, m) forwards, then a forward and a backward in turn, then the remaining backwards

Receive (recv, or irecv(...).wait()) just before you need the tensor. Send an activation with
isend (minidist.comm.isend or torch.distributed.isend) and wait for it in B(i), once its gradient
has come back: a send waited for only at the end of the step keeps every micro-batch's tensor
alive until then. Send a gradient and wait for it at once (rank r-1 reaches B(i) without needing
anything more from you).

The checker (python -m minidist.tutorial.check pp mine.py) holds you to:
  * K SGD steps under both schedules equal one process running every stage on the whole batch
    (each rank's stage, and the loss on the last rank; None elsewhere);
  * m sends to and m receives from each neighbour per step, no collective (torch's profiler), and
    2 b h e (N-1)/N bytes per rank (the kernel's count): the batch's activations forward and their
    gradients back, once per boundary;
  * GPipe's first stage holding all m micro-batches' activations at its peak, 1F1B's rank r at most
    N - r of them (torch's MemTracker).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def order(schedule: str, rank: int, world: int, microbatches: int) -> list[tuple[str, int]]:
    """This rank's actions, ("F", i) and ("B", i), in the order it runs them (gpipe or 1f1b)."""
    raise NotImplementedError("order")


class Pipeline:
    """Stage `rank` of a pipeline over every rank of the default group."""

    def __init__(self, stage: nn.Module, microbatches: int, schedule: str = "1f1b"):
        raise NotImplementedError("Pipeline.__init__")

    def step(self, x: torch.Tensor, target: torch.Tensor, loss_fn: Callable) -> float | None:
        """Forward and backward of the whole batch; the mean loss on the last rank, None elsewhere."""
        raise NotImplementedError("Pipeline.step")
