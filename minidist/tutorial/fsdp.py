"""FSDP with each parameter sharded on its own along dim 0, and a compute dtype.

Every rank keeps rows [r*k, (r+1)*k) of each parameter (k = ceil(rows / N); the last
ranks' pieces may be shorter, even empty): that shard, in fp32, is the nn.Parameter
the optimizer sees, under the parameter's own name. A *unit* is a module that owns
parameters directly (a Linear, an Embedding, a LayerNorm). Around a unit:

    before its forward    all_gather its parameters (in compute_dtype: half the bytes
                          for bf16) into full tensors, and put them in the module
    after its forward     put the shards back and free the full tensors' memory
    before its backward   all_gather them again (backward needs the weights)
    after its backward    reduce_scatter each full gradient (in fp32): every rank gets
                          the sum of its rows; divide by N; free the full tensors

Bytes per step and rank: 2 all_gathers + 1 reduce_scatter of each parameter, about
(2 S_c + S) (N-1)/N with S the fp32 bytes and S_c the compute-dtype bytes (3 S (N-1)/N
in fp32, 1.5x DDP). Memory: the shards (S/N), plus the full parameters of the unit
that is computing and the input of the one reduce_scatter in flight. Everything here is
blocking except that reduce_scatter, which the next one (or, at the end,
finish_gradient_synchronization()) waits on; nothing is prefetched.

Why "free" means resizing the storage to 0 bytes: autograd saved the full tensors for
backward, so they cannot be dropped; emptying their storage releases the memory and
keeps the tensors, which the re-gather fills again before backward reads them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.tutorial.ddp_naive import broadcast_from_rank0


# --8<-- [start:param]
class ShardedParam:
    """One parameter: this rank's rows (`shard`, fp32), and `full`, the whole
    parameter in the compute dtype, whose memory exists only while in use."""

    def __init__(self, param: nn.Parameter, compute_dtype: torch.dtype):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.rows = param.shape[0]
        self.k = -(-self.rows // self.world)      # rows per rank, rounded up
        lo = min(self.rank * self.k, self.rows)
        hi = min(lo + self.k, self.rows)
        grad = param.requires_grad
        self.shard = nn.Parameter(param.detach()[lo:hi].clone(), grad)
        self.full = nn.Parameter(param.detach().to(compute_dtype), grad)
        self.free()

    def padded(self, t: torch.Tensor, rows: int) -> torch.Tensor:
        """`t` with zero rows appended up to `rows`: equal pieces to send."""
        pad = t.new_zeros((rows - t.shape[0], *t.shape[1:]))
        return torch.cat([t, pad])
# --8<-- [end:param]

    # --8<-- [start:gather]
    @torch.no_grad()
    def all_gather(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole parameter in `dtype`, assembled from every rank's shard."""
        piece = self.padded(self.shard.to(dtype), self.k)
        out = piece.new_empty((self.world * self.k, *piece.shape[1:]))
        comm.all_gather(out, piece)
        return out[:self.rows]

    @torch.no_grad()
    def gather(self) -> None:
        """Fill `full` (in the compute dtype), unless it is filled already."""
        storage = self.full.untyped_storage()
        if storage.size() == 0:
            storage.resize_(self.full.numel() * self.full.element_size())
            # through .data: autograd must not see an in-place write to a
            # tensor it saved for backward (the module docstring says why)
            self.full.data.copy_(self.all_gather(self.full.dtype))

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)
    # --8<-- [end:gather]

    # --8<-- [start:reduce]
    def start_reduce_scatter(self):
        """full.grad -> (output, handle): after handle.wait(), `output` holds this
        rank's rows of the sum of every rank's gradient, in fp32."""
        grad = self.padded(self.full.grad.float(), self.world * self.k)
        self.full.grad = None
        out = grad.new_empty((self.k, *grad.shape[1:]))
        return out, comm.reduce_scatter(out, grad, async_op=True)

    def set_grad(self, summed: torch.Tensor) -> None:
        mine = summed[:self.shard.shape[0]] / self.world  # my rows; the mean
        g = self.shard.grad
        self.shard.grad = mine if g is None else g + mine
    # --8<-- [end:reduce]


# --8<-- [start:fsdp]
class FSDP(nn.Module):
    def __init__(self, module: nn.Module,
                 compute_dtype: torch.dtype | None = None):
        super().__init__()
        named = module.named_parameters(remove_duplicate=False)
        if len(list(named)) != len(list(module.parameters())):
            raise ValueError("this FSDP shards each module's own: untie them")
        self.module, self.compute_dtype = module, compute_dtype
        broadcast_from_rank0(module)      # every rank shards the same values
        self.params: dict[str, ShardedParam] = {}  # by name in `module`
        self.pending: list = []           # the reduce_scatter in flight
        for prefix, unit in module.named_modules():
            own = unit.named_parameters(recurse=False)
            sharded = {n: ShardedParam(p, compute_dtype or p.dtype)
                       for n, p in own}
            if not sharded:
                continue                  # not a unit: owns no parameter itself
            for name, sp in sharded.items():
                unit._parameters[name] = sp.shard  # what the optimizer sees
                self.params[f"{prefix}.{name}".lstrip(".")] = sp
                if sp.full.requires_grad:
                    sp.full.register_post_accumulate_grad_hook(
                        lambda _, sp=sp: self._post_backward(sp))
            unit.register_forward_pre_hook(
                lambda m, args, sh=sharded: self._pre_forward(m, sh))
            unit.register_forward_hook(
                lambda m, args, out, sh=sharded: self._post_forward(m, sh))
            unit.register_full_backward_pre_hook(
                lambda m, grads, sh=sharded: self._pre_backward(sh))

    def forward(self, *args):
        if self.compute_dtype is not None:  # inputs in the weights' dtype
            args = [a.to(self.compute_dtype) if a.is_floating_point() else a
                    for a in args]
        return self.module(*args)
# --8<-- [end:fsdp]

    # --8<-- [start:hooks]
    def _pre_forward(self, unit: nn.Module, sharded: dict) -> None:
        for name, sp in sharded.items():
            sp.gather()
            unit._parameters[name] = sp.full  # compute with the full one

    def _post_forward(self, unit: nn.Module, sharded: dict) -> None:
        for name, sp in sharded.items():
            unit._parameters[name] = sp.shard
            sp.free()               # autograd keeps the tensor, not its bytes

    def _pre_backward(self, sharded: dict) -> None:
        for sp in sharded.values():
            sp.gather()             # backward reads the full weights again

    def _post_backward(self, sp: ShardedParam) -> None:
        """sp.full.grad is complete: reduce_scatter it, free the full weight."""
        self.finish_gradient_synchronization()  # the previous one first, so one
        self.pending.append((sp, *sp.start_reduce_scatter()))  # full gradient
        sp.free()                                    # at most is alive at a time

    def finish_gradient_synchronization(self) -> None:
        for sp, out, handle in self.pending:
            handle.wait()
            sp.set_grad(out)
        self.pending.clear()
    # --8<-- [end:hooks]

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole and in fp32, on every rank (to save, to test)."""
        return {n: sp.all_gather(sp.shard.dtype) for n, sp in self.params.items()}
