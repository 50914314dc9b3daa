"""The kernel's byte counters agree with the ring model for the collectives gloo runs as rings."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import kernel_io

pytestmark = pytest.mark.skipif(not kernel_io.available(), reason="needs Linux /proc/self/io")

S = 4 * 2**20  # 4 MiB: large enough that gloo's headers are noise


def _measure(op: str):
    n, r = dist.get_world_size(), dist.get_rank()
    t = torch.ones(S // 4)
    with kernel_io.written() as w:
        if op == "all_reduce":
            comm.all_reduce(t)
        elif op == "all_gather":
            comm.all_gather(torch.empty(S // 4 * n), t)
        elif op == "reduce_scatter":
            comm.reduce_scatter(torch.empty(S // 4 // n), t)
    return w.bytes, comm.ring_bytes_sent(op, S if op != "all_gather" else S * n, n)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("world", [2, 4])
def test_kernel_bytes_match_ring_model(run_dist, op, world):
    for measured, model in run_dist(world, _measure, op):
        assert abs(measured - model) <= 0.01 * model, f"{op}: kernel counted {measured} B, ring model {model} B"
