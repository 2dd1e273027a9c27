"""The PLD engine: what every FFT accounting path of :mod:`dpjax.pld` shares (internal).

The public entry points (:func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` in
:mod:`dpjax.pld.accountant`, :mod:`dpjax.pld.dpsgd`, :mod:`dpjax.pld.grid.batched`,
:mod:`dpjax.pld.curve`, :mod:`dpjax.pld.sweeps.driver`, the PLD calibration) all run the same
steps, and they use this module for them, so that every path computes the numbers of the
single call and compiles the same programs:

1. **Arguments.**  :func:`grid_options` (``None`` -> the default :class:`~dpjax.pld.GridOptions`),
   :func:`as_components` (a mechanism, a ``(mechanism, count)`` pair or a sequence of either ->
   a list), :func:`dpsgd_components` (one DP-SGD configuration as components).
2. **Stacking.**  :func:`stack` groups components by (class, static fields) into parameter
   matrices ``(G, fields)`` with counts ``(G,)``; :func:`prepare` turns them into the
   :class:`~dpjax.pld.grid.compose.Group` lists of the upper and lower bounds (long schedules
   bracketed by blocks, Gaussian schedules merged exactly); :func:`stacked_mechanisms` gives
   ``(stacked mechanism, counts)`` pairs for the fallback bounds.
3. **Gaussian shortcut.**  :func:`exact_gaussian_mu` (the composition *is* one Gaussian),
   :func:`dominating_gaussian_mu` (one Gaussian dominates it), :func:`exact_epsilon` and
   :func:`exact_report` (the closed-form answer and its report), :func:`exact_epsilon_result` /
   :func:`exact_delta_result` (the whole result of such an answer), :func:`scalar`.
4. **The program.**  :func:`program` runs one configuration through the PLD program of
   :mod:`dpjax.pld.grid.program` on the host (NumPy: nothing is compiled), every direction composed
   and converted, returning one packed float64 array ``(directions, kinds, targets +
   len(DIAGNOSTICS))``; :func:`unpack` turns it into ``[{kind: {value, p_inf, ...}}]`` per
   direction; :data:`DIAGNOSTICS` names the packed diagnostics.
5. **Memory guard.**  :func:`check_memory` refuses a plan whose mixture-CDF evaluation would
   need more than :data:`MAX_MIXTURE_BYTES`.
6. **Runs.**  :func:`run` plans, runs and widens the window while a wrap-around bound is over
   budget; :func:`tail_pass` re-runs exponentially tilted when the FFT round-off floor exceeds
   :data:`TAIL_PASS_FRACTION` of the target; :func:`account` is the whole single call (both
   bounds); :func:`combine` turns per-direction results into
   :class:`~dpjax.pld.records.DirectionReport` records and the add/remove bracket.

Names here are internal (not re-exported by :mod:`dpjax.pld`); they are public within the
package so that the entry points above share one definition of each step.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpjax._base import validate as _validate
from dpjax.pld.grid.compose import Group
from dpjax.numerics.exact import (EPSILON_SEARCH_MAX, MU_LARGE, gaussian_epsilon, gaussian_log_delta,
                                  py_log_delta_lower_large)
from dpjax.pld.grid import program as prog
from dpjax.pld.mechanisms import Gaussian, PoissonSubsampledGaussian
from dpjax.pld.grid.program import DIAGNOSTICS
from dpjax.pld.grid.plan import MAX_WINDOW_WIDTH, GridOptions, GridPlan, plan_grid, regrid, tilt_log_mgf, tilt_parameters
from dpjax.pld.records import DeltaResult, DirectionReport, EpsilonResult

__all__ = [
    "grid_options", "as_components", "dpsgd_components",
    "stack", "prepare", "stacked_mechanisms",
    "exact_gaussian_mu", "dominating_gaussian_mu", "exact_epsilon", "exact_report", "exact_epsilon_result",
    "exact_delta_result", "scalar",
    "DIAGNOSTICS", "program", "unpack",
    "MAX_MIXTURE_BYTES", "check_memory",
    "TAIL_PASS_FRACTION", "tail_pass", "run", "account", "combine",
]

# ------------------------------------------------------------------------------------------
# Components -> stacked groups


def _fields(mech):
    data, static = [], []
    for f in dataclasses.fields(mech):
        (static if f.metadata.get("static", False) else data).append(f.name)
    return data, static


def stack(components) -> list[tuple[type, dict, list[str], np.ndarray, np.ndarray]]:
    """Group components by (class, static fields); returns per group the parameter matrix."""
    groups: dict = {}
    for item in components:
        if isinstance(item, tuple):
            mech, count = item
        else:
            mech, count = item, 1
        if hasattr(mech, "validate"):
            mech.validate()
        data, static = _fields(mech)
        cols = [np.atleast_1d(np.asarray(getattr(mech, f), np.float64)) for f in data]
        G = int(np.broadcast_shapes(*[c.shape for c in cols])[0]) if cols else 1
        if any(c.ndim != 1 for c in cols):
            raise ValueError(f"mechanism parameters must be scalars or 1-D arrays, got {mech!r}")
        cols = [np.broadcast_to(c, (G,)) for c in cols]
        cnt = np.atleast_1d(np.asarray(count))
        if cnt.ndim != 1 or cnt.shape[0] not in (1, G):
            raise ValueError(f"count must be a positive integer or a 1-D array of length {G}, got {count!r}")
        # Validated before broadcasting: a schedule's one count is checked once, not per step.
        cnt = np.array([_validate.positive_int("count", c) for c in cnt], np.int64)
        cnt = np.broadcast_to(cnt, (G,))
        key = (type(mech), tuple((s, getattr(mech, s)) for s in static))
        entry = groups.setdefault(key, (type(mech), {s: getattr(mech, s) for s in static}, data, [], []))
        entry[3].append(np.stack(cols, axis=1))
        entry[4].append(cnt)
    out = []
    for cls, static, data, params, counts in groups.values():
        P = np.concatenate(params, axis=0)
        C = np.concatenate(counts)
        if P.shape[0] > 1:  # (one row is already unique: np.unique(axis=0) costs ~0.3 ms a call)
            P, inv = np.unique(P, axis=0, return_inverse=True)
            C = np.bincount(inv.reshape(-1), weights=C, minlength=len(P)).astype(np.int64)
        out.append((cls, static, data, P, C))
    return out


# Schedules of Gaussian mechanisms with more distinct values than this are merged into their one
# exact Gaussian (see _composes_as_one_gaussian) whatever ``max_distinct`` is: exact and cheap.
_MERGE_GAUSSIANS_ABOVE = 256


def _block(cls, data, P, C, max_distinct):
    """Bracket a long schedule by blocks: returns (upper params, lower params, counts) or None.

    Only for mechanisms declaring ``privacy_parameter`` (a field where larger means more
    private, all else equal), varying in that field alone.  Sorted by it, consecutive values
    are grouped into ``max_distinct`` blocks of (nearly) equal total count; the upper bound uses
    each block's smallest value (it dominates every member, by post-processing), the lower bound
    its largest.  Schedules that compose exactly as one Gaussian are merged into that Gaussian
    instead (upper params == lower params, one block): no bracket.
    """
    name = getattr(cls, "privacy_parameter", None)
    if name is None or len(P) <= min(max_distinct, _MERGE_GAUSSIANS_ABOVE):
        return None
    j = data.index(name)
    others = np.delete(P, j, axis=1)
    if len(others.T) and not np.all(others == others[0]):
        return None
    if len(P) <= max_distinct and not _composes_as_one_gaussian(cls, data, P):
        return None
    if _composes_as_one_gaussian(cls, data, P):
        # Exact, not a bracket: the whole schedule is one Gaussian (see _composes_as_one_gaussian).
        merged = P[:1].copy()
        merged[0, j] = float(np.sum(C / P[:, j] ** 2)) ** -0.5
        return merged, merged, np.ones(1, np.int64)
    order = np.argsort(P[:, j])
    P, C = P[order], C[order]
    cum = np.cumsum(C)
    block = np.minimum((cum - 1) * max_distinct // cum[-1], max_distinct - 1)
    starts = np.r_[0, np.flatnonzero(np.diff(block)) + 1]
    ends = np.r_[starts[1:], len(P)]
    up = P[starts].copy()
    lo = P[ends - 1].copy()
    cnt = np.add.reduceat(C, starts)
    return up, lo, cnt


def _composes_as_one_gaussian(cls, data, P) -> bool:
    """True for a schedule of Gaussian mechanisms varying in the noise multiplier only:
    :class:`Gaussian`, or :class:`PoissonSubsampledGaussian` with every ``sampling_prob == 1``
    (then ``P = N(1, s^2)``, ``Q = N(0, s^2)`` in both directions).

    Such a composition is *exactly* one Gaussian mechanism: with ``mu_i = sensitivity /
    sigma_i``, the composition of ``c_i`` copies of each has the trade-off function ``G_mu`` with
    ``mu = sqrt(sum_i c_i mu_i^2)`` (Dong, Roth and Su, "Gaussian Differential Privacy", 2022,
    Cor. 3.3: ``G_mu1 (x) G_mu2 = G_sqrt(mu1^2 + mu2^2)``, an equality of trade-off functions,
    hence of every hockey-stick divergence).  Directly: the pair ``(N(m, I), N(0, I))`` with
    ``m_i = mu_i`` is, up to the invertible rotation sending ``m / |m|`` to the first axis and
    the independent pure-noise coordinates it leaves, the pair ``(N(|m|, 1), N(0, 1))``.  So
    replacing such a schedule by the single mechanism with noise multiplier
    ``(sum_i c_i / sigma_i^2)^(-1/2)`` (same sensitivity) changes no privacy-loss distribution:
    the bound stays certified and the bracket of blocking (each block at its least private
    member) disappears.  On ``numpy.linspace(4.7, 1.3, 2197)`` at delta 1e-6 that bracket put the
    certified epsilon 0.49% above the truth.
    """
    if cls is Gaussian:
        return True
    if cls is PoissonSubsampledGaussian:
        return bool(np.all(P[:, data.index("sampling_prob")] == 1.0))
    return False


def _to_group(cls, static, data, P, C) -> Group:
    G = len(C)
    # Powers of two up to 256, then multiples of 256 (a schedule of 10^4 distinct values would
    # otherwise scan 6384 padding steps, each a full transform).
    Gp = 1 << max(0, math.ceil(math.log2(G))) if G <= 256 else 256 * -(-G // 256)
    if Gp > G:  # pad with copies of the first row and count 0 (no recompiles for every G)
        P = np.concatenate([P, np.repeat(P[:1], Gp - G, axis=0)])
        C = np.concatenate([C, np.zeros(Gp - G, np.int64)])
    # NumPy leaves: the jitted program takes them as they are (no eager device_put per field).
    kwargs = {f: np.ascontiguousarray(P[:, i], np.float64) for i, f in enumerate(data)}
    kwargs.update(static)
    return Group(mechanism=cls(**kwargs), counts=C, offsets=np.zeros(len(C), np.int64))


def prepare(components, max_distinct, stacked=None):
    """Returns (upper_groups, lower_groups, symmetric, blocked).  ``stacked``: ``stack(components)``
    when the caller already has it."""
    stacked = stack(components) if stacked is None else stacked
    up, lo, blocked = [], [], False
    for cls, static, data, P, C in stacked:
        b = _block(cls, data, P, C, max_distinct)
        if b is not None and np.array_equal(b[0], b[1]):  # an exact merge, not a bracket
            P, C, b = b[0], b[2], None
        if b is None:
            g = _to_group(cls, static, data, P, C)
            up.append(g)
            lo.append(g)
        else:
            blocked = True
            Pu, Pl, Cb = b
            up.append(_to_group(cls, static, data, Pu, Cb))
            lo.append(_to_group(cls, static, data, Pl, Cb))
    symmetric = all(getattr(cls, "symmetric", False) for cls, *_ in stacked)
    return up, lo, symmetric, blocked


# ------------------------------------------------------------------------------------------
# The program (on the host)


def program(layout, deltas, epsilons, *, kinds, want, tilt=None, tilt_from=None):
    """One configuration on ``layout`` (a :class:`~dpjax.pld.grid.plan.GridPlan` or a
    :class:`~dpjax.pld.grid.program.GridLayout`) through the PLD program on the host
    (:func:`dpjax.pld.grid.program.run_host`: NumPy, nothing compiled):
    ``(directions, kinds, targets + len(DIAGNOSTICS))``.  ``deltas`` are the targets of
    ``want="eps"``, ``epsilons`` those of ``"delta"``; a ``tilt`` (with ``tilt_from``) runs the
    tilted mode (``layout.lambdas`` are then its candidate Chernoff parameters)."""
    targets = np.ravel(np.asarray(deltas if want == "eps" else epsilons, np.float64))
    inp, spec = prog.inputs(layout, targets, kinds=kinds, want=want, tilt=tilt,
                            tilt_from=None if tilt is None else tilt_from)
    return prog.run_host(inp, spec)


def unpack(flat, directions, kinds, shape):
    """Host side of ``program``'s packed output: ``[{kind: {value, p_inf, ...}}]`` per direction."""
    flat = np.asarray(flat)
    size = int(np.prod(shape, dtype=np.int64))
    res = []
    for di in range(len(directions)):
        r = {}
        for ki, kind in enumerate(kinds):
            row = flat[di, ki]
            r[kind] = dict(value=row[:size].reshape(shape), **{name: row[size + i] for i, name in enumerate(DIAGNOSTICS)})
        res.append(r)
    return res


