"""The schedule of one FSDP model's units: their order, prefetching, the end of backward.

Forward order is recorded on the first forward (pre_forward order); backward meets
the units in the reverse of their post_forward order, because backward visits
layers last-to-first. Prefetch issues the all_gather of the unit that runs next
while the current one computes, so communication hides behind compute.

Prefetch caps memory: at most `max_inflight` units are unsharded ahead of use, so
peak parameter memory is (units in use + max_inflight) unsharded units plus 1/N of
everything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minidist.fsdp.param import ShardedState

if TYPE_CHECKING:
    from minidist.fsdp.unit import FSDPUnit


class Schedule:
    """The order of the units, prefetching, and the end-of-backward callback of one model."""

    def __init__(self, units: list["FSDPUnit"], forward_prefetch: bool, backward_prefetch: bool,
                 max_inflight: int):
        self.units = units
        self.forward_prefetch, self.backward_prefetch = forward_prefetch, backward_prefetch
        self.max_inflight = max_inflight
        self.forward_order: list[FSDPUnit] = []   # first pre_forward of each unit, first step
        self.post_forward_order: list[FSDPUnit] = []  # reversed, the order backward meets them
        self.recording = True
        self.prefetched: list[FSDPUnit] = []      # unsharded (or gathering) ahead of use
        self.callback_queued = False
        self.sync_grads = True                    # False inside no_sync()
        self.peak_live = 0                        # most unsharded units alive at once (testing, stats)
        self.last_reducing: FSDPUnit | None = None  # its reduce_scatter may still be in flight

    # -- order ----------------------------------------------------------------------------------
    def record_pre_forward(self, unit: "FSDPUnit") -> None:
        if self.recording and unit not in self.forward_order:
            self.forward_order.append(unit)

    def record_post_forward(self, unit: "FSDPUnit") -> None:
        if self.recording and unit not in self.post_forward_order:
            self.post_forward_order.append(unit)

    def end_forward(self) -> None:
        """The root forward returned: the order is known from now on."""
        self.recording = False

    # -- prefetch -------------------------------------------------------------------------------
    def became_current(self, unit: "FSDPUnit") -> None:
        if unit in self.prefetched:
            self.prefetched.remove(unit)

    def prefetch_after(self, unit: "FSDPUnit", backward: bool) -> None:
        """Start the all_gathers of the units that run after `unit`, up to max_inflight ahead."""
        if self.recording or not (self.backward_prefetch if backward else self.forward_prefetch):
            return
        order = self.post_forward_order[::-1] if backward else self.forward_order
        if unit not in order:
            return
        for nxt in order[order.index(unit) + 1:]:
            if len(self.prefetched) >= self.max_inflight:
                break
            if nxt.flat.state is ShardedState.SHARDED and not nxt.gathering:
                nxt.unshard(async_op=True)
                self.prefetched.append(nxt)

    def note_alloc(self) -> None:
        live = sum(1 for u in self.units if u.flat.is_allocated and not u.flat.aliased)
        self.peak_live = max(self.peak_live, live)

    # -- reductions -----------------------------------------------------------------------------
    def wait_previous_reduction(self, unit: "FSDPUnit") -> None:
        """Before `unit` reduces, wait for the previous unit's reduce_scatter and free its input.

        Why: the reduce_scatter input is the unit's full padded gradient (S_unit bytes). Holding
        every unit's until the end of backward would cost the whole model's gradients at the
        peak; one in flight behind the current one still overlaps communication with the
        backward compute between the two post_backwards.
        """
        if self.last_reducing is not None and self.last_reducing is not unit:
            self.last_reducing.wait_reduce_scatter()
        self.last_reducing = unit

    # -- end of backward ------------------------------------------------------------------------
    def queue_finish(self) -> None:
        """Called from the first pre_backward of a backward pass: run finish() when it ends."""
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_backward)

    def finish_backward(self) -> None:
        """Every gradient is computed: complete all reductions, reshard, reset for the next step.

        Units whose post_backward never ran (some trainable params got no gradient) reduce
        here, so that every rank issues the same collectives in the same order.
        """
        for u in self.units:
            u.finalize_post_backward()
        for u in self.units:  # hybrid: reduce_scatter done -> start the replica all_reduce
            u.wait_reduce_scatter()
        for u in self.units:
            u.finish_reduction()
        self.prefetched.clear()
        self.last_reducing = None
        self.callback_queued = False
        self.recording = False
