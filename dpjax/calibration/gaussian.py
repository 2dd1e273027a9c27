"""Exact calibration of the (T-fold) Gaussian mechanism -- the analytic oracle.

``T`` compositions of the Gaussian mechanism with noise multiplier ``sigma`` (sensitivity 1) are
exactly one Gaussian mechanism with ``s = sigma / sqrt(T)`` (Balle & Wang 2018; Koskela & Honkela,
"Computing Differential Privacy Guarantees for Heterogeneous Compositions Using FFT", 2021); the
curve itself is defined once, in :mod:`dpjax.numerics.exact` (``mu = 1/s``)::

    delta(eps; s) = Phi(-eps*s + 1/(2s)) - e^eps * Phi(-eps*s - 1/(2s))

It is smooth and strictly decreasing in both ``eps`` and ``sigma``, and its partials are closed
form (``d delta/d sigma = -phi(-eps*s + 1/(2s)) / (s^2 sqrt(T))``,
``d delta/d eps = -e^eps Phi(-eps*s - 1/(2s))``), which makes it the reference problem for the
generic calibration machinery in :mod:`dpjax.calibration.root`.

Usage::

    from dpjax.calibration import gaussian_noise_multiplier
    gaussian_noise_multiplier(1.0, 1e-5, steps=16)   # 14.9225... (= 4 * 3.7306..., s = sigma/4)
"""

from __future__ import annotations

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base import validate as _validate
from dpjax._base.x64 import float64, host_only
from dpjax.numerics.exact import gaussian_log_delta, gaussian_log_delta_upper
from dpjax.calibration.root import (ImplicitAdjoint, SolverStatus, StopGradientAdjoint,
                                    solve_monotone_root)
from dpjax.numerics.root import UPPER_ROOT_ROUNDING
from dpjax._base import xla as _xla

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

__all__ = ["composed_gaussian_delta", "gaussian_noise_multiplier_core", "gaussian_noise_multiplier"]

# Search range for the per-composition-normalised s = sigma/sqrt(T).  delta(eps; s) -> 1 as
# s -> 0 and <= exp(-(eps*s)^2/2)-ish as s grows, so every (eps >= 1e-4, delta >= 1e-300) target
# is reached inside; targets outside raise (never a clipped sigma).
_S_BRACKET = (1e-4, 1e7)


@float64
def composed_gaussian_delta(epsilon, noise_multiplier, steps=1):
    """Tight delta(epsilon) of ``steps`` Gaussian mechanisms; pure, jittable, differentiable.

    The calibration's parametrisation of :func:`dpjax.pld.gaussian_delta` (the one definition
    of the formula): ``mu = sqrt(steps) / noise_multiplier`` (sensitivity 1).

    Args:
      epsilon: scalar/array >= 0.
      noise_multiplier: scalar/array > 0 (noise std / sensitivity).
      steps: scalar/array >= 1 (may be a float: the formula only uses ``sqrt(steps)``).

    Returns:
      delta, broadcast shape of the inputs.
    """
    return jnp.exp(_log_delta(epsilon, noise_multiplier, steps))


def _mu(noise_multiplier, steps):
    return jnp.sqrt(jnp.asarray(steps, jnp.float64)) / jnp.asarray(noise_multiplier, jnp.float64)


def _log_delta(epsilon, noise_multiplier, steps):
    return gaussian_log_delta(epsilon, _mu(noise_multiplier, steps))


def _log_delta_upper(epsilon, noise_multiplier, steps):
    return gaussian_log_delta_upper(jnp.asarray(epsilon, jnp.float64), _mu(noise_multiplier, steps))


@float64(rounding=UPPER_ROOT_ROUNDING)
def gaussian_noise_multiplier_core(target_epsilon, target_delta, steps=1, *,
                                   num_iterations: int = 64, adjoint=ImplicitAdjoint()):
    """Jittable core: smallest sigma with ``composed_gaussian_delta(target_epsilon, sigma, steps) <= target_delta``.

    Scalars in, a :class:`~dpjax.calibration.root.Solution` out (``vmap`` for batches).
    Differentiable in ``target_epsilon``, ``target_delta`` and ``steps`` through ``adjoint``.
    """
    steps = jnp.asarray(steps, jnp.float64)
    sqrt_t = jnp.sqrt(steps)
    theta = (jnp.asarray(target_epsilon, jnp.float64), steps)
    bracket = (_S_BRACKET[0] * sqrt_t, _S_BRACKET[1] * sqrt_t)
    # Bisection on log delta: log keeps the comparison meaningful down to delta ~ 1e-300.  On
    # an upper bound of it (the closed form's rounding margin, dpjax.numerics.exact), so that
    # the returned upper end has delta <= target_delta in exact arithmetic too.
    fn = lambda sigma, th: _log_delta_upper(th[0], sigma, th[1])
    return solve_monotone_root(fn, theta, jnp.log(jnp.asarray(target_delta, jnp.float64)),
                               jax.lax.stop_gradient(bracket), decreasing=True,
                               num_iterations=num_iterations, log_scale=True, adjoint=adjoint)


@_xla.jit
def _batched(eps, delta, steps):
    core = lambda e, d, t: gaussian_noise_multiplier_core(e, d, t, adjoint=StopGradientAdjoint())
    return jax.vmap(core)(eps, delta, steps)


@host_only("dpjax.calibration.gaussian_noise_multiplier_core")
@float64(rounding="up")
def gaussian_noise_multiplier(target_epsilon, target_delta, steps=1):
    """Smallest noise multiplier of ``steps`` composed Gaussian mechanisms meeting (eps, delta).

    Exact analytic accounting (no discretisation); the returned value is the upper end of a
    bisection bracket of relative width < 1e-15 on an upper bound of ``log delta`` (the closed
    form plus its rounding margin, :func:`dpjax.numerics.exact.gaussian_log_delta_upper`), so
    its delta is <= ``target_delta``.

    Args:
      target_epsilon: > 0, scalar or array.
      target_delta: in (0, 1), scalar or array.
      steps: integer >= 1, scalar or array.

    Returns:
      float (scalar inputs) or float64 ndarray (broadcast shape).

    Raises:
      ValueError: bad input, or a target no sigma in ``[1e-4, 1e7] * sqrt(steps)`` reaches.
    """
    target = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, delta = target.epsilon, target.delta
    steps_arr = _validate.positive("steps", steps)
    if np.any(steps_arr < 1) or np.any(steps_arr != np.floor(steps_arr)):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    eps, delta, steps_arr = np.broadcast_arrays(eps, delta, steps_arr)
    shape = eps.shape
    res = _batched(eps.ravel(), delta.ravel(), steps_arr.ravel())
    status = np.asarray(res.status)
    if np.any(status != SolverStatus.CONVERGED):
        bad = int(np.argmax(status != SolverStatus.CONVERGED))
        raise ValueError(
            f"target (epsilon={eps.ravel()[bad]}, delta={delta.ravel()[bad]}) is outside the "
            f"search range sigma/sqrt(steps) in {_S_BRACKET}; use epsilon >= 1e-4")
    out = np.asarray(res.root).reshape(shape)
    return float(out) if out.ndim == 0 else out
