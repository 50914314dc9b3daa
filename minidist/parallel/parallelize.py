"""Parallelism by composition: a layout, the wrappers applied over its dimensions, then the optimizer.

    layout = build_layout(cfg.strategy, topo)                        # which ranks do what
    policy = precision_policy(cfg.trainer, cfg.strategy)             # trainer.precision: engine dtypes
    model = parallelize(model, layout, cfg.strategy, block_types, policy)    # TP, then the strategy's engine
    optimizer = build_optimizer(model, layout, cfg.strategy, cfg.optim, policy)   # ZeRO shards it

What each strategy does is its record's (minidist.strategies): its mesh (`dims`), how it wraps
the model (`wrap_model`) and builds the optimizer (`build_optimizer`); this module only composes
them, and each engine is handed the sub-mesh it works over, by name (minidist.mesh):

    strategy       layout                           model step                 optimizer step
    single         "dp" of size 1                   -                          plain
    ddp            "dp" = N replicas                DDP over "dp"              plain
    zero1, zero2   "dp" = N replicas                -                          ShardedOptimizer(stage=1|2) over "dp"
                                                                               (it hooks the gradients itself)
    zero1_broadcast "dp" = N replicas               -                          ShardedOptimizer(owner_broadcast=True)
    full_shard,
    shard_grad_op  "dp" = N shards                  FSDP over "dp"             plain (over the shards)
    no_shard       ("replicate", "shard" = 1)       FSDP over both             plain
    hybrid_shard   ("replicate", "shard")           FSDP over both             plain (over the shards)
    (pp > 1)       "pp" outermost                   each stage as above        the record's; ZeRO's reduces
                                                    (minidist.parallel.pipeline)  after the schedule

The FSDP strategies are FSDP2's arguments (FSDP_STRATEGIES): full_shard and hybrid_shard
reshard after forward, shard_grad_op and no_shard do not; hybrid_shard and no_shard (a shard
dimension of one rank) get the 2-D mesh.

strategy.tp_size = T > 1 adds a "tp" dimension (innermost: its ranks are consecutive) to any
of them, and N / T data-parallel ranks remain. The model step then starts with tensor
parallelism, torchtitan's order: minidist.tp.parallelize_gpt over layout["tp"] replaces the
layers by their slices, and the data-parallel engine above wraps *that* model over "dp"
(or ("replicate", "shard")) exactly as it would a plain one: it sees ordinary parameters of
the slices' shapes, the same on every rank of its group. The two never share a collective:
TP's all_reduces run inside forward and backward on the tp group, the engine's on dp.

strategy.cp_size = C > 1 adds a "cp" dimension (between data parallelism and tp) to any of them:
minidist.cp.parallelize_gpt over layout["cp"] (after TP) makes each rank compute on 1/C of every
sequence's tokens, and the engine spans "dp_cp", the data-parallel ranks times C
(minidist.strategies.record.engine_mesh): cp ranks hold the same weights, so their gradients are
averaged with the data-parallel ones in the engine's one reduction, and FSDP and ZeRO shard over
all of them. The 2-D engines join the cp ranks to one of their dimensions (layout.hybrid_dims):
hybrid_shard shards over ("replicate", "shard_cp"), no_shard replicates over ("replicate_cp", "shard" = 1).
The cp ranks of a data shard read the same rows; local_batch cuts out each one's tokens every
step, and the model's loss is already the mean over every cp rank's tokens (minidist.cp.plan),
so the loop logs and evaluates unchanged.

A new kind of parallelism is a new record (minidist.strategies.register) and, if it shards
state, an engine offering the contract the loop and the checkpoints call
(minidist.strategies.contract: no_sync, whole and sharded state dicts): they ask the record
which contract its engines offer, never the objects. What is split over which dimension is
declared on the parameters themselves (minidist.sharding: TP's slices over "tp", FSDP's shards
over its dimension), so that clipping and whole-model checkpoints work for any composition
(minidist.parallel.placement).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn as nn

from minidist import clip, cp, strategies
from minidist.mesh import CP, DP_CP, PP, TP, Layout, ParallelDims
from minidist.models.gpt import GPT
from minidist.parallel import pipeline, placement
from minidist.precision import MixedPrecisionPolicy
from minidist.runtime import Topology
from minidist.strategies import contract
from minidist.strategies.record import Strategy
from minidist.tp import parallelize_gpt

TP_MODELS = {"gpt": GPT}
"""The models tensor parallelism has a plan for (minidist.tp.parallelize_gpt), by config name."""


def check_tensor_parallel(model: str, tp: int, setting: str, fix: str) -> None:
    """The one rule about which models take tensor parallelism; ValueError naming `setting` and `fix`.
    Composition (minidist.cli), the comparison's rows and parallelize() itself all ask here."""
    if tp > 1 and model not in TP_MODELS:
        raise ValueError(f"{setting}: tensor parallelism has a plan for model=gpt only, not model={model}; {fix}")


