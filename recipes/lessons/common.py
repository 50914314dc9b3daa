"""What every lesson shares: the run context, a table printer, the one checked claim,
timing across ranks, bytes counted by the kernel, emulated accelerator compute with a log
of when it ran, and a peak-memory probe.

A lesson is a module with a `run(ctx)` function and a `CLAIM` template: it measures,
prints one small table on rank 0 and ends with ctx.claim(CLAIM.format(...), holds,
timing_holds). `holds` is what bytes, call counts, the order of events and memory decide;
`timing_holds` what a clock decides. All ranks compute the verdict from the same
(all-reduced) numbers; ctx.claim takes the minimum over ranks anyway, so every rank agrees
and a failed claim exits non-zero everywhere. The CLAIM template is also what
tests/docs/test_drift.py holds the published claims to.

Where the bytes come from. The trace (minidist.comm.trace) counts what each call should
send under the ring model: a model, which proves nothing when compared with the same
formula. So a byte claim is checked against kernel_bytes(): what the process really
wrote to gloo's sockets, as Linux counts it (minidist.comm.kernel_io).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import re
import statistics
import string
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from minidist import runtime
from minidist.comm import kernel_io
from minidist.runtime import Topology


class ClaimFailed(AssertionError):
    """A lesson's claim did not hold on this run."""


@dataclass
class Context:
    """Where a lesson runs and how big: `small` shrinks models and repeats for CI."""

    topo: Topology
    small: bool
    claims: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.topo.rank

    @property
    def world(self) -> int:
        return self.topo.world_size

    def say(self, text: str = "") -> None:
        if self.rank == 0:
            print(text, flush=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence]) -> None:
        """Print a plain-text table on rank 0; floats are shown with 3 significant figures."""
        def cell(v) -> str:
            return f"{v:.3g}" if isinstance(v, float) else str(v)
        cells = [[cell(v) for v in row] for row in rows]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
        self.say("\n".join(lines))

    def claim(self, text: str, holds: bool, timing_holds: bool = True) -> None:
        """Print the lesson's claim and its verdict; raise ClaimFailed (on every rank) if it fails.

        `holds` is the part that bytes, counts and memory decide: it must hold every time.
        `timing_holds` is the part a clock decides. Small runs (--small, what CI runs on a
        shared machine) report a timing miss without failing: load from other processes can
        hide any time difference, and speed is the benchmarks' business, not a test's.
        """
        verdict = torch.tensor([int(bool(holds)), int(bool(timing_holds))])
        dist.all_reduce(verdict, dist.ReduceOp.MIN)
        ok, timed_ok = bool(verdict[0]), bool(verdict[1])
        if ok and not timed_ok and self.small:
            self.claims.append((text, True))
            self.say(f"claim: {text} -> timing not seen on this small run (load hides it; run without --small)")
            return
        ok = ok and timed_ok
        self.claims.append((text, ok))
        self.say(f"claim: {text} -> {'holds' if ok else 'FAILS'}")
        if not ok:
            raise ClaimFailed(text)


def max_over_ranks(value: float) -> float:
    """The slowest rank's value: a step is as slow as its slowest rank."""
    t = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: float) -> float:
    t = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.SUM)
    return float(t.item()) / dist.get_world_size()


def kernel_bytes(fn: Callable[[], object]) -> float:
    """Bytes this process wrote while fn() ran, as the kernel counts them, averaged over ranks.

    Linux's /proc/self/io (minidist.comm.kernel_io): everything gloo put on its sockets, all
    threads included, a bare barrier pair subtracted. Not minidist's model of the collectives
    but what really left each process. The mean over ranks is the per-rank cost of calls that
    load ranks unevenly (a broadcast: the root sends, the last rank of the chain does not).
    Every rank must call it; print nothing inside fn (stdout is a write too).
    """
    if not kernel_io.available():
        raise RuntimeError("this lesson counts bytes with Linux's /proc/self/io, which this system lacks")
    with kernel_io.written() as w:
        fn()
    return mean_over_ranks(w.bytes)


