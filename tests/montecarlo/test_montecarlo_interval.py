"""Monte Carlo honesty: epsilon estimates carry a confidence interval that
covers the truth at (at least) its stated rate, and estimates the sample cannot resolve are
flagged.

Truth: with ``batches_per_epoch = 1`` every example is in every round, so the mechanism is
exactly the Gaussian mechanism with sensitivity ``|C^{-1}...|`` = ``acc.sensitivity``: its epsilon
is :func:`dpjax.pld.gaussian_epsilon`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins
from dpjax.pld import gaussian_epsilon


def test_interval_covers_the_exact_gaussian_at_its_rate():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), 1, 4)
    sigma, delta, conf, seeds = 1.5, 0.05, 0.8, 40
    truth = float(gaussian_epsilon(delta, acc.sensitivity / sigma))
    covered, widths = 0, []
    for seed in range(seeds):
        e = acc.epsilon_estimate(sigma, delta, 1024, seed, confidence=conf, refinements=2)
        assert e.resolved and e.epsilon_lower <= e.epsilon <= e.epsilon_upper
        covered += e.epsilon_lower <= truth <= e.epsilon_upper
        widths.append(e.epsilon_upper - e.epsilon_lower)
    # If the true coverage is >= 0.8, P(covered <= 26 of 40) = binom.cdf(26, 40, 0.8) ~ 0.03:
    # failing below 27 has a false-alarm rate of about 3% at the nominal rate, and the KL bound is
    # conservative (coverage well above nominal), so in practice it never fails for a sound bound.
    assert stats.binom.cdf(26, seeds, conf) < 0.04
    assert covered >= 27, (covered, seeds)
    # Not vacuous: the interval is informative (relative width well below 1).
    assert np.median(widths) < 0.5 * truth


def test_unresolvable_delta_is_flagged():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 4, 2)
    # 4096 draws at b = 4 and one epsilon, as in test_montecarlo_extreme_sigma.py and
    # test_montecarlo.py::test_gram_sqrt_singular_and_regular: the same compiled program.  1e-9 is
    # far below 1/m at either size.
    e = acc.epsilon_estimate(1.0, 1e-9, 4096, 0)   # delta far below 1/m
    assert not e.resolved and math.isinf(e.epsilon_upper)
    assert "cannot resolve" in e.reason


def test_one_sample_has_no_standard_error():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 4, 2)
    d, se = acc.delta(1.0, 1.0, 1, 0)
    assert math.isinf(float(se))          # was 0
    est = acc.estimate(1.0, [1.0], 1, 0)
    assert est.delta_low[0] <= est.delta[0] <= est.delta_high[0]
    # One [0, 1] draw at 95%: the KL upper bound is 1 unless the draw is 1... the interval is wide.
    assert est.delta_high[0] - est.delta_low[0] > 0.5


def test_each_direction_bound_holds_at_the_union_bound_level():
    """The delta interval is the max over the two directions of per-direction Chernoff-KL
    bounds, each at level ``1 - (1 - confidence) / 2`` so that both hold together with
    probability ``>= confidence`` (union bound): for each direction, ``m KL(mean || bound) >=
    log(4 / (1 - confidence))`` at the reported upper bound (checked with the KL written here)."""
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 4, 2)
    conf, m = 0.9, 4096
    est = acc.estimate(1.0, [0.5, 1.0, 2.0], m, 3, confidence=conf)

    def kl(a, b):
        return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))

    need = math.log(4.0 / (1.0 - conf))
    for i in range(3):
        hi, lo = float(est.delta_high[i]), float(est.delta_low[i])
        for mean in (float(est.delta_remove[i]), float(est.delta_add[i])):
            assert 0.0 < mean < 1.0
            assert m * kl(mean, hi) >= need * (1 - 1e-6)
        assert lo <= float(est.delta[i]) <= hi
    # The larger direction's bound is tight at that level (the bisection's solution, not a looser one).
    i = 0
    top = max(float(est.delta_remove[i]), float(est.delta_add[i]))
    assert m * kl(top, float(est.delta_high[i])) == pytest.approx(need, rel=1e-6)
