"""Exact (eps, delta) curve of the Gaussian mechanism: the analytic oracle.

One Gaussian mechanism with sensitivity ``Delta`` and noise std ``sigma``, and ``T`` of them
composed, are exactly the Gaussian mechanism with

    mu = sqrt(T) * Delta / sigma

(Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy", ICML 2018, Thm. 8;
Dong, Roth & Su, "Gaussian Differential Privacy", 2019).  Its tight curve is

    delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),

the same for the add and the remove direction.  This module is the one definition of that
curve in dpjax: the Gaussian calibration oracle, the Monte Carlo accountant's unamplified
baseline and the strong-composition baseline all call it.

Numerics.  The subtraction is done in log space,
``log delta = log Phi(a) + log(1 - exp(eps + log Phi(b) - log Phi(a)))`` with
``log Phi = jax.scipy.special.log_ndtr``, so deltas far below 1e-16 (large ``eps``) neither
underflow to 0 in the first term nor cancel to a negative number: relative accuracy ~1e-13
down to delta ~ 1e-300.  ``mu = 0`` (no signal) gives delta 0 exactly.

Rounding.  Where ``delta`` is a small difference of two close terms (small ``mu``, deep tails)
or ``eps`` is large, the computed ``log delta`` can be off by more than the epsilon search's
margin of 1e-12 (measured: up to ~1.5e-9 relative in delta at ``mu ~ 0.002``, delta 1e-78).  So
the search widens its margin to a bound on that rounding error (:func:`_log_delta_error_xp`;
an error model of four ulps per term, amplified by the cancellation) where it exceeds 1e-12,
and also accepts an epsilon where a bound free of the cancellation is below the target
(``delta <= Phi(-w)``, and ``delta <= mu phi(d)``, ``d`` the distance from 0 to
``[w, w + mu]``): at ``mu = 1e-20`` the two terms agree to all digits and delta(0) ~ 0.4 mu was
computed as 0.  Closed-form delta answers widen their relative margin the same way
(:func:`host_gaussian_delta_and_upper`).  Where the bound stays below 1e-12 (ordinary ``mu`` and
delta) the values are unchanged.

Large ``mu`` (``mu >= 1e4``, epsilons above ~5e7).  There ``eps + log Phi(-eps/mu - mu/2)`` is
the difference of two numbers of size ``mu^2 / 2`` whose rounding errors (an ulp of ``mu^2``)
exceed the difference itself: from ``mu ~ 1e8`` on the formula returned delta ~ 0 at epsilons
where the true delta is ~1, and an understated epsilon.  So for ``mu >= 1e4`` ``log delta`` is
the upper bound ``log Phi(-w)``, ``w = eps/mu - mu/2``, which needs no cancellation: with
``z = eps/mu + mu/2`` the identity ``e^eps phi(z) = phi(w)`` gives
``delta = Phi(-w) - phi(w) R(z)``, ``R(z) = Phi(-z)/phi(z) in (0, 1/z)`` (Mills' ratio), so
``Phi(-w) - phi(w)/z <= delta <= Phi(-w)``.  ``w`` is moved down by a bound on its rounding
error (``2^-50 (eps/mu + mu/2)``) and the log by a bound on the truncation of ``log_ndtr``'s
asymptotic series (``210 / x^8`` below -20).  The bound exceeds delta by the factor
``1 / (1 - phi(w) R(z) / Phi(-w))``, about ``1 + (w + 1/w) / mu`` (1e-3 relative at
``mu = 1e4``); the epsilon it gives is above the exact one by about ``mu / (mu + w)``, i.e.
about 1 in ~5e7 and more.

All functions are pure, vectorised (broadcasting), jittable and differentiable, and follow the
float64 contract of :mod:`dpjax._base.x64` (float64 results for float32 callers).

Example::

    from dpjax.pld import gaussian_delta, gaussian_epsilon
    gaussian_delta(1.0, 0.5)            # 0.0207... (one step, sigma = 2)
    gaussian_epsilon(1e-5, 16 ** 0.5 / 10.0)   # 16 steps at noise multiplier 10
"""

from __future__ import annotations

import math

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base.x64 import float64
from dpjax._base import ops as _ops
from dpjax._base import traced as _traced
from dpjax._base import xla as _xla
from dpjax.numerics.root import HostBisection

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")
_jax_special = _lazy_module("jax.scipy.special")

__all__ = ["gaussian_delta", "gaussian_log_delta", "gaussian_epsilon", "np_gaussian_log_delta"]

