"""What the code decides in every generated snippet, recomputed cheaply from the code as it is now.

A snippet in docs/generated/ mixes two kinds of number. Some are decided by the code:
which collectives a step issues and how many, a bucket layout, a traced byte count, a
formula, the wording of a lesson's claim, a function quoted from the package. Others are
decided by the clock (times, bandwidths, hidden shares) and by nothing else. The first kind
must never describe last month's code; the second is only as good as the machine it was
measured on, and its snippet says which commit, machine and load that was.

Each snippet is registered in registry() with the job that writes it, a sentence for each kind
(printed under the snippet, so the page says which is which) and a function that recomputes
its structural facts without the slow, clock-bound measurement: a table cell, a line that
must match a pattern, a block of text (the jobs' functions in job_facts.py, the lessons' in
lesson_facts.py, the track's in tutorial_facts.py; the quoted code's here). scripts/gen_docs_numbers.py checks a fresh run's
output against them before it writes a snippet; tests/docs/test_drift.py checks the
committed snippets against them in CI. A fact function marked `world=2` runs on every rank
of a two-process gloo group and returns rank 0's facts.

    .venv/bin/python scripts/gen_docs_numbers.py --check      # the drift check, from the shell
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Callable

import job_facts as jobs
import ladder
from lesson_facts import LESSON_MEASURED, lesson, lesson_claims, lessons  # noqa: F401 - lesson_claims: tests
from tutorial_facts import tutorial
from snippet_check import (GENERATED, ROOT, STAMP, Fact, Snippet, _norm, cell, check, from_json,  # noqa: F401
                           read_cell, text, to_json)


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


def _measured() -> dict[str, Snippet]:
    """The tour, the benchmarks, compare and the lessons' claims: measured snippets, each with what the code decides."""
    return {
        "tour_values": Snippet("tour", "every value", "", jobs.tour_values, world=2),
        "tour_cost": Snippet("tour", "calls, payload, sent and wire MB", "alpha, beta, every time", jobs.tour_cost,
                             world=2),
        "trace_overhead": Snippet("trace_overhead", "", "every number"),
        "main_job_sweep": Snippet("main_job_sweep", "", "every number (benchmarks/results/main_job_sweep.jsonl: "
                                  "each run's own commit and load)"),
        "bench_ddp": Snippet("bench_ddp", "the bucket counts", "every time, ratio and hidden share", jobs.bench_ddp,
                             world=2),
        "bench_fsdp_speed": Snippet("bench_fsdp_speed", "the model's size", "the step times and their ratios; the "
                                    "peaks (MemTracker) are measured only when generated", jobs.bench_fsdp_speed),
        "bench_fsdp_memory_1": Snippet("bench_fsdp_memory_1", "psi and ZeRO-3's 16 psi / N", "measured only when "
                                       "generated: the persistent bytes and peaks (MemTracker)",
                                       jobs.bench_fsdp_memory(1)),
        "bench_fsdp_memory_2": Snippet("bench_fsdp_memory_2", "psi and ZeRO-3's 16 psi / N", "measured only when "
                                       "generated: the persistent bytes and peaks (MemTracker)",
                                       jobs.bench_fsdp_memory(2)),
        "bench_fsdp_overlap": Snippet("bench_fsdp_overlap", "", "every number"),
        "compare": Snippet("compare", "the collectives per step and the closed-form formula of every strategy",
                           "alpha, beta, times, bandwidths, hidden shares, the projection's verdicts (from the "
                           "measured compute time); measured only when generated: bytes and memory", jobs.compare,
                           world=2),
        "lesson_claims": Snippet("lessons", "every claim's wording", "the numbers in the claims (see each lesson)",
                                 lesson_claims),
        "lesson_fsdp_x_tp_n4": Snippet("lesson_fsdp_x_tp_n4", "the claim's wording", "measured at this size only "
                                       "when generated: " + LESSON_MEASURED["fsdp_x_tp"], lesson("fsdp_x_tp")),
    }


def _formulas() -> dict[str, Snippet]:
    """The worked numbers, the traced steps, the quoted code, the records' table and the scale tables."""
    return {
        "worked_numbers_xl": Snippet("worked_numbers_xl", "every number (shapes and formulas)", "",
                                     jobs.worked_numbers_xl),
        "worked_numbers_n4": Snippet("worked_numbers_n4", "the model's size and the formula columns",
                                     "measured only when generated: the kernel's bytes and MemTracker's live bytes",
                                     jobs.worked_numbers_n4),
    } | {f"traced_step_{e}": Snippet("traced_step", "the collectives of the step (ops and counts)",
                                     "every time; the order of the moments (the picture beside it, "
                                     f"docs/generated/step_{e}.png, is redrawn with it)", jobs.traced_step(e),
                                     world=2) for e in ("ddp", "zero", "fsdp")
         } | {name: Snippet("code", "every line", "", code_quote(name)) for name in CODE_QUOTES} | {
        "strategies": Snippet("strategies", "every row (the strategies' records)", "",
                              lambda: [text("the records' table", ladder.table())]),
        "scale_nccl": Snippet("scale_numbers", "every number (NCCL's model, minidist.comm.nccl)", "",
                              jobs.scale_numbers("nccl")),
        "scale_activations": Snippet("scale_numbers", "every number (the formulas, minidist.memory)", "",
                                     jobs.scale_numbers("activations")),
        "scale_plan": Snippet("scale_numbers", "every number (the planner, minidist.compare.plan)", "",
                              jobs.scale_numbers("plan")),
    }


def _layers() -> dict[str, Snippet]:
    """The pipeline's schedules and benchmarks, the cp ring, activation memory and the planner's check."""
    return {
        "pp_timeline": Snippet("pp_timeline", "every schedule's action lists", "the step times and the measured "
                               "bubbles; the pictures beside it (docs/generated/pp_*.png) are redrawn with it",
                               jobs.pp_timeline),
    } | {job: Snippet(job, "the formula column", "every time, measured bubble and ratio", facts)
         for job, facts in (("bench_pp", jobs.bench_pp(4)), ("bench_pp_2", jobs.bench_pp(2)),
                            ("bench_pp_long", jobs.bench_pp(4, (8,), ("gpipe", "1f1b"))))} | {
        "cp_ring": Snippet("cp_ring", "the tiles each rank computes at each step",
                           "the messages and busy times (from the run's trace and clock); the picture beside "
                           "it, docs/generated/cp_ring.png, is redrawn with it", jobs.cp_ring),
        "activation_memory": Snippet("activation_memory", "the formula columns (minidist.memory.activations, "
                                     "Korthikanti et al.'s per layer)", "the measured column (torch's profiler) "
                                     "and its ratio", jobs.activation_memory),
        "plan_check": Snippet("plan_check", "the planned MB and in flight columns (minidist.compare.plan.memory)",
                              "alpha and beta, every time (planned on the measured link), the measured MB "
                              "and the ratios", jobs.plan_check),
    }


def registry() -> dict[str, Snippet]:
    """Every snippet of docs/generated, by name, in the order they are registered (the lessons' after the
    measured ones, the track's after the formulas)."""
    snippets = _measured() | lessons() | _formulas() | tutorial() | _layers()
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
