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

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dpjax._base import validate as _validate
from dpjax.numerics.root import ImplicitAdjoint, Solution, SolverStats, SolverStatus
from dpjax.montecarlo.calibrate import (BRACKET_RELATIVE, NewtonIllinois, newton_illinois,
                                        value_and_slope)
from dpjax.montecarlo import draws as _draws
from dpjax.montecarlo import gram_sqrt
from dpjax.montecarlo.core import scaled_privacy_losses, delta_from_projections, hockey_stick_terms

__all__ = ["ScreenedDraws", "screened_draws", "calibrate_screened",
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
    y_pq, _ = scaled_privacy_losses(gram, u_p @ scale, sigma, i_p)
    _, y_qp = scaled_privacy_losses(gram, u_q @ scale, sigma, i_q)
    e = jnp.reshape(eps, (1,))
    # Unused slots (v = False) hold a copy of sample 0: masked out, never counted twice.
    sum_pq = jnp.sum(jnp.where(v_p, hockey_stick_terms(y_pq, e)[:, 0], 0.0))
    sum_qp = jnp.sum(jnp.where(v_q, hockey_stick_terms(y_qp, e)[:, 0], 0.0))
    return jnp.maximum(sum_pq, sum_qp) / m


def _delta_full(sigma, theta, consts):
    gram, sqrt_gram, eps = theta
    mode_index, u = consts
    return delta_from_projections(gram, u @ sqrt_gram.T, mode_index, sigma, eps)


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


class _Problem(NamedTuple):
    """One screened solve, as the pieces of :func:`_forward` see it (trace-time container)."""

    solver: NewtonIllinois
    k: int
    theta: tuple  # (gram, sqrt_gram, eps): differentiated
    log_target: jax.Array
    t0: jax.Array
    t_min: jax.Array
    t_max: jax.Array
    draws: ScreenedDraws


def _candidate_consts(draws_: ScreenedDraws, idx_p, v_p, idx_q, v_q):
    """The constants of :func:`_delta_candidates` for candidates ``idx_p``, ``idx_q``."""
    u, mode_index = draws_.u, draws_.mode_index
    return (u[idx_p], mode_index[idx_p], v_p, u[idx_q], mode_index[idx_q], v_q, u.shape[0])


def _solve_on(p: _Problem, st: ScreenState, t_start):
    """Newton/Illinois on the candidates of ``st``: ``(t, t_lo, t_hi, status, passes)``."""
    consts = _candidate_consts(p.draws, st.idx_p, st.v_p, st.idx_q, st.v_q)
    return newton_illinois(value_and_slope(_delta_candidates, p.theta, consts), p.log_target,
                           t_start, p.t_min, p.t_max, p.solver)


def _check(p: _Problem, st: ScreenState, t, status):
    """``True`` when the candidates of ``st`` provably hold every contributing sample at ``t``."""
    gram, sqrt_gram, eps = p.theta
    drift_p, drift_q = _drift(st, gram, sqrt_gram, p.draws.mode_index, p.draws.u_norm, jnp.exp(-t))
    return ((status == int(SolverStatus.CONVERGED)) & jnp.isfinite(t)
            & _excluded_ok(st.y_pq, st.idx_p, st.v_p, drift_p, eps)
            & _excluded_ok(st.y_qp, st.idx_q, st.v_q, drift_q, eps))


def _no_solve(p: _Problem):
    """The solver tuple of "nothing solved yet": the warm start, no bracket, zero passes."""
    inf = jnp.asarray(jnp.inf, jnp.float64)
    return (p.t0, -inf, inf, jnp.asarray(int(SolverStatus.CONVERGED), jnp.int32),
            jnp.zeros((), jnp.int32))


def _try_reuse(p: _Problem, state: ScreenState):
    """0. The previous screen of this sample (a valid ``state``), checked with the bound of
    :func:`_drift` at the current ``(G, L, sigma*)``.  No pass over the ``m x b`` sample.
    Returns ``(solve, reused)``."""
    def reuse():
        sol = _solve_on(p, state, p.t0)
        return sol, _check(p, state, sol[0], sol[3])

    return jax.lax.cond(state.valid, reuse, lambda: (_no_solve(p), jnp.zeros((), bool)))


def _screen_at(p: _Problem, w32, t_start) -> ScreenState:
    """1. The float32 screen at ``sigma_0 = e^t_start`` and its candidates."""
    gram, sqrt_gram, _ = p.theta
    s0 = jnp.exp(-t_start)
    (y_pq, y_qp), (w_max, a_p, _, tol_p, tol_q) = _screen(w32, gram, p.draws.mode_index,
                                                          p.draws.u_norm, s0)
    (ip, vp), (iq, vq) = _select(y_pq, p.k), _select(y_qp, p.k)
    return ScreenState(jnp.ones((), bool), s0, gram, sqrt_gram, y_pq, y_qp, w_max, a_p, tol_p,
                       tol_q, ip, vp, iq, vq)


def _fresh_screens(p: _Problem, state: ScreenState, reuse_solve):
    """1-3. Up to two screens (one traced body): a failed first screen (sigma or C moved further
    than the margin, e.g. right after the sample was refreshed) is repeated at the candidates'
    root, which is close to the full root.  Returns ``(solve, ok, screen)``."""
    w32 = p.draws.u32 @ p.theta[1].astype(jnp.float32).T

    def cond(c):
        return (c[0] < 2) & ~c[2]

    def body(c):
        n_try, sol_prev, _, _ = c
        t_start = jnp.where(jnp.isfinite(sol_prev[0]), sol_prev[0], p.t0)
        st = _screen_at(p, w32, t_start)
        sol = _solve_on(p, st, t_start)
        sol = sol[:4] + (sol_prev[4] + sol[4],)
        return n_try + 1, sol, _check(p, st, sol[0], sol[3]), st

    # Start from the failed reuse's root when there was one (closer than the warm start).
    t_r = reuse_solve[0]
    start = (jnp.where(state.valid & jnp.isfinite(t_r), t_r, p.t0),) + _no_solve(p)[1:4] \
        + (reuse_solve[4],)
    _, sol, ok, st = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), start,
                                                     jnp.zeros((), bool), state))
    return sol, ok, st


