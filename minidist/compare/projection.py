"""Communication per step at 8 to 1024 ranks, as NCCL would run it, against the compute that can hide it.

    rows = project(subjects, clusters, strategies, ranks)

Every collective of one step comes from minidist.compare.analytic.plan (the strategy's record's
call list, the one the table checks against the trace), sized in the dtype the engine moves, and
is priced on a cluster of nodes (Cluster: G ranks per node on an intra-node fabric, NICs per node
on the network). A GPU cluster (Cluster.node set: every configured one) prices each call with NCCL's
own model (minidist.comm.nccl via minidist.compare.pricing: ring, double binary tree, NVLS x LL,
LL128, Simple, as NCCL would choose), sizes DDP's and ZeRO's buckets by pricing.bucket_bytes at each
rank count (Subject.bucket_rule), and says whether each row's calls are latency- or bandwidth-bound
(their summed latency terms against the rest). The alpha-beta model below is this machine's link
("calibrated") and any Cluster without a node:

  * a group's ranks sit on n_nodes nodes, m per node (a replica group of hybrid_shard: one
    per node). Bus bandwidth: the intra-node fabric's inside one node; across nodes the
    network's share of the NICs, NICs x B_nic x m / G, and no more than the fabric's: NCCL runs
    one ring per NIC, so an 8-GPU node with 8 x 400 Gb/s gives a cross-node ring ~400 GB/s
    whatever the number of nodes;
  * latency, per hop: alpha_intra inside a node, alpha_net for each of the n_nodes - 1 hops
    of a pass that cross nodes (NCCL's tuning model);
  * ring (N ranks, S bytes): all_gather, reduce_scatter (N-1) hops + S (N-1)/N / B; broadcast
    (pipelined) (N-1) hops + S / B; all_reduce 2 (N-1) hops + 2 S (N-1)/N / B;
  * tree (NCCL's double binary tree across nodes, a chain inside each): all_reduce
    2 ((m-1) alpha_intra + ceil(log2 n_nodes) alpha_net) + 2 S / (0.92 B) (NCCL's tuner rates
    the tree's bus bandwidth at 0.92 of the ring's: TREE_EFFICIENCY);
  * per all_reduce the cheaper of ring and tree (as NCCL's tuner picks); all_gather,
    reduce_scatter and broadcast run as rings.

"calibrated" is this machine: every rank its own node, one link of the alpha and beta measured
on the spot (gloo over loopback TCP on a few CPU cores), extrapolated; its compute is the
measured plain step. Other clusters are alpha-beta numbers from their config, not measurements.

Tensor-parallel rows (`<strategy>+tp<T>`): the tp group is T consecutive ranks, so inside a
node while T <= G (the intra-node link class), and the strategy's groups stride over every node
(data parallelism across nodes); a rank count T does not divide has no row.

Context-parallel rows (`<strategy>+cp<C>`): the cp group is C consecutive ranks (inside a node while
C <= G), the strategy spans all N ranks (dp x cp hold the same weights), and the ring's messages
(minidist.compare.analytic.ContextParallel: per layer 3 (C-1) sends of a rank's (k, v) block of
b (s/C) h e bytes each, with the tokens a cp group shares) are priced as point-to-point hops: one
alpha of the link the hop takes plus the block over that link's bandwidth (NCCL's tuning model
has no send/recv; a ring step waits for its slowest hop, the one that leaves the node once the group
spans nodes). A receive costs nothing of its own: its bytes are the matching send's. The ring's
calls are critical (the attention of a layer waits for its last block), as TP's.

Pipeline rows (`<strategy>+pp<P>`): P stages on the outermost ranks, so a pipeline spans all N ranks
and its hops leave the node once N > G; the strategy runs over each stage's D = N / P ranks on the
stage's 1/P of the layers (its gathers once per micro-batch, minidist.compare.analytic.pipeline_calls).
The messages (one micro-batch's activation, (b/m) s h e, a hop each) pay the fill and drain, 2 (P-1)
hops on the critical path, and in the steady state what each micro-batch's two hops take beyond its
compute (as the planner, minidist.compare.plan); the bubble, (P-1)/(m+P-1) of the step for 1F1B
(minidist.pp.cost.bubble), is priced as time: compute x bubble / (1 - bubble) (bubble_s), not as
communication. Memory: the planner's stage (its layers' states, 1F1B's in-flight micro-batches).

Verdict, per strategy: the calls issued in forward can hide behind forward compute, those of
backward behind backward compute, those after backward (ZeRO's parameter exchange at its default,
overlap_param_gather off; the clip) behind nothing (nothing overlaps them with the next forward),
and tensor parallelism's behind nothing either (phase "critical": the next layer needs their
result; Megatron's overlaps are not modelled). exposed >= max(0, comm_fwd - fwd)
+ max(0, comm_bwd - bwd) + comm_after + comm_critical; the strategy "hides" where that bound is within 1% of the
step's compute (HIDES; a clip's one-scalar all_reduce costs latency only). Necessary, not
sufficient: the first gather and the last reduction always show. Memory: the per-rank
estimate (the measured model: minidist.compare.estimate, activations included) or, for a model
given by its parameter count, the planner's (minidist.compare.plan.memory: the record's states at
the run's precision + the engine's buffers + activations by formula) against each device size.
A strategy's states are split over its record's state_group at that rank count:
hybrid_shard's shard group is a node (the cluster's GPUs per node) unless its shard_size says
otherwise, as at runtime.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from minidist import strategies
from minidist.comm import nccl
from minidist.comm.nccl_graphs import HopperNode
from minidist.compare import pricing
from minidist.compare.analytic import ContextParallel, PipelineParallel, TensorParallel, pipeline_calls, plan
from minidist.shape import ModelShape
from minidist.strategies import Call, Wire

TREE_EFFICIENCY = 0.92
"""NCCL's tuning model: an all_reduce tree reaches this share of the ring's bus bandwidth."""
HIDES = 0.01
"""A strategy hides its communication where what compute cannot hide is at most this share of compute."""


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    intra_alpha_s: float
    intra_Bps: float
    net_alpha_s: float
    nic_Bps: float
    nics_per_node: int
    label: str = ""
    fit: tuple[float, ...] | None = None
    """A calibrated link's fit: (alpha, beta, their standard errors, covariance, RMS relative residual)."""
    node: HopperNode | None = None
    """NCCL's model of a node (minidist.comm.nccl): each call priced as NCCL would run it (its algorithm and
    protocol, minidist.compare.pricing); None: the alpha-beta numbers above (this machine's calibrated link)."""


