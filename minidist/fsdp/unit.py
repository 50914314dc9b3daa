"""One FSDP unit's lifecycle: gather, compute, free, re-gather, reduce.

A unit is a module (a transformer Block, or the root) whose parameters are gathered
together (one all_gather) and reduced together (one reduce_scatter); their layout and
buffers are one UnitShards (minidist.fsdp.param). It owns two state machines and asserts
every transition: the sharded state (SHARDED -> GATHERING -> UNSHARDED -> SHARDED, with the
moves unshard, reshard and prefetch: minidist.fsdp.sharded_state, which FSDPUnit extends)
and the training state, moved by the hooks defined here:

    training state   IDLE --pre_forward--> FORWARD --post_forward--> IDLE
                     IDLE --pre_backward--> PRE_BACKWARD --post_backward--> POST_BACKWARD
                     any --finish_backward--> IDLE

Per training step, one unit goes (minidist.fsdp.all_gather, minidist.fsdp.reduce_scatter):

    pre_forward    unshard: start_all_gather (allocate `full`, copy-in, all_gather into it;
                   or take the prefetched one), wait, install the unsharded params; prefetch: the units set with
                   set_modules_to_forward_prefetch, else the next unit in forward
                   order (schedule.py)
    compute        the module's forward, on the unsharded params
    post_forward   reshard_after_forward=True (full_shard): reshard (install the shards,
                   free `full`). Why: activations
                   are what must stay until backward; keeping every layer's parameters
                   too would make peak memory the full model again. The price is a
                   second all_gather in backward. Except the unit whose post_forward
                   ends the forward pass (schedule.ends_forward; the root, for a GPT):
                   backward needs it first, so it stays gathered (FSDP2 keeps its
                   root's the same way): one all_gather less per step, no higher peak
                   (backward would re-gather it before anything else). Register
                   pre_backward on the outputs' gradients.
    pre_backward   (the gradient of an output arrives) unshard again where it was freed;
                   prefetch the units set with set_modules_to_backward_prefetch, else the
                   unit backward reaches next: the reverse of the forward order, because
                   backward visits layers last-to-first
    post_backward  (every trainable unsharded param's gradient is accumulated: counted
                   with post-accumulate-grad hooks, which fire once per backward even for
                   a unit called twice or recomputed) reshard first, then finish the
                   previous unit's reduce_scatter (last_reduction.advance()), then
                   start_reduction of the gradients -> a GradReduction in flight
                   (copy-in, reduce_scatter, replica all_reduce). The order is the
                   memory peak's: `full` and the previous reduce_scatter's input
                   (S_unit each) are freed before this one's input (S_unit) exists.
                   Each gradient accumulated polls the previous reduction (never
                   blocking), so its input is freed as soon as it has landed.
    finish_backward  (end of backward, an autograd-engine callback) reduction.wait()
                   -> the averaged rows (divided, master dtype, storage device), handed
                   to the sharded params as views

Activation checkpointing (torch.utils.checkpoint, use_reentrant=False) may run a
unit's forward again inside backward to recompute activations. That pre_forward
only makes sure the unit is UNSHARDED (kept if still gathered, else gathered now)
and leaves the training state alone; the params stay gathered because the
recomputed activations saved them, and the unit's post_backward (or the end of
backward, for a unit without trainable params) frees them. The recompute's
post_forward does nothing: it may not even run (checkpoint stops recomputing
early once it has what backward needs), and a reshard there would free params
backward is about to use.

The order of units, the prefetch queue and the sync flag are shared data in
minidist.fsdp.schedule, which the unit consults.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves  # as FSDP2 walks a module's outputs

from minidist.fsdp.shard_spec import MeshInfo
from minidist.fsdp.param import UnitShards
from minidist.fsdp.reduce_scatter import GradReduction, ReductionStage, start_reduction
from minidist.fsdp.schedule import Schedule
from minidist.fsdp.sharded_state import SHARDED_TRANSITIONS, ShardedState, ShardedUnit  # noqa: F401 - importable here
from minidist.fsdp.streams import Streams


class TrainingState(enum.Enum):
    IDLE = enum.auto()
    FORWARD = enum.auto()
    PRE_BACKWARD = enum.auto()
    """An output's gradient arrived; the unit's own gradients are being computed."""
    POST_BACKWARD = enum.auto()
    """Its gradients are complete and their reduction started."""


@dataclass(frozen=True)
class UnitPolicy:
    """What a unit does beyond the mesh; the same for every unit of one FSDP model."""

    reshard_after_forward: bool
    """FSDP2's: True frees the unsharded parameters after forward (full_shard), False keeps them
    until the unit's backward (shard_grad_op; no_shard, which gathers nothing)."""
    reduce_dtype: torch.dtype | None
    """dtype of the gradient reduction; None = the unsharded gradients' dtype."""


def _in_backward() -> bool:
    """True inside an autograd backward pass (as torch's FSDP2 asks, through the same private call)."""
    return torch._C._current_graph_task_id() != -1


