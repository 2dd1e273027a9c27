"""FFT privacy-loss-distribution (PLD) accounting: sound, tight, jitted.

Layers (one module each; docs/design.md §1-2, Koskela & Honkela 2021):

* :mod:`~dpjax.pld.mechanisms` -- mechanisms as privacy-loss distributions (pytree dataclasses:
  :class:`Gaussian`, :class:`PoissonSubsampledGaussian`, :class:`Laplace`,
  :class:`RandomizedResponse`; the interface new mechanisms implement is documented there).
* :mod:`~dpjax.pld.grid.discretize` -- grid PMFs: pessimistic connect-the-dots split (dominating
  pair, ``O(dx^2)`` error per step) and optimistic round-down.
* :mod:`~dpjax.pld.grid.compose` -- FFT composition (self-composition and heterogeneous lists), with
  the wrap-around mass bounded by Chernoff bounds on the discretized log-MGF.
* :mod:`~dpjax.pld.grid.convert` -- ``delta(eps)`` / ``eps(delta)``, exact on each grid segment,
  vectorized over targets.
* :mod:`~dpjax.pld.grid.plan` -- grid choice from the requested accuracy (host side).
* :mod:`~dpjax.pld.grid.fixed_grid` -- a grid planned once, then jittable, differentiable
  ``delta_fn`` / ``grid_epsilon_fn`` in the mechanism parameters.
* :mod:`~dpjax.pld.accountant` -- the public entry points for any mechanisms
  (:func:`epsilon`, :func:`delta`); :mod:`~dpjax.pld.dpsgd` -- DP-SGD (:func:`dpsgd_accounting`,
  :func:`dpsgd_epsilon`, :func:`dpsgd_delta`: Poisson sampling here, random allocation and
  balls-in-bins routed to :mod:`~dpjax.pld.allocation.dpsgd`).
* :mod:`~dpjax.pld.sweeps.driver` -- many configurations in a handful of compiled programs
  (:func:`sweep`, buckets chosen by cost (:class:`BucketPolicy`), sharded over every device;
  :mod:`~dpjax.pld.sweeps.store` writes and resumes).
* :mod:`~dpjax.pld.grid.program` -- the PLD program every path runs (discretize, compose, window,
  convert; NumPy on the host, compiled JAX for sweeps and traced parameters).
* :mod:`~dpjax.pld.curve` -- epsilon after every ``T`` of a list from one transform
  (:func:`epsilon_curve`).

Quick use::

    >>> import dpjax
    >>> dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)                       # doctest: +SKIP
    1.8282...
    >>> from dpjax import pld
    >>> res = pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-5)  # doctest: +SKIP
    >>> res.epsilon_lower, res.epsilon_upper                              # doctest: +SKIP
    >>> comps = [(pld.Gaussian(10.0), 100), (pld.RandomizedResponse(0.96, 2), 100)]
    >>> pld.epsilon(comps, target_delta=1e-5).epsilon                    # doctest: +SKIP
    >>> pld.delta([(pld.Laplace(10.0), 100)], target_epsilon=[1.0, 2.0]).delta  # doctest: +SKIP

Many configurations: array arguments of :func:`dpsgd_epsilon` / :func:`dpsgd_delta` give one
answer per element (``dpsgd_epsilon(numpy.linspace(0.8, 2.0, 64), 0.01, 1000, 1e-5)``), each
equal to its own call; they also work under ``jax.grad`` / ``jax.vmap`` / ``jax.jit``.

Noise schedules: ``noise_schedule=``, e.g.
``pld.dpsgd_accounting(None, 0.01, T, target_delta=1e-5, noise_schedule=numpy.linspace(3.0, 2.5, T))``
(or general mechanisms with array parameters, ``pld.epsilon``); more than
``GridOptions.max_distinct`` distinct values are bracketed by blocks (``result.blocked``), except
schedules of Gaussians (``Gaussian``, or ``PoissonSubsampledGaussian`` with every ``q = 1``),
which compose exactly as one Gaussian and are merged into it (no bracket).

A jittable, differentiable ``delta(eps; params)`` / ``eps(delta; params)`` on a FIXED grid
----------------------------------------------------------------------------------------
:mod:`~dpjax.pld.grid.fixed_grid` (for calibration, sweeps, optimization loops): plan the grid once
on the host for any mechanisms with counts, then evaluate inside your own ``jit`` / ``grad`` /
``vmap`` with the mechanism parameters traced.  The result is a certified upper bound for
*any* parameters (mass leaving the grid goes to the ``+inf`` atom or is covered by the
wrap-around bound); it is tight near the planning point.  ``grid_epsilon_fn`` is closed-form per
grid segment (no search)::

    import jax, jax.numpy as jnp
    from dpjax import pld

    grid = pld.plan_fixed_grid([(pld.PoissonSubsampledGaussian(1.0, 0.01), 1000)],
                               target_delta=1e-5)                     # host side, once
    mech = lambda s, q: [pld.PoissonSubsampledGaussian(s, q)]
    pld.grid_epsilon_fn(grid, 1e-5, mech(1.0, 0.01))                        # certified eps
    jax.grad(lambda s, q: pld.delta_fn(grid, 2.0, mech(s, q)), argnums=(0, 1))(1.0, 0.01)
    jax.vmap(lambda s: pld.grid_epsilon_fn(grid, 1e-5, mech(s, 0.01)))(jnp.linspace(0.9, 1.2, 8))

These run from float32 code (float64 inside); under a user's ``jax.jit`` trace with
``jax.enable_x64(True)``.  :mod:`dpjax.calibration.pld` specialises this to DP-SGD
(``dpsgd_grid``, ``dpsgd_delta_fn``, ``dpsgd_epsilon_fn``, noise calibration).  The lower layers
(:func:`compose` returning a :class:`Composition`, :func:`table`, :func:`delta_at`,
:func:`eps_at`) stay available; directions and bounds are the string enums :class:`Direction`
and :class:`Bound`.
"""

