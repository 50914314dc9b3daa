"""The collective log under the flight recorder: each rank's last collectives, numbered per group.

What is kept: a ring buffer (a deque of CAPACITY entries, default 256) of
Entry(seq, op, group, bytes, dtype, shape, async, issue/complete times, state,
call site). Metadata only, as PyTorch's flight recorder: never a tensor, a
Work handle or a future (a future holds its result tensor: kept, it would keep
a bucket's gradients alive past zero_grad(), so an engine's peak memory would
depend on when the recorder let go). `seq` counts the collectives issued on a
group by this rank, from 1; since every rank issues the same collectives in
the same order, #k names the same collective everywhere. The call site is the
first frame outside minidist.comm (a file:line of the engine or the script).
State moves ISSUED -> COMPLETED or ISSUED -> FAILED: a blocking call when it
returns or raises; an async one when its future completes (a done-callback
that stamps the time and the state and keeps nothing: issued()), a handle
without a future (gloo's async reduce_scatter) at its wait().

Cost (benchmarks/flight_recorder_overhead.py: world of one, gloo, 4 bytes, the
recorder swapped in and out of _issue, 2-core machine, quiet): about 2 us per
blocking collective (a dict look-up, a counter, a walk up 3 frames, a clock
read, a small object in a deque) and about 10 us per async one with its wait
(the done-callback: the backend's thread takes the GIL to run it; keeping and
polling the future instead cost about 9 us, and kept its tensors alive). Under
load the callback waits longer for the GIL (+47 us measured at a load of 3;
the step-time benchmarks did not move). Small enough to be always on;
set_enabled(False) (or MINIDIST_FLIGHT_RECORDER=0) stops recording, while
sequence numbers still count (the fingerprint check needs them).
"""

from __future__ import annotations

import collections
import enum
import itertools
import os
import sys
import time

import torch.distributed as dist

from minidist.comm import peer_progress

CAPACITY = 256
ENABLED = os.environ.get("MINIDIST_FLIGHT_RECORDER", "1") != "0"
_RING: collections.deque = collections.deque(maxlen=CAPACITY)
_GROUPS: dict = {}  # ProcessGroup -> _Group (weak keys would cost; a finished group's record is small)
_COMM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
WHO = {"rank": 0, "world_size": 1}  # as of the last group seen: reports may come after the group is destroyed


class State(enum.Enum):
    ISSUED = "issued"
    COMPLETED = "completed"
    FAILED = "failed"


_ISSUED, _COMPLETED, _FAILED = State.ISSUED, State.COMPLETED, State.FAILED  # plain globals: enum lookups cost


class _Group:
    """What the recorder knows of one process group: names, members, and its sequence counter."""

    def __init__(self, group: dist.ProcessGroup):
        self.world = group  # for None: which default group this counts (a re-initialised world starts over)
        self.key = group.group_name  # the same on every rank: used for the store keys
        self.name = "world" if group is dist.group.WORLD else self.key
        self.ranks = tuple(dist.get_process_group_ranks(group))
        self.counter = itertools.count(1)
        self.last = 0  # seq of the last collective this rank issued on the group
        self.last_op = ""


class Entry:
    """One collective as this rank issued it."""

    __slots__ = ("seq", "op", "group", "numel", "dtype", "shape", "async_op", "issued_at", "completed_at",
                 "state", "site", "error", "reported")
    # completed_at: blocking calls, when they returned; async ones, when their future completed (its
    # done-callback), or for a handle without a future when wait() returned.

    def __init__(self, seq: int, op: str, group: _Group, tensor, numel: int, site: tuple[str, int]):
        self.seq, self.op, self.group, self.site = seq, op, group, site
        self.numel = numel  # of the full logical payload, as comm.trace counts it
        self.dtype, self.shape = (None, ()) if tensor is None else (tensor.dtype, tensor.shape)
        self.async_op = False
        self.issued_at = time.time()
        self.completed_at = None
        self.state = _ISSUED
        self.error = None
        self.reported = False  # named by a CollectiveTimeoutError already

    def finish(self, state: State, error: BaseException | None = None) -> None:
        if self.state is _ISSUED:
            self.completed_at = time.time()
            self.state = state
            if error is not None:
                self.error = str(error).strip().split("\n", 1)[0]
        else:  # settled twice: a failed call, then its handle's wait
            assert self.state is state, (self.state, state)

    def describe(self) -> str:
        return f"{self.op} #{self.seq} on group {self.group.name} (ranks {_ranks(self.group.ranks)})"

    def to_json(self) -> dict:
        dtype = str(self.dtype).removeprefix("torch.") if self.dtype is not None else None
        done = self.completed_at
        nbytes = self.numel * self.dtype.itemsize if self.dtype is not None else 0
        return {"seq": self.seq, "op": self.op, "group": self.group.name, "group_ranks": list(self.group.ranks),
                "bytes": nbytes, "dtype": dtype, "shape": list(self.shape), "async_op": self.async_op,
                "issued_at": self.issued_at, "completed_at": done, "state": self.state.value,
                "duration_s": None if done is None else done - self.issued_at,
                "call_site": format_site(self.site), "error": self.error}