def run(groups, directions, kinds, deltas, epsilons, *, tail_mass, eps_hint, target_delta, options):
    """Plan, run, and widen the window (keeping dx) while a wrap-around bound is over budget."""
    min_width = 0.0
    for _ in range(4):
        plan = plan_grid(groups, directions, tail_mass=tail_mass, eps_hint=eps_hint, target_delta=target_delta,
                         options=options, min_width=min_width)
        check_memory(plan, directions)
        want = "eps" if eps_hint is None else "delta"
        shape = np.shape(deltas) if want == "eps" else np.shape(epsilons)
        res = unpack(program(plan, deltas, epsilons, kinds=kinds, want=want), directions, kinds, shape)
        # Frequency truncation is always sound, but only free when the dropped part is
        # negligible (smooth, near-Gaussian composed loss); otherwise keep every frequency.
        if plan.n_freq is not None and any(float(r["truncation"]) > 1e-3 * plan.tau_wrap
                                           for rd in res for r in rd.values()):
            plan = dataclasses.replace(plan, n_freq=None)
            res = unpack(program(plan, deltas, epsilons, kinds=kinds, want=want), directions, kinds, shape)
        budget = 10.0 * plan.tau_wrap
        over = any(
            (k == "up" and float(r["tail_above"]) > budget) or float(r["tail_below"]) > budget
            for rd in res for k, r in rd.items()
        )
        if not over or plan.n >= options.n_max:
            break
        needed = [float(r["needed_width"]) for rd in res for r in rd.values()]
        needed = max([w for w in needed if math.isfinite(w)], default=0.0)
        min_width = max(1.05 * needed, 1.5 * plan.n * plan.dx)
    return plan, res


