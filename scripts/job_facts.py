"""The generator jobs' snippets (the tour, the benchmarks, compare, the worked numbers, the layers' recipes):
what in each the code decides, recomputed cheaply from the code as it is now.

Each function returns a snippet's structural facts without its clock-bound measurement (a table cell,
a line that must match a pattern, a block of text); scripts/docs_facts.py registers them with the
lessons' (lesson_facts.py) and the track's (tutorial_facts.py). A function the registry marks
`world=2` runs on every rank of a two-process gloo group.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import sys
from pathlib import Path
from typing import Callable

from snippet_check import ROOT, Fact, cell, line, read_cell, text


def _module_from(path: str):
    """A script of the repository (benchmarks/...) as a module, without running its main(); its own
    directory on the path, as when it runs (benchmarks import benchmarks/emulated.py)."""
    name = "_docs_" + Path(path).stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
        sys.path.insert(0, str((ROOT / path).parent))
        try:
            spec.loader.exec_module(sys.modules[name])
        finally:
            sys.path.remove(str((ROOT / path).parent))
    return sys.modules[name]


def tour_values() -> list[Fact]:
    """The values every collective leaves on every rank (acts one to three of the tour), exactly."""
    from minidist.recipes import collectives_tour as tour
    import torch.distributed as dist
    out = tour.Transcript(dist.get_rank(), dist.get_world_size())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        for act, title in ((tour.act_one, "broadcast, all_reduce, reduce, all_gather"),
                           (tour.act_two, "scatter, gather, barrier"),
                           (tour.act_three, "reduce_scatter, all_gather, all_to_all")):
            act(out)
            out.flush(title)
    return [text("the values of every collective, rank by rank", buf.getvalue().strip("\n"))]


def tour_cost() -> list[Fact]:
    """Calls, payload and bytes of the tour's traced act (its times and predictions are the clock's)."""
    from minidist import comm
    from minidist.recipes import collectives_tour as tour
    import torch.distributed as dist
    real = comm.calibrate
    comm.calibrate = lambda *a, **k: comm.CostModel(0.0, 0.0)  # the model's numbers are not structural
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            world = dist.get_world_size()
            tour.act_four(tour.Transcript(dist.get_rank(), world), (1 << 20) - (1 << 20) % (world * 4))
    finally:
        comm.calibrate = real
    if dist.get_rank() != 0:
        return []  # the table is printed by rank 0
    fresh = buf.getvalue()
    head = next(s for s in fresh.splitlines() if s.startswith("op "))
    keys = [" ".join(s.split()[:2]) for s in fresh.splitlines()[fresh.splitlines().index(head) + 2:] if s.strip()]
    return [cell("the tour's traced calls", k, col, read_cell(fresh, k, col))
            for k in keys for col in ("calls", "payload MB", "sent MB", "wire MB") if col in head]


def compare() -> list[Fact]:
    """Collectives per step of every strategy (one traced step of the trainer's, after compare's warm-up),
    and its closed-form formula: the first table of the compare snippet (markdown)."""
    import torch
    import torch.distributed as dist

    from minidist import comm, runtime
    from minidist.compare.analytic import TensorParallel, closed_form
    from minidist.compare.rows import Row, row_strategy
    from minidist.compare.measure import Bench
    from minidist.compare.report import OP_ABBREV
    from minidist.recipes.compare import compose
    from minidist.train.data import build_datasets
    cfg = compose(["trainer.batch_size=1"])  # the calls per step do not depend on the batch: 1.7 s, not 4.2
    topo = runtime.Topology(dist.get_rank(), dist.get_world_size(), dist.get_rank(), "gloo", torch.device("cpu"),
                            dist.group.WORLD)
    train_ds, _, _ = build_datasets(cfg, topo)
    facts = []
    for name in cfg.strategies:
        bench = Bench(cfg, row_strategy(cfg, name), topo, train_ds)
        for _ in range(cfg.warmup_steps):
            bench.step()
        with comm.trace() as t:
            bench.step()
        calls: dict[str, int] = {}
        for r in t.records:
            calls[r.op] = calls.get(r.op, 0) + 1
        facts.append(cell(f"{name}: collectives per step", name, "calls/step",
                          " ".join(f"{OP_ABBREV.get(op, op)}{k}" for op, k in calls.items()), as_set=True))
        row = Row.parse(name)  # a tensor-parallel row: TP's term and the strategy's over the N / T others
        so = row_strategy(cfg, name)
        tp = TensorParallel(row.tp, topo.world_size // row.tp, (), sequence_parallel=so.sequence_parallel,
                            vocab_parallel=so.vocab_parallel) if row.tp > 1 else None
        facts.append(cell(f"{name}: closed form", name, "formula", closed_form(row.base, tp)))
    return facts


def bench_ddp() -> list[Fact]:
    """Buckets of minidist and of torch's DDP (after both rebuilt them) at each cap the job runs."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from minidist.ddp import DDP
    bench = _module_from("benchmarks/ddp_vs_torch.py")
    facts = []
    for cap in _job_values("bench_ddp", "--buckets"):
        torch.manual_seed(0)
        base = bench.Net(64, 1024, 8, 0.0)
        models = [DDP(copy.deepcopy(base), bucket_cap_mb=cap), TorchDDP(copy.deepcopy(base), bucket_cap_mb=cap)]
        x, y = torch.randn(4, 64), torch.randn(4, 1024)
        for _ in range(3):  # both rebuild their buckets in ready order after the first backward (as the benchmark)
            for m in models:
                torch.nn.functional.mse_loss(m(x), y).backward()
        ours, theirs = len(models[0].reducer.buckets), models[1]._get_ddp_logging_data()["num_buckets_reduced"]
        for sleep in _job_values("bench_ddp", "--sleep-ms"):
            facts.append(cell(f"buckets at bucket_cap_mb={cap:g}", f"{sleep:g} {cap:g}", "buckets", f"{ours}/{theirs}"))
    return facts


