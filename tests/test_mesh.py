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


def _tp_layout() -> dict:
    from minidist.mesh import DP, TP, ParallelDims
    topo = runtime.init("gloo")
    out = {}
    for label, dims in (("dp x tp", ParallelDims.infer(4, tp=2)),
                        ("hybrid", ParallelDims.infer(4, shard=2, hybrid=True)),
                        ("hybrid x tp", ParallelDims.infer(4, tp=2, shard=1, hybrid=True))):
        layout = dims.build("cpu")
        loss = torch.tensor([float(layout.dp_rank + 1)])  # the same on ranks that differ only in tp
        out[label] = {"names": layout.names, "key": layout.key, "dp": (layout.dp_rank, layout.dp_size),
                      "main": layout.is_main, "main_rank": layout.main_rank,
                      "dp_group": dist.get_process_group_ranks(layout[DP].get_group()),
                      "tp_size": layout.size(TP), "loss_sum": layout.all_reduce(loss).item()}
        if layout.size(TP) > 1:
            out[label]["tp_group"] = dist.get_process_group_ranks(layout[TP].get_group())
    return out


def test_named_layouts_world4(run_dist):
    got = run_dist(4, _tp_layout)
    for r, g in enumerate(got):
        tp = g["dp x tp"]  # tp innermost: ranks 2k, 2k+1 hold two slices of the same layers
        assert tp["names"] == ("dp", "tp") and tp["key"] == f"dp{r // 2}_tp{r % 2}"
        assert tp["dp"] == (r // 2, 2) and tp["tp_group"] == [r - r % 2, r - r % 2 + 1]
        assert tp["dp_group"] == [r % 2, r % 2 + 2] and tp["main"] == (r == 0) and tp["main_rank"] == 0
        assert tp["loss_sum"] == 1 + 2  # each data shard's loss once, not once per tp rank
        hy = g["hybrid"]  # "dp" is the flattening of (replicate, shard): one group over both
        assert hy["names"] == ("replicate", "shard") and hy["key"] == f"replicate{r // 2}_shard{r % 2}"
        assert hy["dp"] == (r, 4) and hy["dp_group"] == [0, 1, 2, 3] and hy["tp_size"] == 1
        assert hy["loss_sum"] == 1 + 2 + 3 + 4
        both = g["hybrid x tp"]
        assert both["names"] == ("replicate", "shard", "tp") and both["key"] == f"replicate{r // 2}_shard0_tp{r % 2}"
        assert both["dp"] == (r // 2, 2) and both["dp_group"] == [r % 2, r % 2 + 2] and both["loss_sum"] == 3


def test_degrees_that_do_not_fit_name_their_setting():
    from minidist.mesh import ParallelDims
    names = {"tp": "strategy.tp_size", "shard": "strategy.shard_size"}
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(4, tp=3, settings=names)
    assert str(e.value) == "strategy.tp_size=3 must divide the 4 processes of the job; valid: 1, 2, 4"
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(8, tp=2, shard=3, hybrid=True, settings=names)
    assert str(e.value) == ("strategy.shard_size=3 must divide the 4 data-parallel ranks (8 processes / "
                            "strategy.tp_size=2); valid: 1, 2, 4")
    dims = ParallelDims.infer(8, tp=2, shard=-1)  # FSDP: every data-parallel rank shards
    assert (dims.replicate, dims.shard, dims.tp, dims.names, dims.shape) == (1, 4, 2, ("dp", "tp"), (4, 2))


def _pp_layouts() -> dict:
    from minidist.mesh import DP, PP, TP, ParallelDims
    runtime.init("gloo")
    out = {}
    for label, dims in (("pp x dp", ParallelDims.infer(4, pp=2)), ("pp x tp", ParallelDims.infer(4, pp=2, tp=2))):
        layout = dims.build("cpu")
        loss = torch.tensor([float(layout.dp_rank + 1)])
        out[label] = {"names": layout.names, "shape": dims.shape, "key": layout.key, "dp": (layout.dp_rank, layout.dp_size),
                      "pp_group": dist.get_process_group_ranks(layout[PP].get_group()), "main": layout.is_main,
                      "loss_sum": layout.all_reduce(loss).item(), "pp_sum": layout.all_reduce(torch.ones(1), (PP,)).item()}
        if layout.size(TP) > 1:
            out[label]["tp_group"] = dist.get_process_group_ranks(layout[TP].get_group())
        if layout.size(DP) > 1:
            out[label]["dp_group"] = dist.get_process_group_ranks(layout[DP].get_group())
    return out


def test_pipeline_dimension_is_outermost_world4(run_dist):
    for r, g in enumerate(run_dist(4, _pp_layouts)):
        dp = g["pp x dp"]  # pp outermost: a pipeline's stages are 2 apart, data-parallel replicas consecutive
        assert dp["names"] == ("pp", "dp") and dp["shape"] == (2, 2) and dp["key"] == f"pp{r // 2}_dp{r % 2}"
        assert dp["pp_group"] == [r % 2, r % 2 + 2] and dp["dp_group"] == [r - r % 2, r - r % 2 + 1]
        assert dp["dp"] == (r % 2, 2), "ranks that differ only in pp read the same data"
        assert dp["loss_sum"] == 1 + 2 and dp["pp_sum"] == 2 and dp["main"] == (r == 0)
        tp = g["pp x tp"]  # dp has one rank: every rank of the job reads the same batch
        assert tp["names"] == ("pp", "dp", "tp") and tp["shape"] == (2, 1, 2) and tp["dp"] == (0, 1)
        assert tp["pp_group"] == [r % 2, r % 2 + 2] and tp["tp_group"] == [r - r % 2, r - r % 2 + 1]


def test_a_pipeline_degree_that_does_not_fit_names_its_setting():
    from minidist.mesh import ParallelDims
    names = {"tp": "strategy.tp_size", "pp": "strategy.pp_size", "shard": "strategy.shard_size"}
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(8, pp=3, settings=names)
    assert str(e.value) == "strategy.pp_size=3 must divide the 8 processes of the job; valid: 1, 2, 4, 8"
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(8, tp=2, pp=8, settings=names)
    assert str(e.value) == "strategy.pp_size=8 must divide the 4 ranks (8 processes / strategy.tp_size=2); valid: 1, 2, 4"
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(8, tp=2, pp=2, shard=4, hybrid=True, settings=names)
    assert str(e.value) == ("strategy.shard_size=4 must divide the 2 data-parallel ranks (8 processes / "
                            "strategy.tp_size=2 / strategy.pp_size=2); valid: 1, 2")
    dims = ParallelDims.infer(8, tp=2, pp=2)
    assert (dims.pp, dims.dp, dims.world_size, dims.names) == (2, 2, 8, ("pp", "dp", "tp"))


def _cp_layout() -> dict:
    from minidist.mesh import CP, DP, DP_CP, ParallelDims
    runtime.init("gloo")
    out = {}
    for label, dims in (("dp x cp", ParallelDims.infer(4, cp=2)), ("cp x tp", ParallelDims.infer(4, cp=2, tp=2)),
                        ("hybrid x cp", ParallelDims.infer(4, cp=2, shard=2, hybrid=True))):
        layout = dims.build("cpu")
        out[label] = {"names": layout.names, "dp": (layout.dp_rank, layout.dp_size),
                      "cp_group": dist.get_process_group_ranks(layout[CP].get_group()),
                      "dp_group": dist.get_process_group_ranks(layout[DP].get_group()),
                      "dp_cp_group": dist.get_process_group_ranks(layout[DP_CP].get_group()),
                      "grad_sum": layout.all_reduce(torch.ones(1), over=(DP_CP,)).item()}
    plain = ParallelDims.infer(4).build("cpu")  # without cp, "dp_cp" is the data-parallel ranks
    out["no cp"] = dist.get_process_group_ranks(plain[DP_CP].get_group())
    return out


def test_cp_sits_between_data_parallelism_and_tp_world4(run_dist):
    for r, g in enumerate(run_dist(4, _cp_layout)):
        cp = g["dp x cp"]  # cp ranks read the same rows: dp_rank ignores cp
        assert cp["names"] == ("dp", "cp") and cp["dp"] == (r // 2, 2)
        assert cp["cp_group"] == [r - r % 2, r - r % 2 + 1] and cp["dp_group"] == [r % 2, r % 2 + 2]
        assert cp["dp_cp_group"] == [0, 1, 2, 3] and cp["grad_sum"] == 4  # gradients reduced over dp and cp
        both = g["cp x tp"]
        assert both["names"] == ("dp", "cp", "tp") and both["dp"] == (0, 1)
        assert both["cp_group"] == both["dp_cp_group"] == [r % 2, r % 2 + 2] and both["grad_sum"] == 2
        hybrid = g["hybrid x cp"]
        assert hybrid["names"] == ("replicate", "shard", "cp") and hybrid["dp_cp_group"] == [0, 1, 2, 3]
        assert g["no cp"] == [0, 1, 2, 3]


def test_a_cp_degree_that_does_not_fit_is_one_line():
    from minidist.mesh import ParallelDims
    with pytest.raises(ValueError) as e:
        ParallelDims.infer(8, tp=2, cp=3, settings={"cp": "strategy.cp_size", "tp": "strategy.tp_size"})
    assert str(e.value) == "strategy.cp_size=3 must divide the 4 ranks (8 processes / strategy.tp_size=2); valid: 1, 2, 4"
    assert ParallelDims.infer(8, tp=2, cp=2).shape == (2, 2, 2)
