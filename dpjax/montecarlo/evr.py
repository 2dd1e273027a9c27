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

from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.results import ResultMixin
from dpjax.numerics.root import HostBisection

# scipy is imported inside the functions that use it: importing scipy.optimize costs ~0.4 s of a
# cold start, and most users of the Monte Carlo layer never reach Estimate-Verify-Release.

__all__ = ["Certificate", "bernoulli_kl", "failure_probability", "overall_delta",
           "base_delta_for_target", "minimum_samples", "default_samples", "certify_noise",
           "certify_fixed", "CertificateMethod", "Ladder", "DEFAULT_LADDER_RUNGS", "DEFAULT_LADDER_GROWTH"]

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
    return _BASE_DELTA_BISECTION.root(lambda b: overall_delta(num_samples, b, num_tests)[0] <= target_delta,
                                      lo, hi)


#: ``log base_delta`` halved to 1e-9 relative (35 halvings of the 1e12 ratio); the lower end is kept.
_BASE_DELTA_BISECTION = HostBisection(safe="lower", scale="log", rtol=1e-9, max_halvings=100)


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
    from dpjax.numerics.root import bisect_integer

    return bisect_integer(ok, hi // 2 if hi > 1 else 0, hi)


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
      method: how the verification bounds the true delta: ``"importance_betting"`` (the
        variance-reduced summands of :mod:`dpjax.montecarlo.importance`, each direction a betting
        test of its mean against ``base_delta`` with a bet fixed before the draws) or
        ``"bernoulli_kl"`` (the plain hockey-stick terms in ``[0, 1]``, the Hoeffding /
        Bernoulli-KL bound).
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
      range_remove, range_add: the proven upper bound of one summand per direction at the
        released (or last tested) noise multiplier (1 for ``"bernoulli_kl"``).
      reason: one line explaining the outcome.
      proposal: the sampling law of the verification: ``"plain"`` (``"bernoulli_kl"``) or the
        mixture weights of the variance-reduced proposal's P||Q components (defensive, per-mode
        range, large-deviation shift, tilted of order k).

    ``to_dict()`` / ``to_json(path)`` / ``Certificate.load(path)``: see :mod:`dpjax._base.results`.
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
    range_remove: float
    range_add: float
    reason: str
    proposal: str = "plain"

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


def _certify_fixed_kl(accountant, noise_multiplier: float, epsilon: float, target_delta: float,
                      num_samples: int, key, *, chunk_size=None, devices=None) -> Certificate:
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
        delta_add=float(est.delta_add[0]), tests_run=1, growth=1.0, range_remove=1.0, range_add=1.0,
        reason=reason)


@functools.lru_cache(maxsize=32)
def _calibration_fn(num_samples: int, devices=None):
    import jax

    from dpjax.numerics.root import StopGradientAdjoint
    from dpjax.montecarlo.calibrate import DrawPlan, NewtonIllinois, calibrate_on_draws

    def run(gram, eps, base, key, sigma0):
        plan = DrawPlan(key=key, num_samples=num_samples, precompute=False, devices=devices)
        return calibrate_on_draws(gram, eps, base, plan, solver=NewtonIllinois(xtol=1e-10),
                                  adjoint=StopGradientAdjoint(), initial_noise=sigma0)

    return jax.jit(run)


