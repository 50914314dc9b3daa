"""comm.Handed: after an async collective, wait until gloo's worker has let go of the tensors it was handed,
so that the caller's last reference is the one that frees them (and torch's profiler sees it)."""

import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import release


def _released() -> dict:
    out = {"held_after_wait": 0, "released": True}
    for _ in range(20):
        grads = [torch.ones(1 << 12) for _ in range(3)]
        handed = comm.Handed(grads)
        comm.all_reduce_coalesced(grads, async_op=True).get_future().wait()
        out["held_after_wait"] += not handed.released()  # gloo's worker may still hold its Work
        out["released"] &= handed.wait_released() and all((t._use_count(),) == c for t, c in zip(grads, handed.counts))
    x = torch.ones(8)
    handed = comm.Handed([x])
    comm.all_reduce(x, async_op=True).wait()
    view = x[:4]  # a reference taken meanwhile never goes: the wait gives up, bounded
    out["gives_up"] = handed.wait_released() is False
    out["values"] = float(x.sum()), len(view)
    dist.barrier()
    return out


def test_the_backend_lets_go_and_the_wait_is_bounded(run_dist):
    for out in run_dist(2, _released):
        assert out["released"] and out["gives_up"], out
        assert out["values"] == (16.0, 4), out


def test_accelerator_tensors_are_not_waited_for():
    meta = torch.empty(4, device="meta")
    assert comm.Handed([meta]).tensors == [] and release.RELEASE_TIMEOUT_S < 0.1


def _refs(t: torch.Tensor) -> tuple[int, int]:
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _synchronous_calls_return_released() -> dict:
    """Each synchronous call, 20 times: the references to what it was handed, right after it returns."""
    n, held = dist.get_world_size(), {}
    for _ in range(20):
        x, out = torch.ones(4, 1 << 10), torch.empty(n * 4 << 10)
        before = {"all_reduce": _refs(x), "all_gather": (_refs(x), _refs(out))}
        comm.all_reduce(x)
        held["all_reduce"] = held.get("all_reduce", 0) + (_refs(x) != before["all_reduce"])
        comm.all_gather(out, x.view(-1))  # a view handed: counted at the memory's level
        held["all_gather"] = held.get("all_gather", 0) + ((_refs(x), _refs(out)) != before["all_gather"])
        pieces, shard = [torch.ones(n * 8) for _ in range(3)], torch.empty(3 * 8)
        before_rs = [_refs(t) for t in pieces]
        comm.reduce_scatter(shard, torch.cat(pieces))  # minidist's ring on gloo: its lane makes views
        comm.reduce_scatter_coalesced(list(shard.split(8)), pieces)
        held["reduce_scatter"] = held.get("reduce_scatter", 0) + ([_refs(t) for t in pieces] != before_rs)
    return held


def test_synchronous_calls_return_once_the_backend_let_go(run_dist):
    """Without the wait, gloo's worker (or the ring's lane) still holds a just-finished call's tensors in most
    calls on a loaded machine, and they die on its thread, unseen by torch's profiler
    (tests/compare/test_plan.py's tensor-parallel rows measured 0.1-1 MB of them at the peak)."""
    for held in run_dist(2, _synchronous_calls_return_released):
        assert held == {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}, held
