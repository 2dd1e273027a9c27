"""The sweep's per-configuration program: one epsilon query, both discretizations as one batch.

:func:`epsilon_program` computes exactly what the accountant's program does for an epsilon query
(:func:`dpjax.pld.engine.program` with ``want="eps"``: :func:`dpjax.pld.compose.compose_directions`
followed by :func:`dpjax.pld.convert.epsilon` per direction and discretization), with the same
error terms and the same packed output, arranged for a program that runs thousands of
configurations (:mod:`dpjax.pld.sweeping`):

* the pessimistic ("up") and optimistic ("down") PMFs of every direction are one batch of
  ``R = directions x kinds`` rows from the discretization on: one log-MGF, one forward and one
  inverse FFT call, one window placement and one conversion for all rows, instead of a copy of
  that code per discretization (a smaller program: it compiles faster);
* a configuration discretizes its own single-step support, not the bucket's (``support``;
  :func:`_discretize_prefix`: block by block, the same PMFs as a program of its own support);
* the window is read from the circular result with a dynamic slice of the doubled array instead
  of a gather of ``n`` indices (the same values);
* the conversion's weights ``e^{y_ref - y_t}`` are a product of ``n / b + b`` exponentials (block
  start times offset within the block) instead of ``n`` of them; they only depend on ``dx``,
  since ``y_ref - y_t = (n/2 - t) dx``.  Each weight then carries two roundings instead of one,
  far below the certified relative round-off allowance ``roundoff_rel >= 8 u (log2 n + steps)``
  that the conversion applies to the sums of these terms (docs/design.md §2.4).  Its block
  length ``b`` is about ``sqrt(n)`` (:func:`_conversion_block`).

Which end of the bracket a row belongs to is data (a flag per row), so the upper and lower
curves share their code: ``const = p_inf + tail_above + roundoff``, ``fa = 1 + roundoff_rel``,
``fb = 1 - roundoff_rel`` for an upper row; ``const = p_inf - tail_below - roundoff`` and the
opposite factors for a lower row (docs/design.md §2.3).  ``tests/test_sweep.py`` checks the
output against the accountant's program on the same plans.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.pld.compose import UNIT_ROUNDOFF, chernoff_quantiles, pmf_log_mgf, wrap_tails, window_start
from dpjax.pld.convert import segment_epsilon, suffix_sums_small
from dpjax.pld.discretize import FLUSH, materialize_once, grid_pmf

#: Diagnostics after the values, as in :data:`dpjax.pld.engine.DIAGNOSTICS`.
DIAGNOSTICS = ("p_inf", "tail_above", "tail_below", "roundoff", "needed_width", "truncation", "noise_floor",
               "valid_from")


def _cdfs(mech, directions, y, dx):
    """The loss CDFs at ``y`` (D, L) of every direction, materialized (see ``materialize_once``)."""
    if hasattr(mech, "loss_cdfs_directions"):
        return materialize_once(lambda: mech.loss_cdfs_directions(directions, y), dx > 0)
    cdfs = [materialize_once(lambda d=d, yd=yd: mech.loss_cdfs(d, yd), dx > 0) for d, yd in zip(directions, y)]
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *cdfs)


def _discretize(mech, directions, o, dx, m, kinds):
    """(R, m) grid PMFs (rows kind-major: every direction's "up", then every direction's "down"),
    (R, m) grid losses and (D,) ``+inf`` masses of the pessimistic PMFs."""
    y = (o[:, None] + jnp.arange(m)[None, :]) * dx                      # (D, m)
    g = jax.vmap(grid_pmf, in_axes=(0, 0, None))(_cdfs(mech, directions, y, dx), y, dx)
    pmf = jnp.concatenate([g.pmf_up if k == "up" else g.pmf_down for k in kinds], axis=0)
    return pmf, jnp.concatenate([y] * len(kinds), axis=0), g.p_inf_up


#: Block and halo of :func:`_discretize_prefix` (grid points).  ``grid_pmf`` is local: a
#: point's masses depend on the CDFs within 8 points of it (a bin's two ends, then three matching
#: rounds that each reach two atoms further); 16 leaves a margin.
SUPPORT_BLOCK = 1024
SUPPORT_HALO = 16


def _discretize_prefix(mech, directions, o, dx, m, support, kinds):
    """:func:`_discretize` with the configuration's own support ``support`` (traced, <= ``m``):
    the (R, m) PMFs equal those of ``_discretize(..., support)`` on ``[0, support)`` and are 0
    beyond, computed in ``ceil(support / SUPPORT_BLOCK)`` blocks, so the cost follows the
    configuration's support rather than the bucket's.

    Each block evaluates the CDFs on its points and ``SUPPORT_HALO`` more on each side and runs
    ``grid_pmf`` there, keeping the block's own points: their masses only depend on points within
    the halo, so they equal the whole-support computation.  Beyond the support the CDFs are held
    at their value at its last point (``support - 1``): those bins carry no mass, so the PMFs
    there are 0 and the matching of the last real bins is unchanged (an empty neighbour offers
    and takes nothing, as the end of the array does).  ``grid_pmf``'s end terms belong to the
    support's ends: the P-mass below ``y_0`` (added at the first point by the first block, whose
    window starts at 0) and, for the optimistic PMF, the P-mass above the last point, added here
    at ``support - 1`` (a block's own last point is never its window's last).  The ``+inf`` mass
    is ``P(Y > y_{support-1})`` plus the flush allowance of ``support`` points, as for
    ``_discretize``."""
    D, K = len(directions), len(kinds)
    support = jnp.clip(support, 1, m)
    # Blocks tile [0, m) (m is 2^k or 3 * 2^k): the largest power of two <= SUPPORT_BLOCK dividing m.
    B = 1
    while 2 * B <= SUPPORT_BLOCK and m % (2 * B) == 0:
        B *= 2
    H = SUPPORT_HALO
    L = B + 2 * H   # a window's last point always lies in its halo, beyond every point it keeps
    last = support - 1

    def rows_at(j):
        """CDFs (held beyond the support) and grid losses at global indices ``j``."""
        y = (o[:, None] + j[None, :]) * dx
        yc = (o[:, None] + jnp.minimum(j, last)[None, :]) * dx
        return _cdfs(mech, directions, yc, dx), y

    def body(k, state):
        buf, gt_last = state
        s = jnp.maximum(k * B - H, 0)
        c, y = rows_at(s + jnp.arange(L))
        g = jax.vmap(grid_pmf, in_axes=(0, 0, None))(c, y, dx)
        rows = jnp.concatenate([g.pmf_up if kind == "up" else g.pmf_down for kind in kinds], axis=0)
        keep = jax.lax.dynamic_slice_in_dim(rows, k * B - s, B, axis=1)
        # P(Y > y_last) from the block whose window holds the last point (the CDFs are held at
        # their last value beyond it, so any window point at or after it has that value).
        here = jax.lax.dynamic_index_in_dim(c.p_gt, jnp.clip(last - s, 0, L - 1), axis=1, keepdims=False)
        gt_last = jnp.where((s <= last) & (last < s + L), here, gt_last)
        return jax.lax.dynamic_update_slice_in_dim(buf, keep, k * B, axis=1), gt_last

    pmf, gt_last = jax.lax.fori_loop(0, (support + B - 1) // B, body, (jnp.zeros((D * K, m)), jnp.zeros(D)))
    gt_last = jnp.where(gt_last < FLUSH, 0.0, gt_last)                  # (D,) flushed as grid_pmf
    is_down = jnp.asarray(np.repeat([kind == "down" for kind in kinds], D))
    pmf = pmf.at[:, last].add(jnp.where(is_down, jnp.concatenate([gt_last] * K), 0.0))
    p_inf_up = gt_last + 2 * support * FLUSH
    y = (o[:, None] + jnp.arange(m)[None, :]) * dx
    return pmf, jnp.concatenate([y] * K, axis=0), p_inf_up


def _compose(groups_by_direction, dx, lambdas, *, directions, ms, n, kinds, n_freq, support=None):
    """:func:`dpjax.pld.compose.compose_directions` (untilted) on the ``R`` rows at once: the
    accumulated log-modulus and phase of the kept frequencies, log-MGFs, the log of the finite
    mass of the pessimistic PMFs, the bound on the dropped frequencies and the total offset."""
    D, K = len(directions), len(kinds)
    R = D * K
    half = n // 2 + 1
    nf = half if n_freq is None else max(1, min(int(n_freq), half))
    lam_rows = jnp.concatenate([lambdas] * K, axis=0)                   # (R, L)
    carry = dict(logabs=jnp.zeros((R, nf)), angle=jnp.zeros((R, nf)), K=jnp.zeros((R, lambdas.shape[-1])),
                 log_fin=jnp.zeros(D), log_hi=jnp.zeros(R), offset=jnp.zeros(D, jnp.int64), total=jnp.zeros(()))
    for gi, m in enumerate(ms):
        def body(carry, xs, m=m):
            mech, c_int, o = xs
            c = c_int.astype(jnp.float64)
            if support is None:
                pmf, y, p_inf_up = _discretize(mech, directions, o, dx, m, kinds)
            else:
                pmf, y, p_inf_up = _discretize_prefix(mech, directions, o, dx, m, support[gi], kinds)
            K_acc = carry["K"] + jnp.where(c > 0, c * jax.vmap(pmf_log_mgf)(pmf, y, lam_rows), 0.0)
            F = jnp.fft.rfft(pmf, n, axis=-1)
            sq = jnp.real(F) ** 2 + jnp.imag(F) ** 2
            log_hi = (0.5 * jnp.log(jnp.maximum(jnp.max(sq[:, nf:], axis=-1), 1e-300)) if nf < half
                      else jnp.zeros(R))
            F = F[:, :nf]
            off = jnp.mod(carry["offset"] + jnp.mod(c_int, n) * jnp.mod(o, n), n)
            return dict(
                logabs=carry["logabs"] + c * 0.5 * jnp.log(jnp.maximum(sq[:, :nf], 1e-300)),
                angle=carry["angle"] + c * jnp.arctan2(jnp.imag(F), jnp.real(F)),
                K=K_acc,
                log_fin=carry["log_fin"] + jnp.where(c > 0, c * jnp.log1p(-p_inf_up), 0.0),
                log_hi=carry["log_hi"] + jnp.where(c > 0, c * log_hi, 0.0),
                offset=off, total=carry["total"] + c), None

        group = groups_by_direction[0][gi]
        offsets = jnp.stack([jnp.asarray(gd[gi].offsets, jnp.int64) for gd in groups_by_direction], axis=-1)
        xs = (group.mechanism, jnp.asarray(group.counts, jnp.int64), offsets)
        if xs[1].shape[0] == 1:
            carry, _ = body(carry, jax.tree_util.tree_map(lambda a: a[0], xs))
        else:
            carry, _ = jax.lax.scan(body, carry, xs)
    return carry, nf, lam_rows


def _placement(K, lam, log_tau, dx, n):
    """One row's window start ``w_lo`` (centred between the Chernoff quantiles, as
    ``compose_directions``' ``window``), its tail bounds and the width they ask for."""
    l, h = chernoff_quantiles(K, lam, log_tau)
    w_lo = window_start(l, h, dx, n)
    above, below = wrap_tails(K, lam, w_lo, dx, n)
    return w_lo, above, below, h - l


