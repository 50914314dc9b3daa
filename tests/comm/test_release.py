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
        out["released"] &= handed.wait_released() and all(t._use_count() == c for t, c in zip(grads, handed.counts))
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
