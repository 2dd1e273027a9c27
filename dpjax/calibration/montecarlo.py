"""Noise calibration for matrix mechanisms under balls-in-bins batching.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near Exact Privacy Amplification for Matrix
Mechanisms" (2024), §4.1, Alg. 2.  Built on the public Monte Carlo core
(:mod:`dpjax.montecarlo.core`: draws, privacy losses, estimators); the correlation matrix is
validated by :func:`dpjax.matrices.correlation_array`.

For a correlation matrix ``C`` (``n = b * E`` rounds) and a fixed Monte Carlo sample
``(I_j, U_j)_{j<m}`` (common random numbers, drawn once from ``key``), the estimate
``delta_hat(sigma; C)`` of :func:`dpjax.montecarlo.delta_estimate` (max over the P||Q and Q||P directions) is a
deterministic, continuous, piecewise-smooth function of ``(sigma, C)``.  The calibrated noise
multiplier ``sigma*(C)`` is the smallest ``sigma`` with ``delta_hat(sigma; C) <= target_delta``
at ``target_epsilon``; it is found by fixed-length bisection in ``log sigma`` (50 halvings of a
bracket of log-width ln(1e7): relative width ~1.4e-14, so finite differences can check the
gradient) and differentiated by the implicit function theorem (Choquette-Choo et al. 2024, §4.2)::

    d sigma*/d C = -(d delta_hat/d C) / (d delta_hat/d sigma)     at (sigma*, C)

through :class:`~dpjax.calibration.root.ImplicitAdjoint`.

Cost.  The draws ``U`` ``(m, b)`` and ``W = U L^T`` (``L L^T = G``, the Gram matrix of the
modes) do not depend on ``sigma``, so they are computed once per calibration, outside the
bisection loop; each bisection step is one pass of ``logsumexp`` over ``(m, b)`` logits.  The
draws are exactly those of :func:`dpjax.montecarlo.delta_estimate` for the same key (its stream
depends only on ``(key, b, sample index)``), so the calibrated sigma reproduces
``delta_estimate(...) == target_delta``.  Above ``_MAX_PRECOMPUTED`` entries ``m * b`` the
calibration instead calls the chunked :func:`dpjax.montecarlo.delta_estimate` at every step
(bounded memory, same numbers, slower).

What this is and is not.  ``sigma*`` solves the *estimate* (the optimisation loop's use,
Choquette-Choo et al. 2024, §5.1.4: few samples while optimising).  It is not a certificate: certify the final
``(C, sigma)`` with :meth:`dpjax.montecarlo.BallsInBins.certify` and many samples.

Usage::

    import jax, jax.numpy as jnp
    from dpjax.matrices import Toeplitz
    from dpjax.calibration import calibrated_noise   # (not re-exported by dpjax.montecarlo)

    C = Toeplitz(jnp.array([1.0, 0.3]))
    sigma = calibrated_noise(C, 8, 2, target_epsilon=2.0, target_delta=1e-3,
                             num_samples=1 << 14, key=jax.random.key(0))
    dsigma = jax.grad(lambda c: calibrated_noise(
        Toeplitz(c), 8, 2, target_epsilon=2.0, target_delta=1e-3,
        num_samples=1 << 14, key=jax.random.key(0)))(jnp.array([1.0, 0.3]))
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._x64 import float64
from dpjax.calibration.root import (ImplicitAdjoint, RootResult, SolverStatus,
                                    StopGradientAdjoint, solve_monotone_root)
from dpjax.matrices import correlation_array
from dpjax.montecarlo import (as_prng_key, delta_estimate, delta_from_projections, draws,
                              gram_matrix, gram_sqrt)

__all__ = [
    "calibrated_noise_core",
    "calibrated_noise",
    "calibrate_accountant",
    "estimate_minimum_samples",
    "DEFAULT_NUM_ITERATIONS",
]

#: Bisection length: 50 halvings of log(1e7) -> relative bracket width 1.4e-14.
DEFAULT_NUM_ITERATIONS = 50
#: Search range for sigma, relative to the l2-sensitivity max_i |m_i|_2 of the mechanism:
#: amplification only lowers sigma below the unamplified Gaussian one, which for any
#: eps >= 1e-3, delta >= 1e-300 is < 1e4 * sensitivity; 1e-3 * sensitivity makes
#: delta_hat ~ 1 for any eps <~ 1e5.
_BRACKET_RELATIVE = (1e-3, 1e4)
#: Largest m * b (float64 entries) for which the projections W are materialised (128 MiB).
_MAX_PRECOMPUTED = 1 << 24


def estimate_minimum_samples(target_delta: float) -> int:
    """Fewest Monte Carlo samples a calibration accepts for ``target_delta``: ``ceil(1 / delta)``.

    An estimate of delta from ``m`` samples cannot resolve deltas below ~1/m (a single sample
    contributes up to 1/m).  This is a floor for the *estimate*; certifying with
    Estimate-Verify-Release needs more (:func:`dpjax.montecarlo.evr_minimum_samples`).
    """
    return int(math.ceil(1.0 / float(target_delta)))


def calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples: int, *,
                          num_iterations: int = DEFAULT_NUM_ITERATIONS,
                          adjoint=ImplicitAdjoint(), precompute: bool | None = None) -> RootResult:
    """Jittable core: ``sigma*`` with ``delta_hat(sigma*; G) = target_delta`` (safe side).

    Args:
      gram: ``(b, b)`` Gram matrix (:func:`dpjax.montecarlo.gram_matrix`); gradients flow to it (and to whatever
        produced it) through ``adjoint``.
      target_epsilon, target_delta: scalars (differentiable).
      key: PRNG key of the common random numbers.
      num_samples: static ``m``.
      num_iterations: static bisection length.
      precompute: materialise ``W`` (default: when ``m * b <= 2^24``).

    Returns:
      :class:`~dpjax.calibration.root.RootResult` (``root`` is the upper end of the final
      bracket: ``delta_hat(root) <= target_delta``).
    """
    gram = jnp.asarray(gram, jnp.float64)
    b = gram.shape[0]
    eps = jnp.asarray(target_epsilon, jnp.float64)
    if precompute is None:
        precompute = num_samples * b <= _MAX_PRECOMPUTED
    sensitivity = jnp.sqrt(jnp.max(jnp.diagonal(gram)))
    bracket = jax.lax.stop_gradient(
        (_BRACKET_RELATIVE[0] * sensitivity, _BRACKET_RELATIVE[1] * sensitivity))
    if precompute:
        mode_index, u = draws(key, b, num_samples)
        projections = u @ gram_sqrt(gram).T  # (m, b) ~ N(0, G); no sigma dependence

        def fn(sigma, theta):
            g, w, e = theta
            return delta_from_projections(g, w, mode_index, sigma, e)

        theta = (gram, projections, eps)
    else:
        def fn(sigma, theta):
            g, e = theta
            return delta_estimate(g, sigma, e, key, num_samples)[0]

        theta = (gram, eps)
    return solve_monotone_root(fn, theta, jnp.asarray(target_delta, jnp.float64), bracket,
                               decreasing=True, num_iterations=num_iterations, log_scale=True,
                               adjoint=adjoint)


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7, 8))
def _calibrate_jit(correlation, target_epsilon, target_delta, key, b, epochs, num_samples,
                   num_iterations, adjoint):
    gram = gram_matrix(correlation, b, epochs)
    return calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples,
                                 num_iterations=num_iterations, adjoint=adjoint)


def _is_tracer(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@float64
def calibrated_noise(correlation, batches_per_epoch: int, epochs: int, *, target_epsilon,
                     target_delta, num_samples: int, key,
                     num_iterations: int = DEFAULT_NUM_ITERATIONS, adjoint=ImplicitAdjoint()):
    """Noise multiplier calibrated on the Monte Carlo estimate; differentiable in ``C``.

    Solves ``delta_hat(sigma; C, target_epsilon) = target_delta`` (balls-in-bins dominating
    pair of :mod:`dpjax.montecarlo.core`, both directions, ``num_samples`` common random
    numbers from ``key``) by ``num_iterations`` bisection steps in ``log sigma`` over
    ``[1e-3, 1e4] x`` the sensitivity (default 50: bracket ~1.4e-14 relative), returning the
    upper end of the final bracket; ``jax.grad`` gives ``d sigma*/d C`` by implicit
    differentiation.  Usable under ``grad``/``vmap`` from float32 code, and inside ``jit``
    traced with x64 on (inside a ``jit`` traced with x64 off it raises a ``ValueError`` naming
    the fix; see :mod:`dpjax._x64`).  With traced inputs, validation of traced values is
    skipped and an unreachable target gives NaN instead of raising.

    Its home is the calibration layer: ``dpjax.calibration.calibrated_noise`` (it is not
    re-exported by :mod:`dpjax.montecarlo`, which the calibration layer builds on).

    Args:
      correlation: ``C``: :class:`~dpjax.matrices.Toeplitz`, :class:`~dpjax.matrices.BLT`, a
        1-D array (a Toeplitz first column, zero-padded: banded), or a dense ``(n, n)``
        lower-triangular non-negative array with ``n = b * E``.
      batches_per_epoch: ``b`` (static int).
      epochs: ``E`` (static int).
      target_epsilon: > 0.
      target_delta: in (0, 1); needs ``num_samples >= ceil(1/target_delta)``.
      num_samples: static int ``m``.
      key: JAX PRNG key (typed or raw ``uint32[2]``).
      num_iterations: static bisection length.
      adjoint: :class:`~dpjax.calibration.ImplicitAdjoint` (default) or
        :class:`~dpjax.calibration.StopGradientAdjoint`.

    Returns:
      scalar array ``sigma*`` (noise std / clip norm), computed in float64 (float32 when
      returned to a traced float32 caller).  Not a certificate: certify the
      final ``(C, sigma)`` with many samples (:meth:`dpjax.montecarlo.BallsInBins.certify`).

    Raises:
      ValueError: bad input; a target delta below what ``num_samples`` can resolve (says the
        minimum); a target no sigma in the search range reaches.
    """
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    epochs = _validate.positive_int("epochs", epochs)
    m = _validate.positive_int("num_samples", num_samples, minimum=2)
    # The one validation of C (shape, dtype; values when concrete), before tracing.
    correlation = correlation_array(correlation, b * epochs)
    concrete = not _is_tracer((target_epsilon, target_delta))
    if concrete:
        _check_targets(target_epsilon, target_delta, m)
    key = as_prng_key(key)
    res = _calibrate_jit(correlation, target_epsilon, target_delta, key, b, epochs, m,
                         num_iterations, adjoint)
    if concrete and not _is_tracer((correlation, key)):
        _raise_on_status(res, target_epsilon, target_delta)
    return res.root


def _check_targets(target_epsilon, target_delta, m):
    _validate.positive("target_epsilon", target_epsilon)
    _validate.probability_open("target_delta", target_delta)
    if m < estimate_minimum_samples(target_delta):
        raise ValueError(
            f"target_delta={float(target_delta):g} is below what num_samples={m} can "
            f"resolve: use num_samples >= {estimate_minimum_samples(target_delta)} (about 1/delta)")


def _raise_on_status(res: RootResult, target_epsilon, target_delta):
    status = int(res.status)
    if status == SolverStatus.UNREACHABLE:
        raise ValueError(
            f"target (epsilon={float(target_epsilon):g}, delta={float(target_delta):g}) is "
            f"not reached by any noise multiplier up to {_BRACKET_RELATIVE[1]:g} x "
            "sensitivity; increase target_epsilon or target_delta")
    if status == SolverStatus.MET_AT_BRACKET_END:
        raise ValueError(
            f"target (epsilon={float(target_epsilon):g}, delta={float(target_delta):g}) is met "
            f"even at noise multiplier {float(res.root):g} = {_BRACKET_RELATIVE[0]:g} x "
            "sensitivity (the bottom of the search range): the target is vacuous; lower "
            "target_epsilon")


@functools.partial(jax.jit, static_argnums=(4, 5))
def _calibrate_gram_jit(gram, target_epsilon, target_delta, key, num_samples, num_iterations):
    return calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples,
                                 num_iterations=num_iterations, adjoint=StopGradientAdjoint())


@float64
def calibrate_accountant(accountant, target_epsilon, target_delta, num_samples, key, *,
                         num_iterations: int = DEFAULT_NUM_ITERATIONS) -> float:
    """Noise multiplier calibrated on the estimate of a :class:`~dpjax.montecarlo.BallsInBins`.

    The implementation of ``BallsInBins.calibrate``: ``delta_hat(sigma) = target_delta`` at
    ``target_epsilon`` with ``num_samples`` common random numbers from ``key`` (JAX key or int
    seed), solved to ~1e-14 relative; the upper end of the final bracket is returned.  The
    same draws as ``accountant.delta(sigma, target_epsilon, num_samples, key)``, so that call
    at the returned sigma gives ``<= target_delta``.  An estimate, not a certificate: follow
    with ``accountant.certify(sigma, ...)`` (more samples, and ``target_delta`` above the
    calibration delta to leave room for the Estimate-Verify-Release slack).

    Raises:
      ValueError: bad input; ``num_samples < ceil(1/target_delta)`` (says the minimum);
        unreachable or vacuous targets.
    """
    m = _validate.positive_int("num_samples", num_samples, minimum=2)
    _check_targets(target_epsilon, target_delta, m)
    res = _calibrate_gram_jit(jnp.asarray(accountant.gram, jnp.float64),
                              float(target_epsilon), float(target_delta), as_prng_key(key), m,
                              num_iterations)
    _raise_on_status(res, target_epsilon, target_delta)
    return float(res.root)