# ------------------------------------------------------------------------------------------
# Memory guard


#: Refuse a program whose mixture-CDF evaluation would need more than this (bytes).
MAX_MIXTURE_BYTES = 8 * 2**30
#: Live float64 (points x components) arrays of a mixture-CDF evaluation (differences, erfc
#: values, both tails, Newton temporaries): the factor of the estimate below.
_MIXTURE_ARRAYS = 6


def check_memory(plan, directions):
    """ValueError, before anything is allocated, when evaluating the loss CDFs of a mixture
    mechanism (``num_components`` > 1, e.g. group privacy) on the planned grid would need more
    than :data:`MAX_MIXTURE_BYTES`: ``8 bytes x directions x grid points x components x 6``.
    (``group_epsilon(2.0, 0.01, 100, 1e-5, group_size=1000)`` asked XLA for 51.7 GB and died.)"""
    for gi, g in enumerate(plan.groups[0]):
        k = int(getattr(g.mechanism, "num_components", 1) or 1)
        if k <= 1:
            continue
        m = max(plan.ms[d][gi] for d in range(len(plan.ms)))
        need = 8 * len(directions) * m * k * _MIXTURE_ARRAYS
        if need > MAX_MIXTURE_BYTES:
            raise ValueError(
                f"group_size too large for this accountant: the mixture has {k} components and the grid "
                f"{m} points per step, about {need / 2**30:.1f} GiB to evaluate (limit "
                f"{MAX_MIXTURE_BYTES / 2**30:.0f} GiB, dpjax.pld.grid.engine.MAX_MIXTURE_BYTES).  Use a smaller "
                f"group_size, or more noise; group privacy via the group-size-k RDP/Poisson bound "
                f"(dpjax.baselines) needs no mixture")
    return None

