"""No generated snippet describes code that has changed since it was measured.

Each snippet of docs/generated is registered in scripts/docs_facts.py with the structural
facts the current code decides (collectives per step, bucket layouts, traced bytes, formulas,
claim wording, quoted source), recomputed here cheaply: one traced step of each strategy, a
bucket plan, the lessons' own claim templates; never the slow, clock-bound measurement. A
stale snippet fails with the job that regenerates it (scripts/gen_docs_numbers.py JOB). Every
snippet also names the commit that produced it, and says which of its parts are checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import docs_facts  # noqa: E402
import readme_facts  # noqa: E402

REGISTRY = docs_facts.registry()
ON_DISK = sorted(p.stem for p in docs_facts.GENERATED.glob("*.md"))


def _world2_facts(names: list[str]) -> dict:
    return docs_facts.facts_for(names, world=2)


def test_every_snippet_is_registered_and_every_registered_one_generated():
    assert set(ON_DISK) == set(REGISTRY), (
        f"generated but not registered in scripts/docs_facts.py: {sorted(set(ON_DISK) - set(REGISTRY))}; "
        f"registered but not generated: {sorted(set(REGISTRY) - set(ON_DISK))}")


def test_every_snippet_agrees_with_the_code(run_dist):
    facts = docs_facts.facts_for(ON_DISK, world=0)
    facts.update(run_dist(2, _world2_facts, ON_DISK, timeout=300)[0])
    assert set(facts) == {n for n in ON_DISK if REGISTRY[n].facts is not None}
    stale = {n: docs_facts.check_snippet(n, (docs_facts.GENERATED / f"{n}.md").read_text(), facts.get(n))
             for n in ON_DISK}
    stale = {n: ms for n, ms in stale.items() if ms}
    assert not stale, "snippets that no longer describe the code; regenerate them with " \
        "`.venv/bin/python scripts/gen_docs_numbers.py JOB`:\n" + "\n".join(
            f"{n} (JOB {REGISTRY[n].job}): {m}" for n, ms in stale.items() for m in ms)


def test_every_stamp_names_a_commit_of_this_repository():
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    for name in ON_DISK:
        m = docs_facts.STAMP.search((docs_facts.GENERATED / f"{name}.md").read_text())
        assert m, f"{name}: no commit stamp"
        found = subprocess.run(["git", "cat-file", "-e", f"{m.group(2)}^{{commit}}"], cwd=ROOT, capture_output=True)
        assert found.returncode == 0, f"{name}: stamped with commit {m.group(2)}, which this repository lacks"


STALE_COMPARE = """\
strategy         calls/step  payload MB  formula
-------------------------------------------------
ddp                     AR2        6.51  2S(N-1)/N
full_shard     AG18 AR1 RS9       19.53  (3S-S_root)(N-1)/N
"""


def test_the_checker_catches_what_the_issue_found():
    """The compare snippet that said AR2 / AG18 where the code runs AR3 / AG17 fails; the right one passes."""
    facts = [docs_facts.cell("ddp calls", "ddp", "calls/step", "AR3", as_set=True),
             docs_facts.cell("full_shard calls", "full_shard", "calls/step", "AR1 AG17 RS9", as_set=True),
             docs_facts.cell("ddp formula", "ddp", "formula", "2S(N-1)/N")]
    bad = docs_facts.check(STALE_COMPARE, facts)
    assert len(bad) == 2 and "'AR2'" in bad[0] and "'AG18 AR1 RS9'" in bad[1], bad
    fixed = STALE_COMPARE.replace("       AR2", "       AR3").replace("AG18 AR1 RS9", "AG17 AR1 RS9")
    assert docs_facts.check(fixed, facts) == []
    assert docs_facts.read_cell(STALE_COMPARE, "full_shard", "payload MB") == "19.53"


def test_a_lesson_claim_the_lesson_no_longer_makes_fails():
    """The published claim of lesson 1 before it counted layers (issue 16) does not match its code now."""
    old = ("1. `bucket_sweep`: with the default 1 MiB first bucket the first all_reduce starts 1 ms into "
           "backward; with one 64 MB bucket it waits 65 ms, until backward is over -> holds\n")
    fact = next(f for f in docs_facts.lesson_claims() if "bucket_sweep" in f.what)
    assert docs_facts.check(old, [fact]), "an outdated claim passed"
    current = next(s for s in (docs_facts.GENERATED / "lesson_claims.md").read_text().splitlines()
                   if s.startswith("1. "))
    assert docs_facts.check(current + "\n", [fact]) == []


def test_quoted_code_is_the_code():
    body = (docs_facts.GENERATED / "code_ddp_gradient_path.md").read_text()
    for ref in docs_facts.CODE_QUOTES["code_ddp_gradient_path"]:
        path, source = docs_facts.source_of(ref)
        assert f"`{path}`" in body and source.strip("\n") in body, ref


def test_the_readme_ladder_is_the_records():
    """Every rung the comparison runs by default is in README's ladder, each row naming a strategy quotes
    its record's closed form (minidist.strategies), and the generated table is the records' own."""
    from minidist import strategies
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| rung |"):].split("\n\n")[0].splitlines()[2:]
    named = {r.name: row for row in table for r in strategies.records() if f"`{r.name}`" in row.split("|")[1]}
    assert set(named) >= {r.name for r in strategies.records() if 1 in r.default_rows}, sorted(named)
    for name, row in named.items():
        assert strategies.get(name).closed_form.replace(" ", "") in row.replace(" ", ""), (name, row)
    assert docs_facts.ladder.table() in (docs_facts.GENERATED / "strategies.md").read_text()


def test_readme_numbers_are_the_snippets():
    """Every marked number of README.md is what its snippet says (scripts/readme_facts.py), and every fact is marked."""
    problems = readme_facts.check(readme_facts.README.read_text())
    assert not problems, "\n".join(problems)


def test_a_stale_readme_number_fails():
    """The issue's stale README ratio (0.51x, where the lesson prints 0.427x) would fail the check."""
    readme = readme_facts.README.read_text()
    stale = readme_facts.MARKER.sub(lambda m: m.group(0).replace(m.group(2), "0.51x") if m.group(1) == "fsdp_x_tp"
                                    else m.group(0), readme)
    assert any("fsdp_x_tp" in p and "0.51x" in p for p in readme_facts.check(stale))
    assert readme_facts.check(readme_facts.rewrite(stale)) == []
