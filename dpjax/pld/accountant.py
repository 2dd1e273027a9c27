"""Public PLD accountant: validate, plan the grid, run one jitted program for all directions.

General API (any list of mechanisms with counts, heterogeneous compositions included)::

    >>> from dpjax import pld
    >>> comps = [(pld.Gaussian(10.0), 100), (pld.RandomizedResponse(0.96, 2), 100)]
    >>> res = pld.epsilon(comps, target_delta=1e-5)          # doctest: +SKIP
    >>> res.epsilon, res.epsilon_lower, res.epsilon_upper     # doctest: +SKIP

DP-SGD::

    >>> pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-5).epsilon   # doctest: +SKIP

The reported ``epsilon`` (= ``epsilon_upper``) is a certified upper bound: the pessimistic grid
PMF dominates the mechanism, and the single-step truncation (``+inf`` atom), wrap-around
(Chernoff) and FFT round-off terms are added to delta before converting.  ``epsilon_lower`` is
certified from below (optimistic grid, wrap-around from below subtracted); it is loose by about
``T dx / 2`` for long compositions.

This module holds the entry points and what only they do (dropping lossless mechanisms, the
rare-sampling floor, the fallback bounds and the refusal reason when the grid cannot certify);
the steps they share with every other FFT path (stacking, the jitted program, runs, the tilted
tail pass, the Gaussian shortcut) are in :mod:`dpjax.pld.grid.engine`, and the result records in
:mod:`dpjax.pld.records` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64, host_only
from dpjax.pld.grid.engine import (account, as_components, combine, dominating_gaussian_mu, exact_delta_result,
                                   exact_epsilon, exact_epsilon_result, exact_gaussian_mu, grid_options, scalar, stack,
                                   stacked_mechanisms)
from dpjax.numerics.exact import (host_gaussian_delta_and_upper, host_gaussian_epsilon,
                                  host_gaussian_epsilon_is_zero, host_gaussian_log_delta, np_gaussian_delta_upper,
                                  np_gaussian_log_delta)
from dpjax.pld.mechanisms import Gaussian, PoissonSubsampledGaussian
from dpjax.numerics.root import HostBisection
from dpjax.pld.grid.plan import GridOptions
from dpjax.pld.records import DeltaResult, DirectionReport, EpsilonResult  # noqa: F401 (re-exported)


def _one_step_exceeds_every_epsilon(stacked, target_delta: float) -> bool:
    """True when one step of the composition alone has delta above ``target_delta`` at the largest
    float64 epsilon: a certified lower bound (dropping the other steps is post-processing) puts
    the true epsilon beyond float64, and the answer is ``inf`` without a grid (noise
    multipliers like 1e-300, whose losses no window can hold).

    One Gaussian step of sensitivity ``s`` has the closed-form delta of ``mu = s / sigma``; one
    Poisson-subsampled step in the remove direction has exactly ``q delta_G(eps')`` with
    ``e^eps' = (e^eps - 1 + q) / q`` (the mixture's excess over ``e^eps`` is ``q`` times the
    Gaussian pair's at ``eps'``).  Other mechanisms are not tested (False)."""
    eps = np.finfo(np.float64).max
    log_target = math.log(target_delta)
    for cls, _static, data, P, _C in stacked:
        if cls is PoissonSubsampledGaussian:
            q = P[:, data.index("sampling_prob")]
            mu = 1.0 / P[:, data.index("noise_multiplier")]
            log_d = np.log(q) + host_gaussian_log_delta(eps - np.log(q), mu)
        elif cls is Gaussian:
            mu = P[:, data.index("sensitivity")] / P[:, data.index("noise_multiplier")]
            log_d = host_gaussian_log_delta(eps, mu)
        else:
            continue
        if np.any(log_d > log_target):
            return True
    return False


def _one_step_log_delta(stacked, eps):
    """``log delta(eps)`` of every single Gaussian or Poisson-subsampled Gaussian step of the
    composition (and of its Gaussian steps composed), in the remove direction, by their closed
    forms (see :func:`_one_step_exceeds_every_epsilon`): rows x ``eps`` (``eps`` a 1-D float64
    array), or ``None`` when the composition has no such step.  Dropping the other steps is
    post-processing, so each row is a lower bound on the composition's delta."""
    rows, gauss_mu2 = [], 0.0
    for cls, _static, data, P, C in stacked:
        if cls is PoissonSubsampledGaussian:
            q = P[:, data.index("sampling_prob")][:, None]
            mu = 1.0 / P[:, data.index("noise_multiplier")][:, None]
            # eps' = log((e^eps - 1 + q) / q) = eps - log q + log(1 - (1 - q) e^-eps), the last
            # term as log(-expm1(log(1 - q) - eps)): neither overflow nor cancellation at small q, eps.
            with np.errstate(divide="ignore"):  # (log(1 - q) = -inf at q = 1: the term is 0)
                shifted = eps[None, :] - np.log(q) + np.log(-np.expm1(np.log1p(-q) - eps[None, :]))
            rows.append(np.log(q) + np_gaussian_log_delta(shifted, mu))
        elif cls is Gaussian:
            mu = P[:, data.index("sensitivity")] / P[:, data.index("noise_multiplier")]
            gauss_mu2 += float(np.sum(np.asarray(C, np.float64) * mu * mu))
            rows.append(np_gaussian_log_delta(eps[None, :], mu[:, None]))
    if gauss_mu2 > 0:
        rows.append(np_gaussian_log_delta(eps[None, :], math.sqrt(gauss_mu2)))
    return np.concatenate(rows, axis=0) if rows else None


