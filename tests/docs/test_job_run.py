"""A docs job that fails on a claim names the claim and its measured values, one line each (scripts/job_run.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import job_run  # noqa: E402

LESSONS_OUTPUT = "\n".join([
    "== lesson 1: bucket_sweep: buckets",
    "claim: a bucket per tensor leaves 63.4 ms exposed -> FAILS",
    "== lesson 2: no_sync: skipping the reduction",
    "claim: no_sync sends 0 bytes in 3 of 4 steps -> holds",
    "== lesson 3: prefetch: gathers ahead",
    "claim: prefetch issues 4 of the 5 forward all_gathers -> FAILS",
    "x" * 3000,  # the tail alone no longer shows either claim
])


def test_a_failed_run_names_each_failed_claim_with_its_values(tmp_path):
    out, count = tmp_path / "out.txt", tmp_path / "attempts"
    out.write_text(LESSONS_OUTPUT)
    abort = f"echo '{job_run.TEARDOWN_ABORT}' >&2"
    with pytest.raises(SystemExit) as failed:
        job_run.run(f"echo . >> {count}; cat {out}; {abort}; exit 1", timeout=30)
    lines = str(failed.value.code).splitlines()
    assert lines[:3] == [
        f"`echo . >> {count}; cat {out}; {abort}; exit 1` failed (exit 1), 2 claim(s):",
        "  claim failed (lesson 1: bucket_sweep): a bucket per tensor leaves 63.4 ms exposed",
        "  claim failed (lesson 3: prefetch): prefetch issues 4 of the 5 forward all_gathers"]
    assert count.read_text().count(".") == 1, "a run whose claim failed is not retried as a teardown abort"
    assert job_run.failed_claims("== one lesson alone\nclaim: 2.0x -> FAILS\n") == ["claim failed (one lesson alone): 2.0x"]
    printed = (ROOT / "recipes" / "lessons" / "common.py").read_text()  # the lines parsed are the lines printed
    assert 'say(f"claim: {text} -> {\'holds\' if ok else \'FAILS\'}")' in printed
    assert 'ctx.say(f"\\n== {titles[i]}")' in printed

    count.unlink()  # without a failed claim, a teardown abort is retried, and the tail is still shown
    with pytest.raises(SystemExit) as failed:
        job_run.run(f"echo . >> {count}; echo last words; {abort}; exit 1", timeout=30, attempts=2)
    assert count.read_text().count(".") == 2
    assert str(failed.value.code).splitlines()[:2] == [
        f"`echo . >> {count}; echo last words; {abort}; exit 1` failed (exit 1):", "last words"]
