"""Many accountant calls at once, and their derivatives on the accountant's own grid.

:func:`epsilon_many` / :func:`delta_many` answer a batch of compositions (e.g. DP-SGD at many
noise multipliers) with the numbers :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` give one
at a time: every element gets the grid the accountant plans for it (same spacing, window,
offsets, Chernoff parameters), and the elements whose plans share a static shape run in
compiled programs of a few elements each, a loop over them inside XLA (``lax.fori_loop`` with
the count as a runtime argument: padding slots cost nothing, and one program per static shape
serves every batch).  Such a program is dispatched as soon as its elements are planned, so XLA
runs it on a core of its own while the host plans the next ones: the batch costs the programs
alone, spread over the cores, where a Python loop of single calls plans, dispatches and waits for
each in turn.  Elements on the accountant's less common paths (the closed form of compositions
that are exactly one Gaussian, a window widened after a wrap-around bound over budget, the
frequency-truncation retry, the tilted tail pass of tiny deltas, a bound the grid cannot
certify) are answered by the accountant itself, one call each.  So each element equals the
single call (bit for bit on CPU in our tests; the batch program is the same XLA computation
inside a loop).

:func:`grid_partials` gives the derivatives that make these functions differentiable
(:mod:`dpjax._traced`): on the grid the accountant planned at the point, the certified delta
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

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _xla
from dpjax.pld import accountant as _acc
from dpjax.pld import engine
from dpjax.pld.compose import Group, compose_directions, lattice_groups
from dpjax.pld.convert import curve_terms
from dpjax.pld.exact import host_gaussian_epsilon
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.pld.plan import GridOptions, coarse_shape, plan_grid

__all__ = ["epsilon_many", "delta_many", "grid_partials"]

#: Capacities of the batch program (its input arrays): one compiled program per static grid
#: shape and capacity; the loop runs over the actual count only.
_CAPACITIES = (8, 64, 512, 4096)

_STATIC = ("directions", "ms", "n", "kinds", "want", "n_freq", "lattice")


@functools.partial(_xla.jit, static_argnames=_STATIC)
def _loop_program(count, groups, dx, lambdas, log_tau, deltas, epsilons, *, directions, ms, n, kinds, want,
                  n_freq, lattice=None):
    """The accountant's program (:func:`dpjax.pld.engine.program_jit`) for the first
    ``count`` of a batch of plans of one static shape (leading axis on every array); ``lattice``
    as the accountant passes it (both directions' loss CDFs from one lattice evaluation)."""
    raw = engine.program_jit.__wrapped__
    static = dict(directions=directions, ms=ms, n=n, kinds=kinds, want=want, n_freq=n_freq, lattice=lattice)
    data = (groups, dx, lambdas, log_tau, deltas, epsilons)

    def one(i):
        args = jax.tree_util.tree_map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), data)
        return raw(*args, **static)

    shape = jax.eval_shape(one, 0)
    capacity = jax.tree_util.tree_leaves(data)[0].shape[0]
    out = jnp.zeros((capacity,) + shape.shape, shape.dtype)
    return jax.lax.fori_loop(0, count, lambda i, o: o.at[i].set(one(i)), out)


def _first_plan(components, *, want, target, options):
    """The accountant's first plan for one element (what :func:`dpjax.pld.engine.run`
    plans before any retry), or None when the element takes a path of its own."""
    up, _, symmetric, _ = engine.prepare(components, options.max_distinct)
    directions = ("remove",) if symmetric else ("remove", "add")
    if want == "eps":
        kw = dict(tail_mass=options.tail_fraction * float(target), eps_hint=None, target_delta=float(target))
    else:
        kw = dict(tail_mass=options.delta_tail_mass, eps_hint=float(target), target_delta=None)
    plan = coarse_shape(plan_grid(up, directions, options=options, **kw), options)
    engine.check_memory(plan, directions)
    return plan


def _key(plan):
    common = tuple(max(m[gi] for m in plan.ms) for gi in range(len(plan.ms[0])))
    leaves, tree = jax.tree_util.tree_flatten(plan.groups)
    # The accountant's static lattice flags (dpjax.pld.engine.program): the same work sharing
    # between the directions, so the same numbers as the single call.
    lattice = lattice_groups(plan.groups, plan.directions, plan.dx, common)
    return (plan.directions, common, plan.n, plan.n_freq, lattice, tree, tuple(np.shape(x) for x in leaves))


