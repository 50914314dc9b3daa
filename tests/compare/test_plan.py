"""The layout planner (minidist.compare.plan): its memory against torch's allocator at 4 processes (the pool),
its ranking, fits and parts at scale by their own definitions, and the bucket rule (minidist.compare.pricing)."""

from __future__ import annotations

import pytest

from minidist.comm.nccl_graphs import HopperNode
from minidist.compare import pricing
from minidist.compare.plan import GB, GPTModel, Hardware, Layout, memory, plan, step
from minidist.compare.plan_table import table, why
from minidist.pp.cost import bubble
from minidist.strategies import Call
from recipes import plan_check as check


def test_planned_memory_within_5_percent_of_the_allocator_at_4_processes(run_dist):
    """ZeRO-2, FSDP, DDP x TP2 with SP, FSDP x TP2, dp2 x cp2 and dp2 x pp2 (1F1B) at 4 processes
    (recipes.plan_check: the docs' numbers). FSDP's peak holds gloo's staging of a gather or not, as the
    gather's timing falls: each measured peak is within 5% of the plan for the outcome it shows."""
    per_rank = run_dist(4, check.peaks, check.memory_overrides(), timeout=300)
    for row, (planned, in_flight, measured) in check.memory_vs_plan(per_rank).items():
        for m in measured:
            p = check.planned_for(planned, in_flight, m)
            print(f"\n{row}: planned {p / 1e6:.3f} MB, measured {m / 1e6:.3f} MB ({p / m - 1:+.1%})")
            assert p == pytest.approx(m, rel=0.05), (row, planned, in_flight, m)


@pytest.mark.alone
def test_planned_step_times_order_and_match_measured_under_emulated_compute(run_dist):
    """Four layouts at 4 processes whose planned step times differ by TP's calls and the bubble: the planner, told
    this machine's rates (the emulated FLOP/s; gloo's alpha and beta from comm.calibrate), ranks them as measured,
    each planned time within 25% of the measured median (the slowest rank's, per step)."""
    per_rank = run_dist(4, check.step_times, check.time_overrides(), timeout=300)
    times = check.times_vs_plan(per_rank)
    print("\n" + check.table(times, {}, per_rank[0]["link"]))
    planned, measured = ({row: t[i] for row, t in times.items()} for i in (0, 1))
    for a in times:  # the order of every pair the plan separates by more than 10% (dp4 and dp2 x tp2 are ~3%
        for b in times:  # apart in the plan: their order is the machine's noise, not the planner's claim)
            if planned[a] < planned[b] / 1.1:
                assert measured[a] < measured[b], (a, b, times)
    for row, (p, m) in times.items():
        assert p == pytest.approx(m, rel=0.25), (row, p, m)


MODEL = GPTModel.of_params(7.5e9, layers=32)


def test_the_plan_at_scale_fits_ranks_and_explains():
    hw = Hardware("h100", nodes=1)
    rows, rejected = plan(MODEL, hw, global_batch=16, seq=4096, strategies_=("ddp", "zero1", "full_shard"))
    assert rows and rejected > 0
    assert [r["step_s"] for r in rows] == sorted(r["step_s"] for r in rows)
    assert all(r["memory"]["total"] <= 80 * GB for r in rows)
    assert not any(r["layout"].strategy == "ddp" and r["layout"].tp == 1 and r["layout"].pp == 1 for r in rows)
    for r in rows:  # the parts by their own definitions
        lay = r["layout"]
        assert 0 < r["mfu"] <= 0.5 + 1e-9 and why(r) and r["bound"] in ("latency", "bandwidth", "-")
        assert r["bubble"] == (bubble("1f1b", lay.pp, r["microbatches"]) if lay.pp > 1 else 0.0)
        assert r["step_s"] >= r["compute_s"]
    out = table(rows, rejected, hw, "bf16", 0.5)
    assert "bf16 with fp32 masters" in out and "50% of the 989 TFLOP/s" in out


