"""What runs where a backend lacks a collective or an op: a documented equivalent, never a silently different answer.

    ReduceOp.AVG on gloo      SUM, then divide by the group size (_avg_via_sum)
    reduce_scatter on a       all_reduce a copy of the input, keep this rank's chunk: the same
    backend without it        result, twice the wire traffic (_reduce_scatter_by_all_reduce)

FinishingWork is how an asynchronous fallback finishes: the collective's Work, plus the step
(the divide, the chunk copy) that makes its result the one asked for, run once.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from minidist.comm.groups import Group

# torch 2.14 names the single-tensor form reduce_scatter_single; older releases only have reduce_scatter_tensor.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class FinishingWork:
    """A Work handle whose completion also runs a finishing step on this rank.

    Used by the fallbacks below (and coalesced.py): the collective runs asynchronously, and the
    divide (AVG) or chunk copy (reduce_scatter) happens exactly once, on wait()
    or when the future completes, whichever comes first.
    """

    def __init__(self, work: dist.Work, finish: Callable[[], None]):
        self._work = work
        self._finish = finish
        self._lock = threading.Lock()
        self._finished = False

    def _finish_once(self) -> None:
        with self._lock:
            if not self._finished:
                self._finished = True
                self._finish()

    def wait(self, timeout=None) -> bool:
        self._work.wait() if timeout is None else self._work.wait(timeout)
        self._finish_once()
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed() and self._finished

    def get_future(self) -> torch.futures.Future:
        def _then(fut):
            self._finish_once()
            return fut.value()
        return self._work.get_future().then(_then)


def _avg_via_sum(tensor: torch.Tensor, group: Group, run: Callable[[ReduceOp], object], async_op: bool):
    """Run `run(SUM)` and divide the result tensor by the group size."""
    n = dist.get_world_size(group)
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"ReduceOp.AVG needs a floating tensor, got {tensor.dtype}")
    work = run(ReduceOp.SUM)
    if async_op:
        return FinishingWork(work, lambda: tensor.div_(n))
    tensor.div_(n)
    return None


def _native_reduce_scatter(output, flat, op, group, async_op):
    """The backend's reduce_scatter, or on a backend without one the all_reduce fallback below."""
    try:
        return _reduce_scatter_single(output, flat.view_as(flat), op, group=group, async_op=async_op)
    except RuntimeError as e:
        if "does not support" not in str(e):
            raise
        return _reduce_scatter_by_all_reduce(output, flat, op, group, async_op)


def _reduce_scatter_by_all_reduce(output, flat, op, group, async_op):
    """Fallback for backends without reduce_scatter: all_reduce a copy, keep our chunk."""
    scratch = flat.clone()
    rank = dist.get_rank(group)
    work = dist.all_reduce(scratch, op, group=group, async_op=async_op)
    copy = lambda: output.view(-1).copy_(scratch.view(-1).chunk(dist.get_world_size(group))[rank])  # noqa: E731
    if async_op:
        return FinishingWork(work, copy)
    copy()
    return None