#: ``mu`` from which ``log delta`` is the cancellation-free upper bound ``log Phi(-w)`` (module
#: docstring): below it the exact formula's rounding error stays inside the bisection's margin.
MU_LARGE = 1e4
#: Relative bound on the rounding error of ``w = eps/mu - mu/2`` (in units of
#: ``eps/mu + mu/2``): two roundings of at most 2^-53 each, taken four times over.
_W_ROUNDING = 2.0 ** -50
#: Relative rounding error allowed per evaluated term of ``log delta`` (four ulps) in
#: :func:`_log_delta_error_xp`.
_TERM_ROUNDING = 2.0 ** -51
#: Smallest ``mu`` at which :func:`gaussian_epsilon` is differentiated (0 below it).
_MU_GRADIENT_MIN = 1e-12
#: A log delta above one that underflows the floats (e.g. ``log Phi(-1e200)``) and below any
#: valid target's (delta >= 5e-324): what the cancellation-free bounds use for it.
_BELOW_ANY_TARGET = -1e300
#: Doublings of the upper end of the epsilon search, from 1: up to 2^70 ~ 1e21.
_GROW_STEPS = 70
#: The largest epsilon :func:`gaussian_epsilon` tests: beyond it the answer is ``inf``.
EPSILON_SEARCH_MAX = 2.0 ** _GROW_STEPS
#: The smallest positive double.  The Gaussian mechanism's delta is positive at every finite
#: epsilon (``Phi`` of a finite argument); where it lies below every double the certified upper
#: ends report this, not 0 (which would claim pure DP there).
SMALLEST_DELTA = float(np.nextafter(0.0, 1.0))

#: Halvings of the epsilon bracket: enough to reach float64 resolution from any start.
_BISECTION_STEPS = 200
#: Safety margin in log delta for :func:`gaussian_epsilon`: feasible means
#: ``log delta <= log target - 1e-12``.  Separately compiled evaluations of ``log delta`` (the
#: bisection loop vs a caller's check) round ``log_ndtr`` differently by a few ulps (measured
#: 5e-16 relative); the margin keeps ``gaussian_delta(result) <= target_delta`` under any of
#: them, at a cost of ~1e-12 / |d log delta / d eps| in epsilon.
_LOG_DELTA_MARGIN = 1e-12


def _split_large(xp, eps, mu):
    """``(large, eps_l, mu_l, eps_e, mu_e)``: the inputs of the large-``mu`` bound and of the
    exact formula, each with placeholders where the other one applies, so that neither a value
    nor a gradient of the branch not taken can be NaN."""
    large = mu >= MU_LARGE
    return (large, xp.where(large, eps, 0.0), xp.where(large, mu, MU_LARGE),
            xp.where(large, 1.0, eps), xp.where(large, 1.0, mu))


def _large_arg(xp, eps, mu):
    """``-w`` rounded up, ``w = eps/mu - mu/2``: the argument of the large-``mu`` bound
    ``log Phi(-w)`` (module docstring)."""
    ratio = eps / mu
    w = ratio - 0.5 * mu
    return -(w - _W_ROUNDING * (xp.abs(ratio) + 0.5 * mu))


def _exact_of_terms(xp, eps, x_a, log_a, log_phi_b):
    """The exact formula's ``log delta`` from its two evaluated terms ``log_a = log Phi(x_a)``
    and ``log Phi(x_b)`` (``x_a = -eps/mu + mu/2``, ``x_b = -eps/mu - mu/2``)."""
    # Below -20 log_ndtr is an asymptotic series cut after its 15/x^6 term, which underestimates
    # Phi by less than 105/x^8 relative: the bound on that is added to the first term (the
    # second one, subtracted, is then underestimated too: the safe side).
    log_a = log_a + _series_margin(xp, x_a)
    log_b = eps + log_phi_b
    # log(1 - e^x) for x = log_b - log_a < 0; log1p(-exp(x)) is accurate for x < -log 2, -expm1
    # for x near 0.
    x = xp.minimum(log_b - log_a, 0.0)
    log1mexp = xp.where(x < -0.6931471805599453, xp.log1p(-xp.exp(x)), xp.log(-xp.expm1(x)))
    return log_a + log1mexp


def _log_delta_xp(xp, log_phi, eps, mu):
    """``log delta(eps; mu)`` for ``mu > 0`` with array namespace ``xp`` and ``log Phi`` function
    ``log_phi`` (float64 arrays, broadcast); see the module docstring.  The array form of the
    formula that is differentiated: :func:`_log_delta` (``jax.numpy``) and
    :func:`np_gaussian_log_delta` (NumPy) call it; :func:`_log_delta_error_xp` gives the same
    values from fewer ``log_ndtr`` evaluations."""
    large, eps_l, mu_l, eps, mu = _split_large(xp, eps, mu)
    x_a = -eps / mu + 0.5 * mu
    exact = _exact_of_terms(xp, eps, x_a, log_phi(x_a), log_phi(-eps / mu - 0.5 * mu))
    # Large mu: the cancellation-free upper bound (module docstring).
    x_l = _large_arg(xp, eps_l, mu_l)
    return xp.where(large, log_phi(x_l) + _series_margin(xp, x_l), exact)


