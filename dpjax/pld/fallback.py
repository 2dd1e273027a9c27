"""Certified epsilon bounds for a direction the FFT grid could not certify.

The grid accountant (:func:`dpjax.pld.epsilon`) reports ``inf`` in a direction when its
truncation or wrap-around bounds exceed ``target_delta`` there: the composed loss is wider
than the widest window, or so narrow and close to 0 (DP-SGD with ``q * T`` far below delta)
that the grid's smallest spacing holds it in a bin or two and the Chernoff bounds of the
discretized loss saturate.  The answer is then not ``inf`` and not the bound of the un-sampled
mechanism, but the smallest of these certified bounds, each valid for that direction on its own:

* **Support bound.**  A mechanism whose privacy loss is bounded above by ``l_max`` (randomized
  response ``log(1 + k (1-p) / p)``, Laplace ``Delta / b``, the *add* direction of a
  Poisson-subsampled Gaussian ``-log(1 - q)``) has ``delta(eps) = 0`` for ``eps >= l_max``, so
  a composition is ``(sum_i c_i l_max_i, 0)``-DP in that direction (the pure-DP composition
  theorem).  Mechanisms declare ``max_loss(direction)``; without it the bound is ``inf``.
* **Binomial mixture of Gaussians** (compositions of Poisson-subsampled Gaussians).  Each step
  is dominated by ``PSG(sigma_min, q_max)`` (a smaller noise multiplier and a larger sampling
  probability dominate by post-processing).  Conditional on the set ``S`` of sampled steps the
  pair is the Gaussian pair with ``mu = sqrt(|S|) / sigma_min``, and the hockey-stick divergence
  is jointly convex, so in both directions
  ``delta(eps) <= sum_k P(K = k) delta_G(eps; sqrt(k) / sigma_min)``, ``K ~ Bin(T, q_max)``
  (Balle, Barthe and Gaboardi, "Privacy Amplification by Subsampling", 2018, the
  advanced joint convexity argument in its simplest form; ``delta_G`` is the Gaussian
  mechanism's curve of Balle and Wang 2018, Thm. 8).  It is small whenever ``q T`` is: with
  ``q T`` below delta the answer is ``0``.
* **Renyi DP** (Mironov, Talwar and Zhang, "Renyi Differential Privacy of the Sampled Gaussian
  Mechanism", 2019) of the same compositions, converted with Canonne, Kamath and Steinke 2020.
  It bounds both directions.
* **Dominating Gaussian** (every component Gaussian or Poisson-subsampled Gaussian, ``q``
  taken as 1): the bound of the un-sampled mechanism, the loosest, kept as the last resort.

Every one of these is monotone in the parameters (more noise, fewer steps or a smaller ``q``
never raise it), and they only ever replace an ``inf``: a direction the grid certified keeps
the grid's value.
"""

from __future__ import annotations

import math

import numpy as np

from dpjax.numerics.exact import np_gaussian_delta_upper, np_gaussian_log_delta_and_upper
from dpjax.numerics.root import HostBisection

__all__ = ["direction_epsilon"]

# Integer mixture points are exact up to this count of sampled steps; beyond it the points are
# spaced geometrically (ratio 1 + _K_RATIO) and each point carries the mass below it up to the
# previous one (the Gaussian curve is increasing in k: pessimistic).
_K_EXACT = 2048
_K_RATIO = 1e-3
# Relative allowance for floating-point rounding of the mixture sum (float64: ~1e-13 at most).
_ROUNDING = 1e-9


def support_bound(components, direction: str) -> float:
    """``sum_i c_i max_loss_i(direction)``: the composed loss never exceeds it (``inf`` if some
    mechanism does not declare a finite bound)."""
    total = 0.0
    for mech, count in components:
        fn = getattr(mech, "max_loss", None)
        if fn is None:
            return math.inf
        m = np.broadcast_to(np.asarray(fn(direction), np.float64), np.shape(np.asarray(count)))
        total += float(np.sum(m * np.asarray(count, np.float64)))
    return total if math.isfinite(total) else math.inf


def _psg_parameters(components):
    """``(sigma_min, q_max, T)`` when every component is a Poisson-subsampled Gaussian, else None."""
    from dpjax.pld.mechanisms import PoissonSubsampledGaussian

    sig, qs, total = [], [], 0
    for mech, count in components:
        if type(mech) is not PoissonSubsampledGaussian:
            return None
        c = np.asarray(count, np.int64)
        s = np.broadcast_to(np.asarray(mech.noise_multiplier, np.float64), c.shape)
        q = np.broadcast_to(np.asarray(mech.sampling_prob, np.float64), c.shape)
        keep = c > 0
        sig.append(s[keep])
        qs.append(q[keep])
        total += int(c.sum())
    if total < 1:
        return None
    return float(np.min(np.concatenate(sig))), float(np.max(np.concatenate(qs))), total