# ------------------------------------------------------------------------------------------
# Tilted tail pass


#: The tilted tail pass runs when the round-off floor summed over the window exceeds this
#: fraction of the smallest target delta (eps queries) or of the smallest delta found (delta queries).
TAIL_PASS_FRACTION = 1e-3
# Candidate Chernoff parameters of the tilted pass, as multiples of the tilt (all > 1).
_TILT_THETA = np.array([1.02, 1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0])


def tail_pass(groups, directions, kinds, deltas, epsilons, plan, res, *, want, n_max=None, caps=None):
    """Re-run the composition exponentially tilted towards the tail (the PLD program's
    ``tilted`` mode) when the FFT round-off floor matters at the requested delta, and keep, per
    target, the better of the two certified bounds (each is a valid bound on its own: the min of
    the upper ends, the max of the lower ends; the tilted upper end only where it lies at or above
    the tilted window's ``valid_from``).  Ordinary deltas never get here (the floor over the
    whole window is far below them), so their results are unchanged.  The tilted run may use a
    wider window than ``plan`` (same spacing, up to ``n_max`` points; see
    :func:`dpjax.pld.grid.plan.tilt_parameters`).  ``caps``: per direction, certified upper ends found
    without the grid (:func:`dpjax.pld.accountant.epsilon_caps`), which place the tilted window
    where the ordinary upper end is far above them (the window is then centred near the answer).
    """
    if want == "eps":
        level = wrap_level = float(np.min(deltas))
    else:
        level = min(float(np.min(r["up"]["value"])) for r in res)
        # The answer is the larger direction's delta: what wraps onto the tilted window need only
        # be small against that (a direction with delta 1e-25 must not ask for a wider window).
        wrap_level = float(np.min(np.max([np.asarray(r["up"]["value"], np.float64) for r in res], axis=0)))
    floor = max(float(r[k]["noise_floor"]) * plan.n for r in res for k in r)
    if not (level > 0) or floor <= TAIL_PASS_FRACTION * level:
        return res
    # The +inf atom is part of delta at every epsilon, and a tilted run covers the same supports
    # (no less truncated mass): a direction whose atom alone exceeds every target keeps an
    # infinite upper end, and the guarantee (the max over directions) with it.
    top = float(np.max(deltas)) if want == "eps" else 1.0
    if any(float(r["up"]["p_inf"]) > top for r in res):
        return res
    # Where to put the tilted bulk: the ordinary bracket's middle at the smallest target; the
    # tilted curves must serve epsilons from y_v on: the ordinary lower end (a lower bound of the
    # answer), or, without one, a guess halfway from the mean loss to the upper end.  A guess
    # above the answer certifies epsilon <= valid_from (see _tilted_run) and is retried lower
    # (the fractions _TILT_GUESSES of the way from the mean to the ordinary upper end).
    plain = res
    mgf = tilt_log_mgf(groups, directions, _support_tops(plan))   # the same for every guess
    for frac in _TILT_GUESSES:
        for toward in (_TILT_TOWARD if frac == _TILT_GUESSES[0] and want == "eps" else _TILT_TOWARD[:1]):
            res, valid, retry, high = _tilted_run(groups, directions, kinds, deltas, epsilons, plan, res,
                                                  want=want, level=level, frac=frac, n_max=n_max,
                                                  wrap_level=wrap_level, guide=_guide(plain, res, want), mgf=mgf,
                                                  toward=toward, caps=caps)
            if valid:
                break
        if valid or not retry:
            break
    if not valid and want == "eps" and any("down" in r for r in plain):
        # The window started at the ordinary lower end served no answer: try the starts a query
        # without a lower end guesses (a fraction of the way from the mean loss up).  A start
        # at or above the answer still certifies epsilon <= start, so the bracket is never
        # worse than that query's upper end (a sweep, which asks for lower ends, gave 1.548
        # where dpsgd_epsilon gave 0.537: sigma 0.50, q 2.2e-6, T 348, delta 2.8e-11).
        no_down = [{k: v for k, v in r.items() if k != "down"} for r in plain]
        for frac in _TILT_GUESSES:
            res, valid, retry, high = _tilted_run(groups, directions, kinds, deltas, epsilons, plan, res,
                                                  want=want, level=level, frac=frac, n_max=n_max,
                                                  wrap_level=wrap_level, guide=_guide(no_down, res, want),
                                                  mgf=mgf, toward=_TILT_TOWARD[0], caps=caps)
            if valid or not retry:
                break
    if not valid and high:
        # The plan sets the tilt from a probe of the log-MGF; the program places the window from
        # the grid's own, whose heavier tail can put the window's start above y_v, so that no
        # curve reaches the answer.  Shallower tilts lower that start (same program, same shape):
        # sigma 0.50, q 2.2e-6, T 348, delta 2.8e-11 kept the certified 0.530 where the plan's
        # tilt (4.22) started the window at 2.56; 0.9 of it answers 0.38420 (bracket [0.38356, 0.38395]).
        for shrink in _TILT_SHRINK:
            res, valid, _, high = _tilted_run(groups, directions, kinds, deltas, epsilons, plan, res, want=want,
                                              level=level, frac=_TILT_GUESSES[-1], n_max=n_max,
                                              wrap_level=wrap_level, guide=_guide(plain, res, want), mgf=mgf,
                                              toward=_TILT_TOWARD[0], caps=caps, shrink=shrink)
            if valid or not high:
                break
    return res


