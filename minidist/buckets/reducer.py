"""The all_reduce reducer: from "a gradient was accumulated" to "param.grad holds the average".

Used by minidist.DDP and by ZeRO's owner-broadcast variant (minidist.zero.owner_broadcast):
every rank ends backward with the whole averaged gradient. Follow one gradient (the
launcher's path, launcher.py):

1. autograd accumulates into ``p.grad`` and runs ``p``'s post-accumulate-grad
   hook (launcher.hook_gradients) -> ``_on_grad_ready(i, p)``;
2. ``_mark_ready(i)`` hands the gradient to its bucket and counts the bucket
   down: in place (p.grad itself, divided by N) or copied into its slot of the
   bucket's flat buffer (reduction.py: which, when, and why);
3. when the count hits zero the bucket is FULL, and the launcher hands every
   FULL bucket, in bucket order, to the comm hook (or the default reduction),
   which starts async communication and returns a future. Backward keeps
   running meanwhile;
4. at the end of backward the autograd engine runs ``_finalize_backward``
   (queued by the first hook of the backward, launcher.queue_end_of_backward):
   it completes unused parameters, waits on every future in bucket order and,
   for flat buckets, copies each average into ``p.grad`` (finalize.py), so when
   backward() returns every ``p.grad`` holds the average. Each future is
   dropped once waited on, and for buckets reduced in place it waits until
   gloo's worker has let go of the gradients it was handed
   (minidist.comm.release): after backward nothing but ``p.grad`` refers to
   them, so zero_grad() frees them, on this thread.

The buckets are rebuilt once, in the order the first synced backward produced
its gradients (ready_order.py).

Whether a backward reduces is decided by the forward before it (DDP passes
its ``require_backward_grad_sync``, False under no_sync): the reducer is then
ARMED (hooks fill buckets) or LOCAL (hooks only note which parameters got a
gradient; p.grad accumulates), and REDUCING from the first hook of an armed
backward to ``_finalize_backward``.

No host synchronisation on the hot path: copies, zero fills and the launch are
all device ops; the only waits are the futures at the end of backward (on
NCCL, a stream wait). find_unused_parameters adds one blocking all_reduce of a
4-byte-per-tensor bitmap at the end of each synced backward (finalize.py).
"""

from __future__ import annotations

import enum
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist import comm
from minidist.buckets import finalize, layout, reduction
from minidist.buckets.bucket import Bucket, BucketState
from minidist.buckets.finalize import MasterParams
from minidist.buckets.launcher import OrderedLauncher, hook_gradients, queue_end_of_backward
from minidist.buckets.policy import ReducerPolicy
from minidist.buckets.ready_order import ReadyOrder

CommHook = Callable[[Any, Bucket], torch.futures.Future]
"""torch's DDP communication hook: hook(state, bucket) -> Future[Tensor] (minidist.ddp.comm_hooks)."""


class ReducerState(enum.Enum):
    LOCAL = "local"          # the last forward ran under no_sync: backward accumulates p.grad locally
    ARMED = "armed"          # the next backward reduces (its first hook starts REDUCING)
    REDUCING = "reducing"    # a reducing backward is under way; _finalize_backward is queued


