"""Conversions of a composed PLD to (epsilon, delta) (docs/design.md §1, §2.3).

``delta(eps) = sum_t pmf_t (1 - e^{eps - y_t})_+ + P(Y = inf)`` is convex and decreasing in
``eps``.  On a grid segment ``eps in [y_j, y_{j+1}]`` it is exactly

    delta(eps) = A_j - e^{eps - y_ref} B_j,   A_j = sum_{t > j} pmf_t + const,
                                              B_j = sum_{t > j} pmf_t e^{y_ref - y_t},

so ``delta(eps)`` costs one segment lookup and ``eps(delta)`` is solved in closed form inside the
bracketing segment (``eps = y_ref + log((A_j - delta) / B_j)``), vectorized over any number of
targets and differentiable in the PMF (hence in the mechanism parameters) and in ``eps``.
``y_ref`` is the window centre; the planner keeps the window narrower than 1300 so no exponent
overflows.

Upper bound: ``const = p_inf + tail_above + roundoff`` (mass that may have wrapped from above
counts fully) and the sums inflated by the relative round-off allowance (``A`` up, ``B`` down).
Lower bound: ``const = p_inf - tail_below - roundoff`` and the opposite factors, clipped at 0.
"""

from __future__ import annotations

from typing import NamedTuple

from dpjax._base import lazy_module as _lazy_module
from dpjax._base.ops import jax_ops
from dpjax._base.x64 import float64
from dpjax.pld.grid.compose import ComposedPLD
from dpjax._base.enums import StrEnum

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")


class Bound(StrEnum):
    """Which delta curve: the certified ``UPPER`` bound or the certified ``LOWER`` bound
    (``Bound.UPPER == "upper"``)."""

    UPPER = "upper"
    LOWER = "lower"


class HockeyStickTable(NamedTuple):
    """Segment coefficients: ``A``, ``B`` of shape (n+1,) for segments ``j = -1..n-1``."""

    A: jax.Array
    B: jax.Array
    y: jax.Array       # (n,) grid losses
    y_ref: jax.Array   # ()


def suffix_sums(x):
    """``s_j = sum_{t >= j} x_t`` of a 1-D array: the blocked suffix sums of :mod:`dpjax._base.ops`
    (every ``s_j`` sums only terms ``t >= j``, so small tails keep their relative accuracy; for
    non-negative terms the rounding error is at most ``(64 + depth) u s_j``)."""
    return jax_ops().suffix_sum(x)


def curve_terms(pld: ComposedPLD, bound: str):
    """``(r, y, w, y_ref, const, fa, fb)`` of the ``"upper"`` or ``"lower"`` delta curve:
    ``delta(eps) = fa sum_{t > j} r_t + const - e^{eps - y_ref} fb sum_{t > j} w_t`` on segment
    ``j``, with ``w_t = r_t e^{y_ref - y_t}`` (see the module docstring)."""
    bound = Bound.parse(bound)
    r = pld.pmf
    n = r.shape[-1]
    y = pld.losses
    y_ref = (pld.w_lo + n // 2) * pld.dx
    if bound is Bound.UPPER:
        const = pld.p_inf + pld.tail_above + pld.roundoff
        fa, fb = 1.0 + pld.roundoff_rel, 1.0 - pld.roundoff_rel
    else:
        const = pld.p_inf - pld.tail_below - pld.roundoff
        fa, fb = 1.0 - pld.roundoff_rel, 1.0 + pld.roundoff_rel
    return r, y, r * jnp.exp(y_ref - y), y_ref, const, fa, fb


@float64
def table(pld: ComposedPLD, bound: Bound | str = Bound.UPPER) -> HockeyStickTable:
    """Build the segment table for the upper or lower delta curve (:class:`Bound`)."""
    bound = Bound.parse(bound)
    r, y, w, y_ref, const, fa, fb = curve_terms(pld, bound)
    # Suffix sums over t > j, accumulated from the top (small terms first).
    sa = suffix_sums(r)
    sb = suffix_sums(w)
    zero = jnp.zeros((1,))
    A = jnp.concatenate([sa, zero]) * fa + const     # index j+1 <-> segment j (j = -1..n-1)
    B = jnp.concatenate([sb, zero]) * fb
    # Never let a NaN through: for the upper curve it becomes delta = 1 / eps = inf, for the
    # lower curve delta = 0 / eps = 0 (both trivially valid).
    bad = jnp.isnan(A) | jnp.isnan(B)
    A = jnp.where(bad, jnp.inf if bound is Bound.UPPER else -jnp.inf, A)
    B = jnp.where(bad, 0.0, B)
    return HockeyStickTable(A=A, B=B, y=y, y_ref=y_ref)


@float64(rounding="up")
def delta_at(tab: HockeyStickTable, eps) -> jax.Array:
    """``delta(eps)`` for any array of ``eps`` (clipped to [0, 1])."""
    eps = jnp.asarray(eps, jnp.float64)
    y = tab.y
    n = y.shape[0]
    dx = y[1] - y[0]
    j = jnp.clip(jnp.floor((eps - y[0]) / dx).astype(jnp.int64), -1, n - 1)
    A = tab.A[j + 1]
    B = tab.B[j + 1]
    d = A - jnp.exp(jnp.minimum(eps - tab.y_ref, 700.0)) * B
    return jnp.clip(d, 0.0, 1.0)


@float64(rounding="up")
def eps_at(tab: HockeyStickTable, delta) -> jax.Array:
    """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` (``inf`` if none), any array shape."""
    delta = jnp.asarray(delta, jnp.float64)
    y = tab.y
    n = y.shape[0]
    # D_j = delta(y_j) for j = 0..n-1 (decreasing); k = #{j : D_j > delta}.
    D = tab.A[1:] - jnp.exp(y - tab.y_ref) * tab.B[1:]
    # A count rather than a binary search: D may be non-monotone at round-off level.
    k = jnp.sum(D > delta[..., None], axis=-1)              # in 0..n
    seg = k - 1                                              # segment in -1..n-1
    A = tab.A[k]
    B = tab.B[k]
    # Closed form only where it is defined; the other branch's operands are made harmless so
    # that reverse-mode AD never forms 0 * inf (B = 0 or A <= delta give no gradient at all).
    ok = (B > 0) & (A - delta > 0)
    ratio = jnp.where(ok, (A - delta) / jnp.where(ok, B, 1.0), 1.0)
    eps = tab.y_ref + jnp.log(ratio)
    lo_end = jnp.where(seg >= 0, y[jnp.maximum(seg, 0)], -jnp.inf)
    hi_end = jnp.where(seg + 1 <= n - 1, y[jnp.minimum(seg + 1, n - 1)], jnp.inf)
    # Inside the segment the closed form is exact; round-off is resolved toward the upper end.
    eps = jnp.where(ok, jnp.clip(eps, lo_end, hi_end), hi_end)
    eps = jnp.where(k >= n, jnp.inf, eps)
    return jnp.maximum(eps, 0.0)