#: Multiples of the planned tilt :func:`tail_pass` tries last, while no window served an answer.
_TILT_SHRINK = (0.9, 0.75, 0.5)


def _guide(plain, res, want):
    """The results that place the next tilted window: ``plain`` (the ordinary run) with each
    direction's upper end replaced by the best one certified so far.  A tilted run that served no
    answer still certified ``epsilon <= valid_from``; centring the next window between its guess
    and that smaller upper end, not the ordinary one, keeps the tilt shallow enough to reach the
    answer (sigma 0.50, q 2.2e-6, delta 2.8e-11: at T = 348 every later window was centred
    near 1.4 and its curves started above 2.4, leaving 0.537, where T = 785 gives 0.487)."""
    if want != "eps":
        return plain
    return [{**p, "up": r["up"]} for p, r in zip(plain, res)]


#: Where :func:`_tilted_run` centres the tilted bulk between the window's start ``y_v`` and the
#: ordinary upper end: these fractions of the way up, in turn, while the tilted run gives no
#: answer.  The ordinary bracket's middle first; where the floor puts the ordinary upper end far
#: above the answer, the middle asks for a tilt so steep that the curves near the answer are lost
#: (a single fixed-batch step, sigma 0.73, delta 3.8e-14: bracket [16.9, 84.6], tilt 794, no
#: answer; a tenth of the way up answers 18.876, dp_accounting's value).
_TILT_TOWARD = (0.5, 0.1, 0.01)


#: Widest tilted window (loss units) :func:`_tilted_run` asks for on a coarser grid when
#: ``n_max`` points at the plan's spacing cannot reach from ``y_v`` to a top where the wrap-around
#: bounds meet their budget (DP-SGD with q T ~ 5e-6: the plan's spacing 1.9e-6 for an answer of
#: 1.4 left a window of 3.9 at 2^21 points, and the bulk of the loss wrapped onto it).
_TILT_MAX_WIDTH = MAX_WINDOW_WIDTH / 8

#: Where :func:`tail_pass` guesses ``y_v`` without an ordinary lower end above the mean loss:
#: these fractions of the way from the mean to the ordinary upper end, in turn, until the tilted
#: answer lies above its ``valid_from`` (each miss still certifies ``epsilon <= valid_from``); the
#: last, the mean itself, serves any answer above it when a window from there fits.  DP-SGD with
#: sigma 1.51, q 1e-5 at delta 1.3e-12 has ordinary upper ends 0.18 (T = 464) and 0.37 (T = 2154)
#: and answers 9.8e-4 and 2.0e-3, below the first two guesses (both were reported as the ordinary
#: upper end); the fourth serves both (from the mean, the second window does not fit).
_TILT_GUESSES = (0.5, 0.2, 0.02, 0.002, 0.0)


def _support_tops(plan):
    """Per direction and group, the top of each step's grid support (loss units)."""
    return [[(np.asarray(g.offsets, np.float64) + m - 1) * plan.dx for g, m in zip(gd, md)]
            for gd, md in zip(plan.groups, plan.ms)]


