"""The layout planner: which dp x tp x pp x cp layouts of a GPT fit a cluster, ranked by projected step time.

    rows = plan(GPTModel.of_params(7.5e9, layers=32), Hardware("h100", nodes=16), global_batch=512, seq=4096)
    print(plan_table.table(rows, ...))       # python -m recipes.compare --plan plan.params=7.5e9 plan.nodes=16

Every number comes from the one place that owns it:

  memory     the strategy record's model states (zero_stage: ZeRO's (p + g + K) psi family at the run's
             precision), its engine's buffers instant by instant (the record's held(), minidist.footprint),
             activations by formula (minidist.memory.activations: Korthikanti et al. 2022 for minidist's
             GPT, with TP, SP, recompute, 1F1B's in-flight micro-batches, CP's s / cp); the peak of three
             instants (plan_memory.memory); checked against torch's allocator at 4 processes in
             tests/compare/test_plan.py
  comm       the record's calls for one step (minidist.compare.analytic.plan, TP's from minidist.tp.cost),
             each priced as NCCL would run it (minidist.compare.pricing: nccl.predict), with buckets
             sized by pricing.bucket_bytes; exposed after overlap as the projection's rule says (forward
             calls behind forward compute, backward calls behind the backward they can overlap, ZeRO's
             exchange after the step and TP's behind nothing)
  bubble     1F1B's (p-1)/(m+p-1) (minidist.pp.cost.bubble), m = micro-batches per replica, on the last
             stage's time (its blocks and the head: unequal stages, plan_time._stages)
  cp         the ring's bytes per layer (minidist.cp.cost.layer_bytes) over NVLink (or the NIC beyond a
             node), hidden behind each ring step's attention block where that is longer
  compute    model FLOPs 6 psi + 6 L s h per token (causal attention: half of 12 L s h), x 4/3 with
             full recompute, at the precision's dense peak (minidist.precision.PEAK_FLOPS) times
             `efficiency` (the share of peak the kernels reach; stated in every table)
  MFU        model FLOPs per GPU / (step time x peak).

Gradient accumulation: a replica's B / dp sequences run as m micro-batches of `micro_batch`; data
parallelism reduces once per step (behind the last micro-batch's backward), FSDP (zero_stage 3)
gathers and reduces every micro-batch. Not modelled: TP's and CP's compute inefficiency at small
slices, the head computed whole by every tp rank without vocab_parallel, NVLS/SHARP in-network
reduction, overlap of TP's calls (Megatron's), interleaved schedules, the host's own work.

On this machine (minidist.compare.hardware: gloo's calibrated alpha and beta, the GPT's emulated FLOP/s
as the peak) the planned order of step times is the measured one, each within 25%, and every planned
peak within 5% of torch's allocator, pipeline and context parallelism included (recipes.plan_check).

Modules, one concept each: plan_layout (the GPT by its shape, a layout, its engine), plan_memory
(the peak), plan_time (the step time), this one (the layouts tried, and the plan), plan_table (the
words and the table).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from minidist.compare.hardware import GB, Hardware
from minidist.compare.plan_layout import STRATEGIES, GPTModel, Layout
from minidist.compare.plan_memory import ROLES, memory  # noqa: F401 - ROLES: plan_table reads it here
from minidist.compare.plan_time import step
from minidist.precision import RunPrecision


def layouts(model: GPTModel, hw: Hardware, global_batch: int, seq: int, strategies_: tuple[str, ...] = STRATEGIES,
            recompute: tuple[str, ...] = ("none", "full")):
    """Every dp x tp x pp x cp of the cluster's GPUs the model and batch divide (tp within a node and the
    heads, pp the layers, cp the sequence), each strategy and recompute, micro-batches of powers of two."""
    n = hw.gpus
    twos = [2 ** k for k in range(int(math.log2(n)) + 1)]
    for tp, pp, cp in itertools.product(twos, twos, twos):
        if n % (tp * pp * cp) or tp > hw.gpus_per_node or model.heads % tp or model.layers % pp or seq % (2 * cp):
            continue
        dp = n // (tp * pp * cp)
        if global_batch % dp:
            continue
        for strategy, rc in itertools.product(strategies_, recompute):
            for mb in (b for b in twos if b <= global_batch // dp and (global_batch // dp) % b == 0):
                if pp == 1 or global_batch // (dp * mb) >= pp:  # 1F1B needs m >= p
                    yield Layout(dp, tp, pp, cp, strategy, rc, mb)


def plan(model: GPTModel, hw: Hardware, global_batch: int, seq: int, precision: RunPrecision | str = "bf16",
         efficiency: float = 0.5, **kw) -> tuple[list[dict], int]:
    """(rows of the layouts that fit, fastest first, each the largest micro-batch that fits; how many did not)."""
    fits: dict[Layout, dict] = {}
    tried: set[Layout] = set()
    for lay in layouts(model, hw, global_batch, seq, **kw):
        key = replace(lay, micro_batch=0)
        tried.add(key)
        mem = memory(model, lay, seq, precision, hw)
        if mem["total"] > hw.device_GB * GB:
            continue
        row = {"layout": lay, "memory": mem} | step(model, lay, seq, global_batch, precision, hw, efficiency)
        if key not in fits or row["step_s"] < fits[key]["step_s"]:
            fits[key] = row
    rows = sorted(fits.values(), key=lambda r: r["step_s"])
    return rows, len(tried) - len(rows)
