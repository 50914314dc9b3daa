"""What follows from a parameter being split over a mesh dimension: its whole value.

A parameter split over a dimension says so (minidist.sharding: a tensor-parallel layer
over "tp", FSDP's shards over "dp" or "shard"); a parameter that says nothing is whole on
every rank. The consequence for the gradient norm is minidist.clip's (each parameter's
squared norm summed over the dimensions that split it); the one here:

    gather_whole / local_slice      a whole tensor from the slices along "tp" (for a checkpoint
                                    or the final model), and this rank's slice of a whole one,
                                    q | k | v blocks included (minidist.sharding.join / cut)
    gather_stages                   the whole model from its pipeline stages (split over "pp" by
                                    whole parameters: each name lives on one stage's ranks)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.mesh import PP, Layout
from minidist.sharding import Split, cut, join, sharded_over


def splits(module: nn.Module, dim: str) -> dict[str, Split]:
    """{state_dict key: Split} of the parameters split over mesh dimension `dim` along a tensor dim
    (every name of a tied parameter)."""
    out = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        split = sharded_over(p).get(dim)
        if split is not None and split.dim is not None:
            out[n] = split
    return out


# ----------------------------------------------------------------------- whole <-> slices
@torch.no_grad()
def gather_whole(tensors: dict[str, torch.Tensor], split: dict[str, Split], layout: Layout, dim: str) -> dict:
    """`tensors` with each entry named in `split` replaced by the whole tensor joined from its slices
    along mesh dimension `dim` (in coordinate order, as split[name] says); the rest as they are.

    A collective over `dim`'s group: every rank of it calls with the same names. Slices are equal
    in size (tensor parallelism splits evenly). Nothing to do where the dimension has one rank.
    """
    n = layout.size(dim)
    if n == 1:
        return dict(tensors)
    group = layout[dim].get_group()
    out = dict(tensors)
    for name in sorted(k for k in tensors if k in split):
        t = tensors[name].to(layout.device).contiguous()  # NCCL gathers device tensors only
        parts = [torch.empty_like(t) for _ in range(n)]
        comm.all_gather(parts, t, group=group)
        out[name] = join(parts, split[name]).to(tensors[name].device)
    return out


def local_slice(tensors: dict[str, torch.Tensor], split: dict[str, Split], layout: Layout, dim: str) -> dict:
    """This rank's slice (along mesh dimension `dim`) of each whole tensor named in `split`; gather_whole's inverse."""
    n, coord = layout.size(dim), layout.coordinate.get(dim, 0)
    out = dict(tensors)
    for name in tensors:
        if name in split and n > 1:
            try:
                out[name] = cut(tensors[name], split[name], coord, n)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc} (over {dim}={n})") from None
    return out


def gather_stages(parts: dict, layout: Layout) -> dict:
    """Every stage's `parts` (a state dict, or an optimizer state by name: {"state", "param_groups"}) joined
    on the main process; {} elsewhere. Called on every rank: the ranks at coordinate 0 on every dimension
    but "pp" (the first of each stage, where the slices and shards were made whole) gather over "pp"."""
    if layout.size(PP) == 1:
        return parts if layout.is_main else {}
    if any(c for n, c in layout.coordinate.items() if n != PP):
        return {}
    everyone = [None] * layout.size(PP) if layout.is_main else None
    dist.gather_object(parts, everyone, dst=layout.main_rank, group=layout[PP].get_group())
    return _join(everyone) if layout.is_main else {}


def _join(parts: list[dict]) -> dict:
    if "param_groups" not in parts[0]:
        return {k: v for p in parts for k, v in p.items()}
    groups = [dict(g, params=[n for p in parts for n in p["param_groups"][i]["params"]])
              for i, g in enumerate(parts[0]["param_groups"])]
    return {"state": {k: v for p in parts for k, v in p["state"].items()}, "param_groups": groups}
