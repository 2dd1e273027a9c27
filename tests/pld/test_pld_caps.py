"""Bounds found without the grid, next to the grid's bracket.

* Caps on the upper end (:func:`dpjax.pld.accountant.epsilon_caps`): no answer is above the
  Gaussian mechanism that dominates the composition without amplification, nor above the
  composition's largest loss.  They also place the tilted tail pass's window: a single
  fixed-batch step at delta 3.8e-14 had an ordinary upper end of 84.6, a tilted window centred
  halfway to it found nothing, and the answer was 23.81 (the unamplified cap) where
  dp_accounting proves 18.88.
* A raised lower end (:func:`dpjax.pld.accountant.one_step_epsilon_lower`): one step of the
  composition alone, by its closed form, is a lower bound (dropping the other steps is
  post-processing); for one step it is the exact answer, where the grid's optimistic rounding
  left the lower end 2% below the truth (sigma 0.5, q 1e-9, delta 1e-14).
* The threshold test (:func:`dpjax.pld.accountant.threshold_test_delta`): the hockey-stick
  divergence at the event "some step's output exceeds its threshold", a lower bound on delta for
  any threshold, close to the truth where sampled steps are rare (sigma 0.63, q 1.4e-8, T 353,
  delta 4.8e-13: the grid's bracket [1.134e-4, 1.241e-4] became [1.2366e-4, 1.2407e-4]).

Oracles: the closed form of one Poisson-subsampled Gaussian step in 40-digit mpmath
(``q delta_G(eps')`` with ``e^eps' = (e^eps - 1 + q) / q``, the remove direction) and
dp_accounting's pessimistic PLD for the fixed-batch pair.
"""

from __future__ import annotations

import math

import jax
import mpmath
import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax.pld.accountant import delta_caps, epsilon_caps, one_step_epsilon_lower
from dpjax.pld.grid.engine import dpsgd_components, stack

mpmath.mp.dps = 40


def _one_step_delta(eps, sigma, q):
    """Remove-direction delta of one Poisson-subsampled Gaussian step (exact, mpmath)."""
    eps, sigma, q = mpmath.mpf(eps), mpmath.mpf(sigma), mpmath.mpf(q)
    shifted = mpmath.log((mpmath.exp(eps) - 1 + q) / q)
    mu = 1 / sigma
    phi = lambda x: mpmath.ncdf(x)  # noqa: E731
    return q * (phi(-shifted / mu + mu / 2) - mpmath.exp(shifted) * phi(-shifted / mu - mu / 2))


def _threshold_epsilon(sigma, q, steps, delta):
    """The threshold test's epsilon lower end in 50-digit mpmath, maximised over a fine grid of
    thresholds around the single step's optimal one."""
    mp = mpmath.mp
    with mpmath.workdps(50):
        s, q = mp.mpf(sigma), mp.mpf(q)

        def value(eps):
            eps = mp.mpf(eps)
            c0 = s * s * mp.log((mp.exp(eps) - 1 + q) / q) + mp.mpf(1) / 2

            def f(c):
                b0, b1 = mp.ncdf(-c / s), mp.ncdf(-(c - 1) / s)
                return -mp.expm1(steps * mp.log1p(-(q * b1 + (1 - q) * b0))) + mp.exp(eps) * mp.expm1(
                    steps * mp.log1p(-b0))
            return max(f(c0 + mp.mpf(k) / 200) for k in range(-40, 41))

        lo, hi = mp.mpf(0), mp.mpf(1)
        for _ in range(45):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if value(mid) > delta else (lo, mid)
        return float(lo)


def _one_step_epsilon(sigma, q, delta):
    lo, hi = mpmath.mpf(0), mpmath.mpf(60)
    for _ in range(120):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _one_step_delta(mid, sigma, q) <= delta else (mid, hi)
    return float(lo), float(hi)


FIXED = dict(noise_multiplier=0.7286932462046528, steps=1, target_delta=3.788325657087429e-14,
             dataset_size=60_000, batch_size=1671)
