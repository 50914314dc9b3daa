"""What the code decides in every generated snippet, recomputed cheaply from the code as it is now.

A snippet in docs/generated/ mixes two kinds of number. Some are decided by the code:
which collectives a step issues and how many, a bucket layout, a traced byte count, a
formula, the wording of a lesson's claim, a function quoted from the package. Others are
decided by the clock (times, bandwidths, hidden shares) and by nothing else. The first kind
must never describe last month's code; the second is only as good as the machine it was
measured on, and its snippet says which commit, machine and load that was.

Each snippet is registered in SNIPPETS with the job that writes it, a sentence for each kind
(printed under the snippet, so the page says which is which) and a function that recomputes
its structural facts without the slow, clock-bound measurement: a table cell, a line that
must match a pattern, a block of text. scripts/gen_docs_numbers.py checks a fresh run's
output against them before it writes a snippet; tests/docs/test_drift.py checks the
committed snippets against them in CI. A fact function marked `world=2` runs on every rank
of a two-process gloo group and returns rank 0's facts.

    .venv/bin/python scripts/gen_docs_numbers.py --check      # the drift check, from the shell
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import inspect
import io
import sys
import textwrap
from pathlib import Path
from typing import Callable

import ladder
from lesson_facts import LESSON_MEASURED, lesson, lesson_claims, lessons  # noqa: F401 - lesson_claims: tests
from tutorial_facts import tutorial
from snippet_check import (GENERATED, ROOT, STAMP, Fact, Snippet, _norm, cell, check, from_json,  # noqa: F401
                           line, read_cell, text, to_json)


# --------------------------------------------------------------------------- the facts


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
    return [line(f"{row}: the planned MB", f"{row:<18}", rf"\s*{planned / 1e6:.3f}\s.*")
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


# code quoted from the package --------------------------------------------------

CODE_QUOTES = {
    "code_ddp_gradient_path": ("minidist.buckets.reducer:Reducer._on_grad_ready", "minidist.buckets.reducer:Reducer._mark_ready",
                               "minidist.buckets.launcher:OrderedLauncher.launch_ready",
                               "minidist.buckets.reduction:allreduce_presummed"),
}
"""Snippet name -> the functions it quotes, in the order a gradient meets them ("module:qualname")."""


def source_of(ref: str) -> tuple[str, str]:
    """(path relative to the repository, source text) of "module:qualname"."""
    mod_name, qual = ref.split(":")
    obj = importlib.import_module(mod_name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return str(Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT)), textwrap.dedent(inspect.getsource(obj))


def code_quote(name: str) -> Callable[[], list[Fact]]:
    return lambda: [text(f"{ref}: quoted source", source_of(ref)[1].strip("\n")) for ref in CODE_QUOTES[name]]


# --------------------------------------------------------------------------- the registry


def registry() -> dict[str, Snippet]:
    """Every snippet of docs/generated, by name."""
    snippets = {
        "tour_values": Snippet("tour", "every value", "", tour_values, world=2),
        "tour_cost": Snippet("tour", "calls, payload, sent and wire MB", "alpha, beta, every time", tour_cost,
                             world=2),
        "trace_overhead": Snippet("trace_overhead", "", "every number"),
        "main_job_sweep": Snippet("main_job_sweep", "", "every number (benchmarks/results/main_job_sweep.jsonl: "
                                  "each run's own commit and load)"),
        "bench_ddp": Snippet("bench_ddp", "the bucket counts", "every time, ratio and hidden share", bench_ddp,
                             world=2),
        "bench_fsdp_speed": Snippet("bench_fsdp_speed", "the model's size", "the step times and their ratios; the "
                                    "peaks (MemTracker) are measured only when generated", bench_fsdp_speed),
        "bench_fsdp_memory_1": Snippet("bench_fsdp_memory_1", "psi and ZeRO-3's 16 psi / N", "measured only when "
                                       "generated: the persistent bytes and peaks (MemTracker)", bench_fsdp_memory(1)),
        "bench_fsdp_memory_2": Snippet("bench_fsdp_memory_2", "psi and ZeRO-3's 16 psi / N", "measured only when "
                                       "generated: the persistent bytes and peaks (MemTracker)", bench_fsdp_memory(2)),
        "bench_fsdp_overlap": Snippet("bench_fsdp_overlap", "", "every number"),
        "compare": Snippet("compare", "the collectives per step and the closed-form formula of every strategy",
                           "alpha, beta, times, bandwidths, hidden shares, the projection's verdicts (from the "
                           "measured compute time); measured only when generated: bytes and memory", compare, world=2),
        "lesson_claims": Snippet("lessons", "every claim's wording", "the numbers in the claims (see each lesson)",
                                 lesson_claims),
        "lesson_fsdp_x_tp_n4": Snippet("lesson_fsdp_x_tp_n4", "the claim's wording", "measured at this size only "
                                       "when generated: " + LESSON_MEASURED["fsdp_x_tp"], lesson("fsdp_x_tp")),
    }
    snippets.update(lessons())
    snippets["worked_numbers_xl"] = Snippet("worked_numbers_xl", "every number (shapes and formulas)", "",
                                            worked_numbers_xl)
    snippets["worked_numbers_n4"] = Snippet(
        "worked_numbers_n4", "the model's size and the formula columns",
        "measured only when generated: the kernel's bytes and MemTracker's live bytes", worked_numbers_n4)
    snippets.update({f"traced_step_{e}": Snippet("traced_step", "the collectives of the step (ops and counts)",
                                                 "every time; the order of the moments (the picture beside it, "
                                                 f"docs/generated/step_{e}.png, is redrawn with it)", traced_step(e),
                                                 world=2) for e in ("ddp", "zero", "fsdp")})
    snippets.update({name: Snippet("code", "every line", "", code_quote(name)) for name in CODE_QUOTES})
    snippets["strategies"] = Snippet("strategies", "every row (the strategies' records)", "",
                                     lambda: [text("the records' table", ladder.table())])
    snippets["scale_nccl"] = Snippet("scale_numbers", "every number (NCCL's model, minidist.comm.nccl)", "",
                                     scale_numbers("nccl"))
    snippets["scale_activations"] = Snippet("scale_numbers", "every number (the formulas, minidist.memory)", "",
                                            scale_numbers("activations"))
    snippets["scale_plan"] = Snippet("scale_numbers", "every number (the planner, minidist.compare.plan)", "",
                                     scale_numbers("plan"))
    snippets.update(tutorial())
    snippets["pp_timeline"] = Snippet("pp_timeline", "every schedule's action lists", "the step times and the "
                                      "measured bubbles; the pictures beside it (docs/generated/pp_*.png) are "
                                      "redrawn with it", pp_timeline)
    snippets.update({job: Snippet(job, "the formula column", "every time, measured bubble and ratio", facts)
                     for job, facts in (("bench_pp", bench_pp(4)), ("bench_pp_2", bench_pp(2)),
                                        ("bench_pp_long", bench_pp(4, (8,), ("gpipe", "1f1b"))))})
    snippets["cp_ring"] = Snippet("cp_ring", "the tiles each rank computes at each step",
                                  "the messages and busy times (from the run's trace and clock); the picture beside "
                                  "it, docs/generated/cp_ring.png, is redrawn with it", cp_ring)
    snippets["activation_memory"] = Snippet("activation_memory", "the formula columns (minidist.memory.activations, "
                                            "Korthikanti et al.'s per layer)", "the measured column (torch's profiler) "
                                            "and its ratio", activation_memory)
    snippets["plan_check"] = Snippet("plan_check", "the planned MB column (minidist.compare.plan.memory)",
                                     "alpha and beta, every time (planned on the measured link), the measured MB "
                                     "and the ratios", plan_check)
    from gen_docs_numbers import JOBS
    for job in JOBS:  # a job added without facts yet: its one snippet, honestly labelled
        if job not in ("code", "strategies") and not any(s.job == job for s in snippets.values()):
            snippets[job] = Snippet(job, "", "every number (no structural facts registered for it yet)")
    return snippets


def describe(name: str) -> str:
    """The sentence under a snippet that says which of its parts CI holds to the code."""
    snip = registry()[name]
    checked = (f"Checked against the code in CI (tests/docs/test_drift.py): {snip.structural}."
               if snip.structural else "Nothing in it is checked against the code.")
    return checked + (f" Not checked: {snip.clock}." if snip.clock else "")


def check_snippet(name: str, snippet: str, facts: list[Fact] | None) -> list[str]:
    """Everything wrong with a committed snippet: facts the code contradicts, a missing stamp or legend."""
    bad = check(snippet, facts or [])
    if "-dirty`" in snippet:
        bad.append("measured on code with uncommitted changes: commit, then regenerate it")
    elif not STAMP.search(snippet):
        bad.append("no 'Measured at commit `...`' stamp: regenerate it with scripts/gen_docs_numbers.py")
    if describe(name) not in _norm(snippet):
        bad.append(f"its legend is not the registry's: {describe(name)!r}")
    return bad


def facts_for(names: list[str], world: int) -> dict[str, list[Fact]]:
    """Facts of the named snippets whose functions run at `world` (0: in-process, 2: on every rank)."""
    reg = registry()
    return {n: reg[n].facts() for n in names if reg[n].facts is not None and reg[n].world == world}


def main() -> None:
    """`torchrun --nproc_per_node=2 scripts/docs_facts.py OUT.json NAME...`: the world-2 facts, as JSON."""
    import json

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        facts = facts_for(sys.argv[2:], world=2)
        if dist.get_rank() == 0:
            Path(sys.argv[1]).write_text(json.dumps(to_json(facts)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