def _stack(*xs):
    return np.stack([np.asarray(x) for x in xs])


#: Elements per dispatched program (the smallest capacity): a chunk of plans of one static shape
#: is dispatched as soon as it is full, while the host plans the next elements.  The host's
#: planning (~15% of an element's cost) then hides behind the programs.
_CHUNK = _CAPACITIES[0]
#: Programs running at once: one per usable core (one program runs on about one core), so that
#: they do not compete for the cores' caches.
_IN_FLIGHT = min(4, _xla.usable_cpus())


@functools.lru_cache(maxsize=1)
def _workers() -> concurrent.futures.ThreadPoolExecutor:
    # Each chunk's program is run to completion by a worker thread (the GIL is released while XLA
    # runs).  Outside a trace, JAX's asynchronous dispatch alone would overlap the programs; but
    # inside a host callback (``jax.vmap``/``jax.jit`` of a headline function, dpjax._traced) XLA
    # runs a dispatched program inline, one at a time, so the threads are what lets a traced
    # batch use every core.
    return concurrent.futures.ThreadPoolExecutor(max_workers=_IN_FLIGHT, thread_name_prefix="dpjax-batch")


# A forked child has the executor but not its threads: it builds its own.
os.register_at_fork(after_in_child=_workers.cache_clear)


def _run_chunk(args, static):
    out = _loop_program(*args, **static)
    return np.asarray(out)


class _Dispatcher:
    """Plans grouped by static shape (:func:`_key`) as they arrive; each group's chunk of
    :data:`_CHUNK` plans runs as one :func:`_loop_program` on a worker thread, started when full
    (the last, partial chunks by :meth:`results`)."""

    def __init__(self, want: str):
        self.want = want
        self.buckets: dict = {}
        self.pending: list = []

    def add(self, index: int, plan, target) -> None:
        key = _key(plan)
        bucket = self.buckets.setdefault(key, [])
        bucket.append((index, plan, float(target)))
        if len(bucket) == _CHUNK:
            self._launch(key, self.buckets.pop(key))

    def _launch(self, key, chunk) -> None:
        directions, common, n, n_freq, lattice = key[:5]
        cap = next(c for c in _CAPACITIES if c >= len(chunk))
        pad = chunk + [chunk[-1]] * (cap - len(chunk))
        ps = [p for _, p, _ in pad]
        groups = jax.tree_util.tree_map(_stack, *[p.groups for p in ps])
        tg = np.asarray([t for _, _, t in pad], np.float64)
        if self.want == "eps":
            deltas, epsilons = tg, np.zeros(cap)
        else:
            deltas, epsilons = np.full((cap, 1), 0.5), tg
        args = (np.int32(len(chunk)), groups, _stack(*[p.dx for p in ps]), _stack(*[p.lambdas for p in ps]),
                _stack(*[p.log_tau for p in ps]), deltas, epsilons)
        static = dict(directions=directions, ms=tuple(common for _ in directions), n=n, kinds=("up",),
                      want=self.want, n_freq=n_freq, lattice=lattice)
        # The worker inherits the caller's x64 setting (a thread-local JAX configuration).
        x64 = bool(jax.config.jax_enable_x64)

        def run():
            with jax.enable_x64(x64):
                return _run_chunk(args, static)

        self.pending.append(([i for i, _, _ in chunk], directions, _workers().submit(run)))

    def results(self) -> dict:
        """``{index: unpacked result}`` (as :func:`dpjax.pld.engine.unpack`) of every plan added."""
        for key, chunk in list(self.buckets.items()):
            self._launch(key, chunk)
        self.buckets = {}
        out = {}
        pending, self.pending = self.pending, []
        for indices, directions, future in pending:
            flat = future.result()
            for j, i in enumerate(indices):
                out[i] = engine.unpack(flat[j], directions, ("up",), ())
        return out


