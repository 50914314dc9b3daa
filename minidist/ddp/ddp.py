"""minidist.DDP: the public module. Used exactly as torch's DistributedDataParallel:

    model = DDP(net, device_mesh=mesh, bucket_cap_mb=25)   # or process_group=; neither = the world
    loss = loss_fn(model(x), y)
    loss.backward()          # gradients are averaged across ranks by the end of this call
    optimizer.step()

What happens where:
  * construction: every rank checks that it built the same model (names, shapes,
    dtypes; a mismatch is an error on every rank, not a hang), then rank 0's
    parameters and buffers are broadcast so every replica starts identical;
    a Reducer (reducer.py) buckets the trainable parameters and hooks them.
  * forward: buffers (BatchNorm running statistics) are broadcast from rank 0,
    so every replica normalises with the same statistics; the reducer learns
    whether this iteration syncs (see no_sync) and, once, rebuilds its buckets.
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
from minidist.ddp.comm_hooks import CommHook
from minidist.ddp.reducer import Reducer, ReducerPolicy
from minidist.mesh import group_of
from minidist.verify import verify_same_model


class DDP(nn.Module):
    """Data parallelism: replicate `module`, average gradients with bucketed async all_reduce.

    Arguments mirror torch.nn.parallel.DistributedDataParallel: the replicas are
    `process_group`'s ranks or those of the 1-D `device_mesh` (neither = the world). `comm_hook`
    (hook(state, bucket) -> Future[Tensor], see comm_hooks.py) replaces the
    default average (each gradient divided by N as it is copied into its
    bucket, then all_reduce SUM); its state is the process group.
    ``bucket_cap_mb=None`` means torch's default: 25 MiB buckets after a first
    one of 1 MiB; an explicit value caps every bucket, the first included (as torch).
    """

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                 device_mesh: DeviceMesh | None = None, bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, broadcast_buffers: bool = True,
                 comm_hook: CommHook | None = None):
        super().__init__()
        self.module = module
        self.process_group = process_group = group_of("DDP", process_group, device_mesh)
        self.broadcast_buffers = broadcast_buffers
        self.require_backward_grad_sync = True
        """False inside no_sync(): the next backward only accumulates locally."""
        named = list(module.named_parameters())  # tied parameters appear once
        self._buffers_to_sync = [b for b in module.buffers()]
        verify_same_model(named, module.named_buffers(), process_group, "DDP")
        self._broadcast([p.detach() for _, p in named] + self._buffers_to_sync)
        trainable = [(n, p) for n, p in named if p.requires_grad]  # frozen ones are simply left out
        if not trainable:
            raise ValueError("DDP: the module has no parameter that requires grad; there is nothing to reduce")
        policy = ReducerPolicy(bucket_cap_mb, find_unused_parameters, gradient_as_bucket_view)
        self.reducer = Reducer([p for _, p in trainable], [n for n, _ in trainable], policy, process_group)
        if comm_hook is not None:
            self.register_comm_hook(process_group, comm_hook)

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Reduce every bucket with hook(state, bucket) -> Future[Tensor] (the average) from now on."""
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

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self.reducer.prepare_for_forward(sync=self.require_backward_grad_sync)
        if self.broadcast_buffers and self._buffers_to_sync:
            self._broadcast(self._buffers_to_sync)
        return self.module(*args, **kwargs)

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite `tensors` with rank 0's (of the group), all launched before any wait."""
        if dist.get_world_size(self.process_group) == 1:
            return
        with torch.no_grad():
            works = [comm.broadcast(t, group=self.process_group, group_src=0, async_op=True) for t in tensors]
            for w in works:
                w.wait()

