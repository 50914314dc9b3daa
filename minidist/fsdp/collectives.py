"""FSDP's collectives on a unit's flat buffers: the all_gather, and the gradient reduction.

    all_gather      shard (shard_size,)  ->  full (padded,)            S (N-1)/N sent per rank
    reduce_scatter  grads (padded,)      ->  grad shard (shard_size,)  S (N-1)/N
    all_reduce      grad shard across the R replicas (hybrid_shard)    2 (S/N) (R-1)/R
                    or the whole gradient across all ranks (no_shard)  2 S (N-1)/N

(S = bytes of the padded flat buffer, N = ranks of the shard group.) Per step,
full_shard gathers twice (forward, and again in backward because it freed the
parameters after forward) and reduces once: 3 S (N-1)/N, 1.5x DDP's 2 S (N-1)/N,
the price of keeping only 1/N of the parameters between uses, less the unit that
ends the forward (the root, for a GPT), which stays gathered into backward:
(3 S - S_root) (N-1)/N. shard_grad_op keeps the forward's gather for backward:
2 S (N-1)/N, like DDP.

The functions here are stateless: each starts a collective and returns a handle
that owns what the collective still needs (its input, its output, its Work). The
unit that asked holds the handle and waits on it; nothing here remembers a unit.
Everything goes through minidist.comm so traces see it. With NCCL an async
collective runs on the process group's internal stream, ordered after the work
already queued on the current stream, and Work.wait() makes the current stream
wait for it without blocking the host; the handle keeps input and output alive
until that wait (keep-alive rather than record_stream). On gloo the work
proceeds on gloo's threads.

Reductions are SUM; GradReduction divides once, after the last sum, by the
number of contributing ranks (gloo has no PREMUL_SUM, and one divide at the end
is also the most exact).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minidist import comm


@dataclass(frozen=True)
class MeshInfo:
    """The groups one FSDP model shards and reduces over, and this rank's place in them.

    shard: the ranks that split the parameters (shard_world 1 = no_shard; group None
    = the world). replicate: the ranks holding the same shard, whose gradient shards
    are all_reduced (hybrid_shard's replicas, or every rank for no_shard; world 1 =
    none).
    """

    shard_group: dist.ProcessGroup | None
    shard_world: int
    shard_rank: int
    replicate_group: dist.ProcessGroup | None
    replicate_world: int
    replicate_rank: int

    @property
    def grad_divisor(self) -> int:
        """Ranks whose gradients are summed: the average divides by all of them."""
        return self.shard_world * self.replicate_world

    @property
    def is_first(self) -> bool:
        """Group rank 0 in both groups: the rank that holds full values for rank0_only."""
        return self.shard_rank == 0 and self.replicate_rank == 0


# -- all_gather ----------------------------------------------------------------------------------
class AllGather:
    """An all_gather in flight into a unit's `full` buffer; owns its input until it lands."""

    def __init__(self, work, shard: torch.Tensor | None):
        self._work = work
        self._input = shard  # a param_dtype copy of the shard may exist only for this collective

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()
        self._work = self._input = None


def start_all_gather(full: torch.Tensor, shard: torch.Tensor, mesh: MeshInfo) -> AllGather:
    """Start filling `full` (padded,) with every shard rank's `shard` (padded / N,), rank r at r * shard_size."""
    if mesh.shard_world == 1:  # no_shard with a compute dtype: the "gather" is a cast
        full.copy_(shard)
        return AllGather(None, None)
    return AllGather(comm.all_gather(full, shard, group=mesh.shard_group, async_op=True), shard)


# -- gradient reduction --------------------------------------------------------------------------
class ReductionStage(enum.Enum):
    REDUCE_SCATTER = enum.auto()
    """reduce_scatter in the shard group in flight; its (padded,) input is alive."""
    ALL_REDUCE = enum.auto()
    """The replica all_reduce of the shard (hybrid_shard, no_shard) in flight."""
    DONE = enum.auto()


class GradReduction:
    """One unit's gradient on its way to an averaged shard: reduce_scatter, all_reduce, divide.

    Owns its buffers: the (padded,) input of the reduce_scatter, S_unit bytes, is freed
    as soon as the reduce_scatter completes (advance()); the (shard_size,) output
    until wait() hands it over. Stages only move forward: REDUCE_SCATTER -> ALL_REDUCE
    -> DONE, skipping what the mesh does not need.
    """

    def __init__(self, flat_grad: torch.Tensor, mesh: MeshInfo, out_dtype: torch.dtype):
        self._mesh, self._out_dtype = mesh, out_dtype
        self._work = None
        if mesh.shard_world > 1:
            self._input: torch.Tensor | None = flat_grad
            self._output = flat_grad.new_empty(flat_grad.numel() // mesh.shard_world)
            self._work = comm.reduce_scatter(self._output, flat_grad, comm.ReduceOp.SUM,
                                             group=mesh.shard_group, async_op=True)
            self.stage = ReductionStage.REDUCE_SCATTER
        else:  # no_shard: the whole gradient is the shard
            self._input, self._output = None, flat_grad
            self._start_all_reduce()

    def _start_all_reduce(self) -> None:
        if self._mesh.replicate_world > 1:
            self._work = comm.all_reduce(self._output, comm.ReduceOp.SUM,
                                         group=self._mesh.replicate_group, async_op=True)
            self.stage = ReductionStage.ALL_REDUCE
        else:
            self.stage = ReductionStage.DONE

    def advance(self) -> None:
        """Finish the reduce_scatter, free its input, start the replica all_reduce (if any).

        A no-op past the reduce_scatter: the all_reduce is left in flight for wait().
        """
        if self.stage is not ReductionStage.REDUCE_SCATTER:
            return
        self._work.wait()
        self._work = self._input = None  # the padded full gradient: S_unit bytes, free it now
        self._start_all_reduce()

    def poll(self) -> None:
        """advance() if the reduce_scatter has already landed; never blocks.

        Called as the next unit's gradients accumulate: the S_unit input goes as soon as
        it can, rather than at the next post_backward, which lowers the backward's peak.
        """
        if self.stage is ReductionStage.REDUCE_SCATTER and self._work.is_completed():
            self.advance()

    @property
    def buffers(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(padded input, until the reduce_scatter lands; the shard-sized output) - for memory accounting."""
        return self._input, self._output

    def wait(self) -> torch.Tensor:
        """The averaged gradient shard, (shard_size,) in out_dtype. Call once."""
        self.advance()
        if self.stage is ReductionStage.ALL_REDUCE:
            self._work.wait()
            self._work = None
            self.stage = ReductionStage.DONE
        assert self.stage is ReductionStage.DONE and self._output is not None, f"wait() of a {self.stage} reduction"
        out, self._output = self._output, None
        return out.to(self._out_dtype).div_(self._mesh.grad_divisor)


def start_reduction(flat_grad: torch.Tensor, mesh: MeshInfo, out_dtype: torch.dtype) -> GradReduction:
    """Start reducing one unit's (padded,) gradient to this rank's averaged shard (in out_dtype).

    The reduction takes ownership of `flat_grad`; the caller waits with .wait().
    """
    return GradReduction(flat_grad, mesh, out_dtype)
