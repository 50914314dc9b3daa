"""Checkpoints of an FSDP model: full (plain module layout) and sharded (per-rank pieces).

Full state dict: every unit's flat buffer is all_gathered and split back into the
original parameters; the result loads into the unwrapped module. It costs S bytes
of memory on the receiving rank, so big models save sharded instead.

Sharded state dict: this rank's piece of every parameter (and of every optimizer
state tensor) plus the layout needed to put the pieces back together:

    {"world_size": N, "rank": r,
     "params":  {fqn: {"shard": 1-D tensor, "global_shape": shape, "offset": k}},
     "aliases": {tied_fqn: fqn}, "buffers": {name: tensor},
     "optim":   {"state": {fqn: {"sharded": {key: 1-D}, "replicated": {key: value}}},
                 "param_groups": [{hyperparameters..., "params": [fqn, ...]}]}}

`offset` is where the shard starts inside the flattened parameter. Loading takes the
dicts of all N saved ranks, reassembles each parameter (and each optimizer state
tensor) from its pieces and cuts out this rank's piece under the *current* layout,
so a checkpoint written at world size N loads at world size M. (N, r: the shard
group's size and this rank's place in it; hybrid replicas save the same shard.)

Everything here reads the model through FSDP's public API: `module`, `units`
(each unit's `flat` layout and `sharded_state`) and `mesh_info`.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp.collectives import MeshInfo
from minidist.fsdp.param import FlatParamShard
from minidist.fsdp.unit import FSDPUnit, ShardedState


class ShardedModel(Protocol):
    """What this module reads of an FSDP model: its public layout (minidist.fsdp.api.FSDP)."""

    module: nn.Module
    mesh_info: MeshInfo

    @property
    def units(self) -> list[FSDPUnit]: ...


def _check_idle(model: ShardedModel) -> None:
    for u in model.units:
        if u.sharded_state is not ShardedState.SHARDED:
            raise RuntimeError(f"state dicts need every unit sharded (between steps); {u} is not")


def _gather_full(model: ShardedModel, flat: FlatParamShard) -> torch.Tensor:
    """(padded,) full parameter values of one unit, in the master dtype, on every rank."""
    if model.mesh_info.shard_world == 1:
        return flat.local_shard.detach().clone()
    full = torch.empty(flat.padded, dtype=flat.dtype, device=flat.device)
    comm.all_gather(full, flat.local_shard.detach(), group=model.mesh_info.shard_group)
    return full


def _param_entries(model: ShardedModel) -> Iterable[tuple[str, Any, FlatParamShard, int]]:
    """(canonical fqn, info, flat, index) for every original parameter."""
    for u in model.units:
        for i, info in enumerate(u.flat.infos):
            yield info.fqns[0], info, u.flat, i


@torch.no_grad()
def full_state_dict(model: ShardedModel, *, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
    """The plain module's state_dict (original names and shapes, tied names sharing a tensor).

    rank0_only: only the mesh's first rank (group rank 0 of the shard and replicate
    groups) gets the values, every other rank {}. Collective: call on every rank.
    """
    _check_idle(model)
    values: dict[str, torch.Tensor] = {}
    for u in model.units:
        if not u.flat.infos:
            continue
        full = _gather_full(model, u.flat)
        for info, t in zip(u.flat.infos, u.flat.split_flat(full)):
            t = t.clone().cpu() if cpu_offload else t.clone()
            for fqn in info.fqns:
                values[fqn] = t
    if rank0_only and not model.mesh_info.is_first:
        return {}
    out = {}
    for key, v in model.module.state_dict(keep_vars=True).items():
        if key in values:
            out[key] = values[key]
        else:  # a buffer
            v = v.detach().clone()
            out[key] = v.cpu() if cpu_offload else v
    return out


def _broadcast_from_first(model: ShardedModel, t: torch.Tensor) -> None:
    """Copy `t` from the mesh's first rank to all its ranks (hybrid: across replicas, then shards)."""
    m = model.mesh_info
    if m.replicate_world > 1 and m.shard_rank == 0:
        comm.broadcast(t, group=m.replicate_group, group_src=0)
    if m.shard_world > 1:
        comm.broadcast(t, group=m.shard_group, group_src=0)


@torch.no_grad()
def load_full_state_dict(model: ShardedModel, state_dict: dict[str, torch.Tensor] | None, *,
                         broadcast_from_rank0: bool = False) -> None:
    """Load a plain state dict, present on every rank or (broadcast_from_rank0) on the mesh's first rank only."""
    _check_idle(model)
    source = model.mesh_info.is_first if broadcast_from_rank0 else True
    if source:
        missing = [fqn for fqn, *_ in _param_entries(model) if fqn not in state_dict]
        if missing:
            raise KeyError(f"load_full_state_dict: missing parameters {missing}")
    for u in model.units:
        flat = u.flat
        if not flat.infos:
            continue
        full = torch.zeros(flat.padded, dtype=flat.dtype, device=flat.device)
        if source:
            for info, view in zip(flat.infos, flat.split_flat(full)):
                view.copy_(state_dict[info.fqns[0]].reshape(view.shape))
        if broadcast_from_rank0:
            _broadcast_from_first(model, full)
        flat.local_shard.copy_(flat.shard_of(full))
    for name, buf in model.module.named_buffers():
        if source and name in state_dict:
            buf.copy_(state_dict[name])
        if broadcast_from_rank0:
            _broadcast_from_first(model, buf)


