"""Estimate-Verify-Release procedures: every test a procedure can run is in its stated failure
probability (union bound), whatever the procedure (single test, ladder, baseline row)."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins, evr


def _counting_verifier(monkeypatch, pass_at=None):
    """Make every verification fail (delta_hat = 1), except call number ``pass_at`` (1-based),
    which reports delta_hat = 0; count the calls.  A verification is one call of
    ``BallsInBins.estimate`` on the verification path (calibration does not call it)."""
    calls = []
    real = BallsInBins.estimate

    def fake(self, *args, **kwargs):
        est = real(self, *args, **kwargs)
        calls.append(1)
        value = 0.0 if len(calls) == pass_at else 1.0
        fill = np.full_like(est.delta, value)
        return dataclasses.replace(est, delta=fill, delta_remove=fill, delta_add=fill)

    monkeypatch.setattr(BallsInBins, "estimate", fake)
    return calls


def _procedures():
    from dpjax.optimization import baselines as bl
    from dpjax.optimization.certify import certify_noise

    corr = Toeplitz(jnp.array([1.0, 0.5]))
    m = 1 << 14

    def baseline_row():
        row = bl.balls_in_bins_certified(corr, 2.0, 1e-2, 2, 2, certify_samples=m, key=3)
        return row.extra["certificate"]

    def ladder():
        return certify_noise(corr, 2, 2, target_epsilon=2.0, target_delta=1e-2, num_samples=m, key=3)

    return {"baseline_row": baseline_row, "ladder": ladder}


@pytest.mark.parametrize("name", ["baseline_row", "ladder"])
def test_stated_failure_probability_counts_every_test(monkeypatch, name):
    """Run the procedure with every verification failing to learn how many tests it can run
    (K), then again with only the K-th passing: the released certificate's failure
    probability must be at least K times the single-test bound exp(-m KL(base || tau base)) at
    its own (m, base, tau), and its delta at least tau * base + that."""
    run = _procedures()[name]
    calls = _counting_verifier(monkeypatch)
    try:
        cert = run()
        assert not _get(cert, "verified")
    except ValueError:
        pass  # refusing to release is allowed
    k = len(calls)
    assert k >= 1
    monkeypatch.undo()
    calls = _counting_verifier(monkeypatch, pass_at=k)
    cert = run()
    assert _get(cert, "verified") and len(calls) == k
    m, base, tau = _get(cert, "num_samples"), _get(cert, "base_delta"), _get(cert, "tau")
    single = evr.failure_probability(m, base, tau)
    assert _get(cert, "failure_probability") >= k * single * (1 - 1e-12), (k, single)
    assert _get(cert, "delta") >= tau * base + k * single * (1 - 1e-12)
    assert _get(cert, "delta") <= 1e-2


def _get(cert, field):
    return cert[field] if isinstance(cert, dict) else getattr(cert, field)