def bench_fsdp_memory(world: int) -> Callable[[], list[Fact]]:
    def facts() -> list[Fact]:
        from minidist.models.gpt import GPT
        psi = sum(p.numel() for p in GPT(_module_from("benchmarks/fsdp_vs_torch.py").CFG).parameters())
        return [text("the benchmark's model and ZeRO-3's formula",
                     f"world {world}: psi {psi}; persistent"),
                text("16 psi / N", f"16 psi/N {16 * psi / world / 2**20:.3f} MiB")]
    return facts


def bench_fsdp_speed() -> list[Fact]:
    from minidist.models.gpt import GPT
    psi = sum(p.numel() for p in GPT(_module_from("benchmarks/fsdp_vs_torch.py").CFG).parameters())
    return [text("the benchmark's model", f"GPT {psi / 1e6:.2f}M params")]


def _job_values(job: str, flag: str) -> list[float]:
    """The numbers after `flag` in a generator job's command line."""
    from gen_docs_numbers import JOBS
    words = JOBS[job][0].split()
    i = words.index(flag) + 1
    values = []
    while i < len(words) and not words[i].startswith("--"):
        values.append(float(words[i]))
        i += 1
    return values


def traced_step(engine: str) -> Callable[[], list[Fact]]:
    """The collectives of the traced step (recipes/traced_step.py), counted per op, after its warm-up."""
    def facts() -> list[Fact]:
        import torch
        import torch.distributed as dist

        from recipes import traced_step as ts
        x = torch.randn(16, ts.WIDTH, generator=torch.Generator().manual_seed(dist.get_rank()))
        return [text(f"{engine}: the collectives of one step", ts.calls_line(ts.traced(engine, x)["records"]))]
    return facts


def worked_numbers_xl() -> list[Fact]:
    """The XL's tables: every number comes from the model's shapes and the formulas."""
    from recipes import worked_numbers as wn
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        wn.xl_tables()
    return [text("the XL's bytes and model states", buf.getvalue().strip("\n"))]


