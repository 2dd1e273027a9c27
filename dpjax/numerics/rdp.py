"""Renyi-DP (moments accountant) for the Poisson-subsampled Gaussian mechanism.

This is the baseline users compare the tight PLD accountant with (Abadi et al. 2016, the
"moments accountant"; Mironov 2017; Mironov, Talwar & Zhang 2019, "Renyi Differential
Privacy of the Sampled Gaussian Mechanism", arXiv:1908.10530).

Conventions: ``noise_multiplier`` is the noise standard deviation divided by the clip norm
(sensitivity 1), ``sampling_prob`` the Poisson inclusion probability ``q``, add/remove
adjacency.  The per-step RDP at order ``alpha`` is ``log(A_alpha) / (alpha - 1)`` with

    A_alpha = E_{x ~ N(0, s^2)} [ ((1 - q) + q * exp((2x - 1) / (2 s^2)))^alpha ]

(Mironov et al. 2019, Sec. 3.3; the "remove" direction, which they show is the larger one).

* Integer ``alpha`` (their Sec. 3.3, eq. for integer orders): the binomial expansion is finite,
      A_alpha = sum_{i=0}^{alpha} C(alpha, i) (1 - q)^(alpha - i) q^i exp((i^2 - i) / (2 s^2)).
* Fractional ``alpha``: split the integral at ``z0 = s^2 log(1/q - 1) + 1/2`` (where the two
  mixture terms are equal) and expand each side in a generalised binomial series,
      A_alpha = sum_i C(alpha, i) (1-q)^(alpha-i) q^i exp((i^2-i)/(2 s^2)) Phi((z0 - i)/s)
              + sum_i C(alpha, i) (1-q)^i q^(alpha-i) exp(((alpha-i)^2-(alpha-i))/(2 s^2))
                      Phi((alpha - i - z0)/s).
  For ``i > alpha`` the coefficients alternate in sign and the terms decrease in magnitude, so
  truncating after ``_NUM_TERMS`` terms errs by at most the first omitted term of each
  series; we ADD that magnitude to ``A_alpha`` so the truncated value is still an upper bound.

Everything is evaluated in log space with signed log-sum-exp (no overflow for orders up to
1024 and small noise), in one fixed-shape jitted program vmappable over parameters.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.x64 import float64

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")
_jax_special = _lazy_module("jax.scipy.special")

# The default order grid of the moments accountant (the same orders the reference rows
# B*_rdp list: 1.1..10.9 in steps of 0.1, 11..63, 128, 256, 512, 1024).
DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 10.0 for x in range(1, 100)] + [float(x) for x in range(11, 64)] + [128.0, 256.0, 512.0, 1024.0]
)


class Conversion(StrEnum):
    """RDP-to-(epsilon, delta) conversion: Mironov (2017), Prop. 3 (``STANDARD``) or Canonne,
    Kamath & Steinke (2020), Prop. 12 (``IMPROVED``, tighter)."""

    STANDARD = "standard"
    IMPROVED = "improved"


# Terms kept in each series.  Integer orders need alpha + 1 <= 1025 terms (the largest default
# order is 1024); the fractional series decays polynomially (~ i^-(alpha+2)), and its tail is
# bounded (see module docstring), so a generous fixed length costs nothing on CPU.
_NUM_TERMS = 4096


def _log_abs_binom_and_sign(alpha: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log|C(alpha, i)| and sign of the generalised binomial coefficient, ``alpha > 0``, ``i >= 0``.

    C(alpha, i) = Gamma(alpha + 1) / (Gamma(i + 1) Gamma(alpha - i + 1)); only the last Gamma can
    be negative (its argument is negative for i > alpha + 1); at non-positive integers it is a
    pole and the coefficient is exactly 0 (sign 0).
    """
    x = alpha - i + 1.0
    is_pole = (x <= 0) & (x == jnp.floor(x))
    # gammaln is log|Gamma|; Gamma(x) < 0 iff x < 0 and floor(x) is odd.
    gamma_negative = (x < 0) & (jnp.mod(jnp.floor(x), 2.0) == 1.0)
    safe_x = jnp.where(is_pole, 0.5, x)
    log_abs = _jax_special.gammaln(alpha + 1.0) - _jax_special.gammaln(i + 1.0) - _jax_special.gammaln(safe_x)
    sign = jnp.where(is_pole, 0.0, jnp.where(gamma_negative, -1.0, 1.0))
    return log_abs, sign


def _log_a_integer(alpha, log_q, log_1mq, sigma, i):
    log_abs, sign = _log_abs_binom_and_sign(alpha, i)
    valid = (i <= alpha) & (sign != 0)
    log_terms = log_abs + i * log_q + (alpha - i) * log_1mq + (i * i - i) / (2.0 * sigma**2)
    return _jax_special.logsumexp(jnp.where(valid, log_terms, -jnp.inf))


