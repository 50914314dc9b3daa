"""tests/conftest.py's machine sharing under pytest-xdist (`make test` runs 2 workers): a test marked `alone`
runs while no other test does, and the others still run two at a time. One small session of sleeping tests,
each recording when it ran, under the suite's own conftest (~3 s: two xdist workers start)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION = '''
import json, os, time, pytest
def _ran(name, seconds):
    t0 = time.time(); time.sleep(seconds)
    with open(os.environ["INTERVALS"], "a") as f:
        f.write(json.dumps([name, t0, time.time()]) + "\\n")
@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    _ran(f"shared {i}", 0.4)
@pytest.mark.alone
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    _ran(f"alone {i}", 0.5)
'''


@pytest.mark.launches
def test_an_alone_test_runs_with_nothing_beside_it_and_the_others_in_pairs(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import _share_the_machine, pytest_configure  # noqa\n")
    (tmp_path / "test_session.py").write_text(SESSION)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # this suite's own worker
    env |= {"PYTHONPATH": str(ROOT), "INTERVALS": str(tmp_path / "intervals.jsonl")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--rootdir",
                        str(tmp_path), str(tmp_path / "test_session.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ran = [json.loads(line) for line in (tmp_path / "intervals.jsonl").read_text().splitlines()]
    assert len(ran) == 8, ran

    def overlap(a, b):
        return a is not b and a[1] < b[2] and b[1] < a[2]

    beside_alone = [(a[0], b[0]) for a in ran if a[0].startswith("alone") for b in ran if overlap(a, b)]
    assert not beside_alone, beside_alone
    shared = [r for r in ran if r[0].startswith("shared")]
    assert any(overlap(a, b) for a in shared for b in shared), "the shared tests never ran two at a time"


def test_what_collection_imported_is_frozen():
    """tests/conftest.py freezes it: a gc.collect() in a test walks only what tests allocated since."""
    import gc
    assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()  # ~50,000 with pytest alone, ~390,000 for the suite
