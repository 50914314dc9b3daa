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

These are logical bytes. What the backend really sends can differ, and is recorded
beside them (wire_bytes): gloo's own reduce_scatter is an all_reduce inside, 2 S (N-1)/N;
minidist.comm.ring's reduce_scatter sends exactly S (N-1)/N. `algorithm` says which ran.

Times. Each record has issued_s (the call began), launched_s (the call returned: for an
async call, what issuing cost the caller), completed_s (the work finished: its future's
callback; for a handle without a future, no later than the caller's wait() returned) and
waited_s (time the caller was blocked in wait() on the handle). From them:

    span     completed - issued: for an async collective it includes whatever the caller
             computed meanwhile (a backward pass), so it is no measure of the transfer
    exposed  (launched - issued) + waited: the caller's time lost to this collective
             (a synchronous call: its whole span)
    wire     completed - max(issued, completion of the previous collective of its group):
             an estimate of the time on the wire, the one the cost model predicts (see
             Trace.wire_times); for a collective issued on an idle group, its span

A caller that waits on get_future() instead of wait() is not seen waiting (waited 0);
span and wire do not depend on it.

When no trace is active the only cost per collective is one truthiness test of
a module-level list (see benchmarks/trace_overhead.py).
"""

from __future__ import annotations

import contextlib
import functools
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


@dataclass(slots=True)
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
    algorithm: str = "native"
    """What ran: "native" (the backend's collective) or "ring" (minidist.comm.ring)."""
    wire_op: str = ""
    """The collective the backend really runs ("all_reduce" for gloo's native reduce_scatter)."""
    wire_bytes: int = 0
    """Bytes this rank really sends: the ring model's bytes of wire_op."""
    launched_s: float | None = None
    """perf_counter() when the issuing call returned."""
    waited_s: float = 0.0
    """Seconds the caller spent blocked in wait() on the handle (0 for a synchronous call)."""

    @property
    def span_s(self) -> float | None:
        """Issue to completion (for an async call, includes what the caller overlapped)."""
        return None if self.completed_s is None else self.completed_s - self.issued_s

    @property
    def exposed_s(self) -> float:
        """The caller's time lost to this collective: the issuing call plus its waits."""
        launched = self.launched_s if self.launched_s is not None else self.issued_s
        return launched - self.issued_s + self.waited_s


_TIMES = ("span_s", "waited_s", "exposed_s", "wire_s")


@dataclass
class Trace:
    """The records of one `with trace():` block, on this rank."""

    records: list[Record] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wire_times(self) -> list[float | None]:
        """Per record, the estimated seconds its bytes were on the wire (None: not completed).

        A group runs its collectives in order (one NCCL stream; gloo's queue; one ring lane),
        so a collective starts moving bytes when it is issued or when the previous one of its
        group completes, whichever is later: wire = completed - max(issued, previous
        completed). This drops the compute an async collective overlapped and the time it
        queued behind its predecessor. It keeps the time spent waiting for the slowest peer
        to join, which one rank cannot tell from transfer; and where gloo runs two of a
        group's collectives at once (it has 2 threads), it under-counts the later one.
        """
        out: list[float | None] = [None] * len(self.records)
        done: dict[str, float] = {}
        for i in sorted(range(len(self.records)), key=lambda j: self.records[j].issued_s):
            r = self.records[i]
            if r.completed_s is None:
                continue
            start = max(r.issued_s, done.get(r.group, r.issued_s))
            out[i] = max(0.0, r.completed_s - start)
            done[r.group] = max(done.get(r.group, r.completed_s), r.completed_s)
        return out

    def totals(self, by_algorithm: bool = False) -> dict:
        """Per op (or per (op, algorithm)): calls, payload, sent and wire bytes, summed times."""
        out: dict = defaultdict(lambda: dict.fromkeys(("calls", "payload_bytes", "sent_bytes", "wire_bytes", *_TIMES), 0))
        for r, wire in zip(self.records, self.wire_times()):
            row = out[(r.op, r.algorithm) if by_algorithm else r.op]
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["sent_bytes"] += r.sent_bytes
            row["wire_bytes"] += r.wire_bytes
            row["span_s"] += r.span_s or 0.0
            row["waited_s"] += r.waited_s
            row["exposed_s"] += r.exposed_s
            row["wire_s"] += wire or 0.0
        return dict(out)

    @property
    def sent_bytes(self) -> int:
        return sum(r.sent_bytes for r in self.records)

    @property
    def wire_bytes(self) -> int:
        return sum(r.wire_bytes for r in self.records)

    def summary(self, cost_model=None) -> str:
        """A table per op and algorithm: bytes, times; with a CostModel, predicted times beside wire."""
        head = (f"{'op':<15}{'algo':>7}{'calls':>6}{'payload MB':>11}{'sent MB':>9}{'wire MB':>9}"
                f"{'span ms':>10}{'waited ms':>10}{'exposed ms':>11}{'wire ms':>9}")
        if cost_model is not None:
            head += f"{'ring ms':>9}{'tree ms':>9}"
        lines = [head, "-" * len(head)]
        predicted: dict = defaultdict(lambda: [0.0, 0.0])
        if cost_model is not None:  # the collective that really ran (wire_op), on the full payload
            for r in self.records:
                op = r.wire_op or r.op
                predicted[(r.op, r.algorithm)][0] += cost_model.predict(op, r.payload_bytes, r.group_size, "ring")
                predicted[(r.op, r.algorithm)][1] += cost_model.predict(op, r.payload_bytes, r.group_size, "tree")
        for (op, algo), row in sorted(self.totals(by_algorithm=True).items()):
            line = (f"{op:<15}{algo:>7}{int(row['calls']):>6}{row['payload_bytes'] / 1e6:>11.3f}"
                    f"{row['sent_bytes'] / 1e6:>9.3f}{row['wire_bytes'] / 1e6:>9.3f}{row['span_s'] * 1e3:>10.3f}"
                    f"{row['waited_s'] * 1e3:>10.3f}{row['exposed_s'] * 1e3:>11.3f}{row['wire_s'] * 1e3:>9.3f}")
            if cost_model is not None:
                line += f"{predicted[(op, algo)][0] * 1e3:>9.3f}{predicted[(op, algo)][1] * 1e3:>9.3f}"
            lines.append(line)
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        return [asdict(r) | {"span_s": r.span_s, "exposed_s": r.exposed_s, "wire_s": w}
                for r, w in zip(self.records, self.wire_times())]

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


def _wire_op(op: str, algorithm: str, group) -> str:
    """The collective the backend runs for `op`: gloo's own reduce_scatter is an all_reduce."""
    if op == "reduce_scatter" and algorithm == "native" and dist.get_backend(group) == "gloo":
        return "all_reduce"
    return op


def record(op: str, tensor: torch.Tensor | None, payload_numel: int, group, work, issued_s: float, *,
           is_root: bool = False, algorithm: str = "native"):
    """Append one Record to every active trace; return the handle the caller should get back.

    Called only when _ACTIVE is non-empty, right after the issuing call returned. An async
    handle comes back wrapped in a TimedWork, which times the caller's wait(); the
    completion time comes from the work's future, or, for a handle without one, from wait().
    """
    launched = time.perf_counter()
    world = dist.get_world_size(group)
    itemsize = tensor.element_size() if tensor is not None else 0
    payload = payload_numel * itemsize
    sent = ring_bytes_sent(op, payload, world, is_root=is_root)
    wire_op = _wire_op(op, algorithm, group)
    rec = Record(
        op=op, group=_group_name(group), group_size=world,
        dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else "-",
        numel=payload_numel, payload_bytes=payload, sent_bytes=sent,
        async_op=work is not None, issued_s=issued_s, algorithm=algorithm, wire_op=wire_op,
        wire_bytes=sent if wire_op == op else ring_bytes_sent(wire_op, payload, world, is_root=is_root),
        launched_s=launched,
    )
    for t in _ACTIVE:
        t._add(rec)
    if work is None:
        rec.completed_s = launched
        return None
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's async reduce_scatter has no future: time it at wait()
        return TimedWork(work, rec, has_future=False)
    future.add_done_callback(functools.partial(_completed, rec))  # holds the record, not the work
    return TimedWork(work, rec, has_future=True)


def _completed(rec: Record, _future) -> None:
    rec.completed_s = time.perf_counter()


class TimedWork:
    """The handle of a traced async collective: times the caller's wait() (Record.waited_s).

    For a handle without a future, the completion time is taken at wait() too: when
    wait() is entered if the work had already finished, else when it returns (an upper
    bound, the best a future-less handle allows). Everything else passes through.
    """

    __slots__ = ("_work", "_rec", "_has_future")

    def __init__(self, work, rec: Record, has_future: bool = False):
        self._work, self._rec, self._has_future = work, rec, has_future

    def wait(self, *args, **kwargs):
        entered = time.perf_counter()
        finished_before = not self._has_future and self._work.is_completed()
        done = self._work.wait(*args, **kwargs)
        returned = time.perf_counter()
        self._rec.waited_s += returned - entered
        if self._rec.completed_s is None:  # no future, or its callback is still to run
            self._rec.completed_s = entered if finished_before else returned
        return done

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self):
        return self._work.get_future()

    def __getattr__(self, name: str):
        return getattr(self._work, name)
