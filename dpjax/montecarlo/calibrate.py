"""Noise calibration on a Monte Carlo estimate: the solvers behind the calibration layer.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near Exact Privacy Amplification for Matrix
Mechanisms" (2024), §4.1, Alg. 2.  For a Gram matrix ``G`` of the modes and a fixed Monte Carlo
sample (common random numbers from ``key``), the estimate ``delta_hat(sigma; G)`` of
:func:`dpjax.montecarlo.delta_estimate` (max over the two directions) is a deterministic,
continuous, decreasing function of ``sigma``; the calibrated noise multiplier is the smallest
``sigma`` with ``delta_hat(sigma; G) <= target_delta`` at ``target_epsilon``, differentiable in
``G`` by the implicit function theorem (:mod:`dpjax.numerics.root`).

* :func:`calibrated_noise_core` -- fixed-length bisection in ``log sigma`` (jittable);
* :func:`calibrate_accountant` -- the implementation of ``BallsInBins.calibrate``;
* :class:`NewtonIllinois`, :class:`Bisection`, :func:`calibrate_on_draws` -- the in-loop solver
  (a warm-started safeguarded Newton iteration: 2-4 passes over the sample instead of 50), used
  by Estimate-Verify-Release (:mod:`dpjax.montecarlo.evr`) and the optimisation loop.

This module is part of the Monte Carlo layer so that :class:`~dpjax.montecarlo.BallsInBins` and
:mod:`dpjax.montecarlo.evr` can calibrate without importing the calibration layer; the public
import path of every name here is :mod:`dpjax.calibration` (:mod:`dpjax.calibration.montecarlo`
re-exports them next to the differentiable :func:`dpjax.calibration.calibrated_noise`, whose
module documents the method and its cost).

Cost.  The draws ``U`` ``(m, b)`` and ``W = U L^T`` (``L L^T = G``) do not depend on ``sigma``,
so they are computed once per calibration, outside the solver loop, and so are the variance-reduced
estimate's sample means (``(m, b)``, the mixture components' means of the sampled modes); each pass
is one ``logsumexp`` over ``(m, b)`` logits per term.  The Monte Carlo sums sit behind optimization
barriers (:mod:`dpjax.montecarlo._spread`), which keep XLA from moving sigma-free work out of the
solver loop itself.  Above ``MAX_PRECOMPUTED`` entries ``m * b`` every pass
instead calls the chunked :func:`dpjax.montecarlo.delta_estimate` (bounded memory, same
numbers, slower).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax.numerics.root import (ImplicitAdjoint, Solution, SolverStats, SolverStatus, StopGradientAdjoint,
                                 solve_monotone_root)
from dpjax._base.x64 import float64
from dpjax.montecarlo import _spread
from dpjax.montecarlo.core import (as_prng_key, gram_sqrt, hockey_stick_terms, privacy_losses_from_projections,
                                   rbg_key)

__all__ = [
    "calibrated_noise_core",
    "calibrate_accountant",
    "estimate_minimum_samples",
    "DEFAULT_NUM_ITERATIONS",
    "Bisection",
    "NewtonIllinois",
    "calibrate_on_draws",
    "DrawPlan",
    "raise_on_status",
    "BRACKET_RELATIVE",
    "newton_illinois",
    "value_and_slope",
    "MAX_PRECOMPUTED",
]

#: Bisection length: 50 halvings of log(1e7) -> relative bracket width 1.4e-14.
DEFAULT_NUM_ITERATIONS = 50
#: Search range for sigma, relative to the l2-sensitivity max_i |m_i|_2 of the mechanism:
#: amplification only lowers sigma below the unamplified Gaussian one, which for any
#: eps >= 1e-3, delta >= 1e-300 is < 1e4 * sensitivity; 1e-3 * sensitivity makes
#: delta_hat ~ 1 for any eps <~ 1e5.
BRACKET_RELATIVE = (1e-3, 1e4)
#: Largest m * b (float64 entries) for which the projections W are materialised (128 MiB; as
#: much again for the variance-reduced estimate's sample means).
MAX_PRECOMPUTED = 1 << 24


def estimate_minimum_samples(target_delta: float) -> int:
    """Fewest Monte Carlo samples a calibration accepts for ``target_delta``: ``ceil(1 / delta)``.

    An estimate of delta from ``m`` samples cannot resolve deltas below ~1/m (a single sample
    contributes up to 1/m).  This is a floor for the *estimate*; certifying with
    Estimate-Verify-Release needs more (:func:`dpjax.montecarlo.evr_minimum_samples`).
    """
    return int(math.ceil(1.0 / float(target_delta)))


def calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples: int, *,
                          num_iterations: int = DEFAULT_NUM_ITERATIONS,
                          adjoint=ImplicitAdjoint(), precompute: bool | None = None, devices=None) -> Solution:
    """Jittable core: ``sigma*`` with ``delta_hat(sigma*; G) = target_delta`` (safe side).

    Args:
      gram: ``(b, b)`` Gram matrix (:func:`dpjax.montecarlo.gram_matrix`); gradients flow to it (and to whatever
        produced it) through ``adjoint``.
      target_epsilon, target_delta: scalars (differentiable).
      key: PRNG key of the common random numbers.
      num_samples: static ``m``.
      num_iterations: static bisection length.
      precompute: materialise ``W`` (default: when ``m * b <= 2^24``).
      devices: the devices the sample is spread over (default: all; see
        :func:`calibrate_on_draws`).

    Returns:
      :class:`~dpjax.calibration.Solution` (``root`` is the upper end of the final
      bracket: ``delta_hat(root) <= target_delta``).
    """
    plan = DrawPlan(key=key, num_samples=num_samples, precompute=precompute, devices=devices)
    return calibrate_on_draws(gram, target_epsilon, target_delta, plan, solver=Bisection(num_iterations),
                              adjoint=adjoint)


def raise_on_status(res: Solution, target_epsilon, target_delta):
    """``ValueError`` naming the target when a calibration did not converge (unreachable target,
    or one already met at the bottom of the search range); nothing when it did."""
    status = int(res.status)
    if status == SolverStatus.UNREACHABLE:
        raise ValueError(
            f"target (epsilon={float(target_epsilon):g}, delta={float(target_delta):g}) is "
            f"not reached by any noise multiplier up to {BRACKET_RELATIVE[1]:g} x "
            "sensitivity; increase target_epsilon or target_delta")
    if status == SolverStatus.MET_AT_BRACKET_END:
        raise ValueError(
            f"target (epsilon={float(target_epsilon):g}, delta={float(target_delta):g}) is met "
            f"even at noise multiplier {float(res.root):g} = {BRACKET_RELATIVE[0]:g} x "
            "sensitivity (the bottom of the search range): the target is vacuous; lower "
            "target_epsilon")


@functools.partial(jax.jit, static_argnums=(4, 5))
def _calibrate_gram_jit(gram, target_epsilon, target_delta, key, num_samples, num_iterations):
    return calibrated_noise_core(gram, target_epsilon, target_delta, key, num_samples,
                                 num_iterations=num_iterations, adjoint=StopGradientAdjoint())


@float64
def calibrate_accountant(accountant, target_epsilon, target_delta, num_samples, key, *,
                         num_iterations: int = DEFAULT_NUM_ITERATIONS) -> float:
    """Noise multiplier calibrated on the estimate of a :class:`~dpjax.montecarlo.BallsInBins`.

    The implementation of ``BallsInBins.calibrate``: ``delta_hat(sigma) = target_delta`` at
    ``target_epsilon`` with ``num_samples`` common random numbers from ``key`` (JAX key or int
    seed), solved to ~1e-14 relative; the upper end of the final bracket is returned.  The
    same draws as ``accountant.delta(sigma, target_epsilon, num_samples, key)``, so that call
    at the returned sigma gives ``<= target_delta``.  An estimate, not a certificate: follow
    with ``accountant.certify(sigma, ...)`` (more samples, and ``target_delta`` above the
    calibration delta to leave room for the Estimate-Verify-Release slack).

    Raises:
      ValueError: bad input; ``num_samples < ceil(1/target_delta)`` (says the minimum);
        unreachable or vacuous targets.
    """
    m = _validate.positive_int("num_samples", num_samples)
    # Estimate mode: any m >= 1 is accepted.  With m < 1/delta the hockey-stick terms are still
    # continuous in sigma, so delta_hat(sigma) = target_delta has a solution; it is a noisy
    # estimate (Choquette-Choo et al. 2024, §5.1.4 optimise with ~2^9 samples per step).  Only
    # certification (Estimate-Verify-Release) demands enough samples.
    _validate.PrivacyTarget(target_epsilon, target_delta)
    res = _calibrate_gram_jit(jnp.asarray(accountant.gram, jnp.float64),
                              float(target_epsilon), float(target_delta), as_prng_key(key), m,
                              num_iterations)
    raise_on_status(res, target_epsilon, target_delta)
    return float(res.root)


# --------------------------------------------------------------------------- Newton / Illinois
#
# The in-loop solver (Choquette-Choo et al. 2024, §4, Alg. 2 spends 50 bisection passes over the
# sample per optimisation step; a warm-started Newton iteration needs 2-4).  With common random
# numbers, delta_hat(sigma) is a smooth (piecewise C^1: a sample's term has a kink where its loss
# crosses epsilon, invisible at m >~ 100), decreasing function of sigma, and log delta_hat is
# nearly linear in log sigma over the range a step moves.  One forward-mode pass (jax.jvp)
# gives delta_hat and d delta_hat/d sigma together, so each Newton step is one pass.


@dataclasses.dataclass(frozen=True)
class Bisection:
    """Fixed-length bisection in ``log sigma`` (the paper's Algorithm 2 as written).

    ``num_iterations`` passes over the sample; robust, no warm start.  The root is the upper
    (feasible) end of the final bracket.
    """

    num_iterations: int = DEFAULT_NUM_ITERATIONS


@dataclasses.dataclass(frozen=True)
class NewtonIllinois:
    """Safeguarded Newton iteration on ``g(t) = log delta_hat(e^t) - log target_delta``.

    ``t = log sigma``.  Each step is one pass over the sample (``jax.jvp`` gives the value and
    the slope together).  Every evaluated point updates a bracket ``[lo, hi]`` (``g(lo) > 0 >=
    g(hi)``); a Newton point outside the bracket (or undefined: ``delta_hat = 0``, a
    non-negative slope) is replaced by the Illinois secant of the bracket ends (the value kept
    at an end that survives twice is halved) or, without a two-sided bracket yet, by a step of
    ``max_log_step`` towards the root.  Newton steps are also clipped to ``max_log_step``.

    Attributes:
      max_steps: static cap on passes (each pass is one Newton/Illinois step).
      xtol: stop when the step in ``log sigma`` is below this (relative accuracy of sigma; the
        error after the last quadratic step is ~``step^2``).
      max_log_step: largest step in ``log sigma`` (``log 4`` by default).

    Warm start: ``initial_noise`` of :func:`calibrate_on_draws` (the previous optimisation
    step's sigma); from within a few percent of the root 2-4 passes reach ``xtol = 1e-12``.
    """

    max_steps: int = 40
    xtol: float = 1e-12
    max_log_step: float = math.log(4.0)


def newton_illinois(value_and_slope, log_target, t0, t_min, t_max, solver: NewtonIllinois):
    """Raw safeguarded Newton/Illinois loop in ``t = log sigma``; see :class:`NewtonIllinois`.

    ``value_and_slope(sigma) -> (delta, d delta / d sigma)``.  Returns
    ``(t_root, t_lo, t_hi, status, passes)``.
    """
    inf = jnp.asarray(jnp.inf, jnp.float64)
    step_cap = solver.max_log_step

    def cond(state):
        return (state["k"] < solver.max_steps) & ~state["done"]

    def body(state):
        t = state["t"]
        sigma = jnp.exp(t)
        d, dd = value_and_slope(sigma)
        g = jnp.log(d) - log_target  # -inf at d = 0; NaN d is infeasible (conservative)
        feasible = d <= jnp.exp(log_target)
        lo = jnp.where(feasible, state["lo"], jnp.maximum(state["lo"], t))
        hi = jnp.where(feasible, jnp.minimum(state["hi"], t), state["hi"])
        # Illinois bookkeeping: g at the bracket ends; an end kept twice has its g halved.
        g_lo = jnp.where(feasible, jnp.where(state["last"] == 1, 0.5 * state["g_lo"], state["g_lo"]), g)
        g_hi = jnp.where(feasible, g, jnp.where(state["last"] == -1, 0.5 * state["g_hi"], state["g_hi"]))
        last = jnp.where(feasible, 1, -1).astype(jnp.int32)
        slope = dd * sigma / d  # d log delta / d log sigma, < 0
        newton = t - jnp.clip(g / slope, -step_cap, step_cap)
        bracketed = jnp.isfinite(lo) & jnp.isfinite(hi)
        # A Newton step below xtol is taken even where it does not land strictly inside the
        # bracket: started at the root, g is round-off (|g| ~ 1e-15) and t - g/slope can round to
        # t itself, which is then a bracket end; the safeguard would otherwise send the next point
        # max_log_step away and spend ~10 passes coming back.
        newton_ok = jnp.isfinite(newton) & (slope < 0) & (
            ((newton > lo) & (newton < hi)) | (jnp.abs(newton - t) <= solver.xtol))
        secant = hi - g_hi * (hi - lo) / (g_hi - g_lo)
        secant_ok = bracketed & jnp.isfinite(secant) & (secant > lo) & (secant < hi)
        fallback = jnp.where(secant_ok, secant,
                             jnp.where(bracketed, 0.5 * (lo + hi),
                                       jnp.where(feasible, t - step_cap, t + step_cap)))
        t_new = jnp.clip(jnp.where(newton_ok, newton, fallback), t_min, t_max)
        step = jnp.abs(t_new - t)
        at_top = (t >= t_max) & ~feasible
        at_bottom = (t <= t_min) & feasible
        # Quadratic regime (a Newton step at least 10x shorter than the previous one): the error
        # of t_new is ~step^2, so accept it once 100 step^2 <= xtol instead of paying one more
        # pass to see a step below xtol.
        quadratic = newton_ok & state["prev_newton"] & (step <= 0.1 * state["prev_step"])
        converged = ((step <= solver.xtol) | (quadratic & (100.0 * step * step <= solver.xtol))
                     | (bracketed & (hi - lo <= solver.xtol)))
        status = jnp.where(at_top, int(SolverStatus.UNREACHABLE),
                           jnp.where(at_bottom, int(SolverStatus.MET_AT_BRACKET_END),
                                     int(SolverStatus.CONVERGED))).astype(jnp.int32)
        done = converged | at_top | at_bottom
        return dict(t=jnp.where(done & ~converged, t, t_new), lo=lo, hi=hi, g_lo=g_lo, g_hi=g_hi,
                    last=last, k=state["k"] + 1, done=done, status=status, prev_step=step,
                    prev_newton=newton_ok)

    t0 = jnp.clip(jnp.asarray(t0, jnp.float64), t_min, t_max)
    init = dict(t=t0, lo=-inf, hi=inf, g_lo=inf, g_hi=-inf, last=jnp.zeros((), jnp.int32),
                k=jnp.zeros((), jnp.int32), done=jnp.zeros((), bool),
                status=jnp.asarray(int(SolverStatus.CONVERGED), jnp.int32), prev_step=inf,
                prev_newton=jnp.zeros((), bool))
    out = jax.lax.while_loop(cond, body, init)
    # Not converged within max_steps: answer the feasible end if there is one (safe side).
    status = jnp.where(out["done"], out["status"], int(SolverStatus.CONVERGED)).astype(jnp.int32)
    t_root = jnp.where(out["done"] | ~jnp.isfinite(out["hi"]), out["t"], out["hi"])
    t_root = jnp.where(status == int(SolverStatus.UNREACHABLE), jnp.nan, t_root)
    return t_root, out["lo"], out["hi"], status, out["k"]


def value_and_slope(fn, theta, consts):
    """``sigma -> (fn(sigma, theta, consts), d fn / d sigma)`` in one forward-mode pass."""
    def vs(sigma):
        return jax.jvp(lambda s: fn(s, theta, consts), (sigma,), (jnp.ones_like(sigma),))
    return vs


#: Largest ``rows * b`` (float64 entries) of one chunk of a calibration on materialised draws:
#: a pass holds about two dozen ``(rows, b)`` temporaries per proposal component, so a chunk
#: keeps them at about 12 MiB at ``b = 8`` instead of the whole sample's (185 MiB for ``2^17``
#: samples at ``b = 8``).
_SUMMAND_SLICE_ENTRIES = 1 << 16
#: Fewest samples in one chunk of a calibration on materialised draws.
_MIN_CHUNK_ROWS = 256


def _chunk_rows(num_samples: int, b: int) -> int:
    """Samples per chunk of a calibration on materialised draws: a power of two, at least
    :data:`_MIN_CHUNK_ROWS`, as many as :data:`_SUMMAND_SLICE_ENTRIES` allows (``2^16 / b``) and
    no more than the sample needs.  Each chunk is one iteration of a loop behind optimization
    barriers, whose fixed cost (tens of microseconds on a CPU) dominated small problems when
    chunks were cut to ``num_samples / 16``; large samples still give every device many chunks.
    A function of ``(m, b)`` only, never of the devices: the chunks, and so the sums, are the
    same on every layout."""
    cap = max(_MIN_CHUNK_ROWS, _SUMMAND_SLICE_ENTRIES // max(b, 1))
    cap = 1 << (cap.bit_length() - 1)
    rows = max(_MIN_CHUNK_ROWS, 1 << max(num_samples - 1, 0).bit_length())
    return min(rows, cap)


def _mean_totals(totals, num_samples, scale):
    """The estimate from per-direction sums ``(2,)``: ``max_d scale_d total_d / m``."""
    mean = totals * (1.0 / num_samples)
    return jnp.maximum(scale[0] * mean[0], scale[1] * mean[1])


def _valid_sum(x, valid):
    return jnp.sum(jnp.where(valid, x, 0.0))


def _plain_chunk(c, diff, const, local, differentiable, *, num_samples, rows):
    """Per-direction sums ``(2,)`` of the hockey-stick terms of chunk ``c`` of materialised draws.
    ``differentiable``: the projections from ``U L^T`` (the VJP's pass) instead of the stored ones."""
    sigma, gram, sqrt_gram, eps = diff
    mode_index, u, w = local
    proj = u @ sqrt_gram.T if differentiable else w
    y_pq, y_qp = privacy_losses_from_projections(gram, proj, sigma, mode_index)
    valid = (c * rows + jnp.arange(rows)) < num_samples
    e = jnp.reshape(eps, (1,))
    return jnp.stack([_valid_sum(hockey_stick_terms(y_pq, e)[:, 0], valid),
                      _valid_sum(hockey_stick_terms(y_qp, e)[:, 0], valid)])


def _importance_chunk(c, diff, const, local, differentiable, *, num_samples, rows):
    """Per-direction sums ``(2,)`` of the variance-reduced summands of chunk ``c`` of
    materialised draws (see :func:`_plain_chunk`)."""
    from dpjax.montecarlo.importance import _summands

    sigma, gram, sqrt_gram, eps = diff
    (proposal,) = const
    mode_index, u, comp_uniform, w, centre, rev_shift = local
    # The VJP's pass recomputes W and the means from L and G (the stored ones carry no gradient).
    proj = u @ sqrt_gram.T if differentiable else w
    x_f, x_r = _summands(gram, proj, mode_index, comp_uniform, sigma, jnp.reshape(eps, (1,)), proposal,
                         centres=None if differentiable else (centre, rev_shift))
    valid = (c * rows + jnp.arange(rows)) < num_samples
    return jnp.stack([_valid_sum(x_f[:, 0], valid), _valid_sum(x_r[:, 0], valid)])


def _plain_redraw_chunk(c, diff, const, local, differentiable, *, num_samples, chunk_blocks):
    """Chunk ``c`` of :func:`dpjax.montecarlo.monte_carlo_sums`'s chunks, drawn afresh."""
    from dpjax.montecarlo.core import _chunk_sums

    sigma, gram, sqrt_gram, eps = diff
    (key_data,) = const
    key = jax.random.wrap_key_data(key_data, impl="rbg")
    total, _ = _chunk_sums(gram, sqrt_gram, sigma, jnp.reshape(eps, (1,)), key, c * chunk_blocks,
                           num_samples=num_samples, chunk_blocks=chunk_blocks)
    return total[:, 0]


def _importance_redraw_chunk(c, diff, const, local, differentiable, *, num_samples, chunk_blocks):
    """Chunk ``c`` of :func:`dpjax.montecarlo.importance.importance_sums`'s chunks, drawn afresh."""
    from dpjax.montecarlo import importance as imp

    sigma, gram, sqrt_gram, eps = diff
    key_data, proposal = const
    key = jax.random.wrap_key_data(key_data, impl="rbg")
    tables = imp._tilt_tables(gram, sigma, proposal.fwd_tilt)
    out = imp._chunk_sums(gram, sqrt_gram, sigma, jnp.reshape(eps, (1,)), key, c * chunk_blocks, proposal,
                          jnp.zeros((2, 1, 0)), jnp.zeros((1,)), tables, num_samples=num_samples,
                          chunk_blocks=chunk_blocks)
    return out[0][:, 0]


class _Estimate:
    """The estimate ``delta_hat(sigma)`` a calibration solves, its samples spread over devices
    (:mod:`dpjax.montecarlo._spread`): ``value(sigma, theta, consts)`` (differentiable in
    ``theta = (gram, sqrt_gram, eps)`` through the chunks' VJPs) and
    ``value_and_slope(theta, consts)(sigma)`` (one forward-mode pass per chunk)."""

    def __init__(self, layout, per_chunk, num_samples):
        self.layout, self.per_chunk, self.num_samples = layout, per_chunk, num_samples

    def value(self, sigma, theta, consts):
        const, shard, scale = consts
        totals = _spread.total(self.layout, self.per_chunk, (sigma,) + tuple(theta), const, shard)
        return _mean_totals(totals, self.num_samples, scale)

    def value_and_slope(self, theta, consts):
        const, shard, scale = consts

        def vs(sigma):
            totals, slopes = _spread.total_and_slope(self.layout, self.per_chunk, (sigma,) + tuple(theta), const,
                                                     shard)
            return jax.jvp(lambda t: _mean_totals(t, self.num_samples, scale), (totals,), (slopes,))

        return vs


def _materialise(layout, key, b, importance: bool, draws_):
    """The draws of every chunk, laid out over the devices (each device draws its own samples
    from their global indices): ``(mode_index, U)`` or, with ``importance``, ``(mode_index, U,
    component_uniform)``.  ``draws_`` (given draws of the whole sample) are padded and laid out."""
    from dpjax.montecarlo import core
    from dpjax.montecarlo import importance as imp

    if draws_ is not None:
        pad = layout.padded_rows - draws_[1].shape[0]
        return tuple(jnp.pad(jnp.asarray(x), [(0, pad)] + [(0, 0)] * (jnp.ndim(x) - 1)) for x in draws_)
    aligned = (layout.per_device * layout.rows) % core.BLOCK_SIZE == 0
    block = imp.draw_block if importance else core.draw_block

    def draw(first, count, key_, _):
        return _spread.sample_range(lambda j: block(key_, j, b), core.BLOCK_SIZE, first, count, aligned)

    return _spread.per_device(layout, draw, rbg_key(key))


def _chunkwise(layout, fn, rep, local):
    """``fn(rep, chunk)`` on every ``(rows, ...)`` chunk of the materialised arrays ``local`` (a
    pytree laid out by ``layout``), each chunk as the VJP's pass sees it, its outputs laid out the
    same way; no gradient flows through them (the estimate's VJP recomputes them)."""
    rows = layout.rows

    def mapped(first, count, rep_, local_):
        blocks = jax.tree_util.tree_map(lambda x: x.reshape((count // rows, rows) + x.shape[1:]), local_)
        out = jax.lax.map(lambda chunk: fn(rep_, chunk), blocks)
        return jax.tree_util.tree_map(lambda x: x.reshape((count,) + x.shape[2:]), out)

    return jax.lax.stop_gradient(_spread.per_device(layout, mapped, jax.lax.stop_gradient(rep), local))


def _projections(layout, sqrt_gram, u):
    """``W = U L^T``, chunk by chunk, laid out like ``U``."""
    return _chunkwise(layout, lambda l_factor, u_chunk: u_chunk @ l_factor.T, sqrt_gram, u)


def _sample_means(layout, gram, drawn, proposal):
    """The sigma-free parts of the variance-reduced estimate's samples (their P || Q means
    ``(m, b)`` and Q || P shifts ``(m,)``, :func:`dpjax.montecarlo.importance._centres`), chunk by
    chunk, laid out like the draws.  Computed once per calibration: behind the sums' optimization
    barriers XLA would compute them again on every pass of the solver."""
    from dpjax.montecarlo import importance as imp

    def means(rep, chunk):
        mode_index, _, comp_uniform = chunk
        return imp._centres(rep[0], mode_index, comp_uniform, rep[1])

    return _chunkwise(layout, means, (gram, proposal), tuple(drawn))


def _estimate(gram, sqrt_gram, key, num_samples, draws_, precompute, proposal, devices):
    """``(estimate, consts)``: the spread estimate of a calibration and its constants (the
    draws, laid out; the proposal; the key) without the direction scale."""
    from dpjax.montecarlo import _spread as sp
    from dpjax.montecarlo.core import chunk_plan

    b = gram.shape[0]
    devices = sp.device_tuple(devices)
    importance = proposal is not None
    if precompute:
        rows = _chunk_rows(num_samples, b)
        layout = sp.Layout(devices, -(-num_samples // rows), rows)
        drawn = _materialise(layout, key, b, importance, draws_)
        w = _projections(layout, sqrt_gram, drawn[1])
        fn = _importance_chunk if importance else _plain_chunk
        const = (proposal,) if importance else ()
        shard = tuple(drawn) + (w,)
        if importance:
            shard = shard + _sample_means(layout, gram, drawn, proposal)
        per_chunk = functools.partial(fn, num_samples=num_samples, rows=rows)
    else:
        chunk_blocks, num_chunks = chunk_plan(num_samples, None, 1, b)
        layout = sp.Layout(devices, num_chunks)
        key_data = jax.random.key_data(rbg_key(key))
        fn = _importance_redraw_chunk if importance else _plain_redraw_chunk
        const = (key_data, proposal) if importance else (key_data,)
        shard = ()
        per_chunk = functools.partial(fn, num_samples=num_samples, chunk_blocks=chunk_blocks)
    return _Estimate(layout, per_chunk, num_samples), const, shard


@dataclasses.dataclass(frozen=True)
class DrawPlan:
    """The Monte Carlo estimate a calibration solves: its sample and how it is evaluated.

    One record for what :func:`calibrate_on_draws` estimates ``delta_hat(sigma; G)`` on, so that
    the solve itself takes only the matrix, the target and the solver.  Made inside a traced
    function, its array fields may be tracers (only ``num_samples`` and ``precompute`` are
    static and checked by value).

    Attributes:
      key: JAX PRNG key (typed or raw ``uint32[2]``) of the common random numbers (the
        sampler's stream of :mod:`dpjax.montecarlo.core`); ``None`` when ``draws`` are given.
      num_samples: static ``m``, any integer ``>= 1`` (``None`` with ``draws``: their length).
      draws: optional precomputed ``(mode_index (m,), U (m, b))`` (:func:`dpjax.montecarlo.draws`
        of the same key), e.g. drawn once per optimisation step; with a ``proposal``,
        ``(mode_index, U, component_uniform)`` of
        :func:`~dpjax.montecarlo.importance.importance_draws`.
      proposal: ``None`` (the plain estimator) or a
        :class:`dpjax.montecarlo.importance.Proposal`: solve the variance-reduced estimate
        (:mod:`dpjax.montecarlo.importance`).  A constant of the solve (no gradient flows to it).
      direction_scale: ``(2,)`` factors of the two directions' estimates before their max
        (default ``(1, 1)``; a certificate aims the directions at different levels with it;
        with a ``proposal`` only).
      precompute: materialise ``W = U L^T`` (``None``: when ``m * b <= 2^24``, or ``draws`` are
        given); ``False``: every pass re-draws chunk by chunk (bounded memory, the chunks of
        :func:`dpjax.montecarlo.monte_carlo_sums`).
      devices: the devices the sample is spread over (default ``jax.devices()``: every device
        of every process, after ``jax.distributed.initialize()``).  The sample is cut into
        chunks that depend on ``(m, b)`` only; each device evaluates its chunks, and the chunk
        sums (and, for the gradient, the chunks' VJPs) are added in chunk order
        (:mod:`dpjax.montecarlo._spread`), so the root and its gradient are the same bits on
        any number of devices and processes.

    Example::

        DrawPlan(key=jax.random.key(0), num_samples=1 << 14)
        DrawPlan(draws=dpjax.montecarlo.draws(key, b, m))

    Raises:
      ValueError: neither ``key`` nor ``draws`` given, ``key`` without ``num_samples``,
        ``num_samples`` not an integer ``>= 1``, ``precompute`` not ``None`` / ``True`` /
        ``False`` (each naming the field).
    """

    key: object = None
    num_samples: int | None = None
    draws: tuple | None = None
    proposal: object = None
    direction_scale: object = None
    precompute: bool | None = None
    devices: object = None

    def __post_init__(self):
        if self.draws is None:
            if self.key is None:
                raise ValueError("key: a DrawPlan needs the key of its draws (with num_samples), or draws=")
            if self.num_samples is None:
                raise ValueError("num_samples: a DrawPlan with a key needs num_samples (an integer >= 1)")
        if self.num_samples is not None:
            object.__setattr__(self, "num_samples", _validate.positive_int("num_samples", self.num_samples))
        if self.precompute is not None and not isinstance(self.precompute, (bool, np.bool_)):
            raise ValueError(f"precompute must be None, True or False, got {self.precompute!r}")


def calibrate_on_draws(gram, target_epsilon, target_delta, plan: DrawPlan, *, solver=NewtonIllinois(),
                       adjoint=ImplicitAdjoint(), initial_noise=None, sqrt_gram=None) -> Solution:
    """Jittable in-loop calibration: ``sigma*`` with ``delta_hat(sigma*; G) = target_delta``.

    Args:
      gram: ``(b, b)`` Gram matrix of the modes; gradients flow to it through ``adjoint``.
      target_epsilon, target_delta: scalars (differentiable).
      plan: the :class:`DrawPlan` (key and sample count, or precomputed draws; the proposal of
        the variance-reduced estimate; precompute; devices).
      solver: :class:`NewtonIllinois` (default) or :class:`Bisection`.
      adjoint: :class:`~dpjax.calibration.ImplicitAdjoint` (one extra reverse pass at the root)
        or :class:`~dpjax.calibration.StopGradientAdjoint`.
      initial_noise: warm start for :class:`NewtonIllinois` (default: the geometric middle of
        the search range is *not* used; the unamplified Gaussian-ish guess ``sensitivity``).
      sqrt_gram: a square root ``L`` of ``gram`` (``L L^T = G``, :func:`dpjax.montecarlo.gram_sqrt`;
        computed here when not given).  The gradient of the root reaches ``gram`` and ``L``
        alike, so a caller that passes ``L`` differentiates the square root on its own side (the
        optimisation loop does: its parameters' side runs on one device of each process, the
        calibration on all of them).

    Returns:
      :class:`~dpjax.calibration.Solution` (``root``: the noise multiplier, noise std over the
      clipping norm; ``stats.num_passes``: passes over the sample).  An *estimate*: certify with
      many samples (:meth:`dpjax.montecarlo.BallsInBins.certify`).

    Example::

        gram = dpjax.montecarlo.gram_matrix(Toeplitz(jnp.array([1.0, 0.3])), 8, 2)
        sigma = calibrate_on_draws(gram, 2.0, 1e-3, DrawPlan(key=jax.random.key(0),
                                                               num_samples=1 << 14)).root

    Raises:
      ValueError: ``plan`` not a :class:`DrawPlan`; ``solver`` not :class:`NewtonIllinois` or
        :class:`Bisection`.
    """
    if not isinstance(plan, DrawPlan):
        raise ValueError(f"plan must be a DrawPlan(key=..., num_samples=...) or DrawPlan(draws=...), got {plan!r}")
    key, num_samples, draws_, precompute = plan.key, plan.num_samples, plan.draws, plan.precompute
    proposal, direction_scale, devices = plan.proposal, plan.direction_scale, plan.devices
    gram = jnp.asarray(gram, jnp.float64)
    sqrt_gram = gram_sqrt(gram) if sqrt_gram is None else jnp.asarray(sqrt_gram, jnp.float64)
    b = gram.shape[0]
    eps = jnp.asarray(target_epsilon, jnp.float64)
    target = jnp.asarray(target_delta, jnp.float64)
    sensitivity = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.diagonal(gram))))
    lo_b, hi_b = BRACKET_RELATIVE[0] * sensitivity, BRACKET_RELATIVE[1] * sensitivity
    if draws_ is not None:
        num_samples = draws_[1].shape[0]
    if precompute is None:
        # A function of (m, b) only, never of the devices: the two paths cut the sample into
        # different chunks, and a layout must not change the numbers.
        precompute = draws_ is not None or num_samples * b <= MAX_PRECOMPUTED
    if proposal is not None:
        from dpjax.montecarlo.importance import as_proposal

        proposal = jax.lax.stop_gradient(as_proposal(proposal))
    scale = (jnp.ones(2) if direction_scale is None or proposal is None
             else jnp.asarray(direction_scale, jnp.float64))
    estimate, const, shard = _estimate(gram, sqrt_gram, key, num_samples, draws_, precompute, proposal, devices)
    theta, consts = (gram, sqrt_gram, eps), (const, shard, scale)
    fn = estimate.value
    if isinstance(solver, Bisection):
        # The constants ride in theta (they get zero cotangents) so that nothing is closed over.
        return solve_monotone_root(lambda s, th: fn(s, th[0], th[1]), (theta, consts), target, (lo_b, hi_b),
                                   decreasing=True, num_iterations=solver.num_iterations,
                                   log_scale=True, adjoint=adjoint)
    if not isinstance(solver, NewtonIllinois):
        raise ValueError(f"solver must be NewtonIllinois(...) or Bisection(...), got {solver!r}")
    t0 = jnp.log(sensitivity if initial_noise is None else
                 jax.lax.stop_gradient(jnp.asarray(initial_noise, jnp.float64)))

    def forward(th, log_target, c):
        fn_consts, t_start, t_min, t_max = c
        return newton_illinois(estimate.value_and_slope(th, fn_consts), log_target, t_start, t_min,
                               t_max, solver), ()

    def level(t, th, c, aux):
        # The Newton iteration solves log delta_hat(e^t) = log target_delta; differentiating
        # the same equation keeps d t*/d log target = delta / (sigma d delta / d sigma).
        return jnp.log(fn(jnp.exp(t), th, c[0]))

    t_root, t_lo, t_hi, status, passes = adjoint.apply(
        forward, level, theta, jnp.log(target), (consts, t0, jnp.log(lo_b), jnp.log(hi_b)))
    t_lo, t_hi, status, passes = jax.lax.stop_gradient((t_lo, t_hi, status, passes))
    return Solution(jnp.exp(t_root), jnp.exp(t_lo), jnp.exp(t_hi), status,
                    SolverStats(num_passes=passes))