def _tilted_run(groups, directions, kinds, deltas, epsilons, plan, res, *, want, level, frac, n_max=None,
                wrap_level=None, guide=None, mgf=None, toward=0.5, caps=None, shrink=1.0):
    """One tilted run (see :func:`tail_pass`); returns (merged results, whether every
    direction's tilted upper end at the smallest target was an answer, whether a lower guess of
    ``y_v`` may help: some ``y_v`` was a guess and every direction that gave no answer has a
    window that fits).  ``wrap_level``: the delta against which the mass wrapping onto the
    tilted window from below must be negligible (default ``level``); ``guide``: the results
    that place the tilted window (default ``res``, into which the tilted results are merged);
    ``mgf``: :func:`dpjax.pld.grid.plan.tilt_log_mgf` of ``groups`` on ``plan``'s supports, when known;
    ``toward``: where the tilted bulk is centred, that fraction of the way from ``y_v`` to the
    ordinary upper end (:data:`_TILT_TOWARD`); ``shrink``: a factor applied to the planned tilts
    (:data:`_TILT_SHRINK`).

    A tilted upper end at or below ``valid_from`` is no answer, but it still certifies
    ``epsilon <= valid_from``: the tilted delta curve is exact-or-above the truth for every
    ``eps >= valid_from`` and non-increasing in ``eps``, and it reached the target at or below
    ``valid_from``, so its value at ``valid_from`` is within the target."""
    eps_t, y_v, guessed = [], [], False
    means = plan.mean_composed
    for di, r in enumerate(res if guide is None else guide):
        if want == "eps":
            i = int(np.argmin(deltas))
            up = float(np.asarray(r["up"]["value"]).reshape(-1)[i])
            lo = float(np.asarray(r["down"]["value"]).reshape(-1)[i]) if "down" in r else float("nan")
            if caps is not None:
                up = min(up, float(np.asarray(caps[directions[di]], np.float64).reshape(-1)[i]))
            if not math.isfinite(up):
                up = 2.0 * lo if lo > 0 else means[di] + 2.0 * plan.sigma_composed[di] * math.sqrt(
                    2.0 * math.log(1.0 / level))
            if not (lo > means[di]):
                lo = means[di] + (frac if frac is not None else 0.5) * (up - means[di])
                guessed = True
            eps_t.append(lo + toward * (up - lo))
            y_v.append(lo)
        else:
            eps_t.append(float(np.max(epsilons)))
            y_v.append(float(np.min(epsilons)))
    n_max = max(plan.n, GridOptions().n_max if n_max is None else n_max)
    tilt, width, fits = tilt_parameters(groups, directions, eps_t, y_v, plan.n * plan.dx, plan.log_tau,
                                        level=level if wrap_level is None else wrap_level,
                                        max_width=max(plan.dx * n_max, _TILT_MAX_WIDTH),
                                        support_tops=_support_tops(plan), mgf=mgf)
    tilt = tilt * shrink
    if not fits.any():
        # No tilted window reaches down to y_v in any direction: nothing to gain from the run,
        # nor from a lower guess (a lower y_v only asks for a wider window).
        return res, False, False, False
    # A wider window: n times a power of two at the same spacing (offsets and supports
    # unchanged), or, beyond n_max points, n_max points at a coarser spacing.
    scale = max(1, round(width / (plan.n * plan.dx)))
    grid = plan if plan.n * scale <= n_max else regrid(plan, plan.dx * plan.n * scale / n_max, n_max)
    n = plan.n * scale if grid is plan else grid.n
    thetas = tilt[:, None] * _TILT_THETA[None, :]
    shape = np.shape(deltas) if want == "eps" else np.shape(epsilons)
    layout = prog.GridLayout(groups=grid.groups, dx=grid.dx, lambdas=thetas, log_tau=grid.log_tau,
                             directions=directions, ms=grid.ms, n=n)
    out = unpack(program(layout, deltas, epsilons, kinds=kinds, want=want, tilt=tilt,
                           tilt_from=np.asarray(y_v, np.float64)), directions, kinds, shape)
    merged, valid, retry, high = [], True, guessed, False
    for r, t, fit, yv in zip(res, out, fits, y_v):
        m = {}
        for kind in r:
            a, b = dict(r[kind]), t.get(kind)
            if b is None:
                m[kind] = a
                continue
            va, vb = np.asarray(a["value"], np.float64), np.asarray(b["value"], np.float64)
            vf = float(b["valid_from"])
            # An answer at or below valid_from is no answer (the curves miss the bins below it).
            if want == "eps":
                ok = ~np.isnan(vb) & (vb > vf)
            else:
                ok = ~np.isnan(vb) & (np.asarray(epsilons, np.float64) >= vf)
            if kind == "up":
                # Not an answer, but epsilon <= valid_from is certified (see the docstring).
                below = (want == "eps") & ~np.isnan(vb) & (vb <= vf) & np.isfinite(vf)
                a["value"] = np.where(ok & np.isfinite(vb), np.minimum(va, vb),
                                      np.where(below, np.minimum(va, vf), va))
                # (A tilted answer well above the ordinary one is no help either: a lower guess
                # may be.  "Well": beyond the grid's default relative accuracy, 1e-3.)
                answered = bool(np.asarray(ok & (vb <= va * (1 + 1e-3))).reshape(-1)[int(np.argmin(deltas))]
                                if want == "eps" else True)
                valid = valid and answered
                # The program's window started above y_v: a shallower tilt may reach lower.
                high = high or (want == "eps" and not answered and math.isfinite(vf) and vf > yv + grid.dx)
                # A direction with no window reaching y_v will not fit a lower one either.
                retry = retry and (answered or bool(fit))
            else:
                a["value"] = np.where(ok, np.maximum(va, vb), va)
            m[kind] = a
        merged.append(m)
    return merged, valid, retry, high


# ------------------------------------------------------------------------------------------
# One accounting run: prepare, run, tail pass; per-direction reports


def account(components, deltas, epsilons, *, with_lower, options, eps_hint, target_delta, tail_mass, stacked=None,
            caps=None):
    up_groups, lo_groups, symmetric, blocked = prepare(components, options.max_distinct, stacked)
    directions = ("remove",) if symmetric else ("remove", "add")
    kinds = ("up", "down") if (with_lower and not blocked) else ("up",)
    kw = dict(tail_mass=tail_mass, eps_hint=eps_hint, target_delta=target_delta, options=options)
    plan, res = run(up_groups, directions, kinds, deltas, epsilons, **kw)
    res = tail_pass(up_groups, directions, kinds, deltas, epsilons, plan, res,
                     want="eps" if eps_hint is None else "delta", n_max=options.n_max, caps=caps)
    if with_lower and blocked:
        _, res_lo = run(lo_groups, directions, ("down",), deltas, epsilons, **kw)
        for r, rl in zip(res, res_lo):
            r["down"] = rl["down"]
    return [(d, plan, r) for d, r in zip(directions, res)], blocked


def combine(reports):
    """Per-direction reports and the add/remove guarantee: the max over directions of each end
    of the bracket (the lower end clipped to the upper)."""
    dir_reports = []
    for d, plan, res in reports:
        up = np.asarray(res["up"]["value"])
        lo = np.asarray(res["down"]["value"]) if "down" in res else np.zeros_like(up)
        dir_reports.append(_report(d, plan, res, up, lo))
    upper = np.max([r.upper for r in dir_reports], axis=0)
    lower = np.minimum(np.max([r.lower for r in dir_reports], axis=0), upper)
    return dir_reports, upper, lower


