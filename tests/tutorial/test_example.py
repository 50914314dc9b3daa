"""The example the track's pages quote trains every piece to one process's parameters (world 2 and 4)."""

import pytest

from minidist.tutorial.example import WRAPPERS, train


def _all():
    return {piece: train(piece, steps=3) for piece in WRAPPERS}


@pytest.mark.parametrize("world", [2, 4])
def test_every_piece_trains_like_one_process(run_dist, world):
    for errs in run_dist(world, _all):
        assert max(errs.values()) < 1e-5, errs
