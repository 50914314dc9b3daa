"""Where every rank is: each rank's last sequence number per group, published through the store.

Why the store: when rank 0 times out in collective #k, the rank that never
arrived cannot answer a collective (that is the problem), and its own flight
record may sit on another machine. The default store of the process group
(torchrun's TCPStore, or a FileStore) is reachable by every rank on every
backend, gloo included. Writing to it on every collective would cost a round
trip to the store each time; instead a daemon thread publishes this rank's
counters {group: (last seq issued, its op)} under "minidist/flight/rank{r}" every
PERIOD_S, when they changed. A rank that reached #k has published it PERIOD_S
later at most; a timeout is seconds at least, so when it fires, a peer whose
published seq is below k never reached #k (the exception: a peer that arrived
within the last PERIOD_S before the timeout, which would not have caused it).
A peer whose last is #k but with another op issued a different collective as
#k: the ranks disagree (fingerprint.py would name where). Reading is
non-blocking (store.check, then get): a peer that never published is
reported as unknown, never waited for. Cost: at most one small store write
per rank per PERIOD_S, off the training thread. The store and this rank are
remembered, so a report still reads them after the process group is
destroyed (recipes.train reaches exit_on_error after leaving its
runtime.distributed() block).

The same thread serves the dump signal. Python runs signal handlers on the
main thread only, between bytecodes: a rank blocked inside a gloo call would
answer SIGUSR1 only once the timeout fires. watch_signal() points
signal.set_wakeup_fd at a pipe that this thread reads, so the C-level handler's
byte wakes the thread, which dumps at once. If another wakeup fd is already set
(asyncio), it is left alone and the handler runs on the main thread instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from typing import Callable

import torch.distributed as dist

PERIOD_S = 0.5
KEY = "minidist/flight/rank{}"

_started = False
_lock = threading.Lock()
_signals: dict[int, Callable[[int], None]] = {}
_wake_fd: int | None = None  # read end of the pipe signal.set_wakeup_fd writes to


_last_store = None  # the default store as last seen: reports may come after the process group is destroyed


def _store():
    global _last_store
    if dist.is_initialized():
        _last_store = dist.distributed_c10d._get_default_store()
    if _last_store is None:
        raise RuntimeError("no process group has existed: no store to read")
    return _last_store


def ensure_started(snapshot: Callable[[], dict[str, int]]) -> None:
    """Start the publishing/signal thread once per process (a daemon: it never delays exit)."""
    global _started
    if _started:
        return
    with _lock:
        if not _started:
            threading.Thread(target=_run, args=(snapshot,), name="minidist-flight-watch", daemon=True).start()
            _started = True


def _run(snapshot: Callable[[], dict[str, int]]) -> None:
    published = None
    while True:
        fd = _wake_fd
        if fd is not None:
            ready = select.select([fd], [], [], PERIOD_S)[0]
            for signum in os.read(fd, 512) if ready else b"":
                if signum in _signals:
                    _answer(signum)
        else:
            time.sleep(PERIOD_S)
        try:
            if dist.is_initialized() and dist.get_world_size() > 1:
                current = snapshot()
                if current != published:
                    _store().set(KEY.format(dist.get_rank()), json.dumps(current))
                    published = current
        except Exception:  # noqa: BLE001 - the store went away (shutdown): nothing to publish to
            published = None


def _answer(signum: int) -> None:
    try:
        _signals[signum](signum)
    except Exception as exc:  # noqa: BLE001 - a failed dump must not end the thread that publishes progress
        print(f"flight recorder: could not answer signal {signum}: {exc}", file=sys.stderr, flush=True)


def progress(key: str, ranks: tuple[int, ...], me: int) -> dict[int, tuple[int, str] | None]:
    """Each peer's published (last seq, its op) on group `key`; (0, "") if none on it; None if it published nothing."""
    out: dict[int, tuple[int, str] | None] = {}
    for r in ranks:
        if r == me:
            continue
        try:
            store = _store()
            name = KEY.format(r)
            if not store.check([name]):
                out[r] = None
                continue
            last = json.loads(store.get(name)).get(key, (0, ""))
        except Exception:  # noqa: BLE001 - no store or it is gone: say so rather than guess
            out[r] = None
            continue
        out[r] = (int(last[0]), str(last[1]))
    return out


def watch_signal(signum: int, callback: Callable[[int], None]) -> None:
    """Run callback(signum) on the watcher thread when `signum` arrives (main thread only)."""
    global _wake_fd
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install the dump handlers from the main thread (Python's signal rule)")
    previous = signal.getsignal(signum)
    _signals[signum] = callback
    if getattr(previous, "_minidist_flight", False):  # installed before: the callback was replaced above
        return

    def handler(num, frame):
        if _wake_fd is None:  # no wakeup pipe: run here, on the main thread
            _signals[num](num)
        if callable(previous):
            previous(num, frame)

    if _wake_fd is None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if old != -1:  # someone else (asyncio) owns the wakeup fd: keep theirs
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
        else:
            _wake_fd = r
    handler._minidist_flight = True
    signal.signal(signum, handler)
