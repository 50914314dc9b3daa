"""Which tokens each cp rank keeps and which chunk pairs causal attention computes (one process, no group)."""

from __future__ import annotations

import pytest
import torch

from minidist.cp import blocks
from minidist.cp import Chunking, Visibility, chunk_ids, positions, visibility, work


def test_layouts_keep_every_token_once_and_in_order():
    assert positions(8, 2, 0, Chunking.CONTIGUOUS).tolist() == [0, 1, 2, 3]
    assert positions(8, 2, 1, Chunking.ZIGZAG).tolist() == [2, 3, 4, 5]
    assert positions(8, 2, 0, Chunking.ZIGZAG).tolist() == [0, 1, 6, 7]
    assert chunk_ids(4, 1, Chunking.ZIGZAG) == (1, 6)
    for chunking in Chunking:
        every = torch.cat([positions(32, 4, r, chunking) for r in range(4)])
        assert sorted(every.tolist()) == list(range(32))
        assert all((positions(32, 4, r, chunking).diff() > 0).all() for r in range(4))


def test_a_length_that_does_not_cut_is_one_line():
    with pytest.raises(ValueError, match="a sequence of 12 tokens does not split into 8 equal chunks"):
        positions(12, 4, 0, Chunking.ZIGZAG)


def test_causal_mask_per_chunk_pair():
    assert [visibility(2, b) for b in (1, 2, 3)] == [Visibility.FULL, Visibility.DIAGONAL, Visibility.NONE]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_balances_the_work_that_contiguous_leaves_to_the_last_rank(cp):
    """Contiguous: rank r computes r + 1/2 block pairs; zigzag: 2 cp quarter-size pairs each, the same total."""
    contiguous = [work(cp, r, Chunking.CONTIGUOUS) for r in range(cp)]
    zigzag = [work(cp, r, Chunking.ZIGZAG) for r in range(cp)]
    assert contiguous == [r + 0.5 for r in range(cp)]
    assert zigzag == [2.0 * cp] * cp
    assert sum(zigzag) == 4 * sum(contiguous)  # a contiguous chunk is two zigzag chunks: 4 pairs in one
    assert max(contiguous) / (sum(contiguous) / cp) == pytest.approx(2 - 1 / cp)
    # per step of the ring (src = r - t), zigzag computes exactly half a pair of its two chunks
    for r in range(cp):
        assert [work(cp, r, Chunking.ZIGZAG, with_rank=(r - t) % cp) for t in range(1, cp)] == [2.0] * (cp - 1)


def test_a_diagonal_pair_skips_its_tiles_above_the_diagonal():
    """4 tiles a side: 10 of 16 computed (4 causal on the diagonal), a full pair all 16."""
    pairs = blocks.Pairs.of(2, 0, 0, Chunking.CONTIGUOUS)  # rank 0's own chunk: one diagonal pair
    tiles = pairs.tiles(1024, tile=256)
    assert len(tiles) == 10 and sum(diagonal for _, _, diagonal in tiles) == 4
    assert all(ks.start <= qs.start for qs, ks, _ in tiles)
    assert len(blocks.Pairs.of(2, 1, 0, Chunking.CONTIGUOUS).tiles(1024, tile=256)) == 16
