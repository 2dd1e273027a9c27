"""A privacy report: epsilon at several deltas, the trade-off curve of both directions, a
Gaussian-DP estimate, all from the certified hockey-stick curve of the dominating pair.

    >>> import dpjax
    >>> rep = dpjax.dpsgd_privacy_report(1.1, sampling_prob=256 / 60000, epochs=30)   # doctest: +SKIP
    >>> rep.epsilon                  # certified epsilon at rep.target_delta             # doctest: +SKIP
    >>> rep.fpr, rep.tpr_remove      # an attacker's power is at most tpr_remove at fpr  # doctest: +SKIP
    >>> rep.gdp_mu                                                                        # doctest: +SKIP

:func:`dpsgd_privacy_report` takes a DP-SGD configuration in the accounting family's
arguments (Poisson sampling, random allocation, balls-in-bins, fixed batches, groups);
:func:`privacy_report` takes any composition :func:`dpjax.pld.delta` accepts.  Both return a
:class:`PrivacyReport`.

**The two directions.**  Let ``X`` be the mechanism's output on a dataset with the example
(for groups: with the group) and ``Y`` on the neighbouring dataset without it (add/remove
adjacency).  The accountant certifies, for every ``eps >= 0``, ``delta_remove(eps) >=
H_{e^eps}(X || Y)`` and ``delta_add(eps) >= H_{e^eps}(Y || X)`` (``DirectionReport.upper`` of
:func:`dpjax.pld.delta`; where it returns one report, the pair is symmetric or that report
bounds both, and it is used for both).  Under replace adjacency (``sampling="fixed_batch"``)
neither dataset is the one "with" the example and every ordered adjacent pair is bounded by
the larger of the two deltas only: both curves then use it and coincide.  Two tests are
reported, never merged:

* ``tpr_remove``: membership inference, null hypothesis ``Y`` (the example was not used),
  alternative ``X``; FPR = ``P_Y(reject)``, TPR = ``P_X(reject)``.
* ``tpr_add``: the reverse test, null ``X``, alternative ``Y``.

**Why the reported TPR is an upper bound.**  For any test ``phi`` with FPR ``alpha`` under null
``Y`` and TPR under ``X`` and every ``eps >= 0``,

    TPR - e^eps alpha       = E_X[phi] - e^eps E_Y[phi]                <= H_{e^eps}(X || Y),
    (1 - alpha) - e^eps (1 - TPR) = E_Y[1 - phi] - e^eps E_X[1 - phi] <= H_{e^eps}(Y || X),

so the type II error ``beta = 1 - TPR`` is at least ``max(0, 1 - delta_remove(eps) - e^eps alpha,
e^-eps (1 - delta_add(eps) - alpha))`` for EACH ``eps`` and each certified upper end of the two
deltas: every ``eps`` gives a valid line, and so does the maximum over any finite set of them
(the trade-off function of Dong, Roth and Su, "Gaussian differential privacy", is the supremum
of these lines over all ``eps``; a finite set and upper ends of delta only lower it).  The
second line needs the OTHER direction's delta: with one direction's delta in both lines (the
usual conversion of a symmetric ``(eps, delta(eps))`` guarantee) a curve is not a bound wherever
the other direction's delta is larger; for Poisson-subsampled DP-SGD, whose remove delta is
the larger, the add curve computed that way falls below dp_accounting's optimistic (lower)
curve (``tests/test_report.py``).  The reverse test swaps the two deltas.  The reported
``tpr = 1 - max(0, max(lines) - 1e-14)`` (the allowance covers the float64 rounding of a line,
a few ``2^-53``); the lines' maximum is convex in ``alpha``, as a trade-off function is.

**Which eps.**  The lines are evaluated at eps in ``[0, eps_hi]``: 257 equally spaced values,
then twice more, 16 values between the two neighbours of each FPR's best line so far.
``eps_hi`` is one more than the certified epsilon at ``delta_lo = min(fpr_min / 2, (1 -
fpr_max) / 3)`` (at least 1e-14): where ``delta(eps - 1) <= delta_lo``, the loss exceeds ``eps``
with probability below ``fpr_min`` under the null, and both families of lines decrease further
out (``delta'(eps) = -e^eps Q(loss > eps)``), so no later line is better.  It is capped at
``max(log(1 / fpr_min), 40)``, past which a line of the first family is negative and one of the
second below ``e^-40``.  The choice of eps affects only how close the curve is to the
supremum, never its soundness.  For the Gaussian mechanism (closed form) the reported TPR is
within 1e-6 of the exact ``Phi(Phi^-1(FPR) + mu)`` from FPR 1e-6 to 0.5, and never below it
(tested).

**Gaussian DP.**  ``gdp_mu`` is the smallest ``mu`` whose Gaussian trade-off curve
``G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)`` lies at or below the reported curve at every
reported FPR of both directions where the reported type II error is at least 1e-9 (below it
float64 cannot resolve the curve): ``max_j Phi^-1(1 - fpr_j) - Phi^-1(1 - tpr_j)``.  Since
``1 - tpr`` is a lower bound on the true type II error, ``gdp_mu`` is at least what the same
formula gives on the true curve at those points; it is an estimate, not a certificate of
``mu``-GDP (between and outside the points the curve may cross ``G_mu``).  ``inf`` where no
point qualifies.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import Adjacency
from dpjax._base.results import ResultMixin
from dpjax.pld.scenario import accepts_scenario

__all__ = ["PrivacyReport", "privacy_report", "dpsgd_privacy_report", "DEFAULT_TARGET_DELTAS", "DEFAULT_FPR",
           "trade_off_upper", "gdp_mu_estimate"]

#: The deltas a report gives epsilon at.
DEFAULT_TARGET_DELTAS = (1e-5, 1e-6, 1e-8, 1e-10)

#: The false-positive rates a report gives the trade-off curve at: 5 per decade from 1e-6 to
#: 0.1, then 0.2 to 0.5.
DEFAULT_FPR = tuple(float(x) for x in np.concatenate([np.logspace(-6, -1, 26), [0.2, 0.3, 0.4, 0.5]]))

#: Absolute allowance for the float64 rounding of a line ``1 - delta - e^eps alpha`` (terms of
#: size at most 1 here, each rounded to within a few ``2^-53``).
_LINE_ROUNDING = 1e-14
#: Lines per eps interval: the first pass, then the values put between the two neighbours of
#: every FPR's best line in each refinement pass.
_FIRST_PASS = 257
_REFINE = 16
_REFINE_PASSES = 2
#: Past this eps a line of the second family is below e^-40 (nothing float64 resolves next to 1).
_EPS_FLAT_CAP = 40.0
#: Smallest delta at which eps_hi is asked for (the accountant's resolution; below it only the
#: tightness at FPRs under twice this value is affected, never the soundness).
_DELTA_LO_FLOOR = 1e-14
#: Smallest type II error the Gaussian-DP estimate reads.
_GDP_BETA_FLOOR = 1e-9


@dataclasses.dataclass(frozen=True)
class PrivacyReport(ResultMixin):
    """What a privacy report holds (``to_dict`` / ``to_json`` / ``load``: :mod:`dpjax._base.results`).

    Attributes:
      target_delta: (K,) the deltas.
      epsilon: (K,) certified epsilon at each delta (an upper bound; the max over both
        directions), each equal to its own accountant call.
      fpr: (M,) false-positive rates alpha in (0, 1), increasing.
      tpr_remove: (M,) upper bounds on the true-positive rate (power) of any test of "the
        example was not used" (null) against "it was used" at each FPR: membership inference.
      tpr_add: (M,) the same for the reverse test (null: used; alternative: not used).  Under
        replace adjacency both are the same bound (module docstring).
      gdp_mu: the Gaussian-DP estimate of the module docstring (``inf`` where none).
      num_lines: how many eps values gave lines (the same for both curves).
      adjacency: the neighbouring relation (``"add_or_remove"`` or ``"replace"``).
    """

    target_delta: Any
    epsilon: Any
    fpr: Any
    tpr_remove: Any
    tpr_add: Any
    gdp_mu: float
    num_lines: int
    adjacency: Adjacency = Adjacency.ADD_OR_REMOVE


def _fpr(fpr) -> np.ndarray:
    arr = _validate._as_float_array("fpr", DEFAULT_FPR if fpr is None else fpr)
    if arr.ndim > 1 or ((arr <= 0) | (arr >= 1)).any():
        raise ValueError(f"fpr must be a number or 1-D sequence of numbers in (0, 1), got {fpr!r}")
    return np.unique(arr.reshape(-1))


def _deltas(target_delta) -> np.ndarray:
    arr = _validate.probability_open("target_delta", target_delta)
    if arr.ndim > 1:
        raise ValueError(f"target_delta must be a number or 1-D sequence of numbers in (0, 1), got {target_delta!r}")
    return arr.reshape(-1)


def _lines(eps, d_self, d_other, alpha):
    """The two families of lines, (eps, alpha) arrays: ``1 - d_self - e^eps alpha`` and
    ``e^-eps (1 - d_other - alpha)`` (lower bounds on the type II error at ``alpha``)."""
    e = eps[:, None]
    with np.errstate(over="ignore"):
        steep = 1.0 - d_self[:, None] - np.exp(e) * alpha[None, :]
    flat = np.exp(-e) * (1.0 - d_other[:, None] - alpha[None, :])
    return steep, flat


def _refine(eps_sorted, best) -> np.ndarray:
    """``_REFINE`` values between the two neighbours of each best index."""
    lo = eps_sorted[np.maximum(best - 1, 0)]
    hi = eps_sorted[np.minimum(best + 1, eps_sorted.size - 1)]
    pairs = np.unique(np.stack([lo, hi], axis=1), axis=0)
    t = np.linspace(0.0, 1.0, _REFINE + 2)[1:-1]
    return (pairs[:, :1] + (pairs[:, 1:] - pairs[:, :1]) * t[None, :]).reshape(-1)


def trade_off_upper(delta_upper: Callable, fpr, eps_max: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Upper bounds on the power of both tests at ``fpr`` from certified hockey-stick curves.

    Args:
      delta_upper: ``eps (1-D float64 array, >= 0) -> (delta_remove, delta_add)``, certified
        upper ends of the two directions' delta at those eps (arrays of the same shape).
      fpr: 1-D false-positive rates in (0, 1).
      eps_max: the largest eps of the first pass (> 0; see the module docstring).

    Returns:
      ``(tpr_remove, tpr_add, num_lines)``: the module docstring's bounds, and the number of
      eps values whose lines they are the minimum over.
    """
    alpha = np.asarray(fpr, np.float64)
    eps = np.linspace(0.0, float(eps_max), _FIRST_PASS)
    d_rem, d_add = _clean(delta_upper(eps))
    for _ in range(_REFINE_PASSES):
        order = np.argsort(eps)
        eps, d_rem, d_add = eps[order], d_rem[order], d_add[order]
        bests = []
        for d_self, d_other in ((d_rem, d_add), (d_add, d_rem)):
            steep, flat = _lines(eps, d_self, d_other, alpha)
            bests += [steep.argmax(axis=0), flat.argmax(axis=0)]
        new = np.setdiff1d(_refine(eps, np.concatenate(bests)), eps)
        if new.size == 0:
            break
        r, a = _clean(delta_upper(new))
        eps, d_rem, d_add = np.concatenate([eps, new]), np.concatenate([d_rem, r]), np.concatenate([d_add, a])
    out = []
    for d_self, d_other in ((d_rem, d_add), (d_add, d_rem)):
        steep, flat = _lines(eps, d_self, d_other, alpha)
        beta = np.maximum(np.maximum(steep.max(axis=0), flat.max(axis=0)) - _LINE_ROUNDING, 0.0)
        out.append(np.minimum(1.0 - beta, 1.0))
    return out[0], out[1], int(eps.size)


