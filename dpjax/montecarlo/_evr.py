"""Estimate-Verify-Release bookkeeping (Wang et al. 2023, Thm 9; Choquette-Choo et al. 2024, §2, Thm 2.1).

Verification: with ``m`` i.i.d. samples of the hockey-stick terms ``T = max(0, 1 - e^(eps - Y))``
in ``[0, 1]``, release iff the sample mean ``delta_hat <= base_delta``.  If the true
``delta = E[T]`` exceeds ``tau * base_delta`` (``tau >= 1``), Hoeffding's Chernoff bound for
``[0, 1]``-valued variables (Hoeffding 1963, Thm 1; the Bernoulli-KL bound of docs/design.md §4) gives::

    P(delta_hat <= base_delta) <= exp(-m * KL(base_delta || tau * base_delta)) =: beta

(KL between Bernoulli means, increasing in the true mean above ``base_delta``).  The released
mechanism is then ``(eps, tau * base_delta + beta)``-DP: if ``delta <= tau * base_delta`` the
mechanism itself is fine; otherwise it is released with probability at most ``beta``, and the
verification does not look at the data, so the output distribution on neighbours differs by at
most ``beta`` in that case.  The sum bounds the max of the two cases.  ``tau`` is optimised.
Both directions are verified with the same samples; if either direction's true delta exceeds
``tau * base_delta`` its own estimate passes with probability at most ``beta``.
"""

from __future__ import annotations

import math

# scipy is imported inside the functions that use it: importing scipy.optimize costs ~0.4 s of a
# cold start, and most users of the Monte Carlo layer never reach Estimate-Verify-Release.


def bernoulli_kl(p: float, q: float) -> float:
    """``KL(Bernoulli(p) || Bernoulli(q))`` in nats."""
    from scipy import special

    return float(special.rel_entr(p, q) + special.rel_entr(1.0 - p, 1.0 - q))


def failure_probability(num_samples: int, base_delta: float, tau: float) -> float:
    """``beta = exp(-m KL(base_delta || tau base_delta))``: chance a too-high delta passes."""
    if tau * base_delta >= 1.0:
        return 0.0
    return math.exp(-num_samples * bernoulli_kl(base_delta, tau * base_delta))


def overall_delta(num_samples: int, base_delta: float) -> tuple[float, float, float]:
    """Smallest ``tau * base_delta + beta(tau)`` over ``tau in [1, 1/base_delta]``.

    Returns ``(delta, tau, beta)``; ``delta`` is what EVR may report after verifying
    ``delta_hat <= base_delta`` with ``num_samples`` samples.
    """

    def objective(log_tau):
        tau = math.exp(log_tau)
        return tau * base_delta + failure_probability(num_samples, base_delta, tau)

    from scipy import optimize

    hi = -math.log(base_delta)
    res = optimize.minimize_scalar(objective, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-10})
    candidates = [(objective(res.x), res.x), (objective(0.0), 0.0), (objective(hi), hi)]
    value, log_tau = min(candidates)
    tau = math.exp(log_tau)
    return min(value, 1.0), tau, failure_probability(num_samples, base_delta, tau)


def base_delta_for_target(num_samples: int, target_delta: float) -> float | None:
    """Largest ``base_delta`` whose :func:`overall_delta` is ``<= target_delta`` (or ``None``).

    ``overall_delta`` increases with ``base_delta``; bisection in log space, returning the
    lower (safe) end of the final bracket.
    """
    lo, hi = target_delta * 1e-12, target_delta
    if overall_delta(num_samples, lo)[0] > target_delta:
        return None
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if overall_delta(num_samples, mid)[0] <= target_delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return lo


def minimum_samples(target_delta: float, base_delta: float | None = None) -> int:
    """Smallest ``m`` such that verifying ``delta_hat <= base_delta`` certifies ``target_delta``.

    With ``base_delta=None``: the smallest ``m`` for which any ``base_delta`` works (about
    ``log(m) / target_delta``; Choquette-Choo et al. 2024: "about 1/delta samples are the minimum").
    """

    def ok(m: int) -> bool:
        if base_delta is None:
            return base_delta_for_target(m, target_delta) is not None
        return overall_delta(m, base_delta)[0] <= target_delta

    hi = max(1, int(1.0 / target_delta))
    while not ok(hi):
        hi *= 2
        if hi > 1 << 62:
            raise ValueError("no sample count certifies this target_delta with this base_delta")
    lo = hi // 2 if hi > 1 else 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi

