"""This rank's queries against one rank's keys and values, tile by tile, forward and backward.

Both ways of bringing the keys and values (minidist.cp.ring, minidist.cp.all_gather) end
here: a rank's local tensors (batch, heads, tokens, head_dim) hold its chunks one after the
other (minidist.cp.chunks), and so do the visiting k and v. Each (query chunk, key chunk)
pair is computed with its causal mask, or skipped when every key is in the future: the
skipped pairs are the work the causal structure saves (and, with contiguous chunks, the ranks
it leaves idle).

Within a pair the work is cut again into tiles of at most TILE queries by TILE keys, merged
by the same online softmax (FlashAttention's tiling on a CPU): the scores held at any time are
one tile's, whatever the sequence length, and a diagonal pair skips its tiles above the
diagonal, so it costs about half a full pair, as causal attention needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minidist.cp.chunks import Chunking, Visibility, chunk_ids, visibility
from minidist.cp.online_softmax import attend_block, attend_block_backward, merge_

TILE = 256
"""The most queries (and keys) one block of scores holds: 256 x 256 per head and sequence."""

Tile = tuple[slice, slice, bool]
"""(my local query tokens, the visiting key tokens, diagonal: the causal mask applies inside)."""


@dataclass(frozen=True)
class Pairs:
    """The chunk pairs of my queries against rank `src`'s keys that causal attention needs."""

    pairs: tuple[tuple[int, int, bool], ...]
    """(my local chunk index, src's local chunk index, diagonal) of every pair to compute."""
    mine: int
    """How many chunks my local sequence holds (and src's)."""

    @classmethod
    def of(cls, cp: int, rank: int, src: int, chunking: Chunking) -> Pairs:
        mine, theirs = chunk_ids(cp, rank, chunking), chunk_ids(cp, src, chunking)
        pairs = tuple((i, j, visibility(a, b) is Visibility.DIAGONAL) for i, a in enumerate(mine)
                      for j, b in enumerate(theirs) if visibility(a, b) is not Visibility.NONE)
        return cls(pairs, len(mine))

    def tiles(self, tokens: int, tile: int | None = None) -> list[Tile]:
        """Every tile to compute when a local sequence holds `tokens` tokens (a diagonal pair's tiles
        are masked like the chunks themselves: full below the diagonal, causal on it, none above)."""
        size, tile = tokens // self.mine, tile or TILE
        cuts = [(t, min(t + tile, size)) for t in range(0, size, tile)]
        out = []
        for i, j, diagonal in self.pairs:
            for a, (qa, qb) in enumerate(cuts):
                for b, (ka, kb) in enumerate(cuts):
                    seen = visibility(a, b) if diagonal else Visibility.FULL
                    if seen is not Visibility.NONE:
                        out.append((slice(i * size + qa, i * size + qb), slice(j * size + ka, j * size + kb),
                                    seen is Visibility.DIAGONAL))
        return out


def forward(pairs: Pairs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor) -> None:
    """Merge every needed tile's attention into the running `out` and `lse` (in place)."""
    for qs, ks, diagonal in pairs.tiles(q.shape[2]):
        merge_(out[:, :, qs], lse[:, :, qs], *attend_block(q[:, :, qs], k[:, :, ks], v[:, :, ks], diagonal))


def backward(pairs: Pairs, dout: torch.Tensor, delta: torch.Tensor, q: torch.Tensor, lse: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
    """Add every needed tile's gradients into dq (my queries) and dk, dv (the visiting keys and values)."""
    for qs, ks, diagonal in pairs.tiles(q.shape[2]):
        gq, gk, gv = attend_block_backward(dout[:, :, qs], delta[:, :, qs], q[:, :, qs], k[:, :, ks], v[:, :, ks],
                                           lse[:, :, qs], diagonal)
        dq[:, :, qs].add_(gq)
        dk[:, :, ks].add_(gk)
        dv[:, :, ks].add_(gv)