#: ``mu`` of the dominating Gaussian below which the grid is not run: the losses of a step are
#: then ~``mu`` wide, and their CDFs, differences of numbers near 1/2, keep ~``mu / 1e-16``
#: significant digits (at T = 4, q = 1/2 the grid's delta(0) is 2.7% high at mu 2e-11 and 0,
#: below the truth, at 2e-16).  The dominating Gaussian's closed form answers instead: an upper
#: bound, loose by at most a factor ~1/q in delta for Poisson-subsampled steps.
GRID_MU_MIN = 1e-9
_GRID_MU_MIN_REASON = ("Noise beyond what a grid can resolve (dominating Gaussian mu below 1e-9): the answer is "
                       "the dominating Gaussian's closed form, an upper bound that ignores the amplification by "
                       "sampling.")

#: Relative allowance on the closed forms of :func:`_one_step_log_delta` (SciPy's ``log_ndtr``
#: and the float64 logs, ~1e-13 relative in delta): a lower end is claimed only with this margin.
_ONE_STEP_MARGIN = 1e-9


def one_step_epsilon_lower(stacked, deltas, upper) -> np.ndarray | None:
    """A certified lower end on epsilon at ``deltas``: the largest epsilon in ``[0, upper]`` at
    which some single step of the composition (or its Gaussian steps composed) already has delta
    above the target by :func:`_one_step_log_delta`, found by bisection; ``None`` when the
    composition has no Gaussian or Poisson-subsampled Gaussian step.  Exact for one step (up to
    the bisection's width, 1e-12 relative), so a single step's bracket no longer depends on the
    grid's optimistic rounding."""
    d = np.asarray(deltas, np.float64).reshape(-1)
    hi = np.broadcast_to(np.asarray(upper, np.float64), np.shape(deltas)).reshape(-1).copy()
    if _one_step_log_delta(stacked, np.zeros(1)) is None:
        return None
    log_t = np.log(d) + _ONE_STEP_MARGIN
    hi = np.where(np.isfinite(hi), hi, np.finfo(np.float64).max / 4)
    lo = np.zeros_like(hi)
    above0 = np.max(_one_step_log_delta(stacked, lo), axis=0) > log_t

    def above(eps):
        return np.max(_one_step_log_delta(stacked, eps), axis=0) > log_t

    lo = _ONE_STEP_BISECTION.solve_array(above, lo, hi, check_ends=False).root
    return np.where(above0, lo, 0.0).reshape(np.shape(deltas))


#: Epsilon to 1e-12 relative; the lower end (a step's delta still above the target) is kept.
_ONE_STEP_BISECTION = HostBisection(safe="lower", rtol=1e-12, max_halvings=200)


def one_step_delta_lower(stacked, eps) -> np.ndarray | None:
    """A certified lower end on delta at ``eps``: the largest single-step closed form of
    :func:`_one_step_log_delta`, less its rounding allowance; ``None`` as there."""
    e = np.asarray(eps, np.float64)
    rows = _one_step_log_delta(stacked, e.reshape(-1))
    if rows is None:
        return None
    return (np.exp(np.max(rows, axis=0)) * (1.0 - _ONE_STEP_MARGIN)).reshape(e.shape)


