"""Pipeline parallelism in miniature: one stage per rank, micro-batches, GPipe or 1F1B over send and recv.

Split the model's depth instead of its batch or its layers' width: rank r of N holds stage r
(consecutive layers), the batch is cut into m micro-batches, and each micro-batch's activation
flows forward from rank to rank, its gradient back:

    F(i)   stage r on micro-batch i: rank 0 reads the batch's piece, rank r > 0 receives the
           activation from r-1; the last rank computes loss_fn / m, the others send to r+1
    B(i)   backward of F(i): the last rank from its loss, the others from the gradient received
           from r+1; rank r > 0 sends its input's gradient to r-1

Only the order of F and B on each rank differs between schedules (Huang et al. 2019; Narayanan
et al. 2021):

    gpipe   F(0) .. F(m-1), then B(0) .. B(m-1): every rank holds m micro-batches' activations
    1f1b    N-1-r forwards to warm up, then one forward and one backward in turn, then the rest
            of the backwards: rank r holds at most N-r micro-batches' activations

Both have the same bubble, (N-1)/(m+N-1) of every rank's time idle while the pipe fills and
drains. A rank receives just before it needs a tensor. It sends an activation without waiting
(isend) and waits for that send in B(i), once the gradient answering it has arrived: a sent
tensor is freed with its micro-batch, not at the end of the step. It sends a gradient and waits
(a gloo send completes when the receive is posted): rank r-1 reaches B(i) without needing
anything more from r, so neither GPipe nor 1F1B can deadlock. Per step, every boundary carries each micro-batch's activation
forward and its gradient back: 2 b h e bytes (b rows of width h, e bytes each), whatever m is.

Every stage maps (rows, h) to (rows, h): a receiver allocates its buffer from the micro-batch's
shape. The real engine (minidist/pp/) sends a shape header instead, runs schedules as checked
data (interleaved stages, zero-bubble), and composes with data parallelism.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm


# --8<-- [start:order]
def order(schedule: str, rank: int, world: int, microbatches: int) -> list[tuple[str, int]]:
    """This rank's actions, ("F", i) and ("B", i), in the order it runs them."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"schedule must be gpipe or 1f1b, got {schedule!r}")
    warmup = min(world - 1 - rank, m)
    steady = [a for i in range(m - warmup) for a in (("F", warmup + i), ("B", i))]
    return [("F", i) for i in range(warmup)] + steady + [("B", i) for i in range(m - warmup, m)]
# --8<-- [end:order]


# --8<-- [start:pipeline]
class Pipeline:
    """Stage `rank` of a pipeline over every rank of the default group."""

    def __init__(self, stage: nn.Module, microbatches: int, schedule: str = "1f1b"):
        self.stage, self.microbatches, self.schedule = stage, microbatches, schedule
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def step(self, x: torch.Tensor, target: torch.Tensor, loss_fn: Callable) -> float | None:
        """Forward and backward of the whole batch; the mean loss on the last rank, None elsewhere."""
        first, last = self.rank == 0, self.rank == self.world - 1
        xs, targets = x.chunk(self.microbatches), target.chunk(self.microbatches)
        held, total = {}, 0.0
        for kind, i in order(self.schedule, self.rank, self.world, self.microbatches):
            if kind == "F":
                inp = xs[i] if first else self._recv(torch.empty_like(xs[i]), self.rank - 1).requires_grad_()
                out, sent = self.stage(inp), None
                if last:
                    out = loss_fn(out, targets[i]) / self.microbatches
                    total += out.item()
                else:
                    sent = comm.isend(out.detach(), self.rank + 1)
                held[i] = (inp, out, sent)                 # kept for B(i): the activations live on
            else:
                inp, out, sent = held.pop(i)
                out.backward(None if last else self._recv(torch.empty_like(out), self.rank + 1))
                if sent is not None:
                    sent.wait()                            # its gradient came back: it has arrived
                if not first:
                    comm.isend(inp.grad, self.rank - 1).wait()
        return total if last else None

    @staticmethod
    def _recv(buffer: torch.Tensor, src: int) -> torch.Tensor:
        comm.irecv(buffer, src).wait()
        return buffer
# --8<-- [end:pipeline]