# dp_accounting (PLD, pessimistic, value_discretization_interval 1e-4) on the same pair: 18.876.
FIXED_DP_ACCOUNTING = 18.876


def test_fixed_batch_step_at_tiny_delta_is_amplified():
    f = FIXED
    eps = float(dpjax.dpsgd_epsilon(f["noise_multiplier"], None, f["steps"], f["target_delta"], sampling=dpjax.FixedBatch(f["batch_size"], f["dataset_size"])))
    unamplified = float(pld.gaussian_epsilon(f["target_delta"], 2.0 / f["noise_multiplier"]))
    assert eps < 0.8 * unamplified, (eps, unamplified)  # 23.81 before
    # Within 0.2% of dp_accounting's pessimistic value (its own grid error is ~1e-4 absolute).
    assert abs(eps - FIXED_DP_ACCOUNTING) <= 2e-3 * FIXED_DP_ACCOUNTING, eps


@pytest.mark.parametrize("sigma,q,steps,delta", [
    (0.73, 0.5, 1, 3.8e-14), (1.0, 0.01, 1000, 1e-5), (0.6, 1.0 - 1e-9, 3, 1e-14), (2.0, 0.3, 50, 1e-12),
])
def test_never_above_the_caps_and_caps_are_sound(sigma, q, steps, delta):
    comps = dpsgd_components(sigma, q, steps)
    res = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    caps = epsilon_caps(comps, np.asarray([delta]))
    unamplified = float(pld.gaussian_epsilon(delta, math.sqrt(steps) / sigma))
    for r in res.directions:  # each direction within its own caps
        assert float(r.upper) <= float(caps[r.direction][0]) <= unamplified * (1 + 1e-12), r
    assert res.epsilon <= unamplified * (1 + 1e-12)
    assert res.epsilon_lower <= res.epsilon
    # The two caps agree: below a direction's epsilon cap, its delta cap is above the target.
    for r in res.directions:
        below = 0.999 * min(float(r.upper), float(caps[r.direction][0]))
        assert float(delta_caps(comps, np.asarray([below]))[r.direction][0]) >= delta, r


def test_capped_value_differentiates_like_its_closed_form():
    # q = 1 - 1e-9: no amplification left; the grid's value is above the dominating Gaussian's,
    # which is reported, and its derivative is the closed form's.
    sigma, q, steps, delta = 0.6, 1.0 - 1e-9, 3, 1e-14
    res = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    assert res.reason and "cheaper certified bound" in res.reason
    g = float(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, q, steps, delta))(sigma))
    ref = float(jax.grad(lambda s: pld.gaussian_epsilon(delta, math.sqrt(steps) / s))(sigma))
    assert g == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("sigma,q,delta", [
    (1.5134, 1.0132e-05, 1.3074e-12), (1.0, 0.01, 1e-14), (0.8, 0.2, 1e-6), (3.0, 1e-3, 1e-10),
])
def test_one_step_lower_end_is_the_closed_form(sigma, q, delta):
    lo, hi = _one_step_epsilon(sigma, q, delta)
    res = pld.dpsgd_accounting(sigma, q, 1, target_delta=delta)
    assert res.epsilon_lower <= lo and hi <= res.epsilon, (res, lo, hi)
    assert res.epsilon_lower >= lo * (1 - 1e-8), (res.epsilon_lower, lo)


def test_one_step_lower_end_of_a_composition_is_below_its_answer():
    # A long composition: the single step's epsilon is a (weak) lower bound, never above the
    # composition's certified upper end, and never replaces a better grid lower end.
    sigma, q, steps, delta = 1.0, 0.01, 1000, 1e-5
    res = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    single = one_step_epsilon_lower(stack(dpsgd_components(sigma, q, steps)), np.asarray([delta]),
                                    np.asarray([res.epsilon]))
    assert 0 < float(single[0]) < res.epsilon_lower <= res.epsilon


