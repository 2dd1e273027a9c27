"""Certification of an optimised ``(C, sigma)``: Estimate-Verify-Release with a pre-committed ladder.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix
mechanisms", §5.2 (certify ``delta = 1e-5`` through a verified ``8e-6``), with the EVR bound of
Wang et al. 2023 (Thm 9) as implemented in :mod:`dpjax.montecarlo._evr`.

Procedure (all draws independent of the optimisation's: derived from a separate key):

1. ``sigma_0``: solve ``delta_hat_cal(sigma) = base_delta`` on a *calibration* sample (key
   ``fold_in(key, 0)``, ``num_samples // 4`` draws by default: it only places the ladder, so
   it may be cheaper than the verification), warm-started from the optimisation's estimate.
2. Verify on a *verification* sample (key ``fold_in(key, 1)``, ``num_samples`` draws, independent
   of step 1): the ladder ``sigma_j = sigma_0 * growth^j``, ``j = 0 .. max_attempts - 1``, is fixed
   before the verification sample is looked at; release the first ``sigma_j`` with
   ``delta_hat_ver(sigma_j) <= base_delta`` (both adjacency directions).
3. Soundness: for a fixed ``sigma_j`` whose true ``delta(sigma_j) > tau * base_delta``, the test
   passes with probability at most ``beta = exp(-m KL(base || tau base))``; a union bound over
   the ``max_attempts`` rungs bounds the chance that any too-small rung is released by
   ``max_attempts * beta``.  So the release is ``(eps, tau * base_delta + max_attempts * beta)``-DP;
   ``base_delta`` is the largest value for which that is ``<= target_delta`` (``tau`` optimised).
   Reported ``failure_probability = max_attempts * beta``.

The released sigma is therefore the smallest rung that verifies: usually ``sigma_0`` or the
next (the calibration and verification samples differ by sampling error only).  If no rung
verifies, nothing is certified (``verified = False``, ``noise_multiplier = inf``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from dpjax import _validate
from dpjax.calibration.montecarlo import NewtonIllinois, calibrate_on_draws
from dpjax.calibration.root import StopGradientAdjoint
from dpjax.montecarlo import BallsInBins, as_prng_key
from dpjax.montecarlo import _evr

__all__ = ["certify_noise", "ladder_base_delta", "ladder_minimum_samples",
           "default_certify_samples", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_GROWTH"]

#: Rungs of the verification ladder (union bound: failure probability x this).
DEFAULT_MAX_ATTEMPTS = 8
#: Ratio between rungs (2%: about one standard error of sigma_0 from a quarter-size
#: calibration sample at the default sample counts; 8 rungs cover +15%).
DEFAULT_GROWTH = 1.02


def ladder_overall_delta(num_samples: int, base_delta: float, attempts: int):
    """``min_tau tau * base + attempts * beta(tau)``; returns ``(delta, tau, attempts * beta)``."""

    def objective(log_tau):
        tau = math.exp(log_tau)
        return tau * base_delta + attempts * _evr.failure_probability(num_samples, base_delta, tau)

    hi = -math.log(base_delta)
    res = optimize.minimize_scalar(objective, bounds=(0.0, hi), method="bounded",
                                   options={"xatol": 1e-10})
    value, log_tau = min([(objective(res.x), res.x), (objective(0.0), 0.0), (objective(hi), hi)])
    tau = math.exp(log_tau)
    return min(value, 1.0), tau, attempts * _evr.failure_probability(num_samples, base_delta, tau)


def ladder_base_delta(num_samples: int, target_delta: float, attempts: int) -> float | None:
    """Largest ``base_delta`` with :func:`ladder_overall_delta` ``<= target_delta`` (or None)."""
    lo, hi = target_delta * 1e-12, target_delta
    if ladder_overall_delta(num_samples, lo, attempts)[0] > target_delta:
        return None
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if ladder_overall_delta(num_samples, mid, attempts)[0] <= target_delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return lo


def ladder_minimum_samples(target_delta: float, attempts: int) -> int:
    """Fewest samples for which some ``base_delta`` certifies ``target_delta`` (power-of-2 search
    then bisection)."""
    hi = max(1, int(1.0 / target_delta))
    while ladder_base_delta(hi, target_delta, attempts) is None:
        hi *= 2
    lo = hi // 2
    while hi - lo > max(1, hi // 1000):
        mid = (lo + hi) // 2
        if ladder_base_delta(mid, target_delta, attempts) is None:
            lo = mid
        else:
            hi = mid
    return hi


def default_certify_samples(target_delta: float, attempts: int = DEFAULT_MAX_ATTEMPTS,
                            base_fraction: float = 0.4) -> int:
    """Smallest power of two (>= 2^16) whose ladder ``base_delta >= base_fraction * target``.

    The default 0.4 gives 2^23 samples at ``delta = 1e-5`` (base 4.1e-6) and 2^20 at ``1e-3``;
    the paper's operating point (8e-6 verified for 1e-5) needs 2^27 with the 8-rung ladder."""
    m = 1 << 16
    while True:
        base = ladder_base_delta(m, target_delta, attempts)
        if base is not None and base >= base_fraction * target_delta:
            return m
        m *= 2


