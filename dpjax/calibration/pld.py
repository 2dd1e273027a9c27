"""DP-SGD noise calibration and a differentiable epsilon: the DP-SGD specialisation of the
fixed-grid PLD API (:mod:`dpjax.pld.fixed_grid`).

Everything here is a root problem on the certified (pessimistic, connect-the-dots) delta curve
of the PLD accountant (Koskela & Honkela, "Computing Differential Privacy Guarantees for
Heterogeneous Compositions Using FFT", 2021), evaluated on a grid that is *planned once* on the
host (:func:`dpsgd_grid` = :func:`dpjax.pld.plan_fixed_grid` for one DP-SGD step composed
``steps`` times) and then held fixed:

* ``delta_up(eps; sigma, q, T)`` (:func:`dpsgd_delta_fn`) = :func:`dpjax.pld.delta_fn`, the max
  over the remove/add directions of the certified upper bound (single-step truncation, Chernoff
  wrap-around and FFT round-off included; both directions share one grid and are composed in
  one program).  Soundness never depends on the grid plan: for *any* sigma the value is an
  upper bound on the true delta, so ``delta_up(eps*; sigma) <= delta*`` certifies
  ``(eps*, delta*)``-DP at that sigma.  The plan only affects tightness; it is made at a noise
  multiplier just below the expected answer (wider single-step support, so the whole search
  bracket above it is covered).
* :func:`dpsgd_noise_multiplier`: the smallest sigma with ``delta_up(eps*; sigma) <= delta*``
  (delta_up decreases in sigma), by a bracketing Illinois search in ``log sigma`` with a fixed
  number of steps (compiles once per grid size, vmapped over a batch of targets) -- the upper
  end of the final bracket is returned, so the certified epsilon of the returned sigma is
  ``<= target_epsilon`` by construction.
* :func:`epsilon_fn`: ``eps(delta*) = min{eps : delta_up(eps) <= delta*}`` in closed form on
  the bracketing grid segment (:func:`dpjax.pld.epsilon_fn`), differentiable in
  ``(noise_multiplier, sampling_prob, target_delta)`` through the delta-curve table.
  :func:`dpsgd_noise_multiplier_core` is differentiable in ``(target_epsilon, target_delta,
  sampling_prob)`` by the implicit function theorem
  (``d sigma/d theta = -(d delta_up/d theta) / (d delta_up/d sigma)``).

All of them follow the float64 contract of :mod:`dpjax._x64`: eager, ``grad`` and ``vmap`` calls
from float32 code get float64 answers; inside a user's ``jit`` trace with x64 enabled.

Usage::

    import jax, dpjax
    from dpjax.calibration import pld as cal

    dpjax.dpsgd_noise_multiplier(2.0, 1e-5, 0.01, 1000)          # 0.9591...
    grid = cal.dpsgd_grid(0.9591, 0.01, 1000, target_delta=1e-5)  # host-side plan
    deps = jax.grad(lambda s: cal.epsilon_fn(s, 0.01, 1000, 1e-5, grid=grid))(0.9591)  # ~ -4.61
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dpjax import _progress, _validate
from dpjax._x64 import float64, host_only
from dpjax.calibration.gaussian import gaussian_noise_multiplier
from dpjax.calibration.root import (ImplicitAdjoint, SolverStatus, StopGradientAdjoint,
                                    solve_monotone_root)
from dpjax.pld.fixed_grid import FixedGrid, delta_fn, plan_fixed_grid, stack_grids
from dpjax.pld.fixed_grid import epsilon_fn as pld_epsilon_fn
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.pld.plan import GridOptions

__all__ = [
    "DPSGDGrid", "dpsgd_grid", "dpsgd_delta_fn", "epsilon_fn",
    "dpsgd_noise_multiplier_core", "dpsgd_noise_multiplier", "CALIBRATION_OPTIONS",
    "NUM_ITERATIONS", "NUM_FINE_ITERATIONS", "COARSE_OPTIONS", "SIGMA_RANGE",
]

#: Grid accuracy for calibration: the accountant's default :class:`~dpjax.pld.GridOptions`
#: (epsilon discretization error <= min(1e-3 x epsilon, 8e-9 x steps): e.g. 8e-6 absolute,
#: 4e-6 relative at epsilon = 2 and 1000 steps, which moves sigma by about as much relative;
#: the must-show tolerance against the references is 1e-3).
CALIBRATION_OPTIONS = GridOptions()
#: Illinois steps of a search on the wide bracket [guess / 1.5, 1.5 guess]: < 1e-8 relative
#: bracket (measured on these smooth, nearly log-linear curves; 12 steps from a 4x wider
#: bracket reach 1e-15 on the exact Gaussian oracle).
NUM_ITERATIONS = 10
#: Illinois steps of the fine search on the narrow bracket around the coarse answer.
NUM_FINE_ITERATIONS = 6
#: The CLT (mu-GDP) guess is within ~10% of the PLD answer for the usual DP-SGD regimes; the
#: wide bracket is [guess / 1.5, 1.5 guess] and a miss is retried with a shifted bracket.
_BRACKET_FACTOR = 1.5
#: Plan the grid at guess / 1.15: lower noise has the wider single-step loss support, so the
#: grid covers every sigma the search visits near the answer.
_PLAN_FACTOR = 1.15
#: Two-stage search.  Stage 1 on a coarse grid (n <= 2^13, ~16x cheaper per evaluation) finds
#: sigma_1 to ~1e-3; its grid is *more* pessimistic, so the fine answer is at or a little below
#: sigma_1.  Stage 2 searches [0.97, 1.01] x sigma_1 on the accurate grid (planned at the lower
#: end).  Brackets that miss are shifted by their own width and re-planned (see _refine).
COARSE_OPTIONS = GridOptions(relative_accuracy=1e-3, n_min=2**10, n_max=2**13)
#: (lower, upper, plan) factors of the bracket around a centre c.
_WIDE = (1 / _BRACKET_FACTOR, _BRACKET_FACTOR, 1 / _PLAN_FACTOR)
_FINE = (0.97, 1.01, 0.97)


#: The fixed grid of a DP-SGD configuration: a :class:`dpjax.pld.FixedGrid` whose single
#: component is one DP-SGD step (noise multiplier, sampling probability) composed ``steps``
#: times, in both add/remove directions.
DPSGDGrid = FixedGrid


def _template(q, group_size=1, sampling="poisson", dataset_size=None, batch_size=None,
              num_components=None):
    """One DP-SGD step as a mechanism pytree with ``(1,)`` fields (noise multiplier 1, replaced
    during the search): the example-level Poisson-subsampled Gaussian, or for groups / fixed
    batches the mixture of Gaussians of :class:`dpjax.pld.mog.GroupSubsampledGaussian`
    (Ganesh (2024), "Tight Group-Level DP Guarantees for DP-SGD with Sampling via Mixture of
    Gaussians Mechanisms", Thm 3.1 / 3.3)."""
    one = jnp.ones((1,), jnp.float64)
    if group_size == 1 and sampling == "poisson":
        return PoissonSubsampledGaussian(one, jnp.asarray([q], jnp.float64))
    from dpjax.pld.mog import GroupSubsampledGaussian

    f = lambda v: jnp.asarray([0.0 if v is None else float(v)], jnp.float64)
    return GroupSubsampledGaussian(
        noise_multiplier=one, group_size=f(group_size), sampling_prob=f(q), dataset_size=f(dataset_size),
        batch_size=f(batch_size), sampling=sampling, num_components=int(num_components))


def _with(mech, noise_multiplier, sampling_prob=None):
    """``mech`` with its noise multiplier (and sampling probability, when given) replaced."""
    kw = dict(noise_multiplier=jnp.reshape(jnp.asarray(noise_multiplier, jnp.float64), (1,)))
    if sampling_prob is not None:
        kw["sampling_prob"] = jnp.reshape(jnp.asarray(sampling_prob, jnp.float64), (1,))
    return dataclasses.replace(mech, **kw)


def _plan(mech, steps, *, options, **targets) -> FixedGrid:
    """The fixed grid of one DP-SGD configuration (both directions, one ``n`` and ``dx``)."""
    return plan_fixed_grid([(mech, int(steps))], options=options, **targets)


@host_only("dpjax.calibration.dpsgd_delta_fn / epsilon_fn with a grid planned outside the transformation")
@float64
def dpsgd_grid(noise_multiplier, sampling_prob, steps, *, target_delta=None, target_epsilon=None,
               options: GridOptions | None = None) -> DPSGDGrid:
    """Plan the fixed grid (both directions) for DP-SGD around ``noise_multiplier`` (host side).

    Give ``target_delta`` (for epsilon queries) or ``target_epsilon`` (for delta queries /
    calibration).  The plan is valid (sound) for any noise multiplier; it is tight near
    ``noise_multiplier`` and above it.  :func:`dpjax.pld.plan_fixed_grid` for one
    :class:`~dpjax.pld.PoissonSubsampledGaussian` composed ``steps`` times.
    """
    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    steps = _validate.positive_int("steps", steps)
    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    return _plan(_with(_template(q), sigma), steps, options=options or CALIBRATION_OPTIONS,
                 target_delta=target_delta, target_epsilon=target_epsilon)


@float64
def dpsgd_delta_fn(epsilon, noise_multiplier, sampling_prob, steps, *, grid: DPSGDGrid):
    """Certified delta (upper bound, max over remove/add) of DP-SGD at ``epsilon``; pure.

    Scalars in (``steps`` an integer, may be traced), scalar out; jittable, vmappable (with a
    batched ``grid``) and differentiable in ``epsilon``, ``noise_multiplier``, ``sampling_prob``.
    ``sampling_prob=None`` keeps the planned mechanism's (e.g. a group mixture's) own.
    """
    mech = _with(grid.mechanisms[0], noise_multiplier, sampling_prob)
    return delta_fn(grid, epsilon, (mech,), counts=(jnp.reshape(steps, (1,)),))


@float64
def epsilon_fn(noise_multiplier, sampling_prob, steps, target_delta, *, grid: DPSGDGrid | None = None):
    """Certified epsilon of DP-SGD at ``target_delta`` as a differentiable JAX function.

    ``eps = min{eps >= 0 : delta_up(eps) <= target_delta}`` on the fixed ``grid``
    (:func:`dpsgd_grid`), in closed form on the bracketing grid segment
    (:func:`dpjax.pld.epsilon_fn`; no search).  Differentiable in ``noise_multiplier``,
    ``sampling_prob`` and ``target_delta`` through the delta-curve table (on a segment the
    curve is ``A - e^{eps - y} B``, so this is the implicit-function derivative
    ``-(d delta/d theta) / (d delta/d eps)``).  ``inf`` if the target is not reachable on the
    grid.  ``grid=None`` plans one from the (then necessarily concrete) arguments; under
    ``jit``/``grad``/``vmap`` pass a ``grid``.  Works from float32 code (float64 inside).

    Example::

        grid = dpsgd_grid(1.0, 0.01, 1000, target_delta=1e-5)
        jax.grad(lambda s: epsilon_fn(s, 0.01, 1000, 1e-5, grid=grid))(1.0)
    """
    if grid is None:
        leaves = jax.tree_util.tree_leaves((noise_multiplier, sampling_prob, steps, target_delta))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            raise ValueError(
                "epsilon_fn under jit/grad/vmap needs a fixed grid: pass "
                "grid=dpsgd_grid(noise_multiplier, sampling_prob, steps, target_delta=...) "
                "planned on concrete values")
        grid = dpsgd_grid(noise_multiplier, sampling_prob, steps, target_delta=target_delta)
    mech = _with(grid.mechanisms[0], noise_multiplier, sampling_prob)
    return pld_epsilon_fn(grid, target_delta, (mech,), counts=(jnp.reshape(steps, (1,)),))


@float64
def dpsgd_noise_multiplier_core(target_epsilon, target_delta, sampling_prob, steps, bracket, *,
                                grid: DPSGDGrid, num_iterations: int = NUM_ITERATIONS,
                                adjoint=ImplicitAdjoint()):
    """Jittable core: smallest sigma in ``bracket`` with ``delta_up(target_epsilon; sigma) <= target_delta``.

    Returns a :class:`~dpjax.calibration.root.RootResult`; ``root`` differentiable in
    ``target_epsilon``, ``target_delta`` and ``sampling_prob`` (implicit adjoint).  The
    comparison is made on ``log delta`` (relative resolution down to tiny deltas).
    """
    theta = (jnp.asarray(target_epsilon, jnp.float64), jnp.asarray(sampling_prob, jnp.float64))
    fn = lambda sigma, th: jnp.log(dpsgd_delta_fn(th[0], sigma, th[1], steps, grid=grid))
    return solve_monotone_root(fn, theta, jnp.log(jnp.asarray(target_delta, jnp.float64)),
                               jax.lax.stop_gradient(jnp.asarray(bracket, jnp.float64)), decreasing=True,
                               num_iterations=num_iterations, log_scale=True, method="illinois",
                               adjoint=adjoint)


@functools.partial(jax.jit, static_argnames=("num_iterations", "batch_size"))
def _calibrate_batch(eps, delta, steps, lo, hi, grid, *, num_iterations, batch_size):
    def one(args):
        e, d, t, l, h, g = args

        def fn(sigma, th):
            return jnp.log(dpsgd_delta_fn(th, sigma, None, t, grid=g))

        return solve_monotone_root(fn, e, jnp.log(d), (l, h), decreasing=True,
                                   num_iterations=num_iterations, log_scale=True,
                                   method="illinois", adjoint=StopGradientAdjoint())

    # lax.map over chunks of `batch_size` vmapped calibrations bounds memory at
    # ~batch_size * n complex numbers per intermediate array.
    return jax.lax.map(one, (eps, delta, steps, lo, hi, grid), batch_size=batch_size)


def _clt_guess(eps, delta, q, steps):
    """mu-GDP (CLT) guess: mu = q sqrt(T (e^{1/sigma^2} - 1)) (Bu et al. 2020), exact Gaussian
    calibration for mu, solved for sigma."""
    s1 = gaussian_noise_multiplier(eps, delta, 1)  # = 1/mu
    mu = 1.0 / np.asarray(s1)
    return 1.0 / np.sqrt(np.log1p(mu * mu / (q * q * steps)))


@host_only("dpjax.calibration.dpsgd_noise_multiplier_core on a grid from dpjax.calibration.dpsgd_grid")
@float64
def dpsgd_noise_multiplier(target_epsilon, target_delta, sampling_prob, steps, *, group_size=1,
                           sampling="poisson", dataset_size=None, batch_size=None,
                           options: GridOptions | None = None, progress: bool | None = None):
    """Smallest DP-SGD noise multiplier whose certified epsilon meets ``target_epsilon``.

    Poisson sampling with probability ``sampling_prob`` for ``steps`` steps, add/remove
    adjacency, PLD accounting (:mod:`dpjax.pld`).  The answer is the upper end of a bracket of
    relative width ~1e-8 or less found by fixed-length Illinois searches (a coarse grid, then
    the accurate one around the coarse answer) on the certified delta curve,
    so the certified epsilon at the returned sigma is ``<= target_epsilon`` (rounded to the
    safe side); its distance to the exact minimal sigma is the accountant's discretization
    error (by default at most ``min(1e-3 epsilon, 8e-9 steps)`` in epsilon, see
    :data:`CALIBRATION_OPTIONS`; about the same relative error in sigma).

    Vectorized: arrays (broadcast together) calibrate in one jitted, vmapped call per grid size
    (configurations are grouped by FFT length; one compile per group shape).

    Args:
      target_epsilon: > 0.
      target_delta: in (0, 1).
      sampling_prob: q in (0, 1].
      steps: integer >= 1.
      group_size: k >= 1 (scalar): calibrate the guarantee of groups of k examples (mixture of
        Gaussians of Ganesh (2024), "Tight Group-Level DP Guarantees for DP-SGD with Sampling
        via Mixture of Gaussians Mechanisms", Thm 3.1 / 3.3, via
        :class:`dpjax.pld.mog.GroupSubsampledGaussian`).
      sampling: ``"poisson"`` or ``"fixed_batch"`` (batch ``batch_size`` of ``dataset_size``,
        replace-one (replace-k) adjacency: sensitivities ``2j`` with noise std
        ``noise_multiplier``, Ganesh (2024), Thm 3.3, as in :mod:`dpjax.group`).
      dataset_size, batch_size: only (and required) for ``"fixed_batch"``; then
        ``sampling_prob`` must be None or ``batch_size / dataset_size``.
      options: grid accuracy (default :data:`CALIBRATION_OPTIONS`).
      progress: a progress bar on stderr, one tick per bracketed search (group calibration can
        take tens of seconds): ``None`` (default) draws it when stderr is a terminal and the call
        runs over a second (see :mod:`dpjax._progress`), ``False`` never, ``True`` always.

    Returns:
      float (scalar inputs) or float64 ndarray of the broadcast shape.

    Raises:
      ValueError: bad input; a target that needs a noise
        multiplier outside :data:`SIGMA_RANGE` ``[1e-3, 1e4]`` (says which and how to fix it).

    Example::

        >>> dpjax.dpsgd_noise_multiplier(2.0, 1e-5, 0.01, 1000)   # doctest: +SKIP
        0.95910...
    """
    from dpjax.pld.group_spec import validate_group_spec

    spec = validate_group_spec(sampling_prob, group_size=group_size, sampling=sampling,
                               dataset_size=dataset_size, batch_size=batch_size)
    k, sampling, n_data, b_size = spec.group_size, spec.sampling, spec.dataset_size, spec.batch_size
    q = np.asarray(spec.sampling_prob)
    eps = _validate.positive("target_epsilon", target_epsilon)
    delta = _validate.probability_open("target_delta", target_delta)
    steps_arr = _validate.positive("steps", steps)
    if np.any(steps_arr < 1) or np.any(steps_arr != np.floor(steps_arr)):
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    options = options or CALIBRATION_OPTIONS
    eps, delta, q, steps_arr = np.broadcast_arrays(eps, delta, q, steps_arr)
    shape = eps.shape
    eps, delta, q = eps.ravel().copy(), delta.ravel().copy(), q.ravel().copy()
    steps_i = steps_arr.ravel().astype(np.int64)
    # Mixture padding shared by every group size up to k (one compiled program per padding).
    num_components = 1 << max(1, (k + 1 - 1).bit_length())
    mechs = [_template(float(qq), k, sampling, n_data, b_size, num_components) for qq in q]
    if hasattr(mechs[0], "validate"):
        _with(mechs[0], 1.0).validate()
    # A group of k behaves roughly like sampling probability k q (sensitivity-1 part of the
    # mixture); the search re-centres when this guess is off.
    guess = np.atleast_1d(_clt_guess(eps, delta, np.minimum(1.0, k * q), steps_i.astype(np.float64)))
    _check_range(guess, eps, delta, q, steps_i, "needs a noise multiplier of about")
    # Stage 1, coarse grid: wide brackets around the current centre, re-planned at the answer
    # until the grid was planned near it (a grid planned far from the root is sound but loose).
    bar = _progress.progress(None, "calibrate noise", enabled=progress, unit="searches",
                              delay=_progress.LONG_CALL_DELAY)
    coarse, _ = _refine(eps, delta, mechs, steps_i, guess, options=COARSE_OPTIONS,
                        num_iterations=NUM_ITERATIONS, factors=_WIDE, tol=0.15, max_rounds=8, bar=bar)
    # Stage 2, accurate grid: narrow brackets around the coarse answer.
    ok = np.isfinite(coarse)
    out = np.full(eps.size, np.nan)
    if ok.any():
        out[ok], _ = _refine(eps[ok], delta[ok], [m for m, o in zip(mechs, ok) if o], steps_i[ok],
                             coarse[ok], options=options,
                             num_iterations=NUM_FINE_ITERATIONS, factors=_FINE, tol=0.05,
                             max_rounds=4, bar=bar)
    bar.close()
    guess = np.where(ok, coarse, guess)
    if np.isnan(out).any():
        bad = int(np.argmax(np.isnan(out)))
        raise ValueError(
            f"calibration found no consistent noise multiplier for target (epsilon={eps[bad]:g}, "
            f"delta={delta[bad]:g}), sampling_prob={q[bad]:g}, steps={steps_i[bad]} (last "
            f"search around {guess[bad]:.4g}): the PLD accountant's certified delta does not "
            f"cross the target consistently on grids planned there (check "
            f"dpjax.dpsgd_delta at nearby noise multipliers); no sigma is returned rather than "
            f"a loose one")
    _check_range(out, eps, delta, q, steps_i, "needs a noise multiplier of")
    out = out.reshape(shape)
    return float(out) if out.ndim == 0 else out


#: Supported range of noise multipliers (the CLT guess and the answer must lie inside).
SIGMA_RANGE = (1e-3, 1e4)


def _check_range(sigma, eps, delta, q, steps, what):
    bad = (sigma < SIGMA_RANGE[0]) | (sigma > SIGMA_RANGE[1]) | ~np.isfinite(sigma)
    if bad.any():
        i = int(np.argmax(bad))
        hint = ("increase target_epsilon or target_delta" if not sigma[i] < SIGMA_RANGE[0]
                else "decrease target_epsilon (the target is vacuous at any useful noise)")
        raise ValueError(
            f"target (epsilon={eps[i]:g}, delta={delta[i]:g}) with sampling_prob={q[i]:g}, "
            f"steps={steps[i]} {what} {sigma[i]:.4g}, outside the supported range "
            f"[{SIGMA_RANGE[0]:g}, {SIGMA_RANGE[1]:g}]: {hint}")


def _refine(eps, delta, mechs, steps, center, *, options, num_iterations, factors, tol, max_rounds, bar=None):
    """Search ``[lo, hi] * c`` with the grid planned at ``plan * c`` (``factors``), accept roots
    within ``tol`` of the centre (the grid was planned near them), re-centre the others on
    their root, or shift a missed bracket by its own width (status 1 up, status 2 down).
    Returns (roots, last centres); NaN where no round was accepted."""
    lo_f, hi_f, plan_f = factors
    out = np.full(eps.size, np.nan)
    c = np.array(center, np.float64)
    todo = np.arange(eps.size)
    for _ in range(max_rounds):
        if todo.size == 0:
            break
        ct = c[todo]
        roots, st = _solve_group(eps[todo], delta[todo], [mechs[i] for i in todo], steps[todo],
                                 ct * lo_f, ct * hi_f, ct * plan_f, options, num_iterations)
        ok = st == SolverStatus.CONVERGED
        accept = ok & (np.abs(roots / ct - 1) <= tol)
        out[todo[accept]] = roots[accept]
        c[todo] = np.where(ok, roots, np.where(st == 1, ct * hi_f / lo_f, ct * lo_f / hi_f))
        todo = todo[~accept]
        if bar is not None:
            bar.update(1, sigma=f"{float(np.nanmax(c)):.5g}")
        # outside the supported range: stop moving (reported by the caller)
        todo = todo[(c[todo] > SIGMA_RANGE[0] / 10) & (c[todo] < SIGMA_RANGE[1] * 10)]
    return out, c


def _solve_group(eps, delta, mechs, steps, lower, upper, plan_at, options, num_iterations):
    """Plan grids (host) at ``plan_at``, group configurations by grid shape, search each group's
    brackets ``[lower, upper]`` in one batched program; returns (roots, status) arrays."""
    plans = [_plan(_with(mm, float(p)), int(t), target_epsilon=float(e), target_delta=float(d),
                   options=options)
             for e, d, mm, t, p in zip(eps, delta, mechs, steps, plan_at)]
    # Configurations with the same FFT length and mechanism kind run together in one batched
    # program (support lengths m padded to the group's largest: extra points carry no mass).
    keys = [(g.n, type(mm).__name__, getattr(mm, "sampling", ""), getattr(mm, "num_components", 0))
            for g, mm in zip(plans, mechs)]
    roots = np.full(eps.size, np.nan)
    status = np.full(eps.size, 1, np.int64)
    for key in sorted(set(keys)):
        idx = np.array([i for i, k in enumerate(keys) if k == key])
        grid = stack_grids([plans[i] for i in idx])
        res = _calibrate_batch(
            jnp.asarray(eps[idx]), jnp.asarray(delta[idx]), jnp.asarray(steps[idx]),
            jnp.asarray(lower[idx]), jnp.asarray(upper[idx]), grid,
            num_iterations=num_iterations, batch_size=max(1, min(len(idx), (1 << 21) // key[0])))
        roots[idx] = np.asarray(res.root)
        status[idx] = np.asarray(res.status)
    return roots, status
