"""Bytes measured, not only modelled: for every engine, what the kernel counted each process writing
to gloo's sockets (/proc/self/io) agrees with the trace within 1% per step, at N = 2 and N = 4.

A broadcast (the owner-broadcast variant's parameter exchange) is sent by N-1 of the N ranks: the
trace counts the mean over ranks, S(N-1)/N, so the comparison is of means over ranks; the other
engines' collectives send the same on every rank, so there it holds rank by rank too. The paper's
ZeRO-1 and ZeRO-2 (reduce_scatter + all_gather) move DDP's bytes; the owner-broadcast variant 1.5x."""

from __future__ import annotations

import types

import pytest

from minidist import pp
from minidist.comm import kernel_io
from minidist.compare.report import terminal
from minidist.cp import cost
from tests.compare.test_measure import STRATEGIES, TINY, WORLD_2, compare_rows

pytestmark = pytest.mark.skipif(not kernel_io.available(), reason="needs Linux /proc/self/io")
ENGINES = ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "full_shard+tp2", "ddp+cp2",
           "full_shard+cp2", "ddp+pp2", "full_shard+pp2"]
"""At N = 4 full_shard+tp2 is dp 2 x tp 2: TP's all_reduces and FSDP's calls on the slices (compare/analytic.py);
ddp+cp2 and full_shard+cp2 are dp 2 x cp 2: the ring's messages (minidist.cp.cost) and the engine's calls over
all 4 ranks; ddp+pp2 and full_shard+pp2 are dp 2 x pp 2 (1F1B, m = 4): the pipeline's messages (minidist.pp.cost)
and each stage's engine over its 2 data-parallel ranks (the first and last stage send different bytes: per rank,
the stages differ; the mean over ranks is checked)."""


@pytest.mark.parametrize("world", [2, 4])
def test_kernel_and_trace_agree_within_1_percent(run_dist, world):
    if world == 2:  # the world-2 comparison of test_measure.py (run once per session)
        _, _, per_strategy, rows = compare_rows(run_dist, 2, WORLD_2, STRATEGIES)
    else:
        # bytes only, no memory: one step of 8 sequences per rank, not 32 (6 s -> 4 s on 2 cores). DP engines'
        # bytes do not depend on the batch; TP's activations shrink with it while its per-call overhead stays:
        # kernel/trace - 1 for full_shard+tp2 is 0.15% at 32, 0.48% at 8, 0.77% at 4 (the others' <= 0.55%)
        overrides = [o for o in TINY if not o.startswith(("steps", "replay_repeats", "trainer.batch_size"))] + [
            "steps=1", "replay_repeats=1", "trainer.batch_size=8"]
        _, _, per_strategy, rows = compare_rows(run_dist, world, overrides, ENGINES, memory=False)
    for raws, row in zip(per_strategy, rows):
        b = row["bytes"]
        assert b["trace"] == pytest.approx(b["formula"]), row["strategy"]  # TP (CP) rows too: tp.cost (cp.cost) + FSDP's
        assert b["wire"] == b["trace"], row["strategy"]  # on gloo minidist's ring reduce_scatter: no extra bytes
        assert abs(b["kernel"] / b["trace"] - 1) <= 0.01, (row["strategy"], world, b["kernel"], b["trace"])
        if row["strategy"] != "zero1_broadcast" and not row["pp"]:
            for k in b["kernel_per_rank"]:
                assert abs(k / b["trace"] - 1) <= 0.01, (row["strategy"], world, b["kernel_per_rank"], b["trace"])
    kernel = {r["strategy"]: r["bytes"]["kernel"] for r in rows}
    assert kernel["zero1"] / kernel["ddp"] == pytest.approx(1.0, rel=0.02)  # the paper's: DDP's bytes
    assert kernel["zero2"] / kernel["ddp"] == pytest.approx(1.0, rel=0.02)
    assert kernel["zero1_broadcast"] / kernel["ddp"] == pytest.approx(1.5, rel=0.01)  # issue 16 measured 1.50x
    if world == 4:  # the ring's bytes on top of DDP's: the analytic column's calls against minidist.cp.cost's
        ring = cost.step_bytes(types.SimpleNamespace(n_layer=4, n_embd=64), 8 * 2, 32, 2)  # TINY, 8 rows x cp 2
        by = {r["strategy"]: r for r in rows}
        assert by["ddp+cp2"]["bytes"]["formula"] - by["ddp"]["bytes"]["formula"] == pytest.approx(ring)
        assert by["ddp+cp2"]["closed_form"] == "6Lbshe(C-1)/C + 2S(N-1)/N"
        assert kernel["ddp+cp2"] - kernel["ddp"] == pytest.approx(ring, rel=0.02)  # and the kernel saw them
        _check_pipeline_rows(per_strategy, rows)


def _check_pipeline_rows(per_strategy, rows) -> None:
    """The pipeline's messages as traced: minidist.pp.cost's 2 m (b/m) s h e per boundary (16 sequences of 32 tokens
    of width 64 per pipeline, m = 4) plus the tied embedding's gradient to its twin (its copy on each end); the
    bubble measured from the runtime's timeline printed beside (P-1)/(m+P-1) = 0.20."""
    sched = pp.build("1f1b", 2, 4)
    for raws, row in zip(per_strategy, rows):
        if not row["pp"]:
            continue
        sent = sum(r["sent_bytes"] for raw in raws for r in raw["records"] if r["op"] == "send") / len(raws)
        ties = sum(raw["pp"]["tie_bytes"] for raw in raws) / len(raws)
        assert sent - ties == pp.cost.step_bytes(sched, 16 // 4 * 32 * 64, 4), row["strategy"]
        b = row["pp"]["bubble"]
        assert b["formula"] == pytest.approx(0.2) and 0 < b["measured"] < 1 and len(b["per_rank"]) == 2
        assert f"({b['formula']:.2f})" in terminal([row], 1.0)
