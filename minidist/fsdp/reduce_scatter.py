"""One unit's gradient reduction: pre-divide, ONE reduce_scatter, replica all_reduce, post-divide.

    inputs          the unsharded grads, each (N c C,) in the reduce dtype, where they lie
                    (UnitShards.reduce_pieces: a padded copy only for rows N does not divide,
                    a cast only for another dtype; the unsharded .grad are dropped)
    pre-divide      inputs /= pre
    reduce_scatter  inputs  ->  output (S_local,), this rank's rows, laid as `local`; one
                    coalesced collective (comm.reduce_scatter_coalesced)    S (N-1)/N sent per rank
    all_reduce      output across the R replicas (hybrid_shard)           2 (S/N) (R-1)/R
                    or the whole gradient across all ranks (no_shard)     2 S (N-1)/N
    post-divide     output -> master dtype, /= post, -> storage device (CPU offload)

Why no copy-in: a reduce_scatter hands rank r the r-th N-th of its input, so a single-tensor
collective needs every gradient's chunk r side by side, a rank-major copy of them all (FSDP2's
foreach_reduce_scatter_copy_in): one pass over S_unit on the caller's thread, and the
gradients twice for that moment. The coalesced collective takes each gradient as it lies;
minidist's ring (gloo's default) reduces the pieces in place on its own thread, and NCCL
runs one reduce_scatter per gradient in one group.

The average divides by every rank that contributed (shard x replicate). gloo has no
PREMUL_SUM, so the division is explicit, split as minidist.precision.divide_factors says:
fp16 sums can overflow (65504) when N gradients of a few thousand meet, so fp16 divides by
about sqrt(N) before the sum and the rest after; bf16 and fp32 divide once, after the sum
and after the cast to the master dtype (the most exact; the output is N times smaller
than the input).

A GradReduction owns its buffers: the gradients it reduces, S_unit bytes, are dropped as
soon as the reduce_scatter is known complete (advance()); the output until wait() hands
it over, once the backend's worker has let go of it (minidist.comm.release: the sharded
gradients are views of it, and zero_grad() must be what frees them). Stages only move forward: REDUCE_SCATTER -> ALL_REDUCE -> DONE, skipping what
the mesh does not need. On gloo the collectives are async Work handles and the replica
all_reduce starts once the reduce_scatter has landed (gloo orders nothing across
groups). On a GPU both are queued at once on their own streams (the all_reduce after
the reduce_scatter by stream order), and advance() / wait() order the compute stream
after them by events (minidist.fsdp.streams).
"""

from __future__ import annotations

import enum

import torch

from minidist import comm
from minidist.fsdp.shard_spec import MeshInfo
from minidist.fsdp.param import UnitShards
from minidist.fsdp.streams import Streams
from minidist.precision import divide_factors


class ReductionStage(enum.Enum):
    REDUCE_SCATTER = enum.auto()
    """reduce_scatter in the shard group in flight; its (N S_local,) input is alive."""
    ALL_REDUCE = enum.auto()
    """The replica all_reduce of the shard (hybrid_shard, no_shard) in flight."""
    DONE = enum.auto()


