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
from dpjax._base import lazy_module as _lazy_module

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")




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


def materialize_once(fn, ok):
    """``fn()`` computed once into buffers (:func:`dpjax._base.ops` JAX ``materialize``; NaN where
    ``ok`` is False)."""
    from dpjax._base.ops import jax_ops

    return jax_ops().materialize(fn, ok)


def discretize(mechanism, direction: str, offset, dx, m: int) -> GridPMF:
    """Place ``mechanism``'s privacy loss (``direction``) on ``m`` grid points.

    Args:
      mechanism: a mechanism pytree (see :mod:`dpjax.pld.mechanisms`), unstacked.
      direction: "remove" or "add" (static).
      offset: integer (traced ok): the first grid point is ``offset * dx``.
      dx: grid spacing (traced ok).
      m: number of grid points (static).
    Returns:
      :class:`GridPMF` (the discretization of the PLD program, :mod:`dpjax.pld.grid.program`); masses
      are smooth functions of the mechanism parameters (the grid is fixed), so ``jax.grad``
      flows through them.
    """
    from dpjax._base.ops import jax_ops
    from dpjax.pld.grid import program as prog

    rows, y, p_inf = prog._discretize(jax_ops(), mechanism, (direction,), jnp.reshape(jnp.asarray(offset), (1,)),
                                      jnp.asarray(dx, jnp.float64), m, ("up", "down"))
    return GridPMF(pmf_up=rows[0], p_inf_up=p_inf[0], pmf_down=rows[1])
