"""User-facing balls-in-bins Monte Carlo accountant: validation + thin wrappers over the core."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base.results import ResultMixin

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.montecarlo import core, evr
from dpjax.montecarlo.evr import Certificate
from dpjax.numerics.exact import gaussian_delta, gaussian_epsilon
from dpjax.numerics.root import HostBisection


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class DeltaEstimate(ResultMixin):
    """Monte Carlo delta for each epsilon.

    Attributes:
      epsilon: ``(K,)``.
      delta: ``(K,)`` max over the two directions (the add/remove guarantee).
      standard_error: ``(K,)`` standard error of the reported direction.
      delta_remove, se_remove: ``(K,)`` direction P||Q (``X ~ P``, loss ``log P/Q``).
      delta_add, se_add: ``(K,)`` direction Q||P (``X ~ Q``, loss ``log Q/P``).
      num_samples: sample count (the same draws serve both directions and every epsilon).

    ``to_dict()`` / ``to_json(path)`` / ``DeltaEstimate.load(path)``: see :mod:`dpjax._base.results`.
    """

    epsilon: np.ndarray
    delta: np.ndarray
    standard_error: np.ndarray
    delta_remove: np.ndarray
    se_remove: np.ndarray
    delta_add: np.ndarray
    se_add: np.ndarray
    num_samples: int
    delta_low: np.ndarray | None = None
    delta_high: np.ndarray | None = None
    confidence: float = 0.95


@dataclasses.dataclass(frozen=True)
class EpsilonEstimate(ResultMixin):
    """Monte Carlo epsilon at ``target_delta`` with a confidence interval.

    Attributes:
      epsilon: the point estimate (smallest grid epsilon with ``delta_hat <= target_delta``).
      epsilon_lower, epsilon_upper: the interval: where the lower / upper confidence bound on
        delta (Chernoff-KL bound for means of ``[0, 1]`` variables, each side at level
        ``(1 - confidence) / 2``) crosses ``target_delta``.  It covers the true epsilon with
        probability >= ``confidence``: at the true epsilon ``e*`` (not random) both one-sided
        bounds hold with that probability, and both bound curves are non-increasing in epsilon
        (same draws), so the crossings bracket ``e*`` (to the grid resolution).
      resolved: False when the sample cannot resolve ``target_delta`` (even a zero estimate
        has an upper confidence bound above it: ``epsilon_upper = inf``); the point estimate is
        then not meaningful.
      target_delta, confidence, num_samples; reason: one line.
    """

    epsilon: float
    epsilon_lower: float
    epsilon_upper: float
    target_delta: float
    confidence: float
    num_samples: int
    resolved: bool
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def epsilon_low(self) -> float:
        """The former name of :attr:`epsilon_lower`."""
        return self.epsilon_lower

    @property
    def epsilon_high(self) -> float:
        """The former name of :attr:`epsilon_upper`."""
        return self.epsilon_upper


def _kl_bounds(mean, m: int, level: float):
    """Two-sided Chernoff-KL confidence bounds on the mean of ``m`` i.i.d. ``[0, 1]`` variables:
    ``{p : m KL(mean || p) <= log(2 / (1 - level))}`` (Hoeffding 1963, Thm 1: the Bernoulli KL
    tail bound holds for any ``[0, 1]``-valued variables), solved by bisection.  Vectorised."""
    mean = np.clip(np.asarray(mean, np.float64), 0.0, 1.0)
    rhs = math.log(2.0 / (1.0 - level)) / m

    def kl(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            t1 = np.where(a > 0, a * np.log(a / b), 0.0)
            t2 = np.where(a < 1, (1 - a) * np.log((1 - a) / (1 - b)), 0.0)
        return t1 + t2

    # Each bound is the end of its final bracket outside the confidence set (KL above the
    # level): the lower bound in [0, mean] is approached from below, the upper one in [mean, 1]
    # from above, so the interval returned contains the set.
    # (A NaN mean gives (0, 1): its bracket is left as it is.)
    finite = np.isfinite(mean)
    lo_a = _KL_LOWER_BISECTION.solve_array(lambda p: kl(mean, np.maximum(p, 1e-300)) > rhs,
                                           np.zeros_like(mean), mean, active=finite, check_ends=False).root
    hi_b = _KL_UPPER_BISECTION.solve_array(lambda p: kl(mean, np.minimum(p, 1 - 1e-16)) > rhs,
                                           mean, np.ones_like(mean), active=finite, check_ends=False).root
    return np.where(mean > 0, lo_a, 0.0), np.where(mean < 1, hi_b, 1.0)


#: 100 halvings of ``[0, mean]``, the end below the confidence set kept.
_KL_LOWER_BISECTION = HostBisection(safe="lower", max_halvings=100)
#: 100 halvings of ``[mean, 1]``, the end above the confidence set kept.
_KL_UPPER_BISECTION = HostBisection(safe="upper", max_halvings=100)


# --------------------------------------------------------------------------- validation


def _validate_samples(num_samples) -> int:
    m = _validate.positive_int("num_samples", num_samples)
    if m > _validate.MAX_SAMPLES:
        raise ValueError(f"num_samples must be <= 2^40, got {m}")
    return m


# --------------------------------------------------------------------------- accountant


def delta_estimate_from_sums(sums, m: int, flat, confidence: float) -> DeltaEstimate:
    """The :class:`DeltaEstimate` of per-direction Monte Carlo sums of ``m`` draws at the epsilons
    ``flat`` (1-D): both directions, the larger one reported, each with its standard error, and
    the max-direction Chernoff-KL interval at ``confidence``."""
    mean, se = core.estimate_from_sums(sums, m)
    mean, se = np.asarray(mean), np.asarray(se)
    if m < 2:  # one draw says nothing about its spread: no standard error (was reported as 0)
        se = np.full_like(se, np.inf)
    pick = np.argmax(mean, axis=0)
    cols = np.arange(flat.size)
    # Per-direction KL bounds at level (1 - (1 - confidence) / 2) each, so that the
    # max-direction interval holds with probability >= confidence (union bound).
    lo, hi = _kl_bounds(mean, m, 1.0 - (1.0 - confidence) / 2.0)
    return DeltaEstimate(
        epsilon=flat, delta=mean[pick, cols], standard_error=se[pick, cols],
        delta_remove=mean[0], se_remove=se[0], delta_add=mean[1], se_add=se[1], num_samples=m,
        delta_low=np.max(lo, axis=0), delta_high=np.max(hi, axis=0), confidence=confidence)


class BallsInBins:
    """Monte Carlo accountant for ``C x + z`` under balls-in-bins batching (Choquette-Choo et al. 2024).

    Args:
      correlation: the correlation matrix ``C``: a dense ``(n, n)`` lower-triangular
        non-negative array, a :class:`dpjax.matrices.Toeplitz` / :class:`~dpjax.matrices.BLT`,
        or a 1-D array taken as a Toeplitz first column (zero-padded to ``n``: banded);
        validated by :func:`dpjax.matrices.correlation_array`.
      batches_per_epoch: ``b`` (each example falls in one of ``b`` batches, the same every epoch).
      epochs: ``E``; ``n = b * E`` rounds.

    Only the ``(b, b)`` Gram matrix of the modes is kept (O(b n) work for structured ``C``).

    Example::

        acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), batches_per_epoch=32, epochs=8)
        delta, se = acc.delta(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 20, key=0)
        cert = acc.certify(1.0, epsilon=2.0, target_delta=1e-3, num_samples=1 << 22, key=1)
    """

    @float64
    def __init__(self, correlation, batches_per_epoch, epochs):
        b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
        e = _validate.positive_int("epochs", epochs)
        self.batches_per_epoch = b
        self.epochs = e
        self.num_rounds = b * e
        self.gram = core.host_gram_matrix(correlation, b, e)
        if not np.isfinite(self.gram).all():
            raise ValueError("correlation produces a non-finite Gram matrix (entries too large)")

    def __repr__(self) -> str:
        return (f"BallsInBins(batches_per_epoch={self.batches_per_epoch}, epochs={self.epochs}, "
                f"num_rounds={self.num_rounds}, sensitivity={self.sensitivity!r})")

    # ------------------------------------------------------------------ baselines

    @property
    def sensitivity(self) -> float:
        """Deterministic-batch L2 sensitivity ``max_i |m_i|_2`` (no amplification)."""
        return float(np.sqrt(np.max(np.diagonal(self.gram))))

    def unamplified_delta(self, noise_multiplier, epsilon) -> np.ndarray:
        """Gaussian delta at sensitivity :attr:`sensitivity` -- the baseline amplification must beat.

        It is also a rigorous upper bound on the balls-in-bins delta (joint convexity of the
        hockey-stick divergence over the mixture P).
        """
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        eps = _validate.nonnegative("epsilon", epsilon)
        return np.asarray(gaussian_delta(eps, self.sensitivity / sigma))

    def unamplified_epsilon(self, noise_multiplier, target_delta) -> float:
        """Gaussian epsilon at sensitivity :attr:`sensitivity` (:func:`dpjax.pld.gaussian_epsilon`)."""
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
        return float(gaussian_epsilon(delta, self.sensitivity / sigma))

    # ------------------------------------------------------------------ Monte Carlo

    @float64
    def estimate(self, noise_multiplier, epsilon, num_samples, key, *, chunk_size=None,
                 devices=None, confidence=0.95, progress=None) -> DeltaEstimate:
        """Both directions at every ``epsilon`` from one set of ``num_samples`` draws.

        ``delta_low`` / ``delta_high``: a ``confidence`` interval on the max-direction delta
        (Chernoff-KL bounds; the per-sample terms lie in ``[0, 1]``).

        ``progress``: a bar on stderr over the sample chunks (single device): ``None`` (default)
        in a terminal or notebook once the call runs over a second, ``False`` never, ``True``
        always, also as lines in a log (:mod:`dpjax._base.progress`).  It never changes the numbers.
        """
        confidence = _confidence(confidence)
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        eps = _validate.nonnegative("epsilon", epsilon)
        m = _validate_samples(num_samples)
        if chunk_size is not None:
            chunk_size = _validate.positive_int("chunk_size", chunk_size)
        flat = np.atleast_1d(eps).reshape(-1)
        n_dev = len(jax.devices() if devices is None else devices)
        chunks = core.chunk_plan(m, chunk_size, n_dev, self.gram.shape[0])[1]
        with core.progress_bar(chunks, "monte carlo", enabled=progress if n_dev == 1 else False) as bar:
            sums = core.sharded_monte_carlo_sums(
                jnp.asarray(self.gram), sigma, jnp.asarray(flat), core.as_prng_key(key), m, chunk_size, devices,
                progress=bar.enabled)
        return delta_estimate_from_sums(sums, m, flat, confidence)

    def delta(self, noise_multiplier, epsilon, num_samples, key, *, chunk_size=None, devices=None):
        """``(estimate, standard_error)`` of delta at ``epsilon`` (scalar or array; same shape).

        The estimate is the max over the two directions (add/remove adjacency); the standard
        error is that direction's.  ``key``: JAX PRNG key or int seed.
        """
        est = self.estimate(noise_multiplier, epsilon, num_samples, key, chunk_size=chunk_size, devices=devices)
        shape = np.shape(epsilon)
        return est.delta.reshape(shape), est.standard_error.reshape(shape)

    def epsilon(self, noise_multiplier, target_delta, num_samples, key, *, grid_size=32, refinements=3,
                chunk_size=None, devices=None, with_interval=False, confidence=0.95):
        """Monte Carlo ``eps_hat(delta)``: the smallest grid epsilon with ``delta_hat <= target_delta``.

        ``delta_hat(eps)`` (same draws for every eps) is non-increasing, so ``refinements``
        passes over ``grid_size`` epsilons bracket the crossing to a width of
        ``eps_hi / grid_size^refinements``; the upper end is returned.  ``inf`` if even the
        upper search limit fails.

        The bare float is a *point estimate* from ``num_samples`` draws, not a bound: its
        uncertainty can be large (delta far below ``1 / num_samples`` cannot be resolved at
        all).  ``with_interval=True`` returns :class:`EpsilonEstimate` instead (the same as
        :meth:`epsilon_estimate`): the estimate with its ``confidence`` interval, the sample count
        and a ``resolved`` flag.  :meth:`certify` gives a rigorous statement.  (The float return
        is kept for existing callers.)
        """
        if with_interval:
            return self.epsilon_estimate(noise_multiplier, target_delta, num_samples, key, grid_size=grid_size,
                                         refinements=refinements, confidence=confidence, chunk_size=chunk_size,
                                         devices=devices)
        delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
        grid_size = _validate.positive_int("grid_size", grid_size, minimum=2)
        refinements = _validate.positive_int("refinements", refinements)
        unamp = self.unamplified_epsilon(noise_multiplier, delta)
        hi = 2.0 * unamp + 1.0 if math.isfinite(unamp) else 64.0
        lo = 0.0

        def deltas(grid):
            return self.estimate(noise_multiplier, grid, num_samples, key, chunk_size=chunk_size,
                                 devices=devices).delta

        if deltas(np.array([0.0]))[0] <= delta:
            return 0.0
        while deltas(np.array([hi]))[0] > delta:
            hi *= 2.0
            if hi > 1e4:
                return math.inf
        for _ in range(refinements):
            grid = np.linspace(lo, hi, grid_size)
            d = deltas(grid)
            ok = np.nonzero(d <= delta)[0]
            first = int(ok[0])  # hi always passes
            lo, hi = (grid[first - 1] if first > 0 else lo), grid[first]
        return float(hi)

    def epsilon_estimate(self, noise_multiplier, target_delta, num_samples, key, *, grid_size=32,
                         refinements=3, confidence=0.95, chunk_size=None, devices=None) -> EpsilonEstimate:
        """:meth:`epsilon` with a ``confidence`` interval (see :class:`EpsilonEstimate`).

        Same draws for every epsilon; each of the point estimate and the two interval ends is
        bracketed on the grid like :meth:`epsilon` (``refinements`` passes of ``grid_size``),
        the upper grid end of each bracket being returned.
        """
        delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
        grid_size = _validate.positive_int("grid_size", grid_size, minimum=2)
        refinements = _validate.positive_int("refinements", refinements)
        confidence = _confidence(confidence)
        m = _validate_samples(num_samples)

        def curves(grid):
            est = self.estimate(noise_multiplier, grid, m, key, chunk_size=chunk_size, devices=devices,
                                confidence=confidence)
            return est.delta, est.delta_low, est.delta_high

        # Point and upper end: the upper grid end of the bracket; lower end: its lower grid end.
        eps_hat = self._crossing(lambda g: curves(g)[0], delta, grid_size, refinements)[1]
        eps_low = self._crossing(lambda g: curves(g)[1], delta, grid_size, refinements)[0]
        eps_high = self._crossing(lambda g: curves(g)[2], delta, grid_size, refinements)[1]
        # The lower confidence curve is below the point curve, hence crosses first.
        eps_low = min(eps_low, eps_hat)
        resolved = math.isfinite(eps_high)
        if resolved:
            reason = (f"epsilon_hat = {eps_hat:.4g}, {100 * confidence:g}% interval [{eps_low:.4g}, {eps_high:.4g}] "
                      f"from {m} samples (an estimate: use certify() for a guarantee)")
        else:
            need = math.ceil(math.log(2.0 / ((1.0 - confidence) / 2.0)) / delta)
            reason = (f"num_samples = {m} cannot resolve target_delta = {delta:g}: even a zero estimate has an upper "
                      f"confidence bound above it (need roughly {need} samples); the point estimate "
                      f"{eps_hat:.4g} is not meaningful")
        return EpsilonEstimate(epsilon=eps_hat, epsilon_lower=eps_low, epsilon_upper=eps_high, target_delta=delta,
                               confidence=confidence, num_samples=m, resolved=resolved, reason=reason)

    def _crossing(self, curve, delta, grid_size, refinements):
        """``(lo, hi)``: the final grid bracket of the crossing of the non-increasing
        ``curve(grid)`` with ``delta`` (``curve(hi) <= delta``; ``(0, 0)`` if already at 0,
        ``(1e4, inf)`` when not crossed below 1e4)."""
        lo, hi = 0.0, 1.0
        if curve(np.array([0.0]))[0] <= delta:
            return 0.0, 0.0
        while curve(np.array([hi]))[0] > delta:
            lo, hi = hi, 2.0 * hi
            if hi > 1e4:
                return lo, math.inf
        for _ in range(refinements):
            grid = np.linspace(lo, hi, grid_size)
            d = curve(grid)
            first = int(np.nonzero(d <= delta)[0][0])
            lo, hi = (grid[first - 1] if first > 0 else lo), grid[first]
        return float(lo), float(hi)

    def certify(self, noise_multiplier, epsilon, target_delta, num_samples, key, *, chunk_size=None,
                devices=None, method=evr.DEFAULT_METHOD, failure_probability=None) -> Certificate:
        """Estimate-Verify-Release for one noise multiplier: is ``(epsilon, target_delta)`` certified?

        ``method="bernoulli_kl"``: the largest ``base_delta`` whose EVR bound
        (:mod:`dpjax.montecarlo.evr`, one test) stays within ``target_delta``, then
        ``delta_hat <= base_delta`` (both directions) on ``num_samples`` plain draws from ``key``.
        ``method="importance_betting"`` (default, as for :meth:`certify_noise` and
        :func:`dpjax.optimization.optimize_correlation`: plain draws need about ``log(m) /
        target_delta`` samples, the variance-reduced test far fewer where the summands' proven
        range is small): the variance-reduced summands and a betting test of each
        direction against ``target_delta (1 - 0.005)`` (failure probability ``0.005
        target_delta``; docs/design.md §4.2), the bet chosen on ``num_samples // 4`` draws from
        ``fold_in(key, 0)``, the test on ``num_samples`` draws from ``fold_in(key, 1)``
        (``failure_probability`` sets that test's ``beta`` instead).  The draws
        must be independent of whatever chose ``noise_multiplier`` (use another key than the
        calibration's).  ``ValueError`` if ``num_samples`` is below :func:`evr_minimum_samples`
        (``"bernoulli_kl"``).  For a noise multiplier that is calibrated and certified in one call,
        see :meth:`certify_noise`.
        """
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        eps = float(_validate.nonnegative("epsilon", epsilon))
        target = float(_validate.PrivacyTarget(delta=target_delta).delta)
        m = _validate_samples(num_samples)
        return evr.certify_fixed(self, sigma, eps, target, m, key, chunk_size=chunk_size, devices=devices,
                                 method=method, failure_probability=failure_probability)

    def certify_noise(self, target_epsilon, target_delta, key, *, num_samples=None, method=evr.DEFAULT_METHOD,
                      initial_noise=None, devices=None) -> Certificate:
        """A certified noise multiplier at ``(target_epsilon, target_delta)`` in one call.

        :func:`dpjax.montecarlo.evr.certify_noise`: calibrate on one sample, verify a pre-committed
        ladder on an independent one (keys derived from ``key``), union bound over the rungs.
        ``cert.noise_multiplier`` is certified when ``cert.verified`` (``inf`` otherwise);
        ``cert.noise_multiplier_estimate`` is the calibration sample's estimate.  ``num_samples``:
        verification samples (default: the method's; ``"importance_betting"`` sizes it from the
        calibration sample, between 2^16 and 2^22).

        Example::

            acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), batches_per_epoch=16, epochs=4)
            cert = acc.certify_noise(2.0, 1e-5, key=0)
            cert.noise_multiplier, cert.method, cert.failure_probability
        """
        if num_samples is not None:
            num_samples = _validate_samples(num_samples)
        return evr.certify_noise(self, target_epsilon=target_epsilon, target_delta=target_delta,
                                 num_samples=num_samples, key=core.as_prng_key(key), initial_noise=initial_noise,
                                 method=method, devices=devices)

    def calibrate(self, target_epsilon, target_delta, num_samples, key, *, certify=False, method=evr.DEFAULT_METHOD):
        """Noise multiplier with ``delta_hat = target_delta`` (an estimate, not a certificate).

        A convenience for :func:`dpjax.calibration.calibrate_accountant`, which implements it
        (see there for the arguments and errors).  ``certify=True``: instead return the
        :class:`Certificate` of :meth:`certify_noise` (``num_samples`` its verification samples,
        ``None`` for the method's default): a certified noise multiplier, its estimate and how it
        was certified.
        """
        if certify:
            return self.certify_noise(target_epsilon, target_delta, key, num_samples=num_samples, method=method)
        from dpjax.montecarlo.calibrate import calibrate_accountant

        return calibrate_accountant(self, target_epsilon, target_delta, num_samples, key)


def _confidence(confidence) -> float:
    c = float(_validate.probability_open("confidence", confidence))
    return c


def evr_minimum_samples(target_delta, base_delta=None) -> int:
    """Smallest sample count for which Estimate-Verify-Release can certify ``target_delta``.

    (Not :func:`dpjax.calibration.estimate_minimum_samples`, the ``ceil(1/delta)`` floor below
    which a Monte Carlo *estimate* cannot resolve ``delta`` at all.)

    ``base_delta=None``: the absolute minimum (some ``base_delta`` works, about
    ``log(m)/target_delta``); else the minimum for verifying against that ``base_delta``.
    """
    target = float(_validate.PrivacyTarget(delta=target_delta).delta)
    if base_delta is not None:
        base = float(_validate.probability_open("base_delta", base_delta))
        if base >= target:
            raise ValueError(f"base_delta must be < target_delta = {target:g}, got {base:g}")
        return evr.minimum_samples(target, base)
    return evr.minimum_samples(target)


def certified_delta(num_samples, base_delta) -> tuple[float, float, float]:
    """``(delta, tau, failure_probability)`` that EVR reports after verifying ``base_delta``."""
    m = _validate_samples(num_samples)
    base = float(_validate.probability_open("base_delta", base_delta))
    return evr.overall_delta(m, base)
