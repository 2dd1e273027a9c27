"""Small deltas: both ends of the bracket against exact oracles.

* q = 1 (and any Gaussian-only composition) is answered from the closed form: pinned against
  an mpmath evaluation of ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` at 50 digits.
* The FFT path is checked on ``T`` Gaussians composed with one randomized response of loss
  ``+-ell`` (``ell = 2e-7``), which keeps the composition off the closed form.  Its exact curve
  is not known, but it is bracketed by Gaussian curves: composing with another mechanism can
  only raise delta, and one step of loss at most ``ell`` shifts epsilon by at most ``ell``, so
  ``delta_G(eps) <= delta(eps) <= delta_G(eps - ell)`` and ``eps_G(d) <= eps(d) <= eps_G(d) + ell``.
  A certified lower end must be below the right-hand sides, the upper end above the left.
  Before the fix the lower end exceeded the truth by up to 12% in epsilon and 300x in delta at
  deltas of 1e-12..1e-17 (a positive FFT round-off offset with no negative bin to reveal it).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpjax import pld

mpmath.mp.dps = 50
ELL = math.log1p(2 * 1e-7 / (1 - 1e-7))   # RandomizedResponse(1 - 1e-7, 2): loss +-ell


def exact_delta(eps, mu):
    eps, mu = mpmath.mpf(eps), mpmath.mpf(mu)
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.e ** eps * mpmath.ncdf(-eps / mu - mu / 2)


def exact_epsilon(delta, mu):
    delta = mpmath.mpf(delta)
    lo, hi = mpmath.mpf(0), mpmath.mpf(1)
    while exact_delta(hi, mu) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if exact_delta(mid, mu) <= delta else (mid, hi)
    return float(hi)


@pytest.mark.parametrize("sigma,steps,delta", [
    (1.2324692074479908, 111, 3.767315625382703e-12),   # once reported a lower end above the truth
    (30.07, 12005, 1.11e-12),                            # was inf; exact 31.661 (31.67 to two decimals)
    (0.9969695518903323, 1726, 3.4365552236420403e-15),
])
def test_q1_is_exact(sigma, steps, delta):
    mu = math.sqrt(steps) / sigma
    truth = exact_epsilon(delta, mu)
    res = pld.dpsgd_accounting(sigma, 1.0, steps, target_delta=delta)
    assert res.epsilon_lower <= truth <= res.epsilon
    assert res.epsilon <= truth * (1 + 1e-9)
    assert res.epsilon_lower >= truth * (1 - 1e-8)
    # delta at that epsilon: both ends around the 50-digit value
    d = pld.dpsgd_accounting(sigma, 1.0, steps, target_epsilon=truth)
    ed = float(exact_delta(truth, mu))
    assert d.delta_lower <= ed <= d.delta <= ed * (1 + 1e-8)


def _fft_case(sigma, steps):
    return [(pld.Gaussian(sigma), steps), (pld.RandomizedResponse(1 - 1e-7, 2), 1)]


FFT_CASES = [  # (sigma, steps, delta): the sweep cases whose lower end was above the truth
    (1.7482156181443476, 1213, 4.077880949334362e-12),
    (1.0214376924934696, 846, 2.1723360334954403e-12),
]


@pytest.mark.slow
@pytest.mark.parametrize("sigma,steps,delta", FFT_CASES)
def test_fft_lower_end_is_a_lower_bound(sigma, steps, delta):
    mu = math.sqrt(steps) / sigma
    eps_g = exact_epsilon(delta, mu)
    res = pld.epsilon(_fft_case(sigma, steps), delta)
    assert res.epsilon_lower <= eps_g + ELL
    assert res.epsilon >= eps_g


@pytest.mark.parametrize("sigma,steps,eps", [
    (2.167363182619579, 1022, 232.3019210684648),    # delta_lower was 5.2e-15, truth 1.8e-17
    pytest.param(4.295497991393256, 972, 82.99748444543478,   # delta_lower was 1.6e-14, truth 1.4e-15
                 marks=pytest.mark.slow),
])
def test_fft_delta_lower_is_a_lower_bound(sigma, steps, eps):
    mu = math.sqrt(steps) / sigma
    res = pld.delta(_fft_case(sigma, steps), eps)
    assert res.delta_lower <= float(exact_delta(eps - ELL, mu))
    assert res.delta >= float(exact_delta(eps, mu))


@pytest.mark.slow
def test_fft_lower_end_sweep():
    rng = np.random.default_rng(0)
    for _ in range(12):
        sigma = float(np.exp(rng.uniform(np.log(0.5), np.log(5))))
        steps = int(rng.integers(1, 2000))
        delta = float(10 ** rng.uniform(-17, -11))
        mu = math.sqrt(steps) / sigma
        eps_g = exact_epsilon(delta, mu)
        res = pld.epsilon(_fft_case(sigma, steps), delta)
        assert res.epsilon_lower <= eps_g + ELL, (sigma, steps, delta)
        assert res.epsilon >= eps_g, (sigma, steps, delta)
        d = pld.delta(_fft_case(sigma, steps), eps_g)
        assert d.delta_lower <= float(exact_delta(eps_g - ELL, mu)), (sigma, steps, delta)
        assert d.delta >= float(exact_delta(eps_g, mu)), (sigma, steps, delta)


# --------------------------------------------------------------------------- below every double

SMALLEST = float(np.nextafter(0.0, 1.0))


def test_a_delta_below_every_double_is_the_smallest_positive_one():
    # Gaussian noise: delta(eps) > 0 at every finite eps.  At these epsilons it is below every
    # double (one step at mu = 1, eps = 50: log delta ~ -1250, delta ~ 1e-543 by mpmath), and 0
    # would claim pure DP there.  The closed form (q = 1) and the dominating-Gaussian caps that
    # cap every grid answer: DP-SGD, the group mixture, a batch, random allocation, balls-in-bins.
    import dpjax

    assert mpmath.mpf(0) < exact_delta(50.0, 1.0) < mpmath.mpf(SMALLEST)
    assert dpjax.dpsgd_delta(1.0, 1.0, 1, 50.0) == SMALLEST
    assert dpjax.dpsgd_delta(1.0, 0.5, 4, 100.0) == SMALLEST
    assert dpjax.group_delta(1.0, 0.5, 4, 200.0, group_size=2) == SMALLEST
    np.testing.assert_array_equal(dpjax.dpsgd_delta(np.array([1.0, 2.0]), 0.5, 4, np.array([100.0, 300.0])),
                                  [SMALLEST, SMALLEST])
    for scheme in (dpjax.RandomAllocation(4), dpjax.BallsInBins(4), dpjax.RandomAllocation(1)):
        assert dpjax.dpsgd_delta(1.0, target_epsilon=200.0, sampling=scheme, epochs=2) == SMALLEST, scheme
    # Above a direction's bounded loss delta is exactly 0 and stays 0: the add direction of a
    # Poisson-subsampled Gaussian (loss <= log 2 at q = 1/2), Laplace (loss <= 3 here).
    res = pld.delta([pld.PoissonSubsampledGaussian(1.0, 0.5)], 100.0)
    uppers = {str(r.direction): float(np.max(r.upper)) for r in res.directions}
    assert uppers == {"remove": SMALLEST, "add": 0.0} and res.delta == SMALLEST
    assert pld.delta([(pld.Laplace(1.0, 1.0), 3)], 3.5).delta == 0.0
    # Where the value is a positive subnormal it is kept (the curve stays non-increasing).
    assert 0 < dpjax.dpsgd_delta(1.0, 1.0, 1, 38.5) < 1e-300
