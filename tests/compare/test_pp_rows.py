"""Pipeline rows of the comparison without a process group: the row grammar and its one-line mistakes, the
pipeline's messages in the analytic column against minidist.pp.cost's formula, and how `--estimate` and the
projection price a +pp row (and a +cp row: neither dropped nor priced as its plain row). The measured rows
(trace, kernel, the bubble from the pipeline's timeline) are checked in test_kernel_bytes.py (ddp+pp2 and
full_shard+pp2 at N = 4, dp 2 x pp 2)."""

from __future__ import annotations

import types

import pytest

from minidist.cli.compose import ConfigError
from minidist.compare.analytic import PipelineParallel, calls_by_op, closed_form, ring_bytes
from minidist.compare.rows import Row
from minidist.pp import cost
from tests.compare.test_tp_rows import SMALL

PP = ["model.n_layer=2", "model.n_embd=16", "model.n_head=2", "model.block_size=8", "trainer.batch_size=2"]


def test_the_row_grammar_and_a_bad_pp_row_is_one_line():
    from recipes.compare import compose
    assert Row.parse("full_shard+pp2") == Row("full_shard", pp=2) and Row.parse("ddp+pp4").degrees == {"pp_size": 4}
    assert Row.parse("ddp").degrees == {} and Row.parse("ddp+cp2").dim == "cp" and Row.parse("x+yy2") == Row("x+yy2")
    for argv, world, expect in [
        (["strategies=[ddp+pp2]"], 3, "ddp+pp2 needs a world divisible by its pp degree, and this one has 3"),
        (["strategies=[ddp+pp1]"], 2, "ddp+pp1 not valid"),
        (["strategies=[ddp+pp4]"], 4, "strategies: ddp+pp4: strategy.pp_size=4 x pp_virtual=1 = 4 stages must "
                                      "divide model.n_layer=2"),
        (["strategies=[ddp+pp2]", "pp_microbatches=3"], 2, "pp_microbatches=3 must divide the 4 sequences a pipeline shares"),
        (["strategies=[ddp]", "strategy_options.ddp.pp_size=2"], 2, "e.g. strategies=[ddp+pp2]"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose(PP + argv, world=(world, world))
        assert "\n" not in str(info.value) and expect in str(info.value), str(info.value)
    cfg = compose(PP + ["strategies=[ddp,ddp+pp2]"], world=(2, 2))
    assert cfg.strategies == ["ddp", "ddp+pp2"] and cfg.pp_microbatches == 4


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2)])
def test_the_pipelines_messages_send_what_pp_cost_says(schedule, v):
    """Read from the schedule's own action lists, one message per SEND (a receive sends nothing): the mean over the
    P ranks is minidist.pp.cost.step_bytes, 2 m (b/m) s h e (S - 1) / P; each boundary carries 2 m messages."""
    model = types.SimpleNamespace(n_layer=4, n_embd=32)
    pp = PipelineParallel.of_gpt(model, 8, 16, 2, 3, schedule, 4, v)
    assert pp.message == 2 * 16 * 32 * 4 and pp.span == 6
    per_rank = [ring_bytes(pp.p2p(r)) for r in range(2)]
    sched = types.SimpleNamespace(num_stages=2 * v, microbatches=4, pp=2)
    assert sum(per_rank) / 2 == pytest.approx(cost.step_bytes(sched, 2 * 16 * 32, 4))
    assert calls_by_op(pp.p2p(0)) == {"send": 4 * (2 * v - 1), "recv": 4 * (2 * v - 1)}
    assert pp.bubble() == pytest.approx(1 / (v * 4 + 1))
    term = "2bshe(P-1)/P" if v == 1 else "2bshe(vP-1)/P"
    assert closed_form("full_shard", pp=pp) == f"{term} + (3S_P-S_root)(D-1)/D"


