"""One ZeRO bucket: its parameters' flat buffer, its gradient buffer, and this rank's shard.

Three tensors per bucket (bucket_shards.py: k = padded numel / N elements per rank):

    flat_param   padded numel, param_dtype   every parameter of the bucket is a view into it
                                             (p.data), so the all_gather writes the parameters
                                             themselves: no staging copy
    grad_flat    padded numel, reduce_dtype  the reduce_scatter's input: each p.grad is folded
                                             (added) into its slot by the gradient hook, then freed
    master       k elements, master dtype    this rank's shard, what the inner optimizer
                                             updates; with grads in master.grad (k elements)

When the parameters keep their own dtype (no mixed precision) the master *is*
this rank's shard of flat_param (a view): the optimizer updates the parameters
in place and nothing is copied before the all_gather. Under a param_dtype
(bf16/fp16) the master is a separate fp32 tensor (ZeRO's arrangement: every rank
holds 2-byte parameters and gradients, and 1/N of the 4-byte master weights and
8 bytes of Adam state: (2 + 2 + 12/N) psi), copied (cast) into the shard after
each step.

ZeRO-1 (keep_grads) keeps grad_flat for the whole run and reduce_scatters it in
place: the averaged shard lands in this rank's own part of it, which becomes
master.grad (fp32) without a copy. Gradient memory stays psi elements, as the
paper's P_os. ZeRO-2 allocates grad_flat when the bucket's first gradient
arrives and frees it as soon as its reduce_scatter completes, so after backward
only the k-element shards remain: gradient memory psi / N (P_os+g).

Gradient lifecycle per bucket (asserted):

    EMPTY --fold--> FILLING --every param ready (synced backward)--> FULL --launch--> REDUCING
      ^                ^                                                                  |
      |                +------fold (a second backward before zero_grad: accumulate)-------+ finish
      +-----------------------------------zero_grad----------------------------- REDUCED <-+

Parameter lifecycle: CURRENT --step writes the shard--> UPDATED --launch_gather--> GATHERING --wait--> CURRENT.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.precision import divide_factors
from minidist.zero.bucket_shards import BucketShards


class GradState(enum.Enum):
    EMPTY = "empty"          # no gradient since the last zero_grad
    FILLING = "filling"      # gradients are being folded in (a backward under way, or no_sync accumulation)
    FULL = "full"            # a synced backward folded every parameter; waiting for its turn to launch
    REDUCING = "reducing"    # its reduce_scatter is in flight
    REDUCED = "reduced"      # this rank's averaged shard of the gradient is in master.grad


class ParamState(enum.Enum):
    CURRENT = "current"      # flat_param holds every rank's latest shard
    UPDATED = "updated"      # this rank's shard was updated by step(); the others' are stale
    GATHERING = "gathering"  # the all_gather of the updated shards is in flight


def twice(name: str) -> str:
    return (f"ShardedOptimizer: parameter {name} received its gradient twice in one backward (reentrant "
            f"checkpointing, or a second backward through the same graph); ZeRO reduces one gradient per "
            f"parameter per synced backward: use torch.utils.checkpoint(use_reentrant=False).")


class ZeroBucket:
    """A bucket of one parameter group, dtype and device, flattened and sharded over N ranks."""

    def __init__(self, index: int, shards: BucketShards, params: list[nn.Parameter], rank: int,
                 group: dist.ProcessGroup | None, param_dtype: torch.dtype, reduce_dtype: torch.dtype,
                 keep_grads: bool):
        self.index, self.shards, self.params = index, shards, params
        self.rank, self.group, self.keep_grads = rank, group, keep_grads
        self.reduce_dtype = reduce_dtype
        self.pre_divide, self.post_divide = divide_factors(shards.world, reduce_dtype)
        """Sum in reduce_dtype after dividing by pre_divide, then divide by post_divide (their product: N)."""
        p0 = params[0]
        self.master_dtype, device = p0.dtype, p0.device
        lo, hi = shards.shard_range(rank)
        self.flat_param = torch.zeros(shards.padded_numel, dtype=param_dtype, device=device)
        with torch.no_grad():
            for p, off, n in zip(params, shards.offsets, shards.numels):
                self.flat_param[off:off + n].copy_(p.detach().reshape(-1))
            own = self.flat_param[lo:hi]
            if param_dtype == self.master_dtype:
                master = own  # the optimizer updates the parameters in place
            else:  # fp32 master from the full-precision values, before the parameters are cast
                master = torch.zeros(hi - lo, dtype=self.master_dtype, device=device)
                for piece in shards.pieces(rank):
                    src = params[shards.param_ids.index(piece.param)].detach().reshape(-1)
                    master[piece.shard_start:piece.shard_start + piece.numel].copy_(
                        src[piece.param_start:piece.param_start + piece.numel])
        self.master = nn.Parameter(master)
        """This rank's shard (k elements): what the inner optimizer steps."""
        self._own = own
        for p, off, n in zip(params, shards.offsets, shards.numels):
            p.grad = None
            p.data = self.flat_param[off:off + n].view(p.shape)
        self.grad_flat: torch.Tensor | None = None
        self.grad_state = GradState.EMPTY
        self.param_state = ParamState.CURRENT
        self._ready = [False] * len(params)
        self._pending = len(params)
        self._out: torch.Tensor | None = None
        self._grad_in_place = False
        """master.grad is this rank's shard of grad_flat (ZeRO-1's in-place reduce_scatter)."""
        self._work = None
        self._handed: comm.Handed | None = None
        """grad_flat and the shard while the reduce_scatter may refer to them (minidist.comm.release)."""
        self._gather = None

    @property
    def master_is_param(self) -> bool:
        return self.master.data_ptr() == self._own.data_ptr()

    # ------------------------------------------------------------------ gradients
    def fold(self, j: int, grad: torch.Tensor) -> None:
        """Add parameter j's gradient into its slot of grad_flat (cast to reduce_dtype)."""
        if self.grad_state in (GradState.EMPTY, GradState.REDUCED):
            self._open()
        assert self.grad_state is GradState.FILLING, f"bucket {self.index}: fold while {self.grad_state.name}"
        off, n = self.shards.offsets[j], self.shards.numels[j]
        self.grad_flat[off:off + n].add_(grad.reshape(-1))

    def _open(self) -> None:
        """Start collecting gradients: a zeroed grad_flat (ZeRO-2: a fresh one)."""
        if self._grad_in_place:  # accumulating onto a reduced shard: move it out of the buffer
            self.master.grad = self.master.grad.clone()
            self._grad_in_place = False
        if self.grad_flat is None:
            self.grad_flat = torch.zeros(self.shards.padded_numel, dtype=self.reduce_dtype,
                                         device=self.flat_param.device)
        else:
            self.grad_flat.zero_()
        self.grad_state = GradState.FILLING

    def accumulated(self, j: int) -> torch.Tensor:
        """Parameter j's gradient summed on this rank so far (not reduced): a view of its slot in grad_flat."""
        assert self.grad_state is GradState.FILLING, \
            f"bucket {self.index}: no local gradient while {self.grad_state.name}"
        off, n = self.shards.offsets[j], self.shards.numels[j]
        return self.grad_flat[off:off + n].view(self.params[j].shape)

    def mark_ready(self, j: int, name: str) -> bool:
        """Parameter j's gradient of this synced backward is in; True when it was the last one."""
        if self.grad_state is not GradState.FILLING:
            self._open()  # no gradient folded yet (complete(): a parameter without one): its slot stays
        if self._ready[j]:
            raise RuntimeError(twice(name))
        self._ready[j] = True
        self._pending -= 1
        if self._pending == 0:
            self.grad_state = GradState.FULL
            return True
        return False

    def was_ready(self, j: int) -> bool:
        """Parameter j already gave its gradient in this synced backward (or its bucket launched)."""
        return self._ready[j] or self.grad_state in (GradState.FULL, GradState.REDUCING)

    def complete(self, names: list[str]) -> None:
        """End of a synced backward: parameters that got no gradient contribute zeros (or their no_sync sum)."""
        if self.grad_state is GradState.FULL:
            return
        for j, ready in enumerate(self._ready):
            if not ready:
                self.mark_ready(j, names[j])

    def launch(self) -> None:
        """Start the reduce_scatter: this rank's shard of the sum (divided by pre_divide first) comes back."""
        assert self.grad_state is GradState.FULL, f"bucket {self.index}: launch while {self.grad_state.name}"
        if self.pre_divide != 1.0:
            self.grad_flat.div_(self.pre_divide)
        lo, hi = self.shards.shard_range(self.rank)
        in_place = self.keep_grads and self.master.grad is None and self.reduce_dtype == self.master_dtype
        self._out = self.grad_flat[lo:hi] if in_place else torch.empty(
            hi - lo, dtype=self.reduce_dtype, device=self.grad_flat.device)
        self._grad_in_place = in_place
        self._handed = comm.Handed([self.grad_flat, self._out])  # released before finish() hands them on
        self._work = comm.reduce_scatter(self._out, self.grad_flat, group=self.group, async_op=True)
        self.grad_state = GradState.REDUCING

    def is_reduced(self) -> bool:
        return self._work is not None and self._work.is_completed()

    def finish(self) -> None:
        """Wait for the reduce_scatter; the averaged shard of the gradient goes to master.grad (fp32)."""
        assert self.grad_state is GradState.REDUCING, f"bucket {self.index}: finish while {self.grad_state.name}"
        self._work.wait()
        self._work = None
        self._handed.wait_released()  # the backend's worker no longer refers to grad_flat or the shard
        out, self._out, self._handed = self._out, None, None
        if self.master.grad is None or self._grad_in_place:
            grad = out if out.dtype == self.master_dtype else out.to(self.master_dtype)
            if self.post_divide != 1.0:
                grad.div_(self.post_divide)
            self.master.grad = grad
        else:  # a second synced backward before zero_grad: gradients accumulate, as in one process
            self.master.grad.add_(out.to(self.master_dtype), alpha=1.0 / self.post_divide)
        if not self.keep_grads:
            self.grad_flat = None  # ZeRO-2: the whole gradient is gone, only the shard remains
        self._ready = [False] * len(self.params)
        self._pending = len(self.params)
        self.grad_state = GradState.REDUCED

    def zero_grad(self) -> None:
        assert self.grad_state not in (GradState.FULL, GradState.REDUCING), \
            f"bucket {self.index}: zero_grad while {self.grad_state.name} (inside a backward?)"
        self.master.grad = None
        self._grad_in_place = False
        if not self.keep_grads:
            self.grad_flat = None
        self._ready = [False] * len(self.params)
        self._pending = len(self.params)
        self.grad_state = GradState.EMPTY

    def abandon(self) -> None:
        """Error path: wait out an in-flight reduce_scatter and drop this step's gradients."""
        if self._work is not None:
            try:
                self._work.wait()
            except Exception:  # noqa: BLE001 - the error being raised already says what failed
                pass
        self._work = self._out = self._handed = None
        self.grad_state = GradState.EMPTY
        self.zero_grad()

    # ------------------------------------------------------------------ parameters
    def write_master(self) -> None:
        """After step(): this rank's updated shard into its place in flat_param (cast, if not the same tensor)."""
        assert self.param_state is ParamState.CURRENT, f"bucket {self.index}: step while {self.param_state.name}"
        if not self.master_is_param:
            with torch.no_grad():
                self._own.copy_(self.master.detach())
        self.param_state = ParamState.UPDATED

    def launch_gather(self) -> None:
        """all_gather every rank's shard straight into flat_param: the parameters themselves."""
        assert self.param_state is ParamState.UPDATED, f"bucket {self.index}: gather while {self.param_state.name}"
        self._gather = comm.all_gather(self.flat_param, self._own, group=self.group, async_op=True,
                                       algorithm="auto")  # gloo: the ring, which stages nothing
        self.param_state = ParamState.GATHERING

    def wait_gather(self) -> None:
        if self.param_state is ParamState.GATHERING:
            self._gather.wait()
            self._gather = None
            self.param_state = ParamState.CURRENT

    def refresh_master(self) -> None:
        """Re-read the master from the parameters (after they were loaded from a checkpoint)."""
        if not self.master_is_param:
            with torch.no_grad():
                self.master.copy_(self._own)
