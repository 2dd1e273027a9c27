"""Soundness and tightness of the FFT path against the exact Gaussian oracle.

A T-fold Gaussian composition is a Gaussian with sigma/sqrt(T) (docs/design.md §1), so
``delta(eps) = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s))``, ``s = sigma/sqrt(T)``, is
exact.  dpjax does NOT use that shortcut: ``pld.epsilon([(Gaussian(sigma), T)], ...)``
discretizes one Gaussian PLD and composes it T times by FFT power.  We check
``exact <= certified <= exact * 1.003`` (a 0.3% tightness bound) and
``lower <= exact``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import optimize, special

from dpjax import pld

# Soundness tolerance on the oracle side: the closed form evaluated in float64 (log-space
# hockey stick, brentq to xtol 1e-15) is accurate to ~1e-12 relative; a certified value may
# not be below exact by more than that.
ORACLE_RTOL = 1e-10
TIGHT = 1.003


def exact_delta(eps, s):
    """Exact hockey stick of the Gaussian pair N(1, s^2) vs N(0, s^2) (docs/design.md §1), log-space."""
    a = special.log_ndtr(-eps * s + 1.0 / (2 * s))
    b = eps + special.log_ndtr(-eps * s - 1.0 / (2 * s))
    return math.exp(a) * -math.expm1(b - a) if a > -np.inf else 0.0


def exact_eps(delta, s):
    if exact_delta(0.0, s) <= delta:
        return 0.0
    hi = 1.0
    while exact_delta(hi, s) > delta:
        hi *= 2.0
    # log-space root (delta spans many decades); max(., 1e-300) guards a rounded-to-0 delta.
    return optimize.brentq(lambda e: math.log(max(exact_delta(e, s), 1e-300)) - math.log(delta), 0.0, hi,
                           xtol=1e-15, rtol=1e-15)


@pytest.mark.parametrize("case_id", ["A1", "A2", "A3", "A4", "A5", "A6", "A7"])
def test_pinned_epsilon(reference_cases, case_id):
    case = reference_cases[case_id]
    p = case["params"]
    res = pld.epsilon([(pld.Gaussian(p["noise_multiplier"]), p["steps"])], p["delta"], exact_gaussian=False)
    exact = case["value"]
    assert res.epsilon_upper >= exact * (1 - ORACLE_RTOL)
    assert res.epsilon_upper <= exact * TIGHT
    assert res.epsilon_lower <= exact * (1 + ORACLE_RTOL)
    assert res.epsilon == res.epsilon_upper


@pytest.mark.parametrize("case_id", ["A8", "A9", "A10"])
def test_pinned_delta(reference_cases, case_id):
    case = reference_cases[case_id]
    p = case["params"]
    res = pld.delta([(pld.Gaussian(p["noise_multiplier"]), p["steps"])], p["epsilon"], exact_gaussian=False)
    exact = case["value"]
    assert res.delta_upper >= exact * (1 - ORACLE_RTOL)
    # 0.3% of delta (plus the absolute truncation budget 1e-13 the delta queries use).
    assert res.delta_upper <= exact * TIGHT + 1e-13
    assert res.delta_lower <= exact * (1 + ORACLE_RTOL)


# Hypothesis-driven range: T in [1, 1e5] (log-uniform), composed mu = sqrt(T)/sigma in
# [0.015, 4] and delta in [1e-9, 1e-3] -- this spans epsilon from ~0.04 to ~30.
@given(
    log10_steps=st.floats(0.0, 5.0),
    log10_mu=st.floats(math.log10(0.015), math.log10(4.0)),
    log10_delta=st.floats(-9.0, -3.0),
)
def test_fft_path_sound_and_tight(log10_steps, log10_mu, log10_delta):
    steps = max(1, int(round(10**log10_steps)))
    mu = 10**log10_mu
    delta = 10**log10_delta
    sigma = math.sqrt(steps) / mu
    s = 1.0 / mu
    exact = exact_eps(delta, s)
    # exact_gaussian=False: this tests the FFT grid (Gaussians are otherwise answered exactly).
    res = pld.epsilon([(pld.Gaussian(sigma), steps)], delta, with_lower=False, exact_gaussian=False)
    assert res.epsilon_upper >= exact * (1 - ORACLE_RTOL) - 1e-12
    assert res.epsilon_upper <= exact * TIGHT + 1e-12


def test_eps_range_is_covered():
    """The hypothesis range above really reaches eps ~0.05 and ~30 (so the claim is honest)."""
    lo = exact_eps(1e-3, 1 / 0.015)
    hi = exact_eps(1e-9, 1 / 4.0)
    assert lo < 0.05 and hi > 30
