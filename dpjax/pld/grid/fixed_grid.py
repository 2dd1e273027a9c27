"""A jittable, differentiable ``delta(eps; params)`` and ``eps(delta; params)`` on a FIXED grid.

For calibration, sweeps and optimization loops the grid is planned once on the host
(:func:`plan_fixed_grid`, for any mechanisms of :mod:`dpjax.pld.mechanisms` /
:mod:`dpjax.pld.mog` with their counts) and then held fixed, so that :func:`delta_fn` and
:func:`grid_epsilon_fn` are pure fixed-shape JAX functions of the mechanism parameters: jittable,
vmappable (over parameters, or over a batch of grids from :func:`stack_grids`) and
differentiable in every numeric mechanism parameter, ``epsilon`` / ``target_delta`` included.

Soundness for ANY parameters.  The grid (``n``, ``dx``, offsets, support lengths, Chernoff
parameters) was chosen at the planning point, but every approximation is bounded inside the
program for the parameters actually given (Koskela & Honkela, "Computing Differential Privacy
Guarantees for Heterogeneous Compositions Using FFT", 2021): single-step mass above the support
goes to the ``+inf`` atom, mass below is lumped onto the first grid point (dominating), the
wrap-around of the circular convolution is bounded by Chernoff bounds on the discretized
log-MGF and added, and the FFT round-off allowance is added.  So ``delta_fn`` is a certified
upper bound on the true delta and ``grid_epsilon_fn`` a certified upper bound on the true epsilon at
every parameter value; the plan only decides how *tight* they are (tight near the planning
point and for parameters that shrink the loss distribution, e.g. larger noise).

``grid_epsilon_fn`` needs no search: on a grid segment the delta curve is exactly
``A_j - e^{eps - y_ref} B_j``, so ``eps(delta)`` is ``y_ref + log((A_j - delta) / B_j)`` in the
bracketing segment (:func:`dpjax.pld.grid.convert.eps_at`); its derivative flows through the table
``(A_j, B_j)``, which is the implicit-function derivative of the root on that segment.  With
add/remove adjacency the certified delta is the max over directions, so the certified epsilon
is the max over directions of each direction's epsilon.

Example::

    import jax, jax.numpy as jnp
    from dpjax import pld

    grid = pld.plan_fixed_grid([(pld.PoissonSubsampledGaussian(1.0, 0.01), 1000)],
                               target_delta=1e-5)                       # host side, once
    mech = lambda s: [pld.PoissonSubsampledGaussian(s, 0.01)]
    pld.grid_epsilon_fn(grid, 1e-5, mech(1.0))                                # ~ 1.83
    jax.grad(lambda s: pld.grid_epsilon_fn(grid, 1e-5, mech(s)))(1.0)         # d eps / d sigma
    jax.vmap(lambda s: pld.delta_fn(grid, 2.0, mech(s)))(jnp.linspace(0.9, 1.2, 8))

All of these work from float32 code (the float64 contract of :mod:`dpjax._base.x64`); inside a
user's ``jax.jit`` they need ``jax.enable_x64(True)`` around the tracing.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple, Sequence

import numpy as np

from dpjax._base import lazy_module as _lazy_module, register_pytree_dataclass as _register_pytree_dataclass
from dpjax._base import validate as _validate
from dpjax._base.x64 import float64, host_only
from dpjax.pld.grid.compose import Group, compose
from dpjax.pld.grid.convert import Bound, HockeyStickTable, delta_at, eps_at, table
from dpjax.pld.mechanisms import DIRECTIONS, Direction
from dpjax.pld.grid.plan import GridOptions, plan_grid

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

__all__ = ["FixedGrid", "plan_fixed_grid", "stack_grids", "delta_fn", "grid_epsilon_fn", "tables", "EpsilonReport",
           "LooseBoundWarning", "LOOSE_FRACTION"]


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class FixedGrid:
    """A grid planned once for a composition, held fixed while the parameters vary.

    Data fields may carry a leading batch axis (:func:`stack_grids`) for ``jax.vmap``.

    Attributes:
      mechanisms: per component, the mechanism at the planning point (numeric leaves of shape
        ``(G,)``); the template whose class and static fields later parameters must share.
      counts: per component, ``(G,)`` int64 composition counts.
      offsets: per component, ``(D, G)`` int64 grid offsets (first grid point ``offset * dx``)
        for each direction.
      lambdas: ``(D, L)`` Chernoff parameters of the wrap-around bounds.
      dx: ``()`` grid spacing.
      log_tau: ``()`` log of the tail level that places the window.
      directions: static tuple of :class:`~dpjax.pld.mechanisms.Direction`.
      n: static FFT length.
      ms: static ``[direction][component]`` single-mechanism support lengths.
    """

    mechanisms: tuple
    counts: tuple
    offsets: tuple
    lambdas: jax.Array
    dx: jax.Array
    log_tau: jax.Array
    directions: tuple = dataclasses.field(metadata=dict(static=True))
    n: int = dataclasses.field(metadata=dict(static=True))
    ms: tuple = dataclasses.field(metadata=dict(static=True))


def _is_mechanism(x) -> bool:
    return hasattr(x, "loss_cdfs") and dataclasses.is_dataclass(x)


def _components(components) -> list[tuple[Any, Any]]:
    """A mechanism, a ``(mechanism, count)`` pair, or a sequence of either."""
    if _is_mechanism(components):
        return [(components, 1)]
    if isinstance(components, tuple) and len(components) == 2 and _is_mechanism(components[0]) \
            and not _is_mechanism(components[1]):
        return [components]
    out = []
    for item in components:
        mech, count = (item if isinstance(item, tuple) else (item, 1))
        if not _is_mechanism(mech):
            raise ValueError(f"components must be mechanisms or (mechanism, count) pairs, got {item!r}")
        out.append((mech, count))
    if not out:
        raise ValueError("components must contain at least one mechanism")
    return out


def _as_stacked(mech, shape=None):
    """Numeric leaves as float64 arrays of shape ``shape`` (default: 1-D ``(G,)``)."""
    def leaf(a):
        a = jnp.asarray(a, jnp.float64)
        return jnp.broadcast_to(a, shape) if shape is not None else jnp.atleast_1d(a)
    leaves, tree = jax.tree_util.tree_flatten(mech)
    leaves = [leaf(a) for a in leaves]
    if shape is None:
        g = np.broadcast_shapes(*[a.shape for a in leaves]) if leaves else (1,)
        if len(g) != 1:
            raise ValueError(f"mechanism parameters must be scalars or 1-D arrays, got {mech!r}")
        leaves = [jnp.broadcast_to(a, g) for a in leaves]
    return jax.tree_util.tree_unflatten(tree, leaves)


@host_only("dpjax.pld.delta_fn / dpjax.pld.grid_epsilon_fn on a grid planned outside the transformation")
@float64
def plan_fixed_grid(components, *, target_delta=None, target_epsilon=None,
                    options: GridOptions | None = None) -> FixedGrid:
    """Plan a :class:`FixedGrid` for ``components`` (host side, concrete values).

    Args:
      components: a mechanism, a ``(mechanism, count)`` pair, or a sequence of them; numeric
        parameters scalars or 1-D arrays (a stacked group of one mechanism kind), counts
        positive integers (or 1-D arrays matching).  Their values are the planning point.
      target_delta: plan for ``epsilon`` queries at this delta (in (0, 1));
      target_epsilon: plan for ``delta`` queries at this epsilon (> 0).  At least one; with
        both (calibration: delta queries at ``target_epsilon`` compared with ``target_delta``)
        the grid is placed at ``target_epsilon`` and the tail budget is relative to
        ``target_delta``.
      options: grid accuracy (:class:`~dpjax.pld.GridOptions`; default ``GridOptions()``).

    The grid is shared by the directions (common ``n`` and ``dx``); both add/remove directions
    unless every mechanism is symmetric.  Valid (sound) for any later parameters; tight near
    the planning point.
    """
    options = GridOptions() if options is None else options
    if not isinstance(options, GridOptions):
        raise ValueError(f"options must be a dpjax.pld.GridOptions, got {options!r}")
    if target_delta is None and target_epsilon is None:
        raise ValueError("give target_delta or target_epsilon (or both)")
    privacy = _validate.PrivacyTarget(target_epsilon, target_delta)
    delta = None if privacy.delta is None else float(privacy.delta)
    eps = None if privacy.epsilon is None else float(privacy.epsilon)
    kw = dict(eps_hint=eps, target_delta=delta)
    # Truncation + wrap-around budget: a fraction of the delta that matters, else absolute.
    tail_mass = options.delta_tail_mass if delta is None else options.tail_fraction * delta
    groups = []
    for mech, count in _components(components):
        if hasattr(mech, "validate"):
            mech.validate()
        mech = _as_stacked(mech)
        g = jax.tree_util.tree_leaves(mech)[0].shape[0] if jax.tree_util.tree_leaves(mech) else 1
        cnt = np.atleast_1d(np.asarray(count))
        if cnt.ndim != 1 or cnt.shape[0] not in (1, g):
            raise ValueError(f"count must be a positive integer or a 1-D array of length {g}, got {count!r}")
        cnt = np.array([_validate.positive_int("count", c) for c in np.broadcast_to(cnt, (g,))], np.int64)
        groups.append(Group(mechanism=mech, counts=cnt, offsets=np.zeros(g, np.int64)))
    symmetric = all(getattr(type(g.mechanism), "symmetric", False) for g in groups)
    directions = (Direction.REMOVE,) if symmetric else DIRECTIONS
    plan = plan_grid(groups, directions, tail_mass=tail_mass, options=options, **kw)
    return FixedGrid(
        mechanisms=tuple(g.mechanism for g in groups),
        counts=tuple(jnp.asarray(g.counts, jnp.int64) for g in groups),
        offsets=tuple(jnp.asarray(np.stack([np.asarray(plan.groups[di][gi].offsets, np.int64)
                                            for di in range(len(directions))]))
                      for gi in range(len(groups))),
        lambdas=jnp.asarray(plan.lambdas, jnp.float64), dx=jnp.asarray(plan.dx, jnp.float64),
        log_tau=jnp.asarray(plan.log_tau, jnp.float64), directions=tuple(directions), n=int(plan.n),
        ms=tuple(tuple(int(m) for m in ms) for ms in plan.ms))


def stack_grids(grids: Sequence[FixedGrid]) -> FixedGrid:
    """Stack grids of one shape (same ``n``, directions, mechanism kinds and group sizes) along
    a new leading axis, for ``jax.vmap`` over configurations.  Support lengths are padded to
    the largest (a longer support only moves single-step mass from the ``+inf`` atom onto the
    grid: still sound, slightly tighter)."""
    grids = list(grids)
    first = grids[0]
    kinds = lambda g: [(type(m), _static(m)) for m in g.mechanisms]
    if any(g.n != first.n or g.directions != first.directions or kinds(g) != kinds(first)
           or jax.tree_util.tree_structure(g.mechanisms) != jax.tree_util.tree_structure(first.mechanisms)
           for g in grids):
        raise ValueError("grids must share n, directions and mechanism kinds to be stacked")
    ms = tuple(tuple(min(max(g.ms[di][ci] for g in grids), first.n) for ci in range(len(first.ms[di])))
               for di in range(len(first.directions)))
    grids = [dataclasses.replace(g, ms=ms) for g in grids]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *grids)


def _static(mech) -> tuple:
    """The static (meta) fields of a mechanism dataclass, as a comparable tuple."""
    return tuple((f.name, getattr(mech, f.name)) for f in dataclasses.fields(mech)
                 if f.metadata.get("static", False))


def _parameters(grid: FixedGrid, mechanisms):
    """The mechanisms to compose: ``grid.mechanisms`` or the given ones, leaves in the planned
    shapes (float64)."""
    if mechanisms is None:
        return grid.mechanisms
    if _is_mechanism(mechanisms):
        mechanisms = (mechanisms,)
    mechanisms = tuple(mechanisms)
    if len(mechanisms) != len(grid.mechanisms):
        raise ValueError(f"mechanisms must hold {len(grid.mechanisms)} mechanism(s), one per planned "
                         f"component, got {len(mechanisms)}")
    out = []
    for i, (mech, ref) in enumerate(zip(mechanisms, grid.mechanisms)):
        if type(mech) is not type(ref) or _static(mech) != _static(ref) \
                or jax.tree_util.tree_structure(mech) != jax.tree_util.tree_structure(ref):
            raise ValueError(f"mechanisms[{i}] must be a {type(ref).__name__} with the planned static "
                             f"fields, got {mech!r}")
        leaves = jax.tree_util.tree_leaves(ref)
        out.append(_as_stacked(mech, leaves[0].shape) if leaves else mech)
    return tuple(out)


def _counts(grid: FixedGrid, counts):
    if counts is None:
        return grid.counts
    counts = tuple(counts) if isinstance(counts, (tuple, list)) else (counts,)
    if len(counts) != len(grid.counts):
        raise ValueError(f"counts must hold {len(grid.counts)} entries, one per planned component")
    return tuple(jnp.broadcast_to(jnp.asarray(c, jnp.int64), jnp.shape(ref))
                 for c, ref in zip(counts, grid.counts))


def _composed(grid: FixedGrid, mechanisms=None, counts=None):
    """Per direction, the composed (pessimistic) PLD on ``grid``; and the counts."""
    mechs = _parameters(grid, mechanisms)
    cnts = _counts(grid, counts)
    out = []
    for di, d in enumerate(grid.directions):
        groups = tuple(Group(mechanism=m, counts=c, offsets=o[di]) for m, c, o in zip(mechs, cnts, grid.offsets))
        out.append(compose(groups, grid.dx, grid.lambdas[di], grid.log_tau, direction=d, ms=grid.ms[di],
                           n=grid.n, kinds=("up",)).up)
    return out, cnts


def _lumped_below(grid: FixedGrid, mechanisms, counts):
    """Per direction, ``sum_k c_k P_k(Y <= y_0,k)``: the single-step P-mass below each
    mechanism's first grid point, which the pessimistic discretization moves up onto it
    (:mod:`dpjax.pld.grid.discretize`).  Any event of that total probability changes delta by at most
    that much, so a grid planned elsewhere (where this mass is not negligible) can overstate
    delta by up to it."""
    mechs = _parameters(grid, mechanisms)
    cnts = _counts(grid, counts)
    out = []
    for di, d in enumerate(grid.directions):
        total = 0.0
        for m, c, o in zip(mechs, cnts, grid.offsets):
            y0 = jnp.asarray(o[di], jnp.float64) * grid.dx
            p_le = jax.vmap(lambda mech, y: mech.loss_cdfs(d, y[None]).p_le[0])(m, y0)
            total = total + jnp.sum(jnp.asarray(c, jnp.float64) * p_le)
        out.append(total)
    return out


@float64
def tables(grid: FixedGrid, mechanisms=None, *, counts=None) -> tuple[HockeyStickTable, ...]:
    """Per direction, the certified (upper) delta-curve table of the composition on ``grid``.

    ``mechanisms``: one mechanism per planned component (same class and static fields; numeric
    parameters may be traced), default the planning point; ``counts``: optional per-component
    counts (may be traced), default the planned ones.
    """
    comps, _ = _composed(grid, mechanisms, counts)
    return tuple(table(c, Bound.UPPER) for c in comps)


@float64(rounding="up")
def delta_fn(grid: FixedGrid, epsilon, mechanisms=None, *, counts=None) -> jax.Array:
    """Certified delta (upper bound; max over directions) at ``epsilon`` (any array shape).

    Pure, jittable, vmappable, differentiable in ``epsilon`` and the mechanism parameters.  An
    upper bound on the true delta for ANY parameters (see the module docstring).
    """
    eps = jnp.asarray(epsilon, jnp.float64)
    out = [delta_at(t, eps) for t in tables(grid, mechanisms, counts=counts)]
    return out[0] if len(out) == 1 else jnp.maximum(*out) if len(out) == 2 else jnp.max(jnp.stack(out), 0)


#: :func:`grid_epsilon_fn` flags (``EpsilonReport.loose``, and a :class:`LooseBoundWarning`) an answer
#: whose estimated excess over the bound of a grid planned at the same parameters is above this
#: fraction of epsilon (half of the 1% promised: the discretization term is an estimate).
LOOSE_FRACTION = 5e-3
#: Coefficient of the connect-the-dots discretization law ``0.3 C dx^2 / sigma_c`` the planner
#: sizes ``dx`` with (:mod:`dpjax.pld.grid.plan`).
_DISCRETIZATION_LAW = 0.3


class LooseBoundWarning(UserWarning):
    """An :func:`grid_epsilon_fn` answer is sound but looser than a grid planned at its parameters
    would give (the parameters left the range the fixed grid was planned for)."""


def epsilon_rounding(*, with_report: bool, **_):
    """The float32 rounding of a certified epsilon (:func:`dpjax._base.x64.float64`'s
    ``rounding``): up; in an :class:`EpsilonReport`, the epsilon up and its lower estimate down."""
    return {"epsilon": "up", "epsilon_lower_estimate": "down"} if with_report else "up"


class EpsilonReport(NamedTuple):
    """:func:`grid_epsilon_fn`'s answer with the terms of its bound (``with_report=True``).

    Fields (arrays of the target's shape; for add/remove adjacency, the direction that sets
    epsilon):

    * ``epsilon``: the certified epsilon (the value ``grid_epsilon_fn`` returns);
    * ``error_terms``: the mass added to delta for the grid's truncations:
      ``p_inf`` (single-step mass beyond the planned support, at loss ``+inf``) +
      ``tail_above`` (wrap-around bound) + ``roundoff`` (FFT round-off and frequency
      truncation allowance);
    * ``p_inf``, ``tail_above``, ``roundoff``: those terms;
    * ``lumped_below``: the single-step mass below the grid, moved up onto its first point
      (summed over the composition): it can raise delta by at most this much;
    * ``tail_below``: bound on the composed mass below the window, which wraps onto higher
      losses (sound for the upper bound, but it can raise delta by up to this much);
    * ``epsilon_lower_estimate``: epsilon of the same curve without the error terms, at
      ``target_delta + lumped_below + tail_below``: a grid planned at these parameters gives at least this
      (up to its own discretization);
    * ``discretization``: estimated discretization error of epsilon on this grid at these
      parameters (the planner's law ``0.3 C dx^2 / sigma_c``; an estimate, not a bound);
    * ``excess``: ``(epsilon - epsilon_lower_estimate + discretization) / epsilon``, the
      estimated relative excess over the bound of a grid planned here;
    * ``loose``: ``excess > LOOSE_FRACTION`` (or epsilon infinite): re-plan the grid at these
      parameters (:func:`plan_fixed_grid`, :func:`dpjax.calibration.dpsgd_grid`) for a tight
      bound.
    """

    epsilon: jax.Array
    loose: jax.Array
    excess: jax.Array
    error_terms: jax.Array
    p_inf: jax.Array
    tail_above: jax.Array
    roundoff: jax.Array
    lumped_below: jax.Array
    tail_below: jax.Array
    epsilon_lower_estimate: jax.Array
    discretization: jax.Array


def _direction_report(comp, delta, total, lumped):
    tab = table(comp, Bound.UPPER)
    eps = eps_at(tab, delta)
    # A grid planned here has (up to its discretization) a delta curve at least this curve
    # minus the added terms, the lumped mass and the mass that wrapped from below the window
    # onto higher losses (each can raise delta by at most its size): its epsilon is at least
    # this one.  (The table's A carries the added terms as a constant.)
    added = comp.p_inf + comp.tail_above + comp.roundoff
    bare = tab._replace(A=jax.lax.stop_gradient(tab.A - added))
    eps0 = eps_at(bare, delta + lumped + comp.tail_below)
    p = jnp.maximum(comp.pmf, 0.0)
    y = comp.losses
    mass = jnp.maximum(jnp.sum(p), 1e-300)
    mean = jnp.sum(p * y) / mass
    sigma_c = jnp.sqrt(jnp.maximum(jnp.sum(p * (y - mean) ** 2) / mass, 1e-30))
    disc = _DISCRETIZATION_LAW * total * comp.dx ** 2 / sigma_c
    return eps, eps0, disc, comp.p_inf, comp.tail_above, comp.roundoff, lumped, comp.tail_below


def _warn_loose(loose, excess):
    loose, excess = np.asarray(loose), np.asarray(excess)
    if loose.any():
        worst = float(np.max(np.where(loose, excess, 0.0)))
        warnings.warn(
            f"grid_epsilon_fn: the fixed grid was planned for other parameters; this epsilon is sound but an estimated "
            f"{'inf' if not np.isfinite(worst) else f'{100 * worst:.3g}%'} above the bound of a grid planned at "
            f"these parameters (with_report=True gives the terms; re-plan with plan_fixed_grid / "
            f"dpjax.calibration.dpsgd_grid at them)", LooseBoundWarning, stacklevel=2)


@float64(rounding=epsilon_rounding)
def grid_epsilon_fn(grid: FixedGrid, target_delta, mechanisms=None, *, counts=None, with_report: bool = False,
               warn: bool = True):
    """Certified epsilon (upper bound) at ``target_delta`` (any array shape), in closed form.

    ``min{eps >= 0 : delta_fn(eps) <= target_delta}`` = the max over directions of
    :func:`~dpjax.pld.grid.convert.eps_at`; ``inf`` when the grid cannot certify ``target_delta``
    (the ``+inf`` atom plus wrap-around and round-off allowances exceed it).  Differentiable in
    the mechanism parameters and ``target_delta`` through the table (exact on the segment).

    **No silent looseness.**  The value is sound for any parameters, but a grid is tight only
    near where it was planned (below a planned noise multiplier the single-step support
    outgrows the grid and its mass goes to the ``+inf`` atom: planned at sigma 1, read at 0.8,
    DP-SGD's epsilon came out twice the accountant's).  Every call estimates its excess over a
    grid planned at the given parameters (:class:`EpsilonReport`); above
    :data:`LOOSE_FRACTION` (0.5%) it warns with a :class:`LooseBoundWarning` (eagerly and under
    ``jit``/``vmap``/``grad``, through ``jax.debug.callback``; ``warn=False`` silences it), and
    ``with_report=True`` returns the :class:`EpsilonReport` (its ``loose`` flag, the error
    terms, the estimate) instead of the bare epsilon.
    """
    delta = jnp.asarray(target_delta, jnp.float64)
    comps, cnts = _composed(grid, mechanisms, counts)
    total = sum(jnp.sum(jnp.asarray(c, jnp.float64)) for c in cnts)
    lumped = _lumped_below(grid, mechanisms, counts)
    per = [_direction_report(c, delta, total, jax.lax.stop_gradient(lb)) for c, lb in zip(comps, lumped)]
    eps_d = jnp.stack([r[0] for r in per])
    active = jnp.argmax(eps_d, axis=0)
    pick = lambda k: jnp.take_along_axis(jnp.stack([jnp.broadcast_to(r[k], eps_d.shape[1:]) for r in per]),
                                         active[None], axis=0)[0]
    eps = jnp.max(eps_d, axis=0)
    eps0, disc = pick(1), pick(2)
    p_inf, tail, roundoff, below, wrapped = pick(3), pick(4), pick(5), pick(6), pick(7)
    excess = jax.lax.stop_gradient(jnp.where(eps > 0, (eps - eps0 + disc) / jnp.where(eps > 0, eps, 1.0), 0.0))
    excess = jnp.where(jnp.isinf(eps), jnp.inf, excess)
    loose = excess > LOOSE_FRACTION
    if warn:
        jax.debug.callback(_warn_loose, loose, excess)
    if not with_report:
        return eps
    sg = jax.lax.stop_gradient
    return EpsilonReport(epsilon=eps, loose=loose, excess=excess, error_terms=sg(p_inf + tail + roundoff),
                         p_inf=sg(p_inf), tail_above=sg(tail), roundoff=sg(roundoff), lumped_below=sg(below),
                         tail_below=sg(wrapped),
                         epsilon_lower_estimate=sg(eps0), discretization=sg(disc))
