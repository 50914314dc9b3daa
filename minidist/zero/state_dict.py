"""Sharded state dicts that resume at any world size: the state, cut by parameter and element range.

Each rank saves, for every piece of a parameter in its shards (bucket_shards.py), the
elements of each per-element state tensor (Adam's exp_avg, exp_avg_sq) that belong
to that piece, and once each scalar (Adam's step). Under mixed precision the fp32
master weights are saved the same way (key MASTER): they are the real weights, the
model's bf16 copy is rounded.

    {"format": FORMAT, "world_size": N, "rank": r, "numels": [numel of every parameter],
     "state": {param index: {key: [(first element, 1-D tensor), ...] or a scalar}},
     "param_groups": [hyperparameters of each group]}

Loading at M ranks merges every saved rank's pieces into whole per-parameter
tensors and cuts the new shards from them. The format knows
nothing of buckets or owners, so a checkpoint also moves between bucket sizes and
between the flat shards and the owner-broadcast variant.
"""

from __future__ import annotations

from typing import Any

import torch

FORMAT = "minidist.zero/pieces-1"
MASTER = "__master__"


def _local_tensors(opt) -> list[torch.Tensor]:
    return [t for g in opt.optim.param_groups for t in g["params"]]


def _elementwise(value: Any, t: torch.Tensor) -> bool:
    """A state entry with one value per element of the shard (not a scalar such as Adam's step)."""
    return isinstance(value, torch.Tensor) and value.shape == t.shape


def sharded_state_dict(opt) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for t, pieces in zip(_local_tensors(opt), opt.engine.local_pieces()):
        entries = list(opt.optim.state.get(t, {}).items())
        if opt.engine.separate_masters:
            entries.append((MASTER, t.detach()))
        for piece in pieces:
            into = state.setdefault(piece.param, {})
            for key, value in entries:
                if _elementwise(value, t):
                    part = value.detach().reshape(-1)[piece.shard_start:piece.shard_start + piece.numel]
                    into.setdefault(key, []).append((piece.param_start, part.clone().cpu()))
                else:
                    into[key] = value.detach().clone().cpu() if isinstance(value, torch.Tensor) else value
    return {"format": FORMAT, "world_size": opt.world_size, "rank": opt.rank,
            "numels": [p.numel() for p in opt.parameters_in_order], "state": state,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}


def _merge(shards: list[dict[str, Any]], numels: list[int]) -> dict[int, tuple[dict, dict]]:
    """Every saved rank's pieces as whole per-parameter tensors: param -> (elementwise, scalars)."""
    merged: dict[int, tuple[dict, dict]] = {}
    for shard in shards:
        for param, entries in shard["state"].items():
            whole, scalars = merged.setdefault(param, ({}, {}))
            for key, value in entries.items():
                if isinstance(value, list):
                    if key not in whole:
                        whole[key] = torch.zeros(numels[param], dtype=value[0][1].dtype)
                    for start, part in value:
                        whole[key][start:start + part.numel()] = part
                else:
                    scalars[key] = value
    return merged


def load_sharded_state_dict(opt, shards: list[dict[str, Any]]) -> None:
    by_rank = {s.get("rank"): s for s in shards}
    saved_world = shards[0].get("world_size", 0) if shards else 0
    if not shards or sorted(by_rank) != list(range(saved_world)):
        raise ValueError(f"ShardedOptimizer.load_sharded_state_dict: need the sharded state dicts of all "
                         f"{saved_world} saved ranks, got ranks {sorted(by_rank)}")
    if shards[0].get("format") != FORMAT:
        raise ValueError(f"ShardedOptimizer.load_sharded_state_dict: not a {FORMAT} state dict (format "
                         f"{shards[0].get('format')!r}); it was written by another engine or minidist version")
    numels = [p.numel() for p in opt.parameters_in_order]
    if list(shards[0]["numels"]) != numels:
        raise ValueError("ShardedOptimizer.load_sharded_state_dict: the saved parameter sizes differ from this "
                         "optimizer's (different model or parameter order)")
    merged = _merge(shards, numels)
    state, masters = {}, []
    for j, (t, pieces) in enumerate(zip(_local_tensors(opt), opt.engine.local_pieces())):
        entries: dict[str, Any] = {}
        for piece in pieces:
            whole, scalars = merged.get(piece.param, ({}, {}))
            for key, value in whole.items():
                if key not in entries:
                    entries[key] = torch.zeros(t.shape, dtype=value.dtype, device=t.device)
                entries[key].view(-1)[piece.shard_start:piece.shard_start + piece.numel] = \
                    value[piece.param_start:piece.param_start + piece.numel].to(t.device)
            for key, value in scalars.items():
                entries[key] = value.clone() if isinstance(value, torch.Tensor) else value
        masters.append(entries.pop(MASTER, None))
        if entries:
            state[j] = entries
    inner = opt.optim.state_dict()
    inner["state"] = state
    inner["param_groups"] = [dict(saved, params=g["params"])
                             for saved, g in zip(shards[0]["param_groups"], inner["param_groups"])]
    opt.optim.load_state_dict(inner)
    _load_masters(opt, masters)


def _load_masters(opt, masters: list[torch.Tensor | None]) -> None:
    """fp32 masters from the checkpoint where it has them, else re-read from the (just loaded) parameters."""
    if not opt.engine.separate_masters:
        return
    opt.engine.refresh_masters()
    with torch.no_grad():
        for t, saved in zip(_local_tensors(opt), masters):
            if saved is not None:
                t.copy_(saved)