class FSDPUnit(ShardedUnit):
    """A module, its UnitShards, its hooks and its two states (the sharded one: ShardedUnit)."""

    def __init__(self, module: nn.Module, shards: UnitShards, mesh: MeshInfo, policy: UnitPolicy,
                 schedule: Schedule["FSDPUnit"], streams: Streams, name: str):
        super().__init__(shards, mesh, schedule, streams, name)
        self.module, self.policy = module, policy
        self.training_state = TrainingState.IDLE
        self._reduction: GradReduction | None = None
        self._trainable = [fp.unsharded for fp in shards.params if fp.unsharded.requires_grad]
        self._grads_ready = 0
        for p in self._trainable:
            p.register_post_accumulate_grad_hook(self._on_grad_accumulated)
        if shards.params:
            module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            module.register_forward_hook(self._post_forward, with_kwargs=True)

    @property
    def reduction(self) -> GradReduction | None:
        """The gradient reduction in flight (between post_backward and the end of backward), if any."""
        return self._reduction

    # -- forward hooks --------------------------------------------------------------------------
    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if _in_backward():  # activation checkpointing recomputes this forward (module docstring)
            self.unshard()
            return
        if self.training_state is not TrainingState.IDLE:
            raise RuntimeError(
                f"{self} entered forward while {self.training_state.name}: a unit cannot run inside its own "
                f"forward, and a forward cannot start before the previous backward finished")
        self.training_state = TrainingState.FORWARD
        self.schedule.record_pre_forward(self)
        self.unshard()
        self._prefetch(backward=False)

    def _post_forward(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if _in_backward():  # recompute: backward is about to use these params (module docstring)
            return output
        assert self.training_state is TrainingState.FORWARD, f"post_forward of {self} in {self.training_state}"
        self.schedule.record_post_forward(self)
        if self.policy.reshard_after_forward and not self.schedule.ends_forward():
            self.reshard()
        if torch.is_grad_enabled():
            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if outs:
                torch.autograd.graph.register_multi_grad_hook(outs, self._pre_backward, mode="any")
        self.training_state = TrainingState.IDLE
        return output

    # -- backward hooks -------------------------------------------------------------------------
    def _pre_backward(self, *unused: Any) -> None:
        if self.training_state is TrainingState.FORWARD:
            raise RuntimeError(f"a backward reached {self} while its forward runs (autograd.grad inside its "
                               f"forward?); finish the forward first")
        if not self.schedule.end_of_backward_queued:
            self.schedule.end_of_backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(lambda: finish_backward(self.schedule))
        if self.training_state is TrainingState.IDLE:
            self.training_state = TrainingState.PRE_BACKWARD
        self.unshard()
        self._prefetch(backward=True)

    def _on_grad_accumulated(self, param: torch.Tensor) -> None:
        if self.schedule.last_reduction is not None:  # free its input as soon as it landed (never blocks)
            self.schedule.last_reduction.poll()
        self._grads_ready += 1
        if self._grads_ready == len(self._trainable):
            self._post_backward()

    def _post_backward(self) -> None:
        """All of this unit's gradients exist: start reducing them, free the unsharded params."""
        if self.training_state is not TrainingState.PRE_BACKWARD:
            raise RuntimeError(
                f"gradients of {self} were computed outside its backward ({self.training_state.name}): its params "
                f"must be used inside its forward, and activation checkpointing needs use_reentrant=False")
        self.training_state = TrainingState.POST_BACKWARD
        self.reshard()  # first: the gradients are tensors of their own, and `full` (S_unit) goes before
        if self.schedule.require_backward_grad_sync:  # the reduce_scatter input (S_unit) is allocated
            self._start_reduction()

    def _start_reduction(self) -> None:
        """Hand the gradients to a new GradReduction, after the previous unit's reduce_scatter.

        Why wait for the previous one first: a reduce_scatter's input is its unit's whole
        padded gradient (S_unit bytes). Holding every unit's until the end of backward
        would cost the whole model's gradients at the peak; with one in flight behind the
        current one, communication still overlaps the backward compute between two
        post_backwards, and at most two S_unit inputs are alive.
        """
        if self.schedule.last_reduction is not None:
            self.schedule.last_reduction.advance()
        dtype = self.policy.reduce_dtype or self.shards.param_dtype
        self._reduction = start_reduction(self.shards, self.mesh, dtype, self.streams)
        self.schedule.last_reduction = self._reduction
        self.schedule.reducing.append(self)

    # -- end of backward ------------------------------------------------------------------------
    def _finalize_backward(self) -> None:
        """Reduce and reshard what post_backward did not reach."""
        if self.training_state is TrainingState.PRE_BACKWARD and self._trainable:
            self._post_backward()  # some trainable params got no gradient this backward
        elif (self.schedule.require_backward_grad_sync and self._reduction is None
              and self.shards.has_unsharded_grads):
            self._start_reduction()  # grads accumulated under no_sync, this backward touched none
        self.reshard()
        self._grads_ready = 0
        self.training_state = TrainingState.IDLE

    def _finish_reduction(self) -> None:
        if self._reduction is not None:
            self.shards.accumulate_sharded_grads(self._reduction.wait())
            self._reduction = None


def finish_backward(schedule: Schedule[FSDPUnit]) -> None:
    """End of backward (an autograd-engine callback): complete every reduction, reshard, reset.

    Units whose post_backward never ran (some trainable params got no gradient) reduce
    here, so that every rank issues the same collectives in the same order. Reductions
    complete in the order they started: the last one (the first layer's, issued at the
    very end of backward) is waited on last, so the other units' divides and hand-overs
    run while it is still in flight. Every reduce_scatter is finished (hybrid: every
    replica all_reduce started) before any all_reduce is waited on, so the all_reduces
    overlap each other.
    """
    for u in schedule.units:
        u._finalize_backward()
    for u in schedule.reducing:
        u._reduction.advance()
        if u._reduction.stage is ReductionStage.DONE:  # no replica all_reduce to wait for
            u._finish_reduction()
    for u in schedule.reducing:
        u._finish_reduction()
    schedule.end_backward()
