"""The ring reduce_scatter equals the native one at world 2, 3 and 4 (fp32, bf16, sync and
async, SUM and AVG, on the world and on subgroups), is what "auto" picks on gloo, and is
traced with exactly S (N-1)/N bytes sent per rank (gloo's native one: 2x on the wire)."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import ReduceOp, lane, ring


def _inputs(n: int, k: int, dtype, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Small integers (sums stay exact in bf16, whatever the order), and random values."""
    exact = ((torch.arange(n * k) * (rank + 3) + 7 * rank) % 61).to(dtype)
    g = torch.Generator().manual_seed(rank)
    return exact, torch.randn(n * k, generator=g).to(dtype)


def _reduce_scatter(inp, k, algorithm, async_op, op=ReduceOp.SUM, group=None):
    out = torch.full((k,), float("nan"), dtype=inp.dtype)
    work = comm.reduce_scatter(out, inp, op, group=group, async_op=async_op, algorithm=algorithm)
    if async_op:
        assert work is not None and work.wait()
    return out


def _ring_equals_native():
    n, rank = dist.get_world_size(), dist.get_rank()
    for dtype in (torch.float32, torch.bfloat16):
        for k in (1, 999):  # N * k elements, k odd or one: nothing divides evenly
            exact, noisy = _inputs(n, k, dtype, rank)
            for async_op in (False, True):
                want = _reduce_scatter(exact, k, "native", async_op)
                assert torch.equal(_reduce_scatter(exact, k, "ring", async_op), want), (dtype, k, async_op)
                sums = sum(_inputs(n, k, dtype, r)[0].float() for r in range(n))  # every rank's input, here
                assert torch.equal(want.float(), sums[rank * k:(rank + 1) * k])
                tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
                torch.testing.assert_close(_reduce_scatter(noisy, k, "ring", async_op),
                                           _reduce_scatter(noisy, k, "native", async_op), **tol)
                avg = _reduce_scatter(exact, k, "ring", async_op, ReduceOp.AVG)
                torch.testing.assert_close(avg, (want.float() / n).to(dtype), rtol=0, atol=0)
    return True


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_equals_native(run_dist, world):
    assert all(run_dist(world, _ring_equals_native))


def _in_flight_and_subgroups():
    """Several rings in flight at once, a sync ring behind them, subgroups (N = 1 included)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    k = 257
    inputs = [_inputs(n, k, torch.float32, rank)[0] + i for i in range(3)]
    outs = [torch.empty(k) for _ in inputs]
    works = [comm.reduce_scatter(o, x, async_op=True, algorithm="ring") for o, x in zip(outs[:2], inputs[:2])]
    comm.reduce_scatter(outs[2], inputs[2], algorithm="ring")  # queued behind the two on the lane
    assert all(w.wait() for w in works)
    for o, x in zip(outs, inputs):
        assert torch.equal(o, _reduce_scatter(x, k, "native", False))
    # rings on subgroups: peers are global ranks of group members; one group of each rank alone
    singles = [dist.new_group([r]) for r in range(n)]
    members = list(range(n))[::-1][: max(2, n - 1)]  # e.g. world 4: [3, 2, 1], group rank != global
    sub = dist.new_group(members)
    x = _inputs(n, k, torch.float32, rank)[0]
    alone = _reduce_scatter(x[:k], k, "ring", True, group=singles[rank])
    assert torch.equal(alone, x[:k])  # N = 1: a copy
    if rank in members:
        m = len(members)
        mine = x[: m * 3]
        got = _reduce_scatter(mine, 3, "ring", True, group=sub)
        assert torch.equal(got, _reduce_scatter(mine, 3, "native", False, group=sub))
    # a ring left in flight is finished, not abandoned, when the lanes stop (as at exit)
    late = torch.empty(k)
    work = comm.reduce_scatter(late, inputs[0], async_op=True, algorithm="ring")
    lane._stop_lanes()
    assert work.is_completed() and torch.equal(late, outs[0]) and not lane._LANES
    for g in [*singles, sub]:
        dist.destroy_process_group(g)
    return True


@pytest.mark.parametrize("world", [3, 4])
def test_in_flight_rings_and_subgroups(run_dist, world):
    assert all(run_dist(world, _in_flight_and_subgroups))


def _traced_bytes():
    n = dist.get_world_size()
    k = 1001
    with comm.trace() as t:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.ones(n * k, dtype=dtype)
            comm.reduce_scatter(torch.empty(k, dtype=dtype), x)  # auto: the ring on gloo
            comm.reduce_scatter(torch.empty(k, dtype=dtype), x, async_op=True, algorithm="ring").wait()
            comm.reduce_scatter(torch.empty(k, dtype=dtype), x, algorithm="native")
            with comm.reduce_scatter_algorithm("native"):
                comm.reduce_scatter(torch.empty(k, dtype=dtype), x, async_op=True).wait()
    return [(r.algorithm, r.wire_op, r.payload_bytes, r.sent_bytes, r.wire_bytes) for r in t.records], t.summary()


@pytest.mark.parametrize("world", [2, 3])
def test_traced_bytes_are_the_ring_minimum(run_dist, world):
    for records, summary in run_dist(world, _traced_bytes):
        expected = []
        for itemsize in (4, 2):
            s = world * 1001 * itemsize  # S: the full input
            ring_bytes = (world - 1) * 1001 * itemsize  # (N-1)/N S, exactly
            expected += [("ring", "reduce_scatter", s, ring_bytes, ring_bytes)] * 2
            expected += [("native", "all_reduce", s, ring_bytes, 2 * ring_bytes)] * 2  # gloo: an all_reduce inside
        assert records == expected
        assert " ring " in summary and "native" in summary


def test_algorithm_policy():
    assert ring.choose("native", None, torch.empty(1)) == "native"
    assert ring.choose("ring", None, torch.empty(1)) == "ring"
    with comm.reduce_scatter_algorithm("native"):
        assert ring.choose(None, None, torch.empty(1)) == "native"
        with pytest.raises(ValueError, match="must be one of"):
            comm.set_reduce_scatter_algorithm("tree")
    assert ring._default_algorithm == "auto"
    with pytest.raises(ValueError, match="must be one of"):
        ring.choose("halving", None, torch.empty(1))