def _clean(pair) -> tuple[np.ndarray, np.ndarray]:
    """Deltas as float64 arrays in [0, 1]; a NaN (nothing certified) is 1."""
    return tuple(np.clip(np.nan_to_num(np.asarray(d, np.float64), nan=1.0), 0.0, 1.0) for d in pair)


def _per_direction(res) -> tuple[np.ndarray, np.ndarray]:
    """``(delta_remove, delta_add)`` upper ends of a :class:`~dpjax.pld.DeltaResult`: each
    direction's report (no larger than the reported max), or the max for both where the result
    has one report (a symmetric pair, or a bound on both)."""
    total = np.asarray(res.delta_upper, np.float64)
    ups = {str(r.direction): np.minimum(np.asarray(r.upper, np.float64), total) for r in res.directions}
    if set(ups) >= {"remove", "add"}:
        return ups["remove"], ups["add"]
    return total, total


def gdp_mu_estimate(fpr, tpr_curves) -> float:
    """``max_j Phi^-1(1 - fpr_j) - Phi^-1(1 - tpr_j)`` over the curves' points with ``1 - tpr_j
    >= 1e-9`` (the module docstring); ``inf`` where none."""
    from scipy.special import ndtri

    alpha = np.asarray(fpr, np.float64)
    best = -math.inf
    for tpr in tpr_curves:
        beta = 1.0 - np.asarray(tpr, np.float64)
        ok = beta >= _GDP_BETA_FLOOR
        if ok.any():
            best = max(best, float(np.max(-ndtri(alpha[ok]) - ndtri(beta[ok]))))
    return max(best, 0.0) if math.isfinite(best) else math.inf