def _full_solve(p: _Problem, sol):
    """The fallback: Newton/Illinois on the full float64 estimate, from the candidates' root."""
    gram, sqrt_gram, eps = p.theta
    w = p.draws.u @ sqrt_gram.T
    fn = lambda s, th, c: delta_from_projections(th[0], w, p.draws.mode_index, s, th[2])  # noqa: E731
    t, lo, hi, status, passes = newton_illinois(
        value_and_slope(fn, p.theta, ()), p.log_target,
        jnp.where(jnp.isfinite(sol[0]), sol[0], p.t0), p.t_min, p.t_max, p.solver)
    return t, lo, hi, status, passes + sol[4]


def _forward(cfg, theta, log_target, consts):
    """The screened solve: ``(outputs, aux)`` for :meth:`dpjax.numerics.root.ImplicitAdjoint.apply`.

    ``outputs = (t, t_lo, t_hi, status, passes, screened, reused, new_state)``; ``aux =
    (level index, candidates)``: 0 when the candidates suffice (their estimate equals the full
    one near the root), 1 when the full float64 solve ran.
    """
    solver, k = cfg
    t0, t_min, t_max, draws_, state = consts
    p = _Problem(solver, k, theta, log_target, t0, t_min, t_max, draws_)
    m = draws_.u.shape[0]
    if k >= m:
        # Every sample is a candidate: no screen, and no state to carry over.
        everything = jnp.arange(m, dtype=jnp.int32)
        screen = state._replace(idx_p=everything, v_p=jnp.ones((m,), bool),
                                idx_q=everything, v_q=jnp.ones((m,), bool))
        sol = _solve_on(p, screen, t0)
        ok, reused, new_state = sol[3] == int(SolverStatus.CONVERGED), jnp.zeros((), bool), state
    else:
        reuse_solve, reused = _try_reuse(p, state)
        sol, ok, screen = jax.lax.cond(
            reused, lambda: (reuse_solve, reused, state),
            lambda: _fresh_screens(p, state, reuse_solve))
        new_state = screen
    candidates = (screen.idx_p, screen.v_p, screen.idx_q, screen.v_q)
    sol = jax.lax.cond(ok, lambda: sol, lambda: _full_solve(p, sol))
    return sol + (ok, reused, new_state), (jnp.where(ok, 0, 1).astype(jnp.int32), candidates)


def _log_delta_candidates(t, theta, consts, aux):
    """Level function of a screened solve's root: ``log delta_S(e^t)`` on the candidates."""
    return jnp.log(_delta_candidates(jnp.exp(t), theta, _candidate_consts(consts[3], *aux[1])))


def _log_delta_full(t, theta, consts, aux):
    """Level function of the fallback's root: ``log delta_hat(e^t)`` on the whole sample."""
    draws_ = consts[3]
    return jnp.log(_delta_full(jnp.exp(t), theta, (draws_.mode_index, draws_.u)))


def calibrate_screened(gram, target_epsilon, target_delta, draws_: ScreenedDraws, *,
                       solver: NewtonIllinois = NewtonIllinois(), initial_noise=None,
                       num_candidates: int | None = None) -> Solution:
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
      :class:`~dpjax.calibration.Solution`: ``root`` is ``sigma*`` (float64; differentiable
      in the Gram matrix, eps and delta), ``lower``/``upper`` the last solve's bracket,
      ``stats.num_passes`` the solver passes (candidate passes plus full passes of the
      fallback), ``stats.screened`` ``True`` when the candidates sufficed.  An estimate for
      optimisation, not a certificate.
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
    lo_b, hi_b = BRACKET_RELATIVE[0] * sensitivity, BRACKET_RELATIVE[1] * sensitivity
    t0 = jnp.log(sensitivity if initial_noise is None else
                 jax.lax.stop_gradient(jnp.asarray(initial_noise, jnp.float64)))
    t0 = jnp.clip(t0, jnp.log(lo_b), jnp.log(hi_b))
    sqrt_gram = gram_sqrt(gram)
    # 4. The gradient: the implicit function theorem on the level function that held at the
    #    root (the candidates' estimate, or the full one after a fallback), one reverse pass.
    t, t_lo, t_hi, status, passes, ok, reused, new_state = ImplicitAdjoint().apply(
        functools.partial(_forward, (solver, k)), (_log_delta_candidates, _log_delta_full),
        (gram, sqrt_gram, eps), jnp.log(target),
        (t0, jnp.log(lo_b), jnp.log(hi_b), draws_, state))
    t_lo, t_hi, status, passes, ok, reused, new_state = jax.lax.stop_gradient(
        (t_lo, t_hi, status, passes, ok, reused, new_state))
    res = Solution(jnp.exp(t), jnp.exp(t_lo), jnp.exp(t_hi), status,
                   SolverStats(num_passes=passes, screened=ok))
    return res, new_state, reused


class ScreenedStep(NamedTuple):
    """:func:`calibrate_screened_reusing`'s output: the result, the state for the next call on
    the same sample, and whether this call reused the previous screen (no pass over ``m x b``)."""

    result: Solution
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
