"""The trace counts exactly the bytes of the ring formulas, and saves as JSON."""

import json
import time

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
        comm.reduce_scatter(torch.empty(1200), torch.zeros(1200 * n))  # S = full input; the ring on gloo
        comm.reduce_scatter(torch.empty(1200), torch.zeros(1200 * n), async_op=True,
                            algorithm="native").wait()  # gloo's own: an all_reduce inside, no future
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
    assert [r["span_s"] for r in saved["records"]] == [r.span_s for r in t.records]
    wire = [r.wire_bytes for r in t.records]
    assert wire == [2 * r.sent_bytes if r.wire_op == "all_reduce" and r.op == "reduce_scatter" else
                    r.sent_bytes + r.payload_bytes * (n - 1) // n ** 2 if r.op == "reduce" else r.sent_bytes
                    for r in t.records] and t.wire_bytes == sum(wire)
    return [(r.op, r.payload_bytes, r.sent_bytes, r.group_size, r.dtype) for r in t.records], \
        [(r.op, r.payload_bytes) for r in inner.records], t.summary(), [(r.op, r.algorithm, r.wire_op) for r in t.records]


@pytest.mark.parametrize("n", [2, 3])
def test_trace_bytes_equal_ring_formulas(run_dist, tmp_path, n):
    out = run_dist(n, _traced_step, str(tmp_path))
    s = 4800
    for rank, (records, inner, summary, algorithms) in enumerate(out):
        root = rank == 0
        expected = [
            ("all_reduce", s, 2 * s * (n - 1) // n),
            ("all_reduce", s, 2 * s * (n - 1) // n),
            ("all_gather", s * n, s * n * (n - 1) // n),
            ("reduce_scatter", s * n, s * n * (n - 1) // n),
            ("reduce_scatter", s * n, s * n * (n - 1) // n),
            ("broadcast", s, s * (n - 1) // n),  # the mean over ranks: N-1 of N send S
            ("reduce", s, s * (n - 1) // n),
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
        assert algorithms[3:5] == [("reduce_scatter", "ring", "reduce_scatter"), ("reduce_scatter", "native", "all_reduce")]
        assert all(a == "native" and w == op for op, a, w in algorithms[:3] + algorithms[5:])


def test_ring_bytes_sent_world_one_is_zero():
    assert comm.ring_bytes_sent("all_reduce", 10**6, 1) == 0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.ring_bytes_sent("allreduce", 1, 2)


SKEW_S, COMPUTE_S = 1.0, 0.1


def _overlapped_all_reduces():
    """Rank 0 issues async all_reduces, computes (sleeps), then waits; rank 1 joins late."""
    rank = dist.get_rank()
    with comm.trace() as t:
        comm.all_reduce(torch.ones(1024))  # synchronous, overlaps nothing
        if rank == 1:
            time.sleep(SKEW_S)  # a late peer: rank 0's all_reduces cannot finish before it joins
        works = [comm.all_reduce(torch.ones(1024), async_op=True) for _ in range(4)]
        time.sleep(COMPUTE_S)  # the compute they overlap
        for w in works:
            w.wait()
    wire = t.wire_times()
    rows = [(r.span_s, r.waited_s, r.exposed_s, w, r.issued_s, r.completed_s) for r, w in zip(t.records, wire)]
    return rows, t.totals()["all_reduce"], t.summary(comm.CostModel(alpha=1e-4, beta=1e-9))


def test_async_times_span_waited_exposed_wire(run_dist):
    rows, totals, summary = run_dist(2, _overlapped_all_reduces)[0]  # rank 0's view
    (span, waited, exposed, wire, *_), *queued = rows
    assert waited == 0 and exposed == span == wire  # synchronous: the caller is blocked throughout
    spans, waits, exposes, wires, issued, completed = zip(*queued)
    assert spans[0] >= COMPUTE_S  # the first async one waited for the late peer through the compute
    assert waits[0] < spans[0]  # the caller waited only after computing
    assert all(e >= w for e, w in zip(exposes, waits))
    assert all(w <= s for w, s in zip(wires, spans))
    # later ones queued behind the first: their wire time excludes the queue and the compute
    assert sum(wires[1:]) < COMPUTE_S <= min(spans)
    # on one group the wire intervals do not overlap: they fit in the window, spans do not
    assert sum(wires) <= max(completed) - min(issued) < sum(spans)
    assert totals["span_s"] == pytest.approx(span + sum(spans))
    assert totals["wire_s"] == pytest.approx(wire + sum(wires))
    assert all(col in summary for col in ("span ms", "waited ms", "exposed ms", "wire ms", "ring ms"))


def _waits_on_futures():
    """DDP waits on futures (one, or several collected): each wait is an interval of the trace."""
    x, y = torch.ones(4096), torch.ones(4096)
    with comm.trace() as t:
        fut = comm.all_reduce(x, async_op=True).get_future()
        both = comm.collect_all([comm.all_reduce(y, async_op=True).get_future(),
                                          comm.broadcast(torch.ones(8), src=1, async_op=True).get_future()])
        value = fut.wait()
        both.wait()
        chained = comm.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        doubled = chained.wait()
    names = [r.op for r in t.records]
    return (names, [r.root for r in t.records], len(t.waits), float(value[0][0]), float(doubled[0]),
            all(a <= b for a, b, _ in t.waits), t.records[0].waited_s > 0 or t.records[0].completed_s <= t.waits[0][0],
            all(r.completed_s is not None for r in t.records))


def test_waits_on_futures_are_recorded_and_futures_compose(run_dist):
    for names, roots, n_waits, value, doubled, ordered, first, completed in run_dist(2, _waits_on_futures):
        assert names == ["all_reduce", "all_reduce", "broadcast", "all_reduce"] and roots == [None, None, 1, None]
        assert n_waits == 3 and ordered and first and completed  # fut, both (collected) and chained waits
        assert value == 2.0 and doubled == 4.0                   # values pass through, chaining works


def test_hidden_share_is_one_definition():
    assert comm.hidden_share(overhead_s=1.2 - 1.0, comm_alone_s=0.8) == pytest.approx(0.75)
    assert comm.hidden_share(0.0, 0.5) == 1.0 and comm.hidden_share(1.0, 0.5) == -1.0  # all hidden; more than comm
    assert comm.hidden_share(0.1, 0.0) is None