def _report(account: Callable, epsilon_at: Callable, target_delta, fpr) -> PrivacyReport:
    """The report of one composition.  ``account(target_delta=...)`` / ``account(target_epsilon=
    array)`` is its accountant call (an Epsilon/DeltaResult), ``epsilon_at(delta)`` its one-delta
    epsilon (the public call a user compares with)."""
    deltas = _deltas(DEFAULT_TARGET_DELTAS if target_delta is None else target_delta)
    alpha = _fpr(fpr)
    eps = np.asarray([float(epsilon_at(float(d))) for d in deltas], np.float64)
    delta_lo = max(min(float(alpha[0]) / 2.0, (1.0 - float(alpha[-1])) / 3.0), _DELTA_LO_FLOOR)
    cap = max(math.log(1.0 / float(alpha[0])), _EPS_FLAT_CAP)
    eps_lo = float(np.asarray(account(target_delta=delta_lo).epsilon, np.float64))
    eps_max = min(eps_lo + 1.0, cap) if math.isfinite(eps_lo) else cap
    adjacency = [Adjacency.ADD_OR_REMOVE]

    def delta_upper(e):
        res = account(target_epsilon=e)
        adjacency[0] = Adjacency.parse(getattr(res, "adjacency", Adjacency.ADD_OR_REMOVE))
        d_remove, d_add = _per_direction(res)
        if adjacency[0] is Adjacency.REPLACE:  # no "with" / "without": the larger bounds both orders
            d_remove = d_add = np.maximum(d_remove, d_add)
        return d_remove, d_add

    tpr_remove, tpr_add, num_lines = trade_off_upper(delta_upper, alpha, eps_max)
    return PrivacyReport(target_delta=deltas, epsilon=eps, fpr=alpha, tpr_remove=tpr_remove, tpr_add=tpr_add,
                         gdp_mu=gdp_mu_estimate(alpha, (tpr_remove, tpr_add)), num_lines=num_lines,
                         adjacency=adjacency[0])