# Lazy exports (PEP 562, dpjax._base.lazy_exports): a DP-SGD query loads the accountant's
# modules only, not the sweeps, curves or fixed grids.
from typing import TYPE_CHECKING

from dpjax._base import lazy_exports as _lazy_exports

_ATTRS = {
    **dict.fromkeys(("delta", "epsilon"), "dpjax.pld.accountant"),
    **dict.fromkeys(("DeltaResult", "DirectionReport", "EpsilonResult"), "dpjax.pld.records"),
    **dict.fromkeys(("dpsgd_accounting", "dpsgd_delta", "dpsgd_epsilon"), "dpjax.pld.dpsgd"),
    **dict.fromkeys(("ComposedPLD", "Composition", "Group", "compose"), "dpjax.pld.grid.compose"),
    **dict.fromkeys(("Bound", "HockeyStickTable", "delta_at", "eps_at", "table"), "dpjax.pld.grid.convert"),
    **dict.fromkeys(("GridPMF", "discretize"), "dpjax.pld.grid.discretize"),
    **dict.fromkeys(("gaussian_delta", "gaussian_epsilon", "gaussian_log_delta"), "dpjax.numerics.exact"),
    **dict.fromkeys(("FixedGrid", "delta_fn", "grid_epsilon_fn", "plan_fixed_grid", "stack_grids"),
                    "dpjax.pld.grid.fixed_grid"),
    **dict.fromkeys(("DIRECTIONS", "Direction", "Gaussian", "Laplace", "LossCDFs", "Mechanism",
                     "PoissonSubsampledGaussian", "RandomizedResponse"), "dpjax.pld.mechanisms"),
    **dict.fromkeys(("GridOptions", "GridPlan", "plan_grid"), "dpjax.pld.grid.plan"),
    **dict.fromkeys(("BucketPolicy", "SweepConfig", "SweepExecution", "SweepTable", "sweep", "sweep_grid"),
                   "dpjax.pld.sweeps.driver"),
    **dict.fromkeys(("EpsilonCurve", "epsilon_curve"), "dpjax.pld.curve"),
}
_SUBMODULES = ("accountant", "allocation", "curve", "dpsgd", "fallback", "grid", "group_spec", "mechanisms", "mog",
               "records", "sweeps")

if TYPE_CHECKING:  # the same names for static analysis (type checkers, the API reference)
    from dpjax.pld.accountant import delta, epsilon
    from dpjax.pld.records import DeltaResult, DirectionReport, EpsilonResult
    from dpjax.pld.dpsgd import dpsgd_accounting, dpsgd_delta, dpsgd_epsilon
    from dpjax.pld.grid.compose import ComposedPLD, Composition, Group, compose
    from dpjax.pld.grid.convert import Bound, HockeyStickTable, delta_at, eps_at, table
    from dpjax.pld.grid.discretize import GridPMF, discretize
    from dpjax.numerics.exact import gaussian_delta, gaussian_epsilon, gaussian_log_delta
    from dpjax.pld.grid.fixed_grid import FixedGrid, delta_fn, grid_epsilon_fn, plan_fixed_grid, stack_grids
    from dpjax.pld.mechanisms import (
        DIRECTIONS, Direction, Gaussian, Laplace, LossCDFs, Mechanism, PoissonSubsampledGaussian, RandomizedResponse,
    )
    from dpjax.pld.grid.plan import GridOptions, GridPlan, plan_grid
    from dpjax.pld.sweeps.driver import BucketPolicy, SweepConfig, SweepExecution, SweepTable, sweep, sweep_grid
    from dpjax.pld.curve import EpsilonCurve, epsilon_curve

__all__ = [
    "Bound", "ComposedPLD", "Composition", "DIRECTIONS", "DeltaResult", "Direction", "DirectionReport",
    "EpsilonResult", "FixedGrid", "Gaussian", "GridOptions", "GridPMF", "GridPlan", "Group",
    "HockeyStickTable", "Laplace", "LossCDFs", "Mechanism", "PoissonSubsampledGaussian", "RandomizedResponse",
    "compose", "delta", "delta_at", "delta_fn", "discretize", "dpsgd_accounting", "dpsgd_delta",
    "dpsgd_epsilon", "epsilon", "grid_epsilon_fn", "eps_at", "plan_fixed_grid", "plan_grid", "stack_grids",
    "table",
    "gaussian_delta", "gaussian_epsilon", "gaussian_log_delta",
    "BucketPolicy", "SweepConfig", "SweepExecution", "SweepTable", "sweep", "sweep_grid", "EpsilonCurve", "epsilon_curve",
]

__getattr__, __dir__ = _lazy_exports("dpjax.pld", _ATTRS, _SUBMODULES)
