"""Shared fixtures. `run_dist(world_size, body, *args)` runs body on every rank of a
long-lived gloo worker pool (see tests/harness.py) and returns the per-rank values.
The terminal summary says how many pools the session started (each costs a process-group
start-up; a failing body costs a restart)."""

import pytest

from tests.harness import PoolManager

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