def _regular(plan, res, *, want, target, options) -> float | None:
    """The element's value when the accountant would stop after this first run, else None
    (conditions of :func:`dpjax.pld.engine.run` and :func:`~dpjax.pld.engine.tail_pass`)."""
    rs = [r["up"] for r in res]
    if plan.n_freq is not None and any(float(r["truncation"]) > 1e-3 * plan.tau_wrap for r in rs):
        return None
    budget = 10.0 * plan.tau_wrap
    if any(float(r["tail_above"]) > budget or float(r["tail_below"]) > budget for r in rs) \
            and plan.n < options.n_max:
        return None
    values = [float(np.asarray(r["value"])) for r in rs]
    level = float(target) if want == "eps" else min(values)
    floor = max(float(r["noise_floor"]) for r in rs) * plan.n
    if level > 0 and floor > engine.TAIL_PASS_FRACTION * level:
        return None
    if any(math.isnan(v) for v in values):
        return None
    value = max(values)
    if want == "eps" and not math.isfinite(value):
        return None
    return value


def _options(options):
    return engine.grid_options(options)


def _one_dpsgd_step(components):
    """``(sigma, q, T)`` when the composition is one scalar :class:`PoissonSubsampledGaussian`
    composed ``T`` times (DP-SGD), else None (the checks below then take the general route)."""
    if len(components) != 1 or not isinstance(components[0], tuple):
        return None
    mech, count = components[0]
    if type(mech) is not PoissonSubsampledGaussian or np.ndim(mech.noise_multiplier) or np.ndim(mech.sampling_prob):
        return None
    return float(mech.noise_multiplier), float(mech.sampling_prob), int(count)


def _special_epsilon(components, target):
    """True when :func:`dpjax.pld.epsilon` answers without the FFT grid (its closed forms: an
    exact Gaussian composition, or noise so large that the dominating Gaussian's epsilon is 0)."""
    one = _one_dpsgd_step(components)
    if one is not None:
        sigma, q, count = one
        mu_dom, exact = math.sqrt(count) / sigma, q == 1.0
    else:
        mu_dom = engine.dominating_gaussian_mu(components)
        if mu_dom is None:
            return False
        exact = engine.exact_gaussian_mu(components) is not None
    return exact or not float(host_gaussian_epsilon(np.float64(target), mu_dom)) > 0


def _special_delta(components):
    one = _one_dpsgd_step(components)
    if one is not None:
        sigma, q, count = one
        return q == 1.0 or math.sqrt(count) / sigma < 1e-100
    mu = engine.exact_gaussian_mu(components)
    mu_dom = engine.dominating_gaussian_mu(components)
    return mu is not None or (mu_dom is not None and mu_dom < 1e-100)


def _many(components_list, targets, *, want, options):
    options = _options(options)
    targets = np.asarray(targets, np.float64).reshape(-1)
    comps = [engine.as_components(c) for c in components_list]
    out = np.full(len(comps), np.nan)
    single = []
    plans = {}
    dispatcher = _Dispatcher(want)
    for i, c in enumerate(comps):
        # One element: the accountant's own call (its compiled program, no batch program).
        special = len(comps) == 1 or (_special_epsilon(c, targets[i]) if want == "eps" else _special_delta(c))
        if special:
            single.append(i)
            continue
        plans[i] = _first_plan(c, want=want, target=targets[i], options=options)
        dispatcher.add(i, plans[i], targets[i])  # runs while the next elements are planned
    for i, res in sorted(dispatcher.results().items()):
        v = _regular(plans[i], res, want=want, target=targets[i], options=options)
        if v is None:
            single.append(i)
            continue
        if want == "eps":  # as the single call (dpjax.pld.accountant.epsilon) does
            floored = _acc.rare_sampling_floor(comps[i], targets[i], v)
            v = v if floored is None else float(floored)
        out[i] = v
    for i in single:
        if want == "eps":
            out[i] = float(np.asarray(_acc.epsilon(comps[i], targets[i], options=options, with_lower=False).epsilon))
        else:
            out[i] = float(np.asarray(_acc.delta(comps[i], targets[i], options=options, with_lower=False).delta))
    return out


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


