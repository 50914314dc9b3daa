"""Install this checkout into the running interpreter's environment, as `pip install -e '.[dev]'` does,
with both cores of a 2-core machine busy.

pip unpacks the wheels it resolved one after another, in one process: here ~30 s of one core for
5.5 GB (torch and CUDA's libraries, which a CUDA build of torch pulls in even on a CPU machine) while
the other core idles. So:

0. pip itself is upgraded (pip >= 25 resolves in about half the CPU of the venv's pip 23).
1. pip resolves, installing nothing (`--dry-run --report`): the exact distributions, each with where
   it comes from. The project's dependencies are given as requirements, not the project, so no build
   environment is made for it. Meanwhile a second pip unpacks torch, the largest wheel (~1/5 of it all).
2. Two pip processes install the rest, split in two halves of about equal bytes, with `--no-deps`
   (nothing is resolved again, and the halves are disjoint, so no file is written twice).
3. The project itself, editable, with `--no-deps --no-build-isolation` (setuptools is installed by then).

Measured on fresh venvs here: the plain install and this one with the venv's pip 23, alternating,
45 / 40.5 s and 57 / 42 s; this one with pip upgraded first, two later runs, 37 and 39 s.
Without tomllib (Python 3.10), or with --serial, it runs the one plain `pip install -e '.[dev]'`.

    python scripts/install_venv.py [--serial] [pip options ...]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip"]


def requirements(extra: str = "dev") -> list[str] | None:
    """The project's dependencies, its `extra`'s and its build backend's, read from pyproject.toml;
    None where this Python has no TOML reader (3.10)."""
    try:
        import tomllib
    except ImportError:
        return None
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra], *meta["build-system"]["requires"]]


def resolve(reqs: list[str], pip_args: list[str], cache: str) -> list[dict]:
    """pip's resolution of `reqs` into the current environment: what it would install, nothing installed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([*PIP, "install", "--dry-run", "--quiet", "--cache-dir", cache, "--report", report,
                        *pip_args, *reqs], check=True)
        return json.loads(report.read_text())["install"]


def weight(item: dict) -> int:
    """A distribution's size on disk where it is a local file (the CUDA wheels here), else a nominal 1 MB."""
    url = urlparse(item["download_info"]["url"])
    path = Path(unquote(url.path))
    return path.stat().st_size if url.scheme == "file" and path.is_file() else 1 << 20


def halves(items: list[dict]) -> tuple[list[str], list[str]]:
    """`name @ url` requirements in two halves of about equal bytes (largest first, each into the lighter)."""
    parts: tuple[list[str], list[str]] = ([], [])
    sizes = [0, 0]
    for item in sorted(items, key=weight, reverse=True):
        i = sizes.index(min(sizes))
        parts[i].append(f"{item['metadata']['name']} @ {item['download_info']['url']}")
        sizes[i] += weight(item)
    return parts


def installed(item: dict) -> bool:
    """Whether this environment already has the distribution at the resolved version."""
    try:
        return metadata.version(item["metadata"]["name"]) == item["metadata"]["version"]
    except metadata.PackageNotFoundError:
        return False


def install_parallel(reqs: list[str], pip_args: list[str], first: str = "torch") -> None:
    """Resolve on one core while the other unpacks `first` (the largest wheel, ~1/5 of the bytes), then
    install the rest in two halves, then the project."""
    install = [*PIP, "install", "--quiet", "--no-deps", "--no-compile", *pip_args]
    with tempfile.TemporaryDirectory() as cache:  # the resolver's downloads, reused by the installs, then gone
        head = [r for r in reqs if re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] == first]
        procs = [subprocess.Popen([*install, "--cache-dir", cache, *head])] if head else []
        try:
            items = resolve(reqs, pip_args, cache)
        finally:  # no pip left writing into the environment after this script
            wait(procs)
        items = [i for i in items if not installed(i)]  # `first`, unless the resolver chose another version
        wait([subprocess.Popen([*install, "--cache-dir", cache, *part]) for part in halves(items) if part])
    # setuptools' notes on editable installs would pass for warnings (pip >= 25 shows a backend's stderr)
    done = subprocess.run([*install, "--no-build-isolation", "-e", ROOT], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{done.stdout}{done.stderr}install_venv: pip install -e {ROOT} failed (exit {done.returncode})")


def wait(procs: list[subprocess.Popen]) -> None:
    codes = [p.wait() for p in procs]  # every one, not only up to the first that failed
    if any(codes):
        sys.exit("install_venv: a pip install failed (its error is above); run `make` again to retry")


def main(argv: list[str]) -> None:
    serial = "--serial" in argv
    pip_args = [a for a in argv if a != "--serial"]
    reqs = None if serial else requirements()
    # pip >= 25 resolves this project's ~100 distributions in ~9 s of CPU where the venv's pip 23 takes
    # ~17 s (it checked each of PyPI's ~60,000 files' tags against the interpreter's, one by one)
    subprocess.run([*PIP, "install", "--quiet", "--no-cache-dir", "--upgrade", "pip>=25", *pip_args])
    if reqs is None:
        subprocess.run([*PIP, "install", "--quiet", "--no-cache-dir", "--no-compile", *pip_args, "-e", f"{ROOT}[dev]"],
                       check=True)
    else:
        install_parallel(reqs, pip_args)


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    try:
        main(sys.argv[1:])
    except subprocess.CalledProcessError as e:
        sys.exit(f"install_venv: {' '.join(map(str, e.cmd[:4]))} ... failed (exit {e.returncode}); its error is above")
