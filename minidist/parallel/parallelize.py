"""Parallelism by composition: a layout, the wrappers applied over its dimensions, then the optimizer.

    layout = build_layout(cfg.strategy, topo)                        # which ranks do what
    policy = precision_policy(cfg.trainer, cfg.strategy)             # trainer.precision: engine dtypes
    model = parallelize(model, layout, cfg.strategy, block_types, policy)    # DDP / FSDP over the layout
    optimizer = build_optimizer(model, layout, cfg.strategy, cfg.optim, policy)   # ZeRO shards it

Each strategy is a short list of steps, not a branch in every method; each engine is
handed the sub-mesh it works over, by name (minidist.mesh):

    strategy       layout                           model step                 optimizer step
    single         "dp" of size 1                   -                          plain
    ddp            "dp" = N replicas                DDP over "dp"              plain
    zero1, zero2   "dp" = N replicas                -                          ShardedOptimizer(stage=1|2) over "dp"
                                                                               (it hooks the gradients itself)
    zero1_broadcast "dp" = N replicas               -                          ShardedOptimizer(owner_broadcast=True)
    full_shard,
    shard_grad_op  "dp" = N shards                  FSDP over "dp"             plain (over the shards)
    no_shard       "dp" = N replicas                FSDP over "dp"             plain
    hybrid_shard   ("replicate", "shard")           FSDP over both             plain (over the shards)

strategy.tp_size = T > 1 adds a "tp" dimension (innermost: its ranks are consecutive) to any
of them, and N / T data-parallel ranks remain. The model step then starts with tensor
parallelism, torchtitan's order: minidist.tp.parallelize_gpt over layout["tp"] replaces the
layers by their slices, and the data-parallel engine above wraps *that* model over "dp"
(or ("replicate", "shard")) exactly as it would a plain one: it sees ordinary parameters of
the slices' shapes, the same on every rank of its group. The two never share a collective:
TP's all_reduces run inside forward and backward on the tp group, the engine's on dp.

A new kind of parallelism (CPU offload, pipeline stages) is a new step here and,
if it shards state, a state-dict method on its engine: the training loop and the
checkpoints ask the wrapped objects what they offer (`no_sync`, `full_state_dict`,
`sharded_state_dict`), never which strategy is running. What is split over which
dimension is declared on the parameters themselves (minidist.sharding: TP's slices
over "tp", FSDP's shards over its dimension), so that clipping and whole-model
checkpoints work for any composition (minidist.parallel.placement).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Callable

import torch
import torch.nn as nn

import minidist
from minidist.fsdp import ShardingStrategy
from minidist.mesh import DP, REPLICATE, SHARD, TP, Layout, ParallelDims
from minidist.models.gpt import GPT
from minidist.precision import MixedPrecisionPolicy
from minidist.runtime import Topology
from minidist.tp import parallelize_gpt
from minidist.parallel import placement

FSDP_STRATEGIES = tuple(s.value for s in ShardingStrategy)
"""Strategies that are minidist.FSDP's sharding_strategy values."""
DDP_STRATEGIES = ("ddp",)
ZERO_STRATEGIES = ("zero1", "zero2", "zero1_broadcast")
"""Strategies whose optimizer is minidist.ShardedOptimizer (the model is not wrapped)."""
SETTINGS = {TP: "strategy.tp_size", SHARD: "strategy.shard_size"}
"""The config keys that set each degree, for one-line errors."""


