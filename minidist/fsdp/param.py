"""The flat parameter of one FSDP unit: layout, the rank's shard, the unsharded buffer.

A unit's parameters are laid end to end in one flat buffer of `padded` elements,
padded with zeros up to a multiple of the shard-group size N so that it splits
into N equal shards of `shard_size = padded / N` (an all_gather and a
reduce_scatter both need equal pieces):

    flat (padded)   [ p0 ........ | p1 ...... | p2 ... | pad ]
    rank r owns     flat[r * shard_size : (r + 1) * shard_size]

Persistent state (what the optimizer sees) is the rank's shard: `local_shard`,
an fp32 1-D tensor of shard_size elements. Each original parameter is replaced
by a *sharded parameter*: an nn.Parameter that is a 1-D view into local_shard
holding the part of that parameter that falls into this rank's range (possibly
empty). The optimizer updates these views in place, so local_shard is always
the up-to-date input of the next all_gather: no copy-in.

For compute, the module attributes are swapped to *unsharded parameters*:
nn.Parameters with the original shapes, each a view into `full`, the
padded-length buffer the all_gather fills. `full` and its views live for the
whole training run; only their storage is allocated (resize) before an
all_gather and freed (resize to 0) after use, so views saved by autograd stay
valid across a free/re-gather. The unsharded parameters are created with
Tensor.set_ on the storage rather than as views of `full`, so they have their
own version counter: the all_gather that refills the storage is not an
"in-place modification" of tensors autograd saved for backward.

This class is layout and buffers only. Which of the two parameter sets is
installed, and whether `full` is being gathered, is the unit's state
(minidist.fsdp.unit.ShardedState): the unit calls alloc_full / install_unsharded /
install_sharded / free_full in the order its state machine allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class ParamInfo:
    """One original parameter and every (module, attribute) that holds it (more than one if tied)."""

    fqns: list[str]
    """Names in the plain module, first = canonical (e.g. ["wte.weight", "lm_head.weight"])."""
    holders: list[tuple[nn.Module, str]]
    param: nn.Parameter


class FlatParamShard:
    """Layout and buffers of one unit's flat parameter on one rank."""

    def __init__(self, infos: list[ParamInfo], shard_rank: int, shard_world: int,
                 param_dtype: torch.dtype | None = None):
        self.infos = infos
        self.shard_rank, self.shard_world = shard_rank, shard_world
        params = [i.param for i in infos]
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError(f"an FSDP unit needs one parameter dtype, got {sorted(map(str, dtypes))}; "
                             f"cast the module (e.g. module.float()) before wrapping")
        self.dtype = params[0].dtype if params else torch.float32
        self.device = params[0].device if params else torch.device("cpu")
        self.param_dtype = param_dtype or self.dtype
        # Layout: offsets into the flat buffer; shard ranges clipped to each parameter.
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.total = sum(self.numels)
        self.padded = -(-self.total // shard_world) * shard_world
        self.shard_size = self.padded // shard_world
        lo, hi = shard_rank * self.shard_size, (shard_rank + 1) * self.shard_size
        # (start, end) of each parameter's piece inside local_shard and inside the parameter.
        self.shard_ranges: list[tuple[int, int]] = []
        self.param_ranges: list[tuple[int, int]] = []
        for off, n in zip(self.offsets, self.numels):
            a, b = max(off, lo), min(off + n, hi)
            b = max(a, b)
            self.shard_ranges.append((a - lo, b - lo))
            self.param_ranges.append((a - off, b - off))
        self.requires_grad = [p.requires_grad for p in params]

        # local_shard: (shard_size,) in the original dtype; padding stays zero.
        self.local_shard = torch.zeros(self.shard_size, dtype=self.dtype, device=self.device)
        self.sharded_params: list[nn.Parameter] = []
        with torch.no_grad():
            for p, (a, b), (pa, pb), rg in zip(params, self.shard_ranges, self.param_ranges, self.requires_grad):
                self.local_shard[a:b].copy_(p.detach().reshape(-1)[pa:pb])
                self.sharded_params.append(nn.Parameter(self.local_shard[a:b], requires_grad=rg))

        # full: (padded,) in param_dtype; its storage is allocated only while unsharded.
        # Unsharded in one rank (no_shard) at the same dtype, full *is* local_shard: nothing to
        # gather, nothing to free, no second copy of the parameters.
        self.aliased = shard_world == 1 and self.param_dtype == self.dtype
        if self.aliased:
            self.full = self.local_shard
        else:
            self.full = torch.empty(self.padded, dtype=self.param_dtype, device=self.device)
        self._full_bytes = self.full.untyped_storage().nbytes()
        storage = self.full.untyped_storage()
        self.unsharded_params = [
            nn.Parameter(torch.empty(0, dtype=self.param_dtype, device=self.device).set_(storage, off, shape),
                         requires_grad=rg)
            for off, shape, rg in zip(self.offsets, self.shapes, self.requires_grad)]
        self.free_full()
        self.install_sharded()

    # -- storage of the unsharded buffer ------------------------------------------------------
    @property
    def is_allocated(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def alloc_full(self) -> bool:
        """Give `full` its storage back (contents undefined until the all_gather lands).

        True if this allocated S_unit bytes (not when aliased or already allocated)."""
        if self.aliased or self.is_allocated or not self._full_bytes:
            return False
        self.full.untyped_storage().resize_(self._full_bytes)
        return True

    def free_full(self) -> bool:
        """Drop `full`'s storage; the unsharded parameters become 0-byte views until the next alloc.

        True if this freed S_unit bytes."""
        if self.aliased or not self.is_allocated:
            return False
        self.full.untyped_storage().resize_(0)
        return True

    def gather_input(self) -> torch.Tensor:
        """What this rank contributes to the all_gather: its shard in param_dtype."""
        return self.local_shard if self.param_dtype == self.dtype else self.local_shard.to(self.param_dtype)

    # -- which parameters the module attributes hold -------------------------------------------
    def install_unsharded(self) -> None:
        """Point the module attributes at the unsharded parameters (`full` must be filled)."""
        self._install(self.unsharded_params)

    def install_sharded(self) -> None:
        """Point the module attributes back at the sharded parameters."""
        self._install(self.sharded_params)

    def _install(self, params: list[nn.Parameter]) -> None:
        for info, p in zip(self.infos, params):
            for module, attr in info.holders:
                module._parameters[attr] = p

    # -- gradients ----------------------------------------------------------------------------
    @property
    def has_unsharded_grads(self) -> bool:
        return any(p.grad is not None for p in self.unsharded_params)

    def flat_grad(self, dtype: torch.dtype) -> torch.Tensor:
        """The unsharded gradients laid out like `full`: (padded,) in `dtype`; zeros where no grad.

        The unsharded .grad tensors are dropped: after this call the flat copy is the only one.
        """
        flat = torch.zeros(self.padded, dtype=dtype, device=self.device)
        for p, off, n in zip(self.unsharded_params, self.offsets, self.numels):
            if p.grad is not None:
                flat[off:off + n].copy_(p.grad.reshape(-1))
                p.grad = None
        return flat

    def accumulate_sharded_grad(self, shard_grad: torch.Tensor) -> None:
        """Hand each sharded parameter its slice of `shard_grad` ((shard_size,), fp32 averaged).

        A view when .grad is None (no copy), an add when a previous backward left one
        (gradient accumulation without zero_grad, as a plain module accumulates).
        """
        for sp, (a, b), rg in zip(self.sharded_params, self.shard_ranges, self.requires_grad):
            if not rg:
                continue
            if sp.grad is None:
                sp.grad = shard_grad[a:b]
            else:
                sp.grad.add_(shard_grad[a:b])

    # -- full values (state dicts) ------------------------------------------------------------
    def split_flat(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a (padded,) or (total,) flat tensor shaped like the original parameters."""
        return [flat[off:off + n].view(shape) for off, n, shape in zip(self.offsets, self.numels, self.shapes)]

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's (shard_size,) piece of a (padded,) flat tensor."""
        r = self.shard_rank
        return flat[r * self.shard_size:(r + 1) * self.shard_size]