def scalar(a):
    a = np.asarray(a, np.float64)
    return float(a) if a.ndim == 0 else a


def _report(d, plan: GridPlan, res, up, lo) -> DirectionReport:
    # Last line of defence of the laws: no NaN leaves the accountant.
    up = np.where(np.isnan(up), np.inf, up)
    lo = np.where(np.isnan(lo), 0.0, lo)
    r = res["up"]
    tb = float(res["down"]["tail_below"]) if "down" in res else float("nan")
    return DirectionReport(direction=d, upper=up, lower=lo, n=plan.n, dx=plan.dx, p_inf=float(r["p_inf"]),
                           tail_above=float(r["tail_above"]), tail_below=tb, roundoff=float(r["roundoff"]),
                           truncation_budget=plan.tau_inf, noise_floor=float(r["noise_floor"]))


# ------------------------------------------------------------------------------------------
# Gaussian shortcut: compositions that are (or are dominated by) one Gaussian


def dominating_gaussian_mu(components, stacked=None) -> float | None:
    """``mu`` of a Gaussian mechanism dominating the composition, when every component is a
    :class:`Gaussian`, a :class:`PoissonSubsampledGaussian` (whose hockey-stick divergences, by
    joint convexity, are at most ``q`` times those of its ``q = 1`` pair) or a mixture of
    Gaussians against ``N(0, sigma^2)`` (:class:`~dpjax.pld.mog.MixtureOfGaussians`,
    :class:`~dpjax.pld.mog.GroupSubsampledGaussian`: by joint convexity at most the divergence of
    its largest sensitivity, in both directions): else None.  ``mu^2 = sum_i c_i (s_i /
    sigma_i)^2`` (Dong, Roth and Su 2022, Cor. 3.3)."""
    terms = []
    for cls, static, data, P, C in (stack(components) if stacked is None else stacked):
        r = _dominating_ratio(cls, static, data, P)
        if r is None:
            return None
        terms.append((C, r))
    return _root_sum_squares(terms)


#: Below this ``sum c r^2`` may have lost terms to underflow (``r`` below ~1e-154): recomputed
#: scaled by the largest ``r``.
_SQUARES_UNDERFLOW = 1e-290


def _root_sum_squares(terms) -> float:
    """``sqrt(sum_i c_i r_i^2)`` over ``(C, r)`` array pairs: plainly (``inf`` where a square
    overflows), and scaled by the largest ``|r|`` where the plain sum is small enough to have
    underflowed (noise multipliers above ~1e154, whose ``r^2`` is below the floats: the plain
    sum made ``mu`` 0 and the Gaussian's delta 0)."""
    mu2 = 0.0
    for C, r in terms:
        with np.errstate(over="ignore", under="ignore"):
            mu2 += float(np.sum(C.astype(np.float64) * r * r))
    if not mu2 < _SQUARES_UNDERFLOW:
        return math.sqrt(mu2)
    scale = max((float(np.max(np.abs(r))) for C, r in terms if np.size(r)), default=0.0)
    if not scale > 0.0:
        return 0.0
    return scale * math.sqrt(sum(float(np.sum(C.astype(np.float64) * (r / scale) ** 2)) for C, r in terms))


def _dominating_ratio(cls, static, data, P):
    """Per stacked row, the largest sensitivity over the noise of a mechanism dominated by one
    Gaussian (see :func:`dominating_gaussian_mu`), or None."""
    from dpjax.pld.group_spec import Sampling
    from dpjax.pld.mog import GroupSubsampledGaussian, MixtureOfGaussians

    if cls is Gaussian:
        return P[:, data.index("sensitivity")] / P[:, data.index("noise_multiplier")]
    if cls is PoissonSubsampledGaussian:
        return 1.0 / P[:, data.index("noise_multiplier")]
    if cls is MixtureOfGaussians:
        s = max((si for si, pi in zip(static["sensitivities"], static["probabilities"]) if pi > 0), default=0.0)
        return s / P[:, data.index("standard_deviation")]
    if cls is GroupSubsampledGaussian:
        # Sensitivities (Delta j) for j <= k: the largest is Delta k (the full mixture's, not
        # only the components kept after pruning).
        delta = Sampling.parse(static["sampling"]).sensitivity
        return delta * P[:, data.index("group_size")] / P[:, data.index("noise_multiplier")]
    return None


def exact_gaussian_mu(components, stacked=None) -> float | None:
    """``mu`` when the whole composition is exactly one Gaussian mechanism, else None.

    True for any mix of :class:`Gaussian` and :class:`PoissonSubsampledGaussian` with
    ``sampling_prob == 1`` (see :func:`_composes_as_one_gaussian`): ``mu^2 = sum_i c_i
    (sensitivity_i / sigma_i)^2`` (Dong, Roth and Su 2022, Cor. 3.3).  Such compositions are
    answered from the closed form (:mod:`dpjax.numerics.exact`) instead of the FFT: exact, and free
    of the FFT round-off floor (q = 1, sigma 30.07, T = 12005 at delta 1.11e-12 was inf on the
    grid; the exact value is 31.67).
    """
    terms = []
    for cls, static, data, P, C in (stack(components) if stacked is None else stacked):
        if cls is Gaussian:
            r = P[:, data.index("sensitivity")] / P[:, data.index("noise_multiplier")]
        elif cls is PoissonSubsampledGaussian and np.all(P[:, data.index("sampling_prob")] == 1.0):
            r = 1.0 / P[:, data.index("noise_multiplier")]
        else:
            return None
        terms.append((C, r))
    mu = _root_sum_squares(terms)
    return mu if math.isfinite(mu) else None


