"""The call lists the strategies' records plan (minidist.compare.analytic.plan) against the closed forms,
and the projection's cluster model written out by hand: ring or tree as NCCL picks, node and NIC
bandwidth, overlap windows."""

from __future__ import annotations

import math

import pytest

from minidist.compare.analytic import busbw_factor, calls_by_op, plan, ring_bytes
from minidist.compare.projection import HIDES, TREE_EFFICIENCY, Cluster, Subject, calibrated, call_time, project, verdicts
from minidist.shape import ModelShape
from minidist.strategies import Call, Wire

# units: the root (96 elements), then 1200 and 600 + 600; sizes only (each unit one flat buffer)
EVEN = ModelShape(unit_param_numels=((96,), (1200,), (600, 600)), param_numels=(1200, 600, 600, 96),
                  param_units=(1, 2, 2, 0))
BUCKETS = Wire(bucket_numels=(1296, 1200))
NODE = Cluster("dgx", 8, 2e-6, 450e9, 8e-6, 50e9, 8)  # 8 GPUs, NVLink 450 GB/s, 8 x 400 Gb/s


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_closed_forms_on_an_evenly_divisible_layout(n):
    s = 4 * EVEN.psi  # bytes; every unit and bucket divides by 2..16 (96, 1200, 1296 are multiples of 48)
    sent = {name: ring_bytes(plan(name, EVEN, n, BUCKETS, grad_clip=False)) for name in
            ("ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "no_shard")}
    assert sent["ddp"] == 2 * s * (n - 1) // n
    assert sent["shard_grad_op"] == sent["ddp"] == sent["no_shard"]
    root = 4 * EVEN.unit_numels[0]  # the root (first) stays gathered into backward: one gather less
    assert sent["full_shard"] == (3 * s - root) * (n - 1) // n           # 1.5x DDP less the root's re-gather
    assert sent["zero1"] == sent["zero2"] == sent["ddp"]                # reduce_scatter + all_gather: an all_reduce
    assert sent["zero1_broadcast"] == 3 * s * (n - 1) // n               # + broadcasts: N-1 of N ranks send each share
    calls = calls_by_op(plan("full_shard", EVEN, n, BUCKETS))
    assert calls == {"all_gather": 5, "reduce_scatter": 3, "all_reduce": 1}  # + the clip all_reduce


def test_padding_hybrid_phases_and_dtypes():
    lay = ModelShape(unit_param_numels=((10,), (7,)), param_numels=(10, 7), param_units=(0, 1))
    calls = plan("full_shard", lay, 3, grad_clip=False)
    assert [c.payload for c in calls if c.op == "reduce_scatter"] == [12 * 4, 9 * 4]  # padded to multiples of 3
    hybrid = plan("hybrid_shard", EVEN, 8, group=4, grad_clip=False)
    ar = [c for c in hybrid if c.op == "all_reduce"]
    assert [c.group_size for c in ar] == [2, 2, 2] and [c.payload for c in ar] == [96, 1200, 1200]  # S_unit / G bytes
    assert all(c.ranks_spanned == 8 for c in ar)  # a replica group holds one rank per shard group
    assert ring_bytes(hybrid) == (3 * 4 * EVEN.psi - 4 * 96) * 3 // 4 + 2 * (4 * EVEN.psi // 4) // 2
    phases = {(c.op, c.phase) for c in plan("full_shard", EVEN, 4) + plan("zero1_broadcast", EVEN, 4, BUCKETS)}
    assert phases == {("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward"),
                      ("all_reduce", "after"), ("all_reduce", "backward"), ("broadcast", "after")}
    zero = plan("zero2", EVEN, 4, BUCKETS)  # per bucket a reduce_scatter in backward, an all_gather after; the clip
    assert [(c.op, c.phase) for c in zero] == [("reduce_scatter", "backward"), ("all_gather", "after")] * 2 + [
        ("all_reduce", "after")]
    bf16 = Wire(BUCKETS.bucket_numels, itemsize=4, gather_itemsize=2)
    calls = plan("full_shard", EVEN, 4, bf16)
    ag, rs = (sum(c.payload for c in calls if c.op == op) for op in ("all_gather", "reduce_scatter"))
    assert ag == 2 * (2 * sum(EVEN.unit_numels) - 96) and rs == 4 * sum(EVEN.unit_numels)  # gathered bf16, reduced fp32


def test_busbw_factors():
    assert busbw_factor("all_reduce", 8) == 2 * 7 / 8 and busbw_factor("all_gather", 8) == 7 / 8
    assert busbw_factor("broadcast", 8) == 1


def test_inside_a_node_rings_run_on_the_fabric():
    s = 2**30
    for op, bw in (("all_reduce", 2 * s * 7 / 8), ("all_gather", s * 7 / 8), ("broadcast", s)):
        hops = 7 * (2 if op == "all_reduce" else 1)
        assert call_time(NODE, Call(op, s, 8)) == pytest.approx(hops * 2e-6 + bw / 450e9)
    assert call_time(NODE, Call("all_reduce", s, 8), "tree") > call_time(NODE, Call("all_reduce", s, 8))


def test_across_nodes_the_nics_set_the_bus_bandwidth_and_nccl_picks_ring_or_tree():
    s, n = 4 * 2**30, 1024
    ring = call_time(NODE, Call("all_reduce", s, n), "ring")
    # 128 nodes: 127 network hops per pass, the rest inside nodes; bus 8 x 50 GB/s = 400 GB/s
    assert ring == pytest.approx(2 * ((n - 1 - 127) * 2e-6 + 127 * 8e-6) + 2 * s * (n - 1) / n / 400e9)
    tree = call_time(NODE, Call("all_reduce", s, n), "tree")
    assert tree == pytest.approx(2 * (7 * 2e-6 + 7 * 8e-6) + 2 * s / (TREE_EFFICIENCY * 400e9))
    assert call_time(NODE, Call("all_reduce", s, n)) == min(ring, tree) == tree  # 1024 ranks: the tree's latency wins
    bucket = Call("all_reduce", 25 * 2**20, n)                                    # DDP's 25 MiB buckets too
    assert call_time(NODE, bucket) == call_time(NODE, bucket, "tree") < call_time(NODE, bucket, "ring") / 2
    two_nodes = Call("all_reduce", s, 16)                                         # few nodes, large: the ring
    assert call_time(NODE, two_nodes) == call_time(NODE, two_nodes, "ring") < call_time(NODE, two_nodes, "tree")
    # a hybrid replica group (one rank per node) gets one NIC's share: 8 x 50 GB/s / 8
    replica = Call("all_reduce", s, 128, span=1024)
    assert call_time(NODE, replica, "ring") == pytest.approx(2 * 127 * 8e-6 + 2 * s * 127 / 128 / 50e9)


def test_calibrated_is_this_machines_one_link():
    link = calibrated(5e-5, 1e-9)
    n, s = 64, 2**20
    assert call_time(link, Call("all_gather", s, n)) == pytest.approx((n - 1) * 5e-5 + s * (n - 1) / n * 1e-9)
    assert call_time(link, Call("all_reduce", s, n)) == pytest.approx(
        min(2 * (n - 1) * 5e-5 + 2 * s * (n - 1) / n * 1e-9, 2 * math.log2(n) * 5e-5 + 2 * s * 1e-9 / TREE_EFFICIENCY))


def test_a_calibrated_row_carries_the_fits_error():
    """t = A alpha + B beta: its sigma from the fit's (co)variances and its relative residual, by hand."""
    from minidist.compare.projection import comm_error
    link = calibrated(5e-5, 1e-9, 1e-5, 2e-10, -1e-16, 0.1)
    shape = ModelShape.uniform(1e6, 4)
    subject = Subject("m", {"ddp": shape}, 1.0, 2.0, clusters=("calibrated",))
    row = project([subject], [link], ["ddp"], [4], [80.0])[0]
    lat = sum(call_time(link, Call(c.op, 0, c.group_size)) for c in plan("ddp", shape, 4))  # the latency terms
    a, b = lat / 5e-5, (row["comm_s"] - lat) / 1e-9
    assert row["comm_err_s"] == pytest.approx(comm_error(link, lat, row["comm_s"])) == pytest.approx(math.sqrt(
        (a * 1e-5) ** 2 + (b * 2e-10) ** 2 + 2 * a * b * -1e-16 + (0.1 * row["comm_s"]) ** 2))
    assert "±" in verdicts([row], [80.0])[0]
    assert project([subject], [calibrated(5e-5, 1e-9)], ["ddp"], [4], [80.0])[0]["comm_err_s"] == 0


def test_verdicts_follow_each_strategys_window():
    """DDP hides behind backward only; ZeRO-1's parameter all_gather (after step) behind nothing; FSDP's gathers
    behind forward too."""
    rows = ("ddp", "zero1", "full_shard")
    subj = Subject("1B", {s: ModelShape.uniform(1e9, 16) for s in rows}, forward_s=0.05, backward_s=0.1,
                   memory=lambda s, n, group: 16e9 / (group if s == "full_shard" else 1), clusters=("dgx",),
                   wires={s: Wire.even_buckets(1e9, 25 * 2**20) for s in rows})
    rows = project([subj], [NODE], ["ddp", "zero1", "full_shard"], [8, 64], [80.0, 141.0])
    by = {(r["strategy"], r["ranks"]): r for r in rows}
    ddp = by["ddp", 64]
    assert ddp["comm_forward_s"] == 0 and ddp["comm_after_s"] == 0
    assert ddp["exposed_min_s"] == pytest.approx(max(0.0, ddp["comm_backward_s"] - 0.1))
    zero = by["zero1", 64]
    assert zero["comm_after_s"] > 0 and zero["exposed_min_s"] >= zero["comm_after_s"] and not zero["hides"]
    fs = by["full_shard", 64]
    assert fs["comm_forward_s"] > 0 and fs["hides"] == (fs["exposed_min_s"] <= HIDES * 0.15)
    assert by["ddp", 8]["leaves_node"] is False and by["ddp", 64]["leaves_node"] is True
    assert by["ddp", 64]["fits_80GB"] and not by["full_shard", 8]["memory_GB"] > 80
    text = "\n".join(verdicts(rows, [80.0, 141.0]))
    assert "zero1" in text and "never" in text and all(len(line) <= 120 for line in text.splitlines())