def _certify_ladder_kl(accountant, *, target_epsilon: float, target_delta: float, num_samples: int, key,
                       initial_noise: float | None = None, rungs: int = DEFAULT_LADDER_RUNGS,
                       growth: float = DEFAULT_LADDER_GROWTH,
                       calibration_samples: int | None = None, devices=None) -> Certificate:
    """The ``"bernoulli_kl"`` ladder of :func:`certify_noise` (plain draws, arguments validated)."""
    import jax
    import jax.numpy as jnp

    from dpjax.montecarlo.core import as_prng_key

    eps, target, m = float(target_epsilon), float(target_delta), int(num_samples)
    m_cal = max(1, m // 4) if calibration_samples is None else int(calibration_samples)
    base, overall, tau, beta_total = _plan(m, target, rungs)
    key = as_prng_key(key)
    key_cal, key_ver = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    sigma0_guess = accountant.sensitivity if initial_noise is None else float(initial_noise)
    ladder_calibration = getattr(accountant, "_ladder_calibration", None)
    if ladder_calibration is not None:
        # An accountant without a Gram matrix (b-min-sep) calibrates sigma_0 on its own estimate.
        sigma0 = ladder_calibration(eps, base, key_cal, m_cal, sigma0_guess)
    else:
        with jax.enable_x64(True):
            res = _calibration_fn(m_cal, _device_key(devices))(jnp.asarray(accountant.gram), eps, base, key_cal,
                                                               sigma0_guess)
        sigma0 = float(res.root)
    if not math.isfinite(sigma0):
        raise ValueError(f"target (epsilon={eps:g}, delta={target:g}) is not reached by any noise "
                         "multiplier in the search range")
    released, est, tries = math.inf, None, 0
    for j in range(rungs):
        sigma = sigma0 * growth ** j
        tries = j + 1
        est = accountant.estimate(sigma, np.array([eps]), m, key_ver, devices=devices)
        if float(est.delta[0]) <= base:
            released = sigma
            break
    d_hat = float(est.delta[0])
    return _ladder_certificate(
        eps, overall, rungs, released, tries, growth,
        passed=f"delta_hat = {d_hat:.4g} <= base_delta = {base:.4g}", samples=f"{m} independent samples",
        bound=f"tau*base_delta + {rungs}*beta", failed=f"delta_hat = {d_hat:.4g} > base_delta = {base:.4g}",
        top_sigma=sigma0 * growth ** (rungs - 1), failed_detail="",
        method="bernoulli_kl", target_delta=target, base_delta=float(base),
        tau=float(tau), failure_probability=float(beta_total), num_samples=m,
        calibration_samples=m_cal, noise_multiplier_estimate=sigma0,
        delta_estimate=d_hat, standard_error=float(est.standard_error[0]),
        delta_remove=float(est.delta_remove[0]), delta_add=float(est.delta_add[0]),
        range_remove=1.0, range_add=1.0)


def _ladder_certificate(eps, delta, rungs, released, tries, growth, *, passed, samples, bound, failed, top_sigma,
                        failed_detail, **fields) -> Certificate:
    """The certificate of a ladder of ``rungs`` tests, as both procedures word it: verified when a
    rung passed (``released`` finite, at rung ``tries``), certifying ``(eps, delta)``; else nothing
    (delta ``inf``).  The reason names the test that passed (``passed``, with ``samples``; ``delta``
    is ``bound``) or the one that ``failed`` at every rung up to ``top_sigma``; ``fields``: the
    procedure's own fields of :class:`Certificate`."""
    verified = math.isfinite(released)
    if verified:
        reason = (f"verified: {passed} at sigma = {released:.6g} (rung {tries} of {rungs}) with {samples}; "
                  f"(eps, {bound}) = ({eps:g}, {delta:.4g})")
    else:
        reason = f"not verified: {failed} at every rung up to sigma = {top_sigma:.6g}{failed_detail}; nothing certified"
    return Certificate(
        verified=bool(verified), procedure="ladder", epsilon=eps, delta=float(delta) if verified else math.inf,
        num_tests=rungs, noise_multiplier=released, tests_run=tries, growth=growth, reason=reason, **fields)


# --------------------------------------------------------------------------- betting (variance-reduced)
#
# The summands X of :mod:`dpjax.montecarlo.importance` are i.i.d., unbiased for one direction's
# delta, and lie in [0, R] with R proven by :func:`~dpjax.montecarlo.importance.summand_range`.
# Test of "delta <= level" with a bet lam in [0, 1/(R - level)) fixed before the draws (Waudby-Smith
# & Ramdas 2023, "Estimating means of bounded random variables by betting", the wealth process):
# pass iff  sum_s log(1 + lam (level - X_s)) >= log(1/beta).  Each factor is >= 0 (X <= R), and if
# delta > level its expectation is 1 + lam (level - delta) <= 1, so the product of the
# independent factors has expectation <= 1 and Markov's inequality bounds the chance of passing
# by beta.  A direction whose R is at most the level needs no test: delta = E[X] <= R <= level.

#: Share of the target delta given to the failure probability of the whole procedure.
DEFAULT_FAILURE_FRACTION = 0.005
#: Bets per direction evaluated on the calibration sample to choose the bet (a grid of
#: fractions of the largest admissible bet).
_BET_GRID = np.geomspace(1e-4, 0.999, 48)
#: Mixture weights of the range component the certificate chooses from (on the calibration
#: sample).  The proven range falls about as 1 / weight, the low-variance component keeps
#: 0.95 - weight: where the range binds (the betting cap 1 / (R - level)) a large weight pays.
_RANGE_WEIGHTS = (0.1, 0.3, 0.6, 0.9)
#: ``(range_weight, tilt_weight)`` of the candidates with a tilted component (its order chosen
#: by its proven range): the tilt bounds the range by a Renyi-moment (Chernoff) bound of the
#: amplified mechanism, the large-deviations component keeps the rest of the weight.
_TILT_MIXES = ((0.0, 0.3), (0.0, 0.5), (0.0, 0.7), (0.0, 0.95), (0.1, 0.5))
#: Candidates of the one-test certificate (:func:`certify_fixed`).
_FIXED_RANGE_WEIGHTS = (0.3,)
_FIXED_TILT_MIXES = ((0.0, 0.5), (0.0, 0.95))
#: Sample counts the variance-reduced certificate chooses from when none is given.
DEFAULT_BETTING_SAMPLES = (1 << 16, 1 << 22)
#: Allowance for the sampler: the total variation between the law the draws have and the ideal
#: proposal, per sample, times the largest summand any proposal with the defensive weight 0.05
#: can produce (20).  ``(b + 2) 2^-52``: Box-Muller radii truncated at mass 2^-53 per pair and
#: 52-bit uniforms (:mod:`dpjax.montecarlo._normal`); ``4 (b + 3)^2 2^-52``: the up to four
#: inverse-distribution draws of a tilted component's modes (52-bit uniforms, rounding of the
#: weights and of their cumulative sums).  Subtracted from the tested level.
def _sampler_allowance(b: int) -> float:
    return ((b + 2) + 4 * (b + 3) ** 2) * 2.0 ** -52 * 20.0


def _first_crossing(log_sigmas, wealth, threshold, reach):
    """Smallest ``log sigma`` where the piecewise-linear interpolation of ``wealth`` (at increasing
    ``log_sigmas``) reaches ``threshold``, extrapolating the end segments by at most ``reach``;
    ``(log sigma, slope there)`` or ``None``.  Planning only."""
    x, y = np.asarray(log_sigmas, np.float64), np.asarray(wealth, np.float64)
    if not np.all(np.isfinite(y)):
        return None
    slopes = np.diff(y) / np.diff(x)
    if y[0] >= threshold:   # already passing at the first point: extrapolate downwards
        if slopes[0] <= 0:
            return x[0], max(slopes[0], 1e-300)
        return max(x[0] - (y[0] - threshold) / slopes[0], x[0] - reach), slopes[0]
    for i in range(len(slopes)):
        if y[i + 1] >= threshold and slopes[i] > 0:
            return x[i] + (threshold - y[i]) / slopes[i], slopes[i]
    if slopes[-1] > 0:
        hit = x[-1] + (threshold - y[-1]) / slopes[-1]
        if hit <= x[-1] + reach:
            return hit, slopes[-1]
    return None


def _betting_margin(mean: float, var: float, rng: float, level: float, n: int, log_inv_beta: float,
                    cap_fraction: float = 0.999) -> float:
    """Predicted largest true mean (at the pilot's relative variance) at which the betting test
    at ``level`` reaches ``log_inv_beta`` in expectation with ``n`` samples and the best bet up to
    ``cap_fraction / (R - level)`` (second-order expansion of ``log(1 + x)``); 0 if none.
    Planning only: never a bound."""
    if rng <= level:
        return level
    rel = var / mean ** 2 if mean > 0 and var > 0 else math.inf
    cap = cap_fraction / (rng - level)

    def wealth(mu):
        v = rel * mu * mu if math.isfinite(rel) else rng * mu
        gap = level - mu
        lam = min(gap / (v + gap * gap), cap)
        return n * (lam * gap - 0.5 * lam * lam * (v + gap * gap))

    if wealth(0.0) < log_inv_beta:
        return 0.0
    return _BETTING_MARGIN_BISECTION.root(lambda mu: wealth(mu) >= log_inv_beta, 0.0, level)


#: 60 halvings of ``[0, level]``; the lower end (expected wealth reaches the threshold) is kept.
_BETTING_MARGIN_BISECTION = HostBisection(safe="lower", max_halvings=60)


@functools.lru_cache(maxsize=32)
def _importance_calibration_fn(num_samples: int, devices=None):
    import jax

    from dpjax.numerics.root import StopGradientAdjoint
    from dpjax.montecarlo.calibrate import DrawPlan, NewtonIllinois, calibrate_on_draws

    def run(gram, eps, key, sigma0, proposal, scale):
        plan = DrawPlan(key=key, num_samples=num_samples, proposal=proposal, direction_scale=scale,
                        devices=devices)
        return calibrate_on_draws(gram, eps, 1.0, plan, solver=NewtonIllinois(xtol=1e-10),
                                  adjoint=StopGradientAdjoint(), initial_noise=sigma0)

    return jax.jit(run)


def _sums(accountant, sigma, eps, key, n, proposal, bets=None, level=None, devices=None):
    """Sums over ``n`` variance-reduced draws; bets always padded to ``(2, 1, len(_BET_GRID))``
    so that one compiled program serves every call with the same ``n``."""
    import jax.numpy as jnp

    from dpjax.montecarlo.importance import sharded_importance_sums

    padded = np.zeros((2, 1, _BET_GRID.size))
    if bets is not None:
        padded[:, :, : np.shape(bets)[-1]] = bets
    with _x64():
        out = sharded_importance_sums(jnp.asarray(accountant.gram), sigma, jnp.array([eps]), key, n, proposal,
                                      jnp.asarray(padded), jnp.array([0.0 if level is None else level]),
                                      devices=devices)
        return {k: np.asarray(v) for k, v in out._asdict().items()}


def _betting_test(accountant, sigma, eps, key, n, proposal, bets, level, log_inv_beta, ranges, devices=None):
    """One test (both directions) at ``sigma``: pass iff each direction's log-wealth with its bet
    reaches ``log_inv_beta`` (or its range is at most ``level``).  Returns ``(passed, sums)``."""
    lam = np.array([[[bets[d] if ranges[d] > level else 0.0]] for d in range(2)])
    out = _sums(accountant, sigma, eps, key, n, proposal, bets=lam, level=level, devices=devices)
    wealth = out["log_wealth"][:, 0, 0]
    passed = all(ranges[d] <= level or (np.isfinite(wealth[d]) and wealth[d] >= log_inv_beta) for d in range(2))
    return passed, out


def _x64():
    import jax

    return jax.enable_x64(True)


def _moments(sums, n):
    """Per-direction sample mean and (unbiased) variance of the summands.  Sums that overflowed
    (the weights of an extreme noise multiplier) have no finite variance: it is inf, never the
    NaN of ``inf - inf``, so a reported standard error says "unbounded" instead of nothing."""
    mean = sums["total"][:, 0] / n
    total_sq = sums["total_sq"][:, 0]
    finite = np.isfinite(mean) & np.isfinite(total_sq)
    with np.errstate(invalid="ignore", over="ignore"):
        var = np.maximum(total_sq / n - mean * mean, 0.0) * (n / max(n - 1, 1))
    return mean, np.where(finite, var, np.inf)


def _device_key(devices):
    """``devices`` as a hashable cache key (``None``: every device)."""
    return None if devices is None else tuple(devices)


def _calibrate_is(accountant, eps, key, m, sigma0, proposal, scale, devices=None):
    import jax.numpy as jnp

    with _x64():
        res = _importance_calibration_fn(m, _device_key(devices))(jnp.asarray(accountant.gram), eps, key, sigma0,
                                                                  proposal, jnp.asarray(scale, jnp.float64))
    return float(res.root)


@functools.lru_cache(maxsize=1)
def _proposal_fn():
    import jax

    from dpjax.montecarlo.importance import default_proposal

    return jax.jit(lambda g, s, e, w, t: default_proposal(g, s, e, range_weight=w, tilt_weights=t))


def _proposal(accountant, sigma, eps, range_weight, tilt=(0.0, 0.0, 0.0)):
    with _x64():
        p = _proposal_fn()(accountant.gram, float(sigma), float(eps), float(range_weight),
                           np.asarray(tilt, np.float64))
        return type(p)(*(np.asarray(x) for x in p))


def _tilt_order(accountant, sigma, eps):
    """Index (into ``TILT_ORDERS``) of the tilt whose pure component has the smallest proven range
    at ``(sigma, eps)``; ``None`` if none is finite."""
    from dpjax.montecarlo.importance import NUM_TILTS, summand_range

    best, order = math.inf, None
    for j in range(NUM_TILTS):
        tilt = np.zeros(NUM_TILTS)
        tilt[j] = 0.95
        r = summand_range(accountant.gram, sigma, eps, _proposal(accountant, sigma, eps, 0.0, tilt))[0]
        if r < best:
            best, order = r, j
    return order


def _candidates(accountant, sigma, eps, range_weights=None, tilt_mixes=None):
    """Proposals the certificate chooses from: ``(range_weight, tilt_weights)``, the tilted ones at
    the order of :func:`_tilt_order`."""
    from dpjax.montecarlo.importance import NUM_TILTS

    order = _tilt_order(accountant, sigma, eps)
    out = [(w, np.zeros(NUM_TILTS)) for w in (_RANGE_WEIGHTS if range_weights is None else range_weights)]
    if order is not None:
        for w, t in (_TILT_MIXES if tilt_mixes is None else tilt_mixes):
            tilt = np.zeros(NUM_TILTS)
            tilt[order] = t
            out.append((w, tilt))
    return out


def _describe(proposal) -> str:
    from dpjax.montecarlo.importance import TILT_ORDERS

    w = np.asarray(proposal.fwd_weight)
    parts = [f"defensive {w[0]:.2g}", f"per-mode range {w[1]:.2g}", f"large-deviation {w[2]:.2g}"]
    parts += [f"tilt order {k} {t:.2g}" for k, t in zip(TILT_ORDERS, np.asarray(proposal.fwd_tilt)) if t > 0]
    return ", ".join(parts)


def _bets_for(ranges, level, fractions):
    """Admissible bets ``fraction / (R - level)`` per direction (inf-range directions: 0)."""
    out = np.zeros((2, 1, len(fractions)))
    for d in range(2):
        if math.isfinite(ranges[d]) and ranges[d] > level:
            out[d, 0, :] = np.asarray(fractions) / (ranges[d] - level)
    return out


def _not_reached(eps, target):
    return ValueError(f"target (epsilon={eps:g}, delta={target:g}) is not reached by any noise "
                      "multiplier in the search range")


def _calibration_estimate(accountant, eps, target, key_cal, m_cal, initial_noise, level0, devices=None):
    """Step 1: place the proposal near the answer on the calibration sample (two rounds from a
    given ``initial_noise``, else three: the proposal's shifts are chosen at a noise multiplier,
    then the estimate is solved with it).  ``(sigma estimate, the proposal it was solved with)``."""
    sigma = accountant.sensitivity if initial_noise is None else float(initial_noise)
    for _ in range(2 if initial_noise is not None else 3):
        prop = _proposal(accountant, sigma, eps, 0.3)
        sigma = _calibrate_is(accountant, eps, key_cal, m_cal, sigma, prop, (1 / level0, 1 / level0), devices)
        if not math.isfinite(sigma):
            raise _not_reached(eps, target)
    return sigma, prop


def _choose_plan(accountant, sigma, eps, target, key_cal, m_cal, n, level, log_inv_beta, devices):
    """Step 2: the proposal (mixture weights of the range and tilted components) and the sample
    count.  For each candidate, the proven range and the summands' moments on (a part of) the
    calibration sample predict the largest mean the test can pass (planning only).  Returns
    ``(n, proposal, mus)``: ``mus`` the predicted passing mean of each direction (length 2);
    raises ``ValueError`` when not even an all-zero sample of the chosen size would pass."""
    from dpjax.montecarlo.importance import summand_range

    m_screen = min(m_cal, 1 << 16)
    sizes = [n] if n else [1 << k for k in range(16, 23)]
    plans = []   # (needed reduction of the binding direction's delta, size, proposal, mus)
    candidates = [_proposal(accountant, sigma, eps, w, t) for w, t in _candidates(accountant, sigma, eps)]
    ranges = []
    for prop_w in candidates:
        rng = summand_range(accountant.gram, sigma, eps, prop_w)
        ranges.append(max(rng))
        if not all(math.isfinite(r) for r in rng):
            continue
        mean_w, var_w = _moments(_sums(accountant, sigma, eps, key_cal, m_screen, prop_w, devices=devices),
                                 m_screen)
        for size in sizes:
            mus = [_betting_margin(mean_w[d], var_w[d], rng[d], level, size, log_inv_beta) for d in range(2)]
            need = (max(mean_w[d] / mus[d] for d in range(2)) if min(mus) > 0 else math.inf)
            plans.append((need, size, prop_w, mus))
    good = [p for p in plans if p[0] <= 1.1]
    if good:   # the smallest size predicted to release within 10% in delta, its best proposal
        size = min(p[1] for p in good)
        best = min((p for p in good if p[1] == size), key=lambda p: p[0])
    elif plans:
        size = max(sizes)
        best = min((p for p in plans if p[1] == size), key=lambda p: p[0])
    else:
        best = (math.inf, max(sizes), candidates[0], [0.0, 0.0])
    need, n, prop, mus = best
    if not math.isfinite(need) or min(mus) <= 0.0:
        # Not even an all-zero sample would pass: n log(1 + level / (R - level)) < log(K / beta)
        # for the smallest range any candidate gives.
        worst = min(ranges)
        required = int(math.ceil(log_inv_beta * max(worst - level, 0.0) / level))
        raise ValueError(
            f"num_samples = {n} cannot certify target_delta = {target:g} at epsilon = {eps:g}: the "
            f"variance-reduced summands are only proven to be <= {worst:.3g} here, and a betting test "
            f"needs about num_samples >= {required} to pass even at a zero estimate; pass more samples or "
            "method='bernoulli_kl'")
    return n, prop, mus


def _choose_bets(accountant, sigma_a, eps, key_cal, m_cal, n, prop, level, log_inv_beta, devices):
    """Step 4: the bet of each direction and the predicted passing point.  The calibration
    sample's log-wealth for every bet of a grid, at three noise multipliers around ``sigma_a``,
    scaled to ``n`` draws, predicts the verification wealth as a function of log sigma (piecewise
    linear, extrapolated at most 5% beyond); each direction takes the bet whose predicted wealth
    reaches log(K / beta) at the smallest sigma.  The noise of that prediction (calibration and
    verification draws) sets the rung spacing.  Returns ``(bets (2,), aim sigma, relative
    spread)``."""
    from dpjax.montecarlo.importance import summand_range

    points = sigma_a * np.array([0.99, 1.0, 1.01])
    top_range = np.max([summand_range(accountant.gram, sp, eps, prop) for sp in points], axis=0)
    grid = _bets_for(top_range, level, _BET_GRID)
    pilots = [_sums(accountant, sp, eps, key_cal, m_cal, prop, bets=grid, level=level, devices=devices)
              for sp in points]
    wealth = np.stack([pl["log_wealth"][:, 0, :] for pl in pilots]) * (n / m_cal)   # (3, 2, J)
    log_pts = np.log(points)
    bet = np.zeros(2)
    aims, spreads = [], []
    for d in range(2):
        if grid[d, 0, -1] <= 0.0:   # range <= level: passes without a test
            continue
        best = None   # (predicted passing log sigma, bet index, slope there)
        for j in range(grid.shape[-1]):
            hit = _first_crossing(log_pts, wealth[:, d, j], log_inv_beta, 0.05)
            if hit is not None and (best is None or hit[0] < best[0]):
                best = (hit[0], j, hit[1])
        if best is None:   # no bet is predicted to pass nearby: the largest, aimed at sigma_a (1 + 5%)
            bet[d] = grid[d, 0, -1]
            aims.append(float(points[1]) * 1.05)
            spreads.append(0.004)
            continue
        log_aim, j, slope = best
        bet[d] = grid[d, 0, j]
        near = int(np.argmin(np.abs(log_pts - log_aim)))
        _, var_near = _moments(pilots[near], m_cal)
        sd = bet[d] * math.sqrt(n * var_near[d] * (1.0 + n / m_cal))
        aims.append(math.exp(log_aim))
        spreads.append(min(max(sd / slope, 1e-4), 0.02))
    if aims:
        top = int(np.argmax(aims))
        return bet, aims[top], spreads[top]
    return bet, sigma_a, 0.004


def _verify_ladder(accountant, eps, key_ver, n, prop, bet, level, log_inv_beta, sigma0, growth, rungs, devices):
    """Step 5: verify the pre-committed ladder ``sigma0 growth^j`` on the independent
    verification sample, stopping at the first rung that passes.  ``(released sigma or inf,
    rungs tried, (sigma, ranges, sums) of the last rung tried)``."""
    from dpjax.montecarlo.importance import summand_range

    released, tries, last = math.inf, 0, None
    for j in range(rungs):
        sig = sigma0 * growth ** j
        tries = j + 1
        rng = summand_range(accountant.gram, sig, eps, prop)
        lam = [min(bet[d] if bet[d] > 0 else 0.5 / (rng[d] - level), 0.999 / (rng[d] - level))
               if rng[d] > level else 0.0 for d in range(2)]
        passed, out = _betting_test(accountant, sig, eps, key_ver, n, prop, lam, level, log_inv_beta, rng,
                                    devices=devices)
        last = (sig, rng, out)
        if passed:
            released = sig
            break
    return released, tries, last


def _certify_ladder_betting(accountant, *, eps, target, num_samples, key, initial_noise, rungs, growth,
                            calibration_samples, failure_fraction, devices=None) -> Certificate:
    import jax

    from dpjax.montecarlo.core import as_prng_key

    b = accountant.gram.shape[0]
    beta_total = failure_fraction * target
    log_inv_beta = math.log(rungs / beta_total)
    key = as_prng_key(key)
    key_cal, key_ver = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    n = num_samples
    m_cal = calibration_samples or (max(1 << 14, n // 4) if n else 1 << 17)
    level0 = target - beta_total
    sigma, prop_cal = _calibration_estimate(accountant, eps, target, key_cal, m_cal, initial_noise, level0,
                                            devices)
    level = level0 - _sampler_allowance(b)
    n, prop, mus = _choose_plan(accountant, sigma, eps, target, key_cal, m_cal, n, level, log_inv_beta, devices)
    # 3. Aim at the predicted passing means (each direction scaled to its own): sigma_a.
    scale = [1.0 / max(mu, level * 1e-6) for mu in mus]
    sigma_a = _calibrate_is(accountant, eps, key_cal, m_cal, sigma, prop_cal, scale, devices)
    if not math.isfinite(sigma_a):
        raise _not_reached(eps, target)
    bet, aim, spread = _choose_bets(accountant, sigma_a, eps, key_cal, m_cal, n, prop, level, log_inv_beta,
                                    devices)
    # The ladder: rungs 0.75 predicted standard deviations apart (at least 0.05%), the first one
    # standard deviation below the predicted passing point, so that 8 rungs cover it from -1 to
    # +4.25 standard deviations (the prediction's noise is estimated, and the bet chosen on the
    # same calibration sample is slightly optimistic).
    if growth is None:
        growth = math.exp(max(0.75 * spread, math.log(1.0005)))
        sigma0 = aim * math.exp(-spread)
    else:
        sigma0 = aim
    released, tries, (sig, rng, out) = _verify_ladder(accountant, eps, key_ver, n, prop, bet, level, log_inv_beta,
                                                      sigma0, growth, rungs, devices)
    mean, var = _moments(out, n)
    se = np.sqrt(var / n)
    top = int(np.argmax(mean))
    delta = level + beta_total + _sampler_allowance(b)
    return _ladder_certificate(
        eps, delta, rungs, released, tries, growth,
        passed=f"betting tests of both directions against {level:.4g} passed",
        samples=(f"{n} independent variance-reduced samples "
                 f"(estimate {mean[top]:.4g} +- {se[top]:.2g}, summands <= {max(rng):.3g})"),
        bound="level + failure probability", failed="a betting test failed", top_sigma=sig,
        failed_detail=f" (estimate {mean[top]:.4g} +- {se[top]:.2g} against {level:.4g})",
        method="importance_betting", target_delta=target, base_delta=float(level), tau=1.0,
        failure_probability=float(beta_total), num_samples=int(n), calibration_samples=int(m_cal),
        noise_multiplier_estimate=sigma, delta_estimate=float(mean[top]),
        standard_error=float(se[top]), delta_remove=float(mean[0]), delta_add=float(mean[1]),
        range_remove=float(rng[0]), range_add=float(rng[1]), proposal=_describe(prop))


# --------------------------------------------------------------------------- public procedures

class CertificateMethod(StrEnum):
    """How a certificate bounds the true delta: ``IMPORTANCE_BETTING`` (the default: a betting
    test on importance-weighted draws, tight for small deltas) or ``BERNOULLI_KL`` (a
    Bernoulli-KL bound on plain draws)."""

    IMPORTANCE_BETTING = "importance_betting"
    BERNOULLI_KL = "bernoulli_kl"


#: Certificate methods: the values of :class:`CertificateMethod`.
METHODS = tuple(m.value for m in CertificateMethod)
DEFAULT_METHOD = CertificateMethod.IMPORTANCE_BETTING.value


def _method(method, name: str = "method") -> CertificateMethod:
    return CertificateMethod.parse(method, name)


def certify_fixed(accountant, noise_multiplier: float, epsilon: float, target_delta: float,
                  num_samples: int, key, *, chunk_size=None, devices=None,
                  method: str = "bernoulli_kl", failure_probability: float | None = None) -> Certificate:
    """One test: is ``(epsilon, target_delta)`` certified for the given noise multiplier?

    The implementation of :meth:`dpjax.montecarlo.BallsInBins.certify` (arguments validated
    there).  ``num_tests = 1``: the noise multiplier is fixed before the draws.  ``method``:
    ``"bernoulli_kl"`` (``num_samples`` plain draws from ``key``) or ``"importance_betting"``
    (the proposal -- with or without a tilted component -- and the bets chosen on
    ``max(2^12, num_samples // 4)`` draws from ``fold_in(key, 0)``, the test on ``num_samples``
    draws from ``fold_in(key, 1)``; ``failure_probability``, default ``0.005 target_delta``, is the
    test's ``beta``: the level is ``target_delta - beta`` less the sampler's allowance).
    """
    if _method(method) is CertificateMethod.BERNOULLI_KL:
        return _certify_fixed_kl(accountant, noise_multiplier, epsilon, target_delta, num_samples, key,
                                 chunk_size=chunk_size, devices=devices)
    import jax

    from dpjax.montecarlo.core import as_prng_key
    from dpjax.montecarlo.importance import summand_range

    sigma, eps, target, n = float(noise_multiplier), float(epsilon), float(target_delta), int(num_samples)
    b = accountant.gram.shape[0]
    beta = DEFAULT_FAILURE_FRACTION * target if failure_probability is None else float(failure_probability)
    if not 0.0 < beta < target:
        raise ValueError(f"failure_probability must be in (0, target_delta) = (0, {target:g}), got {beta!r}")
    key = as_prng_key(key)
    key_cal, key_ver = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    level = target - beta - _sampler_allowance(b)
    m_cal = max(1 << 12, n // 4)
    # The proposal (untilted, or with a tilted component) and each direction's bet: the pair whose
    # calibration log-wealth (the weaker direction's best bet) is largest.
    best = None
    for w, tilt in _candidates(accountant, sigma, eps, _FIXED_RANGE_WEIGHTS, _FIXED_TILT_MIXES):
        cand = _proposal(accountant, sigma, eps, w, tilt)
        rng_c = summand_range(accountant.gram, sigma, eps, cand)
        if not all(math.isfinite(r) for r in rng_c):
            continue
        grid_c = _bets_for(rng_c, level, _BET_GRID)
        pilot = _sums(accountant, sigma, eps, key_cal, m_cal, cand, bets=grid_c, level=level, devices=devices)
        lw = pilot["log_wealth"][:, 0, :]
        score = min(np.max(lw[d]) if rng_c[d] > level else math.inf for d in range(2))
        if best is None or score > best[0]:
            best = (score, cand, rng_c, grid_c, np.argmax(lw, axis=1))
    if best is None:
        # No candidate has a finite range in both directions: the untilted proposal, whose test
        # with the bets of an infinite range (0) cannot pass; the certificate says so.
        cand = _proposal(accountant, sigma, eps, _FIXED_RANGE_WEIGHTS[0])
        rng_c = summand_range(accountant.gram, sigma, eps, cand)
        best = (None, cand, rng_c, _bets_for(rng_c, level, _BET_GRID), np.zeros(2, int))
    _, prop, rng, grid, pick = best
    lam = [grid[d, 0, pick[d]] for d in range(2)]
    verified, out = _betting_test(accountant, sigma, eps, key_ver, n, prop, lam, level, math.log(1 / beta), rng,
                                  devices=devices)
    mean, var = _moments(out, n)
    se = np.sqrt(var / n)
    top = int(np.argmax(mean))
    delta = level + beta + _sampler_allowance(b)
    reason = ((f"verified: betting tests of both directions against {level:.4g} passed with {n} variance-reduced "
               f"samples; (eps, level + beta) = ({eps:g}, {delta:.4g})") if verified else
              (f"not verified: estimate {mean[top]:.4g} +- {se[top]:.2g} does not pass the betting test against "
               f"{level:.4g}; nothing certified (raise noise_multiplier, epsilon or num_samples)"))
    return Certificate(
        verified=bool(verified), method="importance_betting", procedure="fixed", epsilon=eps,
        delta=float(delta) if verified else math.inf, target_delta=target, base_delta=float(level), tau=1.0,
        failure_probability=float(beta), num_tests=1, num_samples=n, calibration_samples=m_cal,
        noise_multiplier=sigma, noise_multiplier_estimate=sigma, delta_estimate=float(mean[top]),
        standard_error=float(se[top]), delta_remove=float(mean[0]), delta_add=float(mean[1]), tests_run=1,
        growth=1.0, range_remove=float(rng[0]), range_add=float(rng[1]), reason=reason,
        proposal=_describe(prop))


@dataclasses.dataclass(frozen=True)
class Ladder:
    """The pre-committed ladder of :func:`certify_noise`.

    Attributes:
      rungs: tests, an integer >= 1 (default :data:`DEFAULT_LADDER_RUNGS`); the failure
        probability is a union bound over them.
      growth: ratio between rungs, > 1 (``None``: the method's, see :func:`certify_noise`).
      calibration_samples: draws of the planning (calibration) sample, an integer >= 1
        (``None``: ``num_samples // 4``).
      failure_fraction: ``"importance_betting"``: the share of ``target_delta`` given to the
        procedure's failure probability, in ``(0, 0.5)`` (default 0.005).
    """

    rungs: int = DEFAULT_LADDER_RUNGS
    growth: float | None = None
    calibration_samples: int | None = None
    failure_fraction: float = DEFAULT_FAILURE_FRACTION


def certify_noise(accountant, *, target_epsilon: float, target_delta: float, num_samples: int | None = None,
                  key, initial_noise: float | None = None, method: str = DEFAULT_METHOD,
                  ladder: Ladder = Ladder(), devices=None) -> Certificate:
    """A certified noise multiplier for ``accountant`` (a :class:`~dpjax.montecarlo.BallsInBins`, or a
    :class:`~dpjax.montecarlo.BMinSep` with ``method="bernoulli_kl"``, which calibrates ``sigma_0``
    itself) at ``(target_epsilon, target_delta)``: calibrate, then verify a pre-committed ladder.

    Procedure (Choquette-Choo et al. 2024, §5.2: certify ``delta`` through a verified smaller
    level); the calibration sample comes from ``fold_in(key, 0)``, the verification sample from
    ``fold_in(key, 1)``:

    1. Planning on the calibration sample (``calibration_samples`` draws, default
       ``num_samples // 4``).  ``"bernoulli_kl"``: ``sigma_0`` is the estimate solved at
       ``base_delta``.  ``"importance_betting"``: the proposal (among candidates with and without
       a tilted component, by the largest mean the test is predicted to pass given the proven
       range and the summands' variance), each direction's bet and ``sigma_0`` (the calibration
       sample's log-wealth of a grid of bets at three noise multipliers predicts where the
       verification passes; the rungs are spaced by that prediction's noise).  Everything the
       verification uses -- ``sigma_0``, the ladder, the proposal, the bets, the sample count
       -- is fixed here, before the verification sample is drawn.
    2. The ladder ``sigma_j = sigma_0 growth^j``, ``j < rungs``: the first rung whose tests pass
       (both adjacency directions) on the verification sample (``num_samples`` draws) is released.
    3. ``rungs`` tests, union bound: ``"bernoulli_kl"`` releases
       ``(eps, tau base_delta + rungs beta)``, ``base_delta`` the largest value within the target
       (:func:`overall_delta`); ``"importance_betting"`` gives the whole procedure the failure
       probability ``failure_fraction * target_delta`` (``beta`` per rung) and tests each
       direction's variance-reduced mean against ``level = target_delta (1 - failure_fraction)``
       (less the sampler's ``2^-52``-scale allowance), releasing ``(eps, level + failure probability)``.

    The true delta is non-increasing in ``sigma`` (more noise is post-processing), so the
    released rung is never worse than any bad rung it passed over.  If no rung verifies, the
    certificate says so (``verified = False``, ``noise_multiplier = inf``).

    Args:
      num_samples: verification samples (``None``: ``"bernoulli_kl"`` the smallest power of two
        whose base delta is 0.4 target (:func:`default_samples`); ``"importance_betting"`` the
        smallest power of two in ``[2^16, 2^22]`` predicted (from the calibration sample) to
        pass at a mean within 10% of the calibration estimate's delta).
      method: ``"importance_betting"`` (default) or ``"bernoulli_kl"``.
      ladder: :class:`Ladder`: the rungs, their growth, the calibration sample's size and the
        failure fraction.  Its ``growth`` (default 1.02 for ``"bernoulli_kl"``;
        ``"importance_betting"``: 0.75 predicted standard deviations of the passing point, at
        least 1.0005, with ``sigma_0`` one standard deviation below it; a given ``growth`` starts
        the ladder at the predicted passing point).

    Raises:
      ValueError: ``num_samples`` below what can certify ``target_delta`` (``"bernoulli_kl"``,
        says the minimum); a target no noise multiplier in the search range reaches.
    """
    if not isinstance(ladder, Ladder):
        raise ValueError(f"ladder must be a dpjax.montecarlo.evr.Ladder(...), got {ladder!r}")
    rungs, growth, calibration_samples, failure_fraction = (ladder.rungs, ladder.growth, ladder.calibration_samples,
                                                            ladder.failure_fraction)
    privacy = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, target = float(privacy.epsilon), float(privacy.delta)
    rungs = _validate.positive_int("rungs", rungs)
    method = _method(method)
    if num_samples is not None:
        num_samples = _validate.positive_int("num_samples", num_samples)
    if calibration_samples is not None:
        calibration_samples = _validate.positive_int("calibration_samples", calibration_samples)
    if growth is None and method is CertificateMethod.BERNOULLI_KL:
        growth = DEFAULT_LADDER_GROWTH
    if growth is not None:
        growth = float(_validate.positive("growth", growth))
        if not growth > 1.0:
            raise ValueError(f"growth must be > 1, got {growth}")
    if method is CertificateMethod.BERNOULLI_KL:
        if num_samples is None:
            num_samples = default_samples(target, rungs)
        return _certify_ladder_kl(accountant, target_epsilon=eps, target_delta=target, num_samples=num_samples,
                                  key=key, initial_noise=initial_noise, rungs=rungs, growth=growth,
                                  calibration_samples=calibration_samples, devices=devices)
    failure_fraction = float(_validate.probability_open("failure_fraction", failure_fraction))
    if failure_fraction >= 0.5:
        raise ValueError(f"failure_fraction must be < 0.5, got {failure_fraction}")
    return _certify_ladder_betting(accountant, eps=eps, target=target, num_samples=num_samples, key=key,
                                   initial_noise=initial_noise, rungs=rungs, growth=growth,
                                   calibration_samples=calibration_samples, failure_fraction=failure_fraction,
                                   devices=devices)
