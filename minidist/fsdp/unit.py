"""One FSDP unit's lifecycle: gather, compute, free, re-gather, reduce.

A unit is a module (a transformer Block, or the root) whose parameters share one
FlatParamShard. Per training step it goes through:

    pre_forward    all_gather the shard (or wait for the prefetched one), swap in the
                   unsharded params, prefetch the next unit(s) in forward order
    post_forward   full_shard: free the unsharded params now. Why: activations are
                   what must stay until backward; keeping every layer's parameters
                   too would make peak memory the full model again. The price is a
                   second all_gather in backward.
                   register pre_backward on the outputs' gradients
    pre_backward   (the gradient of an output arrives) all_gather again where it was
                   freed, prefetch the unit backward reaches next: the reverse of the
                   forward order, because backward visits layers last-to-first
    post_backward  (every trainable unsharded param's gradient is accumulated: counted
                   with post-accumulate-grad hooks, which fire once per backward even
                   for a unit called twice) reduce_scatter the gradients
                   asynchronously, free the unsharded params
    finish         (end of backward, an autograd-engine callback) wait for the
                   reductions, give each sharded param its averaged gradient shard

The order of units, prefetching and the end-of-backward callback belong to the
model as a whole: minidist.fsdp.schedule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from minidist.fsdp import collectives
from minidist.fsdp.param import FlatParamShard, ShardedState

if TYPE_CHECKING:
    from minidist.fsdp.schedule import Schedule


class TrainingState(enum.Enum):
    IDLE = enum.auto()
    FORWARD = enum.auto()
    PRE_BACKWARD = enum.auto()
    POST_BACKWARD = enum.auto()


@dataclass
class UnitComm:
    """How a unit shards and reduces; the same for every unit of one FSDP model."""

    shard_group: dist.ProcessGroup | None
    """Ranks that split the parameters (None = world)."""
    shard_world: int
    """Size of shard_group; 1 = no_shard."""
    replicate_group: dist.ProcessGroup | None
    """Ranks holding the same shard (hybrid_shard, no_shard); None when there are none."""
    replicate_world: int
    reshard_after_forward: bool
    """full_shard: True; shard_grad_op, no_shard: False."""
    reduce_dtype: torch.dtype | None
    """dtype of the gradient reduction; None = the unsharded gradients' dtype."""

    @property
    def grad_divisor(self) -> int:
        """Ranks whose gradients are summed: the average divides by all of them."""
        return self.shard_world * self.replicate_world


def _flatten_tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flatten_tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _flatten_tensors(o)]
    return []


