"""What the units of one FSDP model share: their order, the prefetch lists and queue, the sync flag.

Passive data that the units consult and update; it calls nothing on a unit (and
does not import minidist.fsdp.unit, so units appear here as an opaque type U).

Order. Forward order is recorded on the first forward (pre_forward order);
backward meets the units in the reverse of their post_forward order, because
backward visits layers last-to-first. A unit that runs next in that order can be
prefetched: its all_gather is issued while the current unit computes, so the
communication hides behind compute.

Prefetch, as FSDP2 does it. By default (implicit prefetch) each unit gathers the next
unit in the recorded order, at most DEFAULT_PREFETCH = 1 unit ahead of use: one unit ahead
hides a unit's all_gather whenever a unit computes at least as long as it gathers. A unit
being gathered holds its `full`, S_unit, from the gather's start, so peak parameter memory
is (units in use + 1) units plus 1/N of everything else (benchmarks/fsdp_vs_torch.py --mode
memory measures the default against FSDP2's). Explicit prefetch replaces the default for a unit:
FSDPUnit.set_modules_to_forward_prefetch([...]) / set_modules_to_backward_prefetch([...])
(FSDP2's names) list the units whose all_gathers that unit issues as soon as its own
parameters are installed; every listed unit adds S_unit to the peak while it waits for
its turn, and an empty list turns prefetch off for that unit.

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

DEFAULT_PREFETCH = 1
"""Units the implicit prefetch gathers ahead of use, forward and backward (FSDP2's: the next one)."""


class Schedule(Generic[U]):
    """The order of one model's units, their prefetch lists and queue, and per-backward flags."""

    def __init__(self):
        self.units: list[U] = []                  # every unit, module order, root first
        self.explicit: dict[tuple[U, bool], list[U]] = {}  # (unit, backward) -> units it prefetches
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
    def set_prefetch(self, unit: U, units: list[U], backward: bool) -> None:
        """Explicit prefetch: `unit` gathers `units` ahead of use in this direction (FSDP2's lists)."""
        assert unit in self.units and all(u in self.units and u is not unit for u in units), \
            "prefetch lists name other units of the same FSDP model"
        self.explicit[(unit, backward)] = list(units)

    def explicit_prefetch(self, unit: U, backward: bool) -> list[U] | None:
        """The units `unit` was told to prefetch in this direction; None: the implicit default."""
        return self.explicit.get((unit, backward))

    def upcoming(self, unit: U, backward: bool) -> list[U]:
        """Implicit prefetch: the units that run after `unit` in this pass (recorded order); [] while recording."""
        if self.recording:
            return []
        order = self.post_forward_order[::-1] if backward else self.forward_order
        return order[order.index(unit) + 1:] if unit in order else []

    def prefetch_slot_free(self) -> bool:
        """Implicit prefetch stays within DEFAULT_PREFETCH units gathered ahead of use."""
        return len(self.prefetched) < DEFAULT_PREFETCH

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


def prefetch_ahead(units: list, forward: int = DEFAULT_PREFETCH, backward: int = DEFAULT_PREFETCH) -> None:
    """Explicit prefetch lists by module order, as torchtitan sets FSDP2's (`units`: FSDP.units, root first).

    In forward the root gathers the first `forward` blocks and each block the next `forward`;
    in backward the root gathers the last `backward` blocks and each block the `backward`
    before it. 0 turns prefetch off. For a model whose blocks run in module order, 1 is the
    default schedule written out; k > 1 holds k unsharded units ahead of use.
    """
    if forward < 0 or backward < 0:
        raise ValueError(f"prefetch_ahead: forward={forward}, backward={backward}: units ahead, 0 or more")
    root, blocks = units[0], list(units[1:])
    root.set_modules_to_forward_prefetch(blocks[:forward])
    root.set_modules_to_backward_prefetch(blocks[::-1][:backward])
    for i, unit in enumerate(blocks):
        unit.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + forward])
        unit.set_modules_to_backward_prefetch(blocks[:i][::-1][:backward])
