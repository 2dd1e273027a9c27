"""Many accountant calls at once, and their derivatives on the accountant's own grid.

:func:`epsilon_many` / :func:`delta_many` answer a batch of compositions (e.g. DP-SGD at many
noise multipliers) with the numbers :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` give one
at a time: each element is the accountant's own call (its grid, its program on the host), run on
a few threads (the PLD program's array operations release the GIL), so each element equals the
single call bit for bit.

:func:`grid_partials` gives the derivatives that make these functions differentiable
(:mod:`dpjax._base.traced`): on the grid the accountant planned at the point, the certified delta
curve of the composition is ``delta(eps; theta)`` (max over the add/remove directions), and

* ``d delta / d theta`` at fixed ``eps`` is the derivative of the active direction's curve
  (autodiff through the composition on the fixed grid; the envelope theorem for the max);
* ``d delta / d eps`` is the curve's slope.  On the grid the curve is piecewise
  ``A_j - e^{eps - y_ref} B_j`` (connect-the-dots), so its slope steps at every grid point by
  about ``dx x`` (the loss's hazard rate) relatively: ~1e-3 on DP-SGD's default grid, far more
  than the accuracy of the values.  The slope used is that of the smooth curve the grid
  interpolates: each segment's chord slope is the exact slope at (about) the segment's middle,
  and between middles it is interpolated linearly (``O(dx^2)``);
* the epsilon of a target delta then has ``d eps / d theta = -(d delta/d theta) / (d delta/d eps)``
  and ``d eps / d delta* = 1 / (d delta/d eps)`` (implicit function theorem), and a calibrated
  noise multiplier ``d sigma / d eps* = -(d delta/d eps) / (d delta/d sigma)``,
  ``d sigma / d delta* = 1 / (d delta/d sigma)``.

These are derivatives at a fixed grid.  The accountant re-plans its grid at every argument
(the spacing follows the noise multiplier continuously), so a finite difference of its values
also carries the change of the discretization error with the plan: a small term
(``~1e-5`` relative at DP-SGD's ``(1.0, 0.01, 1000, 1e-5)``, up to ``~2e-4`` on long
compositions such as ``T = 20000``, where the discretization error itself is larger).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
from typing import Sequence

import numpy as np

from dpjax._base import deferred_x64, jax_loaded, lazy_module as _lazy_module
from dpjax._base import xla as _xla
from dpjax._base.x64 import reset_thread
from dpjax.pld import accountant as _acc
from dpjax.pld.grid import engine
from dpjax.pld.grid import program as prog
from dpjax.pld.grid.plan import GridOptions, plan_grid

jax = _lazy_module("jax")

__all__ = ["epsilon_many", "delta_many", "grid_partials"]

#: Threads answering a batch: one per usable core (each element's program runs in NumPy, which
#: releases the GIL in its array operations and FFTs).
_IN_FLIGHT = min(4, _xla.usable_cpus())


@functools.lru_cache(maxsize=1)
def _workers() -> concurrent.futures.ThreadPoolExecutor:
    # A thread inherits its creator's floating-point environment, and the first batch may come
    # from a host callback, which runs with subnormals flushed (dpjax._base.x64.ieee_arithmetic).
    return concurrent.futures.ThreadPoolExecutor(max_workers=_IN_FLIGHT, thread_name_prefix="dpjax-batch",
                                                 initializer=reset_thread)


# A forked child has the executor but not its threads: it builds its own.
os.register_at_fork(after_in_child=_workers.cache_clear)


def _options(options):
    return engine.grid_options(options)


def _first_plan(components, *, want, target, options):
    """The accountant's first plan for one element (what :func:`dpjax.pld.grid.engine.run` plans
    before any retry)."""
    up, _, symmetric, _ = engine.prepare(components, options.max_distinct)
    directions = ("remove",) if symmetric else ("remove", "add")
    if want == "eps":
        kw = dict(tail_mass=options.tail_fraction * float(target), eps_hint=None, target_delta=float(target))
    else:
        kw = dict(tail_mass=options.delta_tail_mass, eps_hint=float(target), target_delta=None)
    plan = plan_grid(up, directions, options=options, **kw)
    engine.check_memory(plan, directions)
    return plan


def _one(components, target, *, want, options) -> float:
    if want == "eps":
        return float(np.asarray(_acc.epsilon(components, target, options=options, with_lower=False).epsilon))
    return float(np.asarray(_acc.delta(components, target, options=options, with_lower=False).delta))


def _many(components_list, targets, *, want, options):
    """Each element through the accountant's own call (:func:`dpjax.pld.epsilon` /
    :func:`dpjax.pld.delta`, ``with_lower=False``), on :data:`_IN_FLIGHT` threads: the same
    numbers as one call at a time, bit for bit."""
    options = _options(options)
    targets = np.asarray(targets, np.float64).reshape(-1)
    comps = [engine.as_components(c) for c in components_list]
    if len(comps) == 1:
        return np.asarray([_one(comps[0], targets[0], want=want, options=options)])
    # The worker inherits the caller's x64 setting (a thread-local JAX configuration); before
    # JAX is imported, the float64 scope it would enter on first use.
    x64 = bool(jax.config.jax_enable_x64) if jax_loaded() else None

    def run(i):
        # Each worker answers whole elements; their directions run serially (no nested threads).
        with (deferred_x64() if x64 is None else jax.enable_x64(x64)):
            return prog.worker(_one, comps[i], targets[i], want=want, options=options)

    return np.asarray(list(_workers().map(run, range(len(comps)))), np.float64)


def epsilon_many(components_list: Sequence, target_deltas, *, options: GridOptions | None = None) -> np.ndarray:
    """Certified epsilon of each composition at its target delta, as :func:`dpjax.pld.epsilon`
    gives it (``with_lower=False``): ``(B,)`` float64 for ``B`` compositions and ``B`` targets.

    Host side (concrete values).  Must run with x64 enabled (the public wrappers do)."""
    return _many(components_list, target_deltas, want="eps", options=options)


def delta_many(components_list: Sequence, target_epsilons, *, options: GridOptions | None = None) -> np.ndarray:
    """Certified delta of each composition at its target epsilon, as :func:`dpjax.pld.delta`
    gives it (``with_lower=False``)."""
    return _many(components_list, target_epsilons, want="delta", options=options)


# ------------------------------------------------------------------------------------------
# Derivatives on the accountant's grid


def grid_partials(components, *, noise_multiplier: float, sampling_prob: float | None, target_delta=None,
                  epsilon=None, options: GridOptions | None = None) -> dict:
    """Derivatives of the certified delta curve of a one-step-kind composition (DP-SGD: one
    mechanism composed ``T`` times) on the grid the accountant plans for it.

    ``components``: ``[(mechanism, T)]`` whose mechanism's ``noise_multiplier`` field is
    proportional to ``noise_multiplier`` (the derivative is taken in that scale) and whose
    ``sampling_prob`` field is ``sampling_prob`` (None: not differentiated).  Give
    ``target_delta`` (an epsilon query: the grid of :func:`dpjax.pld.epsilon`, read at
    ``epsilon`` when given, else at the certified epsilon there) or only ``epsilon`` (a delta
    query: the grid of :func:`dpjax.pld.delta`).

    Returns a dict of floats: ``epsilon``, ``delta`` (the point on the curve),
    ``d_delta_d_sigma``, ``d_delta_d_q`` (0 when not differentiated) and ``d_delta_d_eps`` (the
    smooth slope, < 0).  NaN entries when the grid cannot represent the point (an infinite
    epsilon).
    """
    options = _options(options)
    comps = engine.as_components(components)
    if target_delta is not None:
        plan = _first_plan(comps, want="eps", target=target_delta, options=options)
        if epsilon is None:
            # The certified epsilon on this grid (the accountant's value where it is regular).
            epsilon = float(epsilon_many([comps], [target_delta], options=options)[0])
    else:
        plan = _first_plan(comps, want="delta", target=epsilon, options=options)
    nan = dict(epsilon=float(epsilon), delta=math.nan, d_delta_d_sigma=math.nan, d_delta_d_q=math.nan,
               d_delta_d_eps=math.nan)
    if not math.isfinite(epsilon):
        return nan
    use_q = sampling_prob is not None
    inp, spec = prog.host_inputs(plan, [0.5], kinds=("up",), want="delta")
    mech = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64)[0], plan.groups[0][0].mechanism)
    sigma = float(mech.noise_multiplier)
    # Central differences of the single-step PMFs (prog.host_curve_partials): steps of 1e-5
    # relative (truncation ~1e-10 relative, far below the values' accuracy; round-off of a
    # difference of smooth PMFs, ~1e-11).
    h_s = 1e-5
    tangents = [(dataclasses.replace(mech, noise_multiplier=sigma * (1 + h_s)),
                 dataclasses.replace(mech, noise_multiplier=sigma * (1 - h_s)), h_s)]
    if use_q:
        q = float(mech.sampling_prob)
        h_q = 1e-5 * min(q, 1.0 - q) if q < 1.0 else 1e-5
        tangents.append((dataclasses.replace(mech, sampling_prob=q + h_q),
                         dataclasses.replace(mech, sampling_prob=q - h_q), h_q))
    res = prog.host_curve_partials(inp, spec, float(epsilon), tangents)
    deltas, slopes = res["delta"], res["slope"]
    a = int(np.argmax(deltas))  # the active direction (envelope theorem for the max)
    dr = res["partials"][0]
    return dict(epsilon=float(epsilon), delta=float(deltas[a]), d_delta_d_sigma=float(dr[a]) / float(noise_multiplier),
                d_delta_d_q=float(res["partials"][1][a]) if use_q else 0.0, d_delta_d_eps=float(slopes[a]))
