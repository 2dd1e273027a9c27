"""FFT privacy-loss-distribution (PLD) accounting: sound, tight, jitted.

Layers (one module each; DESIGN.md §1-2, seed 003):

* :mod:`~dpjax.pld.mechanisms` -- mechanisms as privacy-loss distributions (pytree dataclasses:
  :class:`Gaussian`, :class:`PoissonSubsampledGaussian`, :class:`Laplace`,
  :class:`RandomizedResponse`; the interface new mechanisms implement is documented there).
* :mod:`~dpjax.pld.discretize` -- grid PMFs: pessimistic connect-the-dots split (dominating
  pair, ``O(dx^2)`` error per step) and optimistic round-down.
* :mod:`~dpjax.pld.compose` -- FFT composition (self-composition and heterogeneous lists), with
  the wrap-around mass bounded by Chernoff bounds on the discretized log-MGF.
* :mod:`~dpjax.pld.convert` -- ``delta(eps)`` / ``eps(delta)``, exact on each grid segment,
  vectorized over targets.
* :mod:`~dpjax.pld.plan` -- grid choice from the requested accuracy (host side).
* :mod:`~dpjax.pld.accountant` -- the public entry points.

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

Noise schedules: give array parameters, e.g.
``pld.dpsgd_accounting(numpy.linspace(3.0, 2.5, T), 0.01, T, target_delta=1e-5)``; more than
``GridOptions.max_distinct`` distinct values are bracketed by blocks (``result.blocked``).

A jittable, differentiable ``delta(eps; params)`` on a FIXED grid (for calibration, sweeps)
------------------------------------------------------------------------------------------
Plan the grid once on the host, then compose and convert inside your own ``jit`` / ``grad`` /
``vmap``; the grid (``n``, ``dx``, offsets, support lengths) stays fixed while the mechanism
parameters are traced.  The result is a certified upper bound for *any* parameters (mass
leaving the grid goes to the ``+inf`` atom or is covered by the wrap-around bound); it is tight
near the planning point::

    import jax, jax.numpy as jnp, numpy as np
    from dpjax import pld

    with jax.enable_x64(True):
        mech = pld.PoissonSubsampledGaussian(jnp.asarray([1.0]), jnp.asarray([0.01]))
        group = pld.Group(mech, counts=np.array([1000]), offsets=np.zeros(1, np.int64))
        plan = pld.plan_grid([group], ("remove", "add"), tail_mass=1e-11, eps_hint=None,
                             target_delta=1e-5, options=pld.GridOptions())

        def delta_fn(eps, sigma, q):          # scalars in, scalar out
            out = []
            for di, d in enumerate(plan.directions):
                g = plan.groups[di][0]
                m = pld.PoissonSubsampledGaussian(jnp.reshape(sigma, (1,)), jnp.reshape(q, (1,)))
                comp = pld.compose((pld.Group(m, g.counts, g.offsets),), plan.dx, plan.lambdas[di],
                                   plan.log_tau, direction=d, ms=plan.ms[di], n=plan.n)["up"]
                out.append(pld.delta_at(pld.table(comp, "upper"), eps))
            return jnp.maximum(*out)

        jax.grad(delta_fn, argnums=(0, 1, 2))(2.0, 1.0, 0.01)
        jax.vmap(delta_fn, in_axes=(None, 0, None))(2.0, jnp.linspace(0.9, 1.2, 8), 0.01)

:mod:`dpjax.calibration.pld` packages exactly this for DP-SGD (``dpsgd_grid``,
``dpsgd_delta_fn``, ``epsilon_fn``).  ``pld.eps_at(table, delta)`` gives ``eps(delta)`` in
closed form per segment (differentiable in the parameters through the table).
"""

from dpjax.pld.accountant import (
    DeltaResult, DirectionReport, EpsilonResult, delta, dpsgd_accounting, dpsgd_delta, dpsgd_epsilon, epsilon,
)
from dpjax.pld.compose import ComposedPLD, Group, compose
from dpjax.pld.convert import HockeyStickTable, delta_at, eps_at, table
from dpjax.pld.discretize import GridPMF, discretize
from dpjax.pld.exact import gaussian_delta, gaussian_epsilon, gaussian_log_delta
from dpjax.pld.mechanisms import (
    DIRECTIONS, Gaussian, Laplace, LossCDFs, PoissonSubsampledGaussian, RandomizedResponse,
)
from dpjax.pld.plan import GridOptions, GridPlan, plan_grid

__all__ = [
    "ComposedPLD", "DIRECTIONS", "DeltaResult", "DirectionReport", "EpsilonResult", "Gaussian", "GridOptions",
    "GridPMF", "GridPlan", "Group", "HockeyStickTable", "Laplace", "LossCDFs", "PoissonSubsampledGaussian",
    "RandomizedResponse", "compose", "delta", "delta_at", "discretize", "dpsgd_accounting", "dpsgd_delta",
    "dpsgd_epsilon", "epsilon", "eps_at", "plan_grid", "table",
    "gaussian_delta", "gaussian_epsilon", "gaussian_log_delta",
]
