"""Tracing: a record of every collective issued through minidist.comm, its bytes and its times.

    with minidist.comm.trace() as t:
        loss.backward()
    print(t.summary())
    t.save("trace.json")

The one source of collective bytes and times in minidist: the comparison (minidist.compare),
the lessons and the benchmarks read them here, and the definitions below (with the byte formulas
of sent_bytes.py and the wire estimate of wire_time.py) are stated nowhere else.

Bytes. Each record carries the payload S (bytes of the *full* logical tensor), the bytes this
rank sends under the ring model (sent_bytes: 2 S (N-1)/N for an all_reduce, S (N-1)/N for an
all_gather or a reduce_scatter; for broadcast and reduce the mean over ranks) and what the
backend really sends (wire_op, wire_bytes: gloo's own reduce_scatter is an all_reduce inside).
The table per collective, and why a mean: minidist/comm/sent_bytes.py.

Times (time.perf_counter(), seconds). Each record has issued_s (the call began), launched_s (it
returned: for an async call, what issuing cost the caller), completed_s (the work finished: its
future's callback; for a handle without a future, no later than the caller's wait() returned)
and waited_s (time the caller spent blocked waiting on it). Every wait is also kept as an
interval (Trace.waits: start, end, thread), for waits on the Work handle and on its future
alike: the handle comm returns (TimedWork) and the future it hands out (TimedFuture) time them
(minidist/comm/timed.py; comm.collect_all keeps a wait on several futures traced).
On CUDA the future is the backend's own (a wait there orders a stream; the host does not block).

    span     completed - issued: for an async collective it includes whatever the caller
             computed meanwhile (a backward pass), so it is no measure of the transfer
    exposed  (launched - issued) + waited: the caller's time lost to this collective
    wire     completed - max(issued, the last member's issue (arrived), completion of the
             previous collective of its group): an estimate of the time on the wire, the one
             the cost model predicts (wire_times, minidist/comm/wire_time.py); `arrived` comes
             from every rank's records (arrivals), so the wait for the slowest peer is not counted

HIDDEN, the one definition (hidden_share): the share of a step's communication time that compute
hid, 1 - overhead / comm, where overhead = the step's time minus the same step's without
communication (both measured: under no_sync, or the plain model; never derived from the trace),
and comm = the step's collectives run alone, one at a time. No engine internals are needed, so
it applies to PyTorch's engines as to minidist's (benchmarks/ddp_vs_torch.py,
benchmarks/fsdp_vs_torch.py, minidist.compare). The trace's waits say how long the caller was
blocked (Record.exposed_s); that is not "hidden" and is never called so.

When no trace is active the only cost per collective is one truthiness test of a module-level
list (see benchmarks/trace_overhead.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import torch
import torch.distributed as dist

from minidist.comm.sent_bytes import backend_bytes, ring_bytes_sent
from minidist.comm.timed import TimedFuture, TimedWork, collect_all  # noqa: F401 - collect_all: comm's
from minidist.comm.wire_time import arrivals, wire_times  # noqa: F401 - arrivals: importable here, as before

# The traces that are recording now; empty almost always.
_ACTIVE: list["Trace"] = []


def hidden_share(overhead_s: float, comm_alone_s: float) -> float | None:
    """1 - overhead / comm: the share of communication compute hid (module docstring).

    overhead_s: the step's time minus the same step's without communication (a difference of
    medians, or the median of paired differences); comm_alone_s: the step's collectives alone.
    May be < 0 (the engine's own host work counts as overhead); None without communication.
    """
    if comm_alone_s <= 0:
        return None
    return 1.0 - overhead_s / comm_alone_s


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
    """Bytes this rank sends under the ring model (broadcast, reduce: the mean over ranks)."""
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
    """Bytes this rank really sends for wire_op (the same mean for broadcast and reduce)."""
    launched_s: float | None = None
    """perf_counter() when the issuing call returned."""
    waited_s: float = 0.0
    """Seconds the caller spent blocked waiting on the handle or its future (0 for a synchronous call)."""
    root: int | None = None
    """Group rank of the root (broadcast, reduce, scatter, gather)."""

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
    """The records of one `with trace():` block, on this rank, and the waits on them."""

    records: list[Record] = field(default_factory=list)
    waits: list[tuple[float, float, int]] = field(default_factory=list)
    """(start, end, thread ident) of every wait on a traced handle or its future."""
    groups: dict[str, object] = field(default_factory=dict, repr=False)
    """Process group by record.group name (to issue the same collectives again)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wire_times(self, arrived: Sequence[float] | None = None) -> list[float | None]:
        """Per record, the estimated seconds its bytes were on the wire (None: not completed): wire_times()."""
        return wire_times([(r.group, r.issued_s, r.completed_s) for r in self.records], arrived)

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
        """A table per op and algorithm: bytes, times; with a CostModel, the alpha-beta predictions of the ring and
        of recursive halving-doubling (minidist.comm.cost) beside the wire time."""
        head = (f"{'op':<15}{'algo':>7}{'calls':>6}{'payload MB':>11}{'sent MB':>9}{'wire MB':>9}"
                f"{'span ms':>10}{'waited ms':>10}{'exposed ms':>11}{'wire ms':>9}")
        if cost_model is not None:  # the alpha-beta model's two columns (minidist.comm.cost.ALGORITHMS)
            head += f"{'ring ms':>9}{'halv-dbl ms':>12}"
        lines = [head, "-" * len(head)]
        predicted: dict = defaultdict(lambda: [0.0, 0.0])
        if cost_model is not None:  # the collective that really ran (wire_op), on the full payload
            for r in self.records:
                for k, algo in enumerate(("ring", "halving_doubling")):
                    predicted[(r.op, r.algorithm)][k] += cost_model.predict(r.wire_op or r.op, r.payload_bytes,
                                                                           r.group_size, algo)
        for (op, algo), row in sorted(self.totals(by_algorithm=True).items()):
            line = (f"{op:<15}{algo:>7}{int(row['calls']):>6}{row['payload_bytes'] / 1e6:>11.3f}"
                    f"{row['sent_bytes'] / 1e6:>9.3f}{row['wire_bytes'] / 1e6:>9.3f}{row['span_s'] * 1e3:>10.3f}"
                    f"{row['waited_s'] * 1e3:>10.3f}{row['exposed_s'] * 1e3:>11.3f}{row['wire_s'] * 1e3:>9.3f}")
            if cost_model is not None:
                line += f"{predicted[(op, algo)][0] * 1e3:>9.3f}{predicted[(op, algo)][1] * 1e3:>12.3f}"
            lines.append(line)
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        return [asdict(r) | {"span_s": r.span_s, "exposed_s": r.exposed_s, "wire_s": w}
                for r, w in zip(self.records, self.wire_times())]

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"records": self.to_json(), "waits": self.waits, "totals": self.totals()}, f, indent=1)

    def _add(self, rec: Record, group) -> None:
        with self._lock:
            self.records.append(rec)
            self.groups.setdefault(rec.group, group)

    def _waited(self, start: float, end: float) -> None:
        with self._lock:
            self.waits.append((start, end, threading.get_ident()))


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
           is_root: bool = False, algorithm: str = "native", root: int | None = None, channel: str | None = None):
    """Append one Record to every active trace; return the handle the caller should get back.

    Called only when _ACTIVE is non-empty, right after the issuing call returned. An async
    handle comes back wrapped in a TimedWork, which times the caller's waits (on it and on its
    future); the completion time comes from the work's future, or, without one, from wait().
    `channel`: a point-to-point op's "<group>:<src>><dst>" (comm.p2p), its record's group, of 2 ranks.
    """
    launched = time.perf_counter()
    world = 2 if channel else dist.get_world_size(group)
    payload = payload_numel * (tensor.element_size() if tensor is not None else 0)
    wire_op, wire = backend_bytes(op, algorithm, dist.get_backend(group), payload, world, is_root)
    rec = Record(
        op=op, group=channel or _group_name(group), group_size=world,
        dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else "-",
        numel=payload_numel, payload_bytes=payload, sent_bytes=ring_bytes_sent(op, payload, world, is_root=is_root),
        async_op=work is not None, issued_s=issued_s, algorithm=algorithm, wire_op=wire_op, wire_bytes=wire,
        launched_s=launched, root=root)
    traces = list(_ACTIVE)
    for t in traces:
        t._add(rec, group)
    if work is None:
        rec.completed_s = launched
        return None
    try:
        future = work.get_future()
    except RuntimeError:  # gloo's async reduce_scatter has no future: time it at wait()
        return TimedWork(work, rec, traces, None)
    on_cpu = tensor is None or tensor.device.type == "cpu"
    return TimedWork(work, rec, traces, TimedFuture(future, rec, traces) if on_cpu else future)