def _log_a_fractional(alpha, log_q, log_1mq, sigma, i):
    log_abs, sign = _log_abs_binom_and_sign(alpha, i)
    z0 = sigma**2 * (log_1mq - log_q) + 0.5
    j = alpha - i
    log_s0 = log_abs + i * log_q + j * log_1mq + (i * i - i) / (2.0 * sigma**2) + _jax_special.log_ndtr((z0 - i) / sigma)
    log_s1 = log_abs + j * log_q + i * log_1mq + (j * j - j) / (2.0 * sigma**2) + _jax_special.log_ndtr((j - z0) / sigma)
    log_s = jnp.concatenate([log_s0, log_s1])
    signs = jnp.concatenate([sign, sign])
    log_s = jnp.where(signs != 0, log_s, -jnp.inf)
    log_sum, sum_sign = _jax_special.logsumexp(log_s, b=signs, return_sign=True)
    # Alternating tail beyond the last kept term: bounded by the magnitude of the last kept
    # term of each series (terms decrease in magnitude there); add it to stay an upper bound.
    log_tail = jnp.logaddexp(log_s0[-1], log_s1[-1])
    log_a = jnp.logaddexp(log_sum, log_tail)
    # A_alpha >= 1 mathematically; a negative sum can only come from round-off.
    return jnp.where(sum_sign > 0, log_a, jnp.inf)


@jax.jit
def rdp_poisson_subsampled_gaussian_core(noise_multiplier: jax.Array, sampling_prob: jax.Array, orders: jax.Array) -> jax.Array:
    """Per-step RDP of the Poisson-subsampled Gaussian at each order (pure, jitted).

    Args:
      noise_multiplier: scalar ``sigma > 0``.
      sampling_prob: scalar ``q`` in (0, 1].
      orders: shape ``(m,)``, every order ``> 1``.

    Returns:
      shape ``(m,)`` RDP values (nats) for ONE step; multiply by the number of steps to compose.
    """
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    q = jnp.asarray(sampling_prob, jnp.float64)
    orders = jnp.asarray(orders, jnp.float64)
    i = jnp.arange(_NUM_TERMS, dtype=jnp.float64)
    # At q = 1 (no subsampling) log(1-q) = -inf; evaluate the series at a dummy q and select the
    # closed form alpha / (2 sigma^2) of the plain Gaussian instead.
    q_safe = jnp.where(q >= 1.0, 0.5, q)
    log_q, log_1mq = jnp.log(q_safe), jnp.log1p(-q_safe)

    def one_order(alpha):
        is_integer = alpha == jnp.round(alpha)
        log_a = jnp.where(
            is_integer,
            _log_a_integer(alpha, log_q, log_1mq, sigma, i),
            _log_a_fractional(alpha, log_q, log_1mq, sigma, i),
        )
        return log_a / (alpha - 1.0)

    rdp = jax.vmap(one_order)(orders)
    return jnp.where(q >= 1.0, orders / (2.0 * sigma**2), rdp)


@functools.partial(jax.jit, static_argnames=("conversion",))
def rdp_to_epsilon_core(orders: jax.Array, rdp: jax.Array, target_delta: jax.Array, conversion: str = "improved"):
    """Smallest epsilon over the orders for a total RDP curve (pure, jitted).

    Args:
      orders: shape ``(m,)``, orders > 1.
      rdp: shape ``(m,)``, TOTAL RDP (already composed over steps), nats.
      target_delta: scalar in (0, 1).
      conversion: ``"standard"`` -- Mironov 2017 Prop. 3: ``eps = rdp + log(1/delta)/(alpha-1)``;
        ``"improved"`` -- Canonne, Kamath & Steinke 2020 Prop. 12 (= Asoodeh et al. 2020 eq. 20):
        ``eps = rdp + log1p(-1/alpha) - log(delta * alpha)/(alpha - 1)``.

    Returns:
      ``(epsilon, optimal_order)``; epsilon is ``max(0, min_alpha eps(alpha))``.
    """
    orders = jnp.asarray(orders, jnp.float64)
    rdp = jnp.asarray(rdp, jnp.float64)
    delta = jnp.asarray(target_delta, jnp.float64)
    if conversion == "standard":
        eps = rdp - jnp.log(delta) / (orders - 1.0)
    elif conversion == "improved":
        eps = rdp + jnp.log1p(-1.0 / orders) - jnp.log(delta * orders) / (orders - 1.0)
        # The improved bound is numerically unstable as alpha -> 1 (0/0); orders that close to 1
        # are never optimal for it, so they are skipped.
        eps = jnp.where(orders > 1.01, eps, jnp.inf)
        # Bretagnolle-Huber: TV <= sqrt(1 - exp(-KL)) and KL <= D_alpha for alpha >= 1, so
        # delta >= sqrt(1 - exp(-rdp)) already certifies epsilon = 0 at this order.
        eps = jnp.where(delta**2 + jnp.expm1(-rdp) > 0, 0.0, eps)
    else:
        raise ValueError(f"conversion must be one of ('standard', 'improved'), got {conversion!r}")
    eps = jnp.where(jnp.isnan(eps), jnp.inf, eps)
    best = jnp.argmin(eps)
    return jnp.maximum(eps[best], 0.0), orders[best]


