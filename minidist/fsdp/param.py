"""A unit's parameters, each sharded on its own along dim 0, and the unit's two buffers.

Each parameter is split by rows as minidist.fsdp.shard_spec describes (c = ceil(R / N) rows per
rank, zero-padded). For one unit of parameters p0, p1, ... (S_local = the sum of their padded
shards' elements, c C each) a rank keeps:

    local  (S_local,)     master dtype, storage device: this rank's padded shards end to end
                          [ p0: c0 C0 | p1: c1 C1 | ... ]. The sharded parameters (what the
                          optimizer updates) are views of their real rows. It is the all_gather's
                          send buffer as it stands when compute dtype and device are the storage's;
                          otherwise the copy-in is one cast (and host-to-device copy) of it.
    full   (N S_local,)   param_dtype, compute device, parameter-major: p0's N c0 rows, then
                          p1's, ... The unsharded parameters (original shapes) are views of the
                          first R rows of each region. Its storage exists only while unsharded.

The all_gather fills `full` in place: each parameter's padded shard (a piece of the send
buffer) is gathered into its (N c C,) region, rank r's rows at r c C (gather_pieces; one
coalesced collective, minidist.fsdp.all_gather). The reduce_scatter reads the gradients where
they lie, each parameter's (N c C,) gradient (zero-padded when N does not divide its rows) as
one input of a coalesced reduce_scatter (reduce_pieces), whose output lands laid as `local`:
rank r receives every parameter's rows r c .. (r+1) c, summed. FSDP2 instead copies the
gradients into one rank-major buffer first (foreach_reduce_scatter_copy_in): one pass over
S_unit, and for that moment the gradients twice.

Against FSDP1's flat parameter (one buffer of the unit's parameters end to end, cut into N
equal pieces, minidist before this layout): padding was at most N - 1 elements per unit; but
the optimizer saw 1-D pieces cut at arbitrary offsets (a parameter split across ranks, or
absent from one). Here every piece is a dim-0 slice with its trailing dimensions, at the
price of up to N - 1 padding rows per parameter (and, where a parameter has them, a padded
copy of its gradient).

The unsharded parameters are created with Tensor.set_ on full's storage rather than as views
of `full`, so they have their own version counter: refilling the storage (all_gather) is not an
"in-place modification" of tensors autograd saved. Their storage is resized to 0 and back,
never replaced, so views saved by autograd stay valid across a free and a re-gather.

Layout and buffers only: which parameters the module holds and when `full` is allocated is
the unit's state machine (minidist.fsdp.unit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from minidist.fsdp.shard_spec import CPUOffloadPolicy, MeshInfo, ShardSpec, placements_for
from minidist.sharding import Split, declare, sharded_over


@dataclass
class ParamInfo:
    """One original parameter and every (module, attribute) that holds it (more than one if tied)."""

    fqns: list[str]
    """Names in the plain module, first = canonical (e.g. ["wte.weight", "lm_head.weight"])."""
    holders: list[tuple[nn.Module, str]]
    param: nn.Parameter | None
    """The original parameter, until FSDP has copied its rows (then None)."""


def free_storage(tensor: torch.Tensor) -> None:
    """Release a buffer's memory now, whoever still holds the tensor object (FSDP2's free_storage).

    For buffers whose collective is complete: the Work handle (gloo's keeps its input and output
    tensors until the handle is destroyed) would otherwise keep S_unit bytes alive past their
    last use, until the handle object goes.
    """
    if tensor.untyped_storage().nbytes():
        tensor.untyped_storage().resize_(0)


class FSDPParam:
    """One parameter: its spec, its sharded parameter (rows of `local`) and its unsharded one (a region of `full`).

    The original parameter is not kept: once its rows are copied into `local`, nothing holds
    the full tensor, and its memory goes (on a GPU, FSDP would otherwise cost the whole model).
    """

    def __init__(self, info: ParamInfo, spec: ShardSpec, padded_shard: torch.Tensor, full: torch.Tensor,
                 full_offset: int):
        self.fqns, self.holders, self.spec = info.fqns, info.holders, spec
        self.padded_shard = padded_shard  # (c C,) view of `local`; rows past the real ones stay zero
        self.local_numel = spec.local_shape.numel()
        start, end = spec.row_range()
        requires_grad = info.param.requires_grad
        if self.local_numel:
            with torch.no_grad():
                rows = info.param.detach().reshape(spec.rows, spec.row_numel)
                padded_shard[:self.local_numel].copy_(rows[start:end].reshape(-1))
        self.sharded = nn.Parameter(padded_shard[:self.local_numel].view(spec.local_shape), requires_grad=requires_grad)
        self.sharded.shard_spec = spec
        unsharded = torch.empty(0, dtype=full.dtype, device=full.device)
        unsharded.set_(full.untyped_storage(), full_offset, spec.global_shape)
        self.unsharded = nn.Parameter(unsharded, requires_grad=requires_grad)
        # what the original declared (a tensor-parallel slice: minidist.sharding) stays true of both;
        # the sharded one is also split by rows over FSDP's shard dimension
        declare(self.unsharded, sharded_over(info.param))
        rows = {d: Split(0) for d, place in zip(spec.mesh_dims, spec.placements) if place.is_shard()}
        declare(self.sharded, sharded_over(info.param) | rows)

    def __repr__(self) -> str:
        return f"FSDPParam({self.spec.fqn}, {tuple(self.spec.global_shape)} -> {tuple(self.spec.local_shape)})"


class UnitShards:
    """Layout and buffers of one unit's parameters on one rank."""

    def __init__(self, infos: list[ParamInfo], mesh: MeshInfo, compute_device: torch.device,
                 param_dtype: torch.dtype | None = None, offload: CPUOffloadPolicy | None = None):
        dtypes = {i.param.dtype for i in infos}
        if len(dtypes) > 1:
            raise ValueError(f"an FSDP unit needs one parameter dtype, got {sorted(map(str, dtypes))} in "
                             f"{[i.fqns[0] for i in infos]}; cast the module (e.g. module.float()) before wrapping")
        self.dtype = infos[0].param.dtype if infos else torch.float32
        self.param_dtype = param_dtype or self.dtype
        self.compute_device = compute_device
        self.storage_device = torch.device("cpu") if offload else compute_device
        self.world = n = mesh.shard_world
        dims, places = placements_for(mesh)
        specs = [ShardSpec(i.fqns[0], i.param.shape, i.param.dtype, dims, places, mesh.shard_rank, n,
                           self.storage_device, compute_device) for i in infos]
        self.split_sizes = [s.padded_shard_numel for s in specs]  # columns of the rank-major layouts
        self.offsets = [sum(self.split_sizes[:k]) for k in range(len(specs))]
        self.local_numel = sum(self.split_sizes)
        self.padded = n * self.local_numel
        """S_unit in elements: what one all_gather fills and one reduce_scatter reduces."""
        pin = bool(offload and offload.pin_memory and torch.cuda.is_available())
        self.local = torch.zeros(self.local_numel, dtype=self.dtype, device=self.storage_device, pin_memory=pin)
        self.aliased = n == 1 and self.param_dtype == self.dtype and self.storage_device == compute_device
        """No gather at all: `full` is `local` (no_shard, or one rank, in the master dtype, not offloaded)."""
        self.full = self.local if self.aliased else torch.empty(self.padded, dtype=self.param_dtype,
                                                                device=compute_device)
        self._full_bytes = self.full.untyped_storage().nbytes()
        self.params = [FSDPParam(i, s, self.local[off:off + size], self.full, n * off)
                       for i, s, off, size in zip(infos, specs, self.offsets, self.split_sizes)]
        for i in infos:  # the sharded copies are the parameters now
            i.param = None
        self._full_regions = [self.full[n * off:n * (off + size)] for off, size in zip(self.offsets, self.split_sizes)]
        self.free_full()
        self.install_sharded()

    # -- storage of the unsharded buffer ------------------------------------------------------
    @property
    def is_allocated(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def alloc_full(self) -> None:
        """Give `full` its storage back (contents undefined until the all_gather lands)."""
        if not self.aliased and not self.is_allocated and self._full_bytes:
            self.full.untyped_storage().resize_(self._full_bytes)

    def free_full(self) -> None:
        """Drop `full`'s storage; the unsharded parameters become 0-byte views until the next alloc."""
        if not self.aliased and self.is_allocated:
            self.full.untyped_storage().resize_(0)

    # -- the all_gather's copy-in and pieces ----------------------------------------------------
    def gather_input(self) -> torch.Tensor:
        """Copy-in: this rank's send buffer, `local` in param_dtype on the compute device (`local` itself if so)."""
        return self.local.to(device=self.compute_device, dtype=self.param_dtype, non_blocking=True)

    def gather_pieces(self, send: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(inputs, outputs) of the coalesced all_gather: each parameter's padded shard in `send`, and
        its (N c C,) region of `full`, where rank r's rows land at r c C. Empty parameters are left out."""
        ins, outs = [], []
        for off, size, region in zip(self.offsets, self.split_sizes, self._full_regions):
            if size:
                ins.append(send[off:off + size])
                outs.append(region)
        return ins, outs

    # -- which parameters the module attributes hold -------------------------------------------
    def install_unsharded(self) -> None:
        """Point the module attributes at the unsharded parameters (`full` must be filled)."""
        for fp in self.params:
            for module, attr in fp.holders:
                module._parameters[attr] = fp.unsharded

    def install_sharded(self) -> None:
        """Point the module attributes back at the sharded parameters."""
        for fp in self.params:
            for module, attr in fp.holders:
                module._parameters[attr] = fp.sharded

    # -- gradients ----------------------------------------------------------------------------
    @property
    def has_unsharded_grads(self) -> bool:
        return any(fp.unsharded.grad is not None for fp in self.params)

    @torch.no_grad()
    def reduce_pieces(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The reduction's inputs: each parameter's unsharded gradient, flat, (N c C,) in `dtype`.

        A gradient is used where it lies when it has N c rows already, in `dtype`; one whose rows
        N does not divide gets a zero-padded copy (rows past R), one in another dtype a cast.
        Zeros stand in for a missing gradient, so every rank reduces the same layout; an empty
        parameter gives no piece. The unsharded .grad tensors are dropped: the pieces hold them now.
        """
        pieces = []
        for fp in self.params:
            g, fp.unsharded.grad = fp.unsharded.grad, None
            numel = self.world * fp.spec.padded_shard_numel
            if not numel:
                continue
            if g is not None and g.numel() == numel:
                pieces.append(g.reshape(-1).to(dtype))  # g itself when contiguous and in dtype
                continue
            piece = torch.zeros(numel, dtype=dtype, device=self.compute_device)
            if g is not None:
                piece[:g.numel()].copy_(g.reshape(-1))
            pieces.append(piece)
        return pieces

    def local_pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each non-empty parameter's padded shard in a (S_local,) tensor laid as `local`, in reduce_pieces' order."""
        return [flat[off:off + size] for off, size in zip(self.offsets, self.split_sizes) if size]

    def accumulate_sharded_grads(self, shard_grad: torch.Tensor) -> None:
        """Hand each sharded parameter its rows of `shard_grad` ((S_local,), averaged, master dtype).

        A view when .grad is None (no copy), an add when a previous backward left one
        (gradient accumulation without zero_grad, as a plain module accumulates).
        """
        for fp, off in zip(self.params, self.offsets):
            if not fp.sharded.requires_grad:
                continue
            g = shard_grad[off:off + fp.local_numel].view(fp.spec.local_shape)
            if fp.sharded.grad is None:
                fp.sharded.grad = g
            else:
                fp.sharded.grad.add_(g)

    # -- full values (state dicts) ------------------------------------------------------------
    def unpad(self, rank_major: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's full value (original shape) from a rank-major (N S_local,) tensor."""
        blocks = torch.split(rank_major.view(self.world, self.local_numel), self.split_sizes, dim=1)
        out = []
        for b, fp in zip(blocks, self.params):
            s = fp.spec
            rows = b.reshape(self.world * s.rows_per_shard, s.row_numel)  # rank r's c rows, then rank r + 1's
            out.append(rows[:s.rows].reshape(s.global_shape))
        return out
