"""The wheel as a user installs it: built from this checkout, installed (not editable) into a fresh
environment, then run from another directory, with no checkout on the path.

Offline: the new environment reaches the already-installed dependencies (torch, hydra, ...)
through a .pth line naming this environment's site-packages; a .pth line adds a directory but
runs none of the .pth files in it, so this environment's editable minidist stays invisible.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from minidist.train.metrics import read_metrics
from tests.recipes import test_collectives_tour as tour_test

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "setup.py", "README.md", "minidist", "configs", "hydra_plugins", "recipes"]


def _run(cmd, cwd, env, timeout=120) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.launches
def test_wheel_installs_and_runs_from_anywhere(tmp_path):
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (REPO / name).is_dir() else {}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")} | {"OMP_NUM_THREADS": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", tmp_path / "dist", src], tmp_path, env)
    wheel = next((tmp_path / "dist").glob("minidist-*.whl"))

    target = tmp_path / "env"
    venv.create(target, with_pip=False)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(target), "platbase": str(target)}))
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    py, bindir = target / "bin" / "python", target / "bin"
    # --ignore-installed: never touch the minidist this environment sees through deps.pth
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel], tmp_path, env)
    assert not (site / "recipes").exists() and (site / "minidist" / "configs" / "config.yaml").is_file()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # one interpreter for the cheap checks: what is installed where, `--cfg job`, the tour's arguments
    probe = _run([py, "-c", "import minidist, minidist.cli.config as c, importlib.util as u; "
                  "print(minidist.__version__, minidist.__file__, c.CONFIG_DIR, u.find_spec('recipes')); "
                  "from minidist.recipes import train, collectives_tour; "
                  "train.main(['--cfg', 'job', 'experiment=gpt_tiny', 'strategy=zero1']); "
                  "collectives_tour.main(['--help'])"], elsewhere, env).stdout
    words = probe.split()
    assert words[0] == "0.1.0" and words[3] == "None", probe  # no top-level recipes package
    assert words[1].startswith(str(site)) and words[2] == str(site / "minidist" / "configs"), probe
    assert "n_layer: 2" in probe and "name: zero1" in probe and "--numel" in probe, probe
    assert {"minidist-train", "minidist-tour", "minidist-compare"} <= {f.name for f in bindir.iterdir()}
    tiny = ["experiment=gpt_tiny", "strategy=single", "trainer.steps=2", "trainer.log_interval=1",
            "data.max_bytes=100000", "hydra.run.dir=here"]
    run = _run([bindir / "minidist-train", *tiny], elsewhere, env)
    assert "final" in run.stdout and not run.stderr.strip(), run.stderr
    assert read_metrics(elsewhere / "here" / "metrics.jsonl")[-1]["step"] == 2  # hydra.run.dir honoured
    assert (elsewhere / "here" / "model.pt").is_file() and (elsewhere / "here" / ".hydra" / "overrides.yaml").is_file()
    # a sweep through hydra/launcher=minidist, which Hydra finds by itself in the installed hydra_plugins
    sweep = [o for o in tiny if not o.startswith(("trainer.steps", "hydra.run"))] + [
        "trainer.steps=1", "model.n_layer=1,2", "hydra.sweep.dir=sweep"]
    run = _run([bindir / "minidist-train", "--multirun", *sweep], elsewhere, env)
    done = [json.loads(line)["status"] for line in (elsewhere / "sweep" / "summary.jsonl").read_text().splitlines()]
    assert done == ["done", "done"] and not run.stderr.strip(), run.stdout + run.stderr
    _tour_under_torchrun(bindir, elsewhere, env, tmp_path)


def _tour_under_torchrun(bindir: Path, elsewhere: Path, env: dict, tmp_path: Path) -> None:
    """The installed commands start the world their README command uses (2 processes), and say so first; the
    tour's one run under torchrun (tests/recipes/test_collectives_tour.py runs its acts in the pool): every
    value once per rank, the traced act, no warning, and every rank ending without the interpreter's teardown."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(tour_test.HOOK)
    # OMP_NUM_THREADS unset, as in a user's shell: the launcher sets torchrun's default itself, without its warning
    bare = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(hook)}
    tour = _run([bindir / "minidist-tour", "--numel", "4096"], elsewhere, bare)
    assert tour.stdout.startswith("minidist-tour: 2 processes (torchrun --standalone --nproc_per_node=2); NPROC=N"), \
        tour.stdout[:300]
    assert "; N = 2, S = " in tour.stdout and not tour.stderr, tour.stderr  # no warning, no teardown reached
    tour_test.check_values(tour.stdout, 2)
    tour_test.cost_act(tour.stdout)