@torch.no_grad()
def sharded_state_dict(model: ShardedModel, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """This rank's shards of parameters and optimizer state, with their layout."""
    _check_idle(model)
    params, aliases, names = {}, {}, {}
    for fqn, info, flat, i in _param_entries(model):
        sp = flat.sharded_params[i]
        names[sp] = fqn
        params[fqn] = {"shard": sp.detach().clone().cpu(), "global_shape": tuple(flat.shapes[i]),
                       "offset": flat.param_ranges[i][0]}
        for alias in info.fqns[1:]:
            aliases[alias] = fqn
    out: dict[str, Any] = {"world_size": model.mesh_info.shard_world, "rank": model.mesh_info.shard_rank,
                           "params": params, "aliases": aliases,
                           "buffers": {n: b.detach().clone().cpu() for n, b in model.module.named_buffers()}}
    if optimizer is not None:
        state = {}
        for sp, st in optimizer.state.items():
            entry = {"sharded": {}, "replicated": {}}
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() == 1 and v.shape == sp.shape:
                    entry["sharded"][k] = v.detach().clone().cpu()
                else:
                    entry["replicated"][k] = v.detach().clone().cpu() if isinstance(v, torch.Tensor) else v
            state[names[sp]] = entry
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [names[p] for p in g["params"]]}
                  for g in optimizer.param_groups]
        out["optim"] = {"state": state, "param_groups": groups}
    return out


def _reassemble(pieces: list[tuple[int, torch.Tensor]], numel: int) -> torch.Tensor:
    """One flattened tensor of `numel` elements from (offset, 1-D piece) pairs covering it."""
    full = torch.zeros(numel, dtype=pieces[0][1].dtype)
    covered = 0
    for off, t in pieces:
        full[off:off + t.numel()] = t
        covered += t.numel()
    if covered != numel:
        raise ValueError(f"shards cover {covered} of {numel} elements: pass the dicts of all saved ranks")
    return full


@torch.no_grad()
def load_sharded_state_dict(model: ShardedModel, shards: list[dict[str, Any]],
                            optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load from the sharded dicts of ALL saved ranks (any world size) into this rank's shards."""
    _check_idle(model)
    by_rank = {s["rank"]: s for s in shards}  # hybrid replicas saved the same shard twice
    saved_world = shards[0]["world_size"]
    if sorted(by_rank) != list(range(saved_world)):
        raise ValueError(f"need the sharded state dicts of all {saved_world} saved ranks, got ranks {sorted(by_rank)}")
    saved = [by_rank[r] for r in range(saved_world)]
    entries = list(_param_entries(model))
    for fqn, info, flat, i in entries:
        if fqn not in saved[0]["params"]:
            raise KeyError(f"load_sharded_state_dict: {fqn!r} is not in the checkpoint")
        pieces = [(s["params"][fqn]["offset"], s["params"][fqn]["shard"]) for s in saved]
        full = _reassemble(pieces, flat.numels[i])
        pa, pb = flat.param_ranges[i]
        flat.sharded_params[i].copy_(full[pa:pb])
    for name, buf in model.module.named_buffers():
        buf.copy_(saved[0]["buffers"][name])
    if optimizer is None:
        return
    if "optim" not in saved[0]:
        raise KeyError("load_sharded_state_dict: the checkpoint has no optimizer state (saved without optimizer=)")
    param_of = {fqn: flat.sharded_params[i] for fqn, _, flat, i in entries}
    numel_of = {fqn: (flat.numels[i], flat.param_ranges[i]) for fqn, _, flat, i in entries}
    optimizer.state.clear()
    for fqn, entry in saved[0]["optim"]["state"].items():
        sp = param_of[fqn]
        numel, (pa, pb) = numel_of[fqn]
        # clone: the optimizer updates its state in place and must not write into the checkpoint
        new = {k: (v.clone().to(sp.device) if isinstance(v, torch.Tensor) else v) for k, v in entry["replicated"].items()}
        for k in entry["sharded"]:
            pieces = [(s["params"][fqn]["offset"], s["optim"]["state"][fqn]["sharded"][k]) for s in saved]
            new[k] = _reassemble(pieces, numel)[pa:pb].clone().to(sp.device)
        optimizer.state[sp] = new
    for group, saved_group in zip(optimizer.param_groups, saved[0]["optim"]["param_groups"]):
        group.update({k: v for k, v in saved_group.items() if k != "params"})