def test_estimate_prices_pp_and_cp_rows_by_the_planners_formula(capsys):
    """--estimate tabulates a +pp and a +cp row (each rank's stage, or its tokens, by the planner's formula) and,
    from a bare parameter count, a stage's states as psi/P over D = N / P ranks."""
    from recipes.compare import main
    main(["--estimate", "estimate.worlds=[2,3,4]", "strategies=[ddp,ddp+pp2,ddp+cp2]", *SMALL[:4],
          "model.n_layer=2", "optim=adamw"])
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["ddp+pp2"][2] == "-" and rows["ddp+cp2"][2] == "-" and "(formula)" in " ".join(rows["ddp+pp2"])
    pp2, plain = float(rows["ddp+pp2"][0]), float(rows["ddp+cp2"][0])
    assert 0 < pp2 < plain  # half the blocks' states per rank
    main(["--estimate", "estimate.params=7.5e9", "estimate.worlds=[8,64]", "strategies=[full_shard,full_shard+pp2]"])
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:] if "+" in line[:20]
            or line.startswith("full_shard ")}
    assert float(rows["full_shard+pp2"][-1]) == pytest.approx(float(rows["full_shard"][-1]) * 2 / 2, rel=0.05)


def test_the_projection_prices_a_pipeline_and_a_ring():
    """At scale a +pp2 row keeps its rows (every N that 2 divides), pays the fill and drain's 2 (P-1) hops (over
    NVLink inside a node, the NIC once the pipeline spans nodes) and its bubble as time, (P-1)/(m+P-1) of the
    compute; its engine runs over N / 2 ranks on half the layers (half the gradient bytes per rank), and its
    stage's memory is below the plain row's. A +cp2 row pays its ring on the critical path. Neither is priced
    as its plain row."""
    from minidist.compare import at_scale, projection
    from minidist.compare.rows import row_strategy
    from minidist.recipes.compare import compose

    names = ["ddp", "ddp+pp2", "ddp+cp2"]
    cfg = compose([f"strategies=[{','.join(names)}]", "projection.ranks=[6,8,64]"], estimate=True)
    p = cfg.projection
    subject = at_scale.subject(p, names, {s: row_strategy(cfg, s) for s in names}, cfg.pp_microbatches)
    cluster = at_scale.gpu_clusters(p)[0]
    rows = projection.project([subject], [cluster], names, [6, 8, 64], [80.0, 141.0])
    by = {(r["strategy"], r["ranks"]): r for r in rows}
    assert {s for s, _ in by} == set(names) and ("ddp+pp2", 6) in by
    pipe = subject.pp["ddp+pp2"]
    width = round((p.params / (12 * p.layers)) ** 0.5)
    assert pipe.message == 2 * p.tokens_per_rank * width * 2 // cfg.pp_microbatches  # bf16, P x tokens over m
    compute = by["ddp", 8]["forward_s"] + by["ddp", 8]["backward_s"]
    for n, alpha, bw in ((8, cluster.intra_alpha_s, cluster.intra_Bps),
                         (64, cluster.net_alpha_s, cluster.nic_Bps * cluster.nics_per_node / cluster.gpus_per_node)):
        pp, plain, cp = by["ddp+pp2", n], by["ddp", n], by["ddp+cp2", n]
        hop = alpha + pipe.message / bw
        assert pp["pp_p2p_s"] >= 2 * hop and pp["exposed_min_s"] >= pp["pp_p2p_s"] > 0
        assert pp["bubble"] == pytest.approx(1 / 5) and pp["bubble_s"] == pytest.approx(compute / 4)
        assert pp["comm_backward_s"] < plain["comm_backward_s"]  # half the gradients, over N / 2 ranks
        assert pp["memory_GB"] < plain["memory_GB"]
        assert plain["bubble"] == plain["pp_p2p_s"] == plain["comm_critical_s"] == 0.0
        assert cp["comm_critical_s"] > 0 and cp["bubble"] == 0.0
    verdict = "\n".join(projection.verdicts(rows, [80.0, 141.0]))
    assert "bubble 0.20" in verdict