def _threshold_rows(stacked):
    """``(sigma, shift, q, count)`` arrays of the composition's Gaussian and Poisson-subsampled
    Gaussian steps (remove direction: ``P = (1 - q) N(0, sigma^2) + q N(shift, sigma^2)`` against
    ``Q = N(0, sigma^2)``, ``q = 1`` for a Gaussian), or None when it has none or more than
    :data:`_THRESHOLD_MAX_ROWS` distinct ones."""
    sig, shift, q, cnt = [], [], [], []
    for cls, _static, data, P, C in stacked:
        if cls is PoissonSubsampledGaussian:
            sig.append(P[:, data.index("noise_multiplier")])
            shift.append(np.ones(len(P)))
            q.append(P[:, data.index("sampling_prob")])
        elif cls is Gaussian:
            sig.append(P[:, data.index("noise_multiplier")])
            shift.append(P[:, data.index("sensitivity")])
            q.append(np.ones(len(P)))
        else:
            continue
        cnt.append(np.asarray(C, np.float64))
    if not sig or sum(len(a) for a in sig) > _THRESHOLD_MAX_ROWS:
        return None
    return tuple(np.concatenate(a) for a in (sig, shift, q, cnt))


#: Distinct steps beyond which :func:`threshold_test_delta` is not tried (its cost grows with them).
_THRESHOLD_MAX_ROWS = 64

#: Thresholds searched by :func:`threshold_test_delta`: a coarse grid of standard scores of the
#: most frequent step, then a fine grid around the best (any threshold gives a valid bound: the
#: search only decides how tight).
_Z_COARSE = np.linspace(-8.0, 40.0, 241)
_Z_FINE = np.linspace(-1.0, 1.0, 41)


def threshold_test_delta(rows, eps) -> np.ndarray:
    """A certified lower bound on the composition's remove-direction delta at each ``eps`` (1-D):
    the hockey-stick divergence ``sup_A P(A) - e^eps Q(A)`` at the event ``A`` = "some step's
    output exceeds its threshold" (thresholds ``c = u sigma^2 / shift + shift / 2``, where each
    step's unsubsampled loss equals ``u``), maximised over ``u``.  Every event gives a lower bound;
    this one is the optimal test of a single step, and close to optimal for a composition whose
    steps are rarely sampled (then one sampled step decides: ``P(A) - e^eps Q(A)`` is about ``T``
    times one step's), where the grid's optimistic rounding is loosest.  Closed form:
    ``Q(A) = 1 - prod Phi(c/sigma)^count`` and ``P(A) = 1 - prod (q Phi((c - shift)/sigma)
    + (1 - q) Phi(c/sigma))^count``, in logs (``log_ndtr``, ``expm1``) so that differences of 1e-13
    between probabilities of 1e-10 keep their digits."""
    import scipy.special

    sig, shift, q, cnt = rows
    eps = np.asarray(eps, np.float64).reshape(-1)
    main = int(np.argmax(cnt))  # the most frequent step sets the threshold grid

    def value(u):  # u: (E, U) -> (E, U)
        c = u[..., None] * (sig * sig / shift) + shift / 2.0                      # (E, U, R)
        # The complements from log Phi directly (no 1 - Phi(-x) cancellation at any threshold).
        log_b0c = scipy.special.log_ndtr(c / sig)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # (log(1 - q) = -inf at q = 1)
            log_pc = np.sum(cnt * np.logaddexp(np.log(q) + scipy.special.log_ndtr((c - shift) / sig),
                                               np.log1p(-q) + log_b0c), axis=-1)
            log_qc = np.sum(cnt * log_b0c, axis=-1)
            out = -np.expm1(log_pc) + np.exp(eps)[:, None] * np.expm1(log_qc)
        return np.where(np.isfinite(out), out, -np.inf)

    def u_of_z(z):  # standard score of the most frequent step -> loss threshold u
        s, d = sig[main], shift[main]
        return (z * s - d / 2.0) * d / (s * s)

    z = np.broadcast_to(_Z_COARSE, (eps.size, _Z_COARSE.size))
    step = _Z_COARSE[1] - _Z_COARSE[0]
    best_v = np.full(eps.size, -np.inf)
    for _ in range(3):  # the coarse grid, then two finer ones around the best (20x each)
        v = value(u_of_z(z))
        i = np.argmax(v, axis=1)
        best_v = np.maximum(best_v, v[np.arange(eps.size), i])
        z = z[np.arange(eps.size), i][:, None] + step * _Z_FINE[None, :]
        step = step / 20.0
    return best_v