def _curve_at(comp, eps):
    """``(delta(eps), slope)`` of one direction's upper curve (:func:`dpjax.pld.convert.table`
    terms, summed for the one segment holding ``eps`` only: masked sums instead of the full
    table, cheap to compile and to differentiate)."""
    r, y, w, y_ref, const, fa, fb = curve_terms(comp, "upper")
    n = r.shape[-1]
    dx = comp.dx
    t = jnp.arange(n)
    j = jnp.clip(jnp.floor((eps - y[0]) / dx).astype(jnp.int64), -1, n - 1)
    frac = jnp.clip((eps - (y[0] + j * dx)) / dx, 0.0, 1.0)
    above = lambda k, x: jnp.sum(jnp.where(t > k, x, 0.0))
    A = above(j, r) * fa + const
    e = jnp.exp(jnp.minimum(eps - y_ref, 700.0))
    delta = jnp.clip(A - e * above(j, w) * fb, 0.0, 1.0)
    # Smooth slope (module docstring): chord coefficients of segments j-1, j, j+1.
    wb = jax.lax.stop_gradient(w * fb)
    b, b_next, b_prev = above(j, wb), above(j + 1, wb), above(j - 1, wb)
    b = jnp.where(frac >= 0.5, b + (b_next - b) * (frac - 0.5), b + (b_prev - b) * (0.5 - frac))
    return delta, -e * b


@functools.partial(_xla.jit, static_argnames=("use_q", "directions", "ms", "n", "n_freq"))
def _partials_jit(mechanism, counts, offsets, dx, lambdas, log_tau, q, eps, *, use_q, directions, ms, n, n_freq):
    """On the grid of a plan (``mechanism`` the one DP-SGD step at the planned point, composed
    ``counts`` times; per-direction ``offsets``): per direction ``(delta(eps), d delta/d r,
    d delta/d q, d delta/d eps)`` where the noise multiplier is scaled by ``r`` (at ``r = 1``).
    Forward mode (two tangents): cheaper to compile than a reverse pass through the FFTs."""

    def mech(r, qq):
        kw = dict(noise_multiplier=mechanism.noise_multiplier * r)
        if use_q:
            kw["sampling_prob"] = jnp.broadcast_to(qq, jnp.shape(mechanism.sampling_prob))
        return dataclasses.replace(mechanism, **kw)

    def curves(r, qq):
        m = mech(r, qq)
        groups = tuple((Group(mechanism=m, counts=counts, offsets=offsets[di]),) for di in range(len(directions)))
        comp = compose_directions(groups, dx, lambdas, log_tau, directions=directions, ms=ms, n=n,
                                  kinds=("up",), n_freq=n_freq).up
        return jax.vmap(lambda c: _curve_at(c, eps))(comp)

    x = jnp.stack([jnp.ones(()), jnp.asarray(q, jnp.float64)])
    primal, tangent = jax.vmap(lambda v: jax.jvp(lambda rq: curves(rq[0], rq[1]), (x,), (v,)))(jnp.eye(2))
    deltas, slopes = primal[0][0], primal[1][0]
    return deltas, tangent[0][0], tangent[0][1], slopes


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
    groups = [grp[0] for grp in plan.groups]
    use_q = sampling_prob is not None
    # Supports padded to n and every frequency kept: the program depends on n alone (one compile
    # serves every point of that FFT length); a longer support only moves single-step mass from
    # the +inf atom onto the grid, which changes the curve below the accuracy of the values.
    common = tuple(int(plan.n) for _ in plan.ms[0])
    deltas, dr, dq, slopes = (np.asarray(x) for x in _partials_jit(
        groups[0].mechanism, np.asarray(groups[0].counts, np.int64),
        np.stack([np.asarray(g.offsets, np.int64) for g in groups]), np.float64(plan.dx),
        np.asarray(plan.lambdas, np.float64), np.float64(plan.log_tau),
        np.float64(sampling_prob if use_q else 0.0), np.float64(epsilon), use_q=use_q,
        directions=tuple(plan.directions), ms=common, n=int(plan.n), n_freq=None))
    a = int(np.argmax(deltas))  # the active direction (envelope theorem for the max)
    return dict(epsilon=float(epsilon), delta=float(deltas[a]), d_delta_d_sigma=float(dr[a]) / float(noise_multiplier),
                d_delta_d_q=float(dq[a]) if use_q else 0.0, d_delta_d_eps=float(slopes[a]))