def _ranks(ranks) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2 \
        else ", ".join(map(str, ranks))


def call_site() -> tuple[str, int]:
    """(file, line) of the first frame outside minidist.comm: who issued the collective."""
    f = sys._getframe(2)  # issue()'s caller: normally _issue <- the collective, both skipped below
    while f is not None and f.f_code.co_filename.startswith(_COMM_DIR):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else ("?", 0)


def format_site(site: tuple[str, int]) -> str:
    path = site[0]
    if os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return f"{path}:{site[1]}"


def _group(group) -> _Group:
    """The record of `group`; None and the default group share one (one counter per real group)."""
    g = dist.distributed_c10d._get_default_group() if group is None else group  # raises torch's "not initialized"
    info = _GROUPS.get(g)
    if info is None:
        info = _GROUPS[g] = _Group(g)
        WHO.update(rank=dist.get_rank(), world_size=dist.get_world_size())
        if len(info.ranks) > 1:  # someone to tell where this rank is
            start_watcher()
    if g is dist.group.WORLD:
        _GROUPS[None] = info
    return info


def issue(op: str, tensor, numel: int, group) -> Entry:
    """Give the collective its sequence number on `group` and (when enabled) record it as ISSUED."""
    info = _GROUPS.get(group)
    if info is None or (group is None and info.world is not dist.group.WORLD):  # new group, or a new world
        info = _group(group)
    seq = info.last = next(info.counter)
    info.last_op = op
    entry = Entry(seq, op, info, tensor, numel, call_site())
    if ENABLED:
        _RING.append(entry)
    return entry


def issued(entry: Entry, work):
    """The backend call returned `work`; return the handle the caller should get back.

    An async entry is settled by a done-callback on the work's future: it runs when
    the collective completes (on the backend's thread; inline if it already has),
    stamps the entry and returns, keeping neither the future nor its value. Nothing
    here holds the handle: memory freed by the engine is freed.
    """
    if work is None:
        entry.finish(_COMPLETED)
        return None
    entry.async_op = True
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's async reduce_scatter has no future: completion is seen at wait()
        return _WaitRecorded(work, entry)
    if ENABLED:
        future.add_done_callback(_settler(entry))
    return work


def _settler(entry: Entry):
    """A done-callback that records how `entry`'s collective ended; it holds the entry, nothing else."""
    def settle(future) -> None:
        try:
            future.value()  # done: returns at once, or raises the collective's error
        except Exception as exc:  # noqa: BLE001 - the work failed: record why
            entry.finish(_FAILED, exc)
        else:
            entry.finish(_COMPLETED)
    return settle


class _WaitRecorded:
    """Stands in for a Work handle without a future: the entry completes at wait()."""

    def __init__(self, work, entry: Entry):
        self._work, self._entry = work, entry

    def wait(self, *args, **kwargs):
        try:
            done = self._work.wait(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - recorded, re-raised unchanged (exit_on_error names a timeout)
            self._entry.finish(_FAILED, exc)
            raise
        self._entry.finish(_COMPLETED)
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()


def start_watcher() -> None:
    """Start publishing this rank's progress for its peers (peer_progress.py), once."""
    peer_progress.ensure_started(_progress_snapshot)


def ring_capacity() -> int:
    return _RING.maxlen


def _progress_snapshot() -> dict[str, tuple[int, str]]:
    return {g.key: (g.last, g.last_op) for g in list(_GROUPS.values())}


def oldest_unfinished() -> Entry | None:
    """The first failed entry not reported yet, else the oldest one in flight: what the others wait for."""
    entries = list(_RING)
    failed = [e for e in entries if e.state is _FAILED and not e.reported]
    if failed:
        return failed[0]
    return next((e for e in entries if e.state is _ISSUED), None)


def set_enabled(on: bool, capacity: int = CAPACITY) -> None:
    """Turn recording on or off, or change how many collectives are kept (the entries so far are kept)."""
    global ENABLED, _RING
    ENABLED = bool(on)
    if capacity != _RING.maxlen:
        _RING = collections.deque(_RING, maxlen=capacity)


def entries() -> list[Entry]:
    """The recorded entries, oldest first (a copy)."""
    return list(_RING)