def _mixture_points(steps: int, q: float, target: float):
    """Mixture points ``k_0 < ... < k_m`` and ``P(K > k_j)`` for ``K ~ Bin(steps, q)``.

    Mass of ``K <= k_0`` goes to ``k_0``, of ``k_{j-1} < K <= k_j`` to ``k_j``, and of ``K > k_m``
    to a delta of 1 (``P(K > k_m) <= 1e-3 target``)."""
    import scipy.stats  # on first use: every answer consults this module's support bound, and
    # scipy.stats costs ~0.4 s of import

    k_lo = int(max(0, scipy.stats.binom.ppf(1e-300, steps, q) - 1))
    k_hi = int(min(steps, scipy.stats.binom.isf(1e-3 * target, steps, q) + 1))
    exact = np.arange(k_lo, min(k_hi, k_lo + _K_EXACT) + 1, dtype=np.float64)
    if k_hi > k_lo + _K_EXACT:
        r = math.log1p(_K_RATIO)
        geo = np.exp(np.arange(math.log(exact[-1]) + r, math.log(k_hi) + r, r))
        ks = np.unique(np.r_[exact, np.minimum(np.ceil(geo), k_hi)])
    else:
        ks = exact
    return ks, scipy.stats.binom.sf(ks, steps, q)


def _mixture_curve(components, smallest_delta: float):
    """``eps -> delta`` of the binomial mixture of Gaussians (module docstring), or None when the
    composition is not made of Poisson-subsampled Gaussians."""
    params = _psg_parameters(components)
    if params is None:
        return None
    sigma, q, steps = params
    ks, sf = _mixture_points(steps, q, smallest_delta)
    mu = np.sqrt(ks) / sigma
    # sum_j P(K > k_{j-1}) (f(k_j) - f(k_{j-1})) + f(k_0) + P(K > k_m) (1 - f(k_m)), f = delta_G:
    # the assigned mixture by summation by parts, every term >= 0 (no cancellation).
    prev_sf = np.r_[1.0, sf[:-1]]

    def mixture(f):
        f = np.maximum.accumulate(np.where(mu > 0, f, 0.0))  # increasing in k (guards rounding)
        inc = np.diff(np.r_[0.0, f])
        return float((prev_sf * inc).sum() + sf[-1] * (1.0 - f[-1]))

    def bound(eps: float) -> float:
        # The mixture is sum_j w_j f(k_j) + P(K > k_m) with weights w_j >= 0, so terms raised to
        # upper bounds on their closed forms give an upper bound.  Those carry each term's
        # rounding error, up to ~1e-7 relative at small mu and deep tails (a small difference of
        # two close terms).  Where the raised mixture is within half the allowance of the plain
        # one, the plain one widened by the allowance covers it and the sum's own rounding.
        log_f, upper = np_gaussian_log_delta_and_upper(eps, np.where(mu > 0, mu, 1.0))
        with np.errstate(divide="ignore"):
            plain = mixture(np.exp(log_f))
        raised = mixture(upper)
        value = plain if raised <= plain * (1.0 + _ROUNDING / 2) else raised
        return min(1.0, value * (1.0 + _ROUNDING))

    return bound


def mixture_bound(components, deltas) -> np.ndarray:
    """Epsilon of the binomial mixture of Gaussians (module docstring) at each of ``deltas``
    (``inf`` where the composition is not made of Poisson-subsampled Gaussians)."""
    deltas = np.atleast_1d(np.asarray(deltas, np.float64))
    bound = _mixture_curve(components, float(np.min(deltas)))
    if bound is None:
        return np.full(deltas.shape, np.inf)
    out = np.empty(deltas.shape)
    for i, d in enumerate(deltas):
        if bound(0.0) <= d:
            out[i] = 0.0
            continue
        hi = 1.0
        while bound(hi) > d and hi < 1e6:
            hi *= 2.0
        if bound(hi) > d:
            out[i] = np.inf
            continue
        # bound(0) > d and bound(hi) <= d, both tested above.
        out[i] = _MIXTURE_BISECTION.root(lambda e: bound(e) <= d, 0.0, hi)
    return out


#: Epsilon to 1e-10 relative; the upper end (delta at most the target there) is returned.
_MIXTURE_BISECTION = HostBisection(safe="upper", rtol=1e-10)


