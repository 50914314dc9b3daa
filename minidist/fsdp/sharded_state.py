"""A unit's parameters between their shards and the gathered whole: the sharded state and its moves.

One FSDP unit (minidist.fsdp.unit) gathers its parameters together (one all_gather)
before it computes and frees them after; between the two its parameters pass through
three states, and every move is asserted against SHARDED_TRANSITIONS:

    SHARDED --_start_unshard--> GATHERING --_finish_unshard--> UNSHARDED
       ^                                                          |
       +------------------------- reshard ------------------------+

    _start_unshard   allocate `full` (S_unit bytes), copy-in and start the all_gather into
                     it (minidist.fsdp.all_gather)
    _finish_unshard  wait for it, install the unsharded params
    reshard          install the shards and free `full` (after waiting for a prefetch
                     that was never used: its output is still being written)

``unshard`` moves a unit to UNSHARDED from wherever it is, because the unit is needed
now; ``_prefetch`` starts other units' all_gathers ahead of their use, so the transfer
hides behind this unit's compute: the units set with set_modules_to_forward_prefetch /
set_modules_to_backward_prefetch, else the next one in the schedule's order, while a
prefetch slot is free (minidist.fsdp.schedule: why one unit ahead, and what it costs
in memory). The training hooks that decide when these moves happen are FSDPUnit's.
"""

from __future__ import annotations

import enum

from minidist.fsdp.all_gather import AllGather, start_all_gather
from minidist.fsdp.param import UnitShards
from minidist.fsdp.schedule import Schedule
from minidist.fsdp.shard_spec import MeshInfo
from minidist.fsdp.streams import Streams


class ShardedState(enum.Enum):
    SHARDED = enum.auto()
    """Only `local` holds values; module attributes hold the sharded params; `full` has no storage."""
    GATHERING = enum.auto()
    """The unit's all_gather into `full` is in flight; attributes still hold the shards."""
    UNSHARDED = enum.auto()
    """`full` is filled; module attributes hold the unsharded params."""


SHARDED_TRANSITIONS = frozenset({(ShardedState.SHARDED, ShardedState.GATHERING),
                                 (ShardedState.GATHERING, ShardedState.UNSHARDED),
                                 (ShardedState.UNSHARDED, ShardedState.SHARDED)})
"""Every move the sharded state may make (asserted by ShardedUnit._to; docs/fsdp.md's diagram draws them)."""


class ShardedUnit:
    """A unit's UnitShards and its sharded state: gather, install, free; prefetch the units ahead."""

    def __init__(self, shards: UnitShards, mesh: MeshInfo, schedule: Schedule["ShardedUnit"], streams: Streams,
                 name: str):
        self.shards, self.mesh, self.schedule, self.streams, self.name = shards, mesh, schedule, streams, name
        self.sharded_state = ShardedState.SHARDED
        self._gather: AllGather | None = None

    @property
    def all_gather(self) -> AllGather | None:
        """The all_gather in flight (GATHERING), if any."""
        return self._gather

    def __repr__(self) -> str:
        return f"FSDPUnit({self.name or '<root>'}, {len(self.shards.params)} params, {self.sharded_state.name})"

    def _to(self, state: ShardedState) -> None:
        assert (self.sharded_state, state) in SHARDED_TRANSITIONS, f"{self}: {self.sharded_state.name} -> {state.name}"
        self.sharded_state = state

    def _start_unshard(self) -> None:
        """SHARDED -> GATHERING: start gathering every rank's shards (copy-in, all_gather)."""
        self._to(ShardedState.GATHERING)
        if not self.shards.aliased:  # aliased (no_shard, one dtype, one device): `full` is `local` already
            self.schedule.note_alloc()
            self._gather = start_all_gather(self.shards, self.mesh, self.streams)

    def _finish_unshard(self) -> None:
        """GATHERING -> UNSHARDED: wait for the all_gather into `full`, install the unsharded params."""
        self._to(ShardedState.UNSHARDED)
        if self.schedule.last_reduction is not None:  # its input may have landed: free it now
            self.schedule.last_reduction.poll()
        if self._gather is not None:
            self._gather.wait()
            self._gather = None
        self.shards.install_unsharded()

    def unshard(self) -> None:
        """Make the unsharded params filled and installed, from whatever state (this unit is in use now)."""
        self.schedule.became_current(self)
        if self.sharded_state is ShardedState.SHARDED:
            self._start_unshard()
        if self.sharded_state is ShardedState.GATHERING:
            self._finish_unshard()

    def reshard(self) -> None:
        """-> SHARDED: install the shards and free `full` (after waiting for a prefetch never used)."""
        if self.sharded_state is ShardedState.GATHERING:  # a prefetch never used: `full` is still being written
            self.schedule.became_current(self)
            self._finish_unshard()
        if self.sharded_state is ShardedState.UNSHARDED:
            self._to(ShardedState.SHARDED)
            self.shards.install_sharded()
            if not self.shards.aliased:
                self.shards.free_full()  # on the compute stream: its last readers are queued there
                self.schedule.note_free()

    def set_modules_to_forward_prefetch(self, units: list["ShardedUnit"]) -> None:
        """FSDP2's explicit prefetch: in forward, as soon as this unit's parameters are installed, start
        the all_gathers of `units` (other units of this model; [] = none). Replaces the default, the
        next unit in forward order; each listed unit adds its unsharded size to the peak meanwhile."""
        self.schedule.set_prefetch(self, units, backward=False)

    def set_modules_to_backward_prefetch(self, units: list["ShardedUnit"]) -> None:
        """FSDP2's explicit prefetch in backward: when this unit's backward starts, start the
        all_gathers of `units` ([] = none). Replaces the default, the unit backward reaches next."""
        self.schedule.set_prefetch(self, units, backward=True)

    def _prefetch(self, backward: bool) -> None:
        """Start the all_gathers of the units this one prefetches: its explicit list, else the next one."""
        explicit = self.schedule.explicit_prefetch(self, backward)
        for nxt in self.schedule.upcoming(self, backward) if explicit is None else explicit:
            if explicit is None and not self.schedule.prefetch_slot_free():
                break
            if nxt.sharded_state is ShardedState.SHARDED:
                nxt._start_unshard()
                self.schedule.prefetched.append(nxt)
