"""Where an asynchronous ring runs: a lane, one thread per process group, and the RingWork handle.

A ring (minidist.comm.ring) is N-1 rounds of point-to-point sends and receives. Issued with
async_op on CPU tensors, it runs on its group's lane: the lane runs the group's rings one after
the other, in issue order. Order matters: every rank must post its sends and receives in the
same order; every rank issues a group's collectives in the same order, so a FIFO per group
keeps messages matched. One lane per group, not per process, so rings on two groups progress
independently, as native collectives do: ranks issuing them in different orders cannot
deadlock. At interpreter exit each lane finishes its queued rings and is joined, so no Work
handle outlives the process group. On CUDA (NCCL) a ring runs on the caller's thread: the
sends, receives and adds are queued on streams and the host does not block, so the handle
comes back complete on the host, its result ordered on the current stream.
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue
import threading
from typing import Callable

import torch
import torch.distributed as dist

from minidist.comm.groups import Group


def dispatch(run: Callable[[], None], output: torch.Tensor, group: Group, async_op: bool):
    """Run a ring now or on its group's lane: None, or with async_op a RingWork to wait() on.

    Now when there is nothing to overlap (CUDA: stream-ordered, the host does not block; a
    group of one) or when the caller waits anyway and no ring of the group is queued ahead.
    """
    if output.device.type != "cpu" or dist.get_world_size(group) == 1:
        return _run_now(run, output, async_op)
    lane = _lane(group, create=async_op)
    if not async_op and (lane is None or lane.idle()):
        return _run_now(run, output, async_op)
    work = RingWork(output, run)  # behind this group's queued rings, in issue order
    lane.submit(work._run)
    if async_op:
        return work
    work.wait()
    return None


def _run_now(run: Callable[[], None], output: torch.Tensor, async_op: bool):
    if not async_op:
        run()
        return None
    work = RingWork(output)
    work._run(run)
    return work


class RingWork:
    """The handle of an asynchronous ring: wait(), is_completed(), get_future(), as a Work has."""

    def __init__(self, output: torch.Tensor, ring: Callable[[], None] | None = None):
        self._output = output
        self._ring = ring
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._future: torch.futures.Future = torch.futures.Future()

    def _run(self, ring: Callable[[], None] | None = None) -> None:
        """Run the ring, drop it (and the input it holds), then complete the future and wake wait().

        Dropped before waking the caller: the caller, not the lane, then releases the input
        last, on its own thread (where torch's profiler sees the free: minidist.compare.allocator).
        """
        ring, self._ring = ring or self._ring, None
        try:
            ring()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            self._error = e
        ring = None  # noqa: F841
        if self._error is not None:
            self._future.set_exception(self._error)
        else:
            self._future.set_result([self._output])
        self._done.set()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        seconds = None if timeout is None else timeout.total_seconds()
        if not self._done.wait(seconds):
            raise RuntimeError(f"ring reduce_scatter did not finish within {timeout}")
        if self._error is not None:
            raise RuntimeError(f"ring reduce_scatter failed: {self._error}") from self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def get_future(self) -> torch.futures.Future:
        return self._future


class _Lane:
    """A thread that runs one process group's rings, one after the other."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # submitted and not finished; written under _LANES_LOCK
        self._thread = threading.Thread(target=self._loop, name=f"minidist-ring-{name}", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return self._pending == 0

    def submit(self, job: Callable[[], None]) -> None:
        with _LANES_LOCK:
            self._pending += 1
        self._jobs.put(job)

    def stop(self) -> None:
        """Finish the queued rings, then end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
            del job  # the ring's tensors: the caller frees them when it drops them, not when the next ring comes
            with _LANES_LOCK:
                self._pending -= 1


_LANES: dict[str, _Lane] = {}
_LANES_LOCK = threading.Lock()


def _lane(group: Group, create: bool) -> _Lane | None:
    name = (group if group is not None else dist.group.WORLD).group_name  # None and WORLD: one lane
    with _LANES_LOCK:
        lane = _LANES.get(name)
        if lane is None and create:
            lane = _LANES[name] = _Lane(name)
    return lane


@atexit.register
def _stop_lanes() -> None:
    with _LANES_LOCK:
        lanes = list(_LANES.values())
        _LANES.clear()
    for lane in lanes:
        lane.stop()


os.register_at_fork(after_in_child=_LANES.clear)  # a forked child has none of the parent's threads
