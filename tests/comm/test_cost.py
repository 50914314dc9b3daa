"""The alpha-beta formulas, the weighted least-squares fit and its errors, and the calibration on a real group."""

import math
import random

import pytest

from minidist.comm import CostModel, calibrate
from minidist.comm.cost import CALIBRATION_SIZES, fit


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


def test_halving_doubling_beats_ring_on_latency_and_loses_on_bandwidth():
    m = CostModel(alpha=1e-4, beta=1e-9)
    n = 64
    assert m.predict("all_reduce", 8, n, "halving_doubling") < m.predict("all_reduce", 8, n, "ring")
    assert m.predict("all_reduce", 8, n, "halving_doubling") == pytest.approx(2 * math.log2(n) * 1e-4
                                                                             + 2 * 8 * 63 / 64 * 1e-9)
    assert m.predict("broadcast", 1e9, n, "halving_doubling") > m.predict("broadcast", 1e9, n, "ring")
    with pytest.raises(ValueError, match="algorithm"):
        m.predict("all_reduce", 1, 2, "tree")  # "tree" is NCCL's double binary tree: minidist.comm.nccl


def test_fit_recovers_alpha_beta_and_its_error_covers_them():
    """Synthetic times of a known link with 5% multiplicative noise: the fit lands within its own error bars."""
    rng = random.Random(0)
    alpha, beta, n = 50e-6, 1e-9, 4
    sizes = [4 * s for s in CALIBRATION_SIZES for _ in range(20)]
    times = [(2 * (n - 1) * alpha + 2 * p * (n - 1) / n * beta) * rng.gauss(1, 0.05) for p in sizes]
    a, b, sa, sb, cov, res = fit(sizes, times, n)
    assert abs(a - alpha) < 4 * sa and abs(b - beta) < 4 * sb
    assert 0 < sa < 0.05 * alpha and 0 < sb < 0.05 * beta
    assert 0.03 < res < 0.07  # the noise put in
    exact = fit(sizes, [2 * (n - 1) * alpha + 2 * p * (n - 1) / n * beta for p in sizes], n)
    assert exact[0] == pytest.approx(alpha) and exact[1] == pytest.approx(beta) and exact[5] < 1e-9
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit([4, 4], [1e-4, 1e-4], n)


def test_spread_grows_away_from_the_fit():
    m = CostModel(1e-4, 1e-9, alpha_err=1e-5, beta_err=1e-10, cov=0.0)
    assert m.spread("all_reduce", 4, 2) == pytest.approx(math.hypot(2 * 1e-5, 2 * 4 / 2 * 1e-10))
    assert m.spread("all_reduce", 1 << 30, 2) > 100 * m.spread("all_reduce", 4, 2)
    assert "+-" in m.describe()


def _calibrate():
    m = calibrate(sizes=(1, 1 << 12, 1 << 18), iters=5)
    return m


def test_calibration_fits_alpha_beta_with_errors_agreed_by_all_ranks(run_dist):
    m0, m1 = run_dist(2, _calibrate)
    assert m0 == m1
    assert m0.beta > 0 and 0 <= m0.alpha < 0.1
    assert m0.alpha_err >= 0 and m0.beta_err > 0 and m0.residual > 0
    assert [s.payload_bytes for s in m0.samples] == [4, 4 << 12, 4 << 18]
    assert all(s.q1_s <= s.median_s <= s.q3_s for s in m0.samples)
    assert m0.fitted_at(4 << 12) and not m0.fitted_at(4 << 20)
