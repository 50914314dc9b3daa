"""The flight recorder: this rank's last collectives, so that a hang names itself.

Why: a rank that skips a collective (or is stuck before one) leaves its peers
inside the backend until the process group's timeout, and gloo then says only
"Timed out waiting 300000ms for recv operation to complete": not which
collective, not its sequence number, not who is missing. PyTorch's answer, the
NCCL flight recorder, covers NCCL only; this one sits in
minidist.comm.collectives._issue, so it sees every collective on every backend.

What is kept (metadata only: never a tensor, a handle or a future) and what it
costs (about 2 us per blocking collective, about 10 us per async one):
collective_log.py.

When it speaks (each time also dumping this rank's entries as JSON to
<run_dir>/flight_rank{r}.json, once install_dump_handlers(run_dir) was called):
  * a blocking collective times out (gloo raises in the calling thread): the
    error becomes CollectiveTimeoutError, whose one line names the collective
    and the ranks that never reached it (how those are known: peer_progress.py):
      all_reduce #3 on group world (ranks 0, 1) did not complete within 3.0s:
      rank 1 never reached it (its last on this group: #2); issued at train.py:41; flight record: ...
  * a timeout raised by an async handle's wait() reaches
    minidist.runtime.exit_on_error: on_error() turns it into the same line,
    for the first failed (else the oldest unfinished) collective;
  * any other error reaching exit_on_error: a dump, the error line unchanged;
  * SIGUSR1 (or the signal given): one line about the oldest collective in
    flight, printed by a watcher thread, so it comes while the main thread is
    blocked inside the backend.
On NCCL, torch's watchdog handles a timeout by aborting the process, which
Python may not see: there, send SIGUSR1 before the timeout (or use torch's own
recorder, TORCH_NCCL_TRACE_BUFFER_SIZE).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from minidist.comm import collective_log as _log
from minidist.comm import peer_progress
from minidist.comm.collective_log import (  # noqa: F401 - the recorder's public names
    CAPACITY, Entry, State, entries, format_site, issue, issued, oldest_unfinished, set_enabled,
)

_RUN_DIR: str | None = None
_TIMEOUT = re.compile(r"\b(timed out|timeout)\b", re.IGNORECASE)  # gloo "Timed out", NCCL "timeout"


class CollectiveTimeoutError(RuntimeError):
    """A collective did not complete in time; the message names it and the ranks that never reached it."""


def on_failure(entry: Entry, exc: BaseException) -> None:
    """The backend call raised: record it; a timeout is re-raised as CollectiveTimeoutError naming the collective."""
    entry.finish(State.FAILED, exc)
    if _is_timeout(exc):
        raise CollectiveTimeoutError(report(entry, "timeout")) from exc


def _is_timeout(exc: BaseException) -> bool:
    """A backend's timeout error (not one of minidist's own, whose text may quote a path or a config)."""
    return isinstance(exc, RuntimeError) and type(exc).__module__.startswith(("torch", "builtins")) \
        and _TIMEOUT.search(str(exc)) is not None


def report(entry: Entry, reason: str) -> str:
    """One line naming `entry` and the ranks that never reached it; dumps this rank's record."""
    age = time.time() - entry.issued_at
    entry.reported = entry.reported or reason == "timeout"
    verb = "did not complete within" if reason == "timeout" else "in flight for"
    return (f"{entry.describe()} {verb} {age:.1f}s: {_peers(entry)}; issued at {format_site(entry.site)}"
            f"{_dumped(reason)}")


def _peers(entry: Entry) -> str:
    """Where the other ranks of the group are, from their published progress (peer_progress.py)."""
    seen = peer_progress.progress(entry.group.key, entry.group.ranks, _log.WHO["rank"])
    late = [f"rank {r} never reached it " + (f"(its last on this group: #{p[0]})" if p[0] else "(it issued none on this group)")
            for r, p in seen.items() if p is not None and p[0] < entry.seq]
    other = [f"rank {r} issued {p[1]} as #{entry.seq} (the ranks disagree: MINIDIST_DEBUG_COLLECTIVES=1 names where)"
             for r, p in seen.items() if p is not None and p[0] == entry.seq and p[1] != entry.op]
    unknown = [str(r) for r, p in seen.items() if p is None]
    if unknown:
        other.append(f"rank(s) {', '.join(unknown)} published no progress")
    return "; ".join(late + other) or "every rank reached it (one died, or the network failed, inside it?)"


def dump(path: str | None = None, reason: str = "requested") -> str | None:
    """Write this rank's entries as JSON to `path` (default <run_dir>/flight_rank{r}.json); return the path."""
    if path is None:
        if _RUN_DIR is None:
            return None
        path = os.path.join(_RUN_DIR, f"flight_rank{_log.WHO['rank']}.json")
    doc = {**_log.WHO, "reason": reason, "written_at": time.time(), "capacity": _log.ring_capacity(),
           "entries": [e.to_json() for e in entries()]}
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
        last = entries()[-1:]
        line = f"no collective in flight (last: {last[0].describe() if last else 'none yet'}){_dumped(name)}"
    print(f"[rank {_log.WHO['rank']}/{_log.WHO['world_size']}] flight recorder ({name}): {line}", file=sys.stderr, flush=True)


def install_dump_handlers(run_dir: str, signum: int = signal.SIGUSR1) -> None:
    """Dump to `run_dir` on timeouts and errors; on `signum` (SIGUSR1), also print where this rank is."""
    global _RUN_DIR
    _RUN_DIR = str(run_dir)
    os.makedirs(_RUN_DIR, exist_ok=True)
    peer_progress.watch_signal(signum, _on_signal)
    _log.start_watcher()
