"""What one rank did during the measured steps: phases, waits on collectives, and the collectives.

    rec = StepRecorder(t0)                   # t0: this rank's perf_counter() when all ranks left a barrier
    with comm.trace() as tr, rec.recording_waits():
        with rec.phase("forward", step): ...
    rec.to_dict(tr, backend)                 # plain JSON, seconds since t0

Nothing here synchronises a collective: the trace notes when each was issued and when it
completed (its future's callback, on the backend's thread), phases are perf_counter() at their
edges, and a wait is the time this thread spent inside Work.wait() / Future.wait() - the only
moments the main thread stops computing because of communication. Those two methods are
wrapped while recording_waits() is active (DDP waits on futures, FSDP and ZeRO-1 on works).

A collective without a future (gloo's async reduce_scatter: an all_reduce and a copy behind a
lambda) completes, as far as anyone can observe, when it is waited on; its record says so
("completion": "wait"), and its span is an upper bound.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import torch
import torch.distributed as dist

from minidist import comm


class StepRecorder:
    """Phase and wait intervals of this rank, in seconds since `t0` (a perf_counter() value)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.phases: list[tuple[str, str, int, float, float]] = []
        """(strategy, phase, step, start, end)."""
        self.waits: list[tuple[str, float, float]] = []
        """(strategy, start, end)."""
        self.strategy = ""
        self._thread = threading.get_ident()

    @contextlib.contextmanager
    def phase(self, name: str, step: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phases.append((self.strategy, name, step, start - self.t0, time.perf_counter() - self.t0))

    @contextlib.contextmanager
    def recording_waits(self) -> Iterator[None]:
        """Record every Work.wait() / Future.wait() this thread makes inside the block."""
        classes = (dist.Work, torch._C.Future)
        originals = [cls.wait for cls in classes]

        def wrap(original):
            def wait(handle, *args, **kwargs):
                if threading.get_ident() != self._thread:
                    return original(handle, *args, **kwargs)
                start = time.perf_counter()
                try:
                    return original(handle, *args, **kwargs)
                finally:
                    self.waits.append((self.strategy, start - self.t0, time.perf_counter() - self.t0))
            return wait

        for cls, original in zip(classes, originals):
            cls.wait = wrap(original)
        try:
            yield
        finally:
            for cls, original in zip(classes, originals):
                cls.wait = original

    def records(self, trace: comm.Trace, backend: str) -> list[dict]:
        """The trace's records as plain dicts, times in seconds since t0."""
        out = []
        for r in trace.records:
            futureless = r.async_op and r.op == "reduce_scatter" and backend == "gloo" and r.algorithm == "native"
            out.append({"strategy": self.strategy, "op": r.op, "group": r.group, "group_size": r.group_size,
                        "dtype": r.dtype, "payload_bytes": r.payload_bytes, "sent_bytes": r.sent_bytes,
                        "algorithm": r.algorithm, "wire_op": r.wire_op or r.op, "wire_bytes": r.wire_bytes,
                        "async_op": r.async_op, "issued": r.issued_s - self.t0,
                        "completed": None if r.completed_s is None else r.completed_s - self.t0,
                        "completion": "wait" if futureless else "future" if r.async_op else "sync"})
        return out
