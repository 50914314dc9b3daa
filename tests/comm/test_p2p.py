"""Point to point: a batch of isend/irecv delivers each tensor to its peer (group ranks), and the trace
records each half of a message on its channel: S bytes sent by the sender, none by the receiver."""

from __future__ import annotations

import torch
import torch.distributed as dist

from minidist import comm


def _exchange() -> dict:
    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    mine, theirs, lone = torch.full((5,), float(rank)), torch.empty(5), torch.empty(3)
    with comm.trace() as t:
        works = comm.batch_isend_irecv([comm.P2POp(comm.isend, mine, 1 - rank, group),
                                        comm.P2POp(comm.irecv, theirs, 1 - rank, group)])
        for w in works:
            w.wait()
        (comm.isend(torch.arange(3.0), 1, group=group) if rank == 0 else comm.irecv(lone, 0, group=group)).wait()
    return dict(got=theirs.tolist(), lone=lone.tolist() if rank else None,
                records=[(r.op, r.group.split(":")[-1], r.group_size, r.payload_bytes, r.sent_bytes)
                         for r in t.records])


def test_a_batch_delivers_and_the_trace_names_each_channel(run_dist):
    r0, r1 = run_dist(2, _exchange)
    assert r0["got"] == [1.0] * 5 and r1["got"] == [0.0] * 5 and r1["lone"] == [0.0, 1.0, 2.0]
    assert r0["records"] == [("send", "0>1", 2, 20, 20), ("recv", "1>0", 2, 20, 0), ("send", "0>1", 2, 12, 12)]
    assert r1["records"] == [("send", "1>0", 2, 20, 20), ("recv", "0>1", 2, 20, 0), ("recv", "0>1", 2, 12, 0)]


def test_a_message_costs_one_latency_and_its_bytes():
    model = comm.CostModel(alpha=1e-4, beta=1e-9)
    assert model.predict("send", 1000, 2) == 1e-4 + 1000 * 1e-9 and model.predict("recv", 1000, 2) == 0.0
    assert comm.ring_bytes_sent("send", 1000, 2) == 1000 and comm.ring_bytes_sent("recv", 1000, 2) == 0
