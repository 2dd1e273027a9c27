"""Calibration and Estimate-Verify-Release certificates of the b-min-sep accountant (Dong & Ganesh,
"Privacy Amplification for BandMF via b-Min-Sep Subsampling"): BMinSep.calibrate,
bminsep.calibrate_on_samples and its implicit gradient, BMinSep.certify / certify_noise.

Runs with x64 OFF (the suite's default, what users see).

Tolerances:

* Calibration against its own estimate: the returned sigma is the feasible end of a bisection
  bracket, so ``delta_hat(sigma) <= target`` exactly on the same draws, and within 1e-9 relative
  of it (the bracket is 1.4e-14 wide in ``log sigma``; ``|d log delta / d log sigma|`` is O(10)).
* Calibration against an exact value (``min_sep = 1`` is Poisson sampling, whose delta
  ``dpjax.dpsgd_delta`` computes by PLD): the exact delta at the calibrated sigma is within 3
  standard errors of the estimate (plus 1% for the PLD discretisation, which is pessimistic).
* Implicit gradient against central finite differences of the calibration on the same draws
  (float64, step 1e-5): relative 1e-6.  The bisection root is accurate to ~1e-14 relative, so the
  quotient's round-off is ~1e-9; ``delta_hat`` has a kink where a sample's loss crosses epsilon,
  and at m = 4096 a step of 1e-5 crosses a kink with probability ~m * 1e-5 (each changes the
  slope by O(1/m)); observed agreement 3e-9 or better.  A wrong adjoint (a missing factor,
  a sign, the gradient of one direction instead of the max) is off by O(1).
* Certificates: a release of a sigma whose exact (PLD) delta exceeds ``tau * base_delta`` is a
  false release; the certificate states that its probability is at most
  ``failure_probability``.  Over N independent attempts the count of false releases must not be
  significant at level 1e-3 for a binomial with that rate (one-sided tail).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import dpjax
from dpjax.montecarlo import BMinSep
from dpjax.montecarlo import bminsep as bm

LEVEL = 1e-3
# The configuration of the calibration and gradient tests (one compilation serves them all).
N, B, M, P = 16, 3, 4096, 0.25
MASK = (np.arange(N)[:, None] + np.arange(2)[None, :] < N).astype(np.float64)


def _false_release_count_is_consistent(count, attempts, rate):
    """One-sided binomial test: P(Binomial(attempts, rate) >= count) >= LEVEL."""
    return stats.binom.sf(count - 1, attempts, rate) >= LEVEL


# --------------------------------------------------------------------------- calibration


def test_calibrate_solves_the_estimate_and_matches_poisson():
    """min_sep = 1 with C = [1] is DP-SGD with Poisson sampling: the exact (PLD) delta at the
    calibrated sigma is the target up to the estimate's standard error."""
    p, steps, eps, target, m = 0.1, 16, 2.0, 1e-2, 1 << 14
    acc = BMinSep(np.array([1.0]), p, 1, steps)
    sigma = acc.calibrate(eps, target, m, key=11)
    assert isinstance(sigma, float)
    est = acc.estimate(sigma, eps, m, key=11)
    assert est.num_samples == m
    assert est.delta[0] <= target
    assert est.delta[0] >= target * (1 - 1e-9)
    exact = float(dpjax.dpsgd_delta(sigma, p, steps, eps))
    se = float(est.standard_error[0])
    assert abs(exact - target) <= 3 * se + 0.01 * target, (sigma, exact, target, se)
    # The reference noise multiplier of the PLD accountant: within the estimate's error in sigma.
    ref = float(dpjax.dpsgd_noise_multiplier(p, steps, eps, target))
    slope = (acc.delta(sigma * 1.01, eps, m, 11)[0] - target) / (0.01 * sigma)
    assert abs(sigma - ref) <= (3 * se + 0.01 * target) / abs(slope), (sigma, ref)


