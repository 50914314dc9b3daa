"""The handles minidist.comm returns under a trace: they time every wait on a collective.

    work = comm.all_reduce(x, async_op=True)    # under comm.trace(): a TimedWork
    fut = work.get_future()                     # on the CPU: a TimedFuture (a torch future)
    fut.wait()                                  # the interval lands in Trace.waits, the seconds in Record.waited_s
    comm.collect_all([f1, f2]).wait()           # several futures at once: traced too
    fut.then(hook)                              # a continuation: its wait() is traced too

Engines wait on Work handles (FSDP, ZeRO) or on their futures (DDP's buckets, alone or
collected); each kind of wait is timed here, where minidist issues the collective, not by
patching torch's classes. Outside a trace comm returns the backend's own handles and none of
this runs. What the times mean: minidist.comm.trace.
"""

from __future__ import annotations

import time

import torch


def _note_wait(rec, traces: list, entered: float) -> float:
    """Charge a wait that began at `entered` and ends now to `rec` and to every trace."""
    returned = time.perf_counter()
    rec.waited_s += returned - entered
    for t in traces:
        t._waited(entered, returned)
    return returned


class TimedFuture(torch.futures.Future):
    """The future of a traced async collective on the CPU: completes with the backend's, timed.

    One callback on the backend's future notes the completion time (of `rec`, for a single
    collective) and hands its value (or error) on; wait() is timed like TimedWork.wait() and
    charged to `charge` (the record it waits for last). Engines chain it (then, collect_all) as
    the backend's own: it is a torch future.
    """

    def __init__(self, inner, rec, traces: list, charge=None):
        super().__init__()
        self._rec, self._charge, self._traces = rec, charge or rec, traces
        inner.add_done_callback(self._complete)

    def _complete(self, inner) -> None:
        if self._rec is not None:
            self._rec.completed_s = time.perf_counter()
        try:
            value = inner.value()
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits
            self.set_exception(exc)
        else:
            self.set_result(value)

    def wait(self):
        entered = time.perf_counter()
        try:
            return super().wait()
        finally:
            _note_wait(self._charge, self._traces, entered)

    def then(self, callback):
        """A chained future (a comm hook's continuation) whose wait() is traced too."""
        return TimedFuture(super().then(callback), None, self._traces, charge=self._charge)


def collect_all(futures: list) -> torch.futures.Future:
    """torch.futures.collect_all, and when some of `futures` are traced, its wait() is traced too."""
    collected = torch.futures.collect_all(futures)
    timed = [f for f in futures if isinstance(f, TimedFuture)]
    if not timed:
        return collected
    traces = list({id(t): t for f in timed for t in f._traces}.values())
    return TimedFuture(collected, None, traces, charge=timed[-1]._charge)


class TimedWork:
    """The handle of a traced async collective: times the caller's waits (Record.waited_s, Trace.waits).

    For a handle without a future, the completion time is taken at wait(): when wait() is
    entered if the work had already finished, else when it returns (an upper bound, the best a
    future-less handle allows). Everything else passes through.
    """

    __slots__ = ("_work", "_rec", "_traces", "_future")

    def __init__(self, work, rec, traces: list, future):
        self._work, self._rec, self._traces, self._future = work, rec, traces, future

    def wait(self, *args, **kwargs):
        entered = time.perf_counter()
        finished_before = self._future is None and self._work.is_completed()
        done = self._work.wait(*args, **kwargs)
        returned = _note_wait(self._rec, self._traces, entered)
        if self._rec.completed_s is None:  # no future, or its callback is still to run
            self._rec.completed_s = entered if finished_before else returned
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        if self._future is None:
            return self._work.get_future()  # raises as the backend's does
        return self._future

    def __getattr__(self, name: str):
        return getattr(self._work, name)
