"""One training step per engine, traced and drawn: the timelines on the DDP, ZeRO and FSDP pages.

    torchrun --standalone --nproc_per_node=2 -m recipes.traced_step                  # every engine
    torchrun --standalone --nproc_per_node=2 -m recipes.traced_step --engine fsdp --out outputs/step

The same small model under each engine: an input layer, four blocks and an output layer, every
one Linear(512, 512) (1 MiB of fp32 weight). The blocks' forward sleeps 8 ms and their backward
16 ms (emulated accelerator compute, recipes.lessons.common.sleep: on two CPU cores real matmuls
would take the cores gloo's threads need, and nothing could overlap). After two warm-up steps
(DDP and ZeRO rebuild their buckets in the order gradients arrived) every rank runs one step
inside minidist.comm.trace(), which stamps each collective's issue and completion, while a
probe times the engine's own methods as they run: the gradient hooks, the bucket launches,
the end-of-backward callback (DDP, ZeRO); the gathers, their waits, the frees
and the post_backward reductions of each unit (FSDP). The probe wraps bound methods on the
engine's objects for this one run; it changes no behaviour.

Rank 0 collects every rank's events (one clock: perf_counter is system-wide on Linux), prints
the numbered moments of its own step, and draws the timeline with
minidist.compare.timeline.draw_step: per rank a compute row, a row of the engine's own work and
a lane per overlapping collective. The numbers in the picture are the printed list's.
"""

from __future__ import annotations

import argparse
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import DDP, FSDP, ShardedOptimizer, comm, runtime
from minidist.compare.timeline import draw_step
from recipes.lessons.common import compute_log, sleep

ENGINES = ("ddp", "zero", "fsdp")
WIDTH, BLOCKS, SECONDS = 512, 4, 0.008
DDP_BUCKET_MB = 2.0
"""DDP's and ZeRO's bucket cap here: two blocks per bucket, so several buckets travel during backward."""


class Block(nn.Module):
    """Linear + tanh after an emulated-compute sleep (forward SECONDS, backward twice that)."""

    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.lin, self.seconds = nn.Linear(width, width), seconds

    def forward(self, x):
        return torch.tanh(self.lin(sleep(x, self.seconds)))


class Net(nn.Module):
    """inp -> blocks -> out. Under FSDP (wrap={Block}) inp and out form the root unit."""

    def __init__(self, width: int = WIDTH, blocks: int = BLOCKS, seconds: float = SECONDS):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.Sequential(*(Block(width, seconds) for _ in range(blocks)))
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


@dataclass
class Probe:
    """Times methods of the engine's objects while they run: (kind, label, start, end) per call."""

    events: list[tuple[str, str, float, float]] = field(default_factory=list)
    on: bool = False

    def wrap(self, obj, method: str, kind: str, label: Callable[..., str]) -> None:
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            if not self.on:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.events.append((kind, label(*args, **kwargs), start, time.perf_counter()))
        setattr(obj, method, timed)  # the instance attribute shadows the class's method


def build(engine: str):
    """(model, optimizer) for `engine`; the probe is attached once the buckets are final (probe_engine)."""
    torch.manual_seed(0)
    net = Net()
    if engine == "ddp":
        model = DDP(net, bucket_cap_mb=DDP_BUCKET_MB)
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)
    if engine == "zero":
        return net, ShardedOptimizer(net.parameters(), torch.optim.SGD, bucket_cap_mb=DDP_BUCKET_MB, lr=1e-3)
    model = FSDP(net, wrap={Block})
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def probe_engine(engine: str, model, opt, probe: Probe) -> Callable[[], None]:
    """Wrap the methods whose moments the timeline shows (after warm-up: DDP rebuilds its buckets).

    Returns what undoes the one module-level wrap (FSDP's finish_backward); the rest are
    instance attributes that go with the objects."""
    if engine == "ddp":
        red = model.reducer
        probe.wrap(red, "_on_grad_ready", "hook", lambda i, _param: red.names[i])
        for k, b in enumerate(red.buckets):  # Bucket.launch takes the future of the all_reduce just issued
            probe.wrap(b, "launch", "launch", lambda _future, k=k: f"bucket {k}")
        probe.wrap(red, "_finalize_backward", "callback", lambda *a, **k: "end of backward")
        return lambda: None
    if engine == "zero":
        eng, names = opt.engine, {id(p): n for n, p in model.named_parameters()}
        probe.wrap(eng.reducer, "_on_grad", "hook", lambda _key, p: names[id(p)])
        for b in eng.buckets:
            probe.wrap(b, "launch", "launch", lambda b=b: f"bucket {b.index}")
        probe.wrap(eng.reducer, "_end_backward", "callback", lambda: "end of backward")
        probe.wrap(eng.gather, "launch", "gather", lambda buckets: "all_gather into the parameters")
        return lambda: None
    import minidist.fsdp.unit as unit_mod
    for u in model.units:
        name = u.name or "root"
        probe.wrap(u, "_start_unshard", "gather", lambda name=name: name)
        probe.wrap(u, "_finish_unshard", "wait", lambda name=name: name)
        probe.wrap(u, "_start_reduction", "launch", lambda name=name: name)
    finish = unit_mod.finish_backward  # queued as a lambda that looks the module's name up: wrap it there

    def timed_finish(schedule):
        start = time.perf_counter()
        try:
            return finish(schedule)
        finally:
            probe.events.append(("callback", "finish_backward", start, time.perf_counter()))
    unit_mod.finish_backward = timed_finish
    return lambda: setattr(unit_mod, "finish_backward", finish)


