"""Peak memory as the allocator saw it: an instrument minidist does not own.

    with AllocatorPeak(device) as peak:     # opened before the model is built
        bench = build(); warm_up()
        with peak.window():                 # the step whose peak counts
            step()
    peak.bytes                              # live bytes at the window's peak

CUDA: the caching allocator's own statistics, torch.cuda.max_memory_allocated() after
reset_peak_memory_stats() (bytes handed to tensors; the cache it keeps beyond is not counted).

CPU: torch keeps no allocator statistics, but torch.profiler(profile_memory=True) records an
event for every allocation and free of the CPU allocator (its address and signed size).
The running sum of those events is the live bytes allocated since the profiler started, so
the session opens before the model is built (parameters, gradients, optimizer state and
engine buffers are then all inside it) and the peak is read inside window(). Two limits of
the instrument, both stated where numbers are printed:

  * the profiler's state is per thread: allocations on threads it did not start on (gloo's
    workers, minidist's ring lane) are not seen. The ledger (memory.py) sees the same
    main-thread tensors, so the two are compared like with like;
  * a free of memory allocated before the session is not reported (torch logs a warning):
    so nothing allocated before the session may die inside it (call gc.collect() first).

Kineto, the profiler's backend, prints its own log lines on a CUDA build without a GPU;
KINETO_LOG_LEVEL (unless the user set it) keeps it quiet.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import torch


class AllocatorPeak:
    """Peak live bytes of the allocator inside window() (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.bytes: int | None = None
        """Live bytes at the peak of the last window (None before it closed)."""
        self.at_start: int | None = None
        """Live bytes when the last window opened."""
        self._prof = None
        self._window: tuple[int, int] | None = None

    @property
    def instrument(self) -> str:
        return ("torch.cuda.max_memory_allocated" if self.device.type == "cuda"
                else "torch.profiler allocation events (main thread)")

    def __enter__(self) -> "AllocatorPeak":
        if self.device.type == "cpu":
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            from torch.profiler import ProfilerActivity, profile
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.at_start = torch.cuda.memory_allocated(self.device)
            yield
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device)
            return
        start = time.time_ns()
        yield
        self._window = (start, time.time_ns())

    def __exit__(self, *exc) -> None:
        if self._prof is None:
            return
        self._prof.__exit__(*exc)
        if exc[0] is None and self._window is not None:
            self.at_start, self.bytes = _cpu_peak(self._prof, *self._window)
        self._prof_saved, self._prof = self._prof, None


def _allocations(prof) -> list[tuple[int, int, int]]:
    """(time ns, address, signed bytes) of every CPU allocator event, in time order."""
    alloc = torch._C._profiler._EventType.Allocation
    out, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == alloc and e.extra_fields.device.type == "cpu":
            out.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
    return sorted(out)


def _cpu_peak(prof, start_ns: int, end_ns: int) -> tuple[int, int]:
    """(live bytes at start_ns, peak live bytes in [start_ns, end_ns]) from the allocation events.

    A free counts only if its block was allocated inside the session (matched by address):
    the reporter keeps blocks of earlier sessions in its table and would report their frees.
    """
    live: dict[int, int] = {}
    total = 0
    at_start = peak = None
    for t, ptr, nbytes in _allocations(prof):
        if at_start is None and t >= start_ns:
            at_start = peak = total
        if nbytes > 0:
            live[ptr] = nbytes
            total += nbytes
        else:
            total -= live.pop(ptr, 0)
        if start_ns <= t <= end_ns:
            peak = max(peak, total)
    if at_start is None:
        at_start = peak = total
    return at_start, peak
