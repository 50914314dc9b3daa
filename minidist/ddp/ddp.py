"""minidist.DDP: the public module. Used as torch's DistributedDataParallel, in FSDP2's vocabulary:

    model = DDP(net, mesh=mesh, bucket_cap_mb=25)   # or process_group=; neither = the world
    model = DDP(net, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    loss = loss_fn(model(x), y)
    loss.backward()          # gradients are averaged across ranks by the end of this call
    optimizer.step()

What happens where:
  * construction: every rank checks that it built the same model (names, shapes,
    dtypes; a mismatch is an error on every rank, not a hang), then rank 0's
    parameters and buffers are broadcast (comm.broadcast_tensors) so every replica
    starts identical; a Reducer (minidist.buckets.reducer) buckets the trainable
    parameters and hooks them.
  * forward: buffers (BatchNorm running statistics) are broadcast from rank 0,
    so every replica normalises with the same statistics; the reducer is told
    whether the coming backward syncs (require_backward_grad_sync, False under
    no_sync) and, once, rebuilds its buckets. Inside join() (join.py) each
    forward first agrees with the other ranks on who still has inputs.
  * backward: the reducer's hooks overlap the all_reduce with backward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from minidist import comm
from minidist.arguments import refuse_renamed
from minidist.buckets.launcher import mark_reduced
from minidist.buckets.policy import ReducerPolicy
from minidist.buckets.reducer import Reducer
from minidist.ddp.comm_hooks import CommHook, default_state
from minidist.ddp.join import Agreement, Join
from minidist.ddp.mixed_precision import MixedPrecisionParams
from minidist.mesh import group_of
from minidist.precision import MixedPrecisionPolicy, cast_floating
from minidist.verify import verify_same_model

RENAMED = {"device_mesh": "mesh= (a 1-D DeviceMesh, as every minidist engine and FSDP2 take it)",
           "mixed_precision": "mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...) (FSDP2's name)"}
"""Old argument names, refused in one line naming the new ones (minidist.arguments)."""


class DDP(nn.Module):
    """Data parallelism: replicate `module`, average gradients with bucketed async all_reduce.

    Arguments mirror torch.nn.parallel.DistributedDataParallel, with FSDP2's names for the
    mesh and the policy: the replicas are `process_group`'s ranks or those of the 1-D
    `mesh` (neither = the world).
    ``comm_hook`` (hook(state, bucket) -> Future[Tensor], see comm_hooks.py) is
    registered with the hook's default state (comm_hooks.default_state: the process
    group, or what the hook's declared factory builds, e.g. PowerSGDState) and
    replaces the default average (each gradient divided by N as it is copied into
    its bucket, then all_reduce SUM). ``bucket_cap_mb=None`` means torch's default:
    25 MiB buckets after a first one of 1 MiB; an explicit value caps every bucket,
    the first included (as torch). ``find_unused_parameters=True`` tolerates
    parameters without a gradient at the price of one all_reduce of a 4-byte-per-
    parameter bitmap per synced backward (no graph walk; see reducer.py).
    ``mp_policy`` (minidist.precision.MixedPrecisionPolicy, the argument every minidist
    engine takes): forward and backward in param_dtype on copies of the fp32 parameters,
    gradients all_reduced in reduce_dtype (fp16: divided before and after the sum), fp32
    gradients for the optimizer (mixed_precision.py). The old names (device_mesh=,
    mixed_precision=) are refused in one line naming these.
    """

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                 mesh: DeviceMesh | None = None, bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, broadcast_buffers: bool = True,
                 comm_hook: CommHook | None = None, mp_policy: MixedPrecisionPolicy | None = None, **renamed):
        refuse_renamed("DDP", renamed, RENAMED)
        super().__init__()
        self.module = module
        self.process_group = process_group = group_of("DDP", process_group, mesh)
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True
        """torch's name and meaning: read by each forward; False (no_sync) = its backward only accumulates."""
        self._join: Join | None = None
        """The active join() block, if any."""
        named = list(module.named_parameters())  # tied parameters appear once
        self._buffers_to_sync = [b for b in module.buffers()]
        verify_same_model(named, module.named_buffers(), process_group, "DDP")
        self._broadcast([p.detach() for _, p in named] + self._buffers_to_sync)
        trainable = [(n, p) for n, p in named if p.requires_grad]  # frozen ones are simply left out
        mark_reduced([p for _, p in trainable])  # a ShardedOptimizer over them would reduce them a second time
        if not trainable:
            raise ValueError("DDP: the module has no parameter that requires grad; there is nothing to reduce")
        policy = ReducerPolicy(bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view)
        self.mixed = None
        """fp32 masters and their param_dtype copies (mixed_precision.py), when mp_policy sets a dtype."""
        if mp_policy is not None and (mp_policy.param_dtype or mp_policy.reduce_dtype):
            if gradient_as_bucket_view:
                raise ValueError("DDP: gradient_as_bucket_view needs gradients in the parameters' dtype; "
                                 "it cannot be combined with mp_policy")
            self.mixed = MixedPrecisionParams([p for _, p in trainable], MixedPrecisionPolicy(
                mp_policy.param_dtype or trainable[0][1].dtype, mp_policy.reduce_dtype))
        self.reducer = Reducer([p for _, p in trainable], [n for n, _ in trainable], policy, process_group,
                               self.mixed)
        if comm_hook is not None:
            self.register_comm_hook(default_state(comm_hook, process_group), comm_hook)

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Reduce every bucket with hook(state, bucket) -> Future[Tensor] from now on (once, before backward).

        torch's contract: the hook receives this rank's plain local gradients and
        returns their average over the ranks; p.grad ends as that average.
        """
        self.reducer.set_comm_hook(state, hook)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward+backward inside this block accumulate p.grad locally, without communication.

        The first synced backward after it all_reduces the accumulated sum, so K
        micro-batches under no_sync plus one synced equal one batch of K+1 (each
        micro-batch loss scaled by 1/(K+1), as with torch).
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """Decide now, not at the next forward, whether the next backward reduces (FSDP2's name).

        DDP decides in the forward (torch's semantics, no_sync above). A pipeline schedule
        (minidist.pp) runs the forwards and backwards of different micro-batches interleaved, so
        the forward before a backward is not its own: it calls this before every backward, True
        before each stage's last (torch.distributed.pipelining reaches into its DDP's reducer for
        the same). The next forward decides again, from require_backward_grad_sync.
        """
        self.reducer.arm(requires_gradient_sync)

    def reduce_accumulated(self) -> None:
        """Reduce now, outside any backward, what the backwards without sync accumulated in p.grad, as a
        synced backward's end would (every bucket's all_reduce; p.grad ends as the average). A zero-bubble
        pipeline calls it after its schedule: its weight gradients arrive after the backwards have ended
        (minidist.pp.compose.deferred), so no backward can be the one that reduces."""
        self.reducer.reduce_accumulated()

    @contextlib.contextmanager
    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True) -> Iterator[Join | None]:
        """Uneven inputs (torch's DDP.join): a rank out of batches shadows the others until all are.

        Each forward inside costs one small all_reduce (who is still active); a
        joined rank contributes zero gradients, and the average divides by N
        (divide_by_initial_world_size=True, torch's default) or by the ranks with
        inputs (False). On leaving, every rank holds the last active ranks'
        parameters and buffers. Semantics and limits: join.py.
        """
        if not enable:
            yield None
            return
        if self._join is not None:
            raise RuntimeError("DDP.join() blocks do not nest")
        self._join = join = Join(self, divide_by_initial_world_size=divide_by_initial_world_size)
        try:
            yield join
        finally:
            self._join = None
        join.finish()  # not after an exception: that propagates from the yield

    def forward(self, *args, **kwargs):
        grad_enabled = torch.is_grad_enabled()
        if self._join is None:
            self._before_forward(grad_enabled, self.require_backward_grad_sync)
        else:
            a = self._join.notify(grad_enabled=grad_enabled, require_backward_grad_sync=self.require_backward_grad_sync)
            self._before_forward(grad_enabled, self.require_backward_grad_sync, source=a.source,
                                 divisor=self._join.divisor(a))
        if self.mixed is None:
            return self.module(*args, **kwargs)
        self.mixed.use_copies()
        dtype = self.mixed.param_dtype
        out = self.module(*cast_floating(args, dtype), **cast_floating(kwargs, dtype))
        if not grad_enabled:
            self.mixed.use_masters()  # no backward follows to do it
        return out

    def _before_forward(self, grad_enabled: bool, require_backward_grad_sync: bool, *, source: int = 0,
                        divisor: int | None = None) -> None:
        """The collectives before a forward, the same on every rank: the bucket rebuild, the buffers.

        `source` (the rank whose state is taken) and `divisor` differ from the defaults only under join().
        """
        if grad_enabled:
            self.reducer.prepare_for_forward(require_backward_grad_sync, source=source, divisor=divisor)
        if self.broadcast_buffers and self._buffers_to_sync:
            self._broadcast(self._buffers_to_sync, source)

    # Joinable (join.py): what a rank that ran out of inputs does
    def join_device(self) -> torch.device:
        return self.reducer.device

    def join_main_hook(self, agreement: Agreement) -> None:
        """One iteration of the active ranks, shadowed: their forward's collectives, then zero gradients."""
        self._before_forward(agreement.grad_enabled, agreement.require_backward_grad_sync,
                             source=agreement.source)
        if agreement.grad_enabled and agreement.require_backward_grad_sync:
            self.reducer.shadow_backward()

    def join_post_hook(self, source: int) -> None:
        """Every rank has joined: all take `source`'s parameters and buffers (it stepped last)."""
        self._broadcast([p.detach() for p in self.module.parameters()] + self._buffers_to_sync, source)

    def _broadcast(self, tensors: list[torch.Tensor], source: int = 0) -> None:
        """Overwrite `tensors` with group rank `source`'s (comm.broadcast_tensors)."""
        comm.broadcast_tensors(tensors, group=self.process_group, group_src=source)

