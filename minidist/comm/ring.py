"""A ring reduce_scatter from point-to-point sends: S (N-1)/N bytes per rank, the minimum (and a
ring all_gather that receives in place: ring_all_gather).

Why: gloo's reduce_scatter all_reduces a copy of the whole input and keeps one chunk, so
each rank sends 2 S (N-1)/N bytes, twice what a reduce_scatter needs (torch's FSDP2 on gloo
pays the same). A ring of isend/irecv moves the minimum:

    N ranks, group rank r, input = N chunks of k elements; chunk i is rank i's result
    step s = 0 .. N-2:
        send    chunk (r-1-s) mod N to r+1   (step 0: my input's chunk; later: what I reduced)
        receive chunk (r-2-s) mod N from r-1 and reduce my input's chunk of that index into it
    the chunk received at step N-2 is chunk r, reduced over all N inputs: the output.

    per rank: N-1 messages of S/N bytes: (N-1) alpha + S (N-1)/N beta   (cost.py's ring row)
    memory:   up to two scratch chunks of S/N (gloo's own path copies the whole input: S)

The ring pays N-1 latencies where halving-doubling pays log2 N: it wins on bandwidth and
can lose on tiny payloads at large N. SUM, PRODUCT, MIN and MAX reduce on the way; AVG is
SUM then one divide (collectives.py), as for gloo.

Who chooses: collectives.reduce_scatter(..., algorithm=) with "native", "ring" or "auto"
(None: the process default, set_reduce_scatter_algorithm / reduce_scatter_algorithm()).
"auto" picks the ring where the native collective moves more than the ring minimum: gloo on
CPU tensors; NCCL's reduce_scatter is already a ring.

async_op on CPU tensors: the ring runs on a lane, one thread per process group that runs the
group's rings in issue order. Order matters: every rank must post its sends and receives in
the same order; every rank issues a group's collectives in the same order, so a FIFO per
group keeps messages matched (they carry their own tag, apart from user point-to-point
traffic). One lane per group, not per process, so rings on two groups progress
independently, as native collectives do: ranks issuing them in different orders cannot
deadlock. At interpreter exit each lane finishes its queued rings and is joined, so no Work
handle outlives the process group. On CUDA (NCCL) the ring runs on the caller's thread: the
sends, receives and adds are queued on streams and the host does not block, so the handle
comes back complete on the host, its result ordered on the current stream.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import queue
import threading
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from minidist.comm.groups import Group, global_rank

ALGORITHMS = ("auto", "native", "ring")
_TAG = 0x52494E47  # "RING": keeps the ring's messages apart from the user's point-to-point ones
_COMBINE: dict = {
    ReduceOp.SUM: lambda acc, x: acc.add_(x),
    ReduceOp.PRODUCT: lambda acc, x: acc.mul_(x),
    ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
}
_default_algorithm = "auto"


def set_reduce_scatter_algorithm(name: str) -> str:
    """Make `name` ("auto", "native" or "ring") this process's default; return the previous one."""
    global _default_algorithm
    _check_algorithm(name)
    previous, _default_algorithm = _default_algorithm, name
    return previous


@contextlib.contextmanager
def reduce_scatter_algorithm(name: str) -> Iterator[None]:
    """Within the block, reduce_scatter calls without algorithm= use `name`."""
    previous = set_reduce_scatter_algorithm(name)
    try:
        yield
    finally:
        set_reduce_scatter_algorithm(previous)


def _check_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise ValueError(f"reduce_scatter algorithm must be one of {ALGORITHMS}, got {name!r}")


def choose(algorithm: str | None, group: Group, tensor: torch.Tensor) -> str:
    """"native" or "ring": what runs for `algorithm` (None = the process default) on this group."""
    name = _default_algorithm if algorithm is None else algorithm
    if name != "auto":  # an explicit choice needs no process group to answer
        return algorithm_for("", tensor.device.type, name)
    return algorithm_for(dist.get_backend(group), tensor.device.type, name)


