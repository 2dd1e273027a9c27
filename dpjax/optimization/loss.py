"""The RMSE objective of matrix-factorization mechanisms under balls-in-bins batching.

``RMSE(C) = sigma*(C) * |A C^{-1}|_F / sqrt(n)`` (docs/design.md §6; Choquette-Choo et al. 2024, §4.2), ``A`` the
prefix-sum workload, ``sigma*(C)`` the noise multiplier calibrated on the Monte Carlo estimate
with common random numbers (:func:`dpjax.calibration.calibrated_noise`).  Its gradient is

    d RMSE/dC = sigma* d|A C^{-1}|_F/dC / sqrt(n) + |A C^{-1}|_F / sqrt(n) * d sigma*/dC,

the second term by implicit differentiation of the calibration.  We minimise the log (scale
free, so one learning rate fits any ``n``).  Use few samples while optimising and certify the
final ``(C, sigma)`` with many (Choquette-Choo et al. 2024, §5.1.4).

Usage::

    import jax, jax.numpy as jnp, optax
    from dpjax.optimization import fit, log_rmse_balls_in_bins

    loss = lambda p: log_rmse_balls_in_bins(p, batches_per_epoch=8, epochs=2,
                                            target_epsilon=2.0, target_delta=1e-3,
                                            num_samples=1 << 13, key=jax.random.key(0))
    params, losses = fit(loss, jnp.array([-2.0]), optax.adam(0.1), num_steps=5)
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from dpjax._base.x64 import float64
from dpjax.matrices import Toeplitz, prefix_sum_rmse
from dpjax.calibration import calibrated_noise


@float64
def toeplitz_from_params(params) -> Toeplitz:
    """``C`` with first column ``[1, softplus(params)...]``: non-negative, diagonal 1 (the
    convention of :class:`dpjax.matrices.Toeplitz`), ``len(params) + 1`` bands.  ``params``:
    ``(k,)`` unconstrained reals."""
    params = jnp.asarray(params, jnp.float64)
    return Toeplitz(jnp.concatenate([jnp.ones((1,), jnp.float64), jax.nn.softplus(params)]))


@float64
def log_rmse_balls_in_bins(params, *, batches_per_epoch: int, epochs: int, target_epsilon,
                           target_delta, num_samples: int, key, to_correlation: Callable = toeplitz_from_params):
    """``log RMSE`` of the prefix-sum workload at the calibrated noise; pure, differentiable.

    Args:
      params: parameters of ``C`` (default: :func:`toeplitz_from_params`).
      batches_per_epoch, epochs: ``b``, ``E`` (static); ``n = b * E``.
      target_epsilon, target_delta: the privacy target of the calibration.
      num_samples: static Monte Carlo sample count (common random numbers from ``key``).
      to_correlation: ``params -> C`` (a Toeplitz/BLT pytree or a dense array).

    Returns:
      scalar float64.
    """
    corr = to_correlation(params)
    sigma = calibrated_noise(corr, batches_per_epoch, epochs, target_epsilon=target_epsilon,
                             target_delta=target_delta, num_samples=num_samples, key=key)
    return jnp.log(prefix_sum_rmse(corr, sigma, batches_per_epoch * epochs))


@float64
def fit(loss_fn: Callable, params, optimizer: optax.GradientTransformation, num_steps: int):
    """Run ``num_steps`` optimizer steps on ``loss_fn(params)``; returns ``(params, losses)``.

    ``losses[k]`` is the loss at the parameters *before* step ``k`` (length ``num_steps``), so
    a decreasing sequence shows the steps help.  The step is one jitted ``value_and_grad``.
    """
    params = jnp.asarray(params, jnp.float64)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        loss, grad = jax.value_and_grad(loss_fn)(params)
        updates, state = optimizer.update(grad, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for _ in range(num_steps):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    return params, losses
