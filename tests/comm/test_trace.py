"""The trace counts exactly the bytes of the ring formulas, and saves as JSON."""

import json

import pytest
import torch
import torch.distributed as dist

from minidist import comm


def _traced_step(tmpdir):
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.zeros(1200)  # S = 4800 bytes
    with comm.trace() as t:
        comm.all_reduce(x)
        comm.all_reduce(x, async_op=True).wait()
        comm.all_gather(torch.empty(1200 * n), torch.zeros(1200))  # S = full gathered tensor
        comm.reduce_scatter(torch.empty(1200), torch.zeros(1200 * n))  # S = full input
        comm.reduce_scatter(torch.empty(1200), torch.zeros(1200 * n), async_op=True).wait()  # gloo: no future
        comm.broadcast(x, src=0)
        comm.reduce(x, dst=0)
        comm.all_to_all(torch.empty(1200), torch.zeros(1200))
        comm.scatter(torch.empty(250), [torch.zeros(250)] * n if rank == 0 else None, src=0)
        comm.gather(torch.zeros(250), [torch.empty(250) for _ in range(n)] if rank == 0 else None, dst=0)
        comm.barrier()
        inner = None
        with comm.trace() as inner:  # nested traces both record
            comm.all_reduce(torch.zeros(10, dtype=torch.float64))
    t.save(f"{tmpdir}/trace{rank}.json")
    with open(f"{tmpdir}/trace{rank}.json") as f:
        saved = json.load(f)
    assert len(saved["records"]) == len(t.records)
    assert all(r.completed_s is not None and r.completed_s >= r.issued_s for r in t.records)
    return [(r.op, r.payload_bytes, r.sent_bytes, r.group_size, r.dtype) for r in t.records], \
        [(r.op, r.payload_bytes) for r in inner.records], t.summary()


@pytest.mark.parametrize("n", [2, 3])
def test_trace_bytes_equal_ring_formulas(run_dist, tmp_path, n):
    out = run_dist(n, _traced_step, str(tmp_path))
    s = 4800
    for rank, (records, inner, summary) in enumerate(out):
        root = rank == 0
        expected = [
            ("all_reduce", s, 2 * s * (n - 1) // n),
            ("all_reduce", s, 2 * s * (n - 1) // n),
            ("all_gather", s * n, s * n * (n - 1) // n),
            ("reduce_scatter", s * n, s * n * (n - 1) // n),
            ("reduce_scatter", s * n, s * n * (n - 1) // n),
            ("broadcast", s, s),
            ("reduce", s, s),
            ("all_to_all", s, s * (n - 1) // n),
            ("scatter", 1000 * n, 1000 * n * (n - 1) // n if root else 0),
            ("gather", 1000 * n, 0 if root else 1000),
            ("barrier", 0, 0),
            ("all_reduce", 80, 2 * 80 * (n - 1) // n),
        ]
        assert [(op, p, b) for op, p, b, _, _ in records] == expected
        assert all(size == n for *_, size, _ in records)
        assert records[-1][-1] == "float64"
        assert inner == [("all_reduce", 80)]
        assert "reduce_scatter" in summary and "all_reduce" in summary


def test_ring_bytes_sent_world_one_is_zero():
    assert comm.ring_bytes_sent("all_reduce", 10**6, 1) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.ring_bytes_sent("allreduce", 1, 2)
