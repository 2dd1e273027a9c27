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

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._x64 import float64
from dpjax.pld.compose import ComposedPLD
from dpjax._enums import StrEnum


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


_BLOCK = 64


def suffix_sums(x):
    """``s_j = sum_{t >= j} x_t`` of a 1-D array, as blocked triangular matrix products.

    Same values as ``jnp.cumsum(x[::-1])[::-1]`` (every ``s_j`` sums only terms ``t >= j``, so
    small tails keep their relative accuracy; for non-negative terms the rounding error is at
    most ``(2 B + depth) u s_j``, below a sequential sum's ``n u s_j``), but XLA:CPU lowers
    ``cumsum`` to an associative scan whose compilation takes ~0.45 s per call at n = 2^16;
    these dots compile in ~0.05 s and run in ~1 ms.
    """
    n = x.shape[0]
    if n <= _BLOCK:
        tri = jnp.tril(jnp.ones((n, n), x.dtype))            # tri[i, j] = 1 for i >= j
        return jnp.dot(x, tri, precision=jax.lax.Precision.HIGHEST)
    nb = -(-n // _BLOCK)
    xb = jnp.pad(x, (0, nb * _BLOCK - n)).reshape(nb, _BLOCK)
    tri = jnp.tril(jnp.ones((_BLOCK, _BLOCK), x.dtype))
    within = jnp.dot(xb, tri, precision=jax.lax.Precision.HIGHEST)     # suffix sums inside a block
    totals = within[:, 0]
    after = suffix_sums(totals)                                        # blocks r' >= r
    after = jnp.concatenate([after[1:], jnp.zeros((1,), x.dtype)])     # blocks r' > r
    return (within + after[:, None]).reshape(-1)[:n]


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


@float64
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


@float64
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


# Block length of :func:`epsilon` (a power of two; n = 2^k or 3 * 2^k gives n / 256 <= 3 * 2^(k-8)
# blocks: 384 at n = 98304).
_EPS_BLOCK = 256


def _block_len(n: int) -> int:
    """Largest power of two <= ``_EPS_BLOCK`` dividing ``n``."""
    b = 1
    while b < _EPS_BLOCK and n % (2 * b) == 0:
        b *= 2
    return b


# Chunk length of :func:`suffix_sums_small`'s two-level form.
_SUFFIX_CHUNK = 32


def suffix_sums_small(x):
    """``s_i = sum_{i' >= i} x_i'`` along the last axis of a short array, as triangular
    multiply-reduces (cheap to compile).

    Lengths above ``_SUFFIX_CHUNK`` that it divides are summed in two levels: suffix sums inside
    chunks of 32, plus the suffix sums of the chunk totals (``k (32 + k / 32)`` terms instead of
    ``k^2``: 512 blocks at n = 2^17 made the one-level form a 2 x 512 x 512 select and reduce).
    For non-negative terms the relative error stays below ``(32 + k / 32) u``."""
    k = x.shape[-1]
    if k > _SUFFIX_CHUNK and k % _SUFFIX_CHUNK == 0:
        xb = x.reshape(x.shape[:-1] + (k // _SUFFIX_CHUNK, _SUFFIX_CHUNK))
        within = suffix_sums_small(xb)                        # inside each chunk
        after = suffix_sums_small(within[..., 0])             # chunks r' >= r
        after = jnp.concatenate([after[..., 1:], jnp.zeros(after.shape[:-1] + (1,), x.dtype)], axis=-1)
        return (within + after[..., None]).reshape(x.shape)    # + chunks r' > r
    i = jax.lax.iota(jnp.int32, k)
    # The mask from iotas, not a (k, k) constant: large constants slow XLA's compile.
    return jnp.sum(jnp.where(i[None, :] >= i[:, None], x[..., None, :], 0.0), axis=-1)


def epsilon(pld: ComposedPLD, delta, bound: Bound | str = Bound.UPPER) -> jax.Array:
    """``eps_at(table(pld, bound), delta)`` without building the whole table.

    Same segment coefficients and closed form as :func:`eps_at`, but only where they are needed:
    ``delta(y_j)`` is evaluated at the first point of every block of (up to) 256 grid points
    from the block totals' suffix sums, the last block whose first point is above ``delta`` is
    located, and only that block's 256 suffix sums are formed (a ``(targets, 256)`` slice
    instead of two length-``n`` blocked triangular products).  The segment is the one after the *last*
    grid point with ``delta(y_j) > delta`` (never below :func:`eps_at`'s count where round-off
    makes ``delta(y_j)`` non-monotone).
    """
    bound = Bound.parse(bound)
    delta = jnp.asarray(delta, jnp.float64)
    r, y, _, y_ref, const, fa, fb = curve_terms(pld, bound)
    n = r.shape[-1]
    b = _block_len(n)
    nb = n // b
    rb = r.reshape(nb, b)
    # The weights w_t = r_t e^{y_ref - y_t} with y_ref - y_t = (n/2 - t) dx, factored per block
    # (t = i b + j): e^{(n/2 - i b) dx} e^{-j dx}.  nb + b exponentials instead of n; each w_t
    # then carries one more rounding (a few ulps, as e^{y_ref - y_t} itself).
    w_out = jnp.exp((n // 2 - b * jnp.arange(nb)) * pld.dx)                 # (nb,)
    w_in = jnp.exp(-jnp.arange(b) * pld.dx)                                  # (b,)
    # Suffix sums from block starts: s_r[i] = sum_{t >= i b} r_t (and likewise for w).
    s_r = suffix_sums_small(jnp.sum(rb, axis=1))
    s_w = suffix_sums_small(w_out * jnp.sum(rb * w_in, axis=1))
    # delta at the block starts y_{ib}: terms t > ib, i.e. the suffix from ib minus r_{ib}.
    D_start = (s_r - rb[:, 0]) * fa + const - jnp.exp(y[::b] - y_ref) * (s_w - rb[:, 0] * w_out) * fb
    flat = delta.reshape(-1)
    # Index of the last block start above each target (-1: none).  Max-reductions over masked
    # indices rather than argmax/gather: the same result, and cheaper to compile.
    blk = jnp.max(jnp.where(D_start[None, :] > flat[:, None], jnp.arange(nb)[None, :], -1), axis=1)
    any_above = blk >= 0
    blk = jnp.maximum(blk, 0)
    # The located block of every target: its b suffix sums (terms t > j), as (K, b) arrays.
    start = blk[:, None] * b
    r_blk = r[start + np.arange(b)[None, :]]                                    # (K, b)
    rw = jnp.stack([r_blk, r_blk * w_out[blk][:, None] * w_in[None, :]])       # (2, K, b)
    nxt = blk + 1
    after = nxt < nb
    nxt = jnp.minimum(nxt, nb - 1)
    # Sums over t > j inside the block: the suffix sums from t = j + 1 (the same terms).
    incl = suffix_sums_small(rw)                                               # (2, K, b)
    sums = jnp.concatenate([incl[..., 1:], jnp.zeros(incl.shape[:-1] + (1,), incl.dtype)], axis=-1)
    sr = sums[0] + jnp.where(after, s_r[nxt], 0.0)[:, None]
    sw = sums[1] + jnp.where(after, s_w[nxt], 0.0)[:, None]
    eps = segment_epsilon(sr * fa + const, sw * fb, s_r[0] * fa + const, s_w[0] * fb, blk, any_above, start, flat,
                          y_ref, pld.w_lo, pld.dx, n, jnp.inf if bound is Bound.UPPER else -jnp.inf)
    # A NaN / inf anywhere in the PMF or the constants: no bound (upper: inf, lower: 0).
    broken = ~(jnp.isfinite(s_r[0]) & jnp.isfinite(s_w[0]) & jnp.isfinite(const) & jnp.isfinite(fa))
    eps = jnp.where(broken, jnp.inf if bound is Bound.UPPER else 0.0, eps)
    return jnp.maximum(eps, 0.0).reshape(delta.shape)


def segment_epsilon(A_blk, B_blk, A0, B0, blk, any_above, start, flat, y_ref, w_lo, dx, n: int, a_bad):
    """The last step of :func:`epsilon` (and of :func:`dpjax.pld.sweep_program.epsilon_program`,
    which rearranges the sums before it): per target, the segment whose delta curve crosses it
    and the epsilon there, clipped to the segment.

    ``A_blk``, ``B_blk``: (K, b) the coefficients ``delta(eps) = A - e^{eps - y_ref} B`` at every
    point of the located block (starting at grid index ``start``, (K, 1)); ``A0``, ``B0``: those
    of the whole window (no point above the target, ``any_above`` False); ``blk``: (K,) the block;
    ``flat``: (K,) the targets; ``a_bad``: what a NaN coefficient becomes (``inf`` for the upper
    bound, ``-inf`` for the lower).  Returns (K,) epsilons (``inf`` when the last segment is
    reached)."""
    b = A_blk.shape[-1]
    y_blk = (w_lo + start + np.arange(b)[None, :]) * dx                       # = y[start + t]
    hit = (A_blk - jnp.exp(y_blk - y_ref) * B_blk) > flat[:, None]
    # (The block start itself was found above delta; should round-off disagree here, keep it.)
    last = jnp.maximum(jnp.max(jnp.where(hit, np.arange(b)[None, :], -1), axis=1), 0)
    # Segment j = the last grid point above delta (-1: none): coefficients of the sums over t > j.
    j = jnp.where(any_above, blk * b + last, -1)
    at_last = np.arange(b)[None, :] == last[:, None]
    A = jnp.where(any_above, jnp.sum(jnp.where(at_last, A_blk, 0.0), axis=1), A0)
    B = jnp.where(any_above, jnp.sum(jnp.where(at_last, B_blk, 0.0), axis=1), B0)
    bad = jnp.isnan(A) | jnp.isnan(B)
    A = jnp.where(bad, a_bad, A)
    B = jnp.where(bad, 0.0, B)
    ratio = (A - flat) / B
    eps = y_ref + jnp.log(jnp.where(ratio > 0, ratio, 1.0))
    # Segment [y_j, y_{j+1}] (y_j = (w_lo + j) dx, as in ``ComposedPLD.losses``).
    lo_end = jnp.where(j >= 0, (w_lo + j) * dx, -jnp.inf)
    hi_end = jnp.where(j + 1 <= n - 1, (w_lo + j + 1) * dx, jnp.inf)
    eps = jnp.where((ratio > 0) & (B > 0), jnp.clip(eps, lo_end, hi_end), hi_end)
    return jnp.where(j >= n - 1, jnp.inf, eps)
