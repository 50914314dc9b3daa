"""The site, built once per session with `mkdocs build --strict` (5-7 s on 2 cores): test_docs.py checks that
it builds, test_offline.py scans what it built."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life banner
    p = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return out
