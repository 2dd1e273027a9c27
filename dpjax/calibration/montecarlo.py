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
``delta_estimate(...) == target_delta``.  Above ``MAX_PRECOMPUTED`` entries ``m * b`` the
calibration instead calls the chunked :func:`dpjax.montecarlo.delta_estimate` at every step
(bounded memory, same numbers, slower).

What this is and is not.  ``sigma*`` solves the *estimate* (the optimisation loop's use,
Choquette-Choo et al. 2024, §5.1.4: few samples while optimising).  It is not a certificate: certify the final
``(C, sigma)`` with :meth:`dpjax.montecarlo.BallsInBins.certify` and many samples.

Where the code lives.  :func:`calibrated_noise` is defined here; the solvers it shares with the
Monte Carlo layer (:func:`calibrated_noise_core`, :func:`calibrate_accountant`,
:func:`estimate_minimum_samples`, :class:`NewtonIllinois`, :class:`Bisection`,
:func:`calibrate_on_draws` with its :class:`DrawPlan`) live in :mod:`dpjax.montecarlo.calibrate`
and are re-exported here,
so ``BallsInBins.calibrate`` and Estimate-Verify-Release never import this layer.

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

import jax

from dpjax._base import validate as _validate
from dpjax.numerics.root import ImplicitAdjoint
from dpjax._base.x64 import float64
from dpjax.matrices import correlation_array
from dpjax.montecarlo.calibrate import (DEFAULT_NUM_ITERATIONS, Bisection, DrawPlan, NewtonIllinois,
                                        calibrate_accountant, calibrate_on_draws,
                                        calibrated_noise_core, estimate_minimum_samples,
                                        raise_on_status)
from dpjax.montecarlo.core import as_prng_key, gram_matrix

#: The Monte Carlo calibration's public names (:mod:`dpjax.montecarlo.calibrate`) and
#: :func:`calibrated_noise`, defined here.
__all__ = ["calibrated_noise", "calibrated_noise_core", "calibrate_accountant", "estimate_minimum_samples",
           "DEFAULT_NUM_ITERATIONS", "Bisection", "NewtonIllinois", "calibrate_on_draws", "DrawPlan"]


@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7, 8, 9))
def _calibrate_jit(correlation, target_epsilon, target_delta, key, b, epochs, num_samples,
                   num_iterations, adjoint, solver=None):
    gram = gram_matrix(correlation, b, epochs)
    if solver is not None:
        return calibrate_on_draws(gram, target_epsilon, target_delta, DrawPlan(key=key, num_samples=num_samples),
                                  solver=solver, adjoint=adjoint)
    return calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples,
                                 num_iterations=num_iterations, adjoint=adjoint)


def _is_tracer(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


@float64(rounding="up")
def calibrated_noise(correlation, batches_per_epoch: int, epochs: int, *, target_epsilon,
                     target_delta, num_samples: int, key,
                     num_iterations: int = DEFAULT_NUM_ITERATIONS, adjoint=ImplicitAdjoint(),
                     solver=None):
    """Noise multiplier calibrated on the Monte Carlo estimate; differentiable in ``C``.

    Solves ``delta_hat(sigma; C, target_epsilon) = target_delta`` (balls-in-bins dominating
    pair of :mod:`dpjax.montecarlo.core`, both directions, ``num_samples`` common random
    numbers from ``key``) by ``num_iterations`` bisection steps in ``log sigma`` over
    ``[1e-3, 1e4] x`` the sensitivity (default 50: bracket ~1.4e-14 relative), returning the
    upper end of the final bracket; ``jax.grad`` gives ``d sigma*/d C`` by implicit
    differentiation.  Usable under ``grad``/``vmap`` from float32 code, and inside ``jit``
    traced with x64 on (inside a ``jit`` traced with x64 off it raises a ``ValueError`` naming
    the fix; see :mod:`dpjax._base.x64`).  With traced inputs, validation of traced values is
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
      solver: ``None`` (bisection of ``num_iterations`` steps), :class:`Bisection` or
        :class:`NewtonIllinois` (a few passes; the same root to ~1e-11 relative).

    Returns:
      scalar array ``sigma*`` (noise std / clip norm), computed in float64 (float32, rounded
      up, when returned to a traced float32 caller).  Not a certificate: certify the
      final ``(C, sigma)`` with many samples (:meth:`dpjax.montecarlo.BallsInBins.certify`).

    Raises:
      ValueError: bad input; a target delta below what ``num_samples`` can resolve (says the
        minimum); a target no sigma in the search range reaches.
    """
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    epochs = _validate.positive_int("epochs", epochs)
    m = _validate.positive_int("num_samples", num_samples)
    # The one validation of C (shape, dtype; values when concrete), before tracing.
    correlation = correlation_array(correlation, b * epochs)
    concrete = not _is_tracer((target_epsilon, target_delta))
    if concrete:
        _validate.PrivacyTarget(target_epsilon, target_delta)
    key = as_prng_key(key)
    if solver is not None and not isinstance(solver, (Bisection, NewtonIllinois)):
        raise ValueError(f"solver must be None, Bisection(...) or NewtonIllinois(...), got {solver!r}")
    res = _calibrate_jit(correlation, target_epsilon, target_delta, key, b, epochs, m,
                         num_iterations, adjoint, solver)
    if concrete and not _is_tracer((correlation, key)):
        raise_on_status(res, target_epsilon, target_delta)
    return res.root
