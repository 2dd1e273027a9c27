"""Checks shared by the tests of the participation-chain accountants (BMinSep, RandomAllocation),
whose host methods are one implementation (dpjax.montecarlo._chain.ChainAccountant)."""

from __future__ import annotations

import jax
import numpy as np


def assert_float64_from_float32_caller(acc):
    """With x64 off, the host methods take float32 arguments and answer in float64: the estimate
    equals the x64-on estimate to 1e-12 (float32 arithmetic would differ at ~1e-7), and the loss
    samples are float64."""
    assert not jax.config.jax_enable_x64
    est = acc.estimate(np.float32(0.75), np.float32(1.0), 4096, key=9)
    assert est.delta.dtype == np.float64
    with jax.enable_x64(True):
        ref = acc.estimate(0.75, 1.0, 4096, key=9)
    np.testing.assert_allclose(est.delta, ref.delta, rtol=1e-12)
    remove, _ = acc.privacy_losses(np.float32(0.75), 100, key=9)
    assert remove.dtype == np.float64


def assert_estimate_matches_losses(acc, sigma, eps, m, key):
    """The estimate's record (both directions, the larger reported, the sample count, a KL
    interval around it, decreasing in epsilon on the same draws) and its per-direction means and
    standard errors against the hockey-stick terms of :meth:`privacy_losses` on the same stream.
    Returns the estimate."""
    from dpjax.montecarlo import DeltaEstimate

    est = acc.estimate(sigma, eps, m, key=key)
    assert isinstance(est, DeltaEstimate)
    assert est.num_samples == m and est.confidence == 0.95
    np.testing.assert_array_equal(est.delta, np.maximum(est.delta_remove, est.delta_add))
    assert np.all(est.delta_low <= est.delta) and np.all(est.delta <= est.delta_high)
    assert np.all(np.diff(est.delta) < 0)
    remove, add = acc.privacy_losses(sigma, m, key=key)
    assert remove.shape == add.shape == (m,)
    for losses, mean, se in ((remove, est.delta_remove, est.se_remove), (add, est.delta_add, est.se_add)):
        terms = -np.expm1(np.minimum(eps[None, :] - losses[:, None], 0.0))
        np.testing.assert_allclose(mean, terms.mean(0), rtol=1e-12)
        np.testing.assert_allclose(se, terms.std(0, ddof=1) / np.sqrt(m), rtol=1e-9)
    return est