def _log_delta_error_xp(xp, log_phi, eps, mu):
    """``log delta(eps; mu)`` (``mu > 0``) with a bound on its rounding error, from one
    evaluation of each ``log Phi`` term (a compiled search holds one copy of each).

    The terms ``log_a = log Phi(x_a)`` and ``log_b = eps + log Phi(x_b)`` are each in error by
    at most ``2^-51`` of their size plus their arguments' rounding error (``2^-51 (eps/mu +
    mu/2)``) times ``|d log Phi / dx| <= max(-x, 0) + 1``; ``log(1 - e^(log_b - log_a))``
    multiplies their errors by ``r = e^x / (1 - e^x)``, which is large where ``delta`` is a
    small difference of two close terms (small ``mu``, deep tails).  Where ``r`` is not finite
    (the computed difference is not positive) the bound is ``inf``.  For ``mu >= MU_LARGE`` only
    the bound's own evaluation error.  The epsilon search widens its margin to this bound where
    it exceeds 1e-12, and the closed-form delta answers their relative margin.

    Returns ``(log_delta, error, first)``: :func:`_log_delta_xp`'s value, the bound, and an
    upper bound on ``log delta`` free of the cancellation (``delta <= Phi(x_a)``, and for
    ``eps >= 0`` ``delta <= mu phi(d)``; ``inf`` for ``mu >= MU_LARGE``), which decides where the
    difference is too small for its rounding error to be bounded (tiny ``mu``)."""
    large, eps_l, mu_l, eps_e, mu_e = _split_large(xp, eps, mu)
    ratio = eps_e / mu_e
    err_arg = 2.0 ** -51 * (xp.abs(ratio) + 0.5 * mu_e)
    # One log_ndtr serves the exact formula's first term and, for large mu, the bound's: a
    # compiled search then holds two (they dominate its compile time).
    x_a = xp.where(large, _large_arg(xp, eps_l, mu_l), -ratio + 0.5 * mu_e)
    x_b = -ratio - 0.5 * mu_e
    log_a, log_phi_b = log_phi(x_a), log_phi(x_b)
    # The exact formula sees a placeholder first term for large mu (0: finite, above log_b).
    exact = _exact_of_terms(xp, eps_e, x_a, xp.where(large, 0.0, log_a), log_phi_b)
    log_delta = xp.where(large, log_a + _series_margin(xp, x_a), exact)
    err_a = _TERM_ROUNDING * (1.0 + xp.abs(log_a)) + (xp.maximum(-x_a, 0.0) + 1.0) * err_arg
    err_b = (_TERM_ROUNDING * (1.0 + xp.abs(eps_e) + xp.abs(log_phi_b))
             + (xp.maximum(-x_b, 0.0) + 1.0) * err_arg)
    x = eps_e + log_phi_b - log_a
    x_neg = xp.where(x < 0.0, x, -1.0)
    r = xp.where(x < 0.0, xp.exp(x_neg) / -xp.expm1(x_neg), xp.inf)
    error_exact = err_a + (err_a + err_b) * r + _TERM_ROUNDING * (1.0 + xp.abs(log_delta))
    error = xp.where(large, _TERM_ROUNDING * (1.0 + xp.abs(log_delta)), error_exact)
    # Bounds free of the cancellation, which decide where r is useless: delta <= Phi(x_a), and
    # (eps >= 0) delta <= Phi(-w) - Phi(-w - mu) <= mu phi(d), d the distance from 0 to
    # [w, w + mu] (tiny mu: delta(0) ~ 0.4 mu).
    w = ratio - 0.5 * mu_e
    dist = xp.maximum(xp.maximum(w, -(w + mu_e)) - err_arg, 0.0)
    # A term whose log is below the floats (-inf, its error bound inf): -1e300 is above it.
    log_small = xp.log(mu_e) - 0.5 * dist * dist - _HALF_LOG_2PI
    log_small = xp.where(log_small == -xp.inf, _BELOW_ANY_TARGET, log_small)
    log_small = xp.where(eps_e >= 0.0, log_small + _TERM_ROUNDING * (1.0 + xp.abs(log_small)), xp.inf)
    log_first = log_a + _series_margin(xp, x_a) + err_a
    log_first = xp.where((log_a == -xp.inf) | (xp.isnan(log_first) & ~xp.isnan(x_a)), _BELOW_ANY_TARGET,
                         log_first)
    first = xp.minimum(log_first, log_small)
    return log_delta, error, xp.where(large, xp.inf, first)


