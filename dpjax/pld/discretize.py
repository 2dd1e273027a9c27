"""Grid PMFs: a mechanism's privacy-loss distribution placed on ``y_j = (offset + j) * dx``.

Two discretizations of the same bin masses (bins ``(y_j, y_{j+1}]``, right-continuous so atoms
at a grid point belong to the bin below it):

* **pessimistic** ("up", a dominating pair; Doroshenko et al. 2022, "connect the dots"): a bin
  with P-mass ``p`` and Q-mass ``q`` (so ``q/p`` lies in ``[e^{-y_{j+1}}, e^{-y_j}]``) becomes
  two atoms, ``a`` at ``y_j`` and ``b`` at ``y_{j+1}``, with ``a + b = p`` and
  ``a e^{-y_j} + b e^{-y_{j+1}} = q``.  Merging the two atoms again is post-processing, so the
  split pair dominates the bin and compositions of split PLDs give upper bounds on every
  hockey-stick divergence.  Unlike rounding every loss up (bias ``dx/2`` per step, ``T dx/2``
  after T steps) the split only spreads mass: its error is ``O(dx^2)`` per step.  P-mass below
  ``y_0`` goes to ``y_0`` (with the Q-excess on a Q-only atom at ``-inf``, which never enters
  delta); P-mass above the last point goes to the ``+inf`` atom (counted fully in delta).  Both
  steps are again splits of a merged atom, hence dominating.
* **optimistic** ("down", a dominated pair, then rounding down): bin ``j``'s merged atom (loss
  ``l_j = log(p/q)`` in ``(y_j, y_{j+1}]``; merging is post-processing, hence dominated) is
  matched with its neighbours: a fraction ``u_j`` of atom ``j`` (below ``y_{j+1}``, deficit
  ``D_j = e^{y_{j+1}} q_j - p_j``) and a fraction ``v_{j+1}`` of atom ``j+1`` (above it, excess
  ``E_{j+1} = p_{j+1} - e^{y_{j+1}} q_{j+1}``) with ``u_j D_j = v_{j+1} E_{j+1}`` merge into one
  atom of loss exactly ``y_{j+1}`` (post-processing again).  Whatever is left of each atom is
  rounded down to ``y_j``: the rounded loss is pointwise <= the dominated pair's loss under the
  obvious coupling and ``delta(eps) = E_P[(1 - e^{eps - Y})_+] + P(Y = inf)`` is monotone in
  ``Y``, so compositions give lower bounds.  Matching runs a few parallel rounds (each atom
  offers shares up and down, capped by what the partner can take); on smooth PLDs almost all
  mass is matched and the bias is ``O(dx^2)`` per step instead of the ``~dx/2`` of rounding
  every loss down (B1: bracket width 8e-6 relative instead of 3.5%).  P-mass below ``y_0`` is
  dropped (loss ``-inf``), P-mass above the last point is put at that point.

Bin masses are differences of whichever of ``P(Y <= y)`` / ``P(Y > y)`` is below 1/2, so tails
keep their relative accuracy.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

FLUSH = 1e-290


# Rounds of neighbour matching in the optimistic discretization (each round matches what the
# previous ones left; 3 rounds close most of the gap on peaked single-step PLDs).
_MATCH_ROUNDS = 3


class GridPMF(NamedTuple):
    """One mechanism on the grid ``y_j = (offset + j) * dx``, ``j = 0..m-1``.

    Attributes:
      pmf_up: (m,) pessimistic (dominating, connect-the-dots) P-masses.
      p_inf_up: () P-mass on the ``+inf`` loss atom of the pessimistic PMF.
      pmf_down: (m,) optimistic (rounded-down) P-masses; the rest of the mass is at ``-inf``.
    """

    pmf_up: jax.Array
    p_inf_up: jax.Array
    pmf_down: jax.Array


def _bin_masses(le, gt):
    """Masses of bins ``(y_j, y_{j+1}]`` from CDF and survival values at the grid points."""
    use_le = le[1:] <= 0.5
    m = jnp.where(use_le, le[1:] - le[:-1], gt[:-1] - gt[1:])
    return jnp.maximum(m, 0.0)


def materialize_once(fn, ok):
    """``fn()`` computed once into buffers (``NaN`` where ``ok`` is False: never for a valid grid).

    Without a buffer XLA fuses (duplicates) the erfc expansions of the CDFs into every consumer
    (``le[1:]``, ``le[:-1]``, the split, ...): ~10x the run time and a larger program to compile.
    ``jax.lax.optimization_barrier`` does not prevent this on CPU (the barrier is expanded away
    before fusion); the output of a ``lax.cond`` is always materialized.  The other branch makes
    every result NaN, which the accountant turns into ``epsilon = inf`` (sound).
    """
    return jax.lax.cond(ok, fn, lambda: jax.tree_util.tree_map(
        lambda v: jnp.full(v.shape, jnp.nan, v.dtype), jax.eval_shape(fn)))


def discretize(mechanism, direction: str, offset, dx, m: int) -> GridPMF:
    """Place ``mechanism``'s privacy loss (``direction``) on ``m`` grid points.

    Args:
      mechanism: a mechanism pytree (see :mod:`dpjax.pld.mechanisms`), unstacked.
      direction: "remove" or "add" (static).
      offset: integer (traced ok): the first grid point is ``offset * dx``.
      dx: grid spacing (traced ok).
      m: number of grid points (static).
    Returns:
      :class:`GridPMF`; masses are smooth functions of the mechanism parameters (the grid is
      fixed), so ``jax.grad`` flows through them.
    """
    y = (offset + jnp.arange(m)) * dx
    return grid_pmf(grid_cdfs(mechanism, direction, offset, dx, m), y, dx)


def grid_cdfs(mechanism, direction: str, offset, dx, m: int):
    """The mechanism-specific half of :func:`discretize`: its :class:`LossCDFs` at the ``m`` grid
    points ``(offset + j) dx``, materialized (see ``materialize_once``)."""
    y = (offset + jnp.arange(m)) * dx
    return materialize_once(lambda: mechanism.loss_cdfs(direction, y), jnp.asarray(dx) > 0)


def grid_pmf(c, y, dx) -> GridPMF:
    """The generic half of :func:`discretize`: grid PMFs from the CDFs ``c`` at the grid ``y``
    (1-D, spacing ``dx``).  Pure array code on any mechanism and direction, so it can be vmapped
    over a batch of directions."""
    m = y.shape[-1]
    # Flush values below 1e-290 to 0: denormal arithmetic is ~100x slower on x86 and made the
    # far tails dominate the run time.  The P-mass this can remove (< 2 m 1e-290) is put on the
    # +inf atom below, so the pessimistic PMF stays an upper bound.
    c = type(c)(*(jnp.where(v < FLUSH, 0.0, v) for v in c))
    p_bin = _bin_masses(c.p_le, c.p_gt)
    q_bin = _bin_masses(c.q_le, c.q_gt)
    # Split bin j: a at y_j, b at y_{j+1};  a = (q e^{y_{j+1}} - p) / (e^{dx} - 1).
    # The exponent is capped: above ~700 the Q-mass is 0 in float64 anyway and a clips to 0.
    a = (q_bin * jnp.exp(jnp.minimum(y[1:], 700.0)) - p_bin) / jnp.expm1(dx)
    a = jnp.clip(a, 0.0, p_bin)
    b = p_bin - a
    # pmf_up[j] = a_j + b_{j-1} (+ the P-mass below y_0 at j = 0), assembled with in-place
    # updates: the same sums as padding a and b, but XLA:CPU vectorizes these ~1.6x better.
    pmf_up = jnp.zeros(m).at[:-1].set(a).at[1:].add(b).at[0].add(c.p_le[0])
    # Optimistic: a dominated pair on the grid, then rounding down (see module docstring).
    # Bin j's exact atom (loss l_j in (y_j, y_{j+1}]) has deficit D_j = e^{y_{j+1}} q_j - p_j
    # = a_j (e^dx - 1) >= 0 below y_{j+1}; bin j+1's atom has excess E_{j+1} = p_{j+1} -
    # e^{y_{j+1}} q_{j+1} = b_{j+1} (1 - e^{-dx}) >= 0 above it.  Fractions u_j of atom j and
    # v_{j+1} of atom j+1 with u_j D_j = v_{j+1} E_{j+1} merge into one atom of loss exactly
    # y_{j+1} (post-processing: dominated).  Taking u_j = min(1, E_{j+1}/D_j) / 2 (so
    # v_{j+1} <= 1/2 and u_j + v_j <= 1) the rest of each atom is rounded down to y_j
    # (coupling).  For a smooth density u ~ 1/2 and the bias is O(dx^2) per step instead of
    # the O(dx) of rounding every loss down.
    D = a * jnp.expm1(dx)                     # deficit of atom j below y_{j+1}
    E = b * -jnp.expm1(-dx)                   # excess of atom j above y_j
    tiny = 1e-300
    f = jnp.ones_like(D)                      # fraction of each atom not yet matched
    u = jnp.zeros_like(D)                     # fraction moved up (merged at y_{j+1})
    for _ in range(_MATCH_ROUNDS):
        Dr, Er = f * D, f * E
        # Shares: atom j offers up to s_j of its free part upwards and r_j downwards (s_j + r_j
        # <= 1), each capped by what the partner can absorb, scaled down together if they overlap.
        s_up = jnp.minimum(1.0, jnp.pad(Er[1:], (0, 1)) / jnp.maximum(Dr, tiny))
        r_dn = jnp.minimum(1.0, jnp.pad(Dr[:-1], (1, 0)) / jnp.maximum(Er, tiny))
        over = jnp.maximum(s_up + r_dn, 1.0)
        s_up, r_dn = s_up / over, r_dn / over
        # Matched amount at y_{j+1} (excess units): fraction t/D_j of atom j, t/E_{j+1} of j+1.
        t = jnp.minimum(s_up[:-1] * Dr[:-1], r_dn[1:] * Er[1:])
        up = jnp.where(D[:-1] > tiny, t / jnp.maximum(D[:-1], tiny), 0.0)
        dn = jnp.where(E[1:] > tiny, t / jnp.maximum(E[1:], tiny), 0.0)
        u = u + jnp.pad(up, (0, 1))
        f = jnp.maximum(f - jnp.pad(up, (0, 1)) - jnp.pad(dn, (1, 0)), 0.0)
    u = jnp.clip(u, 0.0, 1.0)
    pmf_down = jnp.zeros(m).at[:-1].set(p_bin * (1.0 - u)).at[1:].add(p_bin * u).at[-1].add(c.p_gt[-1])
    return GridPMF(pmf_up=pmf_up, p_inf_up=c.p_gt[-1] + 2 * m * FLUSH, pmf_down=pmf_down)