def step(model, opt, x, phases: list | None = None) -> None:
    marks = [time.perf_counter()]
    loss = model(x).square().mean()
    marks.append(time.perf_counter())
    loss.backward()
    marks.append(time.perf_counter())
    opt.step()
    opt.zero_grad(set_to_none=True)
    marks.append(time.perf_counter())
    if phases is not None:
        phases += [(p, a, b) for p, a, b in zip(("forward", "backward", "optimizer"), marks, marks[1:])]


def traced(engine: str, x: torch.Tensor) -> dict:
    """Warm up, then one traced step; this rank's events (perf_counter seconds)."""
    probe = Probe()
    model, opt = build(engine)
    for _ in range(2):
        step(model, opt, x)
    restore = probe_engine(engine, model, opt, probe)
    phases: list = []
    dist.barrier()
    probe.on = True
    try:
        with comm.trace() as t, compute_log() as log:
            step(model, opt, x, phases)
    finally:
        probe.on = False
        restore()
    records = [{"op": r.op, "issued": r.issued_s, "completed": r.completed_s, "bytes": r.payload_bytes}
               for r in t.records]
    return {"rank": dist.get_rank(), "phases": phases, "compute": log.spans, "probes": probe.events,
            "records": records}


def calls_line(records: list[dict]) -> str:
    """The step's collectives, counted per op in order of first issue (scripts/docs_facts.py checks it)."""
    calls: dict[str, int] = {}
    for r in records:
        calls[r["op"]] = calls.get(r["op"], 0) + 1
    return "collectives in the step: " + ", ".join(f"{op} x{k}" for op, k in calls.items())


# ------------------------------------------------------------------------------ the numbered moments

def _first(raw: dict, kind: str, label: str | None = None) -> tuple:
    return next(e for e in raw["probes"] if e[0] == kind and (label is None or e[1] == label))


def _phase(raw: dict, name: str) -> tuple:
    return next(p for p in raw["phases"] if p[0] == name)


def _left(raw: dict, t: float) -> int:
    """Sleeping backwards not yet started at time t."""
    return sum(1 for ph, a, _ in raw["compute"] if ph == "backward" and a > t)


def moments_ddp(raw: dict) -> list[tuple[float, str, str]]:
    hook = _first(raw, "hook")
    out = [(hook[2], "engine", f"first gradient hook ({hook[1]}): the gradient is divided by N where it lies and "
                               f"its bucket counts down")]
    for _, label, a, _ in (e for e in raw["probes"] if e[0] == "launch"):
        out.append((a, "engine", f"{label} full: its all_reduce is launched, {_left(raw, a)} of the "
                                 f"{BLOCKS} blocks' backwards still to run"))
    cb = _first(raw, "callback")
    out.append((cb[2], "engine", f"backward done: the end-of-backward callback waits for every bucket in order "
                                 f"({(cb[3] - cb[2]) * 1e3:.1f} ms)"))
    opt = _phase(raw, "optimizer")
    out.append((opt[1], "compute", "optimizer.step() on the averaged gradients, the same on every rank"))
    return out


def moments_zero(raw: dict) -> list[tuple[float, str, str]]:
    hook = _first(raw, "hook")
    out = [(hook[2], "engine", f"first gradient hook ({hook[1]}): p.grad is folded into its bucket's grad_flat "
                               f"and set to None")]
    for _, label, a, _ in (e for e in raw["probes"] if e[0] == "launch"):
        out.append((a, "engine", f"{label} full: its reduce_scatter is launched, {_left(raw, a)} of the "
                                 f"{BLOCKS} blocks' backwards still to run"))
    cb = _first(raw, "callback")
    out.append((cb[2], "engine", f"backward done: the end-of-backward callback waits for the reduce_scatters "
                                 f"({(cb[3] - cb[2]) * 1e3:.1f} ms); each rank holds its slice of the average"))
    opt = _phase(raw, "optimizer")
    out.append((opt[1], "compute", "step() updates this rank's 1/N of the elements"))
    g = _first(raw, "gather")
    out.append((g[2], "engine", f"one all_gather per bucket writes every rank's slice into the parameters; "
                                f"step() waits for them ({(g[3] - g[2]) * 1e3:.1f} ms)"))
    return out


