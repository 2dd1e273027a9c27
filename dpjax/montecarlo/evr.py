"""Estimate-Verify-Release (EVR): the one module that turns Monte Carlo estimates into guarantees.

Wang, Mahloujifar, Wu, Jia & Mittal, "A randomized approach to tight privacy accounting" (2023,
Thm 9), as used by Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy
amplification for matrix mechanisms" (§2, Thm 2.1).  Every certificate dpjax releases --
:meth:`dpjax.montecarlo.BallsInBins.certify` (one noise multiplier), :func:`certify_noise` (a
calibrated noise multiplier: the optimisation loop, the baselines, ``dpjax mc-calibrate
--certify``) -- is built here and returned as one record, :class:`Certificate`.

**One test.**  With ``m`` i.i.d. hockey-stick terms in ``[0, 1]`` and their mean ``delta_hat``,
"pass iff ``delta_hat <= base_delta``".  If the true delta exceeds ``tau * base_delta``, Hoeffding's
Chernoff bound for ``[0, 1]`` variables (Hoeffding 1963, Thm 1: the Bernoulli KL) gives::

    P(pass) <= exp(-m KL(base_delta || tau base_delta)) =: beta          (Bernoulli KL)

**A procedure with several tests.**  A procedure that may run ``K`` tests (several noise
multipliers on one sample, or retries on fresh samples) and releases the noise multiplier of a
passing test: if any noise multiplier it might release has true delta above ``tau base_delta``,
that test passes with probability at most ``beta``, and the event "a bad noise multiplier is
released" lies in the union of those ``K`` events.  So the release is
``(eps, tau base_delta + K beta)``-DP (union bound; the tests need not be independent).  The
verification never looks at the private data, so a mechanism released with probability at most
``K beta`` adds at most that to delta.  ``num_tests`` below is that ``K``; every function that
sizes a certificate takes it, and :class:`Certificate` records it.

**Independence.**  The verification samples must be independent of everything that chose the
noise multipliers under test (the calibration sample, the optimisation's samples): a noise
multiplier calibrated on the verification sample satisfies ``delta_hat = base_delta`` by
construction, and the bound above (``sigma`` fixed before the draws) says nothing about it.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from dpjax import _validate
from dpjax._results import ResultMixin

# scipy is imported inside the functions that use it: importing scipy.optimize costs ~0.4 s of a
# cold start, and most users of the Monte Carlo layer never reach Estimate-Verify-Release.

__all__ = ["Certificate", "bernoulli_kl", "failure_probability", "overall_delta",
           "base_delta_for_target", "minimum_samples", "default_samples", "certify_noise",
           "certify_fixed", "DEFAULT_LADDER_RUNGS", "DEFAULT_LADDER_GROWTH"]

#: Rungs of the verification ladder of :func:`certify_noise` (each is one test).
DEFAULT_LADDER_RUNGS = 8
#: Ratio between rungs (2%: about one standard error of a quarter-size calibration sample's
#: root at the default sample counts; 8 rungs cover +15%).
DEFAULT_LADDER_GROWTH = 1.02


# --------------------------------------------------------------------------- Bernoulli-KL bound


def bernoulli_kl(p: float, q: float) -> float:
    """``KL(Bernoulli(p) || Bernoulli(q))`` in nats."""
    from scipy import special

    return float(special.rel_entr(p, q) + special.rel_entr(1.0 - p, 1.0 - q))


def failure_probability(num_samples: int, base_delta: float, tau: float) -> float:
    """One test: ``beta = exp(-m KL(base_delta || tau base_delta))``, the chance that a noise
    multiplier whose true delta exceeds ``tau * base_delta`` passes ``delta_hat <= base_delta``."""
    if tau * base_delta >= 1.0:
        return 0.0
    return math.exp(-num_samples * bernoulli_kl(base_delta, tau * base_delta))


def overall_delta(num_samples: int, base_delta: float, num_tests: int = 1) -> tuple[float, float, float]:
    """Smallest ``tau * base_delta + num_tests * beta(tau)`` over ``tau in [1, 1/base_delta]``.

    Returns ``(delta, tau, num_tests * beta)``: the delta a procedure that can run ``num_tests``
    tests against ``base_delta`` (each with ``num_samples`` samples) may release, the slack
    factor, and the procedure's failure probability (union bound over its tests).
    """
    k = int(num_tests)

    def objective(log_tau):
        tau = math.exp(log_tau)
        return tau * base_delta + k * failure_probability(num_samples, base_delta, tau)

    from scipy import optimize

    hi = -math.log(base_delta)
    res = optimize.minimize_scalar(objective, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-10})
    value, log_tau = min([(objective(res.x), res.x), (objective(0.0), 0.0), (objective(hi), hi)])
    tau = math.exp(log_tau)
    return min(value, 1.0), tau, k * failure_probability(num_samples, base_delta, tau)


def base_delta_for_target(num_samples: int, target_delta: float, num_tests: int = 1) -> float | None:
    """Largest ``base_delta`` whose :func:`overall_delta` is ``<= target_delta`` (or ``None``).

    ``overall_delta`` increases with ``base_delta``; bisection in log space, returning the lower
    (safe) end of the final bracket.
    """
    lo, hi = target_delta * 1e-12, target_delta
    if overall_delta(num_samples, lo, num_tests)[0] > target_delta:
        return None
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if overall_delta(num_samples, mid, num_tests)[0] <= target_delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return lo


def minimum_samples(target_delta: float, base_delta: float | None = None, num_tests: int = 1) -> int:
    """Smallest ``m`` for which a procedure of ``num_tests`` tests can certify ``target_delta``.

    With ``base_delta=None``: the smallest ``m`` for which some ``base_delta`` works (about
    ``log(m num_tests) / target_delta``; Choquette-Choo et al. 2024: "about 1/delta samples are
    the minimum"); else the minimum for verifying against that ``base_delta``.
    """

    def ok(m: int) -> bool:
        if base_delta is None:
            return base_delta_for_target(m, target_delta, num_tests) is not None
        return overall_delta(m, base_delta, num_tests)[0] <= target_delta

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


def default_samples(target_delta: float, num_tests: int = DEFAULT_LADDER_RUNGS,
                    base_fraction: float = 0.4) -> int:
    """Smallest power of two (>= 2^16) whose ``base_delta >= base_fraction * target_delta`` for a
    procedure of ``num_tests`` tests.  With the 8-rung ladder: 2^23 at ``delta = 1e-5``, 2^20 at
    ``1e-3``."""
    m = 1 << 16
    while True:
        base = base_delta_for_target(m, target_delta, num_tests)
        if base is not None and base >= base_fraction * target_delta:
            return m
        m *= 2


# --------------------------------------------------------------------------- the record


@dataclasses.dataclass(frozen=True)
class Certificate(ResultMixin):
    """Outcome of an Estimate-Verify-Release procedure (one record for every procedure).

    Attributes:
      verified: a noise multiplier passed its test (both adjacency directions).
      method: how the verification bounds the true delta (``"bernoulli_kl"``: the Hoeffding /
        Bernoulli-KL bound of the mean of ``[0, 1]`` terms).
      procedure: ``"fixed"`` (one given noise multiplier) or ``"ladder"`` (a calibrated noise
        multiplier, then a pre-committed ladder of noise multipliers on one verification sample).
      epsilon: the certified epsilon.
      delta: the certified delta ``tau * base_delta + failure_probability`` (``<= target_delta``)
        if verified, else ``inf`` (nothing certified).
      target_delta: requested.
      base_delta: the threshold the estimate had to meet.
      tau: the slack factor of the true delta that the failure probability covers.
      failure_probability: the chance that the procedure releases a noise multiplier whose true
        delta exceeds ``tau * base_delta``: ``num_tests`` times the one-test bound.
      num_tests: tests the procedure can run (the union bound's count).
      num_samples: samples of the verification (per test; the ladder's tests share one sample).
      calibration_samples: samples of the independent calibration sample (0 for ``"fixed"``).
      noise_multiplier: the noise multiplier the certificate is about: the released rung of a
        ladder (``inf`` if none verified), the given one of a ``"fixed"`` test (certified only
        if ``verified``).
      noise_multiplier_estimate: the calibrated noise multiplier the procedure started from (the
        given one for ``"fixed"``).
      delta_estimate, standard_error: the verification estimate at the last tested noise
        multiplier (max over directions) and its standard error.
      delta_remove, delta_add: per-direction estimates there.
      tests_run: tests run before the release (or all of them).
      growth: ratio between consecutive ladder rungs (1 for ``"fixed"``).
      reason: one line explaining the outcome.

    ``to_dict()`` / ``to_json(path)`` / ``Certificate.load(path)``: see :mod:`dpjax._results`.
    """

    verified: bool
    method: str
    procedure: str
    epsilon: float
    delta: float
    target_delta: float
    base_delta: float
    tau: float
    failure_probability: float
    num_tests: int
    num_samples: int
    calibration_samples: int
    noise_multiplier: float
    noise_multiplier_estimate: float
    delta_estimate: float
    standard_error: float
    delta_remove: float
    delta_add: float
    tests_run: int
    growth: float
    reason: str

    def as_dict(self) -> dict:
        """Alias of :meth:`to_dict`."""
        return self.to_dict()


# --------------------------------------------------------------------------- procedures


def _plan(num_samples: int, target: float, num_tests: int):
    base = base_delta_for_target(num_samples, target, num_tests)
    if base is None:
        need = minimum_samples(target, num_tests=num_tests)
        raise ValueError(
            f"num_samples = {num_samples} is too small to certify target_delta = {target:g} with "
            f"{num_tests} test(s); need num_samples >= {need} (use ~{default_samples(target, num_tests)} "
            f"to verify ~0.4 * target_delta)")
    overall, tau, beta_total = overall_delta(num_samples, base, num_tests)
    return base, overall, tau, beta_total


def certify_fixed(accountant, noise_multiplier: float, epsilon: float, target_delta: float,
                  num_samples: int, key, *, chunk_size=None, devices=None) -> Certificate:
    """One test: is ``(epsilon, target_delta)`` certified for the given noise multiplier?

    The implementation of :meth:`dpjax.montecarlo.BallsInBins.certify` (arguments validated
    there).  ``num_tests = 1``: the noise multiplier is fixed before the draws.
    """
    sigma, eps, target, m = float(noise_multiplier), float(epsilon), float(target_delta), int(num_samples)
    base, overall, tau, beta = _plan(m, target, 1)
    est = accountant.estimate(sigma, np.array([eps]), m, key, chunk_size=chunk_size, devices=devices)
    d_hat = float(est.delta[0])
    verified = d_hat <= base
    if verified:
        reason = (f"verified: delta_hat = {d_hat:.4g} <= base_delta = {base:.4g} with {m} samples; "
                  f"(eps, tau*base_delta + beta) = ({eps:g}, {overall:.4g})")
    else:
        reason = (f"not verified: delta_hat = {d_hat:.4g} > base_delta = {base:.4g}; nothing certified "
                  "(raise noise_multiplier, epsilon or num_samples)")
    return Certificate(
        verified=bool(verified), method="bernoulli_kl", procedure="fixed", epsilon=eps,
        delta=float(overall) if verified else math.inf, target_delta=target, base_delta=float(base),
        tau=float(tau), failure_probability=float(beta), num_tests=1, num_samples=m,
        calibration_samples=0, noise_multiplier=sigma, noise_multiplier_estimate=sigma, delta_estimate=d_hat,
        standard_error=float(est.standard_error[0]), delta_remove=float(est.delta_remove[0]),
        delta_add=float(est.delta_add[0]), tests_run=1, growth=1.0, reason=reason)


@functools.lru_cache(maxsize=32)
def _calibration_fn(num_samples: int):
    import jax

    from dpjax.calibration.montecarlo import NewtonIllinois, calibrate_on_draws
    from dpjax.calibration.root import StopGradientAdjoint

    def run(gram, eps, base, key, sigma0):
        return calibrate_on_draws(gram, eps, base, key=key, num_samples=num_samples,
                                  solver=NewtonIllinois(xtol=1e-10), adjoint=StopGradientAdjoint(),
                                  initial_noise=sigma0, precompute=False)

    return jax.jit(run)


def certify_noise(accountant, *, target_epsilon: float, target_delta: float, num_samples: int, key,
                  initial_noise: float | None = None, rungs: int = DEFAULT_LADDER_RUNGS,
                  growth: float = DEFAULT_LADDER_GROWTH,
                  calibration_samples: int | None = None) -> Certificate:
    """A certified noise multiplier for ``accountant`` (a :class:`~dpjax.montecarlo.BallsInBins`)
    at ``(target_epsilon, target_delta)``: calibrate, then verify a pre-committed ladder.

    Procedure (Choquette-Choo et al. 2024, §5.2, certify ``delta`` through a verified smaller
    ``base_delta``); the two samples come from ``fold_in(key, 0)`` and ``fold_in(key, 1)``:

    1. ``sigma_0`` solves ``delta_hat_cal(sigma) = base_delta`` on the calibration sample
       (``calibration_samples`` draws, default ``num_samples // 4``; it only places the ladder).
    2. The ladder ``sigma_j = sigma_0 growth^j``, ``j < rungs``, is fixed before the
       verification sample (``num_samples`` draws, independent of step 1) is drawn; the first
       rung with ``delta_hat_ver(sigma_j) <= base_delta`` (both directions) is released.
    3. ``rungs`` tests: ``base_delta`` is the largest value with
       ``tau base_delta + rungs * beta <= target_delta`` (:func:`overall_delta`).

    The true delta is non-increasing in ``sigma`` (more noise is post-processing), so the
    released rung is never worse than any bad rung it passed over.  If no rung verifies, the
    certificate says so (``verified = False``, ``noise_multiplier = inf``).

    Raises:
      ValueError: ``num_samples`` below what can certify ``target_delta`` with ``rungs`` tests
        (says the minimum); a target no noise multiplier in the search range reaches.
    """
    import jax
    import jax.numpy as jnp

    from dpjax.montecarlo.core import as_prng_key

    eps = float(_validate.positive("target_epsilon", target_epsilon))
    target = float(_validate.probability_open("target_delta", target_delta))
    m = _validate.positive_int("num_samples", num_samples)
    rungs = _validate.positive_int("rungs", rungs)
    m_cal = max(1, m // 4) if calibration_samples is None else _validate.positive_int(
        "calibration_samples", calibration_samples)
    growth = float(_validate.positive("growth", growth))
    if not growth > 1.0:
        raise ValueError(f"growth must be > 1, got {growth}")
    base, overall, tau, beta_total = _plan(m, target, rungs)
    key = as_prng_key(key)
    key_cal, key_ver = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    sigma0_guess = accountant.sensitivity if initial_noise is None else float(initial_noise)
    with jax.enable_x64(True):
        res = _calibration_fn(m_cal)(jnp.asarray(accountant.gram), eps, base, key_cal, sigma0_guess)
    sigma0 = float(res.root)
    if not math.isfinite(sigma0):
        raise ValueError(f"target (epsilon={eps:g}, delta={target:g}) is not reached by any noise "
                         "multiplier in the search range")
    released, est, tries = math.inf, None, 0
    for j in range(rungs):
        sigma = sigma0 * growth ** j
        tries = j + 1
        est = accountant.estimate(sigma, np.array([eps]), m, key_ver)
        if float(est.delta[0]) <= base:
            released = sigma
            break
    verified = math.isfinite(released)
    d_hat = float(est.delta[0])
    if verified:
        reason = (f"verified: delta_hat = {d_hat:.4g} <= base_delta = {base:.4g} at sigma = {released:.6g} "
                  f"(rung {tries} of {rungs}) with {m} independent samples; "
                  f"(eps, tau*base_delta + {rungs}*beta) = ({eps:g}, {overall:.4g})")
    else:
        reason = (f"not verified: delta_hat = {d_hat:.4g} > base_delta = {base:.4g} at every rung up to "
                  f"sigma = {sigma0 * growth ** (rungs - 1):.6g}; nothing certified")
    return Certificate(
        verified=bool(verified), method="bernoulli_kl", procedure="ladder", epsilon=eps,
        delta=float(overall) if verified else math.inf, target_delta=target, base_delta=float(base),
        tau=float(tau), failure_probability=float(beta_total), num_tests=rungs, num_samples=m,
        calibration_samples=m_cal, noise_multiplier=released, noise_multiplier_estimate=sigma0,
        delta_estimate=d_hat, standard_error=float(est.standard_error[0]),
        delta_remove=float(est.delta_remove[0]), delta_add=float(est.delta_add[0]), tests_run=tries,
        growth=growth, reason=reason)
