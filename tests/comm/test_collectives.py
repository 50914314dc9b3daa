"""Every collective's semantics at world 2, 3 and 4, the lesson's values at world 2,
and every ReduceOp. Each body checks many things in one pool call."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.comm import ReduceOp


def _lesson_values():
    """The values of the collectives lesson, as each rank sees them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {}
    t = torch.tensor([rank * 100])
    seen["before broadcast"] = t.tolist()
    comm.broadcast(t, src=0)
    seen["after broadcast"] = t.tolist()
    t = torch.tensor([float(rank + 1)])
    comm.all_reduce(t, ReduceOp.SUM)
    seen["all_reduce"] = t.tolist()
    t = torch.tensor([float(rank + 1)])
    comm.reduce(t, dst=0, op=ReduceOp.SUM)
    seen["reduce"] = t.tolist()
    mine = torch.tensor([rank * 10 + 1])
    bucket = [torch.zeros_like(mine) for _ in range(world)]
    comm.all_gather(bucket, mine)
    seen["all_gather"] = [b.item() for b in bucket]
    buf = torch.zeros(1)
    comm.scatter(buf, [torch.tensor([float(i) * 11]) for i in range(world)] if rank == 0 else None, src=0)
    seen["scatter"] = buf.tolist()
    got = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
    comm.gather(torch.tensor([rank + 0.5]), got, dst=0)
    seen["gather"] = [g.item() for g in got] if rank == 0 else None
    comm.barrier()
    return seen


def test_lesson_values_at_world_2(run_dist):
    r0, r1 = run_dist(2, _lesson_values)
    assert (r0["before broadcast"], r1["before broadcast"]) == ([0], [100])
    assert r0["after broadcast"] == r1["after broadcast"] == [0]
    assert r0["all_reduce"] == r1["all_reduce"] == [3.0]
    assert r0["reduce"] == [3.0] and r1["reduce"] == [2.0]  # rank 1's input, untouched
    assert r0["all_gather"] == r1["all_gather"] == [1, 11]
    assert (r0["scatter"], r1["scatter"]) == ([0.0], [11.0])
    assert r0["gather"] == [0.5, 1.5] and r1["gather"] is None


def test_lesson_values_at_world_3(run_dist):
    out = run_dist(3, _lesson_values)
    for rank, seen in enumerate(out):
        assert seen["after broadcast"] == [0]
        assert seen["all_reduce"] == [6.0]
        assert seen["all_gather"] == [1, 11, 21]
        assert seen["scatter"] == [rank * 11.0]
    assert out[0]["reduce"] == [6.0]
    assert out[0]["gather"] == [0.5, 1.5, 2.5]


def _reduce_ops():
    """all_reduce (single and coalesced), reduce and reduce_scatter with every op, sync and async."""
    rank, world = dist.get_rank(), dist.get_world_size()
    values = [float(r + 2) for r in range(world)]  # rank r contributes r + 2
    expect = {
        ReduceOp.SUM: sum(values), ReduceOp.MAX: max(values), ReduceOp.MIN: min(values),
        ReduceOp.PRODUCT: torch.tensor(values).prod().item(), ReduceOp.AVG: sum(values) / world,
    }
    for op, want in expect.items():
        for async_op in (False, True):
            t = torch.tensor([values[rank]])
            work = comm.all_reduce(t, op, async_op=async_op)
            if async_op:
                work.wait()
            assert torch.allclose(t, torch.tensor([want])), (op, async_op, t)
            # all_reduce_coalesced: each tensor in place, a non-contiguous one included
            ts = [torch.tensor([values[rank]] * 3), torch.full((2, 3), values[rank]).t()]
            work = comm.all_reduce_coalesced(ts, op, async_op=async_op)
            if async_op:
                work.wait()
            assert all(torch.allclose(x, torch.full_like(x, want)) for x in ts), (op, async_op, ts)
            # reduce: only dst's answer is meaningful
            t = torch.tensor([values[rank]])
            work = comm.reduce(t, dst=world - 1, op=op, async_op=async_op)
            if async_op:
                work.wait()
            if rank == world - 1:
                assert torch.allclose(t, torch.tensor([want])), (op, t)
            # reduce_scatter: chunk r of the reduced whole lands on rank r
            inp = torch.arange(world * 2, dtype=torch.float32) + values[rank]
            out = torch.zeros(2)
            work = comm.reduce_scatter(out, inp, op, async_op=async_op)
            if async_op:
                work.wait()
            cols = torch.stack([torch.arange(world * 2, dtype=torch.float32) + v for v in values])
            full = {ReduceOp.SUM: cols.sum(0), ReduceOp.MAX: cols.max(0).values, ReduceOp.MIN: cols.min(0).values,
                    ReduceOp.PRODUCT: cols.prod(0), ReduceOp.AVG: cols.mean(0)}[op]
            assert torch.allclose(out, full[rank * 2:rank * 2 + 2]), (op, out)
    return True


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_ops(run_dist, world):
    assert all(run_dist(world, _reduce_ops))


