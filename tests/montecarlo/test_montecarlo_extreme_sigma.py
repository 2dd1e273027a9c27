"""Monte Carlo soundness at extreme noise multipliers (sigma**2 underflow, subnormals).

A privacy loss that cannot be evaluated (NaN, e.g. from inf - inf once sigma**2 underflows to 0
for sigma <~ 1e-154) must count as +inf, never as 0: otherwise a tiny sigma, which releases the
data almost exactly, looked private and was even certified.
"""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins

# The reproducer's sample count: the b = 1 and b = 4 estimates below are then the reproducer's
# compiled programs (the sample count is static), and more draws only make "every term is 1" stricter.
SAMPLES = 4096


def test_issue_reproducer_no_false_certificate():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), 4, 2)
    cert = acc.certify(1e-160, 1.0, 1e-2, 4096, 0)
    assert not cert.verified
    est = acc.estimate(1e-160, [1.0], 4096, 0)
    np.testing.assert_array_equal(est.delta, [1.0])        # was [0.]
    one_bin = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 1, 2)
    np.testing.assert_array_equal(one_bin.estimate(1e-160, [1.0], 4096, 0).delta, [1.0])  # was NaN


@settings(max_examples=15, deadline=None)
@given(coef=st.floats(0.0, 0.9), b=st.sampled_from([1, 2, 4]),
       log_s=st.floats(min_value=-323.0, max_value=-150.0, allow_nan=False),
       eps=st.sampled_from([0.5, 2.0]))
def test_underflowing_sigma_gives_delta_one(coef, b, log_s, eps):
    # As sigma -> 0 the pair separates and the true delta tends to 1; from sigma**2 underflow on
    # (and into the subnormals) every loss is +inf or NaN -> +inf, so each term is exactly 1.
    acc = BallsInBins(Toeplitz(np.array([1.0, coef])), b, 2)
    sigma = max(10.0 ** log_s, 5e-324)
    d, se = acc.delta(sigma, [eps], SAMPLES, 7)
    np.testing.assert_array_equal(d, [1.0])


@settings(max_examples=10, deadline=None)
@given(coef=st.floats(0.0, 0.9), log_s=st.floats(min_value=-323.0, max_value=-0.5), target=st.sampled_from([1e-2, 1e-1]))
def test_no_certificate_where_unamplified_delta_reaches_target(coef, log_s, target):
    acc = BallsInBins(Toeplitz(np.array([1.0, coef])), 2, 2)
    sigma = max(10.0 ** log_s, 5e-324)
    if float(np.max(acc.unamplified_delta(sigma, [1.0]))) >= target:
        assert not acc.certify(sigma, 1.0, target, 4096, 3).verified


def test_uncertified_record_reports_no_nan():
    # sigma**2 underflows: the importance weights overflow and the sample mean is inf.  The record
    # is not verified, certifies nothing (delta inf), and its standard error is inf ("unbounded"),
    # not the NaN of inf - inf.
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 2, 2)
    with warnings.catch_warnings():
        # Nor do NumPy's overflow warnings reach the user: the host-side bounds handle overflow.
        warnings.simplefilter("error", RuntimeWarning)
        cert = acc.certify(1e-160, 1.0, 1e-2, SAMPLES, 3)
    assert not cert.verified and cert.delta == np.inf
    assert cert.standard_error == np.inf and cert.delta_estimate == np.inf
    assert "nan" not in cert.reason.lower()


def test_overflowing_tilt_normalizers_are_inf_and_the_range_is_the_trivial_bound():
    # G / sigma^2 overflows: log Z_k is +inf (it exceeds the largest float), the tilted terms
    # drop out of the range's denominator, and the bound is the one that holds for any
    # proposal, sup h / D <= 1 / (weight of the untilted component), times the 1 + 1e-9 margin.
    from dpjax.montecarlo import evr
    from dpjax.montecarlo.importance import summand_range, tilt_log_normalizers

    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert tilt_log_normalizers(acc.gram, 1e-160, (2, 3, 4)) == {2: np.inf, 3: np.inf, 4: np.inf}
        assert np.isfinite(list(tilt_log_normalizers(acc.gram, 1e-150, (2, 3, 4)).values())).all()
        prop = evr._proposal(acc, 1e-160, 1.0, 0.0, (0.95, 0.0, 0.0))
        r_f, _ = summand_range(acc.gram, 1e-160, 1.0, prop)
    untilted = float(np.sum(np.asarray(prop.fwd_weight)[(np.asarray(prop.fwd_theta) == 0)
                                                         & (np.asarray(prop.fwd_shift) == 0)]))
    assert 0 < untilted < 1
    assert r_f == (1.0 / untilted) * (1 + 1e-9)
