"""Parallelism by composition: a mesh, the wrappers applied over its dimensions, then the optimizer.

    mesh = build_mesh(cfg.strategy, topo)                         # which ranks do what
    policy = precision_policy(cfg.trainer, cfg.strategy)          # trainer.precision: engine dtypes
    model = parallelize(model, mesh, cfg.strategy, block_types, policy)   # DDP / FSDP over the mesh
    optimizer = build_optimizer(model, mesh, cfg.strategy, cfg.optim, policy)   # ZeRO shards it

Each strategy is a short list of steps, not a branch in every method:

    strategy       mesh                          model step          optimizer step
    single         1-D "dp" of size 1            -                   plain
    ddp            1-D "dp"                      DDP over "dp"       plain
    zero1, zero2   1-D "dp"                      -                   ShardedOptimizer(stage=1|2) over "dp"
                                                                     (it hooks the gradients itself)
    zero1_broadcast 1-D "dp"                     -                   ShardedOptimizer(owner_broadcast=True)
    full_shard,
    shard_grad_op,
    no_shard       1-D "dp"                      FSDP over "dp"      plain (over the shards)
    hybrid_shard   2-D ("replicate", "shard")    FSDP over both      plain (over the shards)

A new kind of parallelism (tensor parallel, CPU offload) is a new step here and,
if it shards state, a state-dict method on its engine: the training loop and the
checkpoints ask the wrapped objects what they offer (`no_sync`, `clip_grad_norm_`,
`sharded_state_dict`), never which strategy is running.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

import minidist
from minidist.fsdp import ShardingStrategy
from minidist.mesh import data_parallel_mesh, hybrid_mesh, is_main
from minidist.precision import MixedPrecisionPolicy
from minidist.runtime import Topology

FSDP_STRATEGIES = tuple(s.value for s in ShardingStrategy)
"""Strategies that are minidist.FSDP's sharding_strategy values."""
DDP_STRATEGIES = ("ddp",)
ZERO_STRATEGIES = ("zero1", "zero2", "zero1_broadcast")
"""Strategies whose optimizer is minidist.ShardedOptimizer (the model is not wrapped)."""


def build_mesh(strategy_cfg, topo: Topology) -> DeviceMesh:
    """The mesh the strategy needs: 2-D for hybrid_shard, 1-D over every rank otherwise."""
    if strategy_cfg.name == "single" and topo.world_size != 1:
        raise ValueError(f"strategy=single runs one process, but the world has {topo.world_size}; "
                         f"use strategy=ddp (or another data-parallel strategy) under torchrun")
    if strategy_cfg.name == "hybrid_shard":
        shard = strategy_cfg.shard_size
        if shard is None:  # one shard group per node: all_gather/reduce_scatter on the fast links
            shard = int(os.environ.get("LOCAL_WORLD_SIZE", topo.world_size))
        return hybrid_mesh(topo, shard)
    return data_parallel_mesh(topo)


def parallelize(model: nn.Module, mesh: DeviceMesh, strategy_cfg, block_types: tuple[type, ...],
                policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """Wrap `model` (already on its device) as the strategy says; returns what forward/backward run on."""
    name = strategy_cfg.name
    if name in FSDP_STRATEGIES:
        return _apply_fsdp(model, mesh, strategy_cfg, block_types, policy)
    if name in DDP_STRATEGIES:
        return _apply_ddp(model, mesh, strategy_cfg, policy)
    return model


def _apply_ddp(model: nn.Module, mesh: DeviceMesh, cfg, policy: MixedPrecisionPolicy | None) -> nn.Module:
    return minidist.DDP(model, device_mesh=mesh, bucket_cap_mb=cfg.bucket_cap_mb,
                        find_unused_parameters=cfg.find_unused_parameters,
                        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                        broadcast_buffers=cfg.broadcast_buffers, comm_hook=_comm_hook(cfg.comm_hook),
                        mixed_precision=policy)


def _apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg, block_types: tuple[type, ...],
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


def build_optimizer(model: nn.Module, mesh: DeviceMesh, strategy_cfg, optim_cfg,
                    policy: MixedPrecisionPolicy | None = None) -> torch.optim.Optimizer:
    """The optimizer over what the model trains: sharded across the mesh for the ZeRO strategies, plain otherwise."""
    cls, kwargs = optimizer_class(optim_cfg)
    if strategy_cfg.name in ZERO_STRATEGIES:
        variant = dict(owner_broadcast=True) if strategy_cfg.name == "zero1_broadcast" else dict(
            stage=int(strategy_cfg.name[-1]), mp_policy=policy, overlap_param_gather=strategy_cfg.overlap_param_gather)
        return minidist.ShardedOptimizer(list(model.parameters()), cls, mesh=mesh, module=model,
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


def clip_grad_norm_(model: nn.Module, max_norm: float, optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
    """Clip the global gradient norm; returns it as a tensor (reading it is a host sync: log steps only).

    An engine whose gradients are sharded offers its own (it must reduce the shards'
    squared norms across ranks): the model (FSDP) or the optimizer (ZeRO, whose
    partitions hold the gradients); replicated gradients are already whole on every rank.
    """
    for engine in (model, optimizer):
        if hasattr(engine, "clip_grad_norm_"):
            return engine.clip_grad_norm_(max_norm)
    return torch.nn.utils.clip_grad_norm_(unwrap(model).parameters(), max_norm)


def full_state_dict(model: nn.Module, mesh: DeviceMesh) -> dict:
    """The whole model's state on the main process ({} elsewhere). A collective for sharded engines."""
    if hasattr(model, "full_state_dict"):
        return model.full_state_dict(rank0_only=True, cpu_offload=True)
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()} if is_main(mesh) else {}
