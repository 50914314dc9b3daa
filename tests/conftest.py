"""Shared fixtures. `run_dist(world_size, body, *args)` runs body on every rank of a
long-lived gloo worker pool (see tests/harness.py) and returns the per-rank values.
The terminal summary says how many pools the session started (each costs a process-group
start-up; a failing body costs a restart)."""

import os

import pytest

from tests.harness import PoolManager

os.environ.setdefault("WANDB_MODE", "disabled")
"""Runs in the suite log to metrics.jsonl and plot, without wandb: an offline wandb run costs ~4 s of CPU (its
service process, its files), in each of the suite's dozens of training runs, pool workers and torchrun children
alike (they inherit this). wandb itself is tested where a test asks for it by logger.mode=offline (the explicit
value wins over $WANDB_MODE: tests/recipes/test_launch.py's two agents) and its settings in
tests/train/test_metrics.py."""

POOLS = pytest.StashKey[PoolManager]()


@pytest.fixture(scope="session")
def _pools(request):
    manager = request.config.stash[POOLS] = PoolManager()
    yield manager
    manager.close()


@pytest.fixture
def run_dist(_pools):
    return _pools.run


def pytest_terminal_summary(terminalreporter, config):
    manager = config.stash.get(POOLS, None)
    if manager is not None and manager.starts:
        terminalreporter.write_line(manager.summary())