def test_calibrate_is_monotone_and_new_probability_or_target_does_not_recompile():
    """More delta or more epsilon needs less noise (same draws); a new sampling_prob or target
    reuses the compiled calibration."""
    acc = BMinSep(np.array([1.0, 0.6]), P, B, N)
    s1 = acc.calibrate(1.5, 0.05, M, key=2)
    size = bm._calibrate_jit._cache_size()
    s2 = acc.calibrate(1.5, 0.02, M, key=2)
    s3 = acc.calibrate(2.5, 0.02, M, key=2)
    assert s2 > s1 and s3 < s2
    s4 = BMinSep(np.array([1.0, 0.6]), 0.6, B, N).calibrate(1.5, 0.02, M, key=2)
    assert s4 > s2  # a larger sampling probability amplifies less
    assert bm._calibrate_jit._cache_size() == size


@pytest.mark.parametrize("call,match", [
    (lambda a: a.calibrate(0.0 - 1, 1e-3, 4096), "epsilon"),
    (lambda a: a.calibrate(1.0, 0.0, 4096), "delta"),
    (lambda a: a.calibrate(1.0, float("nan"), 4096), "delta"),
    (lambda a: a.calibrate(1.0, 1e-3, 0), "num_samples"),
    (lambda a: a.calibrate(1e-6, 0.9999, M), "vacuous"),
    (lambda a: a.certify(0.0, 1.0, 0.05, 1 << 13, 1), "noise_multiplier"),
    (lambda a: a.certify(1.0, 1.0, 0.05, 1 << 13, 1, method="importance_betting"), "method"),
    (lambda a: a.certify_noise(1.0, 0.05, 0, method="importance_betting"), "method"),
    (lambda a: a.estimate(1.0, 1.0, 1024, 0, devices=jax.devices()), "devices"),
    (lambda a: a.certify(1.0, 1.0, 1e-6, 1024, 1), "num_samples"),
])
def test_bad_input_names_the_argument(call, match):
    acc = BMinSep(np.array([1.0, 0.6]), P, B, N)
    with pytest.raises(ValueError, match=match):
        call(acc)


# --------------------------------------------------------------------------- implicit gradient



def _root(col, eps, delta):
    """Calibrated sigma as a function of a 2-band Toeplitz column, on fixed draws."""
    bands = MASK * col[None, :]
    return bm.calibrate_on_samples(bands, eps, delta, P, jax.random.key(3), min_sep=B, num_samples=M).root


# One compiled program gives the root and its gradient (the differences use its root).
_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_root, argnums=(0, 1, 2)))


def test_implicit_gradient_matches_finite_differences():
    col, eps, delta = np.array([1.0, 0.6]), 1.5, 0.02
    with jax.enable_x64(True):
        _, grads = _VALUE_AND_GRAD(col, eps, delta)

        def root(*args):
            return _VALUE_AND_GRAD(*args)[0]

        h = 1e-5
        e = np.eye(2) * h
        fd_col = [(root(col + e[i], eps, delta) - root(col - e[i], eps, delta)) / (2 * h) for i in range(2)]
        fd_eps = (root(col, eps + h, delta) - root(col, eps - h, delta)) / (2 * h)
        fd_delta = (root(col, eps, delta * (1 + h)) - root(col, eps, delta * (1 - h))) / (2 * h * delta)
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(fd_col), rtol=1e-6)
    np.testing.assert_allclose(float(grads[1]), float(fd_eps), rtol=1e-6)
    np.testing.assert_allclose(float(grads[2]), float(fd_delta), rtol=1e-6)
    # Larger coefficients (more sensitivity) need more noise; a larger epsilon or delta needs less.
    assert np.all(np.asarray(grads[0]) > 0) and float(grads[1]) < 0 and float(grads[2]) < 0


