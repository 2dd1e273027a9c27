"""DP-SGD accounting at noise multipliers far beyond training's (1e8 to 1e200): sound answers,
in bounded time and memory, against closed forms.

* ``q = 1``: the composition is one Gaussian with ``mu = sqrt(T) / sigma``; ``delta(0) =
  erf(mu / (2 sqrt 2))``, accurate in SciPy for any tiny ``mu``.  ``mu^2 = T / sigma^2``
  underflows from sigma ~ 1e154 on, which made the answer 0.
* ``q < 1``: one step alone (post-processing of the composition) gives a lower bound,
  ``q delta_G(eps')`` with ``e^eps' = (e^eps - 1 + q) / q`` and ``mu = 1 / sigma``; the dominating
  Gaussian (``mu = sqrt(T) / sigma``, no amplification) an upper bound.  The grid's loss CDFs are
  differences of numbers near 1/2 that keep ~``mu / 1e-16`` significant digits: it returned 0
  at sigma 1e16, ran out of memory on its shared lattice from sigma ~1e8 (hundreds of GiB), and
  failed with a NaN grid size at sigma 1e200.
"""

from __future__ import annotations

import math

import mpmath as mp
import pytest
import scipy.special

import dpjax

Q, T = 0.5, 4


def _gauss_delta0(mu):
    return float(scipy.special.erf(mu / (2.0 * math.sqrt(2.0))))


def _gauss_delta(eps, mu):
    # 50 digits: deep tails (delta ~ 1e-250) and tiny mu, where the float formula cancels.
    with mp.workdps(50):
        eps, mu = mp.mpf(eps), mp.mpf(mu)
        return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("sigma", [1e160, 1e200, 1e300])
def test_one_gaussian_keeps_its_delta_where_mu_squared_underflows(sigma):
    truth = _gauss_delta0(math.sqrt(T) / sigma)
    assert truth <= dpjax.dpsgd_delta(sigma, 1.0, T, 0.0) <= truth * (1 + 1e-6)


@pytest.mark.parametrize("sigma", [1e10, 1e16, 1e20, 1e200])
def test_subsampled_delta_lies_between_one_step_and_the_dominating_gaussian(sigma):
    d = dpjax.dpsgd_delta(sigma, Q, T, 0.0)
    one_step = Q * _gauss_delta0(1.0 / sigma)       # eps' = 0 at eps = 0
    dominating = _gauss_delta0(math.sqrt(T) / sigma)
    assert one_step <= d <= dominating * (1 + 1e-6), (sigma, d, one_step, dominating)


@pytest.mark.parametrize("sigma,target_delta", [(1e8, 1e-10), (1e150, 1e-250), (1e200, 1e-250)])
def test_subsampled_epsilon_is_sound_and_finite(sigma, target_delta):
    eps = dpjax.dpsgd_epsilon(sigma, Q, T, target_delta)
    assert 0.0 < eps < 1e-5
    # Not understated: one step's delta at eps (a lower bound on the composition's) is within
    # the target.
    eps_step = float(mp.log((mp.expm1(mp.mpf(eps)) + Q) / Q))
    assert Q * _gauss_delta(eps_step, 1.0 / sigma) <= target_delta
    # Not looser than the dominating Gaussian's epsilon (the bisection's 2^-200 resolution aside).
    assert _gauss_delta(max(eps - 2.0 ** -199, 0.0), math.sqrt(T) / sigma) > target_delta or eps < 2.0 ** -198
