"""Screened in-loop calibration: the exact Monte Carlo ``sigma*`` at a fraction of the cost.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix
mechanisms", §4 (Algorithm 2, implicit gradient).  For a fixed sample ``(I_j, U_j)_{j<m}`` the
estimate is ``delta_hat(sigma) = max_dir (1/m) sum_j (1 - exp(eps - Y_j(sigma)))_+`` and only
the samples with ``Y_j(sigma) > eps`` contribute -- at ``delta ~ 1e-5`` a few hundred of
``m = 2^17`` -- to the value, the slope and the gradient.  So:

1. **Screen** (the only work over all ``m x b`` entries): ``W = U L^T`` (``L L^T = G``) and the
   losses ``Y_j(sigma_0)`` of both directions at the warm start ``sigma_0``, in float32 (half
   the memory traffic and twice the SIMD width of float64; this pass only *selects*).
2. **Solve** on the candidates (about ``K / 2`` samples with the largest ``Y_j(sigma_0)`` per
   direction, in ``K`` slots; :func:`_select`), in
   float64: Newton/Illinois (:class:`~dpjax.calibration.NewtonIllinois`) on
   ``delta_S(sigma) = max_dir (1/m) sum_{j in S_dir} (...)_+`` with ``W_S = U_S L^T`` (``K x b``).
3. **Check** that no excluded sample can contribute at the root ``sigma*``.  With
   ``s = 1/sigma`` the logits are ``s^2 a_ji + s W_ji`` (``a_ji = G[I_j, i] - G_ii/2`` for P||Q,
   ``-G_ii/2`` for Q||P) and ``logsumexp`` is 1-Lipschitz in the max norm, so
   ``|Y_j(s*) - Y_j(s_0)| <= |s*^2 - s_0^2| max_i |a_ji| + |s* - s_0| max_i |W_ji|``.  If, for
   every excluded ``j``, ``Y_j(s_0)`` plus that bound plus a float32 round-off allowance stays
   below ``eps``, the excluded terms are exactly zero in a neighbourhood of ``sigma*``:
   ``delta_S = delta_hat`` there, so ``sigma*`` and its implicit gradient are those of the full
   estimate (up to float64 summation order).  Otherwise the screen is repeated once at the new
   ``sigma``, and if that fails too the full float64 solve runs (``lax.cond``: the result is
   never an approximation).
4. **Gradient** by the implicit function theorem (one reverse pass) on the ``K`` candidates only.
5. **Reuse** (:func:`calibrate_screened_reusing`): the next optimisation step on the same sample
   first tries the previous screen's candidates, with the check of 3 extended to the change of
   ``G`` and of its Cholesky factor since that screen (:func:`_drift`); only if it fails does it
   screen again.  A reused step makes no pass over the ``m x b`` sample at all.

The float32 pass never determines a number that is returned: the returned ``sigma*``, its
slope and its gradient are float64 on the candidates (or on the full sample in the fallback).
This is an *estimate* for the optimisation loop; certification uses
:func:`dpjax.optimization.certify.certify_noise` (float64, independent draws, unchanged).

Usage (inside a jitted optimisation step, x64 on)::

    d = screened_draws(key, b, m)                      # once per resampling period
    res = calibrate_screened(gram, eps, delta, d, initial_noise=sigma_prev)
    res.root, res.num_passes, res.screened
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dpjax import _validate
from dpjax._results import ResultMixin
from dpjax._root import SolverStatus
from dpjax.montecarlo.calibrate import (_BRACKET_RELATIVE, NewtonIllinois, _newton_illinois,
                                       _zero_cotangent)
from dpjax.montecarlo import draws as _draws
from dpjax.montecarlo import gram_sqrt
from dpjax.montecarlo.core import _privacy_losses, delta_from_projections, hockey_stick_terms

__all__ = ["ScreenedDraws", "ScreenedResult", "screened_draws", "calibrate_screened",
           "default_num_candidates", "ScreenState", "ScreenedStep", "empty_screen_state",
           "calibrate_screened_reusing"]

#: Float32 round-off allowance of the screening losses, relative to the size of the logits.
#: The float32 matmul ``W = U L^T`` errs by at most ``~b 2^-24 |U_j| |L_i|`` (b = 128 terms:
#: 2^-17) and the logsumexp by a few ulps; 2^-12 leaves a factor >= 32 over that.
_F32_ALLOWANCE = 2.0 ** -12


def default_num_candidates(num_samples: int) -> int:
    """Candidates per direction: ``m / 32`` (at least 256, at most ``m``).

    At ``delta = 1e-5`` and ``m = 2^17`` a few hundred samples contribute; ``K = 4096`` slots
    (about 2048 candidates) leave a
    margin of several units of loss between the largest excluded ``Y_j`` and ``eps``, room for
    ``sigma`` to move between the screen and the root.  Each candidate pass then costs ~3% of
    a full pass.
    """
    return int(min(num_samples, max(256, num_samples // 32)))


class ScreenedDraws(NamedTuple):
    """A Monte Carlo sample prepared for screening (a pytree of arrays).

    ``mode_index`` ``(m,)`` int32, ``u`` ``(m, b)`` float64 (the sampler's stream,
    :func:`dpjax.montecarlo.draws`), ``u32`` its float32 copy (the screen), ``u_norm`` ``(m,)``
    the float64 row norms ``|U_j|_2`` (the round-off allowance).
    """

    mode_index: jax.Array
    u: jax.Array
    u32: jax.Array
    u_norm: jax.Array


def screened_draws(key, batches_per_epoch: int, num_samples: int) -> ScreenedDraws:
    """The first ``num_samples`` draws of ``key``'s stream, with the screen's float32 copy."""
    mode_index, u = _draws(key, batches_per_epoch, num_samples)
    return ScreenedDraws(mode_index, u, u.astype(jnp.float32), jnp.sqrt(jnp.sum(u * u, axis=1)))


class ScreenState(NamedTuple):
    """What a screen leaves behind, so that later calls on the same sample can skip it.

    Everything is relative to the screen point ``(G_0, L_0, s_0 = 1/sigma_0)``: the float32
    losses ``y_pq``, ``y_qp`` ``(m,)`` (NaN already mapped to ``+inf``), the per-sample bound
    data ``w_max = max_i |W_ji|``, ``a_p = max_i |a_ji|`` and the round-off allowances
    ``tol_p``, ``tol_q`` ``(m,)``, the candidates ``idx_p, v_p, idx_q, v_q`` ``(K,)``, and
    ``valid`` (``False``: no screen yet on this sample; :func:`empty_screen_state`).  Only
    valid for the sample it was computed on: reset it when the sample changes.
    """

    valid: jax.Array
    s0: jax.Array
    gram0: jax.Array
    sqrt_gram0: jax.Array
    y_pq: jax.Array
    y_qp: jax.Array
    w_max: jax.Array
    a_p: jax.Array
    tol_p: jax.Array
    tol_q: jax.Array
    idx_p: jax.Array
    v_p: jax.Array
    idx_q: jax.Array
    v_q: jax.Array


def empty_screen_state(num_samples: int, batches_per_epoch: int,
                       num_candidates: int | None = None) -> ScreenState:
    """A :class:`ScreenState` with ``valid = False`` (shapes for ``m`` samples, ``b`` modes, ``K``).

    Raises:
      ValueError: ``num_samples``, ``batches_per_epoch`` or ``num_candidates`` below 1.
    """
    m = _validate.positive_int("num_samples", num_samples)
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    k = _num_candidates(m, num_candidates)
    f = functools.partial(jnp.zeros, dtype=jnp.float64)
    return ScreenState(jnp.zeros((), bool), f(()), f((b, b)), f((b, b)), f((m,)), f((m,)), f((m,)),
                       f((m,)), f((m,)), f((m,)), jnp.zeros((k,), jnp.int32), jnp.zeros((k,), bool),
                       jnp.zeros((k,), jnp.int32), jnp.zeros((k,), bool))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScreenedResult(ResultMixin):
    """Outcome of :func:`calibrate_screened`.

    Attributes:
      root: ``sigma*`` (float64; differentiable in the Gram matrix, eps and delta).
      status: int32 :class:`~dpjax.calibration.SolverStatus`.
      num_passes: int32, solver passes (candidate passes plus full passes of the fallback).
      screened: bool, ``True`` when the candidates sufficed (no full float64 solve).
    """

    root: jax.Array
    status: jax.Array
    num_passes: jax.Array
    screened: jax.Array


# --------------------------------------------------------------------------- pieces


def _screen(w32, gram, mode_index, u_norm, s0):
    """Float32 losses of both directions at ``s0 = 1/sigma_0`` and per-sample bound data."""
    b = gram.shape[0]
    s0_32 = s0.astype(jnp.float32)
    half = (0.5 * jnp.diagonal(gram) * s0 * s0).astype(jnp.float32)
    table = (gram * s0 * s0).astype(jnp.float32)
    logits_q = s0_32 * w32 - half[None, :]
    logits_p = logits_q + jnp.take(table, mode_index, axis=0)

    def lse(x):
        mx = jax.lax.stop_gradient(jnp.max(x, axis=-1))
        return mx + jnp.log(jnp.sum(jnp.exp(x - mx[:, None]), axis=-1))

    log_b = math.log(b)
    y_pq = (lse(logits_p) - log_b).astype(jnp.float64)
    y_qp = (-(lse(logits_q) - log_b)).astype(jnp.float64)
    # NaN (overflow) must never be excluded silently: +inf makes it a candidate or fails the check.
    y_pq = jnp.where(jnp.isnan(y_pq), jnp.inf, y_pq)
    y_qp = jnp.where(jnp.isnan(y_qp), jnp.inf, y_qp)
    w_max = jnp.max(jnp.abs(w32), axis=1).astype(jnp.float64)
    # max_i |a_ji|: P||Q a_ji = G[I_j, i] - G_ii / 2 (per mode, gathered); Q||P a_i = -G_ii / 2.
    diag = jnp.diagonal(gram)
    a_p = jnp.max(jnp.abs(gram - 0.5 * diag[None, :]), axis=1)[mode_index]
    a_q = 0.5 * jnp.max(jnp.abs(diag))
    # Round-off allowance of the float32 losses (see _F32_ALLOWANCE).
    l_norm = jnp.sqrt(jnp.max(jnp.abs(diag)))
    size = 1.0 + s0 * u_norm * l_norm + s0 * s0 * a_p
    tol_p = _F32_ALLOWANCE * (size + jnp.abs(jnp.where(jnp.isfinite(y_pq), y_pq, 0.0)))
    tol_q = _F32_ALLOWANCE * (size + jnp.abs(jnp.where(jnp.isfinite(y_qp), y_qp, 0.0)))
    return (y_pq, y_qp), (w_max, a_p, a_q, tol_p, tol_q)


#: Subsampling stride of the selection threshold (see :func:`_select`).
_SELECT_STRIDE = 16


def _select(y, k):
    """Indices ``(k,)`` and validity mask of (about) the ``k / 2`` largest ``y``.

    A full ``top_k`` over ``m`` losses costs ~6x more than this: the threshold is the
    ``k / (2 r)``-th largest of every ``r``-th loss (iid samples: about ``k / 2`` of all losses
    exceed it, standard deviation ~``r sqrt(k / 2r)``), and the samples at or above it are
    compacted into ``k`` slots.  Which samples are kept never affects correctness, only
    whether the check passes: a sample that does not fit is excluded and checked like any
    other.
    """
    m = y.shape[0]
    r = _SELECT_STRIDE if m >= 4 * _SELECT_STRIDE * k else 1
    rank = max(1, k // (2 * r))
    sub = y[::r]
    thr = jax.lax.top_k(sub, min(rank, sub.shape[0]))[0][-1]
    mask = y >= thr
    (idx,) = jnp.nonzero(mask, size=k, fill_value=0)
    valid = jnp.arange(k) < jnp.sum(mask)
    return idx.astype(jnp.int32), valid


def _excluded_ok(y, idx, valid, drift, eps):
    """``True`` when every sample outside ``idx[valid]`` stays below ``eps`` (``y + drift < eps``)."""
    m = y.shape[0]
    member = jnp.zeros((m,), jnp.int32).at[idx].max(valid.astype(jnp.int32)) > 0
    worst = jnp.max(jnp.where(member, -jnp.inf, y + drift))
    return worst < eps


def _delta_candidates(sigma, theta, consts):
    """``delta_S(sigma)``: the estimate restricted to the candidates (float64)."""
    gram, sqrt_gram, eps = theta
    u_p, i_p, v_p, u_q, i_q, v_q, m = consts
    scale = sqrt_gram.T / sigma
    y_pq, _ = _privacy_losses(gram, u_p @ scale, sigma, i_p)
    _, y_qp = _privacy_losses(gram, u_q @ scale, sigma, i_q)
    e = jnp.reshape(eps, (1,))
    # Unused slots (v = False) hold a copy of sample 0: masked out, never counted twice.
    sum_pq = jnp.sum(jnp.where(v_p, hockey_stick_terms(y_pq, e)[:, 0], 0.0))
    sum_qp = jnp.sum(jnp.where(v_q, hockey_stick_terms(y_qp, e)[:, 0], 0.0))
    return jnp.maximum(sum_pq, sum_qp) / m


def _delta_full(sigma, theta, consts):
    gram, sqrt_gram, eps = theta
    mode_index, u = consts
    return delta_from_projections(gram, u @ sqrt_gram.T, mode_index, sigma, eps)


def _value_and_slope(fn, theta, consts):
    def vs(sigma):
        return jax.jvp(lambda s: fn(s, theta, consts), (sigma,), (jnp.ones_like(sigma),))
    return vs


def _drift(st: ScreenState, gram, sqrt_gram, mode_index, u_norm, s):
    """Per-sample bounds on ``|Y_j(G, L, s) - y_j|`` for both directions, ``y_j`` the screen's.

    The logits are ``s^2 a_ji + s W_ji`` with ``a_ji = G[I_j, i] - G_ii/2`` (P||Q) or
    ``-G_ii/2`` (Q||P) and ``W_ji = U_j . L_i``; from the screen point ``(G_0, L_0, s_0)``
    ``|s^2 a - s_0^2 a_0| <= |s^2 - s_0^2| |a_0| + s^2 |a - a_0|`` and
    ``|s W - s_0 W_0| <= |s - s_0| |W_0| + s |U_j| |L_i - L_0i|_2`` (Cauchy-Schwarz), and
    logsumexp is 1-Lipschitz in the max norm.  At ``G = G_0`` this is the bound of the
    module docstring; the screen's float32 allowance ``tol`` is added.
    """
    s0 = st.s0
    ds2, ds = jnp.abs(s * s - s0 * s0), jnp.abs(s - s0)
    d_gram = gram - st.gram0
    d_diag = jnp.diagonal(d_gram)
    # max_i |dG[k, i] - dG_ii / 2| per mode k, gathered by each sample's mode (P||Q).
    d_a_p = jnp.max(jnp.abs(d_gram - 0.5 * d_diag[None, :]), axis=1)[mode_index]
    d_a_q = 0.5 * jnp.max(jnp.abs(d_diag))
    d_l = jnp.max(jnp.sqrt(jnp.sum((sqrt_gram - st.sqrt_gram0) ** 2, axis=1)))
    a_q = 0.5 * jnp.max(jnp.abs(jnp.diagonal(st.gram0)))
    common = ds * st.w_max + s * u_norm * d_l
    drift_p = ds2 * st.a_p + s * s * d_a_p + common + st.tol_p
    drift_q = ds2 * a_q + s * s * d_a_q + common + st.tol_q
    return drift_p, drift_q


def _forward(cfg, gram, sqrt_gram, eps, log_target, t0, t_min, t_max, draws_, state):
    solver, k = cfg
    mode_index, u, u32, u_norm = draws_
    m = u.shape[0]
    theta = (gram, sqrt_gram, eps)
    converged = int(SolverStatus.CONVERGED)

    def solve_on(st: ScreenState, t_start):
        consts = (u[st.idx_p], mode_index[st.idx_p], st.v_p, u[st.idx_q], mode_index[st.idx_q],
                  st.v_q, m)
        t, _, _, status, passes = _newton_illinois(
            _value_and_slope(_delta_candidates, theta, consts), log_target, t_start, t_min, t_max,
            solver)
        return t, status, passes

    def check(st: ScreenState, t, status):
        drift_p, drift_q = _drift(st, gram, sqrt_gram, mode_index, u_norm, jnp.exp(-t))
        return ((status == converged) & jnp.isfinite(t)
                & _excluded_ok(st.y_pq, st.idx_p, st.v_p, drift_p, eps)
                & _excluded_ok(st.y_qp, st.idx_q, st.v_q, drift_q, eps))

    reused = jnp.zeros((), bool)
    if k >= m:
        everything = jnp.arange(m, dtype=jnp.int32)
        st_all = state._replace(idx_p=everything, v_p=jnp.ones((m,), bool), idx_q=everything,
                                v_q=jnp.ones((m,), bool))
        t, status, passes = solve_on(st_all, t0)
        ok = status == converged
        new_state = state
        idx_p, idx_q = (st_all.idx_p, st_all.v_p), (st_all.idx_q, st_all.v_q)
    else:
        # 0. Reuse: the previous screen of this sample (a valid `state`), checked with the bound
        #    of _drift at the current (G, L, sigma*).  No pass over the m x b sample at all.
        def try_reuse():
            t_r, st_r, p_r = solve_on(state, t0)
            return t_r, st_r, p_r, check(state, t_r, st_r)

        def no_reuse():
            return (t0, jnp.asarray(converged, jnp.int32), jnp.zeros((), jnp.int32),
                    jnp.zeros((), bool))

        t_r, status_r, passes_r, reused = jax.lax.cond(state.valid, try_reuse, no_reuse)

        def fresh():
            # Up to two screens (one traced body): a failed first screen (sigma or C moved
            # further than the margin, e.g. right after the sample was refreshed) is repeated
            # at the candidates' root, which is close to the full root.
            w32 = u32 @ sqrt_gram.astype(jnp.float32).T

            def screen_at(t_start):
                s0 = jnp.exp(-t_start)
                (y_pq, y_qp), (w_max, a_p, _, tol_p, tol_q) = _screen(w32, gram, mode_index, u_norm, s0)
                (ip, vp), (iq, vq) = _select(y_pq, k), _select(y_qp, k)
                return ScreenState(jnp.ones((), bool), s0, gram, sqrt_gram, y_pq, y_qp, w_max, a_p,
                                   tol_p, tol_q, ip, vp, iq, vq)

            def cond(c):
                return (c[0] < 2) & ~c[4]

            def body(c):
                n_try, t_prev, _, passes_prev, _, _ = c
                t_start = jnp.where(jnp.isfinite(t_prev), t_prev, t0)
                st = screen_at(t_start)
                t_a, status_a, p_a = solve_on(st, t_start)
                return (n_try + 1, t_a, status_a, passes_prev + p_a, check(st, t_a, status_a), st)

            # Start from the failed reuse's root when there was one (closer than the warm start).
            t_init = jnp.where(state.valid & jnp.isfinite(t_r), t_r, t0)
            init = (jnp.zeros((), jnp.int32), t_init, jnp.asarray(converged, jnp.int32), passes_r,
                    jnp.zeros((), bool), state)
            _, t_f, status_f, passes_f, ok_f, st_f = jax.lax.while_loop(cond, body, init)
            return t_f, status_f, passes_f, ok_f, st_f

        t, status, passes, ok, new_state = jax.lax.cond(
            reused, lambda: (t_r, status_r, passes_r, reused, state), fresh)
        idx_p, idx_q = (new_state.idx_p, new_state.v_p), (new_state.idx_q, new_state.v_q)

    def full():
        w = u @ sqrt_gram.T
        tf, _, _, sf, pf = _newton_illinois(
            _value_and_slope(lambda s, th, c: delta_from_projections(th[0], w, mode_index, s, th[2]),
                             theta, ()),
            log_target, jnp.where(jnp.isfinite(t), t, t0), t_min, t_max, solver)
        return tf, sf, pf + passes

    t, status, passes = jax.lax.cond(ok, lambda: (t, status, passes), full)
    return (t, status, passes, ok, reused, new_state), (idx_p, idx_q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _screened_root(cfg, gram, sqrt_gram, eps, log_target, t0, t_min, t_max, draws_, state):
    return _forward(cfg, gram, sqrt_gram, eps, log_target, t0, t_min, t_max, draws_, state)[0]


def _screened_root_fwd(cfg, gram, sqrt_gram, eps, log_target, t0, t_min, t_max, draws_, state):
    out, (idx_p, idx_q) = _forward(cfg, gram, sqrt_gram, eps, log_target, t0, t_min, t_max, draws_,
                                   state)
    return out, (out[0], out[3], idx_p, idx_q, gram, sqrt_gram, eps, log_target, t0, t_min, t_max,
                 draws_, state)


def _screened_root_bwd(cfg, residuals, cotangents):
    (t_root, ok, idx_p, idx_q, gram, sqrt_gram, eps, log_target, t0, t_min, t_max,
     draws_, state) = residuals
    mode_index, u, _, _ = draws_
    m = u.shape[0]
    t_bar = cotangents[0]
    sigma = jnp.exp(t_root)
    theta = (gram, sqrt_gram, eps)

    def vjp_of(fn, consts):
        # Implicit function theorem (Choquette-Choo et al. 2024, §4.2), one reverse pass:
        # d t*/d theta = -(d delta/d theta) / (sigma d delta/d sigma).
        d, vjp = jax.vjp(lambda s, th: fn(s, th, consts), sigma, theta)
        f_sigma, f_theta = vjp(jnp.ones_like(d))
        return d, f_sigma, f_theta

    def on_candidates():
        (ip, vp), (iq, vq) = idx_p, idx_q
        return vjp_of(_delta_candidates, (u[ip], mode_index[ip], vp, u[iq], mode_index[iq], vq, m))

    def on_full():
        return vjp_of(_delta_full, (mode_index, u))

    d, f_sigma, f_theta = jax.lax.cond(ok, on_candidates, on_full)
    w = t_bar / (sigma * f_sigma)
    g_bar, l_bar, e_bar = jax.tree_util.tree_map(lambda x: -w * x, f_theta)
    draws_bar = jax.tree_util.tree_map(_zero_cotangent, draws_)
    state_bar = jax.tree_util.tree_map(_zero_cotangent, state)
    return (g_bar, l_bar, e_bar, jnp.asarray(w * d, jnp.result_type(log_target)),
            jnp.zeros_like(t0), jnp.zeros_like(t_min), jnp.zeros_like(t_max), draws_bar, state_bar)


_screened_root.defvjp(_screened_root_fwd, _screened_root_bwd)


def calibrate_screened(gram, target_epsilon, target_delta, draws_: ScreenedDraws, *,
                       solver: NewtonIllinois = NewtonIllinois(), initial_noise=None,
                       num_candidates: int | None = None) -> ScreenedResult:
    """Jittable, differentiable ``sigma*`` with ``delta_hat(sigma*; G) = target_delta``.

    The same root and implicit gradient as
    :func:`dpjax.calibration.calibrate_on_draws` with ``draws_=(mode_index, u)`` (the full
    float64 estimate on the same sample), computed on ``num_candidates`` screened samples per
    direction (see the module docstring for why that is exact, and the fallback when it is
    not).

    Args:
      gram: ``(b, b)`` Gram matrix of the modes (float64); gradients flow to it.
      target_epsilon, target_delta: scalars (differentiable).
      draws_: :func:`screened_draws` (``m`` samples).
      solver: :class:`~dpjax.calibration.NewtonIllinois`.
      initial_noise: warm start ``sigma_0`` (default: the sensitivity ``max_i |m_i|``); the
        screen is evaluated there, so a good warm start (the previous step's sigma) is what
        makes the candidates suffice.
      num_candidates: static ``K`` per direction (default :func:`default_num_candidates`).

    Returns:
      :class:`ScreenedResult`.  An estimate for optimisation, not a certificate.
    """
    m = draws_.u.shape[0]
    k = _num_candidates(m, num_candidates)
    res, _, _ = _calibrate(gram, target_epsilon, target_delta, draws_, solver, initial_noise, k,
                           empty_screen_state(m, draws_.u.shape[1], k))
    return res


def _num_candidates(m, num_candidates):
    k = default_num_candidates(m) if num_candidates is None else int(min(num_candidates, m))
    if k < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
    return k


def _calibrate(gram, target_epsilon, target_delta, draws_, solver, initial_noise, k, state):
    gram = jnp.asarray(gram, jnp.float64)
    if not isinstance(solver, NewtonIllinois):
        raise ValueError(f"solver must be NewtonIllinois(...), got {solver!r}")
    eps = jnp.asarray(target_epsilon, jnp.float64)
    target = jnp.asarray(target_delta, jnp.float64)
    sensitivity = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.diagonal(gram))))
    lo_b, hi_b = _BRACKET_RELATIVE[0] * sensitivity, _BRACKET_RELATIVE[1] * sensitivity
    t0 = jnp.log(sensitivity if initial_noise is None else
                 jax.lax.stop_gradient(jnp.asarray(initial_noise, jnp.float64)))
    t0 = jnp.clip(t0, jnp.log(lo_b), jnp.log(hi_b))
    sqrt_gram = gram_sqrt(gram)
    t, status, passes, ok, reused, new_state = _screened_root(
        (solver, k), gram, sqrt_gram, eps, jnp.log(target), t0, jnp.log(lo_b), jnp.log(hi_b),
        draws_, state)
    status, passes, ok, reused, new_state = jax.lax.stop_gradient(
        (status, passes, ok, reused, new_state))
    return ScreenedResult(jnp.exp(t), status, passes, ok), new_state, reused


class ScreenedStep(NamedTuple):
    """:func:`calibrate_screened_reusing`'s output: the result, the state for the next call on
    the same sample, and whether this call reused the previous screen (no pass over ``m x b``)."""

    result: ScreenedResult
    state: ScreenState
    reused: jax.Array


def calibrate_screened_reusing(gram, target_epsilon, target_delta, draws_: ScreenedDraws,
                               state: ScreenState, *, solver: NewtonIllinois = NewtonIllinois(),
                               initial_noise=None, num_candidates: int | None = None) -> ScreenedStep:
    """:func:`calibrate_screened` that reuses the previous call's screen when it provably holds.

    Consecutive optimisation steps on one sample move ``(C, sigma*)`` a little.  The screen of
    an earlier call (``state``, relative to its point ``(G_0, L_0, sigma_0)``) still selects
    every contributing sample if each excluded sample's loss stays below ``eps`` by the bound
    of :func:`_drift` (the module docstring's bound plus the change of ``G`` and of its
    Cholesky factor ``L``).  Then the float32 matmul, the screen and the selection are skipped
    and only the candidates are solved; otherwise the call screens afresh (and falls back to
    the full float64 solve as :func:`calibrate_screened` does).  Either way the root and the
    implicit gradient are those of the full estimate on this sample (up to float64 summation
    order): the reuse is a shortcut, never an approximation.

    Takes the arguments of :func:`calibrate_screened`, plus ``state``.

    Args:
      state: :func:`empty_screen_state` for the first call on a sample, then the previous
        call's ``ScreenedStep.state`` (reset it when the sample changes: a state is only valid
        for the sample it was computed on).

    Returns:
      :class:`ScreenedStep` ``(result, state, reused)``.
    """
    m = draws_.u.shape[0]
    k = _num_candidates(m, num_candidates)
    if state.idx_p.shape != (k,) or state.y_pq.shape != (m,):
        raise ValueError(f"state: shapes for K = {state.idx_p.shape[0]} candidates and "
                         f"{state.y_pq.shape[0]} samples, expected K = {k} and {m} "
                         "(empty_screen_state(num_samples, batches_per_epoch, num_candidates))")
    return ScreenedStep(*_calibrate(gram, target_epsilon, target_delta, draws_, solver,
                                    initial_noise, k, state))
