"""Where the FFT grid cannot certify a direction, every surface answers with the smallest certified
fallback bound (dpjax.pld.fallback), never the un-sampled Gaussian's epsilon or inf while a small
certified value exists; the bounds themselves are checked against exact oracles."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax.pld import fallback
from dpjax.numerics.exact import gaussian_epsilon

TINY = (0.5, 1e-9, 1000, 1e-5)   # q T = 1e-6, ten times below delta: epsilon is 0


def test_tiny_q_single_call_is_small_not_the_unsampled_value():
    # Was 2268.77, the epsilon of the Gaussian with q taken as 1 (the add direction's grid failed).
    res = pld.dpsgd_accounting(*TINY)
    assert res.epsilon == 0.0
    assert "binomial mixture" in res.reason      # the certified bound that gives 0 is named
    assert dpjax.dpsgd_epsilon(*TINY) == 0.0
    # Consistent with the certified delta at epsilon 0 (which is above 0 and below target).
    d0 = pld.dpsgd_delta(0.5, 1e-9, 1000, 0.0)
    assert 0.0 < d0 <= 1e-6   # was 1.0 (the add direction's grid failed there too)


@pytest.mark.slow
def test_tiny_q_every_surface_agrees():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dpjax.interop import RunningAccountant
    from dpjax.interop.dp_accounting import PLDAccountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(1e-9, dp_accounting.GaussianDpEvent(0.5)), 1000)
    assert PLDAccountant().compose(event).get_epsilon(1e-5) == 0.0          # was 2268.8
    row = dpjax.sweep([dict(noise_multiplier=0.5, sampling_prob=1e-9, steps=1000, delta=1e-5)]).rows[0]
    # was inf.  The grid's row carries the binomial-mixture bound as the single call does, and
    # its bracket is exact ([0, 0]), so it stays batched: the value is the single call's.
    assert row["epsilon"] == 0.0 == dpjax.dpsgd_epsilon(0.5, 1e-9, 1000, 1e-5)
    assert row["lower"] == 0.0
    for horizon in (None, 1000):                                            # was inf with a horizon
        acc = RunningAccountant(horizon=horizon)
        acc.step(noise_multiplier=0.5, sample_rate=1e-9, num_steps=1000)
        assert acc.get_epsilon(1e-5) == 0.0


@pytest.mark.slow
def test_tiny_q_curve_fits_in_memory_and_is_small():
    # Was RESOURCE_EXHAUSTED (a 37 GB request: 16 padded copies of a 2^21-point program).
    c = dpjax.epsilon_curve(0.5, 1e-9, [1, 1000], 1e-5)
    assert list(c.epsilon) == [0.0, 0.0]


def test_monotone_in_q_through_the_failing_region():
    qs = [1e-9, 3e-8, 1e-7, 1e-6]   # 3e-8 gave 3.1e-4 (dx / 2) while 1e-7 certifies 0
    eps = [dpjax.dpsgd_epsilon(0.5, q, 1000, 1e-5) for q in qs]
    assert all(np.isfinite(eps)) and max(eps) < 0.1
    assert all(a <= b for a, b in zip(eps, eps[1:])), eps


# --------------------------------------------------------------------------- the bounds themselves

def test_mixture_bound_is_the_exact_gaussian_at_q_one():
    # q = 1: K = T surely, the mixture is the T-fold Gaussian, mu = sqrt(T) / sigma (exact oracle).
    comps = [(pld.PoissonSubsampledGaussian(2.0, 1.0), 9)]
    for delta in (1e-3, 1e-6, 1e-12):
        got = float(fallback.mixture_bound(comps, [delta])[0])
        exact = float(gaussian_epsilon(delta, 1.5))
        assert exact <= got <= exact * (1 + 1e-8) + 1e-12


@pytest.mark.parametrize("steps", [1, 4])
def test_mixture_delta_covers_the_closed_forms_rounding(steps):
    # q = 1 again (the mixture is the Gaussian itself), at small mu and a deep tail: there the
    # closed form is a small difference of two close terms, and its value times 1 + 1e-9 was up
    # to 6e-8 relative below the Gaussian's exact delta (60-digit mpmath).
    import mpmath as mp

    eps, sigma = 0.00047316727558573607, 38968.1703069693
    curve = fallback._mixture_curve([(pld.PoissonSubsampledGaussian(sigma, 1.0), steps)], 1e-90)
    got = curve(eps)
    with mp.workdps(60):
        e, m = mp.mpf(eps), mp.sqrt(steps) / mp.mpf(sigma)
        truth = mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)
    assert mp.mpf(got) >= truth and got <= float(truth) * (1 + 1e-5)


@pytest.mark.parametrize("sigma,q,steps,delta", [(1.0, 1e-3, 100, 1e-5), (0.8, 1e-2, 30, 1e-6),
                                                 (2.0, 1e-4, 1000, 1e-8), (0.6, 0.05, 10, 1e-5)])
def test_every_fallback_bound_lies_above_the_certified_lower_end(sigma, q, steps, delta):
    # Soundness against the grid's certified lower bound on the truth, where the grid works.
    res = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    comps = [(pld.PoissonSubsampledGaussian(sigma, q), steps)]
    for rep in res.directions:
        value, _ = fallback.direction_epsilon(comps, rep.direction, [delta], dominating_mu=math.sqrt(steps) / sigma)
        assert value[0] >= float(rep.lower) * (1 - 1e-9)
    # The support bound holds in the add direction: loss <= -T log(1 - q) there.
    add = next(r for r in res.directions if r.direction == "add")
    assert float(add.lower) <= -steps * math.log1p(-q) * (1 + 1e-9)


def test_rdp_bound_matches_the_baseline():
    from dpjax.numerics.rdp import rdp_epsilon

    comps = [(pld.PoissonSubsampledGaussian(1.0, 0.01), 1000)]
    got = float(fallback.rdp_bound(comps, [1e-5])[0])
    assert got == pytest.approx(rdp_epsilon(1.0, 0.01, 1000, 1e-5)[0], rel=1e-9)


def test_support_bound_of_randomized_response_and_laplace():
    rr = [(pld.RandomizedResponse(0.5, 4), 3)]
    assert fallback.support_bound(rr, "remove") == pytest.approx(3 * math.log1p(4 * 0.5 / 0.5))
    lap = [(pld.Laplace(2.0, 1.0), 5)]
    assert fallback.support_bound(lap, "add") == pytest.approx(2.5)
    assert fallback.support_bound([(pld.Gaussian(1.0), 1)], "remove") == math.inf


@pytest.mark.parametrize("failed", ["remove", "add"])
def test_a_failed_direction_is_replaced_and_the_larger_direction_is_reported(failed):
    # Where the grid fails in one direction, that direction gets its smallest fallback bound and
    # the add-or-remove answer is the larger of the two directions, never the smaller.
    from dpjax.pld.accountant import _fallback

    sigma, q, steps, delta = 1.0, 0.01, 1000, 1e-5
    comps = [(pld.PoissonSubsampledGaussian(sigma, q), steps)]
    res = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    reports = tuple(dataclasses.replace(r, upper=np.float64(np.inf)) if r.direction == failed else r
                    for r in res.directions)
    mu = math.sqrt(steps) / sigma
    out, upper, reason = _fallback(comps, reports, np.float64(delta), mu, "grid")
    fb, _ = fallback.direction_epsilon(comps, failed, [delta], dominating_mu=mu)
    kept = next(float(r.upper) for r in res.directions if r.direction != failed)
    by_direction = {r.direction: float(r.upper) for r in out}
    assert by_direction[failed] == float(fb[0]) and math.isfinite(by_direction[failed])
    assert float(upper) == max(by_direction.values()) == max(float(fb[0]), kept)
    # Sound: never below the certified lower end of the true epsilon.
    assert float(upper) >= res.epsilon_lower
    assert "fallback" in reason
