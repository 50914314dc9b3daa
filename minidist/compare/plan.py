"""The layout planner: which dp x tp x pp x cp layouts of a GPT fit a cluster, ranked by projected step time.

    rows = plan(GPTModel.of_params(7.5e9, layers=32), Hardware("h100", nodes=16), global_batch=512, seq=4096)
    print(plan_table.table(rows, ...))       # python -m recipes.compare --plan plan.params=7.5e9 plan.nodes=16

Every number comes from the one place that owns it:

  memory     the strategy record's model states (zero_stage: ZeRO's (p + g + K) psi family at the run's
             precision), its engine's buffers instant by instant (the record's held(), minidist.footprint),
             activations by formula (minidist.memory.activations: Korthikanti et al. 2022 for minidist's
             GPT, with TP, SP, recompute, 1F1B's in-flight micro-batches, CP's s / cp); the peak of three
             instants (memory()); checked against torch's allocator at 4 processes in tests/compare/test_plan.py
  comm       the record's calls for one step (minidist.compare.analytic.plan, TP's from minidist.tp.cost),
             each priced as NCCL would run it (minidist.compare.pricing: nccl.predict), with buckets
             sized by pricing.bucket_bytes; exposed after overlap as the projection's rule says (forward
             calls behind forward compute, backward calls behind the backward they can overlap, ZeRO's
             exchange after the step and TP's behind nothing)
  bubble     1F1B's (p-1)/(m+p-1) (minidist.pp.cost.bubble), m = micro-batches per replica, on the last
             stage's time (its blocks and the head: unequal stages, _stages)
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
"""

from __future__ import annotations

import itertools
import math
import types
from dataclasses import dataclass, fields as fields_of, replace
from functools import lru_cache

from minidist import strategies
from minidist.compare import pricing
from minidist.compare.analytic import TensorParallel, plan as plan_calls
from minidist.compare.hardware import GB, Hardware
from minidist.cp.cost import layer_bytes
from minidist.footprint import OptimizerModel
from minidist.memory.activations import GPTShape, Parallelism, activation_bytes
from minidist.pp.cost import bubble as pp_bubble
from minidist.precision import RunPrecision
from minidist.shape import ModelShape
from minidist.strategies import Wire
from minidist.strategies.ddp import DDP_RECORD
from minidist.strategies.fsdp import FULL_SHARD, HYBRID_SHARD
from minidist.strategies.zero import ZERO1, ZERO2

STRATEGIES = tuple(r.name for r in (DDP_RECORD, ZERO1, ZERO2, FULL_SHARD, HYBRID_SHARD))
"""The engines a plan tries, one per ZeRO stage and HSDP (their records: minidist.strategies)."""
ROLES = ("parameters", "gradients", "optimizer", "buffers", "activations")