def test_calibration_core_from_float32_caller_and_status():
    """From float32 code the host method gives the float64 root of the core (the same draws:
    an int seed is ``jax.random.key(seed)``); under jit the core needs x64 on, and says so; an
    unreachable target (epsilon = 1e-9: half the losses are positive at any sigma) names the target."""
    bands = bm.band_table(np.array([1.0, 0.6]), N, B)
    sigma = BMinSep(np.array([1.0, 0.6]), P, B, N).calibrate(1.5, 0.02, M, key=3)
    with jax.enable_x64(True):
        ref = float(_VALUE_AND_GRAD(np.array([1.0, 0.6]), 1.5, 0.02)[0])
    assert abs(sigma - ref) <= 1e-12 * ref  # two programs, the same bisection on the same sums
    with pytest.raises(ValueError, match="x64"):
        jax.jit(functools.partial(bm.calibrate_on_samples, min_sep=B, num_samples=M))(
            jnp.asarray(bands, jnp.float32), 1.5, 0.02, P, jax.random.key(3))
    # p = 1, b = 1: no amplification.  16 rounds and 2^14 draws: the compiled calibration of
    # test_calibrate_solves_the_estimate_and_matches_poisson (the sampling probability is data).
    acc = BMinSep(np.array([1.0]), 1.0, 1, 16)
    with pytest.raises(ValueError, match="not reached"):
        acc.calibrate(1e-9, 1e-12, 1 << 14)


# --------------------------------------------------------------------------- certificates

P_CERT, STEPS, EPS, TARGET, M_CERT = 0.2, 8, 1.0, 0.05, 1 << 13


def _ladder_false_releases(attempts, first_key):
    """Ladder certificates at the Poisson configuration; returns (false releases, releases,
    stated failure probability, certificates)."""
    acc = BMinSep(np.array([1.0]), P_CERT, 1, STEPS)
    false, released, certs = 0, 0, []
    for k in range(first_key, first_key + attempts):
        cert = acc.certify_noise(EPS, TARGET, key=k, num_samples=M_CERT)
        certs.append(cert)
        if not cert.verified:
            continue
        released += 1
        exact = float(dpjax.dpsgd_delta(cert.noise_multiplier, P_CERT, STEPS, EPS))
        false += exact > cert.tau * cert.base_delta
    return false, released, certs


def _check_ladder(attempts, first_key):
    false, released, certs = _ladder_false_releases(attempts, first_key)
    rates = {c.failure_probability for c in certs}
    assert len(rates) == 1
    rate = rates.pop()
    cert = certs[0]
    assert cert.method == "bernoulli_kl" and cert.procedure == "ladder"
    assert cert.num_samples == M_CERT and cert.calibration_samples == M_CERT // 4
    assert 0 < rate < 1e-2 and cert.delta <= TARGET
    assert released >= 0.9 * attempts  # the ladder reaches a verified rung almost always
    assert _false_release_count_is_consistent(false, attempts, rate), (false, attempts, rate)
    return false, released, rate


def test_certify_noise_ladder_is_sound_against_poisson():
    false, released, rate = _check_ladder(50, first_key=1000)
    print(f"ladder: {false} false releases of {released} releases in 50 attempts, stated rate {rate:.3g}")


@pytest.mark.slow
def test_certify_noise_ladder_is_sound_against_poisson_many_attempts():
    false, released, rate = _check_ladder(2000, first_key=100_000)
    print(f"ladder: {false} false releases of {released} releases in 2000 attempts, stated rate {rate:.3g}")


def test_certify_fixed_record_and_verdicts():
    """One test at a fixed sigma: verified well above the calibrated sigma, not verified below
    it; the record states method, sample count and failure probability, and a verified delta is
    within the target."""
    acc = BMinSep(np.array([1.0]), P_CERT, 1, STEPS)
    sigma = acc.calibrate(EPS, TARGET, M_CERT // 4, key=7)
    good = acc.certify(1.3 * sigma, EPS, TARGET, M_CERT, key=8)
    bad = acc.certify(0.8 * sigma, EPS, TARGET, M_CERT, key=8)
    assert good.verified and not bad.verified
    assert good.method == "bernoulli_kl" and good.num_samples == M_CERT and good.num_tests == 1
    assert 0 < good.failure_probability < TARGET and good.delta <= TARGET
    assert bad.delta == math.inf
    assert float(dpjax.dpsgd_delta(1.3 * sigma, P_CERT, STEPS, EPS)) <= good.delta
