"""What the units of one FSDP model share: their order, the prefetch queue, the sync flag.

Passive data that the units consult and update; it calls nothing on a unit (and
does not import minidist.fsdp.unit, so units appear here as an opaque type U).

Order. Forward order is recorded on the first forward (pre_forward order);
backward meets the units in the reverse of their post_forward order, because
backward visits layers last-to-first. A unit that runs next in that order can be
prefetched: its all_gather is issued while the current unit computes, so the
communication hides behind compute.

Prefetch caps memory: at most `max_inflight` units are gathered ahead of use (a unit
being gathered holds its all_gather output, S_unit), so peak parameter memory is
(units in use + max_inflight) units plus 1/N of everything else; a copy-out briefly
holds a unit's output and its unsharded parameters together. The default,
DEFAULT_MAX_INFLIGHT_ALL_GATHERS = 1, is FSDP2's: one unit ahead hides a unit's
all_gather whenever a unit computes at least as long as it gathers, and each further
one adds S_unit to the peak (benchmarks/fsdp_vs_torch.py --mode memory measures the
default against FSDP2's).

End of forward. The post_forward that ends the forward pass (counted on the first
forward: the same number of post_forwards ends every later one) belongs to the unit
backward needs first: ends_forward() tells it to stay gathered.

Reductions. `last_reduction` is the most recent unit's gradient reduction; the
next unit finishes its reduce_scatter before starting its own (the memory bound
explained in FSDPUnit._start_reduction). `reducing` lists the units in the order
their reductions started, the order the end of backward completes them in.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from minidist.fsdp.reduce_scatter import GradReduction

U = TypeVar("U")

DEFAULT_MAX_INFLIGHT_ALL_GATHERS = 1
"""Units gathered ahead of use by default (FSDP(max_inflight_all_gathers=), the recipes' strategy)."""


class Schedule(Generic[U]):
    """The order of one model's units, its prefetch queue, and per-backward flags."""

    def __init__(self, forward_prefetch: bool, backward_prefetch: bool, max_inflight: int):
        self.units: list[U] = []                  # every unit, module order, root first
        self.forward_prefetch, self.backward_prefetch = forward_prefetch, backward_prefetch
        self.max_inflight = max_inflight
        self.forward_order: list[U] = []          # first pre_forward of each unit, first step
        self.post_forward_order: list[U] = []     # reversed: the order backward meets them
        self.post_forwards = 0                    # post_forwards so far in this forward pass
        self.post_forwards_per_pass: int | None = None  # counted on the first forward
        self.recording = True                     # until the first root forward returns
        self.prefetched: list[U] = []             # gathering or gathered ahead of use
        self.require_backward_grad_sync = True    # False inside FSDP.no_sync()
        self.end_of_backward_queued = False       # the autograd-engine callback of this backward
        self.last_reduction: GradReduction | None = None
        self.reducing: list[U] = []               # units whose reduction started this backward, in issue order
        self.live_unsharded = 0                   # units whose `full` buffer is allocated now
        self.peak_live = 0                        # most of them at once (testing, stats)

    # -- order ----------------------------------------------------------------------------------
    def record_pre_forward(self, unit: U) -> None:
        if self.recording and unit not in self.forward_order:
            self.forward_order.append(unit)

    def record_post_forward(self, unit: U) -> None:
        if self.recording and unit not in self.post_forward_order:
            self.post_forward_order.append(unit)
        self.post_forwards += 1

    def ends_forward(self) -> bool:
        """The post_forward being recorded is the last of the forward pass (known from the second pass on)."""
        return self.post_forwards == self.post_forwards_per_pass

    def begin_forward(self) -> None:
        """The root forward starts: count its post_forwards from zero (even after one that raised)."""
        self.post_forwards = 0

    def end_forward(self) -> None:
        """The root forward returned: the order is known from now on."""
        if self.recording:
            self.post_forwards_per_pass = self.post_forwards
        self.recording = False

    # -- prefetch -------------------------------------------------------------------------------
    def upcoming(self, unit: U, backward: bool) -> list[U]:
        """The units that run after `unit` in this pass; [] if this direction does not prefetch."""
        if self.recording or not (self.backward_prefetch if backward else self.forward_prefetch):
            return []
        order = self.post_forward_order[::-1] if backward else self.forward_order
        return order[order.index(unit) + 1:] if unit in order else []

    def prefetch_slot_free(self) -> bool:
        return len(self.prefetched) < self.max_inflight

    def became_current(self, unit: U) -> None:
        """`unit` is used now: it no longer counts against the prefetch budget."""
        if unit in self.prefetched:
            self.prefetched.remove(unit)

    # -- unsharded buffers ----------------------------------------------------------------------
    def note_alloc(self) -> None:
        self.live_unsharded += 1
        self.peak_live = max(self.peak_live, self.live_unsharded)

    def note_free(self) -> None:
        self.live_unsharded -= 1

    # -- end of backward ------------------------------------------------------------------------
    def end_backward(self) -> None:
        """Every unit finished its backward: reset what is per backward."""
        self.prefetched.clear()
        self.last_reduction = None
        self.reducing.clear()
        self.end_of_backward_queued = False
        self.recording = False
