"""The site, built once per session with `mkdocs build --strict` (5-7 s on 2 cores): test_docs.py checks that
it builds, test_offline.py scans what it built.

Once per session, not per pytest-xdist worker: the first worker to need it builds it into the session's
directory under a lock, and a worker that comes later takes what is there (the site, or the failed build's
output, so that it fails with the same message). Two builds cost ~9 s of CPU on a 2-core machine."""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(out: Path) -> str | None:
    """mkdocs build --strict into `out`; None when it built, else the end of what it printed."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life banner
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    p = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    return None if p.returncode == 0 else p.stdout[-3000:] + p.stderr[-5000:]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed in this environment (pip install -e '.[docs]')")
    # under xdist the session's directory is above every worker's basetemp; alone, the basetemp itself
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent
    out, failed = shared / "site", shared / "site-build-failed.txt"
    with open(shared / "site.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").is_file() and not failed.is_file():
            error = _build(out)
            if error is not None:
                failed.write_text(error)
    assert not failed.is_file(), failed.read_text()
    return out
