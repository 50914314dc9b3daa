"""The harness itself: a failing, dying or hanging rank fails the test in bounded time."""

import os
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from tests.harness import DistTestError, PoolManager, compose_once


def _rank_and_size():
    return dist.get_rank(), dist.get_world_size()


def _raise_on_rank_1():
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for a partner who never comes


def _die_on_rank_1():
    if dist.get_rank() == 1:
        os._exit(3)
    time.sleep(30)


def _hang_on_rank_0():
    if dist.get_rank() == 0:
        time.sleep(30)


def _warn():
    warnings.warn("something odd", UserWarning)


def test_pool_runs_on_every_rank(run_dist):
    assert run_dist(2, _rank_and_size) == [(0, 2), (1, 2)]
    assert run_dist(3, _rank_and_size) == [(0, 3), (1, 3), (2, 3)]


def test_an_idle_pool_is_closed_and_started_again_when_needed():
    manager = PoolManager()
    try:
        first = manager.run(1, os.getpid)
        manager.close_idle(idle_s=60)  # used just now: kept
        assert manager.run(1, os.getpid) == first
        time.sleep(0.05)
        manager.close_idle(idle_s=0.01)
        assert manager.idle_closes == 1 and not manager._pools
        assert manager.run(1, os.getpid) != first  # a new rank
        assert [w for w, _, _ in manager.starts] == [1, 1] and "1 closed after" in manager.summary()
    finally:
        manager.close()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _new_group() -> int:
    group = dist.new_group([0, 1])  # gloo: a transport thread and two run loops, alive until the group is destroyed
    dist.all_reduce(torch.ones(1), group=group)
    return _threads()


def test_the_groups_a_body_creates_are_destroyed_after_it(run_dist):
    before = run_dist(2, _threads)
    assert all(n > b for n, b in zip(run_dist(2, _new_group), before))
    assert run_dist(2, _threads) == before


def test_error_on_one_rank_fails_fast_with_its_traceback(run_dist):
    t0 = time.monotonic()
    with pytest.raises(DistTestError, match="boom on rank 1"):
        run_dist(2, _raise_on_rank_1)
    assert time.monotonic() - t0 < 20
    assert run_dist(2, _rank_and_size) == [(0, 2), (1, 2)]  # a fresh pool replaced the broken one


def test_dead_rank_fails_with_exit_code(run_dist):
    with pytest.raises(DistTestError, match=r"1 \(exit code 3\)"):
        run_dist(2, _die_on_rank_1, timeout=25)


def test_hung_rank_times_out(run_dist):
    t0 = time.monotonic()
    with pytest.raises(DistTestError, match=r"\[0\] did not finish within 2s"):
        run_dist(2, _hang_on_rank_0, timeout=2)
    assert time.monotonic() - t0 < 15


def test_warnings_fail_unless_allowed(run_dist):
    with pytest.raises(DistTestError, match="something odd"):
        run_dist(2, _warn)
    run_dist(2, _warn, allow_warnings=True)


def _composed(overrides):
    """What compose_once gives this rank (its YAML, or the error it raised) and how often it composed."""
    from unittest import mock

    import minidist.cli
    from omegaconf import OmegaConf
    with mock.patch.object(minidist.cli, "compose_config", wraps=minidist.cli.compose_config) as composed:
        try:
            return OmegaConf.to_yaml(compose_once(overrides)), composed.call_count
        except Exception as exc:  # noqa: BLE001 - the error each rank raised is the result
            return type(exc).__name__, str(exc), composed.call_count


def test_compose_once_composes_on_rank_0_and_every_rank_gets_the_config_or_the_error(run_dist):
    from minidist.cli import compose_config
    from omegaconf import OmegaConf
    overrides = ["experiment=gpt_tiny", "strategy=full_shard", "trainer.steps=3"]
    want = OmegaConf.to_yaml(compose_config(overrides))
    assert run_dist(2, _composed, overrides) == [(want, 1), (want, 0)]
    (kind, error, calls), other = run_dist(2, _composed, ["strategy=nope"])
    assert kind == "ConfigError" and "nope" in error and calls == 1 and other == (kind, error, 0)