@functools.lru_cache(maxsize=32)
def _calibration_fn(num_samples: int):
    def run(gram, eps, base, key, sigma0):
        return calibrate_on_draws(gram, eps, base, key=key, num_samples=num_samples,
                                  solver=NewtonIllinois(xtol=1e-10), adjoint=StopGradientAdjoint(),
                                  initial_noise=sigma0, precompute=False)

    return jax.jit(run)


def certify_noise(correlation, batches_per_epoch: int, epochs: int, *, target_epsilon: float,
                  target_delta: float, num_samples: int, key, initial_noise: float | None = None,
                  max_attempts: int = DEFAULT_MAX_ATTEMPTS, growth: float = DEFAULT_GROWTH,
                  calibration_samples: int | None = None) -> dict:
    """Certified noise multiplier for ``C`` at ``(target_epsilon, target_delta)`` (see module doc).

    Returns a dict: ``verified``, ``noise_multiplier`` (the released, certified sigma; ``inf`` if
    not verified), ``calibrated_noise`` (``sigma_0``), ``epsilon``, ``delta`` (the certified
    ``tau * base + attempts * beta <= target_delta``), ``target_delta``, ``base_delta``, ``tau``,
    ``failure_probability``, ``num_samples`` (per sample set; two sets are drawn),
    ``delta_estimate`` / ``standard_error`` at the released sigma, ``attempts``,
    ``max_attempts``, ``growth``, ``method``, ``reason``.

    Raises:
      ValueError: ``num_samples`` below what can certify ``target_delta`` (says the minimum).
    """
    eps = float(_validate.positive("target_epsilon", target_epsilon))
    target = float(_validate.probability_open("target_delta", target_delta))
    m = _validate.positive_int("num_samples", num_samples)
    attempts = _validate.positive_int("max_attempts", max_attempts)
    m_cal = max(1, m // 4) if calibration_samples is None else _validate.positive_int(
        "calibration_samples", calibration_samples)
    growth = float(_validate.positive("growth", growth))
    if not growth > 1.0:
        raise ValueError(f"growth must be > 1, got {growth}")
    base = ladder_base_delta(m, target, attempts)
    if base is None:
        raise ValueError(
            f"target_delta = {target:g} is below what certify_samples = {m} samples can verify; "
            f"need certify_samples >= {ladder_minimum_samples(target, attempts)} "
            f"(use ~{default_certify_samples(target, attempts)} to verify ~0.8 * target_delta)")
    overall, tau, beta_total = ladder_overall_delta(m, base, attempts)
    acc = BallsInBins(correlation, batches_per_epoch, epochs)
    key = as_prng_key(key)
    key_cal, key_ver = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    sigma0_guess = acc.sensitivity if initial_noise is None else float(initial_noise)
    with jax.enable_x64(True):
        res = _calibration_fn(m_cal)(jnp.asarray(acc.gram), eps, base, key_cal, sigma0_guess)
    sigma0 = float(res.root)
    if not math.isfinite(sigma0):
        raise ValueError(f"target (epsilon={eps:g}, delta={target:g}) is not reached by any noise "
                         "multiplier in the search range")
    released, est, tries = math.inf, None, 0
    for j in range(attempts):
        sigma = sigma0 * growth ** j
        tries = j + 1
        est = acc.estimate(sigma, np.array([eps]), m, key_ver)
        if float(est.delta[0]) <= base:
            released = sigma
            break
    verified = math.isfinite(released)
    d_hat = float(est.delta[0])
    if verified:
        reason = (f"verified: delta_hat = {d_hat:.4g} <= base_delta = {base:.4g} at sigma = {released:.6g} "
                  f"(rung {tries} of {attempts}) with {m} independent samples; "
                  f"(eps, tau*base_delta + {attempts}*beta) = ({eps:g}, {overall:.4g})")
    else:
        reason = (f"not verified: delta_hat = {d_hat:.4g} > base_delta = {base:.4g} at every rung up to "
                  f"sigma = {sigma0 * growth ** (attempts - 1):.6g}; nothing certified")
    return {
        "verified": bool(verified), "noise_multiplier": released, "calibrated_noise": sigma0,
        "epsilon": eps, "delta": float(overall) if verified else math.inf, "target_delta": target,
        "base_delta": float(base), "tau": float(tau), "failure_probability": float(beta_total),
        "num_samples": m, "calibration_samples": m_cal, "delta_estimate": d_hat, "standard_error": float(est.standard_error[0]),
        "delta_remove": float(est.delta_remove[0]), "delta_add": float(est.delta_add[0]),
        "attempts": tries, "max_attempts": attempts, "growth": growth,
        "method": "Estimate-Verify-Release, ladder of pre-committed sigmas, union bound",
        "reason": reason,
    }