def threshold_test_epsilon_lower(stacked, deltas, upper, lower) -> np.ndarray | None:
    """A certified lower end on epsilon at ``deltas`` from :func:`threshold_test_delta`: the largest
    epsilon in ``[lower, upper]`` at which the test's delta still exceeds the target (bisection;
    margin 1e-9 relative plus the float64 rounding of the probabilities, 1e-15 of them); ``None``
    where the test does not apply or does not beat ``lower``."""
    rows = _threshold_rows(stacked)
    if rows is None:
        return None
    d = np.asarray(deltas, np.float64).reshape(-1)
    lo = np.broadcast_to(np.asarray(lower, np.float64), np.shape(deltas)).reshape(-1).copy()
    hi = np.broadcast_to(np.asarray(upper, np.float64), np.shape(deltas)).reshape(-1).copy()
    ok = np.isfinite(hi) & np.isfinite(lo) & (hi > lo)
    if not ok.any():
        return None
    need = d * (1.0 + 1e-9) + 1e-15 * 2.0  # (P, Q <= 1: absolute rounding of the two terms)
    above = ok & (threshold_test_delta(rows, lo) > need)
    if not above.any():
        return None
    # Elements where the test is not above the target at ``lower`` keep ``lower``.
    sol = _THRESHOLD_BISECTION.solve_array(lambda eps: threshold_test_delta(rows, eps) > need, lo, hi,
                                           active=above, check_ends=False)
    return sol.root.reshape(np.shape(deltas))


#: Epsilon to 1e-10 relative; the lower end (the test's delta still above the target) is kept.
_THRESHOLD_BISECTION = HostBisection(safe="lower", rtol=1e-10, max_halvings=60)


def threshold_test_delta_lower(stacked, eps) -> np.ndarray | None:
    """:func:`threshold_test_delta` at ``eps`` less its rounding allowance, or ``None`` where the
    test does not apply."""
    rows = _threshold_rows(stacked)
    if rows is None:
        return None
    e = np.asarray(eps, np.float64)
    val = threshold_test_delta(rows, e.reshape(-1)) * (1.0 - 1e-9) - 2e-15
    return np.maximum(val, 0.0).reshape(e.shape)


def _raise_lower(dir_reports, lower, upper, bound):
    """Lower ends raised to ``bound`` (a remove-direction bound; never above ``upper``)."""
    if bound is None:
        return dir_reports, lower
    bound = np.minimum(bound, upper)
    out = [dataclasses.replace(r, lower=np.minimum(np.maximum(np.asarray(r.lower, np.float64), bound),
                                                   np.asarray(r.upper, np.float64)))
           if r.direction == "remove" else r for r in dir_reports]
    return out, np.maximum(lower, bound)


def _without_lossless(components) -> list:
    """``components`` without the mechanisms whose privacy loss is 0 in both directions
    (``max_loss <= 0``: e.g. randomized response with ``noise_parameter = 1``, a uniformly random
    answer).  Composing them changes nothing, and their loss distribution, a point mass at 0,
    has no spread for the grid planner to size a window from."""
    out = []
    for item in components:
        mech = item[0] if isinstance(item, tuple) and len(item) == 2 else item
        fn = getattr(mech, "max_loss", None)
        if fn is not None:
            if hasattr(mech, "validate"):
                mech.validate()
            if all(np.all(np.asarray(fn(d), np.float64) <= 0.0) for d in ("remove", "add")):
                continue
        out.append(item)
    return out


