"""The planner's step time: compute, the exposed communication of every dimension, 1F1B's bubble.

The parts and where each number comes from are listed in minidist.compare.plan's docstring:
compute at a share of the dense peak, data parallelism's calls priced as NCCL runs them and
hidden behind the compute they overlap, TP's on the critical path, the pipeline's bubble and
point-to-point transfers, the cp ring's transfers not covered by attention.
"""

from __future__ import annotations

import types
from dataclasses import replace
from functools import lru_cache

from minidist.compare import pricing
from minidist.compare.analytic import TensorParallel, plan as plan_calls
from minidist.compare.hardware import Hardware
from minidist.compare.plan_layout import GPTModel, Layout, engine
from minidist.cp.cost import layer_bytes
from minidist.pp.cost import bubble as pp_bubble
from minidist.precision import RunPrecision
from minidist.strategies import Wire


def step(model: GPTModel, lay: Layout, seq: int, global_batch: int, precision: RunPrecision | str, hw: Hardware,
         efficiency: float = 0.5) -> dict:
    """Projected step time and its parts (module docstring), seconds."""
    p = RunPrecision(precision) if isinstance(precision, str) else precision
    record, cfg, world, group, shape = engine(model, lay, seq, p, hw)
    e, peak = p.compute_bytes, hw.peak(p)
    m = global_batch // (lay.dp * lay.micro_batch)  # micro-batches per replica
    tokens = global_batch * seq / hw.gpus  # per GPU, as MFU counts them
    model_flops = (6 * model.psi(seq) + 6 * model.layers * seq * model.hidden) * tokens
    compute = model_flops * (4 / 3 if lay.recompute == "full" else 1) / (peak * efficiency)
    fwd = compute / (4 if lay.recompute == "full" else 3)  # a backward is two forwards; recompute adds one
    bwd = compute - fwd
    # TP's calls scale with the micro-batch; nothing else here depends on it or on recompute
    calls_of = replace(lay, recompute="none", micro_batch=lay.micro_batch if lay.tp > 1 else 0)
    dp, crit = _priced(model, calls_of, seq, p, hw)
    per_mb = record.zero_stage == 3  # FSDP gathers and reduces every micro-batch
    reps = m if per_mb else 1
    window = 1 if per_mb else m  # DP's reduction hides behind the last micro-batch's backward only
    exposed_dp = (max(0.0, reps * dp["forward"] - fwd) + max(0.0, reps * dp["backward"] - bwd / window)
                  + dp["after"])
    tp_s = m * crit["critical"]
    bub = pp_bubble("1f1b", lay.pp, m) if lay.pp > 1 else 0.0
    pp_s = _pp_p2p(model, lay, seq, e, hw, m, compute / m) if lay.pp > 1 else 0.0
    cp_s = _cp_exposed(model, lay, seq, e, hw, peak * efficiency) * m if lay.cp > 1 else 0.0
    comm = tp_s + cp_s
    piped = _stages(compute, model.vocab * model.hidden / (model.psi(seq) + model.layers * seq * model.hidden),
                    lay.pp, m)
    step_s = piped + comm / (1 - bub) + exposed_dp + pp_s
    lat = reps * dp["latency_s"] + m * crit["latency_s"]
    bw = reps * dp["bandwidth_s"] + m * crit["bandwidth_s"]
    return {"step_s": step_s, "compute_s": compute, "exposed_dp_s": exposed_dp, "tp_s": tp_s, "cp_s": cp_s,
            "pp_p2p_s": pp_s, "bubble": bub, "bubble_s": piped - compute + comm * bub / (1 - bub), "microbatches": m,
            "mfu": model_flops / (step_s * peak), "bound": pricing.bound(lat, bw), "latency_share": lat / (lat + bw)
            if lat + bw else 0.0, "bucket_MiB": cfg.get("bucket_cap_mb")}


@lru_cache(maxsize=8192)
def _priced(model: GPTModel, lay: Layout, seq: int, p: RunPrecision, hw: Hardware) -> tuple[dict, dict]:
    """(data parallelism's calls, TP's critical ones) of one step, priced by phase (pricing.price's dicts; read
    only). A plan prices every layout with and without recompute, which changes no call: for the docs' 7.5B GPT
    on 64 GPUs, 3,584 step() calls price 1,484 distinct sets of calls."""
    record, cfg, world, group, shape = engine(model, lay, seq, p, hw)
    e = p.compute_bytes
    cap = cfg.get("bucket_cap_mb")  # null on the link: the engine's default, DDP's 25 MiB
    wire = Wire.even_buckets(shape.psi, int(cap * pricing.MIB) if cap else pricing.DEFAULT_BUCKET, e, e) \
        if "bucket_cap_mb" in cfg else Wire(itemsize=e)
    tp = None
    if lay.tp > 1:
        stage = types.SimpleNamespace(n_layer=model.layers // lay.pp, n_embd=model.hidden)
        tp = TensorParallel.of_gpt(stage, lay.micro_batch, seq // lay.cp, lay.tp, world,
                                   sequence_parallel=lay.sequence_parallel, vocab_parallel=lay.sequence_parallel,
                                   itemsize=e)
    calls = plan_calls(record, shape, lay.tp * world, wire, group=group, grad_clip=True, tp=tp)
    return (hw.price([c for c in calls if c.phase != "critical"]),
            hw.price([c for c in calls if c.phase == "critical"]))


def _stages(compute: float, head_share: float, p: int, m: int) -> float:
    """Seconds of 1F1B's compute over m micro-batches: the last stage's (its blocks and the head, a head_share
    of the model's FLOPs) m times, then the others' once each (fill and drain): C_last + (p - 1) C_mid / m, for
    C / (1 - bubble) with equal stages. The first stage's embedding is a lookup: no FLOPs."""
    if p == 1:
        return compute
    head = head_share * p * compute  # the replica's head, all on the last stage
    return compute + head * (p - 1) / p + (p - 1) * (compute - head / p) / m


def _pp_p2p(model: GPTModel, lay: Layout, seq: int, e: int, hw: Hardware, m: int, per_microbatch: float) -> float:
    """1F1B's transfers, b s h e / t bytes each (sequence-parallel slices), over the NIC (pp is outermost: on
    more than one node some boundary crosses) or NVLink: the fill and drain's 2 (p - 1) on the critical
    path, and in the steady state each micro-batch's two (forward and backward) where longer than its compute."""
    nbytes = lay.micro_batch * seq // lay.cp * model.hidden * e / lay.tp
    one = hw.send_s(nbytes, cross=hw.nodes > 1)
    return 2 * (lay.pp - 1) * one + m * max(0.0, 2 * one - per_microbatch)


def _cp_exposed(model: GPTModel, lay: Layout, seq: int, e: int, hw: Hardware, flops: float) -> float:
    """Per micro-batch: each ring step's k, v block transfer (one send: NVLink inside a node, the NIC beyond,
    or the calibrated link) not covered by that step's attention block."""
    fwd_bytes, bwd_bytes = layer_bytes(lay.micro_batch, seq, model.hidden // lay.tp, lay.cp, element_size=e)
    steps = lay.cp - 1
    cross = lay.tp * lay.cp > hw.gpus_per_node
    block_flops = 4 * lay.micro_batch * (seq / lay.cp) ** 2 * model.hidden / lay.tp / 2  # causal: about half
    per_layer = sum(max(0.0, hw.send_s(b / steps, cross) - k * block_flops / flops) * steps
                    for b, k in ((fwd_bytes, 1), (bwd_bytes, 2)))
    return per_layer * model.layers / lay.pp