def moments_fsdp(raw: dict) -> list[tuple[float, str, str]]:
    fwd, bwd = _phase(raw, "forward"), _phase(raw, "backward")
    gathers = [e for e in raw["probes"] if e[0] == "gather"]
    in_fwd = [e for e in gathers if e[2] < fwd[2]]
    in_bwd = [e for e in gathers if bwd[1] <= e[2] < bwd[2]]
    reductions = [e for e in raw["probes"] if e[0] == "launch"]
    out = [(in_fwd[0][2], "engine", f"{in_fwd[0][1]}: gathered at the start of forward, nothing to hide behind"),
           (in_fwd[1][2], "engine", f"{in_fwd[1][1]}: prefetched as soon as {in_fwd[0][1]} is installed, before "
                                    f"it computes (one unit ahead, FSDP2's default prefetch)"),
           (fwd[2], "compute", "forward ends: every block was freed after its forward; the root, which ends the "
                               "forward, stays gathered for backward (S_root is not gathered again)"),
           (in_bwd[0][2], "engine", f"{in_bwd[0][1]}: gathered again for backward (prefetched by the root's "
                                    f"pre-backward); {len(in_bwd)} backward gathers, {len(in_fwd)} forward"),
           (reductions[0][2], "engine", f"{reductions[0][1]}: all its gradients exist, post_backward frees it "
                                        f"and launches its reduce_scatter (each later unit first completes the "
                                        f"previous unit's: one in flight, hence the long red boxes)"),
           (reductions[-1][2], "engine", f"{reductions[-1][1]}: the last reduce_scatter (the root's: inp's "
                                         f"gradient comes last)")]
    cb = _first(raw, "callback")
    out.append((cb[2], "engine", f"finish_backward waits for the reductions and hands each shard its averaged rows "
                                 f"({(cb[3] - cb[2]) * 1e3:.1f} ms)"))
    opt = _phase(raw, "optimizer")
    out.append((opt[1], "compute", "optimizer.step() on this rank's rows only"))
    return out


MOMENTS = {"ddp": moments_ddp, "zero": moments_zero, "fsdp": moments_fsdp}
TITLES = {"ddp": "DDP: bucketed all_reduce in the gradient hooks",
          "zero": "ZeRO-1: reduce_scatter in the hooks, all_gather after step()",
          "fsdp": "FSDP full_shard: gathers with prefetch, reduce_scatter per unit, the root kept"}


def report(engine: str, ranks: list[dict], out: Path) -> None:
    """Rank 0: print the step's collectives and numbered moments, draw the timeline."""
    raw = min(ranks, key=lambda r: r["rank"])
    t0 = min(p[1] for r in ranks for p in r["phases"])
    moments = MOMENTS[engine](raw)
    print(f"== {engine}: {TITLES[engine]}")
    print(f"N = {len(ranks)}; inp, {BLOCKS} blocks, out: Linear({WIDTH}, {WIDTH}) each;\nblocks sleep "
          f"{SECONDS * 1e3:.0f} ms forward, {2 * SECONDS * 1e3:.0f} ms backward")
    print(calls_line(raw["records"]))
    print("rank 0's step, ms since the step started:")
    for n, (t, _, text) in enumerate(moments, 1):
        print(textwrap.fill(text, 100, initial_indent=f"{n:>2}. {(t - t0) * 1e3:6.1f}  ", subsequent_indent=" " * 12))
    out.mkdir(parents=True, exist_ok=True)
    path = draw_step(ranks, out / f"step_{engine}.png", TITLES[engine], moments)
    print(f"timeline: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--engine", choices=("all",) + ENGINES, default="all")
    ap.add_argument("--out", default="outputs/traced_step", help="directory for step_<engine>.png")
    args = ap.parse_args()
    try:
        with runtime.distributed("gloo", timeout_s=120) as topo:
            torch.set_num_threads(1)
            x = torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(topo.rank))
            for engine in ENGINES if args.engine == "all" else (args.engine,):
                mine = traced(engine, x)
                every = [None] * topo.world_size
                dist.all_gather_object(every, mine)
                if topo.rank == 0:
                    report(engine, every, Path(args.out))
                dist.barrier()
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()