@host_only("dpjax.pld.grid_epsilon_fn on a grid from dpjax.pld.plan_fixed_grid")
@float64
def epsilon(components, target_delta, *, options: GridOptions | None = None, with_lower: bool = True,
            exact_gaussian: bool = True) -> EpsilonResult:
    """Certified epsilon of a composition at ``target_delta`` (scalar or 1-D array).

    Args:
      components: a mechanism, or a sequence of mechanisms / ``(mechanism, count)`` pairs.
        Mechanism parameters may be 1-D arrays (one mechanism per entry, e.g. a noise schedule).
      target_delta: in (0, 1); an array gives one epsilon per entry (one FFT for all).
      options: :class:`GridOptions` (accuracy/size knobs).
      with_lower: also compute the optimistic ``epsilon_lower`` (doubles the FFT work).
      exact_gaussian: answer compositions that are exactly one Gaussian mechanism (Gaussians,
        q = 1 DP-SGD) from the closed form (default); False forces the FFT grid (tests of it).
    Returns:
      :class:`EpsilonResult`.
    """
    options = grid_options(options)
    components = as_components(components)
    deltas = _validate.PrivacyTarget(delta=target_delta).delta
    components = _without_lossless(components)
    if not components:
        zero = np.zeros_like(np.asarray(deltas, np.float64))
        return exact_epsilon_result(deltas, zero, zero)
    stacked = stack(components)  # validates every mechanism; shared by the checks and the plan below
    mu_dom = dominating_gaussian_mu(components, stacked)
    if exact_gaussian and mu_dom is not None and np.all(host_gaussian_epsilon_is_zero(deltas, mu_dom)):
        # Noise so large (sigma = 1e300) that even the dominating Gaussian has epsilon 0: the
        # answer is exactly 0 (the grid would need dx ~ 1e-600 and failed with a NaN size).
        zero = np.zeros_like(np.asarray(deltas, np.float64))
        return exact_epsilon_result(deltas, zero, zero)
    mu = exact_gaussian_mu(components, stacked) if exact_gaussian else None
    if mu is not None:
        upper, lower = exact_epsilon(np.asarray(deltas, np.float64), mu)
        return exact_epsilon_result(deltas, upper, lower)
    if exact_gaussian and mu_dom is not None and mu_dom < GRID_MU_MIN:
        upper = host_gaussian_epsilon(np.asarray(deltas, np.float64), mu_dom)
        return dataclasses.replace(exact_epsilon_result(deltas, upper, np.zeros_like(upper)),
                                   reason=_GRID_MU_MIN_REASON)
    if _one_step_exceeds_every_epsilon(stacked, float(np.max(deltas))):
        inf = np.full(np.shape(deltas), np.inf)
        res = exact_epsilon_result(deltas, inf, inf)
        return dataclasses.replace(res, reason=(
            "a single step alone has delta above target_delta at the largest float64 epsilon (its closed "
            "form, a lower bound on the composition's delta): the true epsilon is beyond float64"))
    # Sampled steps so rare that the binomial mixture bound alone certifies epsilon 0 at every
    # target: nothing is smaller, so the grid (and its tail pass, seconds at q ~ 1e-9) is skipped.
    rare_floor = rare_sampling_floor(components, deltas, np.full(np.shape(deltas), np.inf), stacked)
    if rare_floor is not None and np.all(rare_floor == 0.0):
        zero = np.zeros_like(np.asarray(deltas, np.float64))
        return dataclasses.replace(exact_epsilon_result(deltas, zero, zero), reason=_RARE_SAMPLING_ZERO_REASON)
    tail_mass = options.tail_fraction * float(np.min(deltas))
    # NumPy inputs go straight into the jitted program (jnp.asarray outside a trace compiles a
    # staging program of its own: ~50 ms of every cold start).
    caps = epsilon_caps(components, np.asarray(deltas, np.float64), mu_dom, stacked)
    reports, blocked = account(components, np.asarray(deltas, np.float64), np.zeros(()), with_lower=with_lower,
                                options=options, eps_hint=None, target_delta=float(np.min(deltas)),
                                tail_mass=tail_mass, stacked=stacked, caps=caps)
    dir_reports, upper, lower = combine(reports)
    reason = None
    if np.isinf(upper).any():
        reason = _refusal_reason(dir_reports, float(np.min(deltas)), options)
        dir_reports, upper, reason = _fallback(components, dir_reports, deltas, mu_dom, reason)
    floored = None if rare_floor is None else np.minimum(np.asarray(upper, np.float64), rare_floor)
    if floored is not None and np.any(floored < upper):
        upper, lower = floored, np.minimum(lower, floored)
        reason = ((reason + "  ") if reason else "") + _RARE_SAMPLING_REASON
    dir_reports, capped = _capped(dir_reports, caps)
    if capped:
        new_upper = np.minimum(upper, np.max([r.upper for r in dir_reports], axis=0))
        if np.any(new_upper < upper):
            reason = ((reason + "  ") if reason else "") + _CAP_REASON
        upper = new_upper
        lower = np.minimum(lower, upper)
    if with_lower:
        dir_reports, lower = _raise_lower(dir_reports, lower, upper, one_step_epsilon_lower(stacked, deltas, upper))
        dir_reports, lower = _raise_lower(dir_reports, lower, upper,
                                          threshold_test_epsilon_lower(stacked, deltas, upper, lower))
    return EpsilonResult(epsilon=scalar(upper), epsilon_lower=scalar(lower), epsilon_upper=scalar(upper),
                         target_delta=scalar(deltas), directions=tuple(dir_reports), blocked=blocked,
                         reason=reason)


