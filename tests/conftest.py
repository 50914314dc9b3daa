"""Shared fixtures. `run_dist(world_size, body, *args)` runs body on every rank of a
long-lived gloo worker pool (see tests/harness.py) and returns the per-rank values.
The terminal summary says how many pools the session started (each costs a process-group
start-up; a failing body costs a restart), under pytest-xdist one line per worker. Under xdist (`make test`) a test
marked `alone` runs while no other test does (_share_the_machine)."""

import fcntl
import gc
import os

import pytest

from tests.harness import PoolManager

os.environ.setdefault("WANDB_MODE", "disabled")
"""Runs in the suite log to metrics.jsonl and plot, without wandb: an offline wandb run costs ~4 s of CPU (its
service process, its files), in each of the suite's dozens of training runs, pool workers and torchrun children
alike (they inherit this). wandb itself is tested where a test asks for it by logger.mode=offline (the explicit
value wins over $WANDB_MODE: tests/recipes/test_launch.py's two agents) and its settings in
tests/train/test_metrics.py."""

os.environ.setdefault("OMP_NUM_THREADS", "1")
"""One intra-op thread in pytest's own processes too, as in the pool's ranks and under torchrun (set before any test
module imports torch; subprocesses inherit it). Two pytest-xdist workers with two OpenMP threads each, beside their
ranks, oversubscribe the 2 cores, and OpenMP's threads spin while they wait for work."""

POOLS = pytest.StashKey[PoolManager]()


@pytest.fixture(scope="session")
def _pools(request):
    manager = request.config.stash[POOLS] = PoolManager()
    yield manager
    manager.close()


@pytest.fixture
def run_dist(_pools):
    return _pools.run


def pytest_runtest_teardown(item):
    """After each test, close the pools that have been idle for a while (tests.harness.IDLE_CLOSE_S)."""
    manager = item.config.stash.get(POOLS, None)
    if manager is not None:
        manager.close_idle()


def pytest_terminal_summary(terminalreporter, config):
    manager = config.stash.get(POOLS, None)
    if manager is not None and manager.starts:
        terminalreporter.write_line(manager.summary())
    for worker, line in sorted(config.stash.get(WORKER_POOLS, {}).items()):
        terminalreporter.write_line(f"{worker} {line}")


WORKER_POOLS = pytest.StashKey[dict]()


def pytest_sessionfinish(session):
    """An xdist worker hands its pools' line to the controller, which prints the terminal summary."""
    manager = session.config.stash.get(POOLS, None)
    if hasattr(session.config, "workeroutput") and manager is not None and manager.starts:
        session.config.workeroutput["pools"] = manager.summary()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's hook on the controller, as each worker ends: keep its pools' line."""
    if "pools" in getattr(node, "workeroutput", {}):
        node.config.stash.setdefault(WORKER_POOLS, {})[node.gateway.id] = node.workeroutput["pools"]


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: its claim is a measured time, or a peak that gloo's threads' timing "
                                       "decides; under pytest-xdist no other test runs meanwhile (tests/conftest.py: "
                                       "_share_the_machine)")
    config.addinivalue_line("markers", "launches: starts Python interpreters of its own (torchrun, a subprocess, "
                                       "a new environment), seconds of CPU each; -m 'not launches' is the fast loop")


def pytest_collection_finish(session):
    """What collection imported (torch, the test modules, ~390,000 objects) lives until the session ends: freeze it,
    as the pool's ranks do (tests.harness), so that a full collection walks only what tests allocate since. Each
    gc.collect() in a test (the memory tests call it before they measure) and each automatic full collection
    otherwise cost ~0.19 s of CPU here."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items):
    """The tests that launch interpreters first (a stable sort): they are the longest, and under pytest-xdist a
    long test left for the end keeps one worker busy while the other has nothing left to take. (The docs site's
    build is not marked: its readers, tests/docs, stay next to it.)"""
    items.sort(key=lambda item: item.get_closest_marker("launches") is None)


@pytest.fixture(autouse=True)
def _share_the_machine(request, tmp_path_factory):
    """`make test` runs the suite in 2 pytest-xdist workers on 2 cores: a single-process test, a subprocess
    or a rank waiting on its peer leaves a core idle that the other worker's test fills (one session left
    ~20% of the machine's CPU idle). Their ranks then share the cores, as a world of 4 does; a claim about
    bytes, values or memory does not notice, a measured time does. So a test marked `alone` takes the
    session's room exclusively and every other test takes it shared: it starts when the other worker's
    test ends, and none starts until it ends. It takes a gate first, which tests take on their way in,
    so that tests starting while it waits do not keep it out (flock has no writer preference)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # the session's: every worker's basetemp is below it
    alone = request.node.get_closest_marker("alone") is not None
    with open(shared / "minidist-gate.lock", "a") as gate, open(shared / "minidist-room.lock", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases what is held