def _validated_orders(orders) -> np.ndarray:
    arr = np.atleast_1d(_validate.positive("orders", DEFAULT_RDP_ORDERS if orders is None else orders))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"orders must be a non-empty 1-d sequence of numbers > 1, got {orders!r}")
    if (arr <= 1).any() or np.isinf(arr).any():
        raise ValueError(f"orders must be finite and > 1, got {orders!r}")
    if (arr > _NUM_TERMS - 1).any():
        raise ValueError(f"orders must be <= {_NUM_TERMS - 1}, got max {arr.max()!r}")
    return arr


@float64
def rdp_poisson_subsampled_gaussian(
    noise_multiplier: float, sampling_prob: float, orders: Sequence[float] | None = None
) -> np.ndarray:
    """Per-step RDP of the Poisson-subsampled Gaussian (DP-SGD step), add/remove adjacency.

    Args:
      noise_multiplier: noise std / clip norm, > 0.
      sampling_prob: Poisson sampling probability q in (0, 1].
      orders: RDP orders (> 1); default :data:`DEFAULT_RDP_ORDERS`.

    Returns:
      NumPy array, shape ``(len(orders),)``: RDP (nats) of one step at each order.

    Example::

        >>> rdp = rdp_poisson_subsampled_gaussian(1.0, 0.01, orders=[2.0, 8.0])
    """
    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    arr = _validated_orders(orders)
    return np.asarray(rdp_poisson_subsampled_gaussian_core(sigma, q, jnp.asarray(arr)))


@float64
def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], target_delta: float, *, conversion: str = "improved") -> tuple[float, float]:
    """Convert a total RDP curve to ``(epsilon, optimal_order)`` at ``target_delta``.

    Args:
      orders: shape ``(m,)``, orders > 1.
      rdp: shape ``(m,)``, total RDP at each order (nats, >= 0; ``inf`` allowed).
      target_delta: in (0, 1).
      conversion: ``"improved"`` (default; Canonne-Kamath-Steinke 2020) or ``"standard"``
        (Mironov 2017).
    """
    arr = _validated_orders(orders)
    rdp_arr = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if rdp_arr.shape != arr.shape:
        raise ValueError(f"rdp must have the same shape as orders {arr.shape}, got {rdp_arr.shape}")
    if np.isnan(rdp_arr).any() or (rdp_arr < 0).any():
        raise ValueError(f"rdp must be >= 0 and not NaN, got {rdp!r}")
    delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
    conversion = Conversion.parse(conversion, "conversion").value
    eps, order = rdp_to_epsilon_core(jnp.asarray(arr), jnp.asarray(rdp_arr), delta, conversion=conversion)
    return float(eps), float(order)


@float64(rounding="up")
def rdp_epsilon(
    noise_multiplier: float,
    sampling_prob: float,
    steps: int,
    target_delta: float,
    *,
    orders: Sequence[float] | None = None,
    conversion: str = "improved",
) -> tuple[float, float]:
    """DP-SGD epsilon by the moments accountant (RDP), the classic baseline.

    Args:
      noise_multiplier: noise std / clip norm, > 0.
      sampling_prob: Poisson sampling probability in (0, 1].
      steps: number of DP-SGD steps (integer >= 1).
      target_delta: in (0, 1).
      orders: RDP orders; default :data:`DEFAULT_RDP_ORDERS`.
      conversion: ``"improved"`` (default) or ``"standard"`` RDP-to-DP conversion.

    Returns:
      ``(epsilon, optimal_order)``, an upper bound (looser than the PLD accountant).

    Example::

        >>> eps, order = rdp_epsilon(1.0, 0.01, 1000, 1e-5)   # ~2.10 at order 7.8
    """
    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    t = _validate.positive_int("steps", steps)
    delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
    conversion = Conversion.parse(conversion, "conversion").value
    from dpjax.numerics.cache import call

    # One program (not three, plus an op-by-op multiply), through dpjax's program store (a later
    # process loads it instead of tracing and compiling it).
    f64 = lambda v: np.asarray(v, np.float64)
    eps, order = call("rdp_epsilon", _rdp_epsilon_program,
                               (f64(sigma), f64(q), f64(t), f64(delta), f64(_validated_orders(orders))),
                               dict(conversion=conversion))
    return float(eps), float(order)


@functools.partial(jax.jit, static_argnames=("conversion",))
def _rdp_epsilon_program(sigma, q, steps, delta, orders, *, conversion):
    rdp = rdp_poisson_subsampled_gaussian_core(sigma, q, orders) * steps
    return rdp_to_epsilon_core(orders, rdp, delta, conversion=conversion)