def _floor(r, floor_prior, is_up):
    """The per-bin round-off allowance of ``compose_directions``' ``window`` on a window ``r``."""
    nu = jnp.max(jnp.maximum(-r, 0.0), axis=-1)
    floor = jnp.where(is_up, nu, jnp.maximum(nu, floor_prior))
    r = jnp.where(is_up[:, None], jnp.maximum(r, 0.0) + nu[:, None], jnp.maximum(r - floor[:, None], 0.0))
    return r, floor


def _conversion_block(n: int) -> int:
    """Block length of the conversion: the power of two nearest above sqrt(n) (n a power of two
    or three times one), so that the suffix sums over block totals (``(n/b)^2`` terms) and those
    inside the located block (``b^2`` per target) both stay near ``n``; the accountant's fixed
    256 made the former ``2^20`` terms at ``n = 2^18``."""
    b = 1
    while b * b < n and n % (2 * b) == 0:
        b *= 2
    return b


def _epsilon_row(r, w_lo, dx, const, fa, fb, is_up, delta, weights, start_weights):
    """:func:`dpjax.pld.convert.epsilon` of one row, its bound a flag (see the module docstring).

    ``weights[t] = e^{y_ref - y_t}``, ``start_weights[i] = e^{y_{i b} - y_ref}`` (block starts)."""
    n = r.shape[-1]
    b = _conversion_block(n)
    nb = n // b
    w = r * weights
    rb, wb = r.reshape(nb, b), w.reshape(nb, b)
    s_r = suffix_sums_small(jnp.sum(rb, axis=1))
    s_w = suffix_sums_small(jnp.sum(wb, axis=1))
    D_start = (s_r - rb[:, 0]) * fa + const - start_weights * (s_w - wb[:, 0]) * fb
    flat = delta.reshape(-1)
    blk = jnp.max(jnp.where(D_start[None, :] > flat[:, None], jnp.arange(nb)[None, :], -1), axis=1)
    any_above = blk >= 0
    blk = jnp.maximum(blk, 0)
    start = blk[:, None] * b
    rw = jnp.stack([r, w])[:, start + np.arange(b)[None, :]]                   # (2, K, b)
    nxt = blk + 1
    after = nxt < nb
    nxt = jnp.minimum(nxt, nb - 1)
    t_idx = jax.lax.iota(jnp.int32, b)
    later = t_idx[:, None] > t_idx[None, :]
    sums = jnp.sum(jnp.where(later, rw[..., :, None], 0.0), axis=-2)
    sr = sums[0] + jnp.where(after, s_r[nxt], 0.0)[:, None]
    sw = sums[1] + jnp.where(after, s_w[nxt], 0.0)[:, None]
    y_ref = (w_lo + n // 2) * dx
    eps = segment_epsilon(sr * fa + const, sw * fb, s_r[0] * fa + const, s_w[0] * fb, blk, any_above, start, flat,
                          y_ref, w_lo, dx, n, jnp.where(is_up, jnp.inf, -jnp.inf))
    broken = ~(jnp.isfinite(s_r[0]) & jnp.isfinite(s_w[0]) & jnp.isfinite(const) & jnp.isfinite(fa))
    eps = jnp.where(broken, jnp.where(is_up, jnp.inf, 0.0), eps)
    return jnp.maximum(eps, 0.0).reshape(delta.shape)


def floor_free_target(delta, floor, fa, n):
    """The target at which an upper row's epsilon is a lower bound on the epsilon it would give
    without its round-off allowance: ``delta + nu fa n``.

    The upper curve is ``delta_up(eps) = delta_0(eps) + F(eps)``: ``delta_0`` the same conversion
    of the clipped bins ``max(r, 0)``, ``F`` the per-bin allowance ``nu`` (:func:`_floor`) summed
    over the bins above ``eps`` with weights ``fa - e^{eps - y} fb`` in ``[0, fa]``, so
    ``0 <= F <= nu fa n``.  Where ``delta_0`` meets ``delta``, at ``u0``,
    ``delta_up(u0) <= delta + nu fa n``; ``delta_up`` is non-increasing, so its epsilon at that
    target is at most ``u0``.  The row's answer ``u`` minus that epsilon bounds what any smaller
    round-off floor (the accountant's tilted tail pass) could take off ``u`` on this grid."""
    return delta + floor * fa * n


def epsilon_program(groups, dx, lambdas, log_tau, deltas, support=None, *, directions, ms, n, kinds, n_freq=None,
                    floor_free=False):
    """Certified epsilon of one configuration at ``deltas`` (traceable; the sweep loops it).

    Same arguments and output as :func:`dpjax.pld.engine.program_jit` with ``want="eps"``
    (``groups`` per direction, ``lambdas`` (D, L)): a float64 array ``(directions, kinds,
    targets + len(DIAGNOSTICS))`` of the converted values and the diagnostics.  ``support``
    (optional, traced, one integer per group, at most ``ms``' entries): the configuration's own
    single-step support lengths; the discretization then costs that much
    (:func:`_discretize_prefix`) while the arrays keep the static length, and the result is the
    one of a program with ``ms`` equal to ``support``.  ``floor_free``: one more column at the
    end: per upper row its epsilon at :func:`floor_free_target` of the first target (a lower row
    repeats its value), which bounds how much the round-off allowance costs the row.
    """
    D, K = len(directions), len(kinds)
    ms_common = tuple(max(ms[di][gi] for di in range(D)) for gi in range(len(ms[0])))
    dx = jnp.asarray(dx, jnp.float64)
    lambdas = jnp.asarray(lambdas, jnp.float64)
    carry, nf, lam_rows = _compose(tuple(tuple(g) for g in groups), dx, lambdas, directions=directions,
                                   ms=ms_common, n=n, kinds=kinds, n_freq=n_freq, support=support)
    half = n // 2 + 1
    mag = jnp.exp(carry["logabs"])
    F = mag * (jnp.cos(carry["angle"]) + 1j * jnp.sin(carry["angle"]))
    if nf < half:
        F = jnp.concatenate([F, jnp.zeros((F.shape[0], half - nf), F.dtype)], axis=-1)
        truncation = 2.0 * (half - nf) * jnp.exp(carry["log_hi"])
    else:
        truncation = jnp.zeros(D * K)
    circ = jnp.fft.irfft(F, n, axis=-1)
    w_lo, above, below, width = jax.vmap(_placement, in_axes=(0, 0, None, None, None))(
        carry["K"], lam_rows, log_tau, dx, n)
    offset = jnp.concatenate([carry["offset"]] * K)
    start = jnp.mod(w_lo - offset, n)
    # window[t] = circ[(w_lo + t - offset) mod n]: one dynamic slice of the doubled array per row
    # (the rows unrolled: under vmap the slices would become a gather of n indices, ~20% of the
    # program's time).
    window = jnp.stack([jax.lax.dynamic_slice_in_dim(jnp.concatenate([circ[i], circ[i]]), start[i], n)
                        for i in range(D * K)])
    roundoff_rel = 8.0 * UNIT_ROUNDOFF * (jnp.log2(n) + carry["total"])
    floor_prior = roundoff_rel * (2.0 / n) * jnp.sum(mag, axis=-1)
    is_up = jnp.asarray(np.repeat([k == "up" for k in kinds], D))
    r, floor = _floor(window, floor_prior, is_up)
    roundoff = truncation
    p_inf = jnp.where(is_up, jnp.concatenate([-jnp.expm1(carry["log_fin"])] * K), 0.0)
    const = jnp.where(is_up, p_inf + above + roundoff, p_inf - below - roundoff)
    fa = jnp.where(is_up, 1.0 + roundoff_rel, 1.0 - roundoff_rel)
    fb = jnp.where(is_up, 1.0 - roundoff_rel, 1.0 + roundoff_rel)
    # e^{y_ref - y_t} = e^{(n/2 - t) dx}: block starts times offsets within a block.
    b = _conversion_block(n)
    starts = (n // 2 - jnp.arange(0, n, b)) * dx                          # (n / b,)
    weights = (jnp.exp(starts)[:, None] * jnp.exp(-jnp.arange(b) * dx)[None, :]).reshape(n)
    start_weights = jnp.exp(-starts)
    deltas = jnp.asarray(deltas, jnp.float64)
    diag = [p_inf, above, below, roundoff, width, truncation, floor, jnp.full(D * K, -jnp.inf)]
    if not floor_free:
        value = jax.vmap(_epsilon_row, in_axes=(0, 0, None, 0, 0, 0, 0, None, None, None))(
            r, w_lo, dx, const, fa, fb, is_up, deltas, weights, start_weights)   # (R, *targets)
    else:
        # One more target per row, in the same conversion (the other targets' values are unchanged).
        R, first = D * K, deltas.reshape(-1)[0]
        targets = jnp.concatenate([jnp.broadcast_to(deltas.reshape(-1), (R, deltas.size)),
                                   floor_free_target(first, floor, fa, n)[:, None]], axis=1)
        both = jax.vmap(_epsilon_row, in_axes=(0, 0, None, 0, 0, 0, 0, 0, None, None))(
            r, w_lo, dx, const, fa, fb, is_up, targets, weights, start_weights)
        value = both[:, :deltas.size].reshape((R,) + deltas.shape)
        diag.append(jnp.where(is_up, both[:, -1], both[:, 0]))
    rows = jnp.concatenate([value.reshape(D * K, -1), jnp.stack(diag, axis=1)], axis=1)   # (R, T + 8 [+ 1])
    # (R, ...) kind-major -> (D, K, ...)
    return rows.reshape(K, D, -1).transpose(1, 0, 2)