class GradReduction:
    """One unit's gradient on its way to an averaged shard. Construct with start_reduction()."""

    def __init__(self, shards: UnitShards, mesh: MeshInfo, reduce_dtype: torch.dtype, streams: Streams):
        self._shards, self._mesh, self._streams = shards, mesh, streams
        pre, self._post = divide_factors(mesh.grad_divisor, reduce_dtype)
        pieces = shards.reduce_pieces(reduce_dtype)  # on the compute stream, where the gradients are
        self._work = self._ar_work = self._ar_event = None
        with streams.on(streams.reduce_scatter):
            for g in pieces if pre != 1 else ():
                g.div_(pre)
            if mesh.shard_world > 1:
                self._input: list[torch.Tensor] | None = pieces
                self._output = torch.empty(shards.local_numel, dtype=reduce_dtype, device=shards.compute_device)
                self._handed = comm.Handed([self._output])
                if pieces:
                    self._work = comm.reduce_scatter_coalesced(shards.local_pieces(self._output), pieces,
                                                               comm.ReduceOp.SUM, group=mesh.shard_group,
                                                               async_op=streams.async_op)
            else:  # no_shard (or a world of one): the whole gradient is the shard, laid as `local`
                self._input = None
                self._output = (pieces[0] if len(pieces) == 1 else torch.cat(pieces) if pieces else
                                torch.zeros(0, dtype=reduce_dtype, device=shards.compute_device))
                self._handed = comm.Handed([self._output])
            self._rs_event = streams.record(streams.reduce_scatter)
        self.stage = ReductionStage.REDUCE_SCATTER if self._input is not None else ReductionStage.ALL_REDUCE
        if self._input is None or streams.cuda:  # nothing to wait for first, or stream-ordered
            self._start_all_reduce()

    def _start_all_reduce(self) -> None:
        if self._mesh.replicate_world == 1:
            if self._input is None:
                self.stage = ReductionStage.DONE
            return
        with self._streams.on(self._streams.all_reduce, after=self._streams.reduce_scatter):
            self._ar_work = comm.all_reduce(self._output, comm.ReduceOp.SUM, group=self._mesh.replicate_group,
                                            async_op=self._streams.async_op)
            self._ar_event = self._streams.record(self._streams.all_reduce)

    def advance(self) -> None:
        """Finish the reduce_scatter, drop its input, start the replica all_reduce (gloo; if any).

        A no-op past the reduce_scatter: the all_reduce is left in flight for wait().
        """
        if self.stage is not ReductionStage.REDUCE_SCATTER:
            return
        if self._work is not None:
            self._work.wait()
        self._streams.wait(self._rs_event)  # GPU: the compute stream (which allocated them) is past their last reader
        self._work = self._input = None  # the gradients, S_unit bytes: dropped now, on this thread
        has_replicas = self._mesh.replicate_world > 1
        self.stage = ReductionStage.ALL_REDUCE if has_replicas else ReductionStage.DONE
        if has_replicas and not self._streams.cuda:
            self._start_all_reduce()

    def poll(self) -> None:
        """advance() if the reduce_scatter has already landed; never blocks.

        Called as the next unit's gradients accumulate: the S_unit input goes as soon as
        it can, rather than at the next post_backward, which lowers the backward's peak.
        """
        if self.stage is ReductionStage.REDUCE_SCATTER and (
                self._work.is_completed() if self._work is not None else self._streams.done(self._rs_event)):
            self.advance()

    @property
    def buffers(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """(the gradients being reduced, until the reduce_scatter lands; the shard-sized output) - for memory accounting."""
        return self._input or [], self._output

    def wait(self) -> torch.Tensor:
        """The averaged gradient shard, (S_local,) in the master dtype on the storage device. Call once."""
        self.advance()
        if self.stage is ReductionStage.ALL_REDUCE:
            if self._ar_work is not None:
                self._ar_work.wait()
            self._streams.wait(self._ar_event)
            self._ar_work = self._ar_event = None
            self.stage = ReductionStage.DONE
        assert self.stage is ReductionStage.DONE and self._output is not None, f"wait() of a {self.stage} reduction"
        self._streams.wait(self._rs_event)
        self._handed.wait_released()
        out, self._output = self._output, None
        out = out.to(self._shards.dtype)
        if self._post != 1:
            out.div_(self._post)
        return out.to(self._shards.storage_device)


def start_reduction(shards: UnitShards, mesh: MeshInfo, reduce_dtype: torch.dtype, streams: Streams) -> GradReduction:
    """Start reducing one unit's unsharded gradients to this rank's averaged rows (consumes the grads)."""
    return GradReduction(shards, mesh, reduce_dtype, streams)