@host_only("dpjax.pld.delta_fn on a grid from dpjax.pld.plan_fixed_grid")
@float64
def delta(components, target_epsilon, *, options: GridOptions | None = None, with_lower: bool = True,
          exact_gaussian: bool = True) -> DeltaResult:
    """Certified delta of a composition at ``target_epsilon`` (scalar or 1-D array, >= 0).

    The truncation/wrap-around budget is ``options.delta_tail_mass`` (absolute), so deltas far
    below it are reported as about that value (an upper bound, never below the truth).
    ``exact_gaussian`` as in :func:`epsilon` (closed form for Gaussian-only compositions).
    """
    options = grid_options(options)
    components = as_components(components)
    eps = _validate.PrivacyTarget(epsilon=target_epsilon, allow_zero_epsilon=True).epsilon
    components = _without_lossless(components)
    if not components:
        zero = np.zeros_like(np.asarray(eps, np.float64))
        return exact_delta_result(eps, zero, zero)
    stacked = stack(components)  # validates every mechanism; shared by the checks and the plan below
    mu = exact_gaussian_mu(components, stacked) if exact_gaussian else None
    mu_dom = dominating_gaussian_mu(components, stacked) if exact_gaussian else None
    if mu is None and mu_dom is not None and mu_dom < GRID_MU_MIN:
        # Noise beyond what a grid can resolve: the dominating Gaussian's delta (an upper
        # bound, ~mu_dom) and 0 as the lower end.
        d, upper = host_gaussian_delta_and_upper(eps, mu_dom)
        lower = np.zeros_like(d)
        return exact_delta_result(eps, upper, lower)
    if mu is not None:
        # Relative accuracy of the log-space closed form ~1e-13 (exact.py); 1e-9 either side,
        # the upper end more where the closed form's rounding error bound is larger.
        d, upper = host_gaussian_delta_and_upper(eps, mu)
        lower = d * (1 - 1e-9)
        return exact_delta_result(eps, upper, lower)
    reports, blocked = account(components, np.asarray([0.5]), np.asarray(eps, np.float64), with_lower=with_lower,
                                options=options, eps_hint=float(np.max(eps)), target_delta=None,
                                tail_mass=options.delta_tail_mass, stacked=stacked)
    dir_reports, upper, lower = combine(reports)
    mu_dom = dominating_gaussian_mu(components, stacked)
    if (np.asarray(upper) >= 1.0).any():
        dir_reports, upper = _fallback_delta(components, dir_reports, eps, mu_dom)
    dir_reports, capped = _capped(dir_reports, delta_caps(components, eps, mu_dom))
    if capped:
        upper = np.minimum(upper, np.max([r.upper for r in dir_reports], axis=0))
        lower = np.minimum(lower, upper)
    if with_lower:
        dir_reports, lower = _raise_lower(dir_reports, lower, upper, one_step_delta_lower(stacked, eps))
        dir_reports, lower = _raise_lower(dir_reports, lower, upper, threshold_test_delta_lower(stacked, eps))
    return DeltaResult(delta=scalar(upper), delta_lower=scalar(lower), delta_upper=scalar(upper),
                       target_epsilon=scalar(eps), directions=tuple(dir_reports), blocked=blocked)


#: The binomial-mixture bound is consulted next to the grid's answer where sampled steps are rare:
#: ``P(some step sampled) <= _RARE_SAMPLING * delta`` (below, see :func:`rare_sampling_floor`).
_RARE_SAMPLING = 100.0
_RARE_SAMPLING_REASON = ("Sampled steps are rare at this delta: epsilon is the binomial mixture of Gaussians "
                         "bound (dpjax.pld.fallback), below the grid's answer.")
_RARE_SAMPLING_ZERO_REASON = ("Sampled steps are rare at this delta: the binomial mixture of Gaussians bound "
                              "(dpjax.pld.fallback) certifies epsilon 0, so no grid was run.")


def sampling_is_rare(q_max: float, steps: int, delta: float) -> bool:
    """The condition of :func:`rare_sampling_floor`: ``1 - (1 - q_max)^steps <= _RARE_SAMPLING * delta``."""
    p_any = -math.expm1(steps * math.log1p(-q_max)) if q_max < 1.0 else 1.0
    return p_any <= _RARE_SAMPLING * delta


