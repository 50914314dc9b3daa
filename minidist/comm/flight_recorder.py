"""The flight recorder: this rank's last collectives, so that a hang names itself.

Why: a rank that skips a collective (or is stuck before one) leaves its peers
inside the backend until the process group's timeout, and gloo then says only
"Timed out waiting 300000ms for recv operation to complete": not which
collective, not its sequence number, not who is missing. PyTorch's answer, the
NCCL flight recorder, exists for NCCL only; this one sits in
minidist.comm.collectives._issue, so it sees every collective on every backend.

What is kept: a ring buffer (a deque of CAPACITY entries, default 256) of
Entry(seq, op, group, bytes, dtype, shape, async, issue/complete times, state,
call site). `seq` counts the collectives issued on a group by this rank,
from 1; since every rank issues the same collectives in the same order, #k
names the same collective everywhere. The call site is the first frame outside
minidist.comm (a file:line of the engine or the script). State moves
ISSUED -> COMPLETED or ISSUED -> FAILED: synchronous calls complete when they
return, asynchronous ones when their future does (a handle without a future,
gloo's async reduce_scatter, when it is waited on).

When it speaks (every case dumps this rank's entries as JSON to
<run_dir>/flight_rank{r}.json once install_dump_handlers(run_dir) was called):
  * a collective times out in the calling thread (gloo's blocking calls): the
    backend's error becomes CollectiveTimeoutError, whose one line names the
    collective and the ranks that never reached it (see peer_progress.py);
  * a timeout error from a Work handle's wait() reaches
    minidist.runtime.exit_on_error: on_error() turns it into the same line,
    for the oldest collective that did not complete;
  * SIGUSR1 (or the signal given): one line about the oldest collective in
    flight, printed and dumped by a watcher thread, so it works while the main
    thread is blocked inside the backend.

Cost: see benchmarks/flight_recorder_overhead.py. Per collective, a dict look-up
for the group's counter, a walk up ~3 frames, two clock reads, one small object
in a deque, and for async handles a done-callback on the future:
OVERHEAD_US (measured, world 1 gloo, tiny tensor, loaded 2-core machine).
That is below the ~5 us budget, so it is always on; set_enabled(False) stops
recording (sequence numbers still count, the fingerprint check needs them).
"""

from __future__ import annotations

import collections
import enum
import itertools
import json
import os
import re
import signal
import sys
import time

import torch.distributed as dist

from minidist.comm import peer_progress

CAPACITY = 256
ENABLED = os.environ.get("MINIDIST_FLIGHT_RECORDER", "1") != "0"
_RING: collections.deque = collections.deque(maxlen=CAPACITY)
_GROUPS: dict = {}  # ProcessGroup -> _Group (weak keys would cost; a finished group's record is small)
_RUN_DIR: str | None = None
_COMM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TIMEOUT = re.compile(r"\b(timed out|timeout)\b", re.IGNORECASE)  # gloo "Timed out", NCCL "timeout"


class CollectiveTimeoutError(RuntimeError):
    """A collective did not complete in time; the message names it and the ranks that never reached it."""


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


