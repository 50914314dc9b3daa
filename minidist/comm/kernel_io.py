"""Bytes this process really wrote, counted by the kernel, not by minidist.

The trace (trace.py) counts what each collective *should* send by the ring
model. To check that model against something minidist does not own, read the
kernel's per-process I/O accounting: Linux keeps, for every process (all its
threads summed, so gloo's I/O threads included), `wchar` = bytes passed to
write-like system calls, sockets included. gloo moves every byte of a CPU
collective through its TCP sockets, so around a collective the growth of wchar
is what went on the wire from this rank (plus gloo's small headers).

    with comm.kernel_io.written(group) as w:    # every rank of `group` must enter it
        loss.backward()
    w.bytes      # this rank's bytes written, a bare barrier pair subtracted

NCCL moves bytes by the device and RDMA, which the kernel does not see: there
`available()` is still true but the count is meaningless; callers label such a
column "not measured" on anything but gloo.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch.distributed as dist

_PROC_IO = "/proc/self/io"


def available() -> bool:
    """Whether this kernel exposes per-process I/O counters (Linux)."""
    try:
        return read_wchar() >= 0
    except OSError:
        return False


def read_wchar() -> int:
    """Bytes this process has passed to write-like system calls since it started."""
    with open(_PROC_IO) as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise OSError(f"{_PROC_IO} has no wchar line")


@dataclass
class Written:
    """Filled in when the `written` block exits."""

    bytes: int = 0
    """Bytes written by this process inside the block, less what a bare barrier pair writes."""
    raw: int = 0
    """Bytes written including the fencing barriers."""
    barrier_pair: int = 0
    """What the closing barrier alone writes (the least of PAIR_SAMPLES bare barriers just before; subtracted from raw)."""


@contextlib.contextmanager
def written(group: dist.ProcessGroup | None = None):
    """Count the bytes this process writes inside the block, fenced by barriers on `group`.

    A collective: every rank of `group` must enter and leave the block together.
    Barriers make every rank's sends of the block land inside its window (an async
    collective still in flight when the block ends would be cut off); the closing barrier's own
    bytes are measured just before, by bare barriers (the least of PAIR_SAMPLES), and subtracted. Anything else the
    process writes meanwhile (a print, a log file) is counted too: keep the block quiet.
    """
    dist.barrier(group=group)
    result = Written(barrier_pair=_closing_barrier_bytes(group))
    start = read_wchar()
    try:
        yield result
    finally:
        dist.barrier(group=group)
        result.raw = read_wchar() - start
        result.bytes = max(0, result.raw - result.barrier_pair)


PAIR_SAMPLES = 3
"""Bare barriers measured; the least is the fence's cost."""


def _closing_barrier_bytes(group) -> int:
    """What the block's closing barrier writes, the least of PAIR_SAMPLES measurements: anything else written meanwhile
    (another thread's log line) only ever adds, and one inflated sample subtracted from a block made a
    rank's count fall below the payload it surely sent (seen once at 4 processes under load: -589 bytes)."""
    pairs = []
    for _ in range(PAIR_SAMPLES):
        a = read_wchar()
        dist.barrier(group=group)  # the one fence inside a block's window, the closing barrier
        pairs.append(read_wchar() - a)
    return min(pairs)
