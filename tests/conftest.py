"""Shared fixtures. `run_dist(world_size, body, *args)` runs body on every rank of a
long-lived gloo worker pool (see tests/harness.py) and returns the per-rank values."""

import pytest

from tests.harness import PoolManager


@pytest.fixture(scope="session")
def _pools():
    manager = PoolManager()
    yield manager
    manager.close()


@pytest.fixture
def run_dist(_pools):
    return _pools.run