def _moves_data():
    """all_gather (list, flat and coalesced), reduce_scatter (list input, coalesced), all_to_all, async broadcast."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.full((3,), float(rank))
    flat = torch.empty(3 * world)
    comm.all_gather(flat, mine, async_op=True).wait()
    assert flat.tolist() == [float(r) for r in range(world) for _ in range(3)]
    # all_gather_coalesced: each input into its own output, rank r's piece at r x its numel; one collective
    dest = torch.full((4 * world,), -1.0)  # [a from every rank | b from every rank], as FSDP's `full`
    a, b = torch.full((3,), float(rank)), torch.tensor([rank + 0.5])
    with comm.trace() as tr:
        comm.all_gather_coalesced([dest[:3 * world], dest[3 * world:]], [a, b], async_op=True).wait()
    assert dest.tolist() == [float(r) for r in range(world) for _ in range(3)] + [r + 0.5 for r in range(world)]
    assert [(r.op, r.numel, r.sent_bytes) for r in tr.records] == [("all_gather", 4 * world, 4 * 4 * (world - 1))]
    comm.all_gather_coalesced([dest[3 * world:]], [b + 1])
    assert dest[3 * world:].tolist() == [r + 1.5 for r in range(world)]
    # reduce_scatter_coalesced: inputs[i] (N x outputs[i]) reduced, chunk `rank` into outputs[i]; the ring
    # reads them where they lie (outputs end to end, or apart), gloo's native one after a rank-major copy
    total = sum(range(world))
    for algorithm, apart in (("ring", False), ("ring", True), ("native", False)):
        xs = [torch.arange(world * 3, dtype=torch.float32) + rank, torch.full((world,), rank + 1.0)]
        flat = torch.zeros(4)
        outs = [torch.zeros(3), torch.zeros(1)] if apart else [flat[:3], flat[3:]]
        with comm.trace() as tr:
            comm.reduce_scatter_coalesced(outs, xs, async_op=True, algorithm=algorithm).wait()
        assert outs[0].tolist() == [world * (rank * 3 + i) + float(total) for i in range(3)], (algorithm, outs)
        assert outs[1].item() == total + world, (algorithm, outs)
        assert apart or flat.tolist() == outs[0].tolist() + outs[1].tolist()
        assert [(r.op, r.numel, r.algorithm) for r in tr.records] == [("reduce_scatter", 4 * world, algorithm)]
    parts = [torch.full((2,), float(rank * 10 + j)) for j in range(world)]
    out = torch.empty(2)
    comm.reduce_scatter(out, parts)
    assert out.tolist() == [float(sum(r * 10 + rank for r in range(world)))] * 2
    # all_to_all: chunk j of rank i becomes chunk i of rank j
    inp = torch.tensor([float(rank * 100 + j) for j in range(world)])
    got = torch.empty(world)
    comm.all_to_all(got, inp)
    assert got.tolist() == [float(i * 100 + rank) for i in range(world)]
    ins = [torch.tensor([float(rank * 100 + j)] * 2) for j in range(world)]
    outs = [torch.empty(2) for _ in range(world)]
    comm.all_to_all(outs, ins)
    assert [o[0].item() for o in outs] == [float(i * 100 + rank) for i in range(world)]
    t = torch.tensor([rank + 7.0])
    comm.broadcast(t, src=world - 1, async_op=True).wait()
    assert t.item() == world - 1 + 7.0
    comm.barrier(async_op=True).wait()
    return True


@pytest.mark.parametrize("world", [2, 3, 4])
def test_data_movement(run_dist, world):
    assert all(run_dist(world, _moves_data))


def _wrong_root_arguments():
    rank = dist.get_rank()
    errors = []
    try:
        comm.gather(torch.zeros(1), [torch.zeros(1)] * 2 if rank == 1 else None, dst=0)
    except ValueError as e:
        errors.append(str(e))
    try:
        comm.all_reduce(torch.zeros(1), ReduceOp.BAND)
    except ValueError as e:
        errors.append(str(e))
    try:
        comm.all_reduce(torch.zeros(1, dtype=torch.int64), ReduceOp.AVG)
    except TypeError as e:
        errors.append(str(e))
    return errors


def test_argument_errors_are_raised_before_any_communication(run_dist):
    r0, r1 = run_dist(2, _wrong_root_arguments)
    assert "must pass gather_list" in r0[0] and "must be None" in r1[0]
    assert all("not supported" in e[1] and "AVG needs a floating" in e[2] for e in (r0, r1))