def rare_sampling_floor(components, deltas, upper, stacked=None):
    """``min(upper, binomial mixture bound)`` for a composition of Poisson-subsampled Gaussians
    whose chance of sampling any step, ``1 - (1 - q_max)^T``, is at most ``_RARE_SAMPLING``
    times the smallest target delta; ``None`` otherwise (nothing to compare).  ``stacked``:
    :func:`stack` of the components, when the caller has it.

    Why: there the truth is decided by the few sampled steps (epsilon is 0 once that chance is
    below delta), while the grid's answer carries its spacing and its tail pass's window start
    (a few 1e-6 at q = 1e-9), so the grid alone made epsilon non-monotone in q (3.1e-6 at
    q = 1e-9 against 0 at q = 1e-8, where the grid failed and the mixture bound answered).  Both
    are certified upper bounds, so their minimum is.  The condition depends only on (q, T, delta)
    and grows with q and T, so the minimum is taken on the more private side of the boundary,
    and monotonicity is kept across it.  Cheap there: ``K ~ Bin(T, q)`` has a handful of points."""
    stacked = stack(components) if stacked is None else stacked
    q_max, steps = 0.0, 0
    for cls, _, data, P, C in stacked:
        if cls is not PoissonSubsampledGaussian:
            return None
        q_max = max(q_max, float(np.max(P[:, data.index("sampling_prob")])))
        steps += int(np.sum(C))
    deltas = np.asarray(deltas, np.float64)
    if not sampling_is_rare(q_max, steps, float(np.min(deltas))):
        return None
    from dpjax.pld.fallback import mixture_bound

    bound = mixture_bound(stacked_mechanisms(components), np.ravel(deltas)).reshape(np.shape(deltas))
    return np.minimum(np.asarray(upper, np.float64), bound)


_CAP_REASON = ("The grid's bound was above a cheaper certified bound, which is reported instead: the "
               "composition's largest loss (pure DP composition) or the Gaussian mechanism that dominates it "
               "without amplification (dpjax.pld.accountant.epsilon_caps).")


def epsilon_caps(components, deltas, mu_dom=None, stacked=None):
    """Per direction (``"remove"``, ``"add"``), the cheap certified upper bounds every answer is
    capped by: the support bound (``sum_i c_i max_loss_i``: no loss above it) and the epsilon of
    the Gaussian mechanism dominating the composition without amplification
    (:func:`~dpjax.pld.grid.engine.dominating_gaussian_mu`), whichever is smaller: ``{direction:
    array}`` shaped like ``deltas``."""
    from dpjax.numerics.exact import host_gaussian_epsilon
    from dpjax.pld.fallback import support_bound

    deltas = np.asarray(deltas, np.float64)
    if mu_dom is None:
        mu_dom = dominating_gaussian_mu(components, stacked)
    gauss = (np.asarray(host_gaussian_epsilon(deltas, mu_dom), np.float64).reshape(deltas.shape)
             if mu_dom is not None and math.isfinite(mu_dom) else np.full(deltas.shape, np.inf))
    mechs = stacked_mechanisms(components)
    # (The support bound rounded up: the composed loss never exceeds the exact sum.)
    return {d: np.minimum(gauss, support_bound(mechs, d) * _SUPPORT_ROUNDING) for d in ("remove", "add")}


#: Relative allowance on a computed support bound ``sum_i c_i max_loss_i`` (float64 rounding of
#: the logs and the sum, ~1e-15 each).
_SUPPORT_ROUNDING = 1.0 + 1e-9


def _capped(dir_reports, caps):
    """``(reports, capped)``: each direction's upper end no larger than its cap ``caps[direction]``
    (:func:`epsilon_caps`, or :func:`delta_caps` for delta queries; both certified, so their
    minimum is), its lower end no larger than its upper."""
    out, capped = [], False
    for r in dir_reports:
        up = np.asarray(r.upper, np.float64)
        cap = caps[str(r.direction)].reshape(np.shape(up))
        if np.any(cap < up):
            capped = True
            up = np.minimum(up, cap)
            r = dataclasses.replace(r, upper=up, lower=np.minimum(np.asarray(r.lower, np.float64), up))
        out.append(r)
    return out, capped