class Entry:
    """One collective as this rank issued it."""

    __slots__ = ("seq", "op", "group", "nbytes", "dtype", "shape", "async_op", "issued_at", "completed_at",
                 "state", "site", "error", "reported")

    def __init__(self, seq: int, op: str, group: _Group, tensor, numel: int, site: tuple[str, int]):
        self.seq, self.op, self.group, self.site = seq, op, group, site
        if tensor is None:
            self.nbytes, self.dtype, self.shape = 0, None, ()
        else:
            self.nbytes, self.dtype, self.shape = numel * tensor.element_size(), tensor.dtype, tensor.shape
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
        else:  # a handle waited on twice, or its future's callback after wait() saw the error
            assert self.state is state, (self.state, state)

    def _future_done(self, fut) -> None:
        try:
            fut.value()
        except Exception as exc:  # noqa: BLE001 - the work failed: record why
            self.finish(_FAILED, exc)
        else:
            self.finish(_COMPLETED)

    def describe(self) -> str:
        return f"{self.op} #{self.seq} on group {self.group.name} (ranks {_ranks(self.group.ranks)})"

    def to_json(self) -> dict:
        dtype = str(self.dtype).removeprefix("torch.") if self.dtype is not None else None
        done = self.completed_at
        return {"seq": self.seq, "op": self.op, "group": self.group.name, "group_ranks": list(self.group.ranks),
                "bytes": self.nbytes, "dtype": dtype, "shape": list(self.shape), "async_op": self.async_op,
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
        if len(info.ranks) > 1:  # someone to tell where this rank is
            peer_progress.ensure_started(_progress_snapshot)
    if g is dist.group.WORLD:
        _GROUPS[None] = info
    return info


def issue(op: str, tensor, numel: int, group) -> Entry:
    """Give the collective its sequence number on `group` and (when enabled) record it as ISSUED."""
    info = _GROUPS.get(group)
    if info is None or (group is None and info.world is not dist.group.WORLD):  # new group, or a new world
        info = _group(group)
    seq = info.last = next(info.counter)
    entry = Entry(seq, op, info, tensor, numel, call_site())
    if ENABLED:
        _RING.append(entry)
    return entry


def issued(entry: Entry, work):
    """The backend call returned `work`; return the handle the caller should get back."""
    if work is None:
        entry.finish(_COMPLETED)
        return None
    entry.async_op = True
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's async reduce_scatter has no future: completion is seen at wait()
        return _WaitRecorded(work, entry)
    future.add_done_callback(entry._future_done)
    return work


def on_failure(entry: Entry, exc: BaseException) -> None:
    """The backend call raised: record it; a timeout is re-raised as CollectiveTimeoutError naming the collective."""
    entry.finish(_FAILED, exc)
    if _is_timeout(exc):
        raise CollectiveTimeoutError(report(entry, "timeout")) from exc


def _is_timeout(exc: BaseException) -> bool:
    """A backend's timeout error (not one of minidist's own, whose text may quote a path or a config)."""
    return isinstance(exc, RuntimeError) and type(exc).__module__.startswith(("torch", "builtins")) \
        and _TIMEOUT.search(str(exc)) is not None


class _WaitRecorded:
    """Stands in for a Work handle without a future: the entry completes at wait()."""

    def __init__(self, work, entry: Entry):
        self._work, self._entry = work, entry

    def wait(self, *args, **kwargs):
        try:
            done = self._work.wait(*args, **kwargs)
        except RuntimeError as exc:
            on_failure(self._entry, exc)
            raise
        self._entry.finish(_COMPLETED)
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()


def _progress_snapshot() -> dict[str, int]:
    return {g.key: g.last for g in list(_GROUPS.values())}


def oldest_unfinished() -> Entry | None:
    """The first failed entry not reported yet, else the oldest one in flight: what the others wait for."""
    entries = list(_RING)
    failed = [e for e in entries if e.state is _FAILED and not e.reported]
    if failed:
        return failed[0]
    return next((e for e in entries if e.state is _ISSUED), None)


def report(entry: Entry, reason: str) -> str:
    """One line naming `entry` and the ranks that never reached it; dumps this rank's record."""
    behind, unknown = peer_progress.behind(entry.group.key, entry.group.ranks, entry.seq)
    if behind:
        who = "; ".join(f"rank {r} never reached it " + (f"(its last on this group: #{s})" if s else "(it issued none on this group)")
                        for r, s in behind)
    elif unknown:
        who = f"rank(s) {_ranks(unknown)} published no progress (no store?)"
    else:
        who = "every rank reached it (one died or the network failed inside the collective?)"
    age = time.time() - entry.issued_at
    entry.reported = entry.reported or reason == "timeout"
    verb = "did not complete within" if reason == "timeout" else "in flight for"
    return f"{entry.describe()} {verb} {age:.1f}s: {who}; issued at {format_site(entry.site)}{_dumped(reason)}"


def dump(path: str | None = None, reason: str = "requested") -> str | None:
    """Write this rank's entries as JSON to `path` (default <run_dir>/flight_rank{r}.json); return the path."""
    if path is None:
        if _RUN_DIR is None:
            return None
        path = os.path.join(_RUN_DIR, f"flight_rank{dist.get_rank() if dist.is_initialized() else 0}.json")
    entries = list(_RING)
    doc = {"rank": dist.get_rank() if dist.is_initialized() else 0,
           "world_size": dist.get_world_size() if dist.is_initialized() else 1,
           "reason": reason, "written_at": time.time(), "capacity": _RING.maxlen,
           "entries": [e.to_json() for e in entries]}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return path


def _dumped(reason: str) -> str:
    """Dump to the run directory, for an error path: '; flight record: PATH', or why not; never raises."""
    try:
        path = dump(reason=reason)
    except OSError as exc:
        return f"; flight record not written: {exc}"
    return f"; flight record: {path}" if path else ""


def on_error(exc: BaseException) -> BaseException:
    """For exit_on_error: dump; a backend timeout becomes CollectiveTimeoutError naming the stuck collective."""
    if isinstance(exc, CollectiveTimeoutError):  # reported and dumped where it was raised
        return exc
    entry = oldest_unfinished() if _is_timeout(exc) else None
    if entry is None:
        _dumped(f"error: {type(exc).__name__}")
        return exc
    return CollectiveTimeoutError(report(entry, "timeout"))


def _on_signal(signum: int) -> None:
    """SIGUSR1 (from the watcher thread): one line about the oldest collective in flight, and a dump."""
    entry = oldest_unfinished()
    name = signal.Signals(signum).name
    if entry is not None:
        line = report(entry, name)
    else:
        line = f"no collective in flight (last: {_RING[-1].describe() if _RING else 'none yet'}){_dumped(name)}"
    prefix = f"[rank {dist.get_rank()}/{dist.get_world_size()}] " if dist.is_initialized() else ""
    print(f"{prefix}flight recorder ({name}): {line}", file=sys.stderr, flush=True)


def install_dump_handlers(run_dir: str, signum: int = signal.SIGUSR1) -> None:
    """Dump to `run_dir` on timeouts and errors; on `signum` (SIGUSR1), also print where this rank is."""
    global _RUN_DIR
    _RUN_DIR = str(run_dir)
    os.makedirs(_RUN_DIR, exist_ok=True)
    peer_progress.watch_signal(signum, _on_signal)
    peer_progress.ensure_started(_progress_snapshot)


def set_enabled(on: bool, capacity: int = CAPACITY) -> None:
    """Turn recording on or off, or change how many collectives are kept (the entries so far are kept)."""
    global ENABLED, _RING
    ENABLED = bool(on)
    if capacity != _RING.maxlen:
        _RING = collections.deque(_RING, maxlen=capacity)


def entries() -> list[Entry]:
    """The recorded entries, oldest first (a copy)."""
    return list(_RING)