def exact_report(upper, lower) -> DirectionReport:
    # No grid: n = 0 and every truncation / round-off term is 0 (the closed form has none).
    return DirectionReport(direction="remove", upper=upper, lower=lower, n=0, dx=0.0, p_inf=0.0, tail_above=0.0,
                           tail_below=0.0, roundoff=0.0, truncation_budget=0.0)


def exact_epsilon_result(deltas, upper, lower) -> EpsilonResult:
    """The :class:`~dpjax.pld.records.EpsilonResult` of a bracket ``[lower, upper]`` found without
    a grid (a closed form, or 0): one :func:`exact_report`."""
    return EpsilonResult(epsilon=scalar(upper), epsilon_lower=scalar(lower), epsilon_upper=scalar(upper),
                         target_delta=scalar(deltas), directions=(exact_report(upper, lower),))


def exact_delta_result(eps, upper, lower) -> DeltaResult:
    """:func:`exact_epsilon_result` for delta queries (a :class:`~dpjax.pld.records.DeltaResult`)."""
    return DeltaResult(delta=scalar(upper), delta_lower=scalar(lower), delta_upper=scalar(upper),
                       target_epsilon=scalar(eps), directions=(exact_report(upper, lower),))


def exact_epsilon(deltas, mu):
    """(upper, lower) epsilon of the Gaussian mechanism ``mu`` at ``deltas``: the upper end is
    :func:`gaussian_epsilon` (delta there <= target, with its log-margin), the lower end moves
    down until delta there is > target (checked with the same closed form)."""
    upper = np.asarray(gaussian_epsilon(deltas, mu), np.float64)
    log_t = np.log(deltas)
    # An upper end of inf (the search's largest epsilon, 2^70, does not reach the target: mu
    # above ~1e10) has the lower end 2^70 where delta there is certified above the target, else 0.
    finite = np.isfinite(upper)
    top = np.where(finite, upper, EPSILON_SEARCH_MAX)
    lower = np.maximum(top - np.maximum(1e-9 * top, 1e-12), 0.0)
    lower = np.where(finite, lower, EPSILON_SEARCH_MAX)
    # From MU_LARGE on, log delta is an upper bound (no cancellation); the lower end needs delta
    # from below.
    log_delta = gaussian_log_delta if mu < MU_LARGE else (
        lambda e, m: np.vectorize(py_log_delta_lower_large, otypes=[np.float64])(e, m))
    for _ in range(60):
        bad = (lower > 0) & ~(np.asarray(log_delta(lower, mu)) > log_t)
        if not bad.any():
            break
        lower = np.where(bad, np.where(finite, np.maximum(top - 2.0 * (top - lower), 0.0), 0.0), lower)
    return upper, lower


# ------------------------------------------------------------------------------------------
# Arguments: options, components, DP-SGD compositions


def grid_options(options):
    if options is None:
        return GridOptions()
    if not isinstance(options, GridOptions):
        raise ValueError(f"options must be a dpjax.pld.GridOptions, got {options!r}")
    return options


def _is_mechanism(x) -> bool:
    from dpjax.pld.mechanisms import Mechanism

    return isinstance(x, Mechanism) and dataclasses.is_dataclass(x)


def as_components(components) -> list:
    """A mechanism, a ``(mechanism, count)`` pair, or a sequence of either."""
    if _is_mechanism(components):
        return [components]
    if isinstance(components, tuple) and len(components) == 2 and _is_mechanism(components[0]) \
            and not _is_mechanism(components[1]):
        return [components]
    try:
        items = list(components)
    except TypeError:
        raise ValueError(f"components must be a mechanism or a sequence of mechanisms / (mechanism, count) "
                         f"pairs, got {components!r}") from None
    if not items:
        raise ValueError("components must not be empty")
    for item in items:
        mech = item[0] if isinstance(item, tuple) and len(item) == 2 else item
        if not _is_mechanism(mech):
            raise ValueError(f"not a mechanism (a dataclass with symmetric, loss_cdfs and validate: "
                             f"dpjax.pld.Mechanism): {mech!r}")
    return items


def stacked_mechanisms(components):
    """Components as ``(stacked mechanism, counts)`` pairs (one per class and static fields)."""
    return [(cls(**{f: P[:, i] for i, f in enumerate(data)}, **static), C) for cls, static, data, P, C in stack(components)]


def dpsgd_components(noise_multiplier, sampling_prob, steps, noise_schedule=None):
    steps = _validate.positive_int("steps", steps)
    q = _validate.probability_open_closed("sampling_prob", sampling_prob)
    if q.ndim != 0:
        raise ValueError(f"sampling_prob must be a scalar in (0, 1], got {sampling_prob!r}")
    if noise_schedule is None:
        sigma = _validate.positive("noise_multiplier", noise_multiplier)
        if sigma.ndim != 0:
            raise ValueError(
                f"noise_multiplier must be a scalar here, got shape {sigma.shape}: give a per-step schedule as "
                f"noise_schedule=..., or many noise multipliers to dpjax.dpsgd_epsilon / dpsgd_delta (a batch)")
        return [(PoissonSubsampledGaussian(float(sigma), float(q)), steps)]
    sigma = _validate.positive("noise_schedule", noise_schedule)
    if sigma.ndim != 1 or sigma.shape[0] != steps:
        raise ValueError(
            f"noise_schedule must be a 1-D array of length steps={steps}, got shape {sigma.shape}")
    return [(PoissonSubsampledGaussian(sigma, np.full_like(sigma, float(q))), 1)]