def _series_margin(xp, x):
    """``210 / x^8`` below -20, else 0: twice the bound on the relative truncation error of
    ``log_ndtr``'s asymptotic series there (its first omitted term, ``105 / x^8``)."""
    x8 = (x * x) * (x * x)
    return xp.where(x < _LOG_NDTR_LOWER, 210.0 / (x8 * x8), 0.0)


def _log_delta(eps, mu):
    """``log delta(eps; mu)`` for ``mu > 0`` (float64 jax arrays, broadcast)."""
    return _log_delta_xp(jnp, _jax_special.log_ndtr, eps, mu)


def np_gaussian_log_delta(epsilon, mu) -> np.ndarray:
    """``log delta(epsilon; mu)`` for ``mu > 0`` in NumPy, vectorised, with SciPy's ``log_ndtr``.

    SciPy's ``log_ndtr`` is more accurate below ``-20`` than the order-3 series of
    ``jax.scipy.special.log_ndtr`` (by up to ~1e-9 relative in the log): the bounds of
    :mod:`dpjax.pld.fallback` use it; :func:`host_gaussian_log_delta` instead agrees with the
    jitted path.  ``epsilon``, ``mu``: float64 arrays (broadcast); ``mu = 0`` is the caller's case.
    """
    import scipy.special  # on first use: importing this module stays free of SciPy

    eps = np.asarray(epsilon, np.float64)
    mu = np.asarray(mu, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _log_delta_xp(np, scipy.special.log_ndtr, eps, mu)


def _safe_mu(mu):
    # mu = 0 is handled by a where at the caller; a placeholder 1 keeps gradients NaN-free.
    return jnp.where(mu > 0, mu, 1.0)


@float64
def gaussian_log_delta(epsilon, mu):
    """``log delta(epsilon; mu)`` of the Gaussian mechanism (``-inf`` for ``mu = 0``).

    Args:
      epsilon: array-like, ``>= 0`` (negative values are accepted; the formula holds for any
        real ``eps``).
      mu: array-like, ``>= 0``: ``sqrt(steps) * sensitivity / noise_multiplier``.

    Returns:
      float64 array of the broadcast shape.  Stable down to ``delta ~ 1e-300``.  For
      ``mu >= MU_LARGE`` (1e4) an upper bound, tight to about ``(w + 1/w) / mu`` relative
      (``w = eps/mu - mu/2``; module docstring): the exact formula cancels there.
    """
    if _concrete(epsilon, mu):
        return jax.device_put(host_gaussian_log_delta(epsilon, mu))
    return _gaussian_log_delta(jnp.asarray(epsilon, jnp.float64), jnp.asarray(mu, jnp.float64))


@_xla.jit
def _gaussian_log_delta(eps, mu):
    return jnp.where(mu > 0, _log_delta(eps, _safe_mu(mu)), -jnp.inf)


@_xla.jit
def gaussian_log_delta_upper(epsilon, mu):
    """An upper bound on ``log delta(epsilon; mu)`` for searches that must land on the safe side
    (traced; float64 arrays in, ``mu >= 0``): :func:`gaussian_log_delta` plus the epsilon
    search's margin (1e-12, or the bound on its rounding error where larger), or the
    cancellation-free bound where smaller (:func:`_log_delta_error_xp`).  The margins carry no
    gradient; the derivative is that of ``log delta`` (or of the bound where it decides)."""
    log_delta, error, first = _log_delta_error_xp(jnp, _jax_special.log_ndtr, epsilon, _safe_mu(mu))
    margin = jax.lax.stop_gradient(jnp.maximum(_LOG_DELTA_MARGIN, error))
    upper = jnp.where(jnp.isfinite(margin), log_delta + margin, jnp.inf)
    return jnp.where(mu > 0, jnp.minimum(upper, first), -jnp.inf)


@float64
def gaussian_delta(epsilon, mu):
    """Tight ``delta(epsilon)`` of the Gaussian mechanism with ``mu = sqrt(T) Delta / sigma``.

    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (Balle & Wang 2018, Thm. 8), computed in
    log space (:func:`gaussian_log_delta`).  Vectorised over ``epsilon`` and ``mu``; jittable;
    differentiable in both.
    """
    if _concrete(epsilon, mu):
        return jax.device_put(np.exp(host_gaussian_log_delta(epsilon, mu)))
    return jnp.exp(gaussian_log_delta(epsilon, mu))


@float64(rounding="up")
def gaussian_epsilon(target_delta, mu):
    """Smallest ``eps >= 0`` with ``gaussian_delta(eps, mu) <= target_delta``.

    Bisection on ``log delta`` (decreasing in ``eps``) to float64 resolution, returning the
    upper end of the final bracket, with a margin of 1e-12 in ``log delta``, so that
    ``gaussian_delta(result, mu) <= target_delta`` holds as computed by any compiled or eager
    evaluation (the safe side; the margin moves epsilon by ~1e-12 relative).  For
    ``mu >= MU_LARGE`` the bisection runs on the upper bound of :func:`gaussian_log_delta`: the
    epsilon is then above the exact one by less than 1 plus a rounding margin of ~2^-49 of it.  0 when already
    ``delta(0) <= target_delta``; ``inf`` when even ``eps = 2^70`` does not reach it (never
    for ``mu < 1e10``).

    Vectorised over ``target_delta`` and ``mu`` (broadcast); jittable.  Differentiable by the
    implicit function theorem: ``d eps/d theta = -(d log delta/d theta) / (d log delta/d eps)``
    at the root (zero where the answer is 0 or inf, and for ``mu < 1e-12``).

    Args:
      target_delta: in ``(0, 1)``.
      mu: ``>= 0``.
    """
    if _concrete(target_delta, mu):
        return jax.device_put(host_gaussian_epsilon(target_delta, mu))
    return _gaussian_epsilon(jnp.asarray(target_delta, jnp.float64), jnp.asarray(mu, jnp.float64))


@_xla.jit
def _gaussian_epsilon(target_delta, mu):
    # Jitted once per shape: an eager call would otherwise re-trace the loops every time.
    log_target, mu = jnp.broadcast_arrays(jnp.log(target_delta), mu)
    root = _epsilon_bisection(jax.lax.stop_gradient(log_target), jax.lax.stop_gradient(mu))
    # Implicit-function gradient with the exact value: root + (g - stop_gradient(g)) equals root,
    # and its derivative is that of g = -(log delta(root; mu) - log target) / (d log delta/d eps).
    # Below mu = 1e-12 delta is a difference of two terms equal to ~1e-12 relative, whose
    # derivatives cancel as badly: no gradient there (0, as at 0 and inf).
    interior = (root > 0) & jnp.isfinite(root) & (mu >= _MU_GRADIENT_MIN)
    safe_root = jnp.where(interior, root, 1.0)
    grad_mu = jnp.where(interior, mu, 1.0)
    slope = jax.grad(lambda e: jnp.sum(_log_delta(e, grad_mu)))(safe_root)
    g = -(_log_delta(safe_root, grad_mu) - log_target) / jax.lax.stop_gradient(slope)
    g = jnp.where(interior, g, 0.0)
    return root + (g - jax.lax.stop_gradient(g))


def _epsilon_bisection(log_target, mu):
    safe_mu = _safe_mu(mu)

    def feasible(e):
        # The margin is 1e-12 in log delta, or the bound on its rounding error where larger;
        # or the first term alone is below the target.
        log_delta, error, first = _log_delta_error_xp(jnp, _jax_special.log_ndtr, e, safe_mu)
        log_delta = jnp.where(mu > 0, log_delta, -jnp.inf)
        error = jnp.where(mu > 0, error, 0.0)
        return ((jnp.isfinite(error) & (log_delta <= log_target - jnp.maximum(_LOG_DELTA_MARGIN, error)))
                | ((mu > 0) & (first <= log_target - _LOG_DELTA_MARGIN)))

    # One loop holds the program's one copy of ``feasible`` (its two log_ndtr's dominate the
    # compile time): step 0 tests eps = 0, steps 1.._GROW_STEPS double the upper end from 1
    # until feasible, the next step tests the grown end, and the rest halve [0, hi].
    grow_end = 1 + _GROW_STEPS

    def step(i, state):
        lo, hi, zero_ok, reachable = state
        growing = i <= _GROW_STEPS
        mid = 0.5 * (lo + hi)
        e = jnp.where(i == 0, 0.0, jnp.where(i <= grow_end, hi, mid))
        ok = feasible(e)
        zero_ok = jnp.where(i == 0, ok, zero_ok)
        reachable = jnp.where(i == grow_end, ok, reachable)
        halving = i > grow_end
        new_hi = jnp.where(growing & (i > 0) & ~ok, 2.0 * hi, jnp.where(halving & ok, mid, hi))
        new_lo = jnp.where(halving & ~ok, mid, lo)
        return new_lo, new_hi, zero_ok, reachable

    false = jnp.zeros(mu.shape, bool)
    # Every upper end the loop keeps was tested feasible (or is the grown end, whose test sets
    # ``reachable``), so no re-check afterwards: a separately compiled re-evaluation may round
    # differently.
    _, hi, zero_ok, reachable = jax.lax.fori_loop(
        0, grow_end + 1 + _BISECTION_STEPS, step, (jnp.zeros_like(mu), jnp.ones_like(mu), false, false))
    hi = jnp.where(reachable, hi, jnp.inf)
    return jnp.where(zero_ok, 0.0, hi)


# ------------------------------------------------------------------------------------------
# Host twins for concrete inputs.
#
# A first call of the jitted functions above compiles an XLA program (~1 s on a 2-core CPU,
# for what is scalar arithmetic); the accountant's planning and its closed-form answers call
# them on concrete values, so small concrete calls run here instead, in Python floats: the same
# formulas, the same ``log_ndtr`` algorithm (a port of JAX's, with the C library's erf/erfc:
# no SciPy import either), the same bisection (same margin, same numbers of grow/halve steps;
# the loops stop early only at their fixed point, where further steps cannot change the
# bracket).  Host and compiled values agree to ~1e-13 relative in epsilon for mu >= 0.01
# (measured on 3000 random (delta, mu), delta down to 1e-300; they are bit-equal for ~90%),
# inside the 1e-12 margin in log delta.  Traced inputs (grad, vmap, jit) and arrays larger
# than ``_HOST_MAX_SIZE`` take the jitted path.


#: Largest broadcast size answered on the host (the bisection in Python floats: ~1 ms per
#: element); larger arrays amortize the compile of the jitted path.
_HOST_MAX_SIZE = 256


def _concrete(*args) -> bool:
    if _traced.is_traced(*args):
        return False
    leaves = _ops.tree_flatten(args)[0]
    try:
        size = int(np.prod(np.broadcast_shapes(*(np.shape(x) for x in leaves)), dtype=np.int64))
    except ValueError:  # shapes that do not broadcast: let the jitted path raise as before
        return False
    return size <= _HOST_MAX_SIZE


_HALF_SQRT_2 = 0.7071067811865476   # float64(0.5 * sqrt(2)), as in jax.scipy.special._ndtr
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_NDTR_LOWER, _LOG_NDTR_UPPER = -20.0, 8.0


def _log(v: float) -> float:
    return math.log(v) if v > 0.0 else (-math.inf if v == 0.0 else math.nan)


def _py_ndtr(x: float) -> float:
    """``jax.scipy.special``'s ``_ndtr`` on one float (same branches; the C library's erf/erfc)."""
    w = x * _HALF_SQRT_2
    z = abs(w)
    if z < _HALF_SQRT_2:
        y = 1.0 + math.erf(w)
    elif w > 0.0:
        y = 2.0 - math.erfc(z)
    else:
        y = math.erfc(z)
    return 0.5 * y


def py_log_ndtr(x: float) -> float:
    """``jax.scipy.special.log_ndtr`` (float64) on one float: the same segments (-20, 8) and the
    same order-3 asymptotic series below -20, so host and compiled values agree to a few ulps.
    (SciPy's ``log_ndtr`` is more accurate below -20, by up to ~1e-9 relative in the log, and
    would move deep-tail epsilons by that much against the jitted path.)"""
    if x > _LOG_NDTR_UPPER:
        return -_py_ndtr(-x)
    if x > _LOG_NDTR_LOWER:
        return _log(_py_ndtr(x))
    xl = min(x, _LOG_NDTR_LOWER) if x == x else x
    x2 = xl * xl
    log_scale = -0.5 * x2 - _log(-xl) - _HALF_LOG_2PI
    odd = 1.0 / x2 + 15.0 / (x2 * x2 * x2)
    even = 3.0 / (x2 * x2)
    return log_scale + _log(1.0 + even - odd)


def _py_series_margin(x: float) -> float:
    """:func:`_series_margin` on a float."""
    if not x < _LOG_NDTR_LOWER:
        return 0.0
    x4 = (x * x) * (x * x)   # products, not **: a float power that overflows raises
    return 210.0 / (x4 * x4)


def _py_log_delta_upper_large(eps: float, mu: float) -> float:
    """The large-``mu`` bound of :func:`_log_delta_xp` on floats."""
    ratio = eps / mu
    w = ratio - 0.5 * mu
    x = -(w - _W_ROUNDING * (abs(ratio) + 0.5 * mu))
    return py_log_ndtr(x) + _py_series_margin(x)


def py_log_delta_lower_large(eps: float, mu: float) -> float:
    """A lower bound on ``log delta(eps; mu)`` for ``mu > 0`` without the cancellation of the exact
    formula (module docstring): ``log(Phi(-w_hi) - phi(m) / z_lo)`` with ``w_hi``, ``z_lo`` the
    ends of the rounding interval of ``w``, ``z`` that make it smallest, ``m`` the smallest
    ``|w|`` in that interval (``-inf`` where the bound is not positive).  For the lower end of a
    large-``mu`` epsilon bracket, whose check needs delta from below."""
    ratio = eps / mu
    w = ratio - 0.5 * mu
    err = _W_ROUNDING * (abs(ratio) + 0.5 * mu)
    x = -(w + err)
    log_a = py_log_ndtr(x) - _py_series_margin(x)
    z_lo = w - err + mu
    if not z_lo > 0.0:
        return -math.inf
    m = max(abs(w) - err, 0.0)
    log_c = -0.5 * m * m - _HALF_LOG_2PI - math.log(z_lo)
    if not log_c < log_a:
        return -math.inf
    return log_a + math.log1p(-math.exp(log_c - log_a))


def _py_combine(log_a: float, log_b: float) -> float:
    """``log(e^log_a - e^log_b)`` as :func:`_log_delta_xp` forms it (``log_b <= log_a``)."""
    x = log_b - log_a
    x = x if (x != x or x < 0.0) else 0.0
    if x < -0.6931471805599453:
        return log_a + math.log1p(-math.exp(x))
    return log_a + _log(-math.expm1(x))


def _py_log_delta(eps: float, mu: float) -> float:
    """:func:`_log_delta` on floats (``mu > 0``)."""
    if mu >= MU_LARGE:
        return _py_log_delta_upper_large(eps, mu)
    arg_a = -eps / mu + 0.5 * mu
    return _py_combine(py_log_ndtr(arg_a) + _py_series_margin(arg_a), eps + py_log_ndtr(-eps / mu - 0.5 * mu))


def _py_gaussian_log_delta(eps: float, mu: float) -> float:
    return _py_log_delta(eps, mu) if mu > 0.0 else -math.inf


def _py_log_delta_and_error(eps: float, mu: float) -> tuple[float, float, float]:
    """``(log delta, error, first)``: :func:`_py_gaussian_log_delta` and :func:`_log_delta_error_xp`
    on floats from one evaluation of the terms (``(-inf, 0, -inf)`` for ``mu = 0``, whose delta
    is 0)."""
    if not mu > 0.0:
        return -math.inf, 0.0, -math.inf
    if mu >= MU_LARGE:
        log_delta = _py_log_delta_upper_large(eps, mu)
        return log_delta, _TERM_ROUNDING * (1.0 + abs(log_delta)), math.inf
    ratio = eps / mu
    x_a, x_b = -ratio + 0.5 * mu, -ratio - 0.5 * mu   # the arguments of _py_log_delta, bit for bit
    log_a, log_phi_b = py_log_ndtr(x_a), py_log_ndtr(x_b)
    log_delta = _py_combine(log_a + _py_series_margin(x_a), eps + log_phi_b)
    err_arg = 2.0 ** -51 * (abs(ratio) + 0.5 * mu)
    err_a = _TERM_ROUNDING * (1.0 + abs(log_a)) + (max(-x_a, 0.0) + 1.0) * err_arg
    err_b = _TERM_ROUNDING * (1.0 + abs(eps) + abs(log_phi_b)) + (max(-x_b, 0.0) + 1.0) * err_arg
    # A term whose log is below the floats (-inf, its error bound inf): -1e300 is above it.
    first = _BELOW_ANY_TARGET if log_a == -math.inf else log_a + _py_series_margin(x_a) + err_a
    if eps >= 0.0:
        w = ratio - 0.5 * mu
        dist = max(max(w, -(w + mu)) - err_arg, 0.0)
        log_small = math.log(mu) - 0.5 * dist * dist - _HALF_LOG_2PI
        log_small = (_BELOW_ANY_TARGET if log_small == -math.inf
                     else log_small + _TERM_ROUNDING * (1.0 + abs(log_small)))
        first = min(first, log_small)
    x = eps + log_phi_b - log_a
    if not x < 0.0:
        return log_delta, math.inf, first
    r = math.exp(x) / -math.expm1(x)
    return log_delta, err_a + (err_a + err_b) * r + _TERM_ROUNDING * (1.0 + abs(log_delta)), first


def _delta_and_upper(log_delta, error, first, rel):
    """``(delta, upper)`` from :func:`_log_delta_error_xp`'s three arrays: ``delta (1 + rel)``, or
    ``delta (1 +`` the bound on its rounding error ``)`` where that is larger, never above the
    cancellation-free bound times ``1 + rel`` nor above 1."""
    with np.errstate(over="ignore", invalid="ignore"):
        delta = np.exp(log_delta)
        widen = np.maximum(rel, np.expm1(error))
        upper = np.where(np.isfinite(widen), delta * (1 + widen), np.inf)
        return delta, np.minimum(np.minimum(upper, np.exp(first) * (1 + rel)), 1.0)


def host_gaussian_delta_and_upper(epsilon, mu, rel: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """``(delta, upper)`` on the host for answers from the closed form (float64 ndarrays): the
    value :func:`gaussian_delta` gives, and an upper bound on ``delta(epsilon; mu)``
    (:func:`_delta_and_upper`: the relative margin ``rel``, widened to the bound on the rounding
    error of :func:`_log_delta_error_xp` where that is larger).  One evaluation of the terms
    gives both."""
    with np.errstate(over="ignore", invalid="ignore"):
        parts = (np.asarray(x, np.float64) for x in np.vectorize(
            _py_log_delta_and_error, otypes=[float, float, float])(np.asarray(epsilon, np.float64),
                                                                    np.asarray(mu, np.float64)))
    delta, upper = _delta_and_upper(*parts, rel)
    return delta, _positive_where(mu, upper)


def _positive_where(mu, upper):
    """``upper`` raised to :data:`SMALLEST_DELTA` where ``mu > 0`` (the truth is positive there)."""
    return np.where(np.asarray(mu, np.float64) > 0, np.maximum(upper, SMALLEST_DELTA), upper)


def _np_terms(epsilon, mu):
    """:func:`_log_delta_error_xp`'s three arrays in NumPy with SciPy's ``log_ndtr``."""
    import scipy.special  # on first use: importing this module stays free of SciPy

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _log_delta_error_xp(np, scipy.special.log_ndtr, np.asarray(epsilon, np.float64),
                                   np.asarray(mu, np.float64))


def np_gaussian_log_delta_and_upper(epsilon, mu) -> tuple[np.ndarray, np.ndarray]:
    """``(log_delta, upper)`` in NumPy with SciPy's ``log_ndtr`` (``mu > 0``, float64 arrays,
    broadcast): :func:`np_gaussian_log_delta`'s value and an upper bound on ``delta(epsilon; mu)``
    from one evaluation (:func:`_delta_and_upper` with no relative margin: the caller adds its
    own)."""
    terms = _np_terms(epsilon, mu)
    return terms[0], _delta_and_upper(*terms, 0.0)[1]


def np_gaussian_delta_upper(epsilon, mu, rel: float = 1e-9) -> np.ndarray:
    """An upper bound on ``delta(epsilon; mu)`` (``mu > 0``) in NumPy with SciPy's ``log_ndtr``:
    ``exp`` of :func:`np_gaussian_log_delta` with the margin of :func:`_delta_and_upper` (a bare
    ``1 + 1e-9`` was below the truth by up to ~1e-7 relative at small ``mu`` and deep tails,
    where ``delta`` is a small difference of two close terms)."""
    return _positive_where(mu, _delta_and_upper(*_np_terms(epsilon, mu), rel)[1])


def _py_feasible(eps: float, mu: float, log_target: float) -> bool:
    """The epsilon search's test: ``log delta`` below the target by 1e-12 or by the bound on its
    rounding error where larger, or the first term alone below the target by 1e-12."""
    log_delta, error, first = _py_log_delta_and_error(eps, mu)
    return ((math.isfinite(error) and log_delta <= log_target - max(_LOG_DELTA_MARGIN, error))
            or first <= log_target - _LOG_DELTA_MARGIN)


#: The bisection of :func:`_epsilon_bisection` on floats (the upper end is the feasible one).
_HOST_EPSILON_BISECTION = HostBisection(safe="upper", max_halvings=_BISECTION_STEPS)


def _py_gaussian_epsilon(target_delta: float, mu: float) -> float:
    """The bisection of :func:`_epsilon_bisection` on floats."""
    log_target = _log(target_delta)
    feasible = lambda e: _py_feasible(e, mu, log_target)
    hi = 1.0
    for _ in range(_GROW_STEPS):
        if feasible(hi):  # fixed point: every later step keeps hi
            break
        hi = 2.0 * hi
    if feasible(0.0):
        return 0.0
    if not feasible(hi):
        return math.inf
    # The jitted loop's halvings; HostBisection stops early only at the fixed point (adjacent
    # floats), where further halvings cannot change the bracket.
    return _HOST_EPSILON_BISECTION.root(feasible, 0.0, hi)


def _elementwise(fn, a, b) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    out = [fn(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]
    return np.asarray(out, np.float64).reshape(a.shape)


def host_gaussian_log_delta(epsilon, mu) -> np.ndarray:
    """:func:`gaussian_log_delta` on the host (concrete inputs; float64 ndarray, no compile)."""
    return _elementwise(_py_gaussian_log_delta, epsilon, mu)


def host_gaussian_epsilon(target_delta, mu) -> np.ndarray:
    """:func:`gaussian_epsilon` on the host (concrete inputs; float64 ndarray, no compile)."""
    return _elementwise(_py_gaussian_epsilon, target_delta, mu)


def host_gaussian_epsilon_is_zero(target_delta, mu) -> np.ndarray:
    """Where :func:`gaussian_epsilon` is 0, on the host: ``delta(0) <= target_delta`` with the
    bisection's margin, the test it makes before returning 0 (one ``log_ndtr`` per element
    instead of the whole bisection)."""
    return _elementwise(lambda d, m: float(_py_feasible(0.0, m, _log(d))),
                        target_delta, mu).astype(bool)
