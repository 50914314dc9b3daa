"""Context-parallel rows of the comparison without a process group: the row syntax and its one-line
mistakes, and the ring's calls in the analytic column against minidist.cp.cost's formula. The measured
rows (trace, kernel) are checked in test_kernel_bytes.py (ddp+cp2 and full_shard+cp2 at N = 4)."""

from __future__ import annotations

import pytest

from minidist.cli.compose import ConfigError
from minidist.compare.analytic import ContextParallel, calls_by_op, closed_form, ring_bytes
from minidist.compare.rows import Row
from minidist.cp import Rotate, cost
from minidist.models.gpt import GPTConfig
from tests.compare.test_tp_rows import SMALL


def test_a_bad_cp_row_is_one_line_naming_strategies():
    from recipes.compare import compose
    for argv, world, expect in [
        (["strategies=[ddp+cp2]"], 3, "ddp+cp2 needs a world divisible by its cp degree, and this one has 3"),
        (["strategies=[ddp+cp1]"], 2, "ddp+cp1 not valid"),
        (["strategies=[ddp+cp4]", "model.block_size=12"], 4,
         "strategies: ddp+cp4's cp=4 must split model.block_size=12 into 8 chunks (zigzag); valid: 1, 2, 3, 6"),
        (["strategies=[ddp]", "strategy_options.ddp.cp_size=2"], 2, "e.g. strategies=[ddp+cp2]"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose(SMALL + argv, world=(world, world))
        assert "\n" not in str(info.value) and expect in str(info.value), str(info.value)
    assert Row.parse("full_shard+cp2") == Row("full_shard", cp=2) and Row.parse("ddp+tp2").cp == 1
    assert compose(SMALL + ["strategies=[ddp,ddp+cp2]"], world=(2, 2)).strategies == ["ddp", "ddp+cp2"]


@pytest.mark.parametrize("rotate", list(Rotate))
def test_the_rings_calls_send_what_cp_cost_says(rotate):
    """Built call by call (k and v in one message, a receive sending nothing), the same bytes as
    minidist.cp.cost's closed form, loss all_reduce included; C - 1 hops forward, 2 (C - 1) backward."""
    model = GPTConfig(n_layer=3, n_embd=32, n_head=4, block_size=16, vocab_size=64)
    cp = ContextParallel.of_gpt(model, 8, 16, 4, rotate.value)
    assert ring_bytes(cp.calls()) == pytest.approx(cost.step_bytes(model, 8, 16, 4, rotate))
    want = {"send": 3 * 9, "recv": 3 * 9, "all_reduce": 1} if rotate is Rotate.RING else \
        {"all_gather": 3, "reduce_scatter": 3, "all_reduce": 1}
    assert calls_by_op(cp.calls()) == want
    assert closed_form("full_shard", cp=cp).startswith({"ring": "6", "all_gather": "4"}[rotate.value] + "Lbshe")


def test_the_projection_prices_the_ring_of_a_cp_row():
    """At scale a +cp2 row pays the ring as point-to-point hops on the critical path (inside a node: NVLink's
    alpha + block / bandwidth per send, a receive nothing), runs the engine over all N ranks as its plain row
    does, and has no row where 2 does not divide N. At the same tokens per rank its memory is its plain row's (each
    rank holds as many tokens; what cp buys is sequences C times longer), within 0.1%."""
    from minidist.compare import at_scale, projection
    from minidist.compare.rows import row_strategy
    from minidist.recipes.compare import compose

    names = ["ddp", "ddp+cp2"]
    cfg = compose([f"strategies=[{','.join(names)}]", "projection.ranks=[6,8,64]"], estimate=True)
    p = cfg.projection
    subject = at_scale.subject(p, names, {s: row_strategy(cfg, s) for s in names})
    cluster = at_scale.gpu_clusters(p)[0]
    rows = projection.project([subject], [cluster], names, [6, 8, 64], [80.0, 141.0])
    by = {(r["strategy"], r["ranks"]): r for r in rows}
    assert ("ddp+cp2", 6) in by and all(n % 2 == 0 for s, n in by if s == "ddp+cp2")
    ring = subject.cp["ddp+cp2"]
    sends = [c for c in ring.calls() if c.op == "send"]
    assert len(sends) == 3 * p.layers and sends[0].payload == 2 * p.tokens_per_rank * round(
        (p.params / (12 * p.layers)) ** 0.5) * 2  # (k, v) of the rank's tokens, bf16
    hop = cluster.intra_alpha_s + sends[0].payload / cluster.intra_Bps
    for n in (8, 64):
        cp, plain = by["ddp+cp2", n], by["ddp", n]
        assert plain["comm_critical_s"] == 0.0
        assert cp["comm_critical_s"] == pytest.approx(len(sends) * hop, rel=1e-9)  # the loss's all_reduce: forward
        assert cp["comm_backward_s"] == pytest.approx(plain["comm_backward_s"])  # the engine over all N ranks
        assert cp["exposed_min_s"] >= cp["comm_critical_s"] > 0
        assert cp["memory_GB"] == pytest.approx(plain["memory_GB"], rel=1e-3)
