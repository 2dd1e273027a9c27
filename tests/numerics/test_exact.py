"""The exact Gaussian curve (dpjax.numerics.exact) against a 60-digit oracle, where float64
arithmetic is hardest: large ``mu`` (the exact formula cancels two numbers of size ``mu^2 / 2``)
and deep tails (``log_ndtr``'s asymptotic series below -20).

Soundness: the true delta at a returned epsilon is at most the target, and a returned log delta
is at least the true one.  Tightness: for ``mu >= MU_LARGE`` the epsilon is the exact one plus
at most ``mu / (mu + w) < 1`` (the bound ``Phi(-w)``) plus its rounding margin (``2^-50`` of
``mu (eps/mu + mu/2)``, about ``2^-49 eps``): 2 + 2^-46 eps allows for both; the delta bound
exceeds the truth by the factor ``1 / (1 - phi(w) R(z) / Phi(-w))``, below ``1 + 2 (w + 1/w) / mu``,
and by its rounding margin on ``w`` (about ``2^-50 mu``; 7e-6 relative at ``mu = 1e10``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest

import dpjax
from dpjax.numerics import exact
from dpjax.pld.grid import engine

mp.mp.dps = 60


def _delta(eps, mu):
    """The tight curve Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), in 60 digits."""
    eps, mu = mp.mpf(float(eps)), mp.mpf(float(mu))
    return mp.ncdf(-eps / mu + mu / 2) - mp.e ** eps * mp.ncdf(-eps / mu - mu / 2)


LARGE_MU = [1e4, 1e6, 1e8, 1e9, 1e10]
DELTAS = [0.5, 1e-5, 1e-200]


@pytest.mark.parametrize("mu", LARGE_MU)
@pytest.mark.parametrize("target", DELTAS)
def test_large_mu_epsilon_is_sound_and_tight(mu, target):
    eps = float(exact.gaussian_epsilon(target, mu))
    assert math.isfinite(eps)
    assert _delta(eps, mu) <= target
    assert _delta(eps - 2.0 - 2.0 ** -46 * eps, mu) > target
    # The bracket of the accountant's closed-form answer: its lower end has delta above target.
    upper, lower = engine.exact_epsilon(np.array([target]), mu)
    assert upper[0] == eps and lower[0] <= eps and _delta(lower[0], mu) > target


@pytest.mark.parametrize("mu", [1e12, 1e100])
def test_beyond_the_search_the_bracket_is_inf_above_a_certified_lower_end(mu):
    # The search stops at eps = 2^70 (true epsilon ~mu^2 / 2 beyond it): the upper end is inf and
    # the lower end 2^70, whose delta is above the target (it was NaN, with a RuntimeWarning).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        upper, lower = engine.exact_epsilon(np.array([1e-5, 0.5]), mu)
    assert np.all(np.isinf(upper)) and np.all(lower == 2.0 ** 70)
    assert all(_delta(x, mu) > t for x, t in zip(lower, (1e-5, 0.5)))


@pytest.mark.parametrize("mu", LARGE_MU)
def test_large_mu_log_delta_is_a_tight_upper_bound(mu):
    for t in (-3.0, 0.0, 4.0, 30.0):   # w = eps/mu - mu/2: delta from ~1 down to ~1e-197
        eps = mu * (mu / 2 + t)
        true = _delta(eps, mu)
        bound = mp.e ** mp.mpf(float(exact.gaussian_log_delta(eps, mu)))
        w = abs(t) if t else 1.0
        # w is moved down by its rounding margin 2^-50 (eps/mu + mu/2) ~ 2^-50 mu, which raises
        # log Phi(-w) by at most (max(t, 0) + 1) times that.
        rounding = math.exp((max(t, 0.0) + 1.0) * 2.0 ** -49 * mu)
        assert true <= bound <= true * (1 + 2 * (w + 1 / w) / mu) * rounding * (1 + 1e-9)


def test_compiled_path_agrees_and_is_finite():
    # Before the large-mu bound the compiled bisection returned NaN from mu ~ 1e9 on.
    mus = np.array(LARGE_MU * len(DELTAS))
    deltas = np.repeat(DELTAS, len(LARGE_MU))
    with jax.enable_x64(True):
        compiled = np.asarray(jax.jit(exact.gaussian_epsilon)(jnp.asarray(deltas), jnp.asarray(mus)))
    host = np.asarray(exact.gaussian_epsilon(deltas, mus))
    np.testing.assert_allclose(compiled, host, rtol=1e-12)


def test_public_epsilon_at_large_mu_is_not_understated():
    # One step without subsampling at noise multiplier 1e-10: mu = 1e10.  The epsilon was
    # 4.9999999215e19, where the true delta is 1.0.
    eps = dpjax.dpsgd_epsilon(1e-10, 1.0, 1, 1e-5)
    assert _delta(eps, 1e10) <= 1e-5


@pytest.mark.parametrize("mu", [0.05, 0.3, 2.0])
def test_deep_tail_epsilon_is_sound(mu):
    # delta = 1e-200 puts log_ndtr's arguments below -20 (its series): delta at the epsilon was
    # ~1.4e-9 relative above the target before the series' truncation bound was added.
    eps = float(exact.gaussian_epsilon(1e-200, mu))
    assert _delta(eps, mu) <= 1e-200
    assert _delta(eps * (1 - 1e-7), mu) > 1e-200


def _random_cases(n, seed):
    rng = np.random.default_rng(seed)
    mu = 10.0 ** rng.uniform(-3, 3.9, n)
    delta = 10.0 ** rng.uniform(-250, -0.5, n)
    return mu, delta


def test_random_epsilons_are_never_understated():
    # The closed form's rounding error is amplified where delta is a small difference of two
    # close terms (small mu, deep tails: up to ~1.5e-9 relative in delta at mu ~ 0.002) and
    # where eps is large (mu ~ 1e3-1e4): the search's margin follows the bound on that error.
    # Host and compiled paths, 300 seeded (mu, delta); tight to 1e-6 relative for mu >= 0.01.
    mu, delta = _random_cases(300, 5)
    host = np.array([float(exact.gaussian_epsilon(d, m)) for d, m in zip(delta, mu)])
    with jax.enable_x64(True):
        compiled = np.asarray(jax.jit(exact.gaussian_epsilon)(jnp.asarray(delta), jnp.asarray(mu)))
    for eps_h, eps_c, m, d in zip(host, compiled, mu, delta):
        assert _delta(eps_h, m) <= d and _delta(eps_c, m) <= d, (m, d, eps_h, eps_c)
        if m >= 0.01 and eps_h > 0:
            assert _delta(eps_h * (1 - 1e-6), m) > d, (m, d, eps_h)


def test_tiny_mu_answers_are_sound_and_finite():
    # mu = 1e-20: the two terms of delta agree to all 16 digits; delta(0) ~ 0.4 mu was 0 and
    # delta = 1e-300 was met at epsilon 0.  Now the bound delta <= mu phi(d) answers.
    eps = float(exact.gaussian_epsilon(1e-300, 1e-20))
    assert 0.0 < eps < 4e-19 and _delta(eps, 1e-20) <= 1e-300
    d0 = dpjax.dpsgd_delta(1e20, 1.0, 1, 0.0)
    assert _delta(0.0, 1e-20) <= d0 <= _delta(0.0, 1e-20) * 1.01
    with jax.enable_x64(True):
        g = jax.grad(lambda m: exact.gaussian_epsilon(1e-300, m))(jnp.float64(1e-20))
        compiled = jax.jit(exact.gaussian_epsilon)(jnp.float64(1e-300), jnp.float64(1e-200))
    assert float(g) == 0.0   # documented: no gradient below mu = 1e-12
    assert 0.0 < float(compiled) < 1e-60   # was NaN (compiled) / inf
