"""Optax smoke test: gradient steps on log RMSE of a 2-band Toeplitz C under balls-in-bins
calibration decrease it (docs/design.md §6; the gradient goes through the implicit adjoint)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpjax.optimization import fit, log_rmse_balls_in_bins, toeplitz_from_params

KW = dict(batches_per_epoch=8, epochs=2, target_epsilon=2.0, target_delta=1e-3,
          num_samples=1 << 13, key=jax.random.key(1))


def _loss(p):
    return log_rmse_balls_in_bins(p, **KW)


def test_loss_gradient_matches_finite_differences():
    with jax.enable_x64(True):
        p0 = jnp.array([-1.0])
        value_and_grad = jax.jit(jax.value_and_grad(_loss))
        _, g = value_and_grad(p0)
        h = 1e-5
        fd = (float(value_and_grad(p0 + h)[0]) - float(value_and_grad(p0 - h)[0])) / (2 * h)
    # Same CRN-kink argument as the calibration tests: FD error ~1e-6 relative.
    assert float(g[0]) == pytest.approx(fd, rel=1e-3)


def test_optax_steps_decrease_log_rmse():
    params, losses = fit(_loss, jnp.array([-2.0]), optax.adam(0.2), num_steps=6)
    assert len(losses) == 6 and all(np.isfinite(losses))
    # At c1 = softplus(-2) = 0.13 the negative correlation of C^{-1} still lowers the prefix-sum
    # error faster than the calibrated sigma grows, so the loss must go down along the steps.
    assert losses[-1] < losses[0] - 1e-3
    assert float(toeplitz_from_params(params).coeffs[1]) > float(jax.nn.softplus(-2.0))