def worked_numbers_n4() -> list[Fact]:
    """The formula columns of the N = 4 measurement (the kernel's and MemTracker's columns are measured)."""
    from recipes import worked_numbers as wn
    n = 4
    sh = wn.Shapes.of(wn.SMALL, (n,))
    facts = []
    for precision, (e, _) in wn.PRECISIONS.items():
        for s in wn.STRATEGIES:
            if s == "zero1_broadcast" and precision == "bf16":
                continue
            key = f"{s} {precision}"
            facts += [cell(f"{key}: bytes formula", key, "formula", f"{wn.sent_bytes(s, sh, n, e, n // 2) / wn.MB:.2f}"),
                      cell(f"{key}: states formula", key, "states",
                           f"{wn.state_bytes(s, sh, n, precision, n // 2)[0] / wn.MB:.2f}")]
    return facts


def scale_numbers(part: str) -> Callable[[], list[Fact]]:
    """recipes/scale_numbers.py's tables: formulas and shapes only, every number structural."""
    def facts() -> list[Fact]:
        from minidist.comm import nccl
        from minidist.memory import activations
        if part == "plan":
            from recipes.scale_numbers import plan_case
            return [text("the planner's table", plan_case().strip("\n"))]
        return [text(f"the {part} table", (nccl.table() if part == "nccl" else activations.table()).strip("\n"))]
    return facts


def plan_check() -> list[Fact]:
    """The planner's peak per GPU of every memory row recipes/plan_check.py measures (a formula)."""
    from recipes.plan_check import planned_memory
    return [line(f"{row}: the planned MB and in flight", f"{row:<18}",
                 rf"\s*{planned['total'] / 1e6:.3f}\s+{planned['in_flight'] / 1e6:.3f}\s.*")
            for row, (_, planned) in planned_memory().items()]


def pp_timeline() -> list[Fact]:
    """Every schedule's action lists at p = 4, m = 8 (what the pictures ran; their times are the clock's)."""
    from minidist import pp
    from recipes.pp_timeline import SCHEDULES
    return [text(f"{name}: the action lists", pp.build(name, 4, 8, v).table()) for name, v in SCHEDULES]


def bench_pp(p: int, microbatches=(1, 2, 4, 8, 16), names: tuple[str, ...] | None = None) -> Callable[[], list[Fact]]:
    """The formula column of the benchmark at p ranks, for the micro-batches and schedules its job runs."""
    def facts() -> list[Fact]:
        from minidist import pp
        bench = _module_from("benchmarks/pp_vs_torch.py")
        return [cell(f"{name} m = {m}: the formula", f"{name} {m}", "formula",
                     f"{pp.cost.bubble(name, p, m, bench.virtual(name)):.3f}")
                for name in names or bench.TORCH for m in microbatches if name != "interleaved_1f1b" or m % p == 0]
    return facts


def cp_ring() -> list[Fact]:
    """The tiles each rank of the traced ring computes at each step, as minidist.cp.blocks plans them
    (the job's 4 ranks, its default sequence of 2048 tokens)."""
    from minidist.cp import Chunking
    from recipes import cp_ring as ring
    return [text(f"{c.value}: the tiles per rank and step", ring.tile_table(ring.planned_tiles(c, 4, 2048)))
            for c in Chunking]


def activation_memory() -> list[Fact]:
    """The formula columns of recipes/activation_memory.py at N = 1, 2, 4 (the measured column is the profiler's)."""
    from recipes import activation_memory as am
    facts = []
    for n in (1, 2, 4):
        for name, par in am.layouts(n):
            _, total, layer, paper = am.formula_row(name, par)
            facts += [cell(f"{name}: {col}", name, col, f"{v / 1024:.1f}")
                      for col, v in (("formula", total), ("layer", layer), ("paper", paper))]
    return facts

