"""This rank's queries against one rank's keys and values, chunk pair by chunk pair, forward and backward.

Both ways of bringing the keys and values (minidist.cp.ring, minidist.cp.all_gather) end
here: a rank's local tensors (batch, heads, tokens, head_dim) hold its chunks one after the
other (minidist.cp.chunks), so chunk i of the local q is q.chunk(n, dim=2)[i], and the same
for the visiting k and v. Each (query chunk, key chunk) pair is computed with its causal
mask, or skipped when every key is in the future: the skipped pairs are the work the causal
structure saves (and, with contiguous chunks, the ranks it leaves idle).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minidist.cp.chunks import Chunking, Visibility, chunk_ids, visibility
from minidist.cp.online_softmax import attend_block, attend_block_backward, merge_


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


def forward(pairs: Pairs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor) -> None:
    """Merge every needed pair's attention into the running `out` and `lse` (views of them, in place)."""
    qs, ks, vs = (t.chunk(pairs.mine, dim=2) for t in (q, k, v))
    outs, lses = out.chunk(pairs.mine, dim=2), lse.chunk(pairs.mine, dim=2)
    for i, j, diagonal in pairs.pairs:
        merge_(outs[i], lses[i], *attend_block(qs[i], ks[j], vs[j], diagonal))


def backward(pairs: Pairs, dout: torch.Tensor, delta: torch.Tensor, q: torch.Tensor, lse: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
    """Add every needed pair's gradients into dq (my queries) and dk, dv (the visiting keys and values)."""
    n = pairs.mine
    douts, deltas, qs, lses, dqs = (t.chunk(n, dim=2) for t in (dout, delta, q, lse, dq))
    ks, vs, dks, dvs = (t.chunk(n, dim=2) for t in (k, v, dk, dv))
    for i, j, diagonal in pairs.pairs:
        gq, gk, gv = attend_block_backward(douts[i], deltas[i], qs[i], ks[j], vs[j], lses[i], diagonal)
        dqs[i].add_(gq)
        dks[j].add_(gk)
        dvs[j].add_(gv)
