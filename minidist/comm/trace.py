"""Tracing: a record of every collective issued through minidist.comm.

    with minidist.comm.trace() as t:
        loss.backward()
    print(t.summary())
    t.save("trace.json")

Each record carries the payload S (bytes of the *full* logical tensor) and the
bytes this rank sends under the ring cost model, so that a trace can be checked
against the textbook formulas:

    all_reduce                  2 S (N-1)/N
    all_gather, reduce_scatter    S (N-1)/N   (S = the full, unsharded tensor)
    all_to_all                    S (N-1)/N   (S = this rank's input)
    broadcast, reduce             S
    scatter (src), gather (dst)   S (N-1)/N on the root; S/N on the others for gather
    barrier                       0

These are logical bytes, not bytes on the wire: gloo implements reduce_scatter
as an all_reduce, but a reduce_scatter is still counted as one.

When no trace is active the only cost per collective is one truthiness test of
a module-level list (see benchmarks/trace_overhead.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist

# The traces that are recording now; empty almost always.
_ACTIVE: list["Trace"] = []


def ring_bytes_sent(op: str, payload: int, world: int, *, is_root: bool = False) -> int:
    """Bytes one rank sends for `op` on a payload of `payload` bytes among `world` ranks."""
    if world <= 1:
        return 0
    if op == "all_reduce":
        return 2 * payload * (world - 1) // world
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return payload * (world - 1) // world
    if op in ("broadcast", "reduce"):
        return payload
    if op == "scatter":
        return payload * (world - 1) // world if is_root else 0
    if op == "gather":
        return 0 if is_root else payload // world
    if op == "barrier":
        return 0
    raise ValueError(f"unknown collective {op!r}")


@dataclass
class Record:
    """One collective call as seen by this rank."""

    op: str
    group: str
    group_size: int
    dtype: str
    numel: int
    """Elements in the full logical tensor (the payload)."""
    payload_bytes: int
    """S: bytes of the full logical tensor."""
    sent_bytes: int
    """Bytes this rank sends under the ring model."""
    async_op: bool
    issued_s: float
    """time.perf_counter() when the call was issued."""
    completed_s: float | None = None
    """perf_counter() when the work finished (async: when its future completed)."""

    @property
    def duration_s(self) -> float | None:
        return None if self.completed_s is None else self.completed_s - self.issued_s


@dataclass
class Trace:
    """The records of one `with trace():` block, on this rank."""

    records: list[Record] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def totals(self) -> dict[str, dict[str, float]]:
        """Per-op totals: calls, payload bytes, sent bytes, summed duration."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "sent_bytes": 0, "time_s": 0.0})
        for r in self.records:
            row = out[r.op]
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["sent_bytes"] += r.sent_bytes
            row["time_s"] += r.duration_s or 0.0
        return dict(out)

    @property
    def sent_bytes(self) -> int:
        return sum(r.sent_bytes for r in self.records)

    def summary(self, cost_model=None) -> str:
        """A per-op table; with a CostModel, predicted ring time beside the measured time."""
        head = f"{'op':<15}{'calls':>6}{'payload MB':>12}{'sent MB':>10}{'time ms':>10}"
        if cost_model is not None:
            head += f"{'ring ms':>10}{'tree ms':>10}"
        lines = [head, "-" * len(head)]
        predicted: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        if cost_model is not None:
            for r in self.records:
                predicted[r.op][0] += cost_model.predict(r.op, r.payload_bytes, r.group_size, "ring")
                predicted[r.op][1] += cost_model.predict(r.op, r.payload_bytes, r.group_size, "tree")
        for op, row in sorted(self.totals().items()):
            line = (f"{op:<15}{int(row['calls']):>6}{row['payload_bytes'] / 1e6:>12.3f}"
                    f"{row['sent_bytes'] / 1e6:>10.3f}{row['time_s'] * 1e3:>10.3f}")
            if cost_model is not None:
                line += f"{predicted[op][0] * 1e3:>10.3f}{predicted[op][1] * 1e3:>10.3f}"
            lines.append(line)
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        return [asdict(r) | {"duration_s": r.duration_s} for r in self.records]

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"records": self.to_json(), "totals": self.totals()}, f, indent=1)

    def _add(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every collective issued through minidist.comm inside the block."""
    t = Trace()
    _ACTIVE.append(t)
    try:
        yield t
    finally:
        _ACTIVE.remove(t)


def _group_name(group: dist.ProcessGroup | None) -> str:
    if group is None or group is dist.group.WORLD:
        return "world"
    try:
        return dist._get_process_group_name(group)  # stable name for logging only
    except Exception:
        return str(id(group))


def record(op: str, tensor: torch.Tensor | None, payload_numel: int, group, work, issued_s: float, *,
           is_root: bool = False):
    """Append one Record to every active trace; return the handle the caller should get back.

    Called only when _ACTIVE is non-empty. The record's completion time comes
    from the work's future, or, for a handle without one, from its wait().
    """
    world = dist.get_world_size(group)
    itemsize = tensor.element_size() if tensor is not None else 0
    payload = payload_numel * itemsize
    rec = Record(
        op=op, group=_group_name(group), group_size=world,
        dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else "-",
        numel=payload_numel, payload_bytes=payload,
        sent_bytes=ring_bytes_sent(op, payload, world, is_root=is_root),
        async_op=work is not None, issued_s=issued_s,
    )
    for t in _ACTIVE:
        t._add(rec)
    if work is None:
        rec.completed_s = time.perf_counter()
        return None
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's async reduce_scatter has no future: time it at wait()
        return TimedWork(work, rec)

    def _done(_fut, rec=rec):
        rec.completed_s = time.perf_counter()
    future.add_done_callback(_done)
    return work


class TimedWork:
    """Stands in for a Work handle that has no future: its completion time is taken at wait().

    That is an upper bound on when the collective finished, which is the best a
    future-less handle allows; everything else passes through unchanged.
    """

    def __init__(self, work, rec: Record):
        self._work, self._rec = work, rec

    def wait(self, *args, **kwargs):
        done = self._work.wait(*args, **kwargs)
        if self._rec.completed_s is None:
            self._rec.completed_s = time.perf_counter()
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()