class FSDPUnit:
    """A module, its FlatParamShard, its hooks and its training state."""

    def __init__(self, module: nn.Module, flat: FlatParamShard, comm: UnitComm, schedule: Schedule,
                 name: str):
        self.module, self.flat, self.comm, self.schedule, self.name = module, flat, comm, schedule, name
        self.training_state = TrainingState.IDLE
        self.gathering = False
        self._gather_work = None
        self._gather_input: torch.Tensor | None = None  # kept alive until the gather is waited on
        self._trainable = [p for p in flat.unsharded_params if p.requires_grad]
        self._grads_ready = 0
        self._reduce_input: torch.Tensor | None = None
        self._reduce_output: torch.Tensor | None = None
        self._rs_work = None
        self._ar_work = None
        self._reducing = False                          # a reduction started and not yet finished
        for p in self._trainable:
            p.register_post_accumulate_grad_hook(self._on_grad_accumulated)
        if flat.infos:
            module.register_forward_pre_hook(self.pre_forward, with_kwargs=True)
            module.register_forward_hook(self.post_forward, with_kwargs=True)

    def __repr__(self) -> str:
        return f"FSDPUnit({self.name or '<root>'}, {self.flat.total} params, {self.flat.state.name})"

    # -- unshard / reshard ----------------------------------------------------------------------
    def unshard(self, async_op: bool) -> None:
        """Allocate `full` and start filling it from every rank's shard."""
        assert self.flat.state is ShardedState.SHARDED and not self.gathering, f"unshard of {self}"
        self.flat.alloc_full()
        self.schedule.note_alloc()
        self.gathering = True
        if self.flat.aliased:
            return
        self._gather_input = self.flat.gather_input()
        if self.comm.shard_world == 1:
            self.flat.full.copy_(self._gather_input)
        else:
            self._gather_work = collectives.all_gather_shard(self.flat.full, self._gather_input,
                                                             self.comm.shard_group, async_op=async_op)

    def wait_for_unshard(self) -> None:
        """Make sure the unsharded params are filled and installed on the module."""
        self.schedule.became_current(self)
        if self.flat.state is ShardedState.UNSHARDED:
            return
        if not self.gathering:
            self.unshard(async_op=False)
        if self._gather_work is not None:
            self._gather_work.wait()
        self._gather_work = self._gather_input = None
        self.gathering = False
        self.flat.to_unsharded()

    def reshard(self) -> None:
        if self.gathering:  # a prefetch that was never used
            self.wait_for_unshard()
        self.schedule.became_current(self)
        if self.flat.state is ShardedState.UNSHARDED:
            self.flat.to_sharded()

    # -- forward hooks --------------------------------------------------------------------------
    def pre_forward(self, module: nn.Module, args: tuple, kwargs: dict):
        assert self.training_state is TrainingState.IDLE, (
            f"{self} entered forward while {self.training_state.name}; forward during backward "
            f"(e.g. activation checkpointing recompute) is not supported")
        self.training_state = TrainingState.FORWARD
        self.schedule.record_pre_forward(self)
        self.wait_for_unshard()
        self.schedule.prefetch_after(self, backward=False)
        return None

    def post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any):
        assert self.training_state is TrainingState.FORWARD, f"post_forward of {self} in {self.training_state}"
        self.schedule.record_post_forward(self)
        if self.comm.reshard_after_forward:
            self.reshard()
        if torch.is_grad_enabled():
            outs = [t for t in _flatten_tensors(output) if t.requires_grad]
            if outs:
                torch.autograd.graph.register_multi_grad_hook(outs, self.pre_backward, mode="any")
        self.training_state = TrainingState.IDLE
        return output

    # -- backward hooks -------------------------------------------------------------------------
    def pre_backward(self, *unused: Any) -> None:
        assert self.training_state in (TrainingState.IDLE, TrainingState.PRE_BACKWARD,
                                       TrainingState.POST_BACKWARD), f"pre_backward of {self}"
        self.schedule.queue_finish()
        if self.training_state is TrainingState.IDLE:
            self.training_state = TrainingState.PRE_BACKWARD
        self.wait_for_unshard()
        self.schedule.prefetch_after(self, backward=True)

    def _on_grad_accumulated(self, param: torch.Tensor) -> None:
        self._grads_ready += 1
        if self._grads_ready == len(self._trainable):
            self.post_backward()

    def post_backward(self) -> None:
        """All of this unit's gradients exist: start reducing them, free the unsharded params."""
        assert self.training_state is TrainingState.PRE_BACKWARD, f"post_backward of {self} in {self.training_state}"
        self.training_state = TrainingState.POST_BACKWARD
        if self.schedule.sync_grads and self._trainable:
            self.schedule.wait_previous_reduction(self)
            self._start_reduction()
        self.reshard()

    def finalize_post_backward(self) -> None:
        """End of backward: reduce and reshard what post_backward did not reach."""
        if self.training_state is TrainingState.PRE_BACKWARD:
            self.post_backward()
        elif self.schedule.sync_grads and not self._reducing and self.flat.has_unsharded_grads:
            self._start_reduction()  # grads accumulated under no_sync, this backward touched none
        self.reshard()
        self._grads_ready = 0
        self.training_state = TrainingState.IDLE

    # -- gradient reduction ---------------------------------------------------------------------
    def _start_reduction(self) -> None:
        dtype = self.comm.reduce_dtype or self.flat.param_dtype
        self._reducing = True
        flat_grad = self.flat.flat_grad(dtype)   # (padded,)
        self._reduce_input = flat_grad
        if self.comm.shard_world == 1:
            self._reduce_output = flat_grad
        else:
            self._reduce_output = torch.empty(self.flat.shard_size, dtype=dtype, device=flat_grad.device)
            self._rs_work = collectives.reduce_scatter_grad(self._reduce_output, flat_grad, self.comm.shard_group)
            return
        self.wait_reduce_scatter()

    def wait_reduce_scatter(self) -> None:
        if self._rs_work is not None:
            self._rs_work.wait()
            self._rs_work = None
            self._reduce_input = None  # the padded full gradient: S bytes, free it now
        if self._reduce_output is not None and self.comm.replicate_world > 1 and self._ar_work is None:
            self._ar_work = collectives.all_reduce_grad(self._reduce_output, self.comm.replicate_group)

    def finish_reduction(self) -> None:
        if self._reduce_output is None:
            return
        self.wait_reduce_scatter()
        if self._ar_work is not None:
            self._ar_work.wait()
            self._ar_work = None
        shard_grad = self._reduce_output.to(self.flat.dtype).div_(self.comm.grad_divisor)
        self.flat.accumulate_sharded_grad(shard_grad)
        self._reduce_input = self._reduce_output = None
        self._reducing = False