def algorithm_for(backend: str, device_type: str = "cpu", algorithm: str | None = None) -> str:
    """"native" or "ring" for a backend and device, without a group (what an estimate assumes)."""
    name = _default_algorithm if algorithm is None else algorithm
    if name == "auto":
        return "ring" if device_type == "cpu" and backend == "gloo" else "native"
    _check_algorithm(name)
    return name


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Group = None, async_op: bool = False,
                        op=ReduceOp.SUM):
    """Reduce `input` (N * output.numel() elements) over `group`; chunk `rank` lands in `output`.

    Returns None, or with async_op a RingWork to wait() on before reading `output`. A collective:
    every rank of `group` calls it, in the same order as its other collectives.
    """
    if op not in _COMBINE:
        raise ValueError(f"ring reduce_scatter reduces with SUM, PRODUCT, MIN or MAX, got {op}")
    n = dist.get_world_size(group)
    if input.numel() != output.numel() * n:
        raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected {n} x {output.numel()}")
    run = lambda: _ring(output, input, op, group)  # noqa: E731
    if output.device.type != "cpu" or n == 1:  # stream-ordered on CUDA: the host does not block
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


def _ring(output: torch.Tensor, input: torch.Tensor, op, group: Group) -> None:
    """The N-1 steps of the module docstring, on the calling thread."""
    n, k = dist.get_world_size(group), output.numel()
    if k == 0:
        return
    chunks = input.reshape(-1).split(k)
    aliased = output.untyped_storage().data_ptr() == input.untyped_storage().data_ptr()
    in_place = output.is_contiguous() and not aliased  # else the last step lands in a scratch chunk
    out = output.view(-1) if in_place else torch.empty_like(chunks[0])
    if n == 1:
        out.copy_(chunks[0])
    else:
        r = dist.get_rank(group)
        right, left = global_rank(group, (r + 1) % n), global_rank(group, (r - 1) % n)
        combine = _COMBINE[op]
        scratch = [torch.empty_like(out) for _ in range(min(2, n - 2))]
        send = chunks[(r - 1) % n]
        for s in range(n - 1):
            recv = out if s == n - 2 else scratch[s % 2]  # never the buffer being sent
            works = (dist.isend(send, right, group=group, tag=_TAG), dist.irecv(recv, left, group=group, tag=_TAG))
            for w in works:
                w.wait()
            combine(recv, chunks[(r - 2 - s) % n])
            send = recv
    if not in_place:
        output.copy_(out.view_as(output))


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: Group = None, async_op: bool = False):
    """Every rank's `input` into chunk `rank` of `output` (N * input.numel() elements), received in place.

    The same ring the other way round: at step s rank r sends chunk (r - s) mod N (its own at
    step 0, then the one it just received) to r+1 and receives chunk (r-1-s) mod N from r-1
    straight into its slot of `output`: (N-1) alpha + S (N-1)/N beta, as gloo's all_gather, but
    without gloo's staging copy of the whole output (ProcessGroupGloo gathers into a fresh flat
    buffer, then copies it out). `input` may be `output`'s own chunk (nothing to copy then).
    """
    n = dist.get_world_size(group)
    if output.numel() != input.numel() * n or not output.is_contiguous():
        raise ValueError(f"all_gather: output must be contiguous with {n} x {input.numel()} elements, "
                         f"got {output.numel()}")
    run = lambda: _gather_ring(output, input, group)  # noqa: E731
    if output.device.type != "cpu" or n == 1:
        return _run_now(run, output, async_op)
    lane = _lane(group, create=async_op)
    if not async_op and (lane is None or lane.idle()):
        return _run_now(run, output, async_op)
    work = RingWork(output)
    lane.submit(lambda: work._run(run))
    if async_op:
        return work
    work.wait()
    return None


def _gather_ring(output: torch.Tensor, input: torch.Tensor, group: Group) -> None:
    n, k = dist.get_world_size(group), input.numel()
    chunks = output.view(-1).split(k)
    r = dist.get_rank(group)
    if chunks[r].data_ptr() != input.data_ptr():
        chunks[r].copy_(input.reshape(-1))
    right, left = global_rank(group, (r + 1) % n), global_rank(group, (r - 1) % n)
    for s in range(n - 1):
        works = (dist.isend(chunks[(r - s) % n], right, group=group, tag=_TAG + 1),
                 dist.irecv(chunks[(r - 1 - s) % n], left, group=group, tag=_TAG + 1))
        for w in works:
            w.wait()


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
