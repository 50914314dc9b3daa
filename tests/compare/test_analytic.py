"""The call lists of minidist.compare.analytic against the closed forms, and the projection
against minidist.comm.cost's ring and tree formulas written out by hand."""

from __future__ import annotations

import math

import pytest

from minidist.comm import CostModel
from minidist.compare.analytic import Layout, busbw_factor, calls_by_op, plan, ring_bytes
from minidist.compare.projection import Profile, comm_time

EVEN = Layout(param_numels=(1200, 600, 600, 96), unit_numels=(96, 1200, 1200), bucket_numels=(1296, 1200))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_closed_forms_on_an_evenly_divisible_layout(n):
    s = 4 * EVEN.psi  # bytes; every unit and bucket divides by 2..16 (96, 1200, 1296 are multiples of 48)
    sent = {name: ring_bytes(plan(name, EVEN, n, grad_clip=False)) for name in
            ("ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "no_shard")}
    assert sent["ddp"] == 2 * s * (n - 1) // n
    assert sent["shard_grad_op"] == sent["ddp"] == sent["no_shard"]
    root = 4 * EVEN.unit_numels[0]  # the root (first) stays gathered into backward: one gather less
    assert sent["full_shard"] == (3 * s - root) * (n - 1) // n           # 1.5x DDP less the root's re-gather
    assert sent["zero1"] == sent["zero2"] == sent["ddp"]                # reduce_scatter + all_gather
    assert sent["zero1_broadcast"] == sent["ddp"] + s                   # + one broadcast of every share
    calls = calls_by_op(plan("full_shard", EVEN, n))
    assert calls == {"all_gather": 5, "reduce_scatter": 3, "all_reduce": 1}  # + the clip all_reduce


def test_padding_and_hybrid():
    lay = Layout(param_numels=(10, 7), unit_numels=(10, 7), bucket_numels=(17,))
    calls = plan("full_shard", lay, 3, grad_clip=False)
    assert [c.payload for c in calls if c.op == "reduce_scatter"] == [12 * 4, 9 * 4]  # padded to multiples of 3
    hybrid = plan("hybrid_shard", EVEN, 8, shard_size=4, grad_clip=False)
    ar = [c for c in hybrid if c.op == "all_reduce"]
    assert [c.group_size for c in ar] == [2, 2, 2] and [c.payload for c in ar] == [96, 1200, 1200]  # S_unit / G bytes
    assert ring_bytes(hybrid) == (3 * 4 * EVEN.psi - 4 * 96) * 3 // 4 + 2 * (4 * EVEN.psi // 4) // 2


def test_busbw_factors():
    assert busbw_factor("all_reduce", 8) == 2 * 7 / 8 and busbw_factor("all_gather", 8) == 7 / 8
    assert busbw_factor("broadcast", 8) == 1


def test_projection_reproduces_ring_and_tree_formulas():
    a, b = 5e-6, 1 / 50e9
    link = Profile("ib", a, 50e9)
    lay = Layout(param_numels=(1 << 20,), unit_numels=(1 << 20,), bucket_numels=(1 << 20,))
    s = 4 * (1 << 20)
    for n in (8, 64, 1024):
        lg = math.ceil(math.log2(n))
        ring = comm_time("ddp", lay, n, "ring", link, link, ranks_per_node=1)
        tree = comm_time("ddp", lay, n, "tree", link, link, ranks_per_node=1)
        assert ring == pytest.approx(2 * (n - 1) * a + 2 * s * (n - 1) / n * b, rel=1e-12)
        assert tree == pytest.approx(2 * lg * a + 2 * s * (n - 1) / n * b, rel=1e-12)
        fs = comm_time("full_shard", lay, n, "ring", link, link, ranks_per_node=1)
        # one unit, the root: gathered in forward and kept for backward (2 collectives, not 3)
        assert fs == pytest.approx(2 * ((n - 1) * a + s * (n - 1) / n * b) + 2 * (n - 1) * a + 2 * 4 * (n - 1) / n * b)
    # two tiers: hybrid_shard's shard group inside a node runs at the intra-node profile
    fast = Profile("nvlink", 1e-6, 400e9)
    hyb = comm_time("hybrid_shard", lay, 64, "ring", link, fast, ranks_per_node=8)
    cost_fast, cost_ib = fast.cost, CostModel(a, b)
    expect = (2 * cost_fast.predict("all_gather", s, 8) + cost_ib.predict("all_reduce", s // 8, 8)
              + cost_fast.predict("all_reduce", 4, 8))
    assert hyb == pytest.approx(expect)