def test_one_step_delta_lower_end():
    sigma, q, eps = 0.8, 0.2, 2.0
    exact = float(_one_step_delta(eps, sigma, q))
    res = pld.dpsgd_accounting(sigma, q, 1, target_epsilon=eps)
    assert res.delta_lower <= exact <= res.delta
    assert res.delta_lower >= exact * (1 - 1e-8)


def test_caps_leave_scipy_stats_unimported():
    # The caps run on every answer; the binomial-mixture fallback's scipy.stats (~0.4 s of import,
    # a third of a one-shot CLI query) loads only when a direction actually falls back.
    import subprocess
    import sys

    code = ("import sys, dpjax; dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5); "
            "from dpjax import pld; pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-5); "
            "print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


HEAVY = (0.6291005376737504, 1.3958098043021708e-08, 353, 4.849276483929471e-13)
# Certified upper end of HEAVY (pld.dpsgd_accounting; tests/pld/test_pld_tilted_tail.py, slow tier).
HEAVY_UPPER = 1.2406745796100793e-04


def test_threshold_test_lower_end_against_mpmath():
    from dpjax.pld.accountant import threshold_test_epsilon_lower

    s, q, t, d = HEAVY
    ours = float(threshold_test_epsilon_lower(stack(dpsgd_components(s, q, t)), np.asarray([d]), np.asarray([1e-3]),
                                              np.asarray([0.0]))[0])
    exact = _threshold_epsilon(s, q, t, d)
    # Our threshold search is a grid (a coarser maximisation than the oracle's): at most 0.5% lower.
    assert exact * (1 - 5e-3) <= ours <= exact * (1 + 1e-6), (ours, exact)
    assert ours <= HEAVY_UPPER


def test_threshold_test_tightens_the_lower_end_where_sampling_is_rare():
    # sigma 1, q 1e-6, T 100, delta 1e-12: the grid alone bracketed [2.94e-4, 3.235e-4].
    res = pld.dpsgd_accounting(1.0, 1e-6, 100, target_delta=1e-12)
    assert res.epsilon <= res.epsilon_lower * 1.01, res
    assert res.epsilon_lower <= _threshold_epsilon(1.0, 1e-6, 100, 1e-12) * (1 + 1e-6)


@pytest.mark.parametrize("sigma,q,steps,eps", [(1.0, 0.01, 1000, 1.0), (0.8, 0.2, 1, 2.0), (1.0, 1e-6, 100, 3e-4),
                                               (2.0, 1.0, 10, 1.0)])
def test_threshold_test_delta_is_below_the_certified_delta(sigma, q, steps, eps):
    from dpjax.pld.accountant import _threshold_rows, threshold_test_delta

    res = pld.dpsgd_accounting(sigma, q, steps, target_epsilon=eps)
    low = float(threshold_test_delta(_threshold_rows(stack(dpsgd_components(sigma, q, steps))), np.asarray([eps]))[0])
    assert res.delta_lower <= res.delta and low <= res.delta * (1 + 1e-9), (low, res)
    if steps == 1:  # the optimal test of one step: its exact delta
        assert low == pytest.approx(float(_one_step_delta(eps, sigma, q)), rel=1e-6)


def test_dominating_gaussian_cap_covers_the_closed_forms_rounding():
    # Small mu (sigma ~ 4e4) at delta ~ 4.5e-82: the closed form is a small difference of two
    # close terms, and its value times 1 + 1e-9 was 6e-8 relative below the dominating
    # Gaussian's exact delta (60-digit mpmath), so the cap understated.
    import mpmath as mp

    from dpjax.pld import accountant as acc

    eps, sigma = 0.00047316727558573607, 38968.1703069693
    caps = acc.delta_caps([pld.PoissonSubsampledGaussian(sigma, 0.5)], np.array([eps]))
    with mp.workdps(60):
        e, m = mp.mpf(eps), 1 / mp.mpf(sigma)
        truth = mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)
    for direction in ("remove", "add"):
        cap = float(caps[direction][0])
        assert mp.mpf(cap) >= truth and cap <= float(truth) * (1 + 1e-5)