@dataclass(frozen=True)
class GPTModel:
    """minidist's GPT by its shape: L blocks of width h (12 h^2 + 13 h parameters each), a tied V x h
    embedding, learned positions for `seq` tokens and the final norm (the root unit)."""

    layers: int
    hidden: int
    heads: int
    vocab: int = 50304

    @classmethod
    def of_params(cls, psi: float, layers: int, heads: int | None = None, vocab: int = 50304) -> "GPTModel":
        """The GPT of about psi parameters with `layers` blocks: 12 L h^2 + V h = psi, h rounded to 128; heads
        (unless given) the power of two nearest below h / 128, at most 128, so that every tp up to it divides them."""
        h = (-vocab + math.sqrt(vocab ** 2 + 48 * layers * psi)) / (24 * layers)
        h = max(128, round(h / 128) * 128)
        return cls(layers, h, heads or min(128, 2 ** int(math.log2(h // 128))), vocab)

    @classmethod
    def of_config(cls, cfg) -> "GPTModel":
        return cls(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size)

    def psi(self, seq: int) -> int:
        return self.layers * self.block() + self.root(seq)

    def block(self, tp: int = 1) -> int:
        return (12 * self.hidden ** 2 + 13 * self.hidden) // tp

    def root(self, seq: int, tp: int = 1, vocab_parallel: bool = False) -> int:
        return self.vocab * self.hidden // (tp if vocab_parallel else 1) + seq * self.hidden + 2 * self.hidden

    def shape(self, seq: int, tp: int, pp: int, vocab_parallel: bool, itemsize: int) -> ModelShape:
        """One rank's slice as FSDP units: the root, then the stage's L / pp blocks."""
        units = (self.root(seq, tp, vocab_parallel),) + (self.block(tp),) * (self.layers // pp)
        return ModelShape(tuple((u,) for u in units), units, tuple(range(len(units))), itemsize)


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    strategy: str = DDP_RECORD.name
    recompute: str = "none"
    micro_batch: int = 1
    """Sequences per micro-batch on each replica."""
    sequence_parallel: bool = True
    """With tp > 1: sequence parallelism (Megatron's), and the vocabulary split (vocab_parallel) too."""

    @property
    def name(self) -> str:
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} {self.strategy}"
                f"{' +recompute' if self.recompute != 'none' else ''} mb{self.micro_batch}")


def _engine(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision, hw: Hardware):
    """(record, its config with the bucket rule's size, the data-parallel ranks, the state group, rank shape)."""
    return _engine_of(model, replace(lay, micro_batch=0, recompute="none"), seq, precision, hw)


@lru_cache(maxsize=4096)  # composing a preset (OmegaConf) costs milliseconds; a plan asks for each many times
def _engine_of(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision, hw: Hardware):
    record = strategies.get(lay.strategy)
    world = lay.dp * lay.cp  # cp ranks hold the same weights: their gradients are reduced with dp's
    fields = {"bucket_cap_mb": pricing.bucket_bytes(hw.node(), world) / pricing.MIB} \
        if hw.link is None and any(f.name == "bucket_cap_mb" for f in fields_of(record.schema)) else {}
    cfg = record.preset(**fields)
    group = record.state_group(cfg, world, max(1, hw.gpus_per_node // (lay.tp * lay.cp)))
    shape = model.shape(seq, lay.tp, lay.pp, lay.tp > 1 and lay.sequence_parallel, precision.compute_bytes)
    return record, cfg, world, group, shape


def memory(model: GPTModel, lay: Layout, seq: int, precision: RunPrecision | str, hw: Hardware = Hardware(),
           device: str = "cuda", optimizer: str = "adamw") -> dict[str, float]:
    """Peak bytes per GPU by role (ROLES, and "total", "where"): the most of three instants.

    backward's start   states (no gradients yet) + the engine's holdings before its first gradient
                       + every activation + the loss's fp32 gradient (b s V / t); a pipeline stage's first
                       gradient and its boundary tensors instead (_backward_start)
    after the head     the engine's first bucket allocated, the head's and loss's saved tensors freed
    optimizer          states + gradients + the engine's buffers and the optimizer's temporaries
    States: the record's (p, g, K of the precision) over its state group; the engine's transient
    holdings from its footprint (held()) at the compute dtype; activations minidist.memory's formula."""
    p = RunPrecision(precision) if isinstance(precision, str) else precision
    record, cfg, world, group, shape = _engine(model, lay, seq, p, hw)
    e = p.compute_bytes
    states = record.model_state_bytes(shape.psi, group, e, e, p.optimizer_bytes)
    rows = record.held(shape, cfg, world, group, optimizer=OptimizerModel(optimizer, device),
                       backend="nccl" if device == "cuda" else "gloo", device_type=device)
    sp = vp = lay.tp > 1 and lay.sequence_parallel
    acts = activation_bytes(GPTShape(lay.micro_batch, seq, model.hidden, model.heads, model.layers, model.vocab), p,
                            Parallelism(lay.tp, sp, vp, lay.recompute, lay.pp, lay.cp))
    first_grad, boundary = _backward_start(model, lay, seq, e, acts)

    def held_bytes(h, before: bool) -> dict[str, float]:
        b = dict(h.before_grads if before and h.before_grads is not None else h.bytes)
        return {"gradients": b.get("gradients", 0), "buffers": b.get("buffers", 0) + b.get("other", 0) + boundary}

    base = {"parameters": states["parameters"], "optimizer": states["optimizer"]}
    backward = [h for h in rows if h.at.phase == "backward"] or rows
    first = backward[0]
    during = max((held_bytes(h, False) for h in backward), key=lambda b: sum(b.values()))
    instants = [("backward's start", base | held_bytes(first, True) | {"activations": acts.total + first_grad}),
                ("after the head's backward", base | during
                 | {"activations": acts.total - acts.head + first_grad + acts.recompute_transient})]
    for h in (h for h in rows if h.at.phase in ("post_backward", "optimizer")):  # (boundary: pp's freed by then)
        grads = shape.psi * e if h.plain_grads is None else sum(shape.unit_numels[u] for u in h.plain_grads) * e
        roles = held_bytes(h, False)
        roles["gradients"] += grads
        instants.append((h.note or h.at.phase, base | roles | {"activations": 0.0}))
    where, roles = max(instants, key=lambda kv: sum(kv[1].values()))
    return roles | {"total": sum(roles.values()), "where": where}


def _backward_start(model: GPTModel, lay: Layout, seq: int, e: int, acts) -> tuple[float, float]:
    """(the first gradient a backward allocates, a pipeline stage's boundary tensors) in bytes. The last stage (and
    a model without pp) starts with the loss's fp32 gradient of the logits, b s V / t, and holds the activation it
    received and the gradient it sends (2 b s h e); a first stage binding the peak (1F1B: p micro-batches in flight,
    acts.head = 0) starts inside the last block's MLP (its 4h-wide gradient, the one arriving and the one leaving)
    and holds each in-flight micro-batch's output, which its backward starts from, and the gradient received."""
    sp = lay.tp > 1 and lay.sequence_parallel
    tokens = lay.micro_batch * seq // lay.cp
    loss_grad = tokens * model.vocab / (lay.tp if sp else 1) * 4
    boundary = tokens * model.hidden * e / (lay.tp if sp else 1)  # b s h e: one activation between stages
    if lay.pp == 1:
        return loss_grad, 0.0
    if acts.head == 0:
        return tokens * 4 * model.hidden * e / lay.tp + 2 * boundary, (lay.pp + 1) * boundary
    return loss_grad, 2 * boundary


def step(model: GPTModel, lay: Layout, seq: int, global_batch: int, precision: RunPrecision | str, hw: Hardware,
         efficiency: float = 0.5) -> dict:
    """Projected step time and its parts (module docstring), seconds."""
    p = RunPrecision(precision) if isinstance(precision, str) else precision
    record, cfg, world, group, shape = _engine(model, lay, seq, p, hw)
    e, peak = p.compute_bytes, hw.peak(p)
    m = global_batch // (lay.dp * lay.micro_batch)  # micro-batches per replica
    tokens = global_batch * seq / hw.gpus  # per GPU, as MFU counts them
    model_flops = (6 * model.psi(seq) + 6 * model.layers * seq * model.hidden) * tokens
    compute = model_flops * (4 / 3 if lay.recompute == "full" else 1) / (peak * efficiency)
    fwd = compute / (4 if lay.recompute == "full" else 3)  # a backward is two forwards; recompute adds one
    bwd = compute - fwd
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
    dp_calls = [c for c in calls if c.phase != "critical"]
    per_mb = record.zero_stage == 3  # FSDP gathers and reduces every micro-batch
    dp = hw.price(dp_calls)
    crit = hw.price([c for c in calls if c.phase == "critical"])
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
