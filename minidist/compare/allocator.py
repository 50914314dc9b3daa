"""Peak memory as the allocator saw it: an instrument minidist does not own.

    with AllocatorPeak(device) as peak:     # opened before the model is built
        bench = build(); warm_up()
        for _ in range(2):
            with peak.window():             # a step whose peak counts
                step()
    peak.peaks                              # live bytes at each window's peak
    peak.bytes                              # the highest of them: what a run must have room for

CUDA: the caching allocator's own statistics, torch.cuda.max_memory_allocated() after
reset_peak_memory_stats() (bytes handed to tensors; the cache it keeps beyond is not counted).

CPU: torch keeps no allocator statistics, but torch.profiler(profile_memory=True) records an
event for every allocation and free of the CPU allocator (its address and signed size).
The running sum of those events is the live bytes allocated since the profiler started, so
the session opens before the model is built (parameters, gradients, optimizer state and
engine buffers are then all inside it) and the peak is read inside window(). Two limits of
the instrument, both stated where numbers are printed:

  * the profiler's state is per thread: it sees the thread it started on, and gloo's worker
    while it runs a collective (gloo carries the caller's state into the work: its staging
    buffers are seen), but not minidist's ring lane (a Python thread) nor gloo's worker after
    the collective. The ledger (memory.py) sees the main thread's tensors;
  * a free of memory allocated before the session is not reported (torch logs a warning):
    so nothing allocated before the session may die inside it (call gc.collect() first);
  * a free on a thread it does not follow is not reported either, so a tensor whose last
    reference dies there stays counted until its address is allocated again. minidist's
    engines wait for gloo's worker to let go of what a collective was handed before they
    return it, and minidist.comm's synchronous calls before they return (minidist.comm.release),
    so their tensors die on the main thread.

Two steps of one run can peak differently (an allocation order that timing decides); comm's
own bookkeeping keeps no tensor. `bytes` is the highest window peak, the memory a run must
have room for; `peaks` has each.

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
        self.peaks: list[int] = []
        """Live bytes at the peak of each window (CPU: filled when the session closes)."""
        self.at_start: int | None = None
        """Live bytes when the first window opened."""
        self._prof = None
        self._windows: list[tuple[int, int]] = []
        self.events: list[tuple[int, int, int]] | None = None
        """CPU: (time ns, address, signed bytes) of every allocator event of the session."""

    @property
    def bytes(self) -> int | None:
        """The highest window peak (module docstring); None before any window closed."""
        return max(self.peaks) if self.peaks else None

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
            if self.at_start is None:
                self.at_start = torch.cuda.memory_allocated(self.device)
            yield
            torch.cuda.synchronize(self.device)
            self.peaks.append(torch.cuda.max_memory_allocated(self.device))
            return
        start = time.time_ns()
        yield
        self._windows.append((start, time.time_ns()))

    def __exit__(self, *exc) -> None:
        if self._prof is None:
            return
        self._prof.__exit__(*exc)
        if exc[0] is None and self._windows:
            self.events = _allocations(self._prof)
            self.at_start, self.peaks = _cpu_peaks(self.events, self._windows)
        self._prof = None


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


def _cpu_peaks(events: list[tuple[int, int, int]], windows: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """(live bytes when the first window opens, the peak live bytes inside each window).

    A free counts only if its block was allocated inside the session (matched by address):
    the reporter keeps blocks of earlier sessions in its table and would report their frees.
    An allocation at an address still live here means its block was freed where the profiler
    does not look (another thread): the old block stops counting then, rather than staying
    counted for the rest of the session.
    """
    live: dict[int, int] = {}
    total, at_start = 0, None
    peaks = [None] * len(windows)
    for t, ptr, nbytes in events:
        if at_start is None and t >= windows[0][0]:
            at_start = total
        for k, (a, b) in enumerate(windows):
            if peaks[k] is None and t >= a:
                peaks[k] = total  # live when the window opened
        if nbytes > 0:
            total += nbytes - live.get(ptr, 0)  # an address in use again: its block was freed unseen
            live[ptr] = nbytes
        else:
            total -= live.pop(ptr, 0)
        for k, (a, b) in enumerate(windows):
            if a <= t <= b:
                peaks[k] = max(peaks[k], total)
    return (total if at_start is None else at_start), [total if p is None else p for p in peaks]