def privacy_report(components, *, target_delta=DEFAULT_TARGET_DELTAS, fpr=None, options=None) -> PrivacyReport:
    """The privacy report (module docstring) of a composition of :mod:`dpjax.pld` mechanisms.

    Args:
      components: what :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` accept (a mechanism,
        or a sequence of mechanisms / ``(mechanism, count)`` pairs).
      target_delta: the deltas to give epsilon at (each in (0, 1); default
        :data:`DEFAULT_TARGET_DELTAS`).
      fpr: false-positive rates in (0, 1) for the trade-off curves (default :data:`DEFAULT_FPR`).
      options: :class:`dpjax.pld.GridOptions` of the accountant calls.

    Returns:
      :class:`PrivacyReport` (add/remove adjacency, the directions of :func:`dpjax.pld.delta`).
    """
    from dpjax import pld

    def account(target_delta=None, target_epsilon=None):
        if target_delta is not None:
            return pld.epsilon(components, target_delta, options=options)
        return pld.delta(components, target_epsilon, options=options)

    return _report(account, lambda d: account(target_delta=d).epsilon, target_delta, fpr)


@accepts_scenario("target_delta", name="dpjax.dpsgd_privacy_report")
def dpsgd_privacy_report(noise_multiplier, sampling_prob=None, steps=None, *, target_delta=DEFAULT_TARGET_DELTAS,
                         fpr=None, epochs=None, sampling="poisson", group_size=1) -> PrivacyReport:
    """The privacy report (module docstring) of one DP-SGD configuration.

    The configuration is given as to :func:`dpjax.dpsgd_epsilon` (the accounting family's
    arguments and keywords, ``epochs=`` by :func:`dpjax._base.names.epochs_to_steps` included), and
    each ``report.epsilon[i]`` equals ``dpjax.dpsgd_epsilon(..., target_delta=report.target_delta[i])``.

    Args:
      noise_multiplier: sigma > 0 (noise std / clip norm), a scalar.
      sampling_prob: Poisson sampling probability q in (0, 1] (None with a scheme record).
      steps: number of steps T >= 1 (or ``epochs``).
      target_delta: the deltas to give epsilon at (default :data:`DEFAULT_TARGET_DELTAS`).
      fpr: false-positive rates in (0, 1) (default :data:`DEFAULT_FPR`).
      epochs, sampling, group_size: as for :func:`dpjax.dpsgd_epsilon` (``sampling`` a scheme
        record: :class:`dpjax.FixedBatch`, :class:`dpjax.RandomAllocation`, ...).

    Returns:
      :class:`PrivacyReport` (``adjacency`` ``"replace"`` for fixed batches).
    """
    from dpjax._base import names as _names
    from dpjax.group import _group_accounting, group_dpsgd_epsilon
    from dpjax.pld import dpsgd_accounting
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd
    from dpjax.pld.scenario import scheme_keywords

    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    if sigma.ndim != 0:
        raise ValueError(f"noise_multiplier must be a scalar > 0 for a report, got shape {sigma.shape}")
    sigma = float(sigma)
    s = scheme_keywords("dpsgd_privacy_report", sampling, sampling_prob)
    if allocation_dpsgd.is_allocation(s.sampling):
        allocation_dpsgd.allocation_args(s.sampling, steps=steps, epochs=epochs, group_size=group_size,
                                         batches_per_epoch=s.batches_per_epoch,
                                         selections_per_epoch=s.selections_per_epoch)

        def account(**target):
            return dpsgd_accounting(sigma, None, None, sampling=sampling, epochs=epochs, **target)

        def epsilon_at(d):
            return group_dpsgd_epsilon(sigma, None, steps, d, epochs=epochs, sampling=sampling)

        return _report(account, epsilon_at, target_delta, fpr)
    t = _names.steps_from_epochs("dpsgd_privacy_report", s.sampling_prob, steps, epochs, sampling=s.sampling,
                                 dataset_size=s.dataset_size, batch_size=s.batch_size)
    _names.require("dpsgd_privacy_report", steps=t)
    example_level = s.sampling == "poisson" and group_size == 1

    def account(**target):
        if example_level:
            return dpsgd_accounting(sigma, s.sampling_prob, t, **target)
        target = {"target_delta": None, "target_epsilon": None, **target}
        return _group_accounting(sigma, s.sampling_prob, t, group_size=group_size, sampling=s.sampling,
                                 dataset_size=s.dataset_size, batch_size=s.batch_size, options=None,
                                 with_lower=True, **target)

    def epsilon_at(d):
        return group_dpsgd_epsilon(sigma, sampling_prob, t, d, sampling=sampling, group_size=group_size)

    return _report(account, epsilon_at, target_delta, fpr)