class Reducer:
    """Owns the buckets, the per-parameter hooks and the end-of-backward wait."""

    def __init__(self, params: list[nn.Parameter], names: list[str], policy: ReducerPolicy,
                 process_group: dist.ProcessGroup | None = None, mixed: MasterParams | None = None):
        assert len(params) == len(set(map(id, params))), "parameters must be unique (tied weights once)"
        self.params = params
        self.names = names
        self.policy = policy
        self.group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.mixed = mixed
        """Mixed precision (mixed_precision.py): buckets in reduce_dtype, fp32 gradients written back."""
        self.reduce_dtype = mixed.policy.reduce_dtype_for(params[0].dtype) if mixed else params[0].dtype
        self.comm_hook: CommHook = reduction.allreduce_presummed
        self.hook_state: Any = process_group
        self._hook_registered = False
        self._prescale: float | None = None
        """Hook with divided input: each gradient is multiplied by this on its way into the bucket."""
        self._postscale: float | None = None
        """Other hooks, under join(divide_by_initial_world_size=False): N / ranks with inputs."""
        self._set_divisor(self.world_size)
        self.state = ReducerState.ARMED
        self.buckets: list[Bucket] = []
        self._slot: list[layout.Slot] = []
        """Parameter i lives in buckets[b].views[j] for (b, j) = _slot[i] (layout.py)."""
        self._ready = [False] * len(params)
        self._used = [False] * len(params)
        """Got a gradient since the last synced backward (no_sync iterations included)."""
        self._launcher: OrderedLauncher[Bucket] = OrderedLauncher(lambda b: b.state is BucketState.FULL, self._launch)
        self._handed: list[comm.Handed] = []
        """The gradients of this backward's in-place buckets, handed to the backend (released at the end)."""
        self._backwards_started = 0
        self._order = ReadyOrder(len(params))
        self._build(list(reversed(range(len(params)))))
        self._handles = hook_gradients(self, params, range(len(params)), lambda r, i, p: r._on_grad_ready(i, p))

    def remove_hooks(self) -> None:
        """Unhook every parameter (an engine that rebuilds its reducer over more parameters)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---------------------------------------------------------------- layout
    def _build(self, order: list[int]) -> None:
        """(Re)create the buckets for parameters taken in `order` (indices into self.params)."""
        self.buckets, self._slot = layout.build(self.params, order, self.policy,
                                                self.reduce_dtype if self.mixed else None)
        self._launcher.buckets = self.buckets
        self._choose_in_place()
        if self.policy.gradient_as_bucket_view:  # existing grads move into the new buckets
            layout.move_grads(self.params, self.buckets, self._slot)

    @property
    def device(self) -> torch.device:
        return self.buckets[0].params[0].device

    @property
    def num_rebuilds(self) -> int:
        return self._order.rebuilds

    def _choose_in_place(self) -> None:
        for bucket in self.buckets:
            bucket.in_place = reduction.reduces_in_place(self.comm_hook, self.policy, bucket, self._postscale)

    def bucket_param_names(self) -> list[list[str]]:
        return [[self.names[i] for i in b.param_ids] for b in self.buckets]

    def prepare_for_forward(self, require_backward_grad_sync: bool, *, source: int = 0,
                            divisor: int | None = None) -> None:
        """Called by DDP before a forward with grad enabled: rebuild buckets once, arm or disarm the backward.

        `source`: the group rank whose recorded order the rebuild uses; `divisor`: the
        number of ranks the coming average divides by (None: all N). Both differ
        from the defaults only under DDP.join.
        """
        if self.state is ReducerState.REDUCING:  # the last backward raised before its end: forget it
            self._abandon()
            self._reset_iteration()
        if self._order.rebuild_due:
            self._build(self._order.agree(self.device, self.group, source))  # everyone builds one rank's buckets
        self._set_divisor(self.world_size if divisor is None else divisor)
        self.state = ReducerState.ARMED if require_backward_grad_sync else ReducerState.LOCAL

    def arm(self, require_backward_grad_sync: bool) -> None:
        """Set the next backward's mode without a forward (DDP.set_requires_gradient_sync); not mid-backward."""
        if self.state is ReducerState.REDUCING:
            raise RuntimeError("DDP: set_requires_gradient_sync() called while a reducing backward is under way")
        self.state = ReducerState.ARMED if require_backward_grad_sync else ReducerState.LOCAL

    # ---------------------------------------------------------------- backward
    def _on_grad_ready(self, i: int, _param: nn.Parameter) -> None:
        self._used[i] = True
        if self.state is ReducerState.LOCAL:
            return  # no_sync: p.grad just accumulates locally
        if self.state is ReducerState.ARMED:
            self.state = ReducerState.REDUCING
            self._backwards_started += 1
            queue_end_of_backward(self._finalize_backward)
        self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        if self._ready[i]:
            raise RuntimeError(f"DDP: parameter '{self.names[i]}' received its gradient twice in one backward "
                               f"(reentrant backward or a second backward through the same graph); "
                               f"minidist.DDP supports one gradient per parameter per synced backward.")
        self._ready[i] = True
        self._order.note(i)
        p, (b, j) = self.params[i], self._slot[i]
        bucket = self.buckets[b]
        if bucket.in_place:
            reduction.take_in_place(p, bucket, j, self._prescale)
        else:
            reduction.copy_into_flat(p, bucket, j, self._prescale, self.policy.gradient_as_bucket_view)
        if bucket.mark_ready():
            self._launcher.launch_ready()

    def _launch(self, bucket: Bucket) -> None:
        """Start one FULL bucket's reduction through the hook (the launcher calls it in bucket order)."""
        if bucket.in_place:  # p.grad itself goes to the backend: note who refers to it now
            self._handed.append(comm.Handed(bucket.grads))
        bucket.launch(self.comm_hook(self.hook_state, bucket))

    def _finalize_backward(self, write_grads: bool = True) -> None:
        """End of backward: complete the unused, wait for every bucket, write the averages to p.grad."""
        try:
            self._launcher.launch_ready()  # a no-op unless shadow_backward filled them
            for i in finalize.unready_params(self._ready, self.names, self.policy.find_unused_parameters):
                self._mark_ready(i)  # its local grad (accumulated under no_sync) or zeros
            used = (finalize.globally_used(self._used, self.device, self.group)
                    if self.policy.find_unused_parameters else None)
            if self.mixed is not None:
                self.mixed.use_masters()  # p is fp32 again: its gradient will be too
            for bucket in self.buckets:
                bucket.finish()
                if write_grads:
                    finalize.write_averages(bucket, self.params, used, self._postscale, self.mixed,
                                            self.policy.gradient_as_bucket_view)
            for bucket in self.buckets:
                bucket.reset()
            for handed in self._handed:  # the backend's worker lets go: p.grad holds the last reference
                handed.wait_released()
            self._order.backward_done()
        except BaseException:
            self._abandon()  # wait out launched work, so the next iteration starts clean
            raise
        finally:
            self._reset_iteration()

    def _reset_iteration(self) -> None:
        self._ready = [False] * len(self.params)
        self._used = [False] * len(self.params)
        self._launcher.reset()
        self._handed = []
        self.state = ReducerState.ARMED  # until the next forward decides otherwise

    def shadow_backward(self) -> None:
        """A joined rank's half of an armed backward (DDP.join): every collective, with zeros.

        The buckets are zero-filled (with gradient_as_bucket_view that zeroes this
        rank's p.grad too), reduced in bucket order through the same hook, and the
        used bitmap is all_reduced as zeros, so the ranks that still have inputs
        find every collective matched. p.grad is not written.
        """
        assert self.state is ReducerState.ARMED, f"shadow_backward while {self.state.name}"
        self.state = ReducerState.REDUCING
        self._ready = [True] * len(self.params)
        self._used = [False] * len(self.params)  # this rank contributes no gradient
        for bucket in self.buckets:
            bucket.flat.zero_()
            if bucket.in_place:
                bucket.grads = list(bucket.views)
            for _ in bucket.params:
                bucket.mark_ready()
        self._finalize_backward(write_grads=False)  # launches them all, in order

    def _abandon(self) -> None:
        """Error path: wait out launched work (no Work left referenced), reset for the next iteration."""
        for bucket in self.buckets:
            bucket.abandon()
            bucket.reset()
        self._order.backward_abandoned()

    def set_comm_hook(self, state: Any, hook: CommHook) -> None:
        """From now on every bucket is reduced by hook(state, bucket); it receives plain local gradients."""
        if not callable(hook):
            raise TypeError(f"DDP.register_comm_hook: hook must be callable as hook(state, bucket), got {hook!r}")
        if self._hook_registered:
            raise RuntimeError("DDP: register_comm_hook can be called only once (as in torch); "
                               "construct a new DDP to use a different hook")
        if self._backwards_started:
            raise RuntimeError("DDP: register_comm_hook must be called before the first backward")
        self.comm_hook, self.hook_state, self._hook_registered = hook, state, True
        self._set_divisor(self.world_size)
        self._choose_in_place()

    def _set_divisor(self, d: int) -> None:
        """The coming average divides by d: pre-divide for the default hook, else rescale if d != N."""
        self._prescale, self._postscale = reduction.scales(self.comm_hook, self.world_size, d, self.reduce_dtype)

