"""One interface over the parallelism strategies, so the training loop never branches on them.

    strategy = build_strategy(cfg.strategy, model, cfg.optim, topo, block_types)
    with strategy.no_sync(): ...        # accumulate without communicating
    strategy.clip_grad_norm_(1.0)
    strategy.save(ckpt_dir) / strategy.load(ckpt_dir)
    strategy.full_state_dict()          # the whole model on rank 0 (a collective for FSDP)

What a checkpoint holds depends on where the state lives:

    strategy      model                          optimizer
    single, ddp   model.pt (full, rank 0)        model.pt (full, rank 0; identical everywhere)
    zero1         model.pt (full, rank 0)        shard_rank{r}.pt (each rank owns 1/N of it)
    FSDP kinds    shard_rank{r}.pt (sharded)     shard_rank{r}.pt (with the parameters it belongs to)

Files are written to a temporary name and os.replace'd into place, so a crash
mid-write leaves no half file under the real name.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

import minidist
from minidist import Topology

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FSDP_KINDS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


@dataclass
class Strategy:
    """The wrapped model, its optimizer, and the operations whose meaning depends on sharding."""

    kind: str
    model: nn.Module
    """What forward/backward run on (possibly a DDP or FSDP wrapper)."""
    optimizer: torch.optim.Optimizer
    topo: Topology

    @property
    def module(self) -> nn.Module:
        """The user's model inside any wrapper (for FSDP: its parameters are shards)."""
        return getattr(self.model, "module", self.model)

    @property
    def is_fsdp(self) -> bool:
        return self.kind in FSDP_KINDS

    def no_sync(self):
        """Skip gradient communication for an accumulation micro-step (a no-op without a wrapper)."""
        return self.model.no_sync() if hasattr(self.model, "no_sync") else contextlib.nullcontext()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the *global* gradient norm. FSDP must all_reduce its shards' squared norms; the others hold full grads."""
        if self.is_fsdp:
            return float(self.model.clip_grad_norm_(max_norm))
        return float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm))

    def full_state_dict(self) -> dict:
        """The whole model's state on rank 0 ({} elsewhere). Collective for FSDP: call on every rank."""
        if self.is_fsdp:
            return self.model.full_state_dict(rank0_only=True, cpu_offload=True)
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()} if self.topo.is_main else {}

    # ---------------------------------------------------------- checkpoint
    def save(self, ckpt_dir: Path) -> None:
        """Write this rank's part of the model and optimizer state into ckpt_dir."""
        r = self.topo.rank
        if self.is_fsdp:
            atomic_save(self.model.sharded_state_dict(optimizer=self.optimizer), ckpt_dir / f"shard_rank{r}.pt")
            return
        if self.kind == "zero1":
            atomic_save({"optimizer": self.optimizer.state_dict()}, ckpt_dir / f"shard_rank{r}.pt")
        if self.topo.is_main:
            full = {"model": self.module.state_dict()}
            if self.kind != "zero1":
                full["optimizer"] = self.optimizer.state_dict()
            atomic_save(full, ckpt_dir / "model.pt")

    def load(self, ckpt_dir: Path) -> None:
        """Inverse of save(), on every rank. FSDP ranks read every shard (the engine picks what it owns)."""
        if self.is_fsdp:
            shards = [_load(ckpt_dir / f"shard_rank{i}.pt") for i in range(self.topo.world_size)]
            self.model.load_sharded_state_dict(shards, optimizer=self.optimizer)
            return
        full = _load(ckpt_dir / "model.pt")
        self.module.load_state_dict(full["model"])
        if self.kind == "zero1":
            self.optimizer.load_state_dict(_load(ckpt_dir / f"shard_rank{self.topo.rank}.pt")["optimizer"])
        else:
            self.optimizer.load_state_dict(full["optimizer"])


def optimizer_factory(optim_cfg) -> tuple[type, dict]:
    """(torch optimizer class, its keyword arguments) for cfg.optim."""
    if optim_cfg.name == "adamw":
        return torch.optim.AdamW, dict(lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps,
                                       weight_decay=optim_cfg.weight_decay)
    if optim_cfg.name == "sgd":
        return torch.optim.SGD, dict(lr=optim_cfg.lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov,
                                     weight_decay=optim_cfg.weight_decay)
    raise ValueError(f"unknown optim.name={optim_cfg.name!r}; valid: adamw, sgd")


def _comm_hook(path: str | None) -> Callable | None:
    if not path:
        return None
    mod, _, fn = path.partition(":")
    if not fn:
        raise ValueError(f"strategy.comm_hook={path!r} must be 'module:function'")
    return getattr(importlib.import_module(mod), fn)


def build_strategy(cfg, model: nn.Module, optim_cfg, topo: Topology, block_types: tuple[type, ...]) -> Strategy:
    """Wrap `model` (already on topo.device) as cfg.name says and build its optimizer."""
    kind = cfg.name
    opt_cls, opt_kwargs = optimizer_factory(optim_cfg)
    if kind == "single":
        if topo.world_size != 1:
            raise ValueError(f"strategy=single runs one process, but the world has {topo.world_size}; "
                             f"use strategy=ddp (or another data-parallel strategy) under torchrun")
        return Strategy(kind, model, opt_cls(model.parameters(), **opt_kwargs), topo)
    if kind in ("ddp", "zero1"):
        wrapped = minidist.DDP(model, process_group=topo.group, bucket_cap_mb=cfg.bucket_cap_mb,
                                 find_unused_parameters=cfg.find_unused_parameters,
                                 gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                                 broadcast_buffers=cfg.broadcast_buffers, comm_hook=_comm_hook(cfg.comm_hook))
        if kind == "ddp":
            opt = opt_cls(wrapped.parameters(), **opt_kwargs)
        else:
            opt = minidist.ShardedOptimizer(list(wrapped.parameters()), opt_cls, process_group=topo.group,
                                              **opt_kwargs)
        return Strategy(kind, wrapped, opt, topo)
    if kind in FSDP_KINDS:
        from minidist.mesh import data_parallel_mesh, hybrid_mesh
        if kind == "hybrid_shard":
            shard_size = cfg.shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", topo.world_size))
            mesh = hybrid_mesh(topo, shard_size)
        else:
            mesh = data_parallel_mesh(topo)
        wrapped = minidist.FSDP(model, mesh=mesh, wrap=set(block_types) if cfg.wrap_blocks else None,
                           sharding_strategy=kind, forward_prefetch=cfg.forward_prefetch,
                           backward_prefetch=cfg.backward_prefetch,
                           max_inflight_all_gathers=cfg.max_inflight_all_gathers,
                           param_dtype=DTYPES[cfg.param_dtype.value] if cfg.param_dtype else None,
                           reduce_dtype=DTYPES[cfg.reduce_dtype.value] if cfg.reduce_dtype else None)
        return Strategy(kind, wrapped, opt_cls(wrapped.parameters(), **opt_kwargs), topo)
    raise ValueError(f"unknown strategy {kind!r}; valid: single, ddp, zero1, {', '.join(FSDP_KINDS)}")
