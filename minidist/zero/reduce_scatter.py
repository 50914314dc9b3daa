"""Backward: gradient hooks fill the buckets, each full bucket is reduce_scattered at once.

Follow one gradient (the path of minidist.buckets.launcher, which DDP's reducer takes too,
with reduce_scatter for all_reduce):

1. autograd accumulates into ``p.grad`` and runs p's post-accumulate-grad hook
   (launcher.hook_gradients) -> ``_on_grad((b, j), p)``;
2. the gradient is folded (added) into its slot of the bucket's flat gradient
   buffer and ``p.grad`` is freed: from here on the gradient lives in the bucket;
3. in a synced backward the bucket counts its parameters down; when it is FULL,
   the launcher starts the async reduce_scatter of every FULL bucket from the
   next one in launch order (collectives are matched by issue order, so every
   rank launches the buckets in the same order: a bucket that fills early
   waits); backward keeps running meanwhile;
4. at the end of backward (launcher.queue_end_of_backward, by the first hook) buckets whose
   parameters got no gradient are completed with zeros and launched, and every
   reduce_scatter is waited on in launch order: this rank's shard of the
   averaged gradient is then in each bucket's ``master.grad``.

Cost per rank and step: a reduce_scatter of the S gradient bytes, S (N-1)/N sent
(the ring of minidist.comm.ring on gloo; the backend's own elsewhere): half of
DDP's all_reduce. The other half is the parameter all_gather after step()
(all_gather.py): in total exactly DDP's 2 S (N-1)/N.

ZeRO-2 frees each bucket's gradient buffer when its reduce_scatter completes
(checked at every launch) and keeps at most ``max_inflight`` of them in flight: a
backward faster than the wire would otherwise hold every bucket at once, the whole
gradient, which is what ZeRO-2 is meant not to hold.

Whether a backward reduces is decided when it starts (its first hook), from
``require_backward_grad_sync`` (False inside ShardedOptimizer.no_sync()): so the
backward, not only the forward, must run inside no_sync (DDP decides in the
forward). Unsynced backwards fold into the buckets without communicating; the
next synced one reduces the sum.

Averaging: the buckets are summed in ``reduce_dtype`` after dividing by ``pre``
and divided by ``post`` afterwards (minidist.precision.divide_factors: fp16 sums
divide by about sqrt(N) before and after so that neither overflows nor
underflows; fp32 and bf16 divide once, after, on the k-element shard only).
"""

from __future__ import annotations

import enum
from typing import Callable

import torch.nn as nn

from minidist.buckets.launcher import OrderedLauncher, hook_gradients, queue_end_of_backward
from minidist.zero.bucket import GradState, ZeroBucket, twice


class BackwardState(enum.Enum):
    IDLE = "idle"            # no backward under way
    LOCAL = "local"          # a backward under no_sync: gradients fold into the buckets, nothing is sent
    REDUCING = "reducing"    # a synced backward: full buckets launch their reduce_scatter


class GradientReducer:
    """Owns the gradient hooks, the launch order and the end-of-backward wait."""

    def __init__(self, on_backward_start: Callable[[], None], max_inflight: int | None = None):
        self.on_backward_start = on_backward_start
        """Called when a backward starts (before any gradient is folded): waits for pending all_gathers."""
        self.max_inflight = max_inflight
        """ZeRO-2: at most this many reduce_scatters in flight (their buffers alive); launching one
        more first waits for the oldest. None: no limit (ZeRO-1's buffers live anyway)."""
        self._launcher: OrderedLauncher[ZeroBucket] = OrderedLauncher(
            lambda b: b.grad_state is GradState.FULL, self._launch)
        self.buckets = self._launcher.buckets
        self.names: list[list[str]] = []
        self.require_backward_grad_sync = True
        """torch DDP's name: False inside no_sync(); read when a backward starts."""
        self.state = BackwardState.IDLE
        self._launched: list[ZeroBucket] = []
        """Buckets whose reduce_scatter was launched and not yet finished, in launch order."""
        self._handles = []

    def add(self, bucket: ZeroBucket, names: list[str]) -> None:
        """Append a bucket (launched after every earlier one) and hook its parameters."""
        self.buckets.append(bucket)
        self.names.append(names)
        keys = [(bucket.index, j) for j in range(len(bucket.params))]
        self._handles += hook_gradients(self, bucket.params, keys, lambda r, key, p: r._on_grad(key, p))

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---------------------------------------------------------------- backward
    def _on_grad(self, key: tuple[int, int], p: nn.Parameter) -> None:
        b, j = key
        if self.state is BackwardState.IDLE:
            self.state = BackwardState.REDUCING if self.require_backward_grad_sync else BackwardState.LOCAL
            self.on_backward_start()
            queue_end_of_backward(self._end_backward)
        bucket = self.buckets[b]
        if self.state is BackwardState.REDUCING and bucket.was_ready(j):
            raise RuntimeError(twice(self.names[b][j]))
        bucket.fold(j, p.grad)
        p.grad = None  # the gradient lives in the bucket now
        if self.state is BackwardState.REDUCING and bucket.mark_ready(j, self.names[b][j]):
            self._launch_full()

    def _launch_full(self) -> None:
        """Launch every FULL bucket in order (the launcher), then reap those already reduced."""
        self._launcher.launch_ready()
        self._reap()

    def _launch(self, bucket: ZeroBucket) -> None:
        """Start one bucket's reduce_scatter (called by the launcher, in bucket order)."""
        if self.max_inflight is not None and len(self._launched) >= self.max_inflight:
            self._launched.pop(0).finish()  # bounds the gradient memory in flight (ZeRO-2)
        bucket.launch()
        self._launched.append(bucket)

    def _reap(self) -> None:
        """Finish the oldest launched buckets whose reduce_scatter has completed (ZeRO-2 frees their buffer)."""
        while self._launched and self._launched[0].is_reduced():
            self._launched.pop(0).finish()

    def _end_backward(self) -> None:
        try:
            if self.state is BackwardState.REDUCING:
                for bucket in self._launcher.unlaunched:  # parameters without a gradient here give zeros
                    bucket.complete(self.names[bucket.index])
                self._launch_full()
                while self._launched:
                    self._launched.pop(0).finish()
        except BaseException:
            self.abandon()
            raise
        finally:
            self.state = BackwardState.IDLE
            self._launcher.reset()

    def reduce_accumulated(self) -> None:
        """Reduce now, outside any backward, what the backwards under no_sync accumulated, exactly as the
        next synced backward's end would: every bucket completes (its sum; zeros where nothing came) and
        launches in order, and this rank's averaged shards land in master.grad. What a pipeline calls once
        its schedule is done (minidist.pp.compose.deferred): nothing then overlaps the reduce_scatters."""
        assert self.state is BackwardState.IDLE, f"reduce_accumulated inside a backward ({self.state.value})"
        self.on_backward_start()
        self.state = BackwardState.REDUCING
        self._end_backward()

    def abandon(self) -> None:
        """Error path: wait out launched work, drop this step's gradients, so the next step starts clean."""
        for bucket in self.buckets:
            bucket.abandon()
        self._launched = []
        self._launcher.reset()
        self.state = BackwardState.IDLE

