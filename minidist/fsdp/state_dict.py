"""Checkpoints of an FSDP model: full (plain module layout) and sharded (per-rank rows).

Full state dict: every unit's shards are all_gathered and cut back into the original
parameters (padding rows dropped); the result loads into the unwrapped module. It costs
S bytes of memory on the receiving rank, so big models save sharded instead.

Sharded state dict, format 2 (FORMAT_VERSION): this rank's rows of every parameter (and of
every optimizer state tensor shaped like them) plus what it takes to put them together:

    {"format_version": 2, "world_size": N, "rank": r,
     "params":  {fqn: {"shard": (rows, *trailing dims), "global_shape": shape, "row_offset": k}},
     "aliases": {tied_fqn: fqn}, "buffers": {name: tensor},
     "optim":   {"state": {fqn: {"sharded": {key: rows}, "replicated": {key: value}}},
                 "param_groups": [{hyperparameters..., "params": [fqn, ...]}]}}

`row_offset` is the first row (dim 0) this rank holds. Loading takes the dicts of all N
saved ranks, stacks each parameter (and each optimizer state tensor) from its rows and
cuts out this rank's rows under the *current* layout, so a checkpoint written at world
size N loads at world size M. (N, r: the shard group's size and this rank's place in it;
hybrid replicas save the same rows, and any one of them will do.)

Format 1, written by the flat-parameter FSDP before, has no "format_version": its pieces
are 1-D ranges of the flattened parameter at "offset". It loads: the pieces are put
together by offset and reshaped to the global shape. A version this code does not know
is refused in one line.

Everything here reads the model through FSDP's public API: `module`, `units` (each unit's
`shards` and `sharded_state`) and `mesh_info`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

import torch
import torch.nn as nn

from minidist import comm
from minidist.fsdp.shard_spec import MeshInfo
from minidist.fsdp.param import FSDPParam, UnitShards
from minidist.fsdp.unit import FSDPUnit, ShardedState

FORMAT_VERSION = 2
"""Sharded state dict format written here; 1 (the flat-parameter FSDP's) and 2 load."""


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


def _params(model: ShardedModel) -> Iterable[FSDPParam]:
    for u in model.units:
        yield from u.shards.params


def _gather_full(model: ShardedModel, shards: UnitShards) -> list[torch.Tensor]:
    """Every parameter of one unit at full size, in the master dtype, on every rank (compute device)."""
    local = shards.local.detach().to(shards.compute_device)
    if model.mesh_info.shard_world == 1:
        return shards.unpad(local.clone())
    full = torch.empty(shards.padded, dtype=shards.dtype, device=shards.compute_device)
    comm.all_gather(full, local, group=model.mesh_info.shard_group)
    return shards.unpad(full)


@torch.no_grad()
def full_state_dict(model: ShardedModel, *, rank0_only: bool = True, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
    """The plain module's state_dict (original names and shapes, tied names sharing a tensor).

    rank0_only: only the mesh's first rank (group rank 0 of the shard and replicate
    groups) gets the values, every other rank {}. Collective: call on every rank.
    """
    _check_idle(model)
    values: dict[str, torch.Tensor] = {}
    for u in model.units:
        for fp, t in zip(u.shards.params, _gather_full(model, u.shards)):
            t = t.clone().cpu() if cpu_offload else t.clone()
            for fqn in fp.fqns:
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
    if m.replicate_world > 1 and m.shard_rank == 0:  # a group of None is the world: test the sizes
        comm.broadcast_tensors([t], group=m.replicate_group)
    if m.shard_world > 1:
        comm.broadcast_tensors([t], group=m.shard_group)


def _my_rows(fp: FSDPParam, whole: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a (rows, row_numel) tensor, shaped like its sharded parameter."""
    start, end = fp.spec.row_range()
    return whole[start:end].reshape(fp.spec.local_shape)


@torch.no_grad()
def load_full_state_dict(model: ShardedModel, state_dict: dict[str, torch.Tensor] | None, *,
                         broadcast_from_rank0: bool = False) -> None:
    """Load a plain state dict, present on every rank or (broadcast_from_rank0) on the mesh's first rank only."""
    _check_idle(model)
    source = model.mesh_info.is_first if broadcast_from_rank0 else True
    if source:
        missing = [fp.spec.fqn for fp in _params(model) if fp.spec.fqn not in state_dict]
        if missing:
            raise KeyError(f"load_full_state_dict: missing parameters {missing}")
    for u in model.units:  # one flat tensor per unit: one broadcast per unit
        params = u.shards.params
        numels = [fp.spec.global_shape.numel() for fp in params]
        flat = torch.zeros(sum(numels), dtype=u.shards.dtype, device=u.shards.compute_device)
        if source and params:
            torch.cat([state_dict[fp.spec.fqn].reshape(-1).to(flat) for fp in params], out=flat)
        if broadcast_from_rank0 and params:
            _broadcast_from_first(model, flat)
        for fp, v in zip(params, flat.split(numels)):
            fp.sharded.copy_(_my_rows(fp, v.view(fp.spec.rows, fp.spec.row_numel)))
    for name, buf in model.module.named_buffers():
        if source and name in state_dict:
            buf.copy_(state_dict[name])
        if broadcast_from_rank0:
            _broadcast_from_first(model, buf)


@torch.no_grad()
def sharded_state_dict(model: ShardedModel, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """This rank's rows of parameters and optimizer state, with their layout (format 2)."""
    _check_idle(model)
    params, aliases, names = {}, {}, {}
    for fp in _params(model):
        fqn, sp = fp.spec.fqn, fp.sharded
        names[sp] = fqn
        params[fqn] = {"shard": sp.detach().clone().cpu(), "global_shape": tuple(fp.spec.global_shape),
                       "row_offset": fp.spec.row_range()[0]}
        for alias in fp.fqns[1:]:
            aliases[alias] = fqn
    out: dict[str, Any] = {"format_version": FORMAT_VERSION, "world_size": model.mesh_info.shard_world,
                           "rank": model.mesh_info.shard_rank, "params": params, "aliases": aliases,
                           "buffers": {n: b.detach().clone().cpu() for n, b in model.module.named_buffers()}}
    if optimizer is not None:
        state = {}
        for sp, st in optimizer.state.items():
            entry = {"sharded": {}, "replicated": {}}
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == sp.shape:
                    entry["sharded"][k] = v.detach().clone().cpu()
                else:
                    entry["replicated"][k] = v.detach().clone().cpu() if isinstance(v, torch.Tensor) else v
            state[names[sp]] = entry
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [names[p] for p in g["params"]]}
                  for g in optimizer.param_groups]
        out["optim"] = {"state": state, "param_groups": groups}
    return out


def _saved_ranks(shards: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """(format version, the dicts of saved ranks 0..N-1), or one line saying what is wrong."""
    if not shards or not all(isinstance(s, dict) and "params" in s for s in shards):
        raise ValueError("load_sharded_state_dict: expected the FSDP sharded state dicts of every saved rank "
                         "(what FSDP.sharded_state_dict returned)")
    versions = {s.get("format_version", 1) for s in shards}
    if len(versions) > 1 or not versions <= {1, FORMAT_VERSION}:
        raise ValueError(f"load_sharded_state_dict: sharded checkpoint format {sorted(versions)}, this minidist reads "
                         f"formats 1 and {FORMAT_VERSION}: load it with the minidist that wrote it and save a full "
                         f"state dict")
    by_rank = {s["rank"]: s for s in shards}  # hybrid replicas saved the same rows twice
    saved_world = shards[0]["world_size"]
    if sorted(by_rank) != list(range(saved_world)):
        raise ValueError(f"need the sharded state dicts of all {saved_world} saved ranks, got ranks {sorted(by_rank)}")
    return versions.pop(), [by_rank[r] for r in range(saved_world)]


def _whole(version: int, saved: list[dict], fqn: str, piece: Callable[[dict], torch.Tensor],
           fp: FSDPParam) -> torch.Tensor:
    """One parameter's (or optimizer state's) whole value as (rows, row_numel), from every saved rank's piece."""
    spec, covered = fp.spec, 0
    pieces = [(s["params"][fqn]["row_offset" if version > 1 else "offset"], piece(s)) for s in saved]
    if version == 1:  # 1-D ranges of the flattened parameter
        whole = torch.zeros(spec.global_shape.numel(), dtype=pieces[0][1].dtype)
        for off, t in pieces:
            whole[off:off + t.numel()] = t
            covered += t.numel()
        expected = whole.numel()
    else:  # rows
        whole = torch.zeros(spec.rows, spec.row_numel, dtype=pieces[0][1].dtype)
        for off, t in pieces:
            k = t.shape[0]
            whole[off:off + k] = t.reshape(k, spec.row_numel)
            covered += k
        expected = spec.rows
    if covered != expected:
        raise ValueError(f"shards of {fqn!r} cover {covered} of {expected}: pass the dicts of all saved ranks")
    return whole.view(spec.rows, spec.row_numel)


@torch.no_grad()
def load_sharded_state_dict(model: ShardedModel, shards: list[dict[str, Any]],
                            optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load from the sharded dicts of ALL saved ranks (any world size, format 1 or 2) into this rank's rows."""
    _check_idle(model)
    version, saved = _saved_ranks(shards)
    params = list(_params(model))
    for fp in params:
        fqn = fp.spec.fqn
        if fqn not in saved[0]["params"]:
            raise KeyError(f"load_sharded_state_dict: {fqn!r} is not in the checkpoint")
        fp.sharded.copy_(_my_rows(fp, _whole(version, saved, fqn, lambda s: s["params"][fqn]["shard"], fp)))
    for name, buf in model.module.named_buffers():
        buf.copy_(saved[0]["buffers"][name])
    if optimizer is None:
        return
    if "optim" not in saved[0]:
        raise KeyError("load_sharded_state_dict: the checkpoint has no optimizer state (saved without optimizer=)")
    by_fqn = {fp.spec.fqn: fp for fp in params}
    optimizer.state.clear()
    for fqn, entry in saved[0]["optim"]["state"].items():
        fp = by_fqn[fqn]
        dev = fp.sharded.device
        # clone: the optimizer updates its state in place and must not write into the checkpoint
        new = {k: (v.clone().to(dev) if isinstance(v, torch.Tensor) else v) for k, v in entry["replicated"].items()}
        for k in entry["sharded"]:
            whole = _whole(version, saved, fqn, lambda s: s["optim"]["state"][fqn]["sharded"][k], fp)
            new[k] = _my_rows(fp, whole).clone().to(dev)
        optimizer.state[fp.sharded] = new
    for group, saved_group in zip(optimizer.param_groups, saved[0]["optim"]["param_groups"]):
        group.update({k: v for k, v in saved_group.items() if k != "params"})
