"""`--plan`: its settings (PlanConfig, the comparison's plan.*) and its output, one line per layout that fits,
fastest first, each with one line of why.

    print(from_config(cfg))          # python -m recipes.compare --plan [plan.* overrides]

The numbers are minidist.compare.plan's; this module only words and arranges them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from minidist.compare.plan import GB, ROLES, STRATEGIES as PLANNED, GPTModel, Hardware, plan
from minidist.precision import RunPrecision


@dataclass
class PlanConfig:
    """`--plan`: the layouts of a GPT that fit a cluster, ranked by projected step time (minidist.compare.plan)."""

    params: Optional[float] = None
    """The model by its parameter count (layers blocks of width sqrt(params / 12 layers)); null = model.*."""
    layers: int = 32
    """With params: its transformer blocks."""
    global_batch: int = 512
    """Sequences per optimizer step, over every replica."""
    seq: int = 4096
    """Tokens per sequence."""
    cluster: Optional[str] = None
    """A projection cluster's name (projection.clusters: GPUs per node, NIC bandwidth); null = the fields below."""
    gpu: str = "h100"
    """h100, h200 or a100: its dense peak FLOP/s (minidist.precision.PEAK_FLOPS) and its memory."""
    gpus_per_node: int = 8
    nodes: int = 16
    nic_Gbps: float = 400.0
    """NIC bandwidth per GPU, Gb/s."""
    memory_GB: Optional[float] = None
    """Device memory; null = the GPU's (h100 80, h200 141, a100 80)."""
    precision: str = "bf16"
    """fp32, bf16 or fp16 (bf16/fp16 with fp32 masters): bytes, memory and compute alike."""
    efficiency: float = 0.5
    """The share of the dense peak the kernels reach (compute time = FLOPs / (peak x efficiency))."""
    strategies: list[str] = field(default_factory=lambda: list(PLANNED))
    """The engines tried (minidist.compare.plan.STRATEGIES)."""
    recompute: list[str] = field(default_factory=lambda: ["none", "full"])
    top: int = 12
    """Rows printed (the fastest)."""


def check_plan(p, clusters) -> None:
    """`--plan`'s settings; ValueError (one line) naming the key."""
    from minidist.precision import PEAK_FLOPS

    bad = [s for s in p.strategies if s not in PLANNED]
    rules = [(p.precision in ("fp32", "bf16", "fp16"), f"plan.precision={p.precision!r}: choose fp32, bf16 or fp16"),
             (p.gpu in PEAK_FLOPS, f"plan.gpu={p.gpu!r}: choose one of {', '.join(PEAK_FLOPS)}"),
             (p.cluster is None or p.cluster in clusters,
              f"plan.cluster={p.cluster!r}: choose one of {', '.join(clusters)} (projection.clusters) or null"),
             (min(p.nodes, p.gpus_per_node, p.global_batch, p.seq, p.layers, p.top) >= 1,
              "plan.nodes, gpus_per_node, global_batch, seq, layers and top must be >= 1"),
             (0 < p.efficiency <= 1, f"plan.efficiency={p.efficiency} must be in (0, 1]"),
             (not bad, f"plan.strategies: {', '.join(bad)} not planned; choose from {', '.join(PLANNED)}"),
             (set(p.recompute) <= {"none", "full"} and p.recompute, "plan.recompute: a list of none and full")]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)


def from_config(cfg) -> str:
    """The table for cfg.plan (PlanConfig): the model of plan.params or model.*, the
    cluster of plan.cluster (a projection cluster: its GPUs per node and NIC share) or of plan.*."""
    p = cfg.plan
    model = GPTModel.of_params(p.params, p.layers) if p.params else GPTModel.of_config(cfg.model)
    gpus, nic = p.gpus_per_node, p.nic_Gbps
    if p.cluster:
        c = cfg.projection.clusters[p.cluster]
        gpus, nic = c.gpus_per_node, c.nic_GBps * 8 * c.nics_per_node / c.gpus_per_node
    hw = Hardware(p.gpu, gpus, p.nodes, nic, p.memory_GB)
    return report(model, hw, p.global_batch, p.seq, p.precision, p.efficiency, p.top, strategies_=tuple(p.strategies),
                  recompute=tuple(p.recompute))


def report(model: GPTModel, hw: Hardware, global_batch: int, seq: int, precision: str = "bf16",
           efficiency: float = 0.5, top: int = 12, **kw) -> str:
    """The model's line, then table() of plan()'s rows (kw: plan's strategies_ and recompute)."""
    rows, rejected = plan(model, hw, global_batch, seq, precision, efficiency, **kw)
    head = (f"GPT L = {model.layers}, h = {model.hidden}, a = {model.heads}, V = {model.vocab} "
            f"({model.psi(seq) / 1e9:.2f}B parameters); global batch {global_batch} x {seq} tokens")
    return head + "\n" + table(rows, rejected, hw, precision, efficiency, top)


def why(row: dict) -> str:
    """One line: what the row's step spends beyond compute, its largest part first."""
    parts = {"TP's calls (critical path)": row["tp_s"], "DP's exposed comm": row["exposed_dp_s"],
             "bubble": row["bubble_s"], "CP's ring": row["cp_s"], "PP's transfers": row["pp_p2p_s"]}
    parts = {k: v / row["step_s"] for k, v in parts.items() if v > 0.005 * row["step_s"]}
    mem = row["memory"]
    head = f"peak: {mem['where']}"
    if not parts:
        return f"compute-bound, communication hidden; {head}"
    return "; ".join(f"{k} {v:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])) + \
        f" ({row['bound']}-bound comm); {head}"


def table(rows: list[dict], rejected: int, hw: Hardware, precision: str, efficiency: float, top: int = 12) -> str:
    """The planner's output: one line per layout that fits, fastest first, and a line of why under each."""
    p = RunPrecision(precision)
    lines = [f"{hw.nodes} x {hw.gpus_per_node} {hw.gpu} ({hw.device_GB:g} GB, {hw.nic_Gbps:g} Gb/s NIC per GPU)",
             f"precision: {p.describe()}",
             f"compute at {efficiency:.0%} of the {p.peak_flops(hw.gpu) / 1e12:.0f} TFLOP/s peak; {len(rows)} layouts fit, {rejected} do not; ranked by projected step time",
             f"{'layout':<40}{'step s':>8}{'MFU':>6}{'params':>7}{'grads':>7}{'optim':>7}{'buffers':>8}{'acts':>7}"
             f"{'GB':>7}{'exposed s':>10}{'bubble':>7}{'cp s':>6}"]
    for r in rows[:top]:
        m = r["memory"]
        lines.append(f"{r['layout'].name:<40}{r['step_s']:>8.2f}{r['mfu']:>6.0%}"
                     + "".join(f"{m[k] / GB:>{w}.1f}" for k, w in zip(ROLES, (7, 7, 7, 8, 7)))
                     + f"{m['total'] / GB:>7.1f}{r['exposed_dp_s'] + r['tp_s'] + r['pp_p2p_s']:>10.2f}"
                     f"{r['bubble']:>7.0%}{r['cp_s']:>6.2f}")
        lines.append(f"    {why(r)}")
    lines.append("GB: peak per GPU by role (buffers: the engine's buckets and gathers, the optimizer's temporaries)\n"
                 "exposed: DP's communication after overlap + TP's (critical path) + PP's transfers; bubble: 1F1B's")
    return "\n".join(lines)