def interleaved_times(fns: dict, repeats: int, warmup: int = 1,
                      stat: Callable[[list[float]], float] = statistics.median) -> dict:
    """Seconds of each fn (median of `repeats`, or `stat`), run in alternating order so that machine
    noise hits all alike. stat=min reads the best case, which load on a shared machine disturbs least."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for rep in range(repeats):
        for name in (names if rep % 2 == 0 else names[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {k: max_over_ranks(stat(v)) for k, v in times.items()}


@dataclass
class ComputeLog:
    """When each emulated-compute sleep started (perf_counter, the clock comm.trace stamps
    collectives with): the *order* of compute and communication, which no load can change."""

    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    """(phase, start, end) of every sleep, in the order they ran (recipes/traced_step.py draws them)."""


_LOGS: list[ComputeLog] = []


@contextlib.contextmanager
def compute_log():
    """Record the start of every sleeping forward and backward inside the block."""
    log = ComputeLog()
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


class _Sleep(torch.autograd.Function):
    """Identity; forward sleeps `seconds`, backward twice that: compute that leaves the CPU free."""

    @staticmethod
    def forward(ctx, x, seconds: float, backward_only: bool):
        ctx.seconds = seconds
        if not backward_only:
            start = time.perf_counter()
            for log in _LOGS:
                log.forward.append(start)
            time.sleep(seconds)
            for log in _LOGS:
                log.spans.append(("forward", start, time.perf_counter()))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        start = time.perf_counter()
        for log in _LOGS:
            log.backward.append(start)
        time.sleep(2 * ctx.seconds)
        for log in _LOGS:
            log.spans.append(("backward", start, time.perf_counter()))
        return grad, None, None


def sleep(x: torch.Tensor, seconds: float, backward_only: bool = False) -> torch.Tensor:
    """Emulated accelerator compute: on 2 CPU cores, real matmuls would fight gloo's threads for
    the cores and hide nothing; a sleep occupies time, not a core, as a GPU kernel would."""
    return _Sleep.apply(x, seconds, backward_only) if seconds > 0 else x


class SleepLinear(torch.nn.Module):
    """Linear(width, width) + tanh after an emulated-compute sleep (forward s, backward 2s)."""

    def __init__(self, width: int, seconds: float = 0.0, backward_only: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.seconds, self.backward_only = seconds, backward_only

    def forward(self, x):
        return torch.tanh(self.lin(sleep(x, self.seconds, self.backward_only)))


def peak_bytes(step: Callable[[], object], *tracked: object) -> int:
    """Peak bytes of live CPU tensor storage during step(), counting `tracked` modules/optimizers.

    CPU tensors have no allocator statistics (torch.cuda.max_memory_allocated has no CPU
    twin), so this uses torch's MemTracker, a dispatch mode that sees every tensor created
    and every storage resize. Like the benchmarks, it is measured in its own untimed step.
    """
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    with warnings.catch_warnings():  # MemTracker warns about the None grads it is handed; harmless
        warnings.simplefilter("ignore", UserWarning)
        mt.track_external(*tracked)
        with mt:
            step()
    return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def peak_above_end(step: Callable[[], object], *tracked: object) -> tuple[int, int]:
    """(peak bytes of live CPU tensor storage during step(), the bytes still live when it returns).

    For a step that calls a module more than once (a pipeline runs each stage once per
    micro-batch), which MemTracker's per-module statistics refuse: the same tracker with those
    statistics off, counting storages only. What is live at the end (parameters, gradients, and
    the storage of any untracked tensor the step took a view of, such as the batch it cut into
    micro-batches) is what the step leaves; peak minus end is what it held on the way.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class StoragesOnly(MemTracker):
        def _pre_fw_hook(self, *args) -> None: ...
        def _post_fw_hook(self, *args) -> None: ...
        def _pre_bw_hook(self, *args) -> None: ...
        def _post_bw_hook(self, *args) -> None: ...

    mt = StoragesOnly()
    with warnings.catch_warnings():  # as peak_bytes: MemTracker warns about the None grads it is handed
        warnings.simplefilter("ignore", UserWarning)
        mt.track_external(*tracked)
        with mt:
            step()
            end = mt.get_tracker_snapshot()[torch.device("cpu")]["Total"]
    return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]), int(end)


MiB = 2 ** 20


def claim_pattern(name: str) -> str:
    """A regular expression matching every claim lesson `name` can print: its words, any values.

    Read from the lesson's source (its ctx.claim(...) call: a CLAIM.format(...) template, an
    f-string or a plain string), so the published claims can be held to the wording the code
    prints today without running the lesson (tests/docs/test_drift.py).
    """
    tree = ast.parse(inspect.getsource(importlib.import_module(f"recipes.lessons.{name}")))
    consts = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
              and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
              for t in node.targets if isinstance(t, ast.Name)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "claim" and n.args]
    if len(calls) != 1:
        raise ValueError(f"lesson {name}: expected one ctx.claim(...) call, found {len(calls)}")
    return _pattern(calls[0].args[0], consts)


def _pattern(node: ast.expr, consts: dict[str, str]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.Name) and node.id in consts:
        return re.escape(consts[node.id])
    if isinstance(node, ast.JoinedStr):  # f"...": literal parts kept, every {value} any text
        return "".join(_pattern(v, consts) if isinstance(v, ast.Constant) else "(.+?)" for v in node.values)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and isinstance(node.func.value, (ast.Name, ast.Constant))):
        template = consts[node.func.value.id] if isinstance(node.func.value, ast.Name) else node.func.value.value
        return "".join(re.escape(lit) + ("(.+?)" if field is not None else "")
                       for lit, field, _, _ in string.Formatter().parse(template))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pattern(node.left, consts) + _pattern(node.right, consts)
    raise ValueError(f"a claim's text must be a string, an f-string or TEMPLATE.format(...): {ast.unparse(node)}")


def main_for(run: Callable[[Context], None], title: str) -> None:
    """The entry point of `torchrun ... -m recipes.lessons.<name> [--small]`."""
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--small", action="store_true", help="small sizes and few repeats (CI)")
    args = parser.parse_args()
    run_lessons([run], args.small, [title])


def run_lessons(runs: Sequence[Callable[[Context], None]], small: bool, titles: Sequence[str]) -> None:
    """Run lessons in one process group, then end the process: exit code 1 if any claim failed."""
    failed = 0
    try:
        with runtime.distributed("gloo", timeout_s=120) as topo:
            torch.set_num_threads(1)
            ctx = Context(topo, small)
            for i, run in enumerate(runs):
                ctx.say(f"\n== {titles[i]}")
                torch.manual_seed(0)
                try:
                    run(ctx)
                except ClaimFailed:
                    failed += 1
                dist.barrier()
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(1 if failed else 0)
