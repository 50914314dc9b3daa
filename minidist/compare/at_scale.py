"""The comparison's second model, known by its parameter count, projected on GPU clusters at the run's precision.

    subject = at_scale.subject(cfg.projection, rows, options)     # a projection.Subject
    clusters = at_scale.gpu_clusters(cfg.projection)              # each with NCCL's model of its node

The GPT of projection.params parameters in projection.layers blocks (minidist.compare.plan.GPTModel),
projection.tokens_per_rank tokens per rank in sequences of projection.seq: its compute at the GPU's
dense peak at projection.precision x projection.efficiency (1/3 forward, 2/3 backward), its memory
per rank the planner's (states + the engine's buffers + activations), its buckets the bucket rule's
(minidist.compare.pricing) at each rank count, its bytes at the precision's (or the strategy's own
param_dtype / reduce_dtype).
"""

from __future__ import annotations

import math
import types

import torch

from minidist.comm.nccl_graphs import HopperNode
from minidist.compare import projection
from minidist.compare.analytic import ContextParallel, PipelineParallel, TensorParallel
from minidist.compare.plan import GPTModel, Hardware, Layout, memory as plan_memory
from minidist.compare.rows import Row
from minidist.cp import cost as cp_cost
from minidist.precision import RunPrecision
from minidist.shape import ModelShape
from minidist.strategies import Wire

MIB = 2 ** 20


