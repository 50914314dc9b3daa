"""The alpha-beta formulas, and a calibration that fits positive alpha and beta."""

import math

import pytest
import torch.distributed as dist

from minidist.comm import CostModel, calibrate


def test_ring_formulas():
    m = CostModel(alpha=1e-4, beta=1e-9)
    n, s = 4, 8e6
    assert m.predict("all_reduce", s, n) == pytest.approx(2 * 3 * 1e-4 + 2 * s * 3 / 4 * 1e-9)
    assert m.predict("all_gather", s, n) == pytest.approx(3 * 1e-4 + s * 3 / 4 * 1e-9)
    assert m.predict("reduce_scatter", s, n) == m.predict("all_gather", s, n)
    # all_reduce = reduce_scatter + all_gather, in the ring model
    assert m.predict("all_reduce", s, n) == pytest.approx(2 * m.predict("reduce_scatter", s, n))
    assert m.predict("broadcast", s, n) == pytest.approx(3 * 1e-4 + s * 1e-9)
    assert m.predict("all_reduce", s, 1) == 0.0


def test_tree_beats_ring_on_latency_and_loses_on_bandwidth():
    m = CostModel(alpha=1e-4, beta=1e-9)
    n = 64
    assert m.predict("all_reduce", 8, n, "tree") < m.predict("all_reduce", 8, n, "ring")
    assert m.predict("all_reduce", 8, n, "tree") == pytest.approx(2 * math.log2(n) * 1e-4 + 2 * 8 * 63 / 64 * 1e-9)
    assert m.predict("broadcast", 1e9, n, "tree") > m.predict("broadcast", 1e9, n, "ring")
    with pytest.raises(ValueError, match="algorithm"):
        m.predict("all_reduce", 1, 2, "butterfly")


def _calibrate():
    m = calibrate(sizes=(1, 1 << 12, 1 << 20), iters=5)
    return m.alpha, m.beta


def test_calibration_fits_positive_alpha_beta_agreed_by_all_ranks(run_dist):
    (a0, b0), (a1, b1) = run_dist(2, _calibrate)
    assert (a0, b0) == (a1, b1)
    assert b0 > 0 and 0 <= a0 < 0.1