@dataclass(frozen=True)
class Subject:
    """A model to project: its shape per row, compute per step split forward / backward, memory per rank."""

    name: str
    shapes: dict[str, ModelShape]
    """Per row (`<strategy>` or `<strategy>+tp<T>`): the model's shape (a tensor-parallel row's: a rank's
    slices)."""
    forward_s: float
    backward_s: float
    memory: Callable[[str, int, int], float] | None = None
    """(row, ranks, the ranks its states are split over) -> bytes per rank; None: not applicable (this
    machine's CPU)."""
    clusters: tuple[str, ...] = ()
    """Names of the clusters it is projected on."""
    local_world: int | None = None
    """Processes per node (hybrid_shard's shard group unless its shard_size is set); None: the cluster's
    GPUs per node."""
    wires: dict[str, Wire] = field(default_factory=dict)
    """Per row: how its engine moves the model (buckets, bytes per element); missing: one bucket, the model's dtype."""
    options: dict[str, Any] = field(default_factory=dict)
    """Per row: its strategy config (the comparison's strategy_options); missing: the record's preset."""
    tp: dict[str, TensorParallel] = field(default_factory=dict)
    """Tensor-parallel rows (`<strategy>+tp<T>`): TP's calls; its dp is set per rank count."""
    cp: dict[str, ContextParallel] = field(default_factory=dict)
    """Context-parallel rows (`<strategy>+cp<C>`): the ring's messages per rank and step."""
    pp: dict[str, PipelineParallel] = field(default_factory=dict)
    """Pipeline rows (`<strategy>+pp<P>`): the pipeline, its dp set per rank count; shapes[row] is a stage's."""
    bucket_rule: bool = False
    """On a cluster with NCCL's model: DDP's and ZeRO's buckets sized by pricing.bucket_bytes at each rank count
    (equal buckets of the model's size), not the wire's."""


def calibrated(alpha_s: float, beta_s: float, alpha_err: float = 0.0, beta_err: float = 0.0, cov: float = 0.0,
               residual: float = 0.0) -> Cluster:
    """This machine's link: the calibration's alpha and beta, and its fit's errors (comm.calibrate's CostModel:
    standard errors, covariance, RMS relative residual), which every calibrated row carries (comm_err_s)."""
    bw = 1 / beta_s if beta_s else math.inf
    return Cluster("calibrated", 1, alpha_s, bw, alpha_s, bw, 1, "this machine (gloo, CPU): measured alpha, beta",
                   fit=(alpha_s, beta_s, alpha_err, beta_err, cov, residual))


def comm_error(c: Cluster, latency_s: float, total_s: float) -> float:
    """One sigma of a calibrated row's communication time: t = A alpha + B beta (A = latency / alpha, B = the
    rest / beta) with the fit's (co)variances, and the fit's relative residual scattering each time about it."""
    if c.fit is None:
        return 0.0
    alpha, beta, sa, sb, cov, residual = c.fit
    a = latency_s / alpha if alpha else 0.0
    b = (total_s - latency_s) / beta if beta else 0.0
    return math.sqrt(max(0.0, (a * sa) ** 2 + (b * sb) ** 2 + 2 * a * b * cov) + (residual * total_s) ** 2)


