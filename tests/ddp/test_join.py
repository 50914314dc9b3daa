"""Uneven inputs at world 2 (DDP.join): the rank with fewer batches shadows the other's
collectives instead of hanging, and the parameters equal one process that, at each
step, averages the gradients of the ranks that still had a batch with the documented
divisor (N, or the active count). Plus: join costs nothing outside the block and one
small all_reduce per forward inside it."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minidist import comm
from minidist.ddp import DDP, allreduce_hook
from tests.common import MLP
from tests.ddp.helpers import batches, max_diff

BATCH = 6


class Counting(nn.Module):
    """An MLP with a buffer counting the samples it has seen: DDP broadcasts it before every forward
    (from the lowest rank that still has inputs), so it ends at (iterations x BATCH)."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen += x.shape[0]
        return self.mlp(x)


def _fresh():
    torch.manual_seed(0)
    return Counting()


def _data(n_batches: list[int]):
    return [batches(n, BATCH, 13, 5, seed=10 + r) for r, n in enumerate(n_batches)]


def _reference(n_batches: list[int], divide_by_initial_world_size: bool) -> nn.Module:
    """One process: step k averages the losses of the ranks with a k-th batch, over N or over them."""
    data, model = _data(n_batches), _fresh()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for k in range(max(n_batches)):
        active = [r for r, n in enumerate(n_batches) if k < n]
        divisor = len(n_batches) if divide_by_initial_world_size else len(active)
        opt.zero_grad()
        (sum(F.mse_loss(model.mlp(data[r][k][0]), data[r][k][1]) for r in active) / divisor).backward()
        opt.step()
    return model


def _uneven(n_batches: list[int], divide_by_initial_world_size: bool, hook, ddp_kw: dict) -> dict:
    rank = dist.get_rank()
    mine = _data(n_batches)[rank]
    model = DDP(_fresh(), bucket_cap_mb=1e-6, **ddp_kw)  # a bucket per layer: several shadowed reductions
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with model.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for x, y in mine:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    ref = _reference(n_batches, divide_by_initial_world_size)
    return {"vs ref": max_diff(model.module, ref), "seen": model.module.seen.item(),
            "rebuilds": model.reducer.num_rebuilds}


CASES = {
    # rank 1 joins after one step: it shadows the bucket rebuild and three steps
    "rank 1 short, divide by N": ([4, 1], True, None, {}),
    # rank 0 never has a batch: rank 1 is the source of the rebuild and the buffers;
    # a hook that divides by N itself, rescaled to the active count
    "rank 0 empty, divide by active, allreduce_hook": ([0, 3], False, allreduce_hook, {}),
    "rank 0 short, grad as bucket view, find unused": ([2, 3], True, None,
                                                       dict(gradient_as_bucket_view=True,
                                                            find_unused_parameters=True)),
    "even": ([2, 2], True, None, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_join_uneven_inputs(run_dist, case):
    n_batches, divide, hook, ddp_kw = CASES[case]
    for r in run_dist(2, _uneven, n_batches, divide, hook, ddp_kw, timeout=60):
        assert r["vs ref"] < 1e-6, r["vs ref"]
        assert r["seen"] == max(n_batches) * BATCH, r["seen"]
        assert r["rebuilds"] == 1


def _overhead() -> dict:
    model = DDP(_fresh())
    x, y = batches(1, BATCH, 13, 5)[0]
    for _ in range(2):  # past the one-time bucket rebuild
        F.mse_loss(model(x), y).backward()
    out = {}
    for name, ctx in (("plain", model.join(enable=False)), ("join", model.join())):
        with ctx, comm.trace() as t:
            F.mse_loss(model(x), y).backward()
        out[name] = sorted((r.op, r.dtype) for r in t.records)
    return out


def test_join_overhead_only_inside_the_block(run_dist):
    for r in run_dist(2, _overhead, timeout=60):
        extra = list(r["join"])
        for op in r["plain"]:
            extra.remove(op)
        assert extra == [("all_reduce", "int32")], (r["plain"], r["join"])
        assert ("all_reduce", "int32") not in r["plain"]