def check_context_parallel(model: str, cp_size: int, setting: str, fix: str) -> None:
    """Which models take context parallelism (minidist.cp.parallelize_gpt: the GPT's attention); as above."""
    if cp_size > 1 and model not in TP_MODELS:
        raise ValueError(f"{setting}: context parallelism has a plan for model=gpt only, not model={model}; {fix}")


def cp_policy(strategy_cfg) -> cp.CPPolicy:
    """strategy.cp_chunking and strategy.cp_rotate as minidist.cp's policy; ValueError naming the key."""
    return cp.CPPolicy.of(strategy_cfg.cp_chunking, strategy_cfg.cp_rotate, prefix="strategy.cp_")


def build_layout(strategy_cfg, topo: Topology) -> Layout:
    """The strategy's degrees, checked against the world (one line naming the setting), as a Layout."""
    return layout_dims(strategy_cfg, topo.world_size, local_world(topo)).build(topo.device.type)


def local_world(topo: Topology) -> int:
    """Processes per node: torchrun's LOCAL_WORLD_SIZE, else the whole world (one node)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", topo.world_size))


def layout_dims(strategy_cfg, world: int, local_world: int | None = None) -> ParallelDims:
    """The strategy's degrees at `world` ranks (`local_world` per node); ValueError names the setting."""
    return strategies.get(strategy_cfg.name).dims(strategy_cfg, world, local_world)


def parallelize(model: nn.Module, layout: Layout, strategy_cfg, block_types: tuple[type, ...],
                policy: MixedPrecisionPolicy | None = None, microbatches: int = 1) -> nn.Module:
    """Wrap `model` (already on its device) as the strategy says; returns what forward/backward run on
    (with pp > 1: this rank's stages, each under the engine, minidist.parallel.pipeline)."""
    if layout.size(TP) > 1:  # the layers first, then data parallelism over what remains
        model = _apply_tp(model, layout[TP], strategy_cfg)
    if layout.size(CP) > 1:  # then the sequence; the engine below spans dp x cp
        model = _apply_cp(model, layout[CP], strategy_cfg)
    if layout.size(PP) > 1:  # then the depth: the stages, each wrapped by the engine
        return pipeline.pipeline_model(model, layout, strategy_cfg, microbatches, block_types, policy)
    return strategies.get(strategy_cfg.name).wrap_model(model, layout, strategy_cfg, block_types, policy)


def _apply_tp(model: nn.Module, mesh, cfg) -> nn.Module:
    """Megatron-LM's layout over the 1-D "tp" mesh (minidist.tp.parallelize_gpt), in place."""
    name = next((n for n, cls in TP_MODELS.items() if isinstance(model, cls)), type(model).__name__)
    check_tensor_parallel(name, mesh.size(), f"strategy.tp_size={mesh.size()}", "use strategy.tp_size=1")
    return parallelize_gpt(model, mesh, sequence_parallel=cfg.sequence_parallel, vocab_parallel=cfg.vocab_parallel)


def _apply_cp(model: nn.Module, mesh, cfg) -> nn.Module:
    """Ring (or all_gather) attention over the 1-D "cp" mesh (minidist.cp.parallelize_gpt), in place."""
    name = next((n for n, c in TP_MODELS.items() if isinstance(model, c)), type(model).__name__)
    check_context_parallel(name, mesh.size(), f"strategy.cp_size={mesh.size()}", "use strategy.cp_size=1")
    return cp.parallelize_gpt(model, mesh, cp_policy(cfg))


def local_batch(batch: list, layout: Layout, strategy_cfg) -> list:
    """What this rank computes on of the batch its data shard read: under context parallelism its tokens
    of the same rows (minidist.cp.shard_batch, the strategy's chunking), else the batch as it is."""
    if layout.size(CP) == 1:
        return batch
    return list(cp.shard_batch(batch[0], batch[1], layout[CP], cp_policy(strategy_cfg).chunking))


