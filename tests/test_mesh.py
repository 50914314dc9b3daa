"""The mesh: which data shard is mine, who writes files, which group an engine spans."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm, runtime
from minidist.mesh import (all_reduce_dp, data_parallel_mesh, dp_rank, dp_size, group_of, hybrid_mesh,
                           is_main)


def _layout() -> dict:
    topo = runtime.init("gloo")
    flat, hybrid = data_parallel_mesh(topo), hybrid_mesh(topo, shard=2)
    shard_ranks = dist.get_process_group_ranks(hybrid["shard"].get_group())
    replicate_ranks = dist.get_process_group_ranks(hybrid["replicate"].get_group())
    # group_src names a rank inside the group: the shard group's member 1 is global rank 1 or 3
    t = torch.tensor([float(topo.rank)])
    comm.broadcast(t, group=hybrid["shard"].get_group(), group_src=1)
    total = all_reduce_dp(torch.ones(1), hybrid)
    return {"flat": (dp_rank(flat), dp_size(flat), is_main(flat)),
            "hybrid": (dp_rank(hybrid), dp_size(hybrid), is_main(hybrid)),
            "shard": shard_ranks, "replicate": replicate_ranks, "from_member_1": t.item(), "total": total.item()}


def test_layout_world4(run_dist):
    got = run_dist(4, _layout)
    for r, g in enumerate(got):
        assert g["flat"] == (r, 4, r == 0)
        assert g["hybrid"] == (r, 4, r == 0)      # rows of consecutive ranks: dp rank = global rank here
        assert g["shard"] == [r - r % 2, r - r % 2 + 1]
        assert g["replicate"] == [r % 2, r % 2 + 2]
        assert g["from_member_1"] == r - r % 2 + 1
        assert g["total"] == 4.0


def _errors() -> list[str]:
    topo = runtime.init("gloo")
    out = []
    for call in (lambda: hybrid_mesh(topo, shard=3), lambda: group_of("DDP", None, hybrid_mesh(topo, shard=1)),
                 lambda: group_of("DDP", topo.group, data_parallel_mesh(topo))):
        with pytest.raises(ValueError) as e:
            call()
        out.append(str(e.value))
    return out


def test_one_line_errors(run_dist):
    shard, two_d, both = run_dist(2, _errors)[0]
    assert "hybrid_mesh: shard=3 must divide the 2 processes of the job; valid: 1, 2" in shard, shard
    assert "2-D mesh" in two_d and "mesh['shard']" in two_d
    assert "not both" in both
