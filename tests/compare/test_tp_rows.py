"""Tensor-parallel rows of the comparison without a process group: the row syntax and its one-line
mistakes, the formula's composition (TP's calls from minidist.tp.cost inside consecutive ranks, the
strategy's over N / T strided ones) and how the projection prices it. The measured rows (trace, kernel,
memory) are checked in test_measure.py (ddp+tp2 at N = 2) and test_kernel_bytes.py (full_shard+tp2 at N = 4)."""

from __future__ import annotations

import types

import pytest

from minidist.cli.compose import ConfigError
from minidist.compare.analytic import TensorParallel, calls_by_op, closed_form, plan, ring_bytes
from minidist.compare.rows import Row
from minidist.compare.projection import Cluster, Subject, project
from minidist.models.gpt import GPTConfig
from minidist.shape import ModelShape
from minidist.strategies import Wire
from minidist.tp import cost

SMALL = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=8", "trainer.batch_size=2"]


def test_a_bad_tp_row_is_one_line_naming_strategies():
    from recipes.compare import compose
    for argv, world, expect in [
        (["strategies=[ddp+tp2]"], 3, "ddp+tp2 needs a world divisible by its tp degree, and this one has 3 ranks"),
        (["strategies=[ddp+tp4]"], 4, "strategies: ddp+tp4's tp=4 must divide model.n_head=2"),
        (["strategies=[ddp+tp1]"], 2, "ddp+tp1 not valid"),
        (["strategies=[ddp+tpx]"], 2, "ddp+tpx not valid"),
        (["strategies=[hybrid_shard+tp2]"], 4, "(T >= 2; not hybrid_shard)"),
        (["strategies=[ddp]", "strategy_options.ddp.tp_size=2"], 2, "name the degree in strategies"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose(SMALL + argv, world=(world, world))
        assert "\n" not in str(info.value) and expect in str(info.value), str(info.value)
        assert "strateg" in str(info.value)
    assert Row.parse("full_shard+tp2") == Row("full_shard", tp=2) and Row.parse("zero1") == Row("zero1")
    assert compose(SMALL + ["strategies=[ddp,ddp+tp2]"], world=(2, 2)).strategies == ["ddp", "ddp+tp2"]


def _gpt_tp(size: int, dp: int, **kw) -> TensorParallel:
    return TensorParallel.of_gpt(GPTConfig(n_layer=3, n_embd=32, n_head=4, block_size=16, vocab_size=64), 8, 16,
                                 size, dp, **kw)


def test_a_tp_rows_calls_are_tp_costs_plus_the_strategys_over_the_slices():
    lay = ModelShape(((1000,), (24,)), (1000, 24), (0, 1), unit_param_rows=(((100, 10),), ((24, 1),)))
    tp = _gpt_tp(2, 2, norm_dims=[("tp",), ()])
    calls = plan("ddp", lay, 4, tp=tp)
    tp_calls = [c for c in calls if c.phase == "critical"]
    assert all(c.group_size == 2 and c.ranks_spanned == 2 for c in tp_calls)  # consecutive ranks
    assert sorted((c.op, c.payload // 4) for c in tp_calls) == sorted(
        (op, numel) for (op, numel), k in cost.collectives(_gpt_cfg(), 8, 16).items() for _ in range(k))
    dp = [c for c in calls if c.phase == "backward"]  # DDP's bucket, over the 2 strided data-parallel ranks
    assert [(c.op, c.payload, c.group_size, c.ranks_spanned) for c in dp] == [("all_reduce", 4096, 2, 4)]
    assert [(c.op, c.group_size) for c in calls if c.phase == "after"] == [("all_reduce", 2)]  # the clip over tp
    tp_bytes = cost.step_bytes(_gpt_cfg(), 8, 16, 2)
    assert ring_bytes(calls) == tp_bytes + 2 * 4096 * 1 / 2 + 4 * 1 / 2 * 2
    assert closed_form("ddp", tp) == "8Lbshe(T-1)/T + 2S_T(D-1)/D"
    assert closed_form("full_shard", tp) == "8Lbshe(T-1)/T + (3S_T-S_root)(D-1)/D"
    assert closed_form("ddp", _gpt_tp(2, 1)) == "8Lbshe(T-1)/T"
    # pure TP (D = 1): DDP's reducer still calls its one-rank all_reduce, FSDP calls nothing
    assert calls_by_op(plan("ddp", lay, 2, tp=_gpt_tp(2, 1), grad_clip=False)) == {"all_reduce": 4 * 3 + 1}
    assert calls_by_op(plan("full_shard", lay, 2, tp=_gpt_tp(2, 1), grad_clip=False)) == {"all_reduce": 4 * 3}
    sp = _gpt_tp(2, 1, sequence_parallel=True)  # the same activation bytes, the norms' and biases' on top
    assert ring_bytes(plan("full_shard", lay, 2, tp=sp, grad_clip=False)) == cost.step_bytes(
        _gpt_cfg(), 8, 16, 2, sequence_parallel=True)


def _gpt_cfg() -> GPTConfig:
    return GPTConfig(n_layer=3, n_embd=32, n_head=4, block_size=16, vocab_size=64)


def test_the_projection_keeps_tp_in_a_node_and_never_hides_it():
    node = Cluster("node8", 8, 2e-6, 450e9, 8e-6, 50e9, 8)
    big = TensorParallel.of_gpt(types.SimpleNamespace(n_layer=8, n_embd=3200), 8, 2048, 8, 1)  # 8 x 1B / 8
    subj = Subject("1B", {"ddp": ModelShape.uniform(1e9, 8), "ddp+tp8": ModelShape.uniform(1e9 / 8, 8)}, 0.1, 0.2,
                   None, ("node8",), tp={"ddp+tp8": big},
                   wires={"ddp": Wire.even_buckets(1e9, 25 * 2**20), "ddp+tp8": Wire.even_buckets(1e9 / 8, 25 * 2**20)})
    rows = project([subj], [node], ["ddp", "ddp+tp8"], [4, 8, 16, 64], [80.0])
    tp = {r["ranks"]: r for r in rows if r["strategy"] == "ddp+tp8"}
    assert sorted(tp) == [8, 16, 64]  # 4 ranks cannot hold a tp group of 8
    assert not tp[8]["leaves_node"] and tp[16]["leaves_node"]  # TP inside the node, DDP across nodes
    assert tp[16]["comm_critical_s"] == tp[64]["comm_critical_s"] > 0  # TP's calls do not grow with the nodes
    assert all(not r["hides"] and r["exposed_min_s"] >= r["comm_critical_s"] for r in tp.values())
    ddp = {r["ranks"]: r for r in rows if r["strategy"] == "ddp"}
    assert ddp[64]["comm_critical_s"] == 0 and ddp[64]["hides"]  # DDP's all_reduce behind a 0.2 s backward
