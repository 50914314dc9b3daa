"""Equal, padded flat shards of a bucket: which elements of which parameters each rank updates.

ZeRO (Rajbhandari et al. 2020) partitions the *elements* of the model, not its
parameters. The parameters of a bucket are laid end to end in one flat buffer,
padded to a multiple of the N ranks, and rank r owns the r-th of N equal shards:

    bucket      | p0 ......... | p1 ... | p2 ............ |pad|
    ranks       |   rank 0   |   rank 1   |   rank 2   |     (k = ceil(numel / N) elements each)

A parameter may straddle two shards; a shard may hold pieces of several
parameters. Every rank therefore owns 1/N of the optimizer state to within N-1
padding elements per bucket, however uneven the parameters are (owning whole
parameters leaves ranks idle when a few large ones dominate: partition.py).

Why equal shards: the gradient reduce_scatter and the parameter all_gather take
N chunks of one size; the rank's chunk *is* its shard, so both collectives read
and write the buffers in place, with no packing copy.

Pure arithmetic: no process group, no tensors; every rank computes the same
shards from the same parameter shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """The part of one parameter that falls in one rank's shard of a bucket."""

    param: int
    """Position of the parameter in the optimizer's parameter list (every group, in order)."""
    param_start: int
    """First element of the piece inside the parameter (flattened)."""
    shard_start: int
    """First element of the piece inside the rank's shard."""
    numel: int


@dataclass(frozen=True)
class BucketShards:
    """Parameters laid end to end, padded to world * shard_numel elements."""

    param_ids: tuple[int, ...]
    """Positions of the bucket's parameters in the optimizer's parameter list."""
    numels: tuple[int, ...]
    world: int

    @property
    def offsets(self) -> tuple[int, ...]:
        out, o = [], 0
        for n in self.numels:
            out.append(o)
            o += n
        return tuple(out)

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def shard_numel(self) -> int:
        """k: elements per rank, the bucket's numel divided by N, rounded up (at least 1)."""
        return max(1, -(-self.numel // self.world))

    @property
    def padded_numel(self) -> int:
        return self.shard_numel * self.world

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of rank's shard in the flat buffer."""
        k = self.shard_numel
        return rank * k, (rank + 1) * k

    def pieces(self, rank: int) -> list[Piece]:
        """The parameter pieces inside rank's shard, in flat order (padding excluded)."""
        lo, hi = self.shard_range(rank)
        out = []
        for pid, off, n in zip(self.param_ids, self.offsets, self.numels):
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out.append(Piece(pid, a - off, a - lo, b - a))
        return out


def padding_elements(buckets: list[BucketShards]) -> int:
    """Elements added to make every bucket divide into N equal shards (< N per bucket)."""
    return sum(b.padded_numel - b.numel for b in buckets)