def _place(c: Cluster, call: Call) -> tuple[int, int]:
    """(nodes the group touches, its ranks per node)."""
    nodes = max(1, -(-call.ranks_spanned // c.gpus_per_node))
    return nodes, max(1, call.group_size // nodes)


def call_time(c: Cluster, call: Call, algorithm: str = "auto") -> float:
    """Seconds for one collective on cluster `c` (module docstring); auto = NCCL's choice."""
    k, s = call.group_size, float(call.payload)
    if k <= 1:
        return 0.0
    if call.op in ("send", "recv"):
        return _hop_time(c, call)
    if c.node is not None:  # NCCL's choice; "ring" / "tree" restrict it as NCCL_ALGO would (tree: all_reduce only)
        only = {"auto": nccl.ALGORITHMS, "ring": ("ring",), "tree": ("tree",) if call.op == "all_reduce" else ("ring",)}
        return pricing.call_time(c.node, call, only[algorithm])
    nodes, m = _place(c, call)
    bus = c.intra_Bps if nodes == 1 else min(c.intra_Bps if m > 1 else math.inf,
                                             c.nics_per_node * c.nic_Bps * m / c.gpus_per_node)
    inter = nodes - 1
    hops = (k - 1 - inter) * c.intra_alpha_s + inter * c.net_alpha_s
    if call.op in ("all_gather", "reduce_scatter"):
        return hops + s * (k - 1) / k / bus
    if call.op in ("broadcast", "reduce"):
        return hops + s / bus
    if call.op != "all_reduce":
        raise ValueError(f"no projection for {call.op!r}")
    ring = 2 * hops + 2 * s * (k - 1) / k / bus
    tree = 2 * ((m - 1) * c.intra_alpha_s + math.ceil(math.log2(nodes)) * c.net_alpha_s) + 2 * s / (TREE_EFFICIENCY * bus)
    return {"ring": ring, "tree": tree, "auto": min(ring, tree) if nodes > 1 else ring}[algorithm]


def _hop_time(c: Cluster, call: Call) -> float:
    """A point-to-point message of a ring of `call.group_size` ranks: one hop, alpha + S / B of the slowest link
    the ring takes (the network's share of the NICs once the group spans nodes); a receive adds nothing."""
    if call.op == "recv":
        return 0.0
    nodes, _ = _place(c, call)
    if nodes == 1:
        return c.intra_alpha_s + call.payload / c.intra_Bps
    return c.net_alpha_s + call.payload / (c.nics_per_node * c.nic_Bps / c.gpus_per_node)


def step_comm(c: Cluster, calls: list[Call], algorithm: str = "auto") -> dict[str, float]:
    """Seconds of communication per phase of the step (forward, backward, after, critical), back to back."""
    out = {"forward": 0.0, "backward": 0.0, "after": 0.0, "critical": 0.0, "pipeline": 0.0}
    for call in calls:
        out[call.phase] += call_time(c, call, algorithm)
    return out


def project(subjects: list[Subject], clusters: list[Cluster], strategies: list[str], ranks: list[int],
            devices_GB: list[float]) -> list[dict]:
    """One row per (subject, cluster, strategy, ranks)."""
    rows = []
    by_name = {c.name: c for c in clusters}
    for subj in subjects:
        for c in (by_name[n] for n in subj.clusters if n in by_name):
            for strategy in strategies:
                size = math.prod(d.size for d in (subj.tp.get(strategy), subj.cp.get(strategy),
                                                  subj.pp.get(strategy)) if d is not None)
                rows += [_row(subj, c, strategy, n, devices_GB) for n in ranks if n % size == 0]
    return rows


def _row(subj: Subject, c: Cluster, strategy: str, n: int, devices_GB: list[float]) -> dict:
    tp, pp = subj.tp.get(strategy), subj.pp.get(strategy)
    if tp is not None:  # T consecutive ranks (a node's while T <= G), the strategy over the N / T others
        tp = dataclasses.replace(tp, dp=n // tp.size)
    if pp is not None:  # P stages outermost, the strategy over each stage's N / P ranks
        pp = dataclasses.replace(pp, dp=n // pp.size)
    record = strategies.get(strategy.partition("+")[0])
    group = record.state_group(subj.options.get(strategy) or record.preset(), n, subj.local_world or c.gpus_per_node)
    wire = subj.wires.get(strategy, Wire())
    if subj.bucket_rule and c.node is not None and wire.bucket_numels:  # the bucket rule at this rank count
        dp = n // (tp.size if tp else 1) // (pp.size if pp else 1)
        wire = Wire.even_buckets(subj.shapes[strategy].psi, pricing.bucket_bytes(c.node, dp), wire.reduce_bytes(
            subj.shapes[strategy]), wire.gather_itemsize)
    if pp is not None:  # the first stage's rank: its engine's calls, its messages, the tie, the loss, the clip
        calls = pipeline_calls(record, [(subj.shapes[strategy], wire)], pp, 0, group=group, norm_dims=[["pp"], ["dp", "pp"]])
    else:
        calls = plan(record, subj.shapes[strategy], n, wire, group=group, tp=tp)
    cp = subj.cp.get(strategy)
    calls += cp.calls() if cp is not None else []  # C consecutive ranks: the group spans C
    t = step_comm(c, calls)
    latency = sum(call_time(c, dataclasses.replace(x, payload=0)) for x in calls)
    compute = subj.forward_s + subj.backward_s
    pipe = _pipeline(c, pp, compute) if pp is not None else {"pp_p2p_s": 0.0, "bubble": 0.0, "bubble_s": 0.0}
    exposed = (max(0.0, t["forward"] - subj.forward_s) + max(0.0, t["backward"] - subj.backward_s) + t["after"]
               + t["critical"] + pipe["pp_p2p_s"])
    mem = subj.memory(strategy, n, group) if subj.memory else None
    return {"model": subj.name, "cluster": c.name, "strategy": strategy, "ranks": n, "comm_s": sum(t.values()),
            "comm_ring_s": sum(step_comm(c, calls, "ring").values()), **{f"comm_{k}_s": v for k, v in t.items()},
            "forward_s": subj.forward_s, "backward_s": subj.backward_s, "exposed_min_s": exposed,
            "hides": exposed <= HIDES * (subj.forward_s + subj.backward_s),
            "bound": pricing.bound(latency, sum(t.values()) - latency),
            "comm_err_s": comm_error(c, latency, sum(t.values())),
            "bucket_MiB": max(wire.bucket_numels, default=0) * wire.reduce_bytes(subj.shapes[strategy]) / 2 ** 20,
            "leaves_node": any(_place(c, x)[0] > 1 for x in calls), "memory_GB": None if mem is None else mem / 1e9,
            **pipe,
            **{f"fits_{g:g}GB": None if mem is None else mem / 1e9 <= g for g in devices_GB}}


def _pipeline(c: Cluster, pp: PipelineParallel, compute_s: float) -> dict[str, float]:
    """A pipeline's exposed messages (module docstring: the fill and drain's 2 (P-1) hops, and each micro-batch's
    two hops beyond its compute) and its bubble, as a share and as seconds of the step."""
    hop = _hop_time(c, Call("send", pp.message, pp.size, span=pp.span))
    per_microbatch = compute_s / pp.microbatches
    bubble = pp.bubble()
    return {"pp_p2p_s": 2 * (pp.size - 1) * hop + pp.microbatches * max(0.0, 2 * hop - per_microbatch),
            "bubble": bubble, "bubble_s": compute_s * bubble / (1 - bubble)}


def verdicts(rows: list[dict], devices_GB: list[float]) -> list[str]:
    """A short table per (model, cluster): where each strategy stops hiding, and from where it fits."""
    out = []
    for model, cluster in dict.fromkeys((r["model"], r["cluster"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["cluster"]) == (model, cluster)]
        top, mem = max(r["ranks"] for r in mine), mine[0]["memory_GB"] is not None
        head = f"  {'strategy':<14}{'hides up to':>12}{'comm ms @' + str(top):>15}{'exposed >= ms':>15}{'bound':>11}"
        if mem:
            head += f"{'GB/rank @' + str(top):>14}  fits " + "/".join(f"{g:g}" for g in devices_GB) + " GB from"
        lines = [f"{model} on {cluster}:", head]
        for strategy in dict.fromkeys(r["strategy"] for r in mine):
            rs = [r for r in mine if r["strategy"] == strategy]
            ok, last = [r["ranks"] for r in rs if r["hides"]], rs[-1]
            comm = f"{last['comm_s'] * 1e3:.1f}" + (f" ± {last['comm_err_s'] * 1e3:.1f}" if last["comm_err_s"] else "")
            line = (f"  {strategy:<14}{(str(max(ok)) if ok else 'never'):>12}{comm:>15}"
                    f"{last['exposed_min_s'] * 1e3:>15.1f}{last['bound']:>11}")
            if mem:
                fits = [next((str(r["ranks"]) for r in rs if r[f"fits_{g:g}GB"]), "-") for g in devices_GB]
                line += f"{last['memory_GB']:>14.1f}  {'/'.join(fits)}"
            if last["bubble"]:
                line += f"  bubble {last['bubble']:.2f}: {last['bubble_s'] * 1e3:.1f} ms"
            lines.append(line)
        out.append("\n".join(lines))
    return out