def rdp_bound(components, deltas) -> np.ndarray:
    """Renyi-DP epsilon of a composition of Poisson-subsampled Gaussians (``inf`` otherwise)."""
    from dpjax.pld.mechanisms import PoissonSubsampledGaussian

    deltas = np.atleast_1d(np.asarray(deltas, np.float64))
    pairs: dict = {}
    for mech, count in components:
        if type(mech) is not PoissonSubsampledGaussian:
            return np.full(deltas.shape, np.inf)
        c = np.asarray(count, np.int64)
        s = np.broadcast_to(np.asarray(mech.noise_multiplier, np.float64), c.shape).reshape(-1)
        q = np.broadcast_to(np.asarray(mech.sampling_prob, np.float64), c.shape).reshape(-1)
        for si, qi, ci in zip(s, q, c.reshape(-1)):
            pairs[(float(si), float(qi))] = pairs.get((float(si), float(qi)), 0) + int(ci)
    if not pairs or len(pairs) > 16:  # per-pair RDP curves: a fallback, not a schedule accountant
        return np.full(deltas.shape, np.inf)
    from dpjax.numerics.rdp import DEFAULT_RDP_ORDERS, rdp_poisson_subsampled_gaussian, rdp_to_epsilon

    orders = np.asarray(DEFAULT_RDP_ORDERS, np.float64)
    per = [(c, np.asarray(rdp_poisson_subsampled_gaussian(s, q, orders), np.float64)) for (s, q), c in pairs.items()
           if c > 0]
    if any(np.any(r < 0) for _, r in per):
        # Cancellation in the series at tiny q (values ~1e-13 of either sign): not a bound.
        return np.full(deltas.shape, np.inf)
    total = sum(c * r for c, r in per)
    total = np.where(np.isnan(total), np.inf, total)
    return np.asarray([rdp_to_epsilon(orders, total, float(d))[0] for d in deltas], np.float64)


def direction_epsilon(components, direction: str, deltas, *, dominating_mu: float | None = None):
    """Smallest of the certified bounds of the module docstring for ``direction``.

    Args:
      components: ``(mechanism, count)`` pairs (counts may be arrays matching the mechanism's
        stacked parameters).
      direction: ``"remove"`` or ``"add"``.
      deltas: target deltas (1-D array-like).
      dominating_mu: ``mu`` of a dominating Gaussian mechanism, when there is one.

    Returns:
      ``(epsilon, name)``: per-delta upper bounds and the name of the bound that gave the
      smallest value at the smallest delta.
    """
    deltas = np.atleast_1d(np.asarray(deltas, np.float64))
    cands = {"support (pure DP composition)": np.full(deltas.shape, support_bound(components, direction))}
    cands["binomial mixture of Gaussians"] = mixture_bound(components, deltas)
    if _psg_parameters(components) is not None:
        cands["Renyi DP"] = rdp_bound(components, deltas)
    if dominating_mu is not None:
        from dpjax.numerics.exact import host_gaussian_epsilon

        cands["dominating Gaussian (sampling_prob taken as 1)"] = np.asarray(
            host_gaussian_epsilon(deltas, dominating_mu), np.float64).reshape(deltas.shape)
    names = list(cands)
    values = np.stack([np.where(np.isnan(cands[k]), np.inf, cands[k]) for k in names])
    best = np.min(values, axis=0)
    name = names[int(np.argmin(values[:, int(np.argmin(deltas))]))]
    return best, name


def direction_delta(components, direction: str, epsilons, *, dominating_mu: float | None = None):
    """The bounds of :func:`direction_epsilon` as deltas at ``epsilons``: ``(delta, name)``."""
    eps = np.atleast_1d(np.asarray(epsilons, np.float64))
    cands = {"support (pure DP composition)": np.where(eps >= support_bound(components, direction), 0.0, 1.0)}
    bound = _mixture_curve(components, 1e-300)
    if bound is not None:
        cands["binomial mixture of Gaussians"] = np.asarray([bound(float(e)) for e in eps])
    if dominating_mu is not None:
        cands["dominating Gaussian (sampling_prob taken as 1)"] = (
            np_gaussian_delta_upper(eps, dominating_mu, _ROUNDING) if dominating_mu > 0 else np.zeros(eps.shape))
    names = list(cands)
    values = np.stack([np.where(np.isnan(cands[k]), 1.0, cands[k]) for k in names])
    best = np.min(values, axis=0)
    return best, names[int(np.argmin(values[:, 0]))]