def build_layout(strategy_cfg, topo: Topology) -> Layout:
    """The strategy's degrees, checked against the world (one line naming the setting), as a Layout."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", topo.world_size))
    return layout_dims(strategy_cfg, topo.world_size, local).build(topo.device.type)


def layout_dims(strategy_cfg, world: int, local_world: int | None = None) -> ParallelDims:
    """The strategy's degrees at `world` ranks (`local_world` per node); ValueError names the setting."""
    name = strategy_cfg.name
    if name == "single" and world != 1:
        raise ValueError(f"strategy=single runs one process, but this job has {world}; "
                         f"use strategy=ddp (or another data-parallel strategy) under torchrun")
    tp = getattr(strategy_cfg, "tp_size", 1)
    if name == "hybrid_shard":
        shard = strategy_cfg.shard_size
        if shard is None:  # one shard group per node: all_gather/reduce_scatter on the fast links
            shard = max(1, (local_world or world) // max(tp, 1))
        return ParallelDims.infer(world, tp=tp, shard=shard, hybrid=True, settings=SETTINGS)
    # FSDP's full_shard and shard_grad_op split the parameters over every data-parallel rank
    sharded = name in (ShardingStrategy.FULL_SHARD.value, ShardingStrategy.SHARD_GRAD_OP.value)
    return ParallelDims.infer(world, tp=tp, shard=-1 if sharded else 1, settings=SETTINGS)


def parallelize(model: nn.Module, layout: Layout, strategy_cfg, block_types: tuple[type, ...],
                policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """Wrap `model` (already on its device) as the strategy says; returns what forward/backward run on."""
    name = strategy_cfg.name
    if layout.size(TP) > 1:  # the layers first, then data parallelism over what remains
        model = _apply_tp(model, layout[TP], strategy_cfg)
    if name in FSDP_STRATEGIES:
        hybrid = name == ShardingStrategy.HYBRID_SHARD.value
        return _apply_fsdp(model, layout[(REPLICATE, SHARD)] if hybrid else layout[DP], strategy_cfg,
                           block_types, policy)
    if name in DDP_STRATEGIES:
        return _apply_ddp(model, layout[DP], strategy_cfg, policy)
    return model


def _apply_tp(model: nn.Module, mesh, cfg) -> nn.Module:
    """Megatron-LM's layout over the 1-D "tp" mesh (minidist.tp.parallelize_gpt), in place."""
    if not isinstance(model, GPT):
        raise ValueError(f"strategy.tp_size={mesh.size()}: tensor parallelism has a plan for model=gpt only, "
                         f"not {type(model).__name__}; use strategy.tp_size=1")
    return parallelize_gpt(model, mesh, sequence_parallel=cfg.sequence_parallel, vocab_parallel=cfg.vocab_parallel)


def _apply_ddp(model: nn.Module, mesh, cfg, policy: MixedPrecisionPolicy | None) -> nn.Module:
    return minidist.DDP(model, device_mesh=mesh, bucket_cap_mb=cfg.bucket_cap_mb,
                        find_unused_parameters=cfg.find_unused_parameters,
                        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                        broadcast_buffers=cfg.broadcast_buffers, comm_hook=_comm_hook(cfg.comm_hook),
                        mixed_precision=policy)


def _apply_fsdp(model: nn.Module, mesh, cfg, block_types: tuple[type, ...],
                policy: MixedPrecisionPolicy | None) -> nn.Module:
    policy = policy or MixedPrecisionPolicy(cfg.param_dtype.torch_dtype if cfg.param_dtype else None,
                                            cfg.reduce_dtype.torch_dtype if cfg.reduce_dtype else None)
    return minidist.FSDP(model, mesh=mesh, wrap=set(block_types) if cfg.wrap_blocks else None,
                         sharding_strategy=cfg.name, forward_prefetch=cfg.forward_prefetch,
                         backward_prefetch=cfg.backward_prefetch,
                         max_inflight_all_gathers=cfg.max_inflight_all_gathers,
                         param_dtype=policy.param_dtype, reduce_dtype=policy.reduce_dtype)


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


def _comm_hook(path: str | None) -> Callable | None:
    if not path:
        return None
    mod, _, fn = path.partition(":")
    if not fn:
        raise ValueError(f"strategy.comm_hook={path!r} must be 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def build_optimizer(model: nn.Module, layout: Layout, strategy_cfg, optim_cfg,
                    policy: MixedPrecisionPolicy | None = None) -> torch.optim.Optimizer:
    """The optimizer over what the model trains: sharded over "dp" for the ZeRO strategies, plain otherwise."""
    cls, kwargs = optimizer_class(optim_cfg)
    if strategy_cfg.name in ZERO_STRATEGIES:
        variant = dict(owner_broadcast=True) if strategy_cfg.name == "zero1_broadcast" else dict(
            stage=int(strategy_cfg.name[-1]), mp_policy=policy, overlap_param_gather=strategy_cfg.overlap_param_gather)
        return minidist.ShardedOptimizer(list(model.parameters()), cls, mesh=layout[DP], module=model,
                                         bucket_cap_mb=strategy_cfg.bucket_cap_mb, **variant, **kwargs)
    return cls(model.parameters(), **kwargs)


def optimizer_class(optim_cfg) -> tuple[type, dict]:
    """(torch optimizer class, its keyword arguments) for cfg.optim."""
    if optim_cfg.name == "adamw":
        return torch.optim.AdamW, dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                       weight_decay=optim_cfg.weight_decay)
    if optim_cfg.name == "sgd":
        return torch.optim.SGD, dict(lr=optim_cfg.lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov,
                                     weight_decay=optim_cfg.weight_decay)
    raise ValueError(f"unknown optim.name={optim_cfg.name!r}; valid: adamw, sgd")


# ------------------------------------------------- what the loop asks of the wrapped model
def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside any wrapper (under FSDP its parameters are this rank's shards)."""
    return getattr(model, "module", model)


def no_sync(model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
    """Skip gradient communication for an accumulation micro-step: the engine that reduces the gradients
    (the model's wrapper, or ZeRO's optimizer) offers no_sync; nothing to skip without one. Put the
    backward inside the block too: ZeRO (and FSDP) read it there, DDP in the forward."""
    for engine in (model, optimizer):
        if hasattr(engine, "no_sync"):
            return engine.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm_(model: nn.Module, max_norm: float, layout: Layout, optimizer: torch.optim.Optimizer | None = None,
                    norm_type: float = 2.0) -> torch.Tensor:
    """Clip the global gradient norm; returns it as a tensor (reading it is a host sync: log steps only).

    The norm of the whole model's gradient whatever is split where: each parameter's
    squared norm summed over the dimensions it declares (FSDP's shards over "dp" or
    "shard", a tensor-parallel slice over "tp"), replicated ones counted once
    (minidist.parallel.placement.global_norm). Then every gradient is scaled by
    min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ does.
    ZeRO keeps the averaged gradients in its optimizer's partitions (p.grad is None
    after backward): there the pieces it holds are grouped by their parameter's
    declaration, plus "dp" (each element lives on one data-parallel rank).
    """
    if hasattr(optimizer, "grad_pieces"):
        pieces, split_over_dp = optimizer.grad_pieces()
        also = (DP,) if split_over_dp else ()
        groups = {placement.dims_of(p, also): [] for p in optimizer.parameters_in_order}  # the same on every rank
        for p, g in pieces:
            groups[placement.dims_of(p, also)].append(g)
        total = placement.global_norm(groups, layout, norm_type)
        if pieces:  # views of the partitions' fp32 gradients: scaling them scales the step
            torch._foreach_mul_([g for _, g in pieces], torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total
    params = list(model.parameters())
    total = placement.global_norm(params, layout, norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def full_state_dict(model: nn.Module, layout: Layout) -> dict:
    """The whole model's state on the main process ({} elsewhere). A collective.

    Each tensor-parallel slice is first made whole over the data-parallel ranks (the
    engine's full_state_dict gathers FSDP's shards onto the slice's first data-parallel
    rank; a replicated model is whole already), then those first ranks concatenate the
    slices along "tp" (nothing to do without tensor parallelism).
    """
    first = layout.dp_rank == 0
    if hasattr(model, "full_state_dict"):
        state = model.full_state_dict(rank0_only=True, cpu_offload=True)
    else:
        state = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()} if first else {}
    if first:
        state = placement.gather_whole(state, placement.splits(unwrap(model), TP), layout, TP)
    return state if layout.is_main else {}