def test_memory_follows_the_records_and_the_activation_formula():
    lay = Layout(dp=32, strategy="ddp", micro_batch=1)
    ddp = memory(MODEL, lay, 4096, "bf16")
    psi = MODEL.psi(4096)
    assert ddp["parameters"] + ddp["optimizer"] == pytest.approx(14 * psi)  # p = 2, K = 12; g after backward
    full = memory(MODEL, Layout(dp=32, strategy="full_shard", micro_batch=1), 4096, "bf16")
    assert full["optimizer"] == pytest.approx(12 * psi / 32)
    recompute = memory(MODEL, Layout(dp=32, strategy="full_shard", recompute="full", micro_batch=1), 4096, "bf16")
    assert recompute["activations"] < full["activations"] / 4
    assert memory(MODEL, Layout(dp=8, tp=4, strategy="full_shard", micro_batch=1), 4096, "fp32")["activations"] > \
        memory(MODEL, Layout(dp=8, tp=4, strategy="full_shard", micro_batch=1), 4096, "bf16")["activations"] * 1.9
    slow = step(MODEL, Layout(dp=32, strategy="zero1", micro_batch=1), 4096, 32, "fp32", Hardware(nodes=4))
    fast = step(MODEL, Layout(dp=32, strategy="zero1", micro_batch=1), 4096, 32, "bf16", Hardware(nodes=4))
    assert slow["compute_s"] / fast["compute_s"] == pytest.approx(989.4 / 66.9)  # one precision, compute too


def test_bucket_rule_amortises_latency_as_ranks_grow():
    node = HopperNode()
    sizes = [pricing.bucket_bytes(node, n) for n in (8, 64, 1024)]
    assert sizes == sorted(sizes) and sizes[0] >= pricing.DEFAULT_BUCKET and sizes[-1] > sizes[0]
    for n, size in zip((8, 64), sizes):  # below the cap, the rule's own condition holds, and fails one size down
        c = pricing.choice(node, Call("reduce_scatter", size, n))
        assert c.latency_s <= pricing.LATENCY_SHARE * c.seconds
        if size > pricing.DEFAULT_BUCKET:
            half = pricing.choice(node, Call("reduce_scatter", size // 2, n))
            assert half.latency_s > pricing.LATENCY_SHARE * half.seconds
    small = pricing.price(node, [Call("reduce_scatter", 1 << 20, 1024)] * 3)
    assert pricing.bound(small["latency_s"], small["bandwidth_s"]) == "latency"


def test_the_projection_counts_activations_at_the_runs_precision_and_sizes_buckets():
    """The 7.5B GPT at 8192 tokens per rank in bf16 (the issue's case): DDP's 16 psi + activations fit no device,
    ZeRO-1 not 80 GB at 8 ranks; ZeRO's buckets grow with the ranks, so its calls are bandwidth-bound at 1024."""
    from minidist.compare import at_scale, projection
    from minidist.compare.rows import row_strategy
    from minidist.recipes.compare import compose

    cfg = compose(["strategies=[ddp,zero1]", "projection.ranks=[8,1024]"], estimate=True)
    p = cfg.projection
    subject = at_scale.subject(p, ["ddp", "zero1"], {s: row_strategy(cfg, s) for s in ("ddp", "zero1")})
    rows = projection.project([subject], at_scale.gpu_clusters(p)[:1], ["ddp", "zero1"], [8, 1024], [80.0, 141.0])
    by = {(r["strategy"], r["ranks"]): r for r in rows}
    assert by["ddp", 8]["memory_GB"] > 141 and not by["ddp", 8]["fits_141GB"]
    assert 80 < by["zero1", 8]["memory_GB"] < 141
    psi = p.params
    assert by["ddp", 8]["memory_GB"] > (16 * psi + 30e9) / 1e9  # states and activations of 8192 tokens
    assert by["zero1", 1024]["bucket_MiB"] > 4 * by["zero1", 8]["bucket_MiB"] >= 4 * 25
    assert by["zero1", 1024]["bound"] == "bandwidth" and by["zero1", 1024]["comm_s"] < 3 * by["ddp", 1024]["comm_s"]
    assert subject.name.endswith("bf16")