def subject(p, names: list[str], options: dict, microbatches: int = 4) -> projection.Subject:
    """cfg.projection's GPT by its parameter count, at its precision: compute at the GPU's peak x efficiency,
    memory by the planner's formula, the bucket rule on every GPU cluster; a pipeline row's `microbatches`
    (the comparison's pp_microbatches)."""
    compute = 6 * p.params * p.tokens_per_rank / (RunPrecision(p.precision).peak_flops(p.gpu) * p.efficiency)
    rows = {s: Row.parse(s) for s in names}
    return projection.Subject(
        f"{p.params / 1e9:g}B {p.precision}", {s: ModelShape.uniform(p.params / (r.tp * r.pp), p.layers // r.pp)
                                               for s, r in rows.items()},
        compute / 3, 2 * compute / 3, lambda s, n, group: _memory(p, options[s], s, n, microbatches), tuple(p.clusters),
        wires={s: _wire(p, options[s]) for s in names}, options=options,
        tp={s: _wire_tp(p, options[s]) for s, r in rows.items() if r.tp > 1},
        cp={s: _ring(p, options[s], r.cp) for s, r in rows.items() if r.cp > 1},
        pp={s: _pipeline(p, options[s], microbatches) for s, r in rows.items() if r.pp > 1}, bucket_rule=True)


def gpu_clusters(p) -> list[projection.Cluster]:
    """cfg.projection.clusters, each with NCCL's model of its node."""
    return [projection.Cluster(name, c.gpus_per_node, c.intra_alpha_us * 1e-6, c.intra_GBps * 1e9,
                               c.net_alpha_us * 1e-6, c.nic_GBps * 1e9, c.nics_per_node, c.label, node=_node(name, c))
            for name, c in p.clusters.items()]


def _wire_tp(p, strategy_cfg) -> TensorParallel:
    """TP's calls for the projected model: L = p.layers blocks of width h = sqrt(psi / 12 L) (a GPT block
    holds 12 h^2 parameters), a tp group sharing T x tokens_per_rank tokens, in the engine's param dtype."""
    width = round(math.sqrt(p.params / (12 * p.layers)))
    shape = types.SimpleNamespace(n_layer=p.layers, n_embd=width)
    return TensorParallel.of_gpt(shape, strategy_cfg.tp_size, p.tokens_per_rank, strategy_cfg.tp_size, 1,
                                 sequence_parallel=strategy_cfg.sequence_parallel,
                                 vocab_parallel=strategy_cfg.vocab_parallel,
                                 itemsize=_bytes(strategy_cfg.get("param_dtype"),
                                                 RunPrecision(p.precision).compute_bytes))


def _ring(p, strategy_cfg, c: int) -> ContextParallel:
    """CP's messages for the projected model: a cp group shares C x tokens_per_rank tokens (C x tokens_per_rank /
    seq sequences, each rank 1/C of every one), so a rank's (k, v) blocks are b (s/C) h e = tokens_per_rank h e
    bytes each, in the run's compute dtype."""
    width = round(math.sqrt(p.params / (12 * p.layers)))
    e = RunPrecision(p.precision).compute_bytes
    batch = max(1, c * p.tokens_per_rank // p.seq)
    return ContextParallel(c, strategy_cfg.get("cp_rotate", "ring"), p.layers,
                           cp_cost.block_bytes(batch, p.seq, width, c, e))


def _pipeline(p, strategy_cfg, m: int) -> PipelineParallel:
    """The projected model's pipeline: P stages sharing P x tokens_per_rank tokens per step in m micro-batches,
    each message one micro-batch's activation, (P x tokens_per_rank / m) h e bytes; its dp is set per rank count."""
    width = round(math.sqrt(p.params / (12 * p.layers)))
    size = strategy_cfg.pp_size
    message = size * p.tokens_per_rank * width * RunPrecision(p.precision).compute_bytes // m
    return PipelineParallel(size, 1, strategy_cfg.pp_schedule, m, strategy_cfg.get("pp_virtual", 1), message)


def _bytes(dtype, default: int = 4) -> int:
    return default if dtype is None else torch.empty(0, dtype=dtype.torch_dtype).element_size()


def _wire(p, strategy_cfg) -> Wire:
    """How the projected model travels: buckets of p.bucket_cap_mb (on a GPU cluster the bucket rule's instead:
    minidist.compare.pricing), in the dtypes the engine moves (FSDP's param_dtype / reduce_dtype; else the run's
    precision's); with tensor parallelism a rank's slices, psi / T."""
    e = RunPrecision(p.precision).compute_bytes
    gather = _bytes(strategy_cfg.get("param_dtype"), e)
    reduce = _bytes(strategy_cfg.get("reduce_dtype") or strategy_cfg.get("param_dtype"), e)
    split = strategy_cfg.get("tp_size", 1) * strategy_cfg.get("pp_size", 1)  # a rank's slices of its stage
    return Wire.even_buckets(p.params / split, int(p.bucket_cap_mb * MIB), reduce, gather)


def _node(name: str, c) -> HopperNode:
    """NCCL's model of a configured cluster's node: its GPUs, each with its share of the node's NICs."""
    return HopperNode(name=name, gpus=c.gpus_per_node, nic_GBps=c.nic_GBps * c.nics_per_node / c.gpus_per_node)


def _memory(p, strategy_cfg, row: str, n: int, m: int = 4) -> float:
    """Peak bytes per rank of the projected GPT (minidist.compare.plan.memory: the record's states at the run's
    precision, its engine's buffers, activations by formula for tokens_per_rank / seq sequences of p.seq; a
    tensor-parallel row's tp group shares T times as many, a context-parallel row's cp group C times as many,
    each rank 1/C of their tokens; a pipeline row's stage its layers' states and 1F1B's in-flight micro-batches
    of P x as many sequences over m)."""
    r = Row.parse(row)
    model = GPTModel.of_params(p.params, p.layers)
    batch = max(1, p.tokens_per_rank // p.seq) * r.size
    lay = Layout(n // r.size, r.tp, r.pp, r.cp, strategy=r.base, micro_batch=max(1, batch // m) if r.pp > 1 else batch,
                 sequence_parallel=bool(strategy_cfg.get("sequence_parallel", False)))
    gpus = next((c.gpus_per_node for c in p.clusters.values()), 8)  # hybrid_shard's group: a node (all alike)
    return plan_memory(model, lay, p.seq, p.precision, Hardware(p.gpu, gpus))["total"]
