"""Running one docs job's command (scripts/gen_docs_numbers.py), and saying why a run failed.

A lesson ends with its claim, printed with the values this run measured
(recipes/lessons/common.py: "claim: <text with the numbers> -> holds | FAILS"), and a
failed claim makes the run exit non-zero. The lessons job runs every lesson in one
process, so the output tail alone may not even contain the claim that failed: a failed
run is reported with one line per failed claim (which lesson, the claim and its measured
values), then the tail of its output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEARDOWN_ABORT = "terminate called without an active exception"
"""What a torchrun worker with gloo may print when it aborts in interpreter teardown (minidist.runtime.exit_process)."""


def failed_claims(stdout: str) -> list[str]:
    """One line per claim the run printed as failing: the section it was in, the claim with its values."""
    section, out = "", []
    for line in stdout.splitlines():
        if line.startswith("== "):  # a lesson's header: "== lesson 3: fsdp_vs_ddp_bytes: <title>", or "== <title>"
            m = re.match(r"== (lesson \d+: \w+): ", line)
            section = m.group(1) if m else line[3:].strip()
        elif line.startswith("claim: ") and line.rstrip().endswith("-> FAILS"):
            claim = line.removeprefix("claim: ").rstrip().removesuffix("-> FAILS").rstrip()
            out.append(f"claim failed{f' ({section})' if section else ''}: {claim}")
    return out


def failure(command: str, p: subprocess.CompletedProcess) -> str:
    """The message of a failed run: its failed claims first, one line each, then its output's tail."""
    claims = failed_claims(p.stdout)
    head = f"`{command}` failed (exit {p.returncode})" + (f", {len(claims)} claim(s):" if claims else ":")
    return "\n".join([head, *(f"  {c}" for c in claims), p.stdout[-2000:], p.stderr[-3000:]])


def run(command: str, timeout: int, attempts: int = 3) -> str:
    """Run `command` with the venv's executables first on PATH; return stdout (raise on failure).

    A worker that has finished can still abort in interpreter teardown under torchrun with
    gloo (see minidist.runtime.exit_process), which fails a complete run: such runs are
    retried, unless a claim failed (the run is not complete, and its numbers said so).
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for attempt in range(1, attempts + 1):
        p = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode == 0:
            return p.stdout
        if TEARDOWN_ABORT not in p.stderr or failed_claims(p.stdout) or attempt == attempts:
            raise SystemExit(failure(command, p))
        print(f"  a worker aborted in teardown; running it again ({attempt + 1}/{attempts})")
    raise AssertionError("unreachable")
