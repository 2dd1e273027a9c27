"""Random allocation of the Gaussian mechanism: its privacy-loss distribution, certified from
both sides (docs/design.md §12).

The sampling scheme (Feldman & Shenfeld, "Privacy amplification by random allocation"): in every
epoch of ``t`` steps each example is used in ``k`` of them, chosen uniformly at random and afresh
each epoch; ``E`` epochs are run.  Each step adds Gaussian noise of standard deviation ``sigma``
(the noise multiplier: sensitivity 1).

One epoch of 1-of-``t`` allocation is dominated by the pair

    P = (1/t) sum_i N(e_i, sigma^2 I_t),      Q = N(0, sigma^2 I_t),

whose likelihood ratio under ``Q`` is the mean of ``t`` independent log-normal variables,

    V = dP/dQ = sum_i X_i,   X_i = Z_i / t,   Z_i = exp(W_i / sigma - 1 / (2 sigma^2)),   W_i ~ N(0, 1).

Every hockey-stick divergence of the pair (remove: ``E_Q[(V - e^eps)_+]``; add:
``E_Q[(1 - e^eps V)_+]``), and of its compositions, is the expectation of a convex function of
``V``.  Hence

* **upper bound**: a ratio ``V'`` larger than ``V`` in the convex order (extra mass allowed, on
  any ratio, and in particular on the atoms "ratio 0" and "ratio +inf") gives a dominating pair;
* **lower bound**: a ratio smaller in the convex order, or moved in the direction the hockey
  stick decreases (down for remove, up for add), with mass removed, gives a lower bound.

``V'`` is built as a mixture of lattice laws, one per *max-band*: the range of ``X`` is cut at
``b_0 < ... < b_K`` (geometric); on the event that the largest ``X_i`` lies in band ``k`` the law
of ``V`` is ``(mu_{<=b_k})^{*t} - (mu_{<=b_{k-1}})^{*t}``, computed by one FFT power on a lattice
of spacing ``g_k`` scaled to that event (relative resolution at every scale, from the add
direction's tiny ratios to the remove direction's large ones).  ``X`` is put on the lattice by a
mean-preserving split (upper) or by merging and matching neighbouring bins with the leftovers
rounded down / up (lower, per direction), and what falls outside each window is bounded with
Chernoff bounds on truncated laws.  The atoms are then placed on a loss grid (connect-the-dots, or
the optimistic matching), and the epochs compose by FFT.

The numerics are written once against an array namespace: :data:`JAX` (jittable, vmappable,
differentiable; float64 under :mod:`dpjax._base.x64`) and :data:`NUMPY` (the same operations on the
host, for one-shot calls: no compilation).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from dpjax.numerics.root import HostBisection

_U = 2.0**-52
_TINY = 1e-300
_SQRT1_2 = 0.7071067811865476
# Rounds of neighbour matching of the optimistic lattices (as in dpjax.pld.grid.discretize).
_MATCH_ROUNDS = 3
# Window of the others' sum in a band: z standard deviations below its mean and z + _Z_SKEW
# above, z = sqrt(2 log(1/tau)) (only placement: the Chernoff bounds computed afterwards certify
# what lies outside; the sum of log-normals is skewed to the right).
_Z_SKEW = 3.0
_Z_SKEW_LOW = 1.0
# Chernoff parameters of the lattice windows: multiples of 1 / (window width).
_LAMBDA_MULT = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0])
# Chernoff parameters of the composition: multiples of sqrt(2 log(1/tau)) / (composed std).
_COMPOSE_MULT = np.array([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 10.0])
# Block length of the blocked log-MGF sums (lattice and grid lengths are multiples of it).
_BLOCK = 16
# Truncation points of the window tail bounds: b_k 2^{-r/2}, r < _N_TRUNC.
_N_TRUNC = 24
# A lattice room at or above this holds the whole range of the sum on every band's event (see
# band_geometry): the planner's last resort, where no window can be outside.
_WHOLE_ROOM = 1e6


# ------------------------------------------------------------------------------------------
# Array namespaces


class Ops:
    """The array operations the numerics use, for one backend (see :data:`JAX`, :data:`NUMPY`)."""

    def __init__(self, name, xp, erfc, scatter_add, stop, materialize, take_along_axis, suffix_sum, fori_loop):
        self.name = name
        self.xp = xp
        self.erfc = erfc
        self.scatter_add = scatter_add
        self.stop = stop
        self.materialize = materialize
        self.take_along_axis = take_along_axis
        self.suffix_sum = suffix_sum
        self.fori_loop = fori_loop

    def __repr__(self):
        return f"Ops({self.name})"


def _np_scatter_add(n, idx, vals):
    idx = np.asarray(idx).reshape(-1)
    return np.bincount(idx, weights=np.asarray(vals, np.float64).reshape(-1), minlength=n)[:n]


def _make_numpy() -> Ops:
    import scipy.special as sp

    def fori_loop(lo, hi, body, init, stop=None):
        state = init
        for i in range(lo, hi):
            state = body(i, state)
            if stop is not None and stop(state):
                break
        return state

    return Ops("numpy", np, sp.erfc, _np_scatter_add, lambda x: x, lambda fn: fn(), np.take_along_axis,
               lambda a: np.cumsum(a[..., ::-1], axis=-1)[..., ::-1], fori_loop)


def _make_jax() -> Ops:
    import jax
    import jax.numpy as jnp
    from dpjax.pld.grid.convert import suffix_sums
    from dpjax.pld.grid.discretize import materialize_once

    def scatter_add(n, idx, vals):
        return jnp.zeros(n, jnp.float64).at[idx.reshape(-1)].add(vals.reshape(-1), mode="drop")

    def materialize(fn):
        return materialize_once(fn, jnp.asarray(True))

    def suffix_sum(a):
        # Blocked triangular products (dpjax.pld.grid.convert): XLA:CPU's cumsum compiles slowly.
        flat = a.reshape(-1, a.shape[-1])
        return jax.vmap(suffix_sums)(flat).reshape(a.shape)

    def fori_loop(lo, hi, body, init, stop=None):
        return jax.lax.fori_loop(lo, hi, body, init)

    return Ops("jax", jnp, jax.lax.erfc, scatter_add, jax.lax.stop_gradient, materialize, jnp.take_along_axis,
               suffix_sum, fori_loop)


NUMPY = _make_numpy()


class _LazyJax:
    ops = None


def jax_ops() -> Ops:
    """:class:`Ops` of ``jax.numpy`` (created on first use: importing this module stays cheap)."""
    if _LazyJax.ops is None:
        _LazyJax.ops = _make_jax()
    return _LazyJax.ops


# ------------------------------------------------------------------------------------------
# Normal helpers


def _small_tails(ops, *ws):
    """``min(Phi(w), 1 - Phi(w))`` (the tail of ``W`` beyond ``w`` on the side below 1/2) of
    several arrays ``ws``, with one ``erfc`` call (each call site of XLA's float64 ``erfc`` is a
    large expansion to compile).  The formula of :func:`dpjax.pld.mechanisms.normal_small_tail`
    over this module's backends (:class:`Ops`: NumPy with SciPy's ``erfc`` or ``jax.numpy``),
    which keeps this module free of a jax import."""
    xp = ops.xp
    if xp is np:
        # On the host one call per array is cheaper than joining them (small arrays: the join
        # costs more than the arithmetic); the values are the same.
        return [0.5 * ops.erfc(np.abs(np.asarray(w, dtype=np.float64)) * _SQRT1_2) for w in ws]
    shapes = [xp.shape(w) for w in ws]
    flat = xp.concatenate([xp.reshape(xp.asarray(w, dtype=np.float64), (-1,)) for w in ws])
    tails = 0.5 * ops.erfc(xp.abs(flat) * _SQRT1_2)
    out, i = [], 0
    for shp in shapes:
        size = int(np.prod(shp, dtype=np.int64))
        out.append(xp.reshape(tails[i:i + size], shp))
        i += size
    return out


def _interval_from_tails(xp, wl, tl, wh, th):
    """``Phi(wh) - Phi(wl)`` (``wl <= wh``) from the small tails ``tl``, ``th`` at the ends."""
    cdf_hi = xp.where(wh <= 0.0, th, 1.0 - th)
    return xp.maximum(xp.where(wl > 0.0, tl - th, cdf_hi - tl), 0.0)


def _log_ndtr_from_tail(xp, w, tail):
    """``log Phi(w)`` from the small tail at ``w`` (``w`` above about -37; below, ``log 1e-300``:
    only used where that is harmless, see the callers).  Not :func:`dpjax.numerics.exact.py_log_ndtr`:
    it reuses a tail already computed (no second ``erfc``) and runs on either backend."""
    return xp.where(w < 0.0, xp.log(xp.maximum(tail, 1e-300)), xp.log1p(-tail))


def host_constants(t: float, tau: float) -> tuple[float, float]:
    """``(w_lo, w_top)`` of one epoch (host floats; they do not depend on ``sigma``): ``P(W <=
    w_lo)^t = tau`` and ``w_top`` such that ``t P(W > w_top) = tau / 2``; the bands then span
    ``[w_lo, max(1/sigma + Q^{-1}(tau/2), w_top)]``."""
    import scipy.special as sp

    w_lo = float(sp.ndtri(math.exp(math.log(tau) / t)))
    return w_lo, float(-sp.ndtri(0.5 * tau / t))


def _w_of(xp, x, s, t):
    """``w`` with ``exp(s w - s^2/2) / t = x`` (``-inf`` at ``x = 0``)."""
    pos = x > 0.0
    return xp.where(pos, (xp.log(t * xp.where(pos, x, 1.0)) + 0.5 * s * s) / s, -np.inf)


# ------------------------------------------------------------------------------------------
# One epoch: bands and lattice windows


def band_geometry(ops, sigma, t, tau, *, levels: int, n: int, m: int, room=1.0) -> dict:
    """Bands and lattice windows of one epoch of 1-of-``t`` allocation.

    Returns arrays: ``w_lo``, ``w_max`` (bands span ``W in [w_lo, w_max]``), ``wk`` (K+1 band
    edges in ``W``), per level ``bl``, ``bh`` (band ends in ``X``), ``g`` (lattice spacing),
    ``w0`` (first window index), ``lo``, ``hi`` (the span the window was sized for).
    """
    xp = ops.xp
    s = 1.0 / sigma
    log_t = xp.log(t)
    import scipy.special as sp

    # Lowest edge: P(every X_i <= b_0) = tau (that event is spread to the ratio-0 / inf atoms).
    # Top: P(the active coordinate beyond) <= tau / 2 and t P(an inactive one beyond) <= tau / 2.
    w_lo, w_top = host_constants(t, tau)
    w_max = xp.maximum(s - float(sp.ndtri(0.5 * tau)), w_top)
    w_max = xp.maximum(w_max, w_lo + 1e-3)
    k = xp.arange(levels + 1, dtype=np.float64)
    wk = w_lo + (w_max - w_lo) * k / levels
    b = xp.exp(s * wk - 0.5 * s * s - log_t)
    bl, bh = b[:-1], b[1:]
    wh = wk[1:]
    # Mean and variance of X given X <= b_k (log-normal partial moments).
    t0, t1, t2 = _small_tails(ops, wh, wh - s, wh - 2.0 * s)
    log_f = _log_ndtr_from_tail(xp, wh, t0)
    m1 = xp.exp(_log_ndtr_from_tail(xp, wh - s, t1) - log_t - log_f)
    m2 = xp.exp(s * s + _log_ndtr_from_tail(xp, wh - 2.0 * s, t2) - 2.0 * log_t - log_f)
    var = xp.maximum(m2 - m1 * m1, 0.0)
    mo = (t - 1.0) * m1
    so = xp.sqrt((t - 1.0) * var)
    z = math.sqrt(2.0 * math.log(1.0 / tau))
    # Below the mean the law of X given X <= b_k has the untruncated lower tail (scaled by 1 / F):
    # where b_k cuts into the bulk, the truncated standard deviation understates it, and with few
    # steps (no central limit) the others' sum then falls below a window placed z such deviations
    # down with probability far above tau (sigma 50, t = 2: about 1e-6 at tau = 6e-10).  A second
    # scale from the one-term quantile, (m1 - x_q) / z with P(X <= x_q) <= tau F (Mills:
    # w_q = -sqrt(2 log(1 / (tau F))) lies below the exact quantile), is a sub-Gaussian parameter
    # of the lower tail at the level tau; the larger of the two places the window's lower end.
    w_q = -xp.sqrt(2.0 * (math.log(1.0 / tau) - log_f))
    x_q = xp.exp(s * w_q - 0.5 * s * s - log_t)
    so_low = xp.maximum(so, math.sqrt(t - 1.0) * xp.maximum(m1 - x_q, 0.0) / z)
    # The truncated law is skewed to the left (its mass piles up below b_k), so its sum's lower
    # tail needs a little more than z such deviations, as the upper side's _Z_SKEW; a larger
    # ``room`` (the planner's retry after a tail bound over budget) widens this side as well.
    lo = bl + xp.maximum(0.0, mo - (z + _Z_SKEW_LOW) * so_low * room ** (1.0 / 3.0))
    if room >= _WHOLE_ROOM:
        # The largest room holds the whole range: from the band's lower edge (with the lattice
        # floor of the band plus t - 1 lattice origins as the window start, nothing lies below)
        # up to t b_k (below: ``full``).
        lo = bl
    # Room for one more large X among the others (heavy tails: two large values together are
    # not rare when t is small): y with t P(band) t P(X > y) <= tau (from the Gaussian bound
    # P(W > w) <= exp(-w^2/2) for w >= 0.4), at most b_k.
    tb0, tb1 = _small_tails(ops, wk[:-1], wk[1:])
    pband = _interval_from_tails(xp, wk[:-1], tb0, wk[1:], tb1)
    log_p = math.log(tau) - 2.0 * math.log(t) - xp.log(xp.maximum(pband, tau))
    w_q = xp.sqrt(xp.maximum(-2.0 * log_p, 0.16))
    y_q = xp.minimum(bh, xp.exp(s * w_q - 0.5 * s * s - log_t))
    # ``room`` (>= 1; the planner raises it when a window's tail bound is over budget) adds more.
    hi = bh + mo + (z + _Z_SKEW) * so + room * y_q
    # Every value of V' on the event is at most t (b_k + g): where that is below ``hi`` (few
    # steps, heavy tails) the window holds all of it, nothing can wrap from above:
    # t (b_k + g) <= lo + (n - 2) g  <=>  g >= (t b_k - lo) / (n - t - 2).
    full = ((t * bh <= hi) | (room >= _WHOLE_ROOM)) & (t + 2.0 < 0.5 * n)
    g = xp.where(full, (t * bh - lo) / xp.maximum(n - t - 2.0, 1.0), (hi - lo) / (n - 2))
    hi = xp.where(full, t * bh, hi)
    # The lattice must reach b_k plus a block for the truncated sums (see _window_tails).
    g = xp.maximum(g, bh / (m - _BLOCK - 2))
    w0 = xp.floor(lo / g)
    return dict(w_lo=w_lo, w_max=w_max, wk=wk, bl=bl, bh=bh, g=g, w0=w0, lo=lo, hi=hi)


def _match(xp, D, E):
    """Fractions ``(u, v)`` of each merged atom matched upwards / downwards: atom ``j`` lacks
    ``D_j`` below the next point, atom ``j+1`` exceeds its own point by ``E_{j+1}``; fractions
    ``u_j``, ``v_{j+1}`` with ``u_j D_j = v_{j+1} E_{j+1}`` merge into one atom exactly on the
    shared point (the parallel rounds of :mod:`dpjax.pld.grid.discretize`'s optimistic grid)."""
    # Pair j joins atom j (its need D_j) and atom j + 1 (its excess E_{j+1}); the round-invariant
    # masks and denominators are formed once (large lattices: each pass over them costs).
    Dl, Eh = D[..., :-1], E[..., 1:]
    has_d, has_e = Dl > _TINY, Eh > _TINY
    d_safe, e_safe = xp.maximum(Dl, _TINY), xp.maximum(Eh, _TINY)
    zero = xp.zeros(D.shape[:-1] + (1,))
    f = xp.ones_like(D)
    u = xp.zeros_like(Dl)
    v = xp.zeros_like(Dl)
    for _ in range(_MATCH_ROUNDS):
        Dr, Er = f[..., :-1] * Dl, f[..., 1:] * Eh
        s_up = xp.minimum(1.0, Er / xp.maximum(Dr, _TINY))                  # atom j's share up
        r_dn = xp.minimum(1.0, Dr / xp.maximum(Er, _TINY))                  # atom j + 1's share down
        over = xp.maximum(xp.concatenate([s_up, zero], -1) + xp.concatenate([zero, r_dn], -1), 1.0)
        tt = xp.minimum(s_up / over[..., :-1] * Dr, r_dn / over[..., 1:] * Er)
        up = xp.where(has_d, tt / d_safe, 0.0)
        dn = xp.where(has_e, tt / e_safe, 0.0)
        u, v = u + up, v + dn
        f = xp.maximum(f - xp.concatenate([up, zero], -1) - xp.concatenate([zero, dn], -1), 0.0)
    return (xp.clip(xp.concatenate([u, zero], -1), 0.0, 1.0),
            xp.clip(xp.concatenate([zero, v], -1), 0.0, 1.0))


# The lower laws contract the lowest part of X exactly onto the lattice (see _contract): at most
# _CONTRACT_CELLS lattice cells, and only while the density of X changes by more than _KAPPA
# (relative) over one cell; beyond that the neighbour matching leaves little unmatched, while a
# contraction loses the variance inside its intervals.
_CONTRACT_CELLS = 32
_KAPPA = 0.05
# Safeguarded Newton steps per contracted interval (only the tightness depends on them: every
# end kept is on the sound side).
_ROOT_ITERS = 10


def _contract(ops, s, t, g, limit, origin, u0):
    """Exact contraction of the lowest part of ``X`` onto the lattice ``j g``.

    Consecutive intervals ``[u_{i-1}, u_i]`` (from ``u0``) are chosen so that the conditional mean
    of ``X`` on each is the lattice point ``p_i`` (of ``origin + j g``) just above ``u_{i-1}``: merging each interval
    into one atom is post-processing (a contraction), and the atom already sits on the lattice,
    so nothing is rounded.  ``G(u) = E[X; u_{i-1} < X <= u] - p_i P(u_{i-1} < X <= u)`` is negative
    just above ``p_i`` and increases beyond it; ``u_i`` is found by safeguarded Newton iteration on ``[p_i, limit]``,
    keeping the end with ``G >= 0`` (mean at or above ``p_i``) for the remove
    direction's law and the end with ``G <= 0`` for the add direction's, so that the atom's exact
    mean is on the side its direction may round to.  Stops where no root lies below ``limit``.

    Returns ``(u_end (2, K), masses (2, K, M), index (2, K, M))``: the contracted range ends at
    ``u_end`` (per law: remove, add); atom ``i`` has the mass of its interval at lattice index
    ``index`` (-1 where unused).
    """
    xp = ops.xp
    K = g.shape[0]
    lim = xp.broadcast_to(limit, (2, K))
    gg = xp.broadcast_to(g, (2, K))

    def cdf_first(u):
        w = _w_of(xp, u, s, t)
        tw, tws = _small_tails(ops, w, w - s)
        F = xp.where(w <= 0.0, tw, 1.0 - tw)
        M = xp.where(w - s <= 0.0, tws, 1.0 - tws) / t
        return F, M

    F_lim, M_lim = cdf_first(lim)
    oo = xp.broadcast_to(origin, (2, K))
    u0 = xp.broadcast_to(u0, (2, K))
    F0, M0 = cdf_first(u0)

    def step(i, state):
        u, F_u, M_u, done, masses, index = state
        p = oo + (xp.floor((u - oo) / gg) + 1.0) * gg
        # G(p) < 0 (the conditional mean below p is below p), so p is the bracket's left end.
        G_l = (M_lim - M_u) - p * (F_lim - F_u)
        ok = ~done & (G_l >= 0.0) & (p < lim)

        def solve(_, br):
            # Safeguarded Newton on G (G'(u) = (u - p) f_X(u)), keeping a bracket [a, b] with
            # G(a) < 0 <= G(b); a step leaving the bracket is replaced by its midpoint.
            a, b, c = br
            F_c, M_c = cdf_first(c)
            Gc = (M_c - M_u) - p * (F_c - F_u)
            right = Gc >= 0.0
            a = xp.where(right, a, c)
            b = xp.where(right, c, b)
            w_c = _w_of(xp, c, s, t)
            dens = xp.exp(-0.5 * w_c * w_c) / (math.sqrt(2.0 * math.pi) * s * xp.maximum(c, _TINY))
            slope = (c - p) * dens
            newton = c - Gc / xp.where(slope > 0, slope, 1.0)
            inside = (slope > 0) & (newton > a) & (newton < b)
            return a, b, xp.where(inside, newton, 0.5 * (a + b))

        # Start where a uniform density would put the root (2 p - u), inside the bracket.
        c0 = xp.clip(2.0 * p - u, p + 1e-12 * gg, lim)
        a, b, _ = ops.fori_loop(0, _ROOT_ITERS, solve, (p, lim, xp.where(c0 < lim, c0, 0.5 * (p + lim))))
        # Newton may approach the root from the right only: the left end then is a point just
        # below b if G is still negative there (checked), else the last left iterate.
        cand = xp.maximum(b - 1e-12 * (b - p) - 4e-16 * b, p)
        F_c, M_c = cdf_first(cand)
        a = xp.where((M_c - M_u) - p * (F_c - F_u) < 0.0, xp.maximum(cand, a), a)
        # Row 0 (remove): the end with G >= 0; row 1 (add): the end with G < 0 (or p itself).
        u_new = xp.stack([b[0], a[1]])
        u_new = xp.where(ok, u_new, u)
        F_n, M_n = cdf_first(u_new)
        mass = xp.where(ok, xp.maximum(F_n - F_u, 0.0), 0.0)
        masses = xp.where(xp.arange(_CONTRACT_CELLS) == i, mass[..., None], masses)
        index = xp.where(xp.arange(_CONTRACT_CELLS) == i, xp.where(ok, xp.round((p - oo) / gg), -1.0)[..., None], index)
        return u_new, F_n, M_n, done | ~ok, masses, index

    init = (u0, F0, M0, xp.zeros((2, K), bool), xp.zeros((2, K, _CONTRACT_CELLS)),
            -xp.ones((2, K, _CONTRACT_CELLS)))
    u, _, _, _, masses, index = ops.fori_loop(0, _CONTRACT_CELLS, step, init, stop=lambda st: st[3].all())
    return u, masses, index


def _bottom_atom(ops, s, t, g, bl):
    """The lower laws' bottom atom of :func:`_lattice_laws`: ``(theta, P(X <= theta), mu, delta)``.

    ``X <= theta = min(g, b_{k-1})`` is merged into one atom at ``mu = E[X | X <= theta]``, on the
    lattice ``delta + j g`` with ``delta = mu mod g`` (so the atom is a lattice point: where the
    bulk of X is finer than g, nothing else could put it on the lattice exactly); the exact
    interval contraction then runs from theta on.  Each (K,)."""
    xp = ops.xp
    theta = xp.minimum(g, bl)
    w_th = _w_of(xp, theta, s, t)
    t_th, t_ths = _small_tails(ops, w_th, w_th - s)
    f_th = xp.where(w_th <= 0.0, t_th, 1.0 - t_th)                         # P(X <= theta)
    m_th = xp.where(w_th - s <= 0.0, t_ths, 1.0 - t_ths) / t               # E[X; X <= theta]
    mu = xp.where(f_th > 0, m_th / xp.maximum(f_th, _TINY), 0.5 * theta)
    delta = ops.stop(mu - g * xp.floor(mu / g))
    return theta, f_th, mu, delta


def _cells(xp, s, t, xl, w, tw, tws, ends, we, te, tes, lo_i, hi_i):
    """Mass and first moment of ``X`` on every cell of the lattice ``xl`` (K, m) clipped to
    ``[ends[lo_i], ends[hi_i]]`` (``lo_i`` None: from ``X = 0``): (K, m-1) each.  ``w``, ``tw``,
    ``tws``: ``W`` and the small tails of ``W``, ``W - s`` at the lattice points; ``we``, ``te``,
    ``tes`` the same at the range ends."""
    hi_v = ends[hi_i][:, None]
    above = xl > hi_v
    ew = xp.where(above, we[hi_i][:, None], w)
    et = xp.where(above, te[hi_i][:, None], tw)
    ets = xp.where(above, tes[hi_i][:, None], tws)
    if lo_i is not None:
        below = xl < ends[lo_i][:, None]
        ew = xp.where(below, we[lo_i][:, None], ew)
        et = xp.where(below, te[lo_i][:, None], et)
        ets = xp.where(below, tes[lo_i][:, None], ets)
    mass = _interval_from_tails(xp, ew[:, :-1], et[:, :-1], ew[:, 1:], et[:, 1:])
    first = _interval_from_tails(xp, ew[:, :-1] - s, ets[:, :-1], ew[:, 1:] - s, ets[:, 1:]) / t
    return mass, first


def _upper_law(xp, s, t, g, x0, w, tw, tws, ends, we, te, tes):
    """The dominating lattice law of :func:`_lattice_laws` ([0]): ``A`` (``[0, b_{k-1}]``) and ``B``
    (``(b_{k-1}, b_k]``), every cell's outcome split between its two lattice neighbours keeping
    its mean: (K, 2, m)."""
    zero = xp.zeros((g.shape[0], 1))

    def split(mass, first):
        D = xp.maximum(x0[:, 1:] * mass - first, 0.0)
        a = xp.clip(D / g[:, None], 0.0, mass)
        return xp.concatenate([a, zero], -1) + xp.concatenate([zero, mass - a], -1)

    law_a = split(*_cells(xp, s, t, x0, w, tw, tws, ends, we, te, tes, None, 0))    # [0, b_{k-1}]
    law_b = split(*_cells(xp, s, t, x0, w, tw, tws, ends, we, te, tes, 0, 1))       # (b_{k-1}, b_k]
    return xp.stack([law_a, law_b], 1)


def _lattice_laws(ops, s, t, g, bl, bh, m: int):
    """:func:`_lattice_laws_on` for every level: on the host, levels whose support (up to ``b_k``)
    covers a small part of the lattice are computed on a shorter prefix of it (grouped by
    powers of two of the prefix length): everything beyond ``b_k`` is exactly zero, and every
    entry is computed by the same element-wise operations (same values; large ``t`` puts most
    levels' ``b_k`` far below the lattice top, which is sized for the sum of ``t`` terms)."""
    bottom = _bottom_and_contraction(ops, s, t, g, bl)
    if ops.xp is not np:
        return _lattice_laws_on(ops, s, t, g, bl, bh, m, bottom)
    K = g.shape[0]
    # Last lattice index at or below b_k, plus room for the split's upper neighbour and the
    # contraction's cells (at most _CONTRACT_CELLS + 1 lattice steps).
    need = np.ceil(bh / g) + 3.0
    need = np.where(np.isfinite(need), need, float(m))
    sizes = np.full(K, m, dtype=np.int64)
    size = m
    while size % 2 == 0 and size // 2 >= 4 * _CONTRACT_CELLS:
        size //= 2
        sizes = np.where(need <= size, size, sizes)
    if np.all(sizes == m):
        return _lattice_laws_on(ops, s, t, g, bl, bh, m, bottom)
    laws = np.zeros((3, K, 2, m))
    origins = np.zeros((3, K))
    for size in np.unique(sizes):
        ks = np.nonzero(sizes == size)[0]
        (theta, f_th, mu, delta), (u_end, c_mass, c_index) = bottom
        part = ((theta[ks], f_th[ks], mu[ks], delta[ks]), (u_end[:, ks], c_mass[:, ks], c_index[:, ks]))
        sub, org = _lattice_laws_on(ops, s, t, g[ks], bl[ks], bh[ks], int(size), part)
        laws[:, ks, :, :size] = sub
        origins[:, ks] = org
    return laws, origins


def _bottom_and_contraction(ops, s, t, g, bl):
    """:func:`_bottom_atom` and :func:`_contract` of every level (their loops run once for all
    levels)."""
    xp = ops.xp
    bottom = _bottom_atom(ops, s, t, g, bl)
    theta, _, _, delta = bottom
    # Contract up to where the density of X changes by less than kappa over one cell (|d log f /
    # dx| g = (g / x) |1 + (log(t x) + s^2 / 2) / s^2|, one fixed-point step from x = g / kappa):
    # beyond it the neighbour matching leaves little unmatched, and contraction loses variance.
    x_res = g / _KAPPA
    x_res = g * xp.abs(1.0 + (xp.log(t * x_res) + 0.5 * s * s) / (s * s)) / _KAPPA
    limit = xp.minimum(bl, xp.minimum(_CONTRACT_CELLS * g, x_res))
    return bottom, _contract(ops, s, t, g, limit, delta, theta)


def _lattice_laws_on(ops, s, t, g, bl, bh, m: int, bottom):
    """``X`` restricted to ``[0, b_{k-1}]`` ("A") and ``(b_{k-1}, b_k]`` ("B") on the lattice
    ``j g_k`` (``m`` points), three ways: (3, K, 2, m) masses and (3, K) lattice origins (0).

    [0] the mean-preserving split of every outcome between its two lattice neighbours (larger in
    the convex order).  [1], [2]: the lowest part of ``X`` contracted exactly onto the lattice
    (:func:`_contract`); above it each cell merged into one atom (its conditional mean),
    neighbouring atoms matched onto the shared point, leftovers rounded down ([1], the remove
    direction's lower bound) or up ([2], the add direction's).
    """
    xp = ops.xp
    K = g.shape[0]
    (theta, f_th, mu, delta), (u_end, c_mass, c_index) = bottom
    x0 = xp.arange(m, dtype=np.float64)[None, :] * g[:, None]             # (K, m): upper lattice
    x1 = delta[:, None] + x0                                               # lower lattice
    x = xp.stack([x0, x1])                                                 # (2, K, m)
    w = _w_of(xp, x, s, t)
    ends = xp.stack([bl, bh, u_end[0], u_end[1]])                          # (4, K)
    we = _w_of(xp, ends, s, t)
    def tails():
        # Small tails of W and W - s at every lattice point and at the range ends, computed once
        # into buffers (XLA would otherwise duplicate the erfc expansions into every consumer).
        return tuple(_small_tails(ops, w, w - s, we, we - s))

    tw, tws, te, tes = ops.materialize(tails)

    def cells(L, lo_i, hi_i):
        return _cells(xp, s, t, x[L], w[L], tw[L], tws[L], ends, we, te, tes, lo_i, hi_i)

    m_ra, f_ra = cells(1, 2, 0)                                            # (u_end, b_{k-1}]: remove
    m_aa, f_aa = cells(1, 3, 0)                                            # add
    m_bl, f_bl = cells(1, 0, 1)                                            # B on the lower lattice
    up = _upper_law(xp, s, t, g, x0, w[0], tw[0], tws[0], ends, we, te, tes)   # (K, 2, m)
    # Lower laws: match the cells of (A above the contraction, B) per direction.
    mass_l = xp.stack([xp.stack([m_ra, m_bl], 1), xp.stack([m_aa, m_bl], 1)])     # (2, K, 2, m-1)
    first_l = xp.stack([xp.stack([f_ra, f_bl], 1), xp.stack([f_aa, f_bl], 1)])
    xl, xh = x1[:, :-1], x1[:, 1:]
    D = xp.maximum(xh[None, :, None] * mass_l - first_l, 0.0)
    Ex = xp.maximum(first_l - xl[None, :, None] * mass_l, 0.0)
    u, v = _match(xp, D, Ex)
    z2 = xp.zeros(mass_l.shape[:-1] + (1,))
    rm = xp.concatenate([mass_l[0] * (1.0 - u[0]), z2[0]], -1) + xp.concatenate([z2[0], mass_l[0] * u[0]], -1)
    ad = xp.concatenate([mass_l[1] * v[1], z2[1]], -1) + xp.concatenate([z2[1], mass_l[1] * (1.0 - v[1])], -1)
    # The contracted atoms, exactly on their lattice points, into A.
    j0 = xp.clip(xp.round((mu - delta) / g), 0, m - 1)
    idx = xp.concatenate([c_index, xp.broadcast_to(j0[None, :, None], (2, K, 1))], -1)     # (2, K, M+1)
    val = xp.concatenate([c_mass, xp.broadcast_to(f_th[None, :, None], (2, K, 1))], -1)
    val = xp.where(idx >= 0, val, 0.0)
    flat = ((xp.arange(2)[:, None, None] * K + xp.arange(K)[None, :, None]) * m
            + xp.clip(idx, 0, m - 1)).astype(np.int64)
    atoms = ops.scatter_add(2 * K * m, flat, val).reshape(2, K, m)
    rm = rm + xp.stack([atoms[0], xp.zeros_like(atoms[0])], 1)
    ad = ad + xp.stack([atoms[1], xp.zeros_like(atoms[1])], 1)
    laws = xp.stack([up, rm, ad])                                          # (3, K, 2, m)
    return laws, xp.stack([xp.zeros_like(delta), delta, delta])


def _log1p_c(xp, z):
    """``log(1 + z)`` for complex ``z`` without cancellation near 0."""
    x, y = xp.real(z), xp.imag(z)
    return 0.5 * xp.log1p(2.0 * x + x * x + y * y) + 1j * xp.arctan2(y, 1.0 + x)


def _expm1_c(xp, w):
    """``exp(w) - 1`` for complex ``w`` without cancellation near 0."""
    a, b = xp.real(w), xp.imag(w)
    return (xp.expm1(a) * xp.cos(b) - 2.0 * xp.sin(0.5 * b) ** 2) + 1j * xp.exp(a) * xp.sin(b)


def _polar(xp, F):
    """``(log |F|, arg F, F != 0)`` with finite derivatives at ``F = 0`` (where the log is
    ``log 1e-300`` and the angle 0; the mask lets callers zero those entries)."""
    re, im = xp.real(F), xp.imag(F)
    sq = re * re + im * im
    nz = sq > 0
    safe = xp.where(nz, sq, 1.0)
    logabs = xp.where(nz, 0.5 * xp.log(safe), math.log(_TINY))
    ang = xp.arctan2(xp.where(nz, im, 0.0), xp.where(nz, re, 1.0))
    return logabs, ang, nz


def _cpow(xp, F, t):
    """``F^t`` for an integer ``t``, as ``exp(t log F)`` (exact on the principal branch)."""
    lr, ang, nz = _polar(xp, F)
    return xp.where(nz, xp.exp(t * lr) * (xp.cos(t * ang) + 1j * xp.sin(t * ang)), 0.0)


def _event_power(xp, FA, FB, t):
    """``(FA + FB)^t - FA^t``: the transform of the law on "some X_i in the band".

    Where ``|FB| < |FA|``, ``FA^t expm1(t log1p(FB / FA))`` (no cancellation when the band is
    rare); where that power is large (the two terms differ by a factor ``>= e^{1/2}``) or
    ``|FB| >= |FA|`` (then ``|FA|^t`` is below the band's own mass to the power ``t``), directly.
    """
    small = xp.abs(FB) < xp.abs(FA)
    z = xp.where(small, FB / xp.where(small, FA, 1.0), 0.0)
    w = t * _log1p_c(xp, z)
    stable = _cpow(xp, FA, t) * _expm1_c(xp, w)
    direct = _cpow(xp, FA + FB, t) - _cpow(xp, FA, t)
    return xp.where(small & (xp.real(w) < 0.5), stable, direct)


class EpochAtoms(NamedTuple):
    """The likelihood ratio ``V'`` of one epoch as lattice atoms (``K`` levels x ``n`` points).

    Attributes:
      v: (3, K, n) ratio values of the atoms (per law: the lower laws sit on shifted lattices).
      q: (3, K, n) Q-masses: [0] dominating law, [1] remove lower law, [2] add lower law.
      p_inf: () P-mass at ratio ``+inf`` of the dominating law (remove: counted in full).
      q_zero: () Q-mass at ratio 0 of the dominating law (add: counted in full).
      slack: (2,) bound on what wrapped-in mass can add to a remove / add hockey stick of the
        lower laws.
      noise_rel: () relative round-off allowance of the lattice powers.
    """

    v: Any
    q: Any
    p_inf: Any
    q_zero: Any
    slack: Any
    noise_rel: Any


def _prefix_log_mgf(ops, S, g, lam, J):
    """``log sum_{j < 16 J} S_j e^{lam j g}`` for every truncation ``J`` (a number of 16-point
    blocks).

    ``S``: (V, K, m) lattice masses; ``g``: (K,); ``lam``: (K, L); ``J``: (V, K, R).  Sums inside a
    block use 16 shared exponentials; the block terms are scaled by their largest value per row
    (``log`` of ``sum + 1e-300`` then never falls below the exact value beyond rounding: terms
    that underflow are covered by the guard) and summed under each truncation's mask.
    Returns (V, K, L, R).
    """
    xp = ops.xp
    V, K, m = S.shape
    nb = m // _BLOCK
    i = xp.arange(_BLOCK, dtype=np.float64)
    inner_e = xp.exp(lam[:, :, None] * (i[None, None, :] * g[:, None, None]))           # (K, L, 16)
    inner = xp.einsum("vkbi,kli->vklb", S.reshape(V, K, nb, _BLOCK), inner_e)            # (V, K, L, nb)
    xb = xp.arange(nb, dtype=np.float64)[None, :] * (_BLOCK * g[:, None])               # (K, nb)
    logt = xp.where(inner > 0, xp.log(xp.maximum(inner, 1e-300)) + (lam[:, :, None] * xb[:, None, :])[None],
                    -np.inf)
    top = xp.max(logt, -1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0.0)
    scaled = xp.exp(logt - top)
    mask = (xp.arange(nb, dtype=np.float64) < J[..., None]) * 1.0                      # (V, K, R, nb)
    total = xp.einsum("vklb,vkrb->vklr", scaled, mask)
    return xp.log(total + 1e-300) + top


def _window_tails(ops, laws, origins, w0, geo, s, t, n: int):
    """Chernoff bounds on the Q- and P-mass of each level's event law outside its window.

    On "some X_i in band k" (union over which ``i``), ``V' = X'_i + S`` with ``X'_i <= b_k + g``
    and ``S`` the sum of the other ``t - 1``, each at most ``b_k``.  Above the window (``V' >=
    h``): ``S >= a = h - b_k - g``, bounded for every truncation point ``c`` in the band edges by
    ``P(S_c >= a) + (t - 1) P(c < X <= b_k)``, where ``S_c`` sums ``t - 1`` lattice laws truncated
    at ``c`` (Chernoff with the truncated log-MGF ``K_c``: ``exp((t-1) K_c(lam) - lam a)``, and for
    the P-mass ``E[S_c e^{lam (S_c - a)}] = (t-1) K_c'(lam) e^{...}`` with ``K_c'`` bounded by a
    secant of the convex ``K_c``).  Below (window start above the band's lattice floor ``beta``):
    ``S <= lo - beta``, Chernoff with ``lam < 0``.  Each law on its own lattice ``origin + j g``
    (``origins``: (3, K)) with its window ``J in [w0, w0 + n)`` (``w0``: (3, K)).  Returns
    (Q-mass, P-mass), each (3, K).
    """
    xp = ops.xp
    S = laws[:, :, 0] + laws[:, :, 1]                                      # (3, K, m): all X <= b_k
    V, K, m = S.shape
    nb = m // _BLOCK
    g, bl, bh, wk = geo["g"], geo["bl"], geo["bh"], geo["wk"]
    scale = xp.maximum(geo["hi"] - geo["lo"], g)
    # lam from 0.5 / width up to ~ 1 / g (values just beyond the window edge need lam g ~ 1).
    mult = xp.concatenate([xp.asarray(_LAMBDA_MULT), xp.asarray([n / 8.0, n / 2.0, 2.0 * n])])
    lam = mult[None, :] / scale[:, None]                                   # (K, L)
    # Truncation points c = b_k 2^{-r/2}, r = 0.._N_TRUNC-1 (r = 0: none): include the blocks
    # whose points are all < x_{16 J - 1}, i.e. J = ceil((c / g + 1) / 16) (c' = (16 J - 1) g >= c).
    r = xp.arange(_N_TRUNC, dtype=np.float64)
    cut = bh[:, None] * 2.0 ** (-0.5 * r)[None, :]                         # (K, R)
    J = xp.clip(xp.ceil(((cut[None] - origins[..., None]) / g[None, :, None] + 1.0) / _BLOCK), 1, nb)
    J = xp.where(r == 0, float(nb), J)                                      # (V, K, R)
    logK = _prefix_log_mgf(ops, S, g, lam, J) + (lam[None] * origins[..., None])[..., None]  # (V, K, L, R)
    h = t * origins + (w0 + n) * g                                          # (V, K): first value above
    a = h - bh - g
    # Remainders P(c < X <= b_k) and E[X; c < X <= b_k].
    wc = _w_of(xp, cut, s, t)
    wlev = wk[1:]
    a_hi = wlev[:, None] + 0.0 * wc
    ta, tb_, tas, tbs, tpl, tph, tpls, tphs = _small_tails(ops, wc, a_hi, wc - s, a_hi - s, wk[:-1], wk[1:],
                                                            wk[:-1] - s, wk[1:] - s)
    p_rem = xp.where(r[None, :] == 0, 0.0, _interval_from_tails(xp, wc, ta, a_hi, tb_))
    e_rem = xp.where(r[None, :] == 0, 0.0, _interval_from_tails(xp, wc - s, tas, a_hi - s, tbs) / t)
    valid = r[None, :] >= 0.0
    la = lam[None, :, :, None]
    slope = (logK[:, :, 1:] - logK[:, :, :-1]) / (lam[None, :, 1:, None] - lam[None, :, :-1, None])
    # An overflowed log-MGF (inf, or inf - inf) gives no bound at that lam (inf), never a NaN.
    slope = xp.where(xp.isnan(slope), np.inf, xp.maximum(slope, 0.0))

    def chernoff(count, thr):
        """Chernoff bounds (P(S_c >= thr), E[S_c; S_c >= thr]) of the sum of ``count`` lattice
        variables truncated at every point c: (V, K, R) each."""
        tq = xp.exp(xp.minimum(count * logK - la * thr[:, :, None, None], 0.0))               # (V, K, L, R)
        te = count * slope * xp.exp(xp.minimum(count * logK[:, :, :-1] - la[:, :, :-1] * thr[:, :, None, None],
                                               700.0))
        te = xp.where(xp.isnan(te), np.inf, te)
        return xp.minimum(xp.min(xp.where(xp.isnan(tq), 1.0, tq), axis=2), 1.0), xp.min(te, axis=2)

    def best(x):
        return xp.min(xp.where(valid[None], x, np.inf), axis=-1)

    def tail(count, thr):
        """Bounds on P(S >= thr) and E[S; S >= thr], S a sum of ``count`` variables <= b_k: for
        every truncation c, the truncated sum's Chernoff bound plus the event that some variable
        exceeds c, on which the remaining ``count - 1`` must still reach ``thr - b_k - g``
        (bounded the same way, with one truncation term)."""
        thr2 = thr - bh - g
        cq, ce = chernoff(count, thr)
        cq2, ce2 = chernoff(count - 1.0, thr2)
        p1 = xp.minimum(best(cq2 + (count - 1.0) * p_rem[None]), 1.0)                      # (V, K)
        e1 = best(ce2 + (count - 1.0) * (e_rem + (count - 2.0) / t * p_rem)[None])
        pq = best(cq + count * p_rem[None] * p1[..., None])
        pe = best(ce + count * (e_rem[None] * p1[..., None] + p_rem[None] * e1[..., None]))
        return xp.minimum(pq, 1.0), pe

    pband = _interval_from_tails(xp, wk[:-1], tpl, wk[1:], tph)                          # (K,)
    eband = _interval_from_tails(xp, wk[:-1] - s, tpls, wk[1:] - s, tphs) / t
    # (a) union over the variable in the band: t P(band) P(others >= a).
    Pq, Pe = tail(t - 1.0, a)
    q_union = t * pband[None] * Pq
    p_union = t * (eband[None] * Pq + pband[None] * Pe)
    # (b) the whole sum: P(every X <= b_k, V' >= h) (better where the band is not rare).
    Fq, Fe = tail(t, h)
    # Exact zero where even t copies of the largest lattice value stay below the window top.
    x_top = origins + xp.ceil((bh - origins) / g) * g
    none_above = t * x_top < h
    q_above = xp.where(none_above, 0.0, xp.minimum(xp.minimum(q_union, Fq), 1.0))
    p_above = xp.where(none_above, 0.0, xp.minimum(xp.minimum(p_union, Fe), 1.0))
    # Below the window (see _below_window).
    q_below, p_below = _below_window(ops, S, origins, w0, g, bl, lam, pband, t)
    return xp.minimum(q_above + q_below, 1.0), xp.minimum(p_above + p_below, 1.0)


def _below_window(ops, S, origins, w0, g, bl, lam, pband, t):
    """The part of :func:`_window_tails` below each window: (Q-mass, P-mass), each (3, K).

    (a) the band's split value is >= ``beta = floor(b_{k-1} / g) g``, so the others sum to at
    most ``lo - beta``; (b) the whole sum is at most ``lo``: Chernoff with ``-lam`` on the full
    lattice laws ``S`` (3, K, m)."""
    xp = ops.xp
    V, K, m = S.shape
    nb = m // _BLOCK
    beta = origins + xp.floor((bl - origins) / g) * g                     # (V, K)
    lo_w = t * origins + w0 * g
    gap = lo_w - beta
    logKn = (_prefix_log_mgf(ops, S, g, -lam, xp.full((V, K, 1), float(nb)))[..., 0]
             - lam[None] * origins[..., None])                               # (V, K, L)
    tb = xp.min(xp.exp(xp.minimum((t - 1.0) * logKn + lam[None] * gap[..., None], 0.0)), axis=-1)
    tf = xp.min(xp.exp(xp.minimum(t * logKn + lam[None] * lo_w[..., None], 0.0)), axis=-1)
    # (gap - (t - 1) origin is a whole number of lattice steps: compare with half a step.)
    q_below = xp.where(gap > (t - 1.0) * origins + 0.5 * g, xp.minimum(xp.minimum(t * pband[None] * tb, tf), 1.0), 0.0)
    return q_below, lo_w * q_below


def _window_starts(xp, geo, origins, t):
    """First window index of every law and level (``origins``: (V, K)): where the window starts at
    the band (``lo = b_{k-1}``), at the smallest value on the event, the band's lattice floor
    ``beta`` plus ``t - 1`` values ``>= origin``; else at ``lo``."""
    g = geo["g"][None, :]
    beta = origins + xp.floor((geo["bl"][None, :] - origins) / g) * g
    at_band = geo["lo"] <= geo["bl"]
    return xp.where(at_band[None, :], xp.round((beta - origins) / g), xp.floor((geo["lo"][None, :] - t * origins) / g))


def _bias_shift(xp, laws, origins, geo, t):
    """Window shift (lattice steps) of each lower law: its leftovers are rounded down (remove) or
    up (add), which moves the mean of every term by up to a lattice step, and the sum of the
    ``t - 1`` others by up to ``t - 1`` steps; with many steps that is far more than the sum's
    spread (sigma 30, t = 10^6: the remove law's sum sat ~500 steps below a window of 32768 steps
    that is ~35 of its standard deviations wide, and 1e-3 of it fell outside).  The window follows
    the law's own mean: ``(t - 1)`` times the difference of its mean from the dominating law's
    (which keeps the mean).  Zero for the dominating law and where the window starts at the band
    (it then holds the whole range from the smallest value on)."""
    S = laws[:, :, 0] + laws[:, :, 1]                                      # (3, K, m)
    m = S.shape[-1]
    x = origins[..., None] + xp.arange(m, dtype=np.float64) * geo["g"][None, :, None]
    mean = xp.sum(S * x, -1) / xp.maximum(xp.sum(S, -1), _TINY)           # (3, K)
    shift = xp.round((t - 1.0) * (mean - mean[:1]) / geo["g"][None, :])
    at_band = geo["lo"] <= geo["bl"]
    return xp.where(at_band[None, :], 0.0, shift)


def upper_window_mass(sigma, t, tau, *, levels: int, n: int, m: int, room=1.0):
    """P-mass the dominating law of one epoch puts outside its lattice windows (host, NumPy): the
    part of :attr:`EpochAtoms.p_inf` that a larger ``room`` reduces, computed without the lower
    laws, the powers or the loss grid (about a tenth of :func:`epoch_atoms`).  The planner uses it
    to pick ``room`` before running; the run itself still checks every bound."""
    with np.errstate(all="ignore"):
        s = 1.0 / sigma
        t = float(t)
        geo = band_geometry(NUMPY, sigma, t, tau, levels=levels, n=n, m=m, room=room)
        g = geo["g"]
        x0 = np.arange(m, dtype=np.float64)[None, :] * g[:, None]
        w = _w_of(np, x0, s, t)
        ends = np.stack([geo["bl"], geo["bh"]])
        we = _w_of(np, ends, s, t)
        tw, tws, te, tes = _small_tails(NUMPY, w, w - s, we, we - s)
        up = _upper_law(np, s, t, g, x0, w, tw, tws, ends, we, te, tes)[None]     # (1, K, 2, m)
        origins = np.zeros((1, g.shape[0]))
        _, p_out = _window_tails(NUMPY, up, origins, _window_starts(np, geo, origins, t), geo, s, t, n)
        return float(np.sum(p_out))


def epoch_atoms(ops, sigma, t, tau, *, levels: int, n: int, m: int, room=1.0, geometry=None) -> EpochAtoms:
    """Lattice atoms of one epoch of 1-of-``t`` allocation.

    Args:
      ops: :data:`NUMPY` or :func:`jax_ops`.
      sigma: noise multiplier (> 0).
      t: steps in the epoch (>= 1; float or int).
      tau: truncation level: the events spread to the ratio-0 / ratio-inf atoms have Q- and P-mass
        about ``tau``.
      levels, n, m: number of bands, window (FFT) length, lattice length (static; ``m`` a multiple
        of 16).
    """
    xp = ops.xp
    s = 1.0 / sigma
    t = t * 1.0
    # ``geometry`` (a band_geometry dict) holds the bands and windows fixed (derivatives in sigma
    # of the bound at a fixed discretization); by default they follow sigma.
    geo = ops.stop(geometry if geometry is not None else
                   band_geometry(ops, sigma, t, tau, levels=levels, n=n, m=m, room=room))
    g, w0 = geo["g"], geo["w0"]
    laws, origins = _lattice_laws(ops, s, t, g, geo["bl"], geo["bh"], m)   # (3, K, 2, m), (3, K)
    reps = -(-m // n)                                                      # fold onto n points
    padded = xp.concatenate([laws, xp.zeros(laws.shape[:-1] + (reps * n - m,))], -1)
    folded = padded.reshape(laws.shape[:-1] + (reps, n)).sum(-2)
    F = xp.fft.rfft(folded, axis=-1)                                       # (3, K, 2, n/2+1)
    lam_hat = _event_power(xp, F[:, :, 0], F[:, :, 1], t)                  # (3, K, n/2+1)
    circ = xp.fft.irfft(lam_hat, n, axis=-1)
    # A sum of t lattice values is t * origin + J g; the window holds J in [w0, w0 + n).  Where
    # the window starts at the band (lo = b_{k-1}), it starts at the smallest value on the event:
    # the band's lattice floor beta plus t - 1 values >= origin.
    w0 = ops.stop(_window_starts(xp, geo, origins, t) + _bias_shift(xp, laws, origins, geo, t))      # (3, K)
    idx = xp.mod(w0[..., None].astype(np.int64) + xp.arange(n), n)
    r = ops.take_along_axis(circ, idx, axis=-1)
    v = t * origins[..., None] + (w0[..., None] + xp.arange(n)) * g[None, :, None]          # (3, K, n)
    # Round-off floor: every bin may carry the largest negative excursion seen; the lower laws
    # also lose the a-priori offset from relative errors ~noise_rel of every coefficient.
    noise_rel = 8.0 * _U * (math.log2(n) + t)
    nu = xp.max(xp.maximum(-r, 0.0), axis=-1)                              # (3, K)
    prior = noise_rel * (2.0 / n) * xp.sum(xp.abs(lam_hat), axis=-1)
    floor = xp.where(xp.arange(3)[:, None] == 0, -nu, xp.maximum(nu, prior))
    q = xp.maximum(xp.where(xp.arange(3)[:, None, None] == 0, xp.maximum(r, 0.0), r) - floor[..., None], 0.0)
    q_out, p_out = _window_tails(ops, laws, origins, w0, geo, s, t, n)
    # Events outside every band: all X_i <= b_0, or some X_i > b_K (spread to ratios 0 / inf).
    w_lo, w_max = geo["w_lo"], geo["w_max"]
    t_lo, t_lo_s, tail_hi, tail_hi_s = _small_tails(ops, w_lo, w_lo - s, w_max, w_max - s)   # w_max > s
    log_f0 = _log_ndtr_from_tail(xp, w_lo, t_lo)
    q_low = xp.exp(t * log_f0)
    p_low = xp.exp(_log_ndtr_from_tail(xp, w_lo - s, t_lo_s) + (t - 1.0) * log_f0)
    q_high = -xp.expm1(t * xp.log1p(-tail_hi))
    p_high = -xp.expm1(xp.log1p(-tail_hi_s) + (t - 1.0) * xp.log1p(-tail_hi))
    p_inf = xp.minimum(p_low + p_high + xp.sum(p_out[0]), 1.0)
    q_zero = xp.minimum(q_low + q_high + xp.sum(q_out[0]), 1.0)
    # Lower laws: wrapped-in mass counts at most its landed ratio (<= the window top) times its
    # Q-mass for remove, its Q-mass for add.
    top = t * origins + (w0 + n) * g[None, :]
    slack = xp.stack([xp.sum(top[1] * q_out[1]), xp.sum(q_out[2])])
    return EpochAtoms(v=v, q=q, p_inf=p_inf, q_zero=q_zero, slack=slack, noise_rel=noise_rel)


# ------------------------------------------------------------------------------------------
# Atoms -> loss grid


def grid_up(ops, v, q, offset, dx, N: int):
    """Dominating (connect-the-dots) placement of ratio atoms (values ``v``, Q-masses ``q``,
    P-masses ``v q``) on the loss grid ``y_j = (offset + j) dx``, ``j < N``.

    An atom with loss ``log v`` in ``[y_j, y_{j+1}]`` is split between the two grid points keeping
    its P- and Q-mass (a mean-preserving spread of the ratio); below ``y_0`` between ratio 0 and
    ``e^{y_0}``; above ``y_{N-1}`` between ``e^{y_{N-1}}`` and ``+inf``.  Returns ``(Q-masses (N,),
    p_inf, q_zero)``; the P-mass at ``y_j`` is ``e^{y_j}`` times the Q-mass there.
    """
    xp = ops.xp
    y0 = offset * dx
    top = (offset + N - 1) * dx
    pos = v > 0
    loss = xp.where(pos, xp.log(xp.where(pos, v, 1.0)), -np.inf)
    j = xp.floor((loss - y0) / dx)
    inside = (j >= 0) & (j <= N - 2)
    ji = xp.clip(xp.where(inside, j, 0.0), 0, N - 2).astype(np.int64)
    yj = (offset + ji) * dx
    frac = xp.clip(xp.expm1(xp.clip(loss - yj, 0.0, dx)) / xp.expm1(dx * 1.0), 0.0, 1.0)
    q_hi = xp.where(inside, q * frac, 0.0)
    q_lo = xp.where(inside, q - q_hi, 0.0)
    below = pos & (loss < y0)
    above = pos & (loss >= top)
    q_b = xp.where(below, q * v * xp.exp(-y0), 0.0)
    q_zero = xp.sum(xp.where(below, q - q_b, 0.0)) + xp.sum(xp.where(pos, 0.0, q))
    p_inf = xp.sum(xp.where(above, q * (v - xp.exp(top)), 0.0))
    out = ops.scatter_add(N, xp.concatenate([ji.reshape(-1), ji.reshape(-1) + 1]),
                          xp.concatenate([q_lo.reshape(-1), q_hi.reshape(-1)]))
    edge = xp.where(xp.arange(N) == 0, xp.sum(q_b), 0.0) + xp.where(xp.arange(N) == N - 1,
                                                                     xp.sum(xp.where(above, q, 0.0)), 0.0)
    return out + edge, xp.maximum(p_inf, 0.0), xp.maximum(q_zero, 0.0)


def grid_down(ops, loss, p, q, offset, dx, N: int):
    """Dominated placement of atoms (losses ``loss``, P-masses ``p``, Q-masses ``q``, oriented as
    the direction being bounded) on ``y_j = (offset + j) dx``: merged per bin ``(y_j, y_{j+1}]``
    (post-processing), neighbouring merged atoms matched so that a piece sits exactly on the
    shared grid point (post-processing), the rest rounded down.  Atoms at or below ``y_0`` are
    dropped, atoms above ``y_{N-1}`` rounded down to it.  Returns the P-masses (N,)."""
    xp = ops.xp
    y0 = offset * dx
    top = (offset + N - 1) * dx
    j = xp.ceil((loss - y0) / dx) - 1.0
    inside = (j >= 0) & (j <= N - 2)
    ji = xp.clip(xp.where(inside, j, 0.0), 0, N - 2).astype(np.int64)
    yj = (offset + ji) * dx
    d_at = xp.where(inside, -q * xp.exp(yj + dx) * xp.expm1(xp.clip(loss - yj - dx, -dx, 0.0)), 0.0)
    e_at = xp.where(inside, q * xp.exp(yj) * xp.expm1(xp.clip(loss - yj, 0.0, dx)), 0.0)
    pin = xp.where(inside, p, 0.0)
    flat = ji.reshape(-1)
    P = ops.scatter_add(N - 1, flat, pin)
    D = ops.scatter_add(N - 1, flat, d_at)
    E = ops.scatter_add(N - 1, flat, e_at)
    u, _ = _match(xp, D, E)
    zero = xp.zeros(1)
    out = xp.concatenate([P * (1.0 - u), zero]) + xp.concatenate([zero, P * u])
    over = xp.sum(xp.where(loss > top, p, 0.0))
    return out + xp.where(xp.arange(N) == N - 1, over, 0.0)


class EpochPMFs(NamedTuple):
    """One epoch (one block size) on the loss grid.

    Attributes:
      pmf: (4, N) P-masses of: remove upper, add upper, remove lower, add lower; the remove rows
        on ``y_j = (offset + j) dx``, the add rows on ``(offset_add + j) dx`` with ``offset_add =
        -(offset + N - 1)`` (the negated grid, reversed).
      p_inf: (4,) mass at loss ``+inf`` (upper rows only).
      offsets: (4,) grid offsets.
      slack: (4,) per-epoch bound on wrapped-in mass of the lower rows (subtracted from the lower
        curves).
      noise_rel: () relative round-off allowance of the lattice powers.
    """

    pmf: Any
    p_inf: Any
    offsets: Any
    slack: Any
    noise_rel: Any


def epoch_pmfs(ops, sigma, t, tau, dx, *, levels: int, n: int, m: int, N: int, room=1.0, geometry=None,
               offset=None) -> EpochPMFs:
    """Both directions' upper and lower PMFs of one epoch of 1-of-``t`` allocation on a loss grid
    of ``N`` points starting just below the smallest atom."""
    xp = ops.xp
    at = epoch_atoms(ops, sigma, t, tau, levels=levels, n=n, m=m, room=room, geometry=geometry)
    v = at.v                                                               # (3, K, n)
    vmin = xp.min(xp.where(v > 0, v, np.inf))
    if offset is None:
        offset = ops.stop(xp.floor(xp.log(vmin) / dx)).astype(np.int64) - 1
    q_up, p_inf_g, q_zero_g = grid_up(ops, v[0], at.q[0], offset, dx, N)
    y = (offset + xp.arange(N)) * dx
    pos = v > 0
    loss = xp.where(pos, xp.log(xp.where(pos, v, 1.0)), -np.inf)
    offset_add = -(offset + N - 1)
    rm_down = grid_down(ops, loss[1], v[1] * at.q[1], at.q[1], offset, dx, N)
    ad_down = grid_down(ops, -loss[2], at.q[2], xp.maximum(v[2], 0.0) * at.q[2], offset_add, dx, N)
    pmf = xp.stack([q_up * xp.exp(y), q_up[::-1], rm_down, ad_down])
    zero = xp.zeros(())
    p_inf = xp.minimum(xp.stack([at.p_inf + p_inf_g, at.q_zero + q_zero_g, zero, zero]), 1.0)
    offsets = xp.stack([offset, offset_add, offset, offset_add])
    slack = xp.stack([zero, zero, at.slack[0], at.slack[1]])
    return EpochPMFs(pmf=pmf, p_inf=p_inf, offsets=offsets, slack=slack, noise_rel=at.noise_rel + zero)


# ------------------------------------------------------------------------------------------
# Composition of epochs (and of the blocks of a k-of-t allocation), and conversion


class Composed(NamedTuple):
    """The composed PLD of the 4 rows (remove upper, add upper, remove lower, add lower) on a
    window of ``n_comp`` grid points ``(w_lo + i) dx``.

    ``const_up`` / ``const_lo`` are the constants added to the upper / subtracted from the lower
    delta curve (``+inf`` atom, wrap-around, slack); ``roundoff_rel`` inflates the hockey-stick
    sums of the upper curve (and deflates the lower one).
    """

    pmf: Any
    w_lo: Any
    dx: Any
    p_inf: Any
    tail_above: Any
    tail_below: Any
    roundoff_rel: Any
    noise_floor: Any
    # (4,): the curves serve eps >= valid_from only (a tilted composition, compose_tilted); None:
    # every eps.
    valid_from: Any = None


class Pair(NamedTuple):
    """The ordinary composition and the tilted one (:func:`compose_tilted`) of the same epoch
    PMFs: :func:`eps_of` / :func:`delta_of` take the smaller upper end and the larger lower end
    of the two (both certified)."""

    ordinary: Any
    tilted: Any


def ordinary(comp):
    """The ordinary :class:`Composed` of ``comp`` (itself, or a :class:`Pair`'s first)."""
    return comp.ordinary if isinstance(comp, Pair) else comp


def _grid_log_mgf(xp, pmf, y, lam):
    """``log sum_i pmf_i e^{lam y_i}`` (pmf, y: (..., N); lam: (..., L)) with per-row reference
    at the mean (underflow guard ``+1e-300``; overflow gives ``inf``, a trivial bound)."""
    mass = xp.maximum(xp.sum(pmf, -1), _TINY)
    ref = xp.sum(pmf * y, -1) / mass                                                # (...)
    N = pmf.shape[-1]
    nb = N // _BLOCK
    dx = y[..., 1] - y[..., 0]
    i = xp.arange(_BLOCK, dtype=np.float64)
    inner_e = xp.exp(lam[..., :, None] * (i * dx[..., None, None]))                  # (..., L, 16)
    inner = xp.einsum("...bi,...li->...lb", pmf.reshape(pmf.shape[:-1] + (nb, _BLOCK)), inner_e)
    expo = lam[..., :, None] * (y[..., None, ::_BLOCK] - ref[..., None, None])      # (..., L, nb)
    ok = expo < 700.0
    outer = xp.where(ok, xp.exp(xp.where(ok, expo, 0.0)), 0.0)
    terms = xp.where(inner > 0, inner * outer, 0.0)
    direct = lam * ref[..., None] + xp.log(xp.sum(terms, -1) + 1e-300)
    # Where a block's factor would overflow (a far atom of tiny mass and a large lam: large noise
    # puts the loss within 1e-3 of 0 while the grid holds atoms 0.3 away), the same sum shifted by
    # its largest term; an infinite block sum (lam g 16 beyond the range) still gives K = inf, a
    # trivial bound, never a NaN.
    overflow = xp.any((inner > 0) & ~ok, axis=-1)
    logt = xp.where(inner > 0, xp.log(xp.where(inner > 0, inner, 1.0)) + expo, -np.inf)
    top = xp.max(logt, -1, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0.0)
    shifted = lam * ref[..., None] + top[..., 0] + xp.log(xp.sum(xp.exp(logt - top), -1) + 1e-300)
    shifted = xp.where(xp.isnan(shifted), np.inf, shifted)
    return xp.where(overflow, shifted, direct)


def compose_epochs(ops, pmfs: EpochPMFs, counts, dx, log_tau, *, n_comp: int) -> Composed:
    """Compose block ``b``'s epoch PMFs ``counts[b]`` times (``pmfs`` fields with a leading block
    axis), by FFT on ``n_comp`` points, in a window placed between the composed Chernoff
    quantiles at ``log_tau``; mass outside the window is bounded (Chernoff) and added to the upper
    curves (from above) / subtracted from the lower curves (from below), as in
    :mod:`dpjax.pld.grid.compose`."""
    xp = ops.xp
    counts = counts * 1.0
    pmf = pmfs.pmf                                                      # (B, 4, N)
    B, D, N = pmf.shape
    reps = -(-N // n_comp)
    padded = xp.concatenate([pmf, xp.zeros((B, D, reps * n_comp - N))], -1).reshape(B, D, reps, n_comp).sum(2)
    F = xp.fft.rfft(padded, axis=-1)                                     # (B, 4, nf)
    c = counts[:, None, None]
    lf, af, _ = _polar(xp, F)
    logabs = xp.sum(c * lf, 0)
    angle = xp.sum(c * af, 0)
    mag = xp.exp(logabs)
    circ = xp.fft.irfft(mag * (xp.cos(angle) + 1j * xp.sin(angle)), n_comp, axis=-1)   # (4, n_comp)
    y = (pmfs.offsets[..., None] + xp.arange(N)) * dx                    # (B, 4, N)
    mass = xp.maximum(xp.sum(pmf, -1), _TINY)
    mean_b = xp.sum(pmf * y, -1) / mass
    var_b = xp.sum(pmf * (y - mean_b[..., None]) ** 2, -1) / mass
    sd = xp.sqrt(xp.maximum(xp.sum(counts[:, None] * var_b, 0), 1e-24))  # (4,)
    zt = math.sqrt(2.0) * xp.sqrt(xp.maximum(-log_tau, 1.0))
    lam_pos = zt * _COMPOSE_MULT[None, :] / sd[:, None]
    lams = xp.concatenate([lam_pos, -lam_pos], -1)                       # (4, L)
    Kb = _grid_log_mgf(xp, pmf, y, xp.broadcast_to(lams[None], (B,) + lams.shape))      # (B, 4, L)
    K = xp.sum(xp.where(c > 0, c * Kb, 0.0), 0)                          # (4, L)
    pos = lams > 0
    h = xp.min(xp.where(pos, (K - log_tau) / xp.where(pos, lams, 1.0), np.inf), -1)
    l = xp.max(xp.where(pos, -np.inf, (K - log_tau) / xp.where(pos, 1.0, lams)), -1)
    centre = xp.where(xp.isfinite(0.5 * (h + l)), 0.5 * (h + l), xp.sum(counts[:, None] * mean_b, 0))
    w_lo = xp.floor(centre / dx).astype(np.int64) - n_comp // 2
    cnt_i = counts.astype(np.int64)
    offset_tot = xp.mod(xp.sum(xp.mod(cnt_i, n_comp)[:, None] * xp.mod(pmfs.offsets, n_comp), 0), n_comp)
    idx = xp.mod(xp.arange(n_comp)[None, :] + (w_lo - offset_tot)[:, None], n_comp)
    r = ops.take_along_axis(circ, idx, axis=-1)
    hi = (w_lo + n_comp) * dx
    lo = (w_lo - 1) * dx
    above = xp.min(xp.where(pos, K - lams * hi[:, None], np.inf), -1)
    below = xp.min(xp.where(pos, np.inf, K - lams * lo[:, None]), -1)
    above = xp.where(xp.isnan(above), 1.0, xp.minimum(xp.exp(xp.minimum(above, 0.0)), 1.0))
    below = xp.where(xp.isnan(below), 1.0, xp.minimum(xp.exp(xp.minimum(below, 0.0)), 1.0))
    roundoff_rel = 8.0 * _U * (math.log2(n_comp) + xp.sum(counts)) + xp.sum(counts * pmfs.noise_rel)
    prior = roundoff_rel * (2.0 / n_comp) * xp.sum(mag, -1)
    is_up = xp.arange(4) < 2
    nu = xp.max(xp.maximum(-r, 0.0), -1)
    floor = xp.where(is_up, nu, xp.maximum(nu, prior))
    r = xp.where(is_up[:, None], xp.maximum(r, 0.0) + nu[:, None], xp.maximum(r - floor[:, None], 0.0))
    p_inf = -xp.expm1(xp.sum(counts[:, None] * xp.log1p(-xp.minimum(pmfs.p_inf, 1.0 - 1e-16)), 0))
    # Wrapped-in lattice mass of the lower rows: each epoch's bound times its count, times the
    # most mass the other factors can carry.
    sl = xp.sum(counts[:, None] * pmfs.slack, 0)
    below = xp.where(is_up, below, below + sl * xp.exp(sl))
    return Composed(pmf=r, w_lo=w_lo, dx=dx, p_inf=p_inf, tail_above=above, tail_below=below,
                    roundoff_rel=roundoff_rel + xp.zeros(4), noise_floor=floor)


# Chernoff parameters above the tilted window: multiples of the tilt (theta > lam).
_TILT_THETA = np.array([1.05, 1.1, 1.2, 1.35, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0])
# Untilt factors above exp(_UNTILT_MAX) are not used: those bins (far below the tilted mean,
# where the floor would be blown up) are dropped and the curves serve larger eps only.
_UNTILT_MAX = 600.0


def _log_mgf_rows(xp, pmf, y, lam):
    """``log sum_j pmf_j e^{lam y_j}`` for ``pmf``, ``y``: (B, D, N) and ``lam``: (D, L), by a
    max-shifted sum (no overflow; ``-inf`` for an empty row): (B, D, L)."""
    logp = xp.where(pmf > 0, xp.log(xp.where(pmf > 0, pmf, 1.0)), -np.inf)
    out = []
    for i in range(lam.shape[-1]):
        e = logp + lam[None, :, i, None] * y
        top = xp.max(e, -1, keepdims=True)
        top = xp.where(xp.isfinite(top), top, 0.0)
        out.append(top[..., 0] + xp.log(xp.sum(xp.exp(e - top), -1)))
    return xp.stack(out, -1)


def tilted_mean(xp, pmfs: EpochPMFs, counts, dx, lam):
    """Mean of the composed loss under the exponential tilt ``lam`` (4,) of every row:
    ``sum_b c_b E[y e^{lam y}] / E[e^{lam y}]`` (host: picks the tilt, :func:`choose_tilt`)."""
    pmf = pmfs.pmf
    N = pmf.shape[-1]
    y = (pmfs.offsets[..., None] + xp.arange(N)) * dx
    logp = xp.where(pmf > 0, xp.log(xp.where(pmf > 0, pmf, 1.0)), -np.inf)
    e = logp + lam[None, :, None] * y
    top = xp.max(e, -1, keepdims=True)
    w = xp.exp(e - xp.where(xp.isfinite(top), top, 0.0))
    m = xp.sum(w * y, -1) / xp.maximum(xp.sum(w, -1), _TINY)
    return xp.sum(counts[:, None] * m, 0)


def compose_tilted(ops, pmfs: EpochPMFs, counts, dx, log_tau, *, n_comp: int, tilt, tilt_from) -> Composed:
    """:func:`compose_epochs` for small deltas, tilted towards the tail (docs/design.md §12.3).

    The per-bin round-off floor of an FFT composition is relative to the composed PMF's peak
    (about 1e-17 per bin): summed over the bins above epsilon it is more than a delta of 1e-13.
    Every row's PMFs are tilted, ``p~ = p e^{lam y - K_b(lam)}`` (``tilt`` = lam per row),
    composed, and untilted by ``e^{K(lam) - lam y}``: tilting commutes with convolution, and the
    floor, relative to the tilted peak (near the answer), is multiplied by the untilt factor --
    tiny in the tail.  The window is placed below the smallest top ``h`` with ``exp(K(theta) -
    theta h + lam (h - y_v)) <= tau`` (``theta > lam``; ``y_v`` = ``tilt_from``), which bounds the
    mass wrapping from above onto a bin at ``y >= y_v`` after its amplification by the untilt
    (``1{S >= h} e^{lam (S - y)} <= e^{theta (S - h)} e^{lam (h - y_v)}``): added to the upper
    curves, subtracted from the lower ones; mass from below arrives damped by ``e^{-lam n dx}``
    (subtracted from the lower ones; extra mass on the upper ones is harmless).  The curves serve
    ``eps >= valid_from`` (the window's start, ``y_v``, or where the untilt factor passes
    ``e^600``); rows with ``lam <= 0`` have ``valid_from = inf`` (the ordinary pass decides).
    The same rules as dpjax.pld.grid.compose's tilted tail pass (docs/design.md §2.4)."""
    xp = ops.xp
    counts = counts * 1.0
    pmf = pmfs.pmf                                                      # (B, 4, N)
    B, D, N = pmf.shape
    lam = xp.asarray(tilt, dtype=np.float64) + xp.zeros(D)
    y_v = xp.asarray(tilt_from, dtype=np.float64) + xp.zeros(D)
    y = (pmfs.offsets[..., None] + xp.arange(N)) * dx                    # (B, 4, N)
    Kb = _log_mgf_rows(xp, pmf, y, lam[:, None])[..., 0]                 # (B, 4)
    used = counts[:, None] > 0
    bad = xp.any(used & ~xp.isfinite(Kb), 0)                            # (4,)
    Kb = xp.where(xp.isfinite(Kb), Kb, 0.0)
    logp = xp.where(pmf > 0, xp.log(xp.where(pmf > 0, pmf, 1.0)), -np.inf)
    x = logp + lam[None, :, None] * y - Kb[..., None]                    # <= 0 up to rounding
    bad = bad | xp.any(used & xp.any(x > 700.0, -1), 0)
    tilted = xp.where(pmf > 0, xp.exp(xp.minimum(x, 700.0)), 0.0)
    reps = -(-N // n_comp)
    padded = xp.concatenate([tilted, xp.zeros((B, D, reps * n_comp - N))], -1).reshape(B, D, reps, n_comp).sum(2)
    F = xp.fft.rfft(padded, axis=-1)
    c = counts[:, None, None]
    lf, af, _ = _polar(xp, F)
    mag = xp.exp(xp.sum(c * lf, 0))
    angle = xp.sum(c * af, 0)
    circ = xp.fft.irfft(mag * (xp.cos(angle) + 1j * xp.sin(angle)), n_comp, axis=-1)   # (4, n_comp)
    Kt = xp.sum(counts[:, None] * Kb, 0)                                # (4,)
    theta = lam[:, None] * _TILT_THETA[None, :]                          # (4, L)
    Kth = xp.sum(xp.where(c > 0, c * _log_mgf_rows(xp, pmf, y, theta), 0.0), 0)    # (4, L)
    ok = (theta > lam[:, None]) & xp.isfinite(Kth)
    # Window top h: the smallest with exp(K(theta) - theta h + lam (h - y_v)) <= tau.
    h = xp.min(xp.where(ok, (Kth - log_tau - lam[:, None] * y_v[:, None]) / xp.where(ok, theta - lam[:, None], 1.0),
                        np.inf), -1)
    h = xp.clip(xp.where(xp.isfinite(h), h, y_v + n_comp * dx), y_v, y_v + 1e4)
    w_lo = xp.ceil(h / dx).astype(np.int64) - n_comp
    cnt_i = counts.astype(np.int64)
    offset_tot = xp.mod(xp.sum(xp.mod(cnt_i, n_comp)[:, None] * xp.mod(pmfs.offsets, n_comp), 0), n_comp)
    idx = xp.mod(xp.arange(n_comp)[None, :] + (w_lo - offset_tot)[:, None], n_comp)
    r = ops.take_along_axis(circ, idx, axis=-1)
    yw = (w_lo[:, None] + xp.arange(n_comp)[None, :]) * dx               # (4, n_comp)
    hi = (w_lo + n_comp) * dx
    above = xp.min(xp.where(ok, Kth - theta * hi[:, None] + lam[:, None] * (hi - xp.minimum(y_v, hi))[:, None],
                            np.inf), -1)
    above = xp.where(xp.isnan(above), 1.0, xp.minimum(xp.exp(xp.minimum(above, 0.0)), 1.0))
    below = xp.minimum(xp.exp(-lam * n_comp * dx), 1.0)
    pos = lam > 0
    valid_from = xp.maximum(xp.maximum(w_lo * dx, y_v), (Kt - _UNTILT_MAX) / xp.where(pos, lam, 1.0))
    valid_from = xp.where(bad | ~pos, np.inf, valid_from)
    log_s = Kt[:, None] - lam[:, None] * yw
    s_ = xp.where((log_s <= _UNTILT_MAX) & (yw >= valid_from[:, None]),
                  xp.exp(xp.minimum(log_s, _UNTILT_MAX)), 0.0)
    roundoff_rel = 8.0 * _U * (math.log2(n_comp) + xp.sum(counts)) + xp.sum(counts * pmfs.noise_rel)
    prior = roundoff_rel * (2.0 / n_comp) * xp.sum(mag, -1)
    is_up = xp.arange(4) < 2
    nu = xp.max(xp.maximum(-r, 0.0), -1)
    floor = xp.where(is_up, nu, xp.maximum(nu, prior))
    r = xp.where(is_up[:, None], xp.maximum(r, 0.0) + nu[:, None], xp.maximum(r - floor[:, None], 0.0)) * s_
    # Rounding of the tilt (exp of x with an absolute error ~u (|log p| + lam |y| + |K_b|), |log
    # p| <= 745) and of the untilt (Kt carries up to B u sum c_b |K_b|): relative errors of bins.
    ymax = xp.max(xp.abs(y), axis=(0, 2))
    rel_t = 2.0 * _U * xp.sum(counts[:, None] * (lam[None, :] * ymax[None, :] + xp.abs(Kb) + 750.0), 0)
    rel_u = 2.0 * _U * ((B + 1.0) * xp.sum(counts[:, None] * xp.abs(Kb), 0) + lam * xp.max(xp.abs(yw), -1) + 2.0)
    p_inf = -xp.expm1(xp.sum(counts[:, None] * xp.log1p(-xp.minimum(pmfs.p_inf, 1.0 - 1e-16)), 0))
    sl = xp.sum(counts[:, None] * pmfs.slack, 0)
    tail_below = xp.where(is_up, below, xp.minimum(below + above + sl * xp.exp(sl), 1.0))
    return Composed(pmf=r, w_lo=w_lo, dx=dx, p_inf=p_inf, tail_above=above, tail_below=tail_below,
                    roundoff_rel=roundoff_rel + rel_t + rel_u, noise_floor=floor, valid_from=valid_from)


#: 50 halvings of each row's ``[0, hi]``; the lower end (tilted mean still below the target) is kept.
_TILT_BISECTION = HostBisection(safe="lower", max_halvings=50)


def choose_tilt(pmfs: EpochPMFs, counts, dx, comp: Composed, *, target_delta=None, target_epsilon=None,
                lower_hint=0.0):
    """``(tilt, tilt_from)`` (4 floats each) for :func:`compose_tilted`, or None where the ordinary
    composition's round-off floor (per bin ``noise_floor``, over ``n_comp`` bins) is at most 1e-3
    of the delta in question (its target, or the upper delta found at the target epsilon).

    ``tilt_from`` is where the answer is known to lie above: the lower end of ``comp`` (an
    ordinary composition or a :class:`Pair`), or ``lower_hint`` (a certified lower end found
    otherwise) where larger (epsilon queries), or the smallest target epsilon (delta queries); each
    row's ``tilt`` puts its tilted mean there (:func:`tilted_mean`, bisection: the mean grows with
    the tilt), so that the tilted peak sits at the answer.  Host (NumPy) only."""
    base_comp = ordinary(comp)
    n_comp = base_comp.pmf.shape[-1]
    floor_mass = float(np.max(np.asarray(base_comp.noise_floor)[:2])) * n_comp
    with np.errstate(all="ignore"):
        if target_delta is not None:
            d = float(np.min(target_delta))
            vals = np.asarray(eps_of(NUMPY, comp, np.asarray(d)))
            target = max(float(np.max(np.where(np.isnan(vals[2:]), 0.0, vals[2:]))), float(np.min(lower_hint)))
        else:
            target = float(np.min(target_epsilon))
            vals = np.asarray(delta_of(NUMPY, comp, np.asarray(target_epsilon, np.float64)))
            d = float(np.min(np.where(np.isnan(vals[:2]), 1.0, vals[:2])))
    if not floor_mass > 1e-3 * d or not target > 0 or not math.isfinite(target):
        return None
    counts = np.asarray(counts, np.float64)
    with np.errstate(all="ignore"):
        base = tilted_mean(np, pmfs, counts, dx, np.zeros(4))
        lo, hi = np.zeros(4), np.ones(4)
        for _ in range(60):
            grow = tilted_mean(np, pmfs, counts, dx, hi) < target
            if not grow.any() or hi.max() > 1e6:
                break
            hi = np.where(grow, 2.0 * hi, hi)
        lo = _TILT_BISECTION.solve_array(lambda t: tilted_mean(np, pmfs, counts, dx, t) < target, lo, hi,
                                         check_ends=False).root
    lam = np.where(np.isfinite(base) & (base < target), lo, 0.0)
    return tuple(float(v) for v in lam), (target,) * 4


def _curves(ops, comp: Composed):
    """Per row: losses ``y`` (4, n), suffix sums ``A`` (4, n+1) and ``B`` (4, n+1) with
    ``delta(eps) = A_j - e^{eps - y_ref} B_j`` on segment ``[y_j, y_{j+1}]`` (``A``, ``B`` at
    index ``j + 1``), and ``y_ref`` (4,)."""
    xp = ops.xp
    r = comp.pmf
    n = r.shape[-1]
    y = (comp.w_lo[:, None] + xp.arange(n)[None, :]) * comp.dx
    y_ref = (comp.w_lo + n // 2) * comp.dx
    is_up = xp.arange(4) < 2
    # Bins more than 700 nats below the reference would overflow their weight: the upper rows
    # keep them at weight e^700 (B smaller, delta larger: sound), the lower rows drop them
    # (removing mass lowers every hockey stick).  Windows of the planned size never reach them.
    far = (y_ref[:, None] - y) > 700.0
    r = xp.where(far & ~is_up[:, None], 0.0, r)
    w = r * xp.exp(xp.minimum(y_ref[:, None] - y, 700.0))
    const = xp.where(is_up, comp.p_inf + comp.tail_above, comp.p_inf - comp.tail_below)
    fa = xp.where(is_up, 1.0 + comp.roundoff_rel, 1.0 - comp.roundoff_rel)
    fb = xp.where(is_up, 1.0 - comp.roundoff_rel, 1.0 + comp.roundoff_rel)
    zero = xp.zeros((4, 1))
    sa = xp.concatenate([ops.suffix_sum(r), zero], -1)
    sb = xp.concatenate([ops.suffix_sum(w), zero], -1)
    A = sa * fa[:, None] + const[:, None]
    B = sb * fb[:, None]
    return y, A, B, y_ref


def _best_of(ops, a, b):
    """Rows 0, 1 (upper) the smaller of ``a`` and ``b``; rows 2, 3 (lower) the larger."""
    xp = ops.xp
    is_up = (xp.arange(4) < 2).reshape((4,) + (1,) * (a.ndim - 1))
    return xp.where(is_up, xp.minimum(a, b), xp.maximum(a, b))


def _row_query(query):
    """The four rows' answer to ``query(ops, comp, (y, A, B, y_ref), x)`` for targets ``x`` of any
    shape, as (4,) + x.shape: on a :class:`Composed` its curves (:func:`_curves`) and the targets
    flattened to (T,), giving (4, T); on a :class:`Pair` the better of its two parts row by row
    (:func:`_best_of`)."""

    @functools.wraps(query)
    def rows(ops, comp, x):
        if isinstance(comp, Pair):
            return _best_of(ops, rows(ops, comp.ordinary, x), rows(ops, comp.tilted, x))
        out = query(ops, comp, _curves(ops, comp), ops.xp.reshape(x, (-1,)))
        return out.reshape((4,) + ops.xp.shape(x))

    return rows


@_row_query
def delta_of(ops, comp: Composed, curves, e):
    """``delta_of(ops, comp, eps)``: delta of every row at ``eps`` (array of any shape; here
    flattened, ``e``): (4,) + eps.shape, clipped to [0, 1]."""
    xp = ops.xp
    y, A, B, y_ref = curves
    n = y.shape[-1]
    j = xp.clip(xp.floor((e[None, :] - y[:, :1]) / comp.dx).astype(np.int64), -1, n - 1)   # (4, T)
    Aj = xp.take_along_axis(A, j + 1, axis=-1)
    Bj = xp.take_along_axis(B, j + 1, axis=-1)
    d = Aj - xp.exp(xp.minimum(e[None, :] - y_ref[:, None], 700.0)) * Bj
    d = xp.clip(d, 0.0, 1.0)
    bad = ~xp.isfinite(d)
    d = xp.where(bad, xp.where(xp.arange(4)[:, None] < 2, 1.0, 0.0), d)
    if comp.valid_from is not None:
        # Below valid_from the upper curves lack the bins under it: no bound there.
        d = xp.where((xp.arange(4)[:, None] < 2) & (e[None, :] < comp.valid_from[:, None]), 1.0, d)
    return d


@_row_query
def eps_of(ops, comp: Composed, curves, dl):
    """``eps_of(ops, comp, delta)``: smallest ``eps >= 0`` with ``delta_row(eps) <= delta`` for
    every row (``inf`` if none; ``delta`` of any shape, here flattened, ``dl``): (4,) + delta.shape."""
    xp = ops.xp
    y, A, B, y_ref = curves
    n = y.shape[-1]
    Dg = A[:, 1:] - xp.exp(y - y_ref[:, None]) * B[:, 1:]                  # delta(y_j), (4, n)
    k = xp.sum(Dg[:, None, :] > dl[None, :, None], -1)                      # (4, T) in 0..n
    Ak = xp.take_along_axis(A, k, axis=-1)
    Bk = xp.take_along_axis(B, k, axis=-1)
    seg = k - 1
    ok = (Bk > 0) & (Ak - dl[None, :] > 0)
    ratio = xp.where(ok, (Ak - dl[None, :]) / xp.where(ok, Bk, 1.0), 1.0)
    val = y_ref[:, None] + xp.log(ratio)
    lo_end = xp.where(seg >= 0, xp.take_along_axis(y, xp.maximum(seg, 0), axis=-1), -np.inf)
    hi_end = xp.where(seg + 1 <= n - 1, xp.take_along_axis(y, xp.minimum(seg + 1, n - 1), axis=-1), np.inf)
    # Not ok: the curve is at or below delta on the whole segment, which happens only for k = 0
    # (the segment below y_0: delta(y_0) <= delta already).  Then every eps on it qualifies: the
    # lower rows take its lower end (-inf, so 0); y_0 there could lie above the lower curve's
    # true crossing, e.g. a plan evaluated at a smaller sigma whose grid holds almost none of the
    # lower law's mass (the lower end of a bracket must never exceed the truth).  The upper rows
    # keep y_0 (certified, and what they always reported).
    is_up = xp.arange(4)[:, None] < 2
    val = xp.where(ok, xp.clip(val, lo_end, hi_end), xp.where(is_up, hi_end, lo_end))
    val = xp.where(k >= n, np.inf, val)
    val = xp.maximum(val, 0.0)
    broken = ~(xp.isfinite(A[:, :1]) & xp.isfinite(B[:, :1]))
    val = xp.where(broken, xp.where(xp.arange(4)[:, None] < 2, np.inf, 0.0), val)
    if comp.valid_from is not None:
        # The upper curves hold from valid_from on: an answer below it certifies valid_from (the
        # curve is non-increasing, so it is at most the target there too).  The lower curves only
        # lack mass below it: still lower bounds everywhere.
        val = xp.where(is_up, xp.maximum(val, comp.valid_from[:, None]), val)
    return val


# ------------------------------------------------------------------------------------------
# The whole computation for one noise multiplier


class Shape(NamedTuple):
    """Static sizes of a run: ``levels`` bands, lattice window ``n`` (FFT), lattice length ``m``,
    loss grid ``N`` points, composition FFT ``n_comp``."""

    levels: int
    n: int
    m: int
    N: int
    n_comp: int


def run(ops, sigma, block_steps, counts, tau, dx, log_tau, shape: Shape, room=1.0, frozen=None, tilt=(),
        tilt_from=()) -> Composed:
    """Epoch PMFs of every block size (``block_steps``: (B,) steps per block; ``counts``: (B,)
    compositions of each; ``sigma``: one noise multiplier, or a list with one per block),
    composed; with a ``tilt`` (:func:`choose_tilt`) a :class:`Pair` of the ordinary and the
    tilted composition.  ``sigma``, ``tau``, ``dx``, ``log_tau`` may be traced."""
    if ops is NUMPY:
        with np.errstate(all="ignore"):
            return _run(ops, sigma, block_steps, counts, tau, dx, log_tau, shape, room, frozen, tilt, tilt_from)
    return _run(ops, sigma, block_steps, counts, tau, dx, log_tau, shape, room, frozen, tilt, tilt_from)


def _run(ops, sigma, block_steps, counts, tau, dx, log_tau, shape: Shape, room, frozen=None, tilt=(),
         tilt_from=()) -> Composed:
    stacked = epoch_stack(ops, sigma, block_steps, tau, dx, shape, room, frozen)
    if ops is NUMPY:
        _LAST_STACK[:] = [(_stack_key(sigma, block_steps, tau, dx, shape, room), stacked)]
    comp = compose_epochs(ops, stacked, counts, dx, log_tau, n_comp=shape.n_comp)
    if not tilt:
        return comp
    return Pair(comp, compose_tilted(ops, stacked, counts, dx, log_tau, n_comp=shape.n_comp, tilt=tilt,
                                     tilt_from=tilt_from))


# The epoch PMFs of the last host run with their key (the tilted pass composes them again; see
# dpjax.pld.allocation.accountant's planner): :func:`last_stack`.
_LAST_STACK: list = []


def _stack_key(sigma, block_steps, tau, dx, shape, room):
    sig = tuple(float(x) for x in (sigma if isinstance(sigma, (list, tuple)) else [sigma] * len(block_steps)))
    return sig, tuple(float(b) for b in block_steps), float(tau), float(dx), shape, float(room)


def last_stack(sigma, block_steps, tau, dx, shape: Shape, room=1.0):
    """The host :func:`epoch_stack` of these arguments: the last host run's if it had them,
    else computed."""
    key = _stack_key(sigma, block_steps, tau, dx, shape, room)
    if _LAST_STACK and _LAST_STACK[0][0] == key:
        return _LAST_STACK[0][1]
    with np.errstate(all="ignore"):
        return epoch_stack(NUMPY, sigma, block_steps, tau, dx, shape, room)


def epoch_stack(ops, sigma, block_steps, tau, dx, shape: Shape, room=1.0, frozen=None) -> EpochPMFs:
    """:class:`EpochPMFs` of every block (leading block axis): what :func:`run` composes (an
    epsilon-per-epoch curve composes it once per number of epochs)."""
    xp = ops.xp
    frozen = frozen or [(None, None)] * len(block_steps)
    sig = list(sigma) if isinstance(sigma, (list, tuple)) else [sigma] * len(block_steps)
    per = [epoch_pmfs(ops, sig[b], block_steps[b], tau, dx, levels=shape.levels, n=shape.n, m=shape.m, N=shape.N,
                      room=room, geometry=frozen[b][0], offset=frozen[b][1])
           for b in range(len(block_steps))]
    return EpochPMFs(*[xp.stack([getattr(p, f) for p in per]) for f in EpochPMFs._fields])
