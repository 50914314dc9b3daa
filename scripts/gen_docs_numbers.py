"""Regenerate every number the documentation quotes: run the project's own commands, write snippets.

    .venv/bin/python scripts/gen_docs_numbers.py              # everything (many minutes on 2 cores)
    .venv/bin/python scripts/gen_docs_numbers.py tour lessons # some jobs
    .venv/bin/python scripts/gen_docs_numbers.py code         # the cheap one: code quoted from the package
    .venv/bin/python scripts/gen_docs_numbers.py --check      # is any committed snippet stale? (no measuring)
    .venv/bin/python scripts/gen_docs_numbers.py --readme     # README.md's numbers from the snippets

Each job runs one command (the tour, the lessons, a benchmark) and writes
docs/generated/<snippet>.md: the command, its output verbatim, and a stamp saying which
commit produced it, on what machine and under what load, and which of its parts CI holds
to the code (scripts/docs_facts.py). Before writing, the output is checked against the
structural facts recomputed from the same code (collectives per step, bucket layouts,
claim wording, ...): a run that disagrees with the code it ran is not published. Pages
include the snippets with pymdownx.snippets (--8<-- "<snippet>.md"), so no measured number
in the docs is typed by hand; README.md's measured numbers are copied from the snippets after every
job (scripts/readme_facts.py). Commit your code first (the stamp names the commit; a tree
with uncommitted changes to the code is refused unless --allow-dirty), then the snippets.
A job whose command fails says why in one line per failed claim, with the values the run
measured, before its output's tail (scripts/job_run.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_facts  # noqa: E402 - the directory of this script
import readme_facts  # noqa: E402
from job_run import run  # noqa: E402 - a failed run names each failed claim with its values

ROOT = docs_facts.ROOT
OUT = docs_facts.GENERATED
TORCHRUN = "torchrun --standalone --nproc_per_node={n}"

JOBS: dict[str, tuple[str, int]] = {
    # name: (command as a user types it, from the repository root, with the venv's tools; timeout s)
    "code": ("", 0),  # no command: quotes functions of the package (docs_facts.CODE_QUOTES)
    "strategies": ("", 0),  # no command: the registered strategies' ladder, from their records (scripts/ladder.py)
    "tour": (f"{TORCHRUN.format(n=2)} recipes/collectives_tour.py", 300),
    "lessons": (f"{TORCHRUN.format(n=2)} -m recipes.lessons --all", 900),
    "bench_ddp": (f"{TORCHRUN.format(n=2)} benchmarks/ddp_vs_torch.py --sleep-ms 0 20 --buckets 1 25 --repeats 6", 600),
    "bench_fsdp_speed": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py", 600),
    "bench_fsdp_memory_1": (f"{TORCHRUN.format(n=1)} benchmarks/fsdp_vs_torch.py --mode memory", 300),
    "bench_fsdp_memory_2": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py --mode memory", 300),
    "bench_fsdp_overlap": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py --mode overlap", 600),
    "trace_overhead": ("python benchmarks/trace_overhead.py", 300),
    "compare": (f"{TORCHRUN.format(n=2)} -m recipes.compare name=docs-compare", 600),
    "tutorial_ddp": (f"{TORCHRUN.format(n=2)} -m minidist.tutorial.measure --part ddp", 300),
    "tutorial_zero": (f"{TORCHRUN.format(n=2)} -m minidist.tutorial.measure --part zero", 300),
    "tutorial_fsdp": (f"{TORCHRUN.format(n=2)} -m minidist.tutorial.measure --part fsdp", 300),
    "tutorial_check": ("python -m minidist.tutorial.check ddp_bucketed minidist/tutorial/exercises/ddp_bucketed.py; "
                       "python -m minidist.tutorial.check ddp_bucketed minidist/tutorial/ddp_bucketed.py", 600),
    "lesson_zero1_vs_ddp_n4": (f"{TORCHRUN.format(n=4)} -m recipes.lessons.zero1_vs_ddp", 600),
    "bench_zero_overlap": (f"{TORCHRUN.format(n=2)} benchmarks/zero_overlap.py", 600),
    "lesson_fsdp_x_tp_n4": (f"{TORCHRUN.format(n=4)} -m recipes.lessons.fsdp_x_tp", 600),
    "worked_numbers_xl": ("python -m recipes.worked_numbers", 300),
    "worked_numbers_n4": (f"{TORCHRUN.format(n=4)} -m recipes.worked_numbers --measure", 900),
    "bench_bucket_overhead": (f"{TORCHRUN.format(n=2)} benchmarks/bucket_overhead.py", 600),
    "traced_step": (f"{TORCHRUN.format(n=2)} -m recipes.traced_step --out docs/generated", 300),
    "scale_numbers": ("python -m recipes.scale_numbers", 120),
    "pp_timeline": (f"{TORCHRUN.format(n=4)} -m recipes.pp_timeline --out docs/generated", 300),
    "bench_pp": (f"{TORCHRUN.format(n=4)} benchmarks/pp_vs_torch.py", 900),
    "bench_pp_2": (f"{TORCHRUN.format(n=2)} benchmarks/pp_vs_torch.py", 900),
    "bench_pp_long": (f"{TORCHRUN.format(n=4)} benchmarks/pp_vs_torch.py --microbatches 8 --forward-ms 80 "
                      f"--schedules gpipe 1f1b", 600),
    "cp_ring": (f"{TORCHRUN.format(n=4)} -m recipes.cp_ring --out docs/generated", 300),
    "plan_check": (f"{TORCHRUN.format(n=4)} -m recipes.plan_check", 300),
    "activation_memory": ("; ".join(f"{TORCHRUN.format(n=n)} -m recipes.activation_memory" for n in (1, 2, 4)), 600),
    # the table of the runs `benchmarks/main_job_sweep.py run` recorded (each minutes long, under the CPU lock)
    "main_job_sweep": ("python benchmarks/main_job_sweep.py table", 120),
}

CODE_PATHS = ("minidist", "recipes", "benchmarks", "scripts", "configs", "hydra_plugins")
"""What a stamp's commit must hold unchanged (the docs themselves may differ)."""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit_and_changes() -> tuple[str, list[str]]:
    """HEAD's short hash and the files of CODE_PATHS that differ from it."""
    return _git("rev-parse", "--short=12", "HEAD"), _git("status", "--porcelain", "--", *CODE_PATHS).splitlines()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(s.split(":", 1)[1].strip() for s in Path("/proc/cpuinfo").read_text().splitlines()
                   if s.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU")
    return (f"{os.cpu_count()} CPU cores ({cpu}), {gpu}, torch {torch.__version__.split('+')[0]}, "
            f"Python {platform.python_version()}")


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def stamp(commit: str, load_start: float, load_end: float) -> str:
    return (f"Measured at commit `{commit}` on {time.strftime('%Y-%m-%d')}: {machine()}, gloo; load average "
            f"{load_start:.1f} at the start, {load_end:.1f} at the end (other work on the machine makes times noisy).")


def facts_of(names: list[str]) -> dict[str, list[docs_facts.Fact]]:
    """The structural facts of the named snippets, as the code decides them now."""
    facts = docs_facts.facts_for(names, world=0)
    two = [n for n in names if docs_facts.registry()[n].world == 2]
    if two:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "facts.json"
            run(f"{TORCHRUN.format(n=2)} scripts/docs_facts.py {out} {' '.join(two)}", 600)
            facts.update(docs_facts.from_json(json.loads(out.read_text())))
    return facts


def snippet(command: str, output: str) -> str:
    return (f"```console\n$ OMP_NUM_THREADS=1 .venv/bin/{command}\n```\n\n"
            f"```text\n{output.strip(chr(10))}\n```\n")


COMPARE_RUN = ROOT / "outputs" / "docs-compare"
"""Where the compare job's command writes its tables and charts (its name=docs-compare)."""
COMPARE_IMAGES = ("comparison", "timeline", "projection")


def compare_body(command: str, output: str) -> str:
    """The comparison as its page shows it: the tables rendered (the run's table.md, without its title)
    and the projection's verdicts; the charts are copied beside it by write_job (docs/generated/compare_*.png)."""
    table = (COMPARE_RUN / "table.md").read_text().split("\n", 2)[2]
    verdicts = output[output.index("projection: "):output.index("outputs in ")].strip("\n")
    return f"```console\n$ OMP_NUM_THREADS=1 .venv/bin/{command}\n```\n\n{table.strip()}\n\n```text\n{verdicts}\n```\n"


def split_lessons(output: str) -> dict[str, str]:
    """`-m recipes.lessons --all` output -> {lesson name: its section}."""
    parts = re.split(r"^(?=== lesson \d+: )", output.strip("\n"), flags=re.M)
    out = {}
    for part in parts:
        m = re.match(r"== lesson \d+: (\w+): ", part)
        if m:
            out[m.group(1)] = part
    return out


def code_quotes() -> dict[str, str]:
    """Snippet bodies quoting the package's functions (docs_facts.CODE_QUOTES)."""
    bodies = {}
    for name, refs in docs_facts.CODE_QUOTES.items():
        parts = []
        for ref in refs:
            path, source = docs_facts.source_of(ref)
            parts.append(f"`{path}`, `{ref.split(':')[1]}`:\n\n```python\n{source.strip(chr(10))}\n```\n")
        bodies[name] = "\n".join(parts)
    return bodies


def bodies_of(job: str, output: str) -> dict[str, str]:
    """A job's output -> {snippet name: body}."""
    command = JOBS[job][0]
    if job == "tour":
        values, _, cost = output.partition("\n== cost")
        return {"tour_values": snippet(command, values), "tour_cost": snippet(command, "== cost" + cost)}
    if job == "lessons":
        from recipes.lessons import LESSONS
        sections = split_lessons(output)
        missing = [n for n in LESSONS if n not in sections]
        if missing:
            raise SystemExit(f"lessons missing from the output: {missing}")
        out = {f"lesson_{n}": snippet(f"{TORCHRUN.format(n=2)} -m recipes.lessons.{n}", sections[n]) for n in LESSONS}
        claims = [s for s in output.splitlines() if s.startswith("claim: ")]
        out["lesson_claims"] = "\n".join(f"{i + 1}. `{n}`: {c.removeprefix('claim: ')}"
                                         for i, (n, c) in enumerate(zip(LESSONS, claims))) + "\n"
        return out
    if job == "compare":
        return {job: compare_body(command, output)}
    if job == "main_job_sweep":  # a markdown table: rendered, not quoted
        return {job: f"```console\n$ .venv/bin/{command}\n```\n\n{output.strip()}\n"}
    if job == "scale_numbers":  # one snippet per table
        parts = dict(re.findall(r"^== (.*?)\n(.*?)(?=^== |\Z)", output, flags=re.M | re.S))
        return {"scale_nccl": snippet(command, parts["NCCL's algorithms and protocols"]),
                "scale_activations": snippet(command, parts["activation memory per rank"]),
                "scale_plan": snippet(command, parts["the planner"])}
    if job == "tutorial_check":  # two runs of the checker: the stub (exit 1), then the solution (exit 0)
        runs = re.split(r"^(?=ddp_bucketed: )", output.strip("\n"), flags=re.M)[1:]
        return {job: "\n".join(snippet(c, o) for c, o in zip(command.split("; "), runs))}
    if job == "activation_memory":  # one run per world size, each printing its table
        runs = re.split(r"^(?=== N = )", output.strip("\n"), flags=re.M)[1:]
        return {job: "\n".join(snippet(c, o) for c, o in zip(command.split("; "), runs))}
    if job == "traced_step":  # one section per engine; the pictures are written beside (step_<engine>.png)
        from recipes.traced_step import ENGINES
        parts = dict(re.findall(r"^== (\w+): (.*?)(?=^== |\Z)", output, flags=re.M | re.S))
        return {f"traced_step_{e}": snippet(f"{command} --engine {e}", f"== {e}: {parts[e]}") for e in ENGINES}
    return {job: snippet(command, output)}


def write_job(job: str, commit: str) -> None:
    load_start, t0 = load(), time.perf_counter()
    if job in ("code", "strategies"):
        bodies = code_quotes() if job == "code" else {job: docs_facts.ladder.table()}
        how = f"Quoted at commit `{commit}` on {time.strftime('%Y-%m-%d')}."
    else:
        output = run(*JOBS[job])
        bodies, how = bodies_of(job, output), stamp(commit, load_start, load())
        if job == "lessons":  # one run of all of them
            how += f" Taken from one run of all of them: `{JOBS[job][0]}`."
    print(f"{job}: {time.perf_counter() - t0:.0f} s")
    facts = facts_of(list(bodies))
    bad = {n: docs_facts.check(body, facts.get(n, [])) for n, body in bodies.items()}
    bad = {n: b for n, b in bad.items() if b}
    if bad:
        raise SystemExit(f"{job}: the output disagrees with the code it ran (scripts/docs_facts.py); nothing "
                         f"written:\n" + "\n".join(f"  {n}: {m}" for n, ms in bad.items() for m in ms))
    for name, body in bodies.items():
        (OUT / f"{name}.md").write_text(f"{body}\n<small>{how} {docs_facts.describe(name)}</small>\n")
        print(f"wrote docs/generated/{name}.md")
    if job == "compare":
        for png in COMPARE_IMAGES:
            shutil.copyfile(COMPARE_RUN / f"{png}.png", OUT / f"compare_{png}.png")
            print(f"wrote docs/generated/compare_{png}.png")


def check_all() -> int:
    """Hold every committed snippet to the code as it is now; print what is stale. No measuring."""
    reg = docs_facts.registry()
    on_disk = {p.stem for p in OUT.glob("*.md")}
    problems = [f"{n}: registered in scripts/docs_facts.py but not generated" for n in sorted(set(reg) - on_disk)]
    problems += [f"{n}: in docs/generated but not registered" for n in sorted(on_disk - set(reg))]
    facts = facts_of(sorted(set(reg) & on_disk))
    for name in sorted(set(reg) & on_disk):
        problems += [f"{name} (job {reg[name].job}): {m}"
                     for m in docs_facts.check_snippet(name, (OUT / f"{name}.md").read_text(), facts.get(name))]
    problems += readme_facts.check(readme_facts.README.read_text())
    print("\n".join(problems) or "every snippet agrees with the code, and README.md with the snippets")
    return 1 if problems else 0


def write_readme() -> None:
    """README.md's marked numbers from the snippets as they are now (scripts/readme_facts.py)."""
    old = readme_facts.README.read_text()
    new = readme_facts.rewrite(old)
    if new != old:
        readme_facts.README.write_text(new)
        print("wrote README.md's numbers from the snippets")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("jobs", nargs="*", help=f"jobs to run (default: all): {', '.join(JOBS)}")
    ap.add_argument("--check", action="store_true", help="only check the committed snippets against the code")
    ap.add_argument("--allow-dirty", action="store_true", help="measure code with uncommitted changes")
    ap.add_argument("--readme", action="store_true", help="only copy README.md's numbers from the snippets")
    args = ap.parse_args()
    if args.check:
        raise SystemExit(check_all())
    if args.readme:
        return write_readme()
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown:
        ap.error(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    commit, changed = commit_and_changes()
    if changed and not args.allow_dirty:
        ap.error(f"uncommitted changes to the code ({len(changed)} files, e.g. {changed[0].split()[-1]}): the stamp "
                 f"would name a commit that did not produce the numbers; commit first (or --allow-dirty)")
    if changed:
        commit += "-dirty"
    OUT.mkdir(parents=True, exist_ok=True)
    for job in args.jobs or JOBS:
        write_job(job, commit)
    write_readme()


if __name__ == "__main__":
    main()
