"""Estimate-Verify-Release procedures: every test a procedure can run is in its stated failure
probability (union bound), whatever the procedure (single test, ladder, baseline row)."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins, evr


def _counting_verifier(monkeypatch, method, pass_at=None):
    """Make every verification test fail, except test number ``pass_at`` (1-based), which passes;
    record each test's failure bound.  ``"bernoulli_kl"``: a test is one call of
    ``BallsInBins.estimate`` on the verification path (calibration does not call it; its bound is
    computed from the certificate's (m, base, tau)).  ``"importance_betting"``: a test is one call
    of ``evr._betting_test``, whose bound is ``exp(-log_inv_beta)``."""
    calls = []
    if method == "bernoulli_kl":
        real = BallsInBins.estimate

        def fake(self, *args, **kwargs):
            est = real(self, *args, **kwargs)
            calls.append(None)
            value = 0.0 if len(calls) == pass_at else 1.0
            fill = np.full_like(est.delta, value)
            return dataclasses.replace(est, delta=fill, delta_remove=fill, delta_add=fill)

        monkeypatch.setattr(BallsInBins, "estimate", fake)
    else:
        real = evr._betting_test

        def fake(accountant, sigma, eps, key, n, proposal, bets, level, log_inv_beta, ranges, devices=None):
            _, out = real(accountant, sigma, eps, key, n, proposal, bets, level, log_inv_beta, ranges, devices)
            calls.append(math.exp(-log_inv_beta))
            return len(calls) == pass_at, out

        monkeypatch.setattr(evr, "_betting_test", fake)
    return calls


def _procedures(method):
    from dpjax.optimization import baselines as bl
    from dpjax.optimization.certify import CertifySettings, certify_noise

    corr = Toeplitz(jnp.array([1.0, 0.5]))
    m = 1 << 14

    def baseline_row():
        row = bl.balls_in_bins_certified(corr, 2.0, 1e-2, 2, 2,
                                         settings=CertifySettings(num_samples=m, key=3, method=method))
        return row.certificate

    def ladder():
        return certify_noise(corr, 2, 2, target_epsilon=2.0, target_delta=1e-2,
                             settings=CertifySettings(num_samples=m, key=3, method=method))

    return {"baseline_row": baseline_row, "ladder": ladder}


@pytest.mark.parametrize("name,method", [
    ("baseline_row", "bernoulli_kl"), ("ladder", "bernoulli_kl"), ("ladder", "importance_betting"),
    pytest.param("baseline_row", "importance_betting", marks=pytest.mark.slow),  # the same ladder, ~1 min
])
def test_stated_failure_probability_counts_every_test(monkeypatch, name, method):
    """Run the procedure with every verification failing to learn how many tests it can run
    (K), then again with only the K-th passing: the released certificate's failure
    probability must be at least the sum of the K tests' bounds (Bernoulli KL: K times
    exp(-m KL(base || tau base)) at its own (m, base, tau)), and its delta at least its verified
    level plus that."""
    run = _procedures(method)[name]
    calls = _counting_verifier(monkeypatch, method)
    try:
        cert = run()
        assert not _get(cert, "verified")
    except ValueError:
        pass  # refusing to release is allowed
    k = len(calls)
    assert k >= 1
    monkeypatch.undo()
    calls = _counting_verifier(monkeypatch, method, pass_at=k)
    cert = run()
    assert _get(cert, "verified") and len(calls) == k and _get(cert, "method") == method
    m, base, tau = _get(cert, "num_samples"), _get(cert, "base_delta"), _get(cert, "tau")
    bounds = [evr.failure_probability(m, base, tau) if b is None else b for b in calls]
    assert _get(cert, "failure_probability") >= sum(bounds) * (1 - 1e-12), (k, bounds)
    assert _get(cert, "delta") >= tau * base + sum(bounds) * (1 - 1e-12)
    assert _get(cert, "delta") <= 1e-2


def _get(cert, field):
    return cert[field] if isinstance(cert, dict) else getattr(cert, field)


# ----------------------------------------------------------------------------- variance-reduced


def test_betting_certificate_fixed_verified_and_not():
    acc = BallsInBins(Toeplitz(jnp.array([1.0, 0.5, 0.25])), 8, 4)
    ok = acc.certify(3.0, 4.0, 1e-3, 1 << 14, key=5, method="importance_betting")
    assert ok.verified and ok.method == "importance_betting" and ok.num_tests == 1
    assert ok.delta <= 1e-3 and ok.failure_probability == pytest.approx(0.005 * 1e-3)
    # delta = level + beta + the sampler's allowance (the law of the draws vs the ideal proposal).
    allowance = evr._sampler_allowance(8)
    assert 0 < allowance < 1e-10
    assert ok.delta == pytest.approx(ok.base_delta + ok.failure_probability + allowance, rel=1e-12, abs=1e-15)
    assert ok.range_remove > 0 and ok.range_add > 0
    # The certificate names the verification's sampling law (chosen on the calibration draws),
    # and keeps it through JSON; a plain certificate says "plain".
    assert ok.proposal.startswith("defensive ") and "per-mode range" in ok.proposal
    assert type(ok).from_dict(ok.to_dict()).proposal == ok.proposal
    assert acc.certify(3.0, 4.0, 1e-3, 1 << 14, key=5, method="bernoulli_kl").proposal == "plain"
    bad = acc.certify(0.6, 1.0, 1e-3, 1 << 14, key=5, method="importance_betting")
    assert not bad.verified and bad.delta == math.inf and bad.delta_estimate > 1e-3


def test_betting_ladder_counts_every_rung_and_releases_near_the_estimate():
    acc = BallsInBins(Toeplitz(jnp.array([1.0, 0.5])), 16, 4)
    cert = evr.certify_noise(acc, target_epsilon=2.0, target_delta=1e-3, num_samples=1 << 16, key=1,
                             method="importance_betting")
    assert cert.verified and cert.procedure == "ladder" and cert.num_tests == evr.DEFAULT_LADDER_RUNGS
    assert cert.failure_probability == pytest.approx(0.005 * 1e-3)
    assert cert.delta <= 1e-3 and 1 <= cert.tests_run <= cert.num_tests
    # Released within 2% of the calibration estimate (the plain certificate with as many samples
    # cannot certify 1e-3 within 10%).
    assert cert.noise_multiplier_estimate <= cert.noise_multiplier <= 1.02 * cert.noise_multiplier_estimate
    # The released sigma is certified by an independent plain estimate too: its delta is below target.
    plain = acc.estimate(cert.noise_multiplier, [2.0], 1 << 20, 99)
    assert plain.delta[0] < 1e-3


@pytest.mark.parametrize("ladder, match", [
    (evr.Ladder(rungs=0), "rungs"),
    (evr.Ladder(growth=1.0), "growth"),
    (evr.Ladder(calibration_samples=0), "calibration_samples"),
    (evr.Ladder(failure_fraction=0.5), "failure_fraction"),
    ({"rungs": 2}, "ladder must be a dpjax.montecarlo.evr.Ladder"),
])
def test_ladder_is_validated_before_any_draw(ladder, match):
    acc = BallsInBins(Toeplitz(jnp.array([1.0, 0.5])), 4, 2)
    with pytest.raises(ValueError, match=match):
        evr.certify_noise(acc, target_epsilon=2.0, target_delta=1e-3, num_samples=1 << 16, key=1, ladder=ladder)
