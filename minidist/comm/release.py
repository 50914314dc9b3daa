"""After an async collective: wait until the backend's thread has let go of the tensors it was handed.

    handed = comm.Handed(grads)          # before the collective: who refers to them now
    work = comm.all_reduce_coalesced(grads, async_op=True)
    work.get_future().wait()             # the sums are in place ...
    handed.wait_released()               # ... and gloo's worker no longer refers to them

Why. gloo runs a collective on its own worker thread, and the Work it runs holds the tensors
(its inputs, and its future's value) until that thread, after completing the future, comes
back to drop it. On a loaded machine that can be milliseconds after the caller's wait()
returned, later than the optimizer step and zero_grad(): measured on the CPU benchmark GPT,
in most steps the gradients were still held by gloo when backward returned. Whoever drops a
tensor's last reference frees it; if that is gloo's thread, (1) the memory outlives the
caller's zero_grad() by a margin that depends on scheduling, so a step's peak depends on it,
and (2) torch's profiler, which follows the thread it started on, never sees the free, and
counts the tensor as alive until its address is reused (minidist.compare.allocator).
Waiting for the release makes the caller's own reference the last one, on its thread.

How. A tensor's reference count (TensorImpl's use count, torch's Tensor._use_count) is read
before the collective; after it, the caller yields the CPU (os.sched_yield) until every count
is back to what it was. Nothing else runs meanwhile, so the only references that can go are
the backend's. Bounded by RELEASE_TIMEOUT_S: a reference taken meanwhile by someone else
(a view made by a hook) would never go; the wait then gives up and the memory behaves as
before. Cost: a read of one integer per tensor, and usually no wait at all (the worker drops
the Work microseconds after completing its future); at most the time the worker needs to be
scheduled again. Host tensors only: on an accelerator a finished collective's tensors are kept
by the stream machinery (NCCL's work record) and given back to the caching allocator, whose
statistics see every free; there is nothing to wait for.

Synchronous calls (minidist.comm's functions without async_op) wait the same way before they
return, counting references to each tensor's storage (whole_storage=True) rather than to the
tensor object: the call itself may hand the backend a view (a flattened input), and minidist's
ring lane makes views of the pieces it sends. The caller's thread is inside the call, so no
reference of its own appears meanwhile. Without it, tensor parallelism's activations (gathered,
scattered on every layer) died on gloo's thread in many steps on a loaded machine, and torch's
profiler counted 0.1-1 MB of them alive at an 8 MB peak (tests/compare/test_plan.py).
"""

from __future__ import annotations

import os
import time
from typing import Iterable

import torch

RELEASE_TIMEOUT_S = 0.05
"""Longest wait for the backend to let go; past it, the tensors are left as they are."""


def _tensor_refs(t: torch.Tensor) -> tuple[int, ...]:
    return (t._use_count(),)


def _tensor_and_storage_refs(t: torch.Tensor) -> tuple[int, int]:
    """References to the tensor object (a copy of the handle the backend keeps) and to its memory (a view)."""
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class Handed:
    """Tensors about to be handed to a collective, and their reference counts before.

    whole_storage: count references to the tensors' memory (any view of it) as well as to the
    tensor objects; only where nothing else on this thread can make a view meanwhile (a
    synchronous call)."""

    def __init__(self, tensors: Iterable[torch.Tensor], *, whole_storage: bool = False):
        self.tensors = [t for t in tensors if t.device.type == "cpu" and t.layout == torch.strided]
        self._refs = _tensor_and_storage_refs if whole_storage else _tensor_refs
        self.counts = [self._refs(t) for t in self.tensors]

    def released(self) -> bool:
        """No reference beyond those counted before remains (the backend's are gone)."""
        return all(now <= before for t, c in zip(self.tensors, self.counts) for now, before in zip(self._refs(t), c))

    def wait_released(self) -> bool:
        """Yield until released() (at most RELEASE_TIMEOUT_S); whether it was. Call after the collective
        completed, with the caller's own extra handles (its Work, its future) already dropped."""
        deadline = None
        while not self.released():
            if deadline is None:
                deadline = time.perf_counter() + RELEASE_TIMEOUT_S
            elif time.perf_counter() > deadline:
                return False
            os.sched_yield()
        return True