def delta_caps(components, eps, mu_dom=None, stacked=None):
    """:func:`epsilon_caps` for delta queries: per direction, the dominating Gaussian's delta
    at ``eps`` (with its rounding allowance), and 0 at and above the support bound."""
    from dpjax.pld.fallback import _ROUNDING, support_bound

    eps = np.asarray(eps, np.float64)
    if mu_dom is None:
        mu_dom = dominating_gaussian_mu(components, stacked)
    mechs = stacked_mechanisms(components)
    gauss = (np_gaussian_delta_upper(eps, mu_dom, _ROUNDING)
             if mu_dom is not None and mu_dom > 0 and math.isfinite(mu_dom)
             else (np.zeros(eps.shape) if mu_dom == 0 else np.ones(eps.shape)))
    return {d: np.where(eps >= support_bound(mechs, d) * _SUPPORT_ROUNDING, 0.0, gauss) for d in ("remove", "add")}


def _fallback(components, dir_reports, deltas, mu_dom, reason):
    """Replace each direction's ``inf`` by the smallest certified bound of
    :mod:`dpjax.pld.fallback` (support, binomial mixture of Gaussians, RDP, dominating Gaussian):
    a direction the grid could not certify no longer turns the whole answer into ``inf`` or the
    un-sampled mechanism's epsilon.  Directions the grid certified keep their values."""
    from dpjax.pld.fallback import direction_epsilon

    stacked = stacked_mechanisms(components)
    shape = np.shape(deltas)
    used, out = [], []
    for r in dir_reports:
        up = np.asarray(r.upper, np.float64)
        if np.isinf(up).any():
            fb, name = direction_epsilon(stacked, str(r.direction), np.ravel(deltas), dominating_mu=mu_dom)
            fb = fb.reshape(shape)
            if np.isfinite(fb[np.isinf(up)]).any():
                up = np.where(np.isinf(up), fb, up)
                used.append(f"'{r.direction}': {name}")
            r = dataclasses.replace(r, upper=up)
        out.append(r)
    upper = np.max([r.upper for r in out], axis=0)
    if used:
        reason = ("the grid could not certify target_delta in every direction; there epsilon is the smallest "
                  "certified fallback bound (" + "; ".join(used) + ").  Grid: " + reason)
    return out, upper, reason


def _fallback_delta(components, dir_reports, eps, mu_dom):
    """:func:`_fallback` for delta queries: a direction whose grid delta is 1 (nothing
    certified) gets the smallest bound of :func:`dpjax.pld.fallback.direction_delta`."""
    from dpjax.pld.fallback import direction_delta

    stacked = stacked_mechanisms(components)
    out = []
    for r in dir_reports:
        up = np.asarray(r.upper, np.float64)
        if (up >= 1.0).any():
            fb, _ = direction_delta(stacked, str(r.direction), np.ravel(eps), dominating_mu=mu_dom)
            r = dataclasses.replace(r, upper=np.minimum(up, fb.reshape(np.shape(eps))))
        out.append(r)
    return out, np.max([r.upper for r in out], axis=0)


def _refusal_reason(dir_reports, target, options) -> str:
    """Why the upper bound is inf: names the term that exceeds ``target_delta``."""
    worst = max(dir_reports, key=lambda r: r.p_inf + r.tail_above + r.roundoff + r.noise_floor * r.n)
    floor = worst.noise_floor * worst.n
    terms = (f"P(loss=+inf) {worst.p_inf:.3g}, wrap-around bound {worst.tail_above:.3g}, frequency truncation "
             f"{worst.roundoff:.3g}, FFT round-off floor {worst.noise_floor:.3g} per bin (<= {floor:.3g} over "
             f"the n={worst.n} bins, dx={worst.dx:.3g})")
    if floor >= max(worst.p_inf, worst.tail_above, worst.roundoff) and floor > 0.1 * target:
        return (f"target_delta {target:.3g} is below what float64 FFT accounting can resolve in direction "
                f"'{worst.direction}': the composed PMF carries a round-off floor of {worst.noise_floor:.3g} per "
                f"bin (relative error ~ steps * 2^-52 of the characteristic function, spread over every bin), "
                f"and its share above epsilon exceeds target_delta.  A finer grid, a wider window or a larger "
                f"GridOptions.n_max does not lower it; ask for a larger target_delta ({terms})")
    return (f"target_delta {target:.3g} is below what the grid can certify in direction '{worst.direction}' "
            f"({terms}).  Either the true epsilon is very large (loss beyond the widest window) or the "
            f"composition is too long for GridOptions.n_max={options.n_max} (raise it)")
