"""Which part of a whole parameter a tensor holds: the one declaration every split parameter carries.

An engine that splits a parameter keeps only its rank's part as an ordinary nn.Parameter
(state_dict keys and optimizers see nothing unusual) and says on the parameter what the
part is, so that code which needs the whole can ask without knowing which engine made it:

    shard_param(w, "tp", 0)              # a column-parallel weight: rows split over "tp"
    shard_param(w_qkv, "tp", 0, parts=3) # q | k | v, each block's rows split over "tp"
    sharded_over(w)                      # {"tp": Split(dim=0, parts=1)}; {} for a whole parameter
    split_of(w, "tp")                    # Split(dim=0, parts=1), or None

Who declares: minidist.tp's layers over "tp" when they keep their slice; FSDP over its
shard dimension ("dp", or "shard" for hybrid_shard) on the sharded parameters it creates,
keeping whatever the original parameter declared (a tensor-parallel slice under FSDP says
both). Who reads: gradient clipping sums a parameter's squared norm over exactly the
dimensions it declares and counts an undeclared (replicated) one once
(minidist.clip.global_norm); the whole model is assembled from the slices along
"tp" and cut again at another degree (`join` / `cut` below, used by
minidist.parallel.placement and minidist.tp.full_tensor).

`parts` > 1 says the split tensor dimension is several equal blocks, each split over the
ranks: the fused q|k|v projection is three blocks of n_embd rows, and a rank holds its
heads' rows of q, of k and of v, concatenated (torch's DTensor calls this a strided shard).
Joining the slices end to end would interleave q, k and v of different ranks; `join` puts
block b of every rank together first.

`dim` None: split some other way, the engine's own business (e.g. a 1-D flat shard); such
a parameter counts for norms, but only its engine can make it whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SHARDED_OVER = "sharded_over"
"""The attribute on a parameter that holds its declaration: {mesh dimension name: Split}."""


@dataclass(frozen=True)
class Split:
    """How one mesh dimension splits a parameter: along tensor dim `dim`, in `parts` equal blocks each split."""

    dim: int | None = 0
    parts: int = 1


def shard_param(param: torch.Tensor, mesh_dim: str, tensor_dim: int | None = 0, parts: int = 1) -> torch.Tensor:
    """Declare that `param` holds this rank's slice of a bigger parameter, split over mesh dimension
    `mesh_dim` along `tensor_dim` (in `parts` blocks, each split); returns `param`. Declarations over
    other dimensions are kept (a tensor-parallel slice that FSDP shards again declares both)."""
    setattr(param, SHARDED_OVER, sharded_over(param) | {mesh_dim: Split(tensor_dim, parts)})
    return param


def sharded_over(param: torch.Tensor) -> dict[str, Split]:
    """{mesh dimension: Split} for each dimension that splits `param`; {} for a whole one."""
    return dict(getattr(param, SHARDED_OVER, {}))


def split_of(param: torch.Tensor, mesh_dim: str) -> Split | None:
    """How `param` is split over `mesh_dim`; None where every rank of that dimension holds all of it."""
    return sharded_over(param).get(mesh_dim)


def declare(param: torch.Tensor, declaration: dict[str, Split]) -> torch.Tensor:
    """Give `param` exactly `declaration` (an engine copying a declaration onto a parameter it made)."""
    setattr(param, SHARDED_OVER, dict(declaration))
    return param


# ----------------------------------------------------------------------------- whole <-> slices
def cut(whole: torch.Tensor, split: Split, rank: int, size: int) -> torch.Tensor:
    """The slice of `whole` that rank `rank` of `size` holds under `split` (a new tensor, not a view)."""
    if split.dim is None:
        raise ValueError("a parameter split some other way (tensor dim None) is cut by its own engine")
    blocks = whole.chunk(split.parts, dim=split.dim)
    if whole.shape[split.dim] % (split.parts * size):
        raise ValueError(f"dimension {split.dim} of a {tuple(whole.shape)} tensor does not split into "
                         f"{split.parts} block(s) of {size} equal slices")
    return torch.cat([b.chunk(size, dim=split.dim)[rank] for b in blocks], dim=split.dim).clone()


def join(slices: list[torch.Tensor], split: Split) -> torch.Tensor:
    """The whole tensor from every rank's slice (in rank order): `cut`'s inverse."""
    if split.dim is None:
        raise ValueError("a parameter split some other way (tensor dim None) is joined by its own engine")
    if split.parts == 1:
        return torch.cat(slices, dim=split.dim)
    per_rank = [s.chunk(split.parts, dim=split.dim) for s in slices]
    return torch.cat([per_rank[r][b] for b in range(split.parts) for r in range(len(slices))], dim=split.dim)