def precision_policy(trainer_cfg, strategy_cfg) -> MixedPrecisionPolicy | None:
    """The engines' dtypes: trainer.precision (bf16, fp16) for the parameters' compute copy and, unless
    the strategy sets its own reduce_dtype (or param_dtype, FSDP), for the gradient reduction too."""
    precision = trainer_cfg.precision.value
    own_param = getattr(strategy_cfg, "param_dtype", None)
    own_reduce = getattr(strategy_cfg, "reduce_dtype", None)
    param = own_param.torch_dtype if own_param else _DTYPES.get(precision)
    if param is None and own_reduce is None:
        return None
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=own_reduce.torch_dtype if own_reduce else None)


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_optimizer(model: nn.Module, layout: Layout, strategy_cfg, optim_cfg,
                    policy: MixedPrecisionPolicy | None = None) -> torch.optim.Optimizer:
    """The optimizer over what the model trains, as the strategy builds it (ZeRO's shards it over "dp")."""
    cls, kwargs = optimizer_class(optim_cfg)
    record = strategies.get(strategy_cfg.name)
    optimizer = record.build_optimizer(model, layout, strategy_cfg, cls, kwargs, policy)
    if layout.size(PP) > 1:  # ZeRO's reduction, at the end of the pipeline's schedule
        pipeline.attach_optimizer(model, optimizer, record)
    return optimizer


def optimizer_class(optim_cfg) -> tuple[type, dict]:
    """(torch optimizer class, its keyword arguments) for cfg.optim."""
    if optim_cfg.name == "adamw":
        return torch.optim.AdamW, dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                       weight_decay=optim_cfg.weight_decay, fused=optim_cfg.fused)
    if optim_cfg.name == "sgd":
        return torch.optim.SGD, dict(lr=optim_cfg.lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov,
                                     weight_decay=optim_cfg.weight_decay)
    raise ValueError(f"unknown optim.name={optim_cfg.name!r}; valid: adamw, sgd")


# ------------------------------------------------- what the loop asks of the wrapped model
def unwrap(model: nn.Module, strategy: Strategy) -> nn.Module:
    """The user's model inside the strategy's wrapper, if it has one (under FSDP its parameters are this
    rank's shards)."""
    return model.module if strategy.model_engine is not None else model


def no_sync(model: nn.Module, optimizer: torch.optim.Optimizer | None, strategy: Strategy):
    """Skip gradient communication for an accumulation micro-step: the engine that reduces the gradients
    (the model's wrapper, or ZeRO's optimizer: the record says which) offers no_sync; nothing to skip
    without one. Put the backward inside the block too: ZeRO (and FSDP) read it there, DDP in the forward."""
    if strategy.model_engine is not None:
        return model.no_sync()
    if strategy.optimizer_engine is not None:
        return optimizer.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm_(model: nn.Module, max_norm: float, layout: Layout, optimizer: torch.optim.Optimizer | None = None,
                    norm_type: float = 2.0, *, strategy: Strategy) -> torch.Tensor:
    """Clip the global gradient norm (minidist.clip); returns it as a tensor (reading it is a host sync).

    The pieces are the model's parameters and their .grad, each parameter's norm summed over
    the dimensions it declares (FSDP's shards over "dp" or "shard", a tensor-parallel slice
    over "tp"), replicated ones counted once. ZeRO keeps the averaged gradients in its
    optimizer's shards (p.grad is None after backward; its contract, ShardedOptimizerState,
    hands them out): there the pieces it holds, plus "dp_cp" (each element lives on one rank of
    its engine's mesh: "dp", or dp x cp). cp ranks hold the same parameters and, after the
    engine's reduction over dp x cp, the same whole gradients: nothing is summed over cp again.
    """
    if strategy.optimizer_engine is contract.ShardedOptimizerState:
        pieces, split_over_dp = optimizer.grad_pieces()
        every = [(p, None) for p in optimizer.parameters_in_order] + pieces  # the same groups on every rank
        return clip.clip_grad_norm_(every, max_norm, layout, device=layout.device, norm_type=norm_type,
                                    also=(DP_CP,) if split_over_dp else ())
    pieces = [(p, p.grad) for p in model.parameters()]
    return clip.clip_grad_norm_(pieces, max_norm, layout, device=layout.device, norm_type=norm_type)


def full_state_dict(model: nn.Module, layout: Layout, strategy: Strategy) -> dict:
    """The whole model's state on the main process ({} elsewhere). A collective.

    Each tensor-parallel slice is first made whole over the data-parallel ranks (a sharded
    model's engine gathers its shards onto the slice's first data-parallel rank:
    contract.ShardedModel.full_state_dict; a replicated model is whole already), then those
    first ranks concatenate the slices along "tp" (nothing to do without tensor parallelism).
    """
    first = layout.dp_rank == 0
    if strategy.model_engine is contract.ShardedModel:
        state = model.full_state_dict(rank0_only=True, cpu_offload=True)
    else:
        state = {k: v.detach().cpu() for k, v in unwrap(model, strategy).state_dict().items()} if first else {}
    if first:
        state = placement.gather_whole(state, placement.splits(unwrap(model, strategy), TP), layout, TP)
    return placement.gather_stages(state, layout)  # the pipeline's stages joined (as is without one)
