"""Regenerate every number the documentation quotes: run the project's own commands, write snippets.

    .venv/bin/python scripts/gen_docs_numbers.py              # everything (several minutes on 2 cores)
    .venv/bin/python scripts/gen_docs_numbers.py tour lessons # some jobs

Each job runs one command (the tour, the lessons, a benchmark) and writes
docs/generated/<job>.md: the command, its output verbatim, and the conditions it
ran under. The lessons job also writes one snippet per lesson. Pages include
the snippets with pymdownx.snippets (--8<-- "<job>.md"), so no measured number
in the docs is typed by hand; tests/docs/test_docs.py checks that every snippet
a page includes exists. Commit the regenerated files.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "generated"
TORCHRUN = "torchrun --standalone --nproc_per_node={n}"

JOBS: dict[str, tuple[str, int]] = {
    # name: (command as a user types it, from the repository root, with the venv's tools; timeout s)
    "tour": (f"{TORCHRUN.format(n=2)} recipes/collectives_tour.py", 300),
    "lessons": (f"{TORCHRUN.format(n=2)} -m recipes.lessons --all", 900),
    "bench_ddp": (f"{TORCHRUN.format(n=2)} benchmarks/ddp_vs_torch.py --sleep-ms 0 20 --buckets 1 25 --repeats 6", 600),
    "bench_fsdp_speed": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py", 600),
    "bench_fsdp_memory_1": (f"{TORCHRUN.format(n=1)} benchmarks/fsdp_vs_torch.py --mode memory", 300),
    "bench_fsdp_memory_2": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py --mode memory", 300),
    "bench_fsdp_overlap": (f"{TORCHRUN.format(n=2)} benchmarks/fsdp_vs_torch.py --mode overlap", 600),
    "trace_overhead": ("python benchmarks/trace_overhead.py", 300),
    "compare": (f"{TORCHRUN.format(n=2)} -m recipes.compare name=docs-compare", 600),
    "lesson_zero1_vs_ddp_n4": (f"{TORCHRUN.format(n=4)} -m recipes.lessons.zero1_vs_ddp", 600),
    "bench_zero_overlap": (f"{TORCHRUN.format(n=2)} benchmarks/zero_overlap.py", 600),
}


def conditions() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"Measured on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPU cores, gloo, torch "
            f"{torch.__version__.split('+')[0]}, Python {platform.python_version()}, load average {load:.1f} "
            f"when it started (other work on a shared machine makes times noisy; bytes are exact).")


def run(command: str, timeout: int, attempts: int = 3) -> str:
    """Run `command` with the venv's executables first on PATH; return stdout (raise on failure).

    A worker that has finished can still abort in interpreter teardown under torchrun with
    gloo (see minidist.runtime.exit_process), which fails a complete run: such runs are retried.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for attempt in range(1, attempts + 1):
        p = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode == 0:
            return p.stdout
        if "terminate called without an active exception" not in p.stderr or attempt == attempts:
            raise SystemExit(f"`{command}` failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
        print(f"  a worker aborted in teardown; running it again ({attempt + 1}/{attempts})")
    raise AssertionError("unreachable")


def snippet(command: str, output: str, cond: str) -> str:
    return (f"```console\n$ OMP_NUM_THREADS=1 .venv/bin/{command}\n```\n\n"
            f"```text\n{output.strip(chr(10))}\n```\n\n<small>{cond}</small>\n")


def write(name: str, text: str) -> None:
    (OUT / f"{name}.md").write_text(text)
    print(f"wrote docs/generated/{name}.md")


def split_lessons(output: str) -> dict[str, str]:
    """`-m recipes.lessons --all` output -> {lesson name: its section}."""
    parts = re.split(r"^(?=== lesson \d+: )", output.strip("\n"), flags=re.M)
    out = {}
    for part in parts:
        m = re.match(r"== lesson \d+: (\w+): ", part)
        if m:
            out[m.group(1)] = part
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("jobs", nargs="*", help=f"jobs to run (default: all): {', '.join(JOBS)}")
    args = ap.parse_args()
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown:
        ap.error(f"unknown jobs {unknown}; known: {', '.join(JOBS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for name in args.jobs or JOBS:
        command, timeout = JOBS[name]
        cond = conditions()
        t0 = time.perf_counter()
        output = run(command, timeout)
        print(f"{name}: {time.perf_counter() - t0:.0f} s")
        if name == "tour":
            values, _, cost = output.partition("\n== cost")
            write("tour_values", snippet(command, values, cond))
            write("tour_cost", snippet(command, "== cost" + cost, cond))
        elif name == "lessons":
            from recipes.lessons import LESSONS
            sections = split_lessons(output)
            missing = [n for n in LESSONS if n not in sections]
            if missing:
                raise SystemExit(f"lessons missing from the output: {missing}")
            note = f"{cond} Taken from one run of all of them: `{command}`."
            for lesson in LESSONS:
                write(f"lesson_{lesson}", snippet(f"{TORCHRUN.format(n=2)} -m recipes.lessons.{lesson}",
                                                  sections[lesson], note))
            claims = [line for line in output.splitlines() if line.startswith("claim: ")]
            write("lesson_claims", "\n".join(f"{i + 1}. `{n}`: {c.removeprefix('claim: ')}"
                                             for i, (n, c) in enumerate(zip(LESSONS, claims))) + f"\n\n<small>{cond}</small>\n")
        else:
            write(name, snippet(command, output, cond))


if __name__ == "__main__":
    main()
