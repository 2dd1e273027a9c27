"""eps(T) curves: certified epsilon after every ``T`` of a list (e.g. every epoch) from one transform.

Koskela & Honkela ("Computing Differential Privacy Guarantees for Heterogeneous Compositions
Using FFT", 2021, §5.5) note that the composed PLD of ``T`` identical steps has the discrete
Fourier transform ``F^T`` of the single-step PMF's transform ``F``, so the privacy curve can be
evaluated for many ``T`` from ONE forward transform.  :func:`epsilon_curve` does exactly that:

1. one grid is planned for the largest ``T`` (the widest window, the strictest single-step
   truncation ``tau / T_max``) and held for every ``T`` of the list;
2. the PLD program (:mod:`dpjax.pld.grid.program`, on the host) discretizes the single step and takes
   its forward FFT once (neither depends on ``T``), then for each ``T`` raises it to the power
   ``T``, inverts, places the window from that ``T``'s own log-MGF and converts to epsilon; the
   inverses are the only per-``T`` transforms;
3. every error term is bounded per ``T`` inside the program exactly as for a single call
   (``+inf`` atom, Chernoff wrap-around bounds of the discretized log-MGF at that ``T``, FFT
   round-off allowance), so each entry is a certified upper bound on the true epsilon after
   ``T`` steps, with its certified lower end; soundness never depends on the grid, which was
   planned for ``T_max`` (docs/design.md §2.4).  Every entry has the single call's error
   accounting: where the FFT round-off floor matters at ``target_delta`` (deltas near 1e-12 and
   below) the composition at that ``T`` is re-run tilted towards the tail on the same grid, as
   the single call does on its own; a ``T`` whose wrap-around bound came out over budget (not
   seen in practice: the window is sized for ``T_max``) or with a direction the grid cannot
   certify (``q T`` far below delta) is recomputed by the single-configuration accountant
   (window widening, and the fallback bounds of :mod:`dpjax.pld.fallback`);
4. composition never gains privacy (the steps after ``T`` are a post-processing away), so a
   bound certified after ``T'`` steps holds after every ``T <= T'``: each entry is the smallest
   bound certified at its ``T`` or at a larger ``T`` of the list, and the curve is monotone.

Error bound against separate calls.  A separate call ``dpsgd_epsilon(sigma, q, T, delta)`` uses
a grid planned for ``T``; both values are certified upper bounds and both lie above the true
epsilon, above each other's certified lower end.  So ``|curve - separate| <= max(upper) -
min(lower)`` of the two brackets; with the default accuracy both are within ``relative_accuracy``
(1e-3) of the true value (measured differences in ``tests/pld/test_curve.py``).

Example::

    >>> import dpjax
    >>> curve = dpjax.epsilon_curve(1.0, 0.01, [100 * e for e in range(1, 101)], 1e-5)  # doctest: +SKIP
    >>> curve.epsilon[-1]                     # after 10,000 steps                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dpjax._base import deferred_x64 as _deferred_x64
from dpjax.pld.records import EpsilonCurve
from dpjax._base import validate as _validate
from dpjax._base.x64 import host_only
from dpjax.pld.grid import engine
from dpjax.pld.dpsgd import dpsgd_accounting
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.pld.grid.plan import GridOptions, plan_grid
from dpjax.pld.scenario import BallsInBins, Poisson, RandomAllocation, accepts_scenario, scheme_keywords

__all__ = ["EpsilonCurve", "epsilon_curve"]


#: Values of T per chunk of the curve (kept for the signature of :func:`epsilon_curve`: the host
#: program evaluates one T at a time from the shared transform).
DEFAULT_BATCH = 16


def _needs_tail_pass(plan, res, delta: float) -> bool:
    """The single call's rule (:func:`dpjax.pld.grid.engine.tail_pass`): the FFT round-off floor
    summed over the window is not negligible at ``delta``."""
    floor = max(float(r[k]["noise_floor"]) * plan.n for r in res for k in r)
    return floor > engine.TAIL_PASS_FRACTION * delta


def _plan_at(plan, t: int, t_max: int):
    """The curve's plan with the count ``t`` and that count's composed moments (the tilted pass
    places its window from them: mean ~ T, std ~ sqrt(T))."""
    groups = tuple(tuple(g._replace(counts=np.asarray([t], np.int64)) for g in gd) for gd in plan.groups)
    r = t / t_max
    return dataclasses.replace(plan, groups=groups, total_count=t,
                               mean_composed=tuple(m * r for m in plan.mean_composed),
                               sigma_composed=tuple(s * r**0.5 for s in plan.sigma_composed))


@accepts_scenario("target_delta", name="dpjax.epsilon_curve", overridable=("steps", "epochs"))
@host_only("dpjax.pld.grid_epsilon_fn with counts=... on a grid from dpjax.pld.plan_fixed_grid")
def epsilon_curve(noise_multiplier, sampling_prob=None, steps=None, target_delta=None, *,
                  options: GridOptions | None = None, with_lower: bool = True, batch: int = DEFAULT_BATCH,
                  sampling="poisson", epochs=None) -> EpsilonCurve:
    """Certified epsilon of DP-SGD after every ``T`` in ``steps``, from one transform.

    Args:
      noise_multiplier: sigma > 0.
      sampling_prob: Poisson sampling probability q in (0, 1].
      steps: 1-D sequence of numbers of steps (integers >= 1; any order, repeats allowed).
      target_delta: in (0, 1).
      options: :class:`~dpjax.pld.GridOptions` (accuracy knobs).
      with_lower: also compute the certified lower ends.
      batch: accepted for compatibility (an integer >= 1; each ``T`` is evaluated in turn from
        the shared transform).
      sampling: ``"poisson"`` (default) or :class:`dpjax.Poisson` ``(q)``; or
        :class:`dpjax.RandomAllocation` / :class:`dpjax.BallsInBins` with ``epochs`` (an integer:
        every epoch up to it, or a list) instead of ``sampling_prob`` and ``steps``: epsilon after each epoch
        (:func:`dpjax.pld.allocation.accountant.allocation_epsilon_curve`; ``steps`` of the result
        are the steps after each entry).

    Also ``epsilon_curve(scenario, target_delta, steps=[...])`` with a
    :class:`~dpjax.pld.scenario.TrainingScenario` (Poisson), or ``epochs=[...]`` for random
    allocation and balls-in-bins; without the list, the curve has the scenario's own step count
    (every epoch up to the scenario's, for the per-epoch schemes).

    Returns:
      :class:`EpsilonCurve`.
    """
    scheme = scheme_keywords("epsilon_curve", sampling, sampling_prob, accepts=(Poisson, RandomAllocation, BallsInBins))
    sampling_prob = scheme.sampling_prob
    if scheme.sampling != "poisson" or epochs is not None:
        return _allocation_curve(noise_multiplier, sampling_prob, steps, target_delta, sampling=scheme.sampling,
                                 batches_per_epoch=scheme.batches_per_epoch,
                                 selections_per_epoch=scheme.selections_per_epoch, epochs=epochs)
    if sampling_prob is None or steps is None or target_delta is None:
        raise ValueError("epsilon_curve needs sampling_prob, steps and target_delta (Poisson sampling)")
    options = engine.grid_options(options)
    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
    batch = _validate.positive_int("batch", batch)
    t_list = np.atleast_1d(np.asarray(steps, dtype=object))
    if t_list.ndim != 1 or t_list.size == 0:
        raise ValueError(f"steps must be a non-empty 1-D sequence of integers >= 1, got {steps!r}")
    t_list = np.asarray([_validate.positive_int("steps", t) for t in t_list], np.int64)
    t_max = int(t_list.max())
    kinds = ("up", "down") if with_lower else ("up",)
    directions = ("remove", "add")
    uniq = np.unique(t_list)
    with _deferred_x64():
        groups, _lo, _sym, _blocked = engine.prepare([(PoissonSubsampledGaussian(sigma, q), t_max)],
                                                    options.max_distinct)
        tail_mass = options.tail_fraction * delta
        plan = plan_grid(groups, directions, tail_mass=tail_mass, eps_hint=None, target_delta=delta, options=options)
        flat = _run_curve(plan, uniq, delta, directions, kinds, batch)
        single = functools.partial(dpsgd_accounting, sigma, q, target_delta=delta, options=options,
                                   with_lower=with_lower)
        upper, lower, redo = _brackets(flat, plan, groups, uniq, t_max, delta, directions, kinds, options, single)
    # Composition never gains privacy: the steps after T are a post-processing away, so a bound
    # certified after T' steps also holds after every T <= T'.  Each entry is the smallest bound
    # certified at its T or at any larger T of the list (a curve that is monotone in T).
    upper = np.minimum.accumulate(upper[::-1])[::-1]
    lower = np.minimum(lower, upper)
    pos = np.searchsorted(uniq, t_list)
    return EpsilonCurve(steps=t_list, epsilon=upper[pos], epsilon_lower=lower[pos], epsilon_upper=upper[pos],
                        target_delta=delta, n=int(plan.n), dx=float(plan.dx), recomputed=redo[pos])


def _allocation_curve(noise_multiplier, sampling_prob, steps, target_delta, *, sampling, batches_per_epoch,
                      selections_per_epoch, epochs) -> EpsilonCurve:
    """``epsilon_curve(sampling="random_allocation" | "balls_in_bins")``: epsilon after each epoch
    (:func:`dpjax.pld.allocation.accountant.allocation_epsilon_curve`)."""
    from dpjax.pld.allocation.accountant import allocation_epsilon_curve

    if sampling not in ("random_allocation", "balls_in_bins"):
        raise ValueError(f"sampling must be one of ('poisson', 'random_allocation', 'balls_in_bins'), got "
                         f"{sampling!r}")
    if sampling_prob is not None or steps is not None:
        raise ValueError(f"sampling_prob and steps are for sampling='poisson' (give batches_per_epoch and "
                         f"epochs for {sampling!r})")
    if batches_per_epoch is None or epochs is None or target_delta is None:
        raise ValueError(f"sampling={sampling!r} needs batches_per_epoch, epochs and target_delta")
    return allocation_epsilon_curve(noise_multiplier, batches_per_epoch, epochs, target_delta,
                                    selections_per_epoch=selections_per_epoch,
                                    balls_in_bins=sampling == "balls_in_bins")


def _run_curve(plan, uniq, delta, directions, kinds, batch):
    """The packed program output ``(K, directions, kinds, 1 + diagnostics)`` at every distinct
    ``T`` of ``uniq``: the PLD program on the host, one discretization and forward transform for
    every ``T`` (:func:`dpjax.pld.grid.program.run_host_counts`)."""
    from dpjax.pld.grid import program as prog

    inp, spec = prog.host_inputs(plan, [delta], kinds=kinds, want="eps")
    return prog.run_host_counts(inp, spec, uniq)


def _brackets(flat, plan, groups, uniq, t_max, delta, directions, kinds, options, single):
    """``(upper, lower, recomputed)`` per distinct ``T``: the program's bracket with the single
    call's rules applied (a window over budget or a direction the grid cannot certify: the
    single call ``single(T)``; an FFT round-off floor that matters: the tilted tail pass)."""
    k = len(uniq)
    upper = np.empty(k)
    lower = np.zeros(k)
    redo = np.zeros(k, bool)
    budget = 10.0 * plan.tau_wrap
    for i in range(k):
        res = engine.unpack(flat[i], directions, kinds, (1,))
        over = any((kd == "up" and float(r["tail_above"]) > budget) or float(r["tail_below"]) > budget
                   for rd in res for kd, r in rd.items())
        if over:  # the single-configuration accountant widens the window
            redo[i] = True
            s = single(int(uniq[i]))
            upper[i], lower[i] = float(s.epsilon_upper), float(s.epsilon_lower)
            continue
        if _needs_tail_pass(plan, res, delta):
            # The single call's error accounting where the FFT round-off floor matters (small
            # delta): the composition re-run tilted towards the tail, on this grid at this T
            # (one compiled program for every T).
            t = int(uniq[i])
            groups_t = [g._replace(counts=np.asarray([t], np.int64)) for g in groups]
            res = engine.tail_pass(groups_t, directions, kinds, np.asarray([delta]), np.zeros(()),
                                   _plan_at(plan, t, t_max), res, want="eps", n_max=options.n_max)
        _, up, lo = engine.combine([(d, plan, r) for d, r in zip(directions, res)])
        upper[i], lower[i] = float(np.ravel(up)[0]), float(np.ravel(lo)[0])
        if not np.isfinite(upper[i]):
            # A direction the grid cannot certify: the single call's fallback bounds.
            redo[i] = True
            s = single(int(uniq[i]))
            upper[i], lower[i] = float(s.epsilon_upper), float(s.epsilon_lower)
    return upper, lower, redo
