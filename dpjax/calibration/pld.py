"""DP-SGD noise calibration and a differentiable epsilon: the DP-SGD specialisation of the
fixed-grid PLD API (:mod:`dpjax.pld.grid.fixed_grid`).

Everything here is a root problem on the certified (pessimistic, connect-the-dots) epsilon /
delta curve of the PLD accountant (Koskela & Honkela, "Computing Differential Privacy
Guarantees for Heterogeneous Compositions Using FFT", 2021):

* :func:`dpsgd_noise_multiplier` (host side, batched): the smallest sigma, to a relative
  1e-4, whose certified epsilon *on the accountant's own curve* ``g(sigma) =
  dpjax.dpsgd_epsilon(sigma, ...)`` meets the target (see its docstring for the exact
  statement).  Each probe is evaluated on the grid the accountant plans at that very sigma,
  because a grid is tight only near its planning point: on a grid planned at ``sigma_p`` the
  curve is sound but loose for ``sigma < sigma_p`` (the single-step support there is wider
  than the grid, its mass goes to the ``+inf`` atom), so a search on one grid planned above the
  root finds a spurious root near ``sigma_p`` (an earlier release gave 1.5489 instead of
  1.2015), and a window planned too narrow must be widened as the accountant does, or the
  curve is ``inf`` there (an earlier release refused an everyday target this way).  Probes of
  one FFT length share one compiled program (supports padded to ``n``), so a search compiles
  one or two programs.
* ``delta_up(eps; sigma, q, T)`` (:func:`dpsgd_delta_fn`) = :func:`dpjax.pld.delta_fn` on a grid
  *planned once* (:func:`dpsgd_grid`) and held fixed: the max over the remove/add directions
  of the certified upper bound.  Soundness never depends on the grid plan: for *any* sigma the
  value is an upper bound on the true delta, so ``delta_up(eps*; sigma) <= delta*`` certifies
  ``(eps*, delta*)``-DP at that sigma; the plan only affects tightness (tight at and above the
  planning sigma, loose below it).
* :func:`dpsgd_noise_multiplier_core` (jittable, differentiable): the smallest sigma in a given
  bracket with ``delta_up(eps*; sigma) <= delta*`` on such a fixed grid, by a fixed-length
  Illinois search -- the smallest *on that grid*: plan the grid at (or a little below) the
  bracket's lower end, or the answer is loose.  Differentiable in ``(target_epsilon,
  target_delta, sampling_prob)`` by the implicit function theorem
  (``d sigma/d theta = -(d delta_up/d theta) / (d delta_up/d sigma)``).
* :func:`dpsgd_epsilon_fn`: ``eps(delta*) = min{eps : delta_up(eps) <= delta*}`` in closed form on
  the bracketing grid segment (:func:`dpjax.pld.grid_epsilon_fn`), differentiable in
  ``(noise_multiplier, sampling_prob, target_delta)`` through the delta-curve table.

All of them follow the float64 contract of :mod:`dpjax._base.x64`: eager, ``grad`` and ``vmap`` calls
from float32 code get float64 answers; inside a user's ``jit`` trace with x64 enabled.

Usage::

    import jax, dpjax
    from dpjax.calibration import pld as cal

    dpjax.dpsgd_noise_multiplier(0.01, 1000, 2.0, 1e-5)          # 0.9591...
    grid = cal.dpsgd_grid(0.9591, 0.01, 1000, target_delta=1e-5)  # host-side plan
    deps = jax.grad(lambda s: cal.dpsgd_epsilon_fn(s, 0.01, 1000, 1e-5, grid=grid))(0.9591)  # ~ -4.61
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base import progress as _progress
from dpjax._base import validate as _validate
from dpjax._base import traced as _traced
from dpjax._base.x64 import float64, host_only
from dpjax.calibration.root import ImplicitAdjoint, solve_monotone_root
from dpjax.numerics.root import UPPER_ROOT_ROUNDING, HostBisection
from dpjax.pld.grid.fixed_grid import FixedGrid, delta_fn, plan_fixed_grid
from dpjax.pld.grid.fixed_grid import epsilon_rounding, grid_epsilon_fn
from dpjax.pld.grid.compose import Group
from dpjax.numerics.exact import host_gaussian_log_delta
from dpjax.pld.mechanisms import DIRECTIONS, PoissonSubsampledGaussian
from dpjax.pld.grid.plan import GridOptions, plan_grid
from dpjax.pld.scenario import FixedBatch, accepts_scenario, scheme_keywords

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

__all__ = [
    "DPSGDGrid", "dpsgd_grid", "dpsgd_delta_fn", "dpsgd_epsilon_fn",
    "dpsgd_noise_multiplier_core", "dpsgd_noise_multiplier", "CALIBRATION_OPTIONS",
    "NUM_ITERATIONS", "RELATIVE_TOLERANCE", "SIGMA_RANGE",
]

#: Grid accuracy of the calibration: the accountant's default :class:`~dpjax.pld.GridOptions`,
#: so the curve searched is the one :func:`dpjax.pld.dpsgd_epsilon` reports (see
#: :func:`dpsgd_noise_multiplier` for the guarantee).
CALIBRATION_OPTIONS = GridOptions()
#: Relative width of the final bracket ``[lower, upper]`` of :func:`dpsgd_noise_multiplier`:
#: ``upper`` (returned) meets the target, ``lower = upper / (1 + RELATIVE_TOLERANCE)`` or
#: more does not (on the accountant's curve).
RELATIVE_TOLERANCE = 1e-4
#: Default Illinois steps of :func:`dpsgd_noise_multiplier_core` (the jittable search on a
#: grid the caller planned): < 1e-8 relative bracket from a 2x bracket on these smooth, nearly
#: log-linear curves.
NUM_ITERATIONS = 10
#: With custom grid options the search compares epsilon with ``target_epsilon * (1 -
#: _AGREEMENT_MARGIN)``.  Its probes run the grid plan and composition in one batched program
#: with supports padded to ``n`` and no frequency truncation: a sound upper bound, but not
#: bit-identical to the accountant with those options; the margin covers round-off.
_AGREEMENT_MARGIN = 1e-7


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
    # NumPy leaves (host values): jnp.asarray / jnp.ones outside a trace compile a small
    # staging program each (~50 ms apiece of a first calibration); the jitted programs take
    # NumPy arrays as they are.
    one = np.ones((1,), np.float64)
    if group_size == 1 and sampling == "poisson":
        return PoissonSubsampledGaussian(one, np.asarray([q], np.float64))
    from dpjax.pld.mog import GroupSubsampledGaussian

    f = lambda v: np.asarray([0.0 if v is None else float(v)], np.float64)
    return GroupSubsampledGaussian(
        noise_multiplier=one, group_size=f(group_size), sampling_prob=f(q), dataset_size=f(dataset_size),
        batch_size=f(batch_size), sampling=sampling, num_components=int(num_components))


def _with(mech, noise_multiplier, sampling_prob=None):
    """``mech`` with its noise multiplier (and sampling probability, when given) replaced."""
    def one(v):  # concrete values stay NumPy (no staging compile), traced ones go through jnp
        if _traced.is_tracer(v):
            return jnp.reshape(jnp.asarray(v, jnp.float64), (1,))
        return np.reshape(np.asarray(v, np.float64), (1,))

    kw = dict(noise_multiplier=one(noise_multiplier))
    if sampling_prob is not None:
        kw["sampling_prob"] = one(sampling_prob)
    return dataclasses.replace(mech, **kw)


def _plan(mech, steps, *, options, **targets) -> FixedGrid:
    """The fixed grid of one DP-SGD configuration (both directions, one ``n`` and ``dx``)."""
    return plan_fixed_grid([(mech, int(steps))], options=options, **targets)


@host_only("dpjax.calibration.dpsgd_delta_fn / dpsgd_epsilon_fn with a grid planned outside the transformation")
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


@float64(rounding="up")
def dpsgd_delta_fn(epsilon, noise_multiplier, sampling_prob, steps, *, grid: DPSGDGrid):
    """Certified delta (upper bound, max over remove/add) of DP-SGD at ``epsilon``; pure.

    Scalars in (``steps`` an integer, may be traced), scalar out; jittable, vmappable (with a
    batched ``grid``) and differentiable in ``epsilon``, ``noise_multiplier``, ``sampling_prob``.
    ``sampling_prob=None`` keeps the planned mechanism's (e.g. a group mixture's) own.
    """
    mech = _with(grid.mechanisms[0], noise_multiplier, sampling_prob)
    return delta_fn(grid, epsilon, (mech,), counts=(jnp.reshape(steps, (1,)),))


@float64(rounding=epsilon_rounding)
def dpsgd_epsilon_fn(noise_multiplier, sampling_prob, steps, target_delta, *, grid: DPSGDGrid | None = None,
               with_report: bool = False, warn: bool = True):
    """Certified epsilon of DP-SGD at ``target_delta`` as a differentiable JAX function.

    ``eps = min{eps >= 0 : delta_up(eps) <= target_delta}`` on the fixed ``grid``
    (:func:`dpsgd_grid`), in closed form on the bracketing grid segment
    (:func:`dpjax.pld.grid_epsilon_fn`; no search).  Differentiable in ``noise_multiplier``,
    ``sampling_prob`` and ``target_delta`` through the delta-curve table (on a segment the
    curve is ``A - e^{eps - y} B``, so this is the implicit-function derivative
    ``-(d delta/d theta) / (d delta/d eps)``).  ``inf`` if the target is not reachable on the
    grid.  ``grid=None`` plans one from the (then necessarily concrete) arguments; under
    ``jit``/``grad``/``vmap`` pass a ``grid``.  Works from float32 code (float64 inside).

    Example::

        grid = dpsgd_grid(1.0, 0.01, 1000, target_delta=1e-5)
        jax.grad(lambda s: dpsgd_epsilon_fn(s, 0.01, 1000, 1e-5, grid=grid))(1.0)
    """
    if grid is None:
        if _traced.is_traced(noise_multiplier, sampling_prob, steps, target_delta):
            raise ValueError(
                "dpsgd_epsilon_fn under jit/grad/vmap needs a fixed grid: pass "
                "grid=dpsgd_grid(noise_multiplier, sampling_prob, steps, target_delta=...) "
                "planned on concrete values")
        grid = dpsgd_grid(noise_multiplier, sampling_prob, steps, target_delta=target_delta)
    mech = _with(grid.mechanisms[0], noise_multiplier, sampling_prob)
    return grid_epsilon_fn(grid, target_delta, (mech,), counts=(jnp.reshape(steps, (1,)),), with_report=with_report,
                          warn=warn)


@float64(rounding=UPPER_ROOT_ROUNDING)
def dpsgd_noise_multiplier_core(target_epsilon, target_delta, sampling_prob, steps, bracket, *,
                                grid: DPSGDGrid, num_iterations: int = NUM_ITERATIONS,
                                adjoint=ImplicitAdjoint()):
    """Jittable core: smallest sigma in ``bracket`` with ``delta_up(target_epsilon; sigma) <= target_delta``.

    Returns a :class:`~dpjax.calibration.root.Solution`; ``root`` differentiable in
    ``target_epsilon``, ``target_delta`` and ``sampling_prob`` (implicit adjoint).  The
    comparison is made on ``log delta`` (relative resolution down to tiny deltas).
    """
    theta = (jnp.asarray(target_epsilon, jnp.float64), jnp.asarray(sampling_prob, jnp.float64))
    fn = lambda sigma, th: jnp.log(dpsgd_delta_fn(th[0], sigma, th[1], steps, grid=grid))
    return solve_monotone_root(fn, theta, jnp.log(jnp.asarray(target_delta, jnp.float64)),
                               jax.lax.stop_gradient(jnp.asarray(bracket, jnp.float64)), decreasing=True,
                               num_iterations=num_iterations, log_scale=True, method="illinois",
                               adjoint=adjoint)


#: Window widenings after a wrap-around bound over budget (as :func:`dpjax.pld.epsilon`).
_MAX_PLANS = 4


def _probe_plan(sigma, delta, steps, template, options, min_width=0.0):
    """The accountant's grid for an epsilon query at ``delta`` and noise multiplier ``sigma``
    (what :func:`dpjax.pld.dpsgd_epsilon` plans; ``min_width`` widens the window at the same
    spacing after a wrap-around bound came out over budget)."""
    mech = _with(template, float(sigma))
    if _one_gaussian(template):
        # T Gaussian steps (q = 1) compose exactly into one Gaussian with sigma / sqrt(T); the
        # accountant does the same, so one discretization error instead of T.
        mech, steps = _with(template, float(sigma) / math.sqrt(steps)), 1
    groups = [Group(mechanism=mech, counts=np.array([int(steps)], np.int64), offsets=np.zeros(1, np.int64))]
    tail_mass = options.tail_fraction * float(delta)
    directions = (DIRECTIONS[0],) if getattr(type(template), "symmetric", False) else DIRECTIONS
    return plan_grid(groups, directions, tail_mass=tail_mass, eps_hint=None, target_delta=float(delta),
                     options=options, min_width=min_width)


def _one_gaussian(template) -> bool:
    return isinstance(template, PoissonSubsampledGaussian) and float(np.asarray(template.sampling_prob)[0]) == 1.0


def _evaluate(sigmas, deltas, steps, templates, options):
    """Certified epsilon at each ``(sigma, delta)``, each on the grid the accountant plans at
    that sigma (window widened while a wrap-around bound is over budget, as the accountant
    does).  Probes of one grid shape run in one batched call (batch padded to a power of two,
    so a handful of programs are compiled, never one per probe)."""
    sigmas = np.asarray(sigmas, np.float64)
    out = np.full(sigmas.size, np.nan)
    plans = [_probe_plan(s, d, t, m, options) for s, d, t, m in zip(sigmas, deltas, steps, templates)]
    todo = list(range(sigmas.size))
    for attempt in range(_MAX_PLANS):
        if not todo:
            break
        res = _run_plans([plans[i] for i in todo], [sigmas[i] for i in todo], [deltas[i] for i in todo],
                         [templates[i] for i in todo])
        again = []
        for i, (eps, tail, need) in zip(todo, res):
            out[i] = eps
            p = plans[i]
            if tail > 10.0 * p.tau_wrap and p.n < options.n_max and attempt + 1 < _MAX_PLANS:
                width = max(1.05 * need if math.isfinite(need) else 0.0, 1.5 * p.n * p.dx)
                plans[i] = _probe_plan(sigmas[i], deltas[i], steps[i], templates[i], options, min_width=width)
                again.append(i)
        todo = again
    return out


def _run_plans(plans, sigmas, deltas, templates):
    """Certified epsilon of each probe on its plan (the PLD program on the host), with the
    largest wrap-around bound and the window width it asks for: ``[(eps, tail, need)]`` (the
    last two drive the window widening of :func:`_evaluate`, as in the accountant)."""
    from dpjax.pld.grid import program as prog
    from dpjax.pld.grid.engine import DIAGNOSTICS

    col = {name: 1 + i for i, name in enumerate(DIAGNOSTICS)}
    out = []
    for p, d in zip(plans, deltas):
        inp, spec = prog.host_inputs(p, [float(d)], kinds=("up",), want="eps")
        rows = prog.run_host(inp, spec)[:, 0, :]                        # (directions, 1 + diagnostics)
        out.append((float(np.max(rows[:, 0])),
                    float(np.max(np.maximum(rows[:, col["tail_above"]], rows[:, col["tail_below"]]))),
                    float(np.max(rows[:, col["needed_width"]]))))
    return out


class _Search:
    """Bracketing search for the smallest sigma with ``g(sigma) <= target`` on one curve ``g``.

    ``g`` is the accountant's certified epsilon at ``target_delta``, each value on the grid
    planned at that sigma.  State: ``lo`` the largest sigma seen infeasible below ``hi``, the
    smallest sigma seen feasible (``g <= target``).  Each round proposes two probes straddling
    the root predicted by a secant in ``(log sigma, log g)`` (nearly linear there), spread by a
    fraction of the step (so an accurate prediction closes the bracket in one round) and
    falling back to bisection when a round does not halve the bracket.  Done when
    ``hi / lo - 1 <= rtol``; ``hi`` is returned: a sigma whose certified epsilon was evaluated
    and is ``<= target``.
    """

    def __init__(self, target, x0, rtol):
        self.log_target = math.log(target)
        self.points = []          # (log sigma, log g - log target), y may be +-inf
        self.sig = {}             # log sigma -> the exact sigma evaluated (returned as is)
        self.x0 = x0
        self.rtol = rtol
        self.width_before = math.inf
        self.stalled = False

    # --- state ---
    def add(self, sigma, eps):
        x = math.log(sigma)
        y = (math.log(eps) - self.log_target) if eps > 0 else -math.inf
        if not (eps == eps):  # NaN: never counts as feasible
            y = math.inf
        self.points.append((x, y))
        self.sig[x] = float(sigma)

    def bracket(self):
        feas = [x for x, y in self.points if y <= 0]
        xh = min(feas) if feas else math.inf
        infeas = [x for x, y in self.points if y > 0 and x < xh]
        xl = max(infeas) if infeas else -math.inf
        return xl, xh

    def done(self):
        xl, xh = self.bracket()
        return xh - xl <= math.log1p(self.rtol)

    def y(self, x):
        """``log g - log target`` recorded at ``x = log sigma`` (a probed point of ``points``)."""
        return dict(self.points)[x]

    def _slope(self):
        """d log g / d log sigma from the two finite points nearest the root (default -1)."""
        fin = sorted([(abs(y), x, y) for x, y in self.points if math.isfinite(y)])
        for i in range(len(fin)):
            for j in range(i + 1, len(fin)):
                (_, x1, y1), (_, x2, y2) = fin[i], fin[j]
                if abs(x2 - x1) > 1e-9:
                    b = (y2 - y1) / (x2 - x1)
                    if b < 0:
                        return min(max(b, -50.0), -0.05)
        return -1.0

    # --- proposals ---
    def next_probes(self):
        if not self.points:
            return [self.x0 - 0.02, self.x0 + 0.02]
        xl, xh = self.bracket()
        tiny = 0.45 * math.log1p(self.rtol)
        if math.isfinite(xl) and math.isfinite(xh):
            w = xh - xl
            yl, yh = self.y(xl), self.y(xh)
            if self.stalled or not (math.isfinite(yl) and math.isfinite(yh)) or yl == yh:
                xs = 0.5 * (xl + xh)
            else:
                xs = xh - yh * (xh - xl) / (yh - yl)
            self.stalled = w > 0.5 * self.width_before
            self.width_before = w
            d = max(tiny, 0.05 * min(xs - xl, xh - xs))
            if 2 * d >= 0.9 * w:
                return [xl + w / 3, xl + 2 * w / 3]
            lo = min(max(xs - d, xl + 0.02 * w), xh - 0.02 * w - 2 * d)
            return [lo, lo + 2 * d]
        # Not bracketed yet: extrapolate from the point nearest the target.
        feasible_side = math.isfinite(xh)
        x_near = xh if feasible_side else xl
        y_near = self.y(x_near)
        if not math.isfinite(y_near):
            step = -math.log(2.0) if feasible_side else math.log(2.0)
        else:
            step = -y_near / self._slope()
            step = max(min(step, math.log(8.0)), -math.log(8.0))
        # Overshoot a little towards the other side, so that the pair likely brackets.
        d = max(tiny, 0.05 * abs(step), 0.002)
        xs = x_near + step
        return [xs - d, xs + d]


def _calibrate(eps, delta, steps, templates, guess, *, options, rtol, max_rounds=60, bar=None,
               evaluate=None):
    """Lockstep bracketing searches (one per target) on the accountant's certified epsilon
    curve; every round evaluates all active targets' probes in batched calls
    (``evaluate(sigmas, deltas, steps, templates, options)``, default :func:`_evaluate`)."""
    evaluate = evaluate or _evaluate
    lo_x, hi_x = math.log(SIGMA_RANGE[0]), math.log(SIGMA_RANGE[1])
    searches = [_Search(float(e), math.log(min(max(float(g), SIGMA_RANGE[0] * 1.1), SIGMA_RANGE[1] / 1.1)), rtol)
                for e, g in zip(eps, guess)]
    result = np.full(len(searches), np.nan)
    reason = [""] * len(searches)
    active = list(range(len(searches)))
    for _ in range(max_rounds):
        if not active:
            break
        probes, owner = [], []
        for i in active:
            xs = [min(max(x, lo_x), hi_x) for x in searches[i].next_probes()]
            for x in dict.fromkeys(xs):
                probes.append(math.exp(x))
                owner.append(i)
        owner = np.asarray(owner)
        vals = evaluate(np.asarray(probes), delta[owner], steps[owner], [templates[i] for i in owner],
                        options)
        for s, i, v in zip(probes, owner, vals):
            searches[i].add(s, float(v))
        if bar is not None:
            bar.update(1, probes=len(probes))
        still = []
        for i in active:
            sr = searches[i]
            xl, xh = sr.bracket()
            if sr.done():
                result[i] = sr.sig[xh]
            elif xl >= hi_x - 1e-12:
                reason[i] = "above"
            elif xh <= lo_x + 1e-12:
                reason[i] = "below"
            else:
                still.append(i)
        active = still
    for i in active:
        reason[i] = "stalled"
    return result, reason, searches


def _gdp_mu(eps, delta):
    """mu of the mu-GDP (Gaussian) trade-off curve meeting ``(eps, delta)`` exactly (host, no
    compile): ``delta(eps; mu)`` of the Gaussian mechanism (:func:`dpjax.pld.gaussian_delta`,
    evaluated by its host twin) increases in mu.  Plain bisection in ``log mu`` (scipy.optimize
    would add ~0.4 s of import to a cold calibration, for a starting point)."""
    log_delta = math.log(delta)

    def f(log_mu):
        return float(host_gaussian_log_delta(eps, math.exp(log_mu))) - log_delta

    lo, hi = math.log(1e-4), math.log(1e3)
    if f(lo) > 0:
        return math.exp(lo)
    if f(hi) < 0:
        return math.exp(hi)
    # A starting point, not a bound: the final bracket's midpoint is returned.
    sol = _GDP_MU_BISECTION.solve(lambda log_mu: f(log_mu) < 0, lo, hi, check_ends=False)
    return math.exp(0.5 * (sol.lower + sol.upper))


#: ``log mu`` to 1e-6 (~24 halvings of ``[log 1e-4, log 1e3]``); ``f < 0`` below the root.
_GDP_MU_BISECTION = HostBisection(safe="lower", atol=1e-6)


def _clt_guess(eps, delta, q, steps):
    """Starting point of the search: the mu-GDP (CLT) approximation
    ``mu = q sqrt(T (e^{1/sigma^2} - 1))`` (Bu et al. 2020) solved for sigma.  Only a starting
    point: it can be off by tens of percent (few steps, large epsilon), the search does not
    depend on it being close."""
    out = []
    for e, d, qq, t in zip(np.ravel(eps), np.ravel(delta), np.ravel(q), np.ravel(steps)):
        mu = _gdp_mu(float(e), float(d))
        out.append(1.0 / math.sqrt(math.log1p(mu * mu / (qq * qq * t))))
    return np.asarray(out)


@accepts_scenario("target_epsilon", "target_delta", name="dpjax.dpsgd_noise_multiplier", noise="calibrate")
def dpsgd_noise_multiplier(sampling_prob=None, steps=None, target_epsilon=None, target_delta=None, *, group_size=1,
                           sampling="poisson", options: GridOptions | None = None, progress: bool | None = None,
                           sample_rate=None, epochs=None):
    """Smallest DP-SGD noise multiplier whose certified epsilon meets ``target_epsilon``.

    Poisson sampling with probability ``sampling_prob`` for ``steps`` steps, add/remove
    adjacency, PLD accounting (:mod:`dpjax.pld`).

    **Guarantee.**  Let ``g(sigma)`` be the accountant's certified epsilon at ``target_delta``
    (:func:`dpjax.dpsgd_epsilon`, or :func:`dpjax.group.group_dpsgd_epsilon` for groups): a sound
    upper bound on the true epsilon, on the grid the accountant plans at that sigma.  The
    returned ``sigma`` satisfies ``g(sigma) <= target_epsilon``, evaluated by the public
    accountant at this very sigma (with the default ``options``), so
    ``(target_epsilon, target_delta)``-DP is certified; and

    * default ``options`` (any number of targets): the search runs on ``g`` itself (each
      probe is the accountant's value at that sigma; the probes of many targets are evaluated
      together by :func:`dpjax.pld.grid.batched.epsilon_many`, equal to the single calls), so an
      array of targets gives what separate calls give.  The bracketing search stops at a
      relative width :data:`RELATIVE_TOLERANCE` (1e-4), then a secant step on its final
      bracket (one or two more accountant calls) returns a sigma evaluated feasible within
      about 1e-9 relative of the crossing ``g(sigma) = target_epsilon``: so the returned sigma
      is a smooth function of the targets (its finite differences agree with the gradient)
      and never more than 1e-4 above the smallest feasible sigma;
    * custom ``options``: the searches run in lockstep on one batched program (the grid plan
      per probe with those options, supports padded to the FFT length: a sound bound that can
      differ from the accountant's by up to ~3e-4 relative), to the same precision on that
      curve, a hair below the target.

    **Traceable.**  Under ``jax.grad`` / ``jax.vmap`` / ``jax.jit`` (from float32 code too) the
    search runs on the host (``jax.pure_callback``; a vmapped batch of targets is one lockstep
    search) and the gradient is the implicit derivative on the accountant's grid at the
    returned sigma: ``d sigma/d target_epsilon = -(d delta/d eps) / (d delta/d sigma)``,
    ``d sigma/d target_delta = 1 / (d delta/d sigma)``, ``d sigma/d sampling_prob =
    -(d delta/d q) / (d delta/d sigma)`` (:mod:`dpjax.pld.grid.batched`).

    The accountant's curve itself is within its discretization error of the exact one (by
    default ``min(1e-3 epsilon, 8e-9 steps)`` in epsilon, see :data:`CALIBRATION_OPTIONS`;
    measured -1.2e-4 to +3.4e-4 relative in sigma against dp_accounting at a 1e-4 interval on random
    targets).  How: a bracketing secant search in ``(log sigma, log g)`` on the host, starting
    at the mu-GDP (CLT) estimate, two probes per round straddling the predicted root.  Every
    probe is the accountant's host call (nothing is compiled, docs/design.md §2.5).

    Vectorized: arrays (broadcast together) run as lockstep searches whose probes are evaluated
    in batched programs (grouped by grid shape).

    **Argument order** (the accounting family's one order, docs/api_names.md):
    ``(sampling_prob, steps, target_epsilon, target_delta)``; Opacus-style ``sample_rate=`` and
    ``epochs=`` (``steps = epochs / sampling_prob`` rounded up:
    :func:`dpjax._base.names.epochs_to_steps`).

    Unreachable targets raise ``ValueError`` saying why: ``target_delta >= 1 - (1 - q)^T``
    (vacuous: every sigma meets it), or a sigma outside :data:`SIGMA_RANGE` would be needed.

    Args:
      sampling_prob: q in (0, 1] (alias ``sample_rate=``; None with a scheme record).
      steps: integer >= 1 (or ``epochs=``).
      target_epsilon: > 0.
      target_delta: in (0, 1).
      group_size: k >= 1 (scalar): calibrate the guarantee of groups of k examples (mixture of
        Gaussians of Ganesh (2024), "Tight Group-Level DP Guarantees for DP-SGD with Sampling
        via Mixture of Gaussians Mechanisms", Thm 3.1 / 3.3, via
        :class:`dpjax.pld.mog.GroupSubsampledGaussian`).
      sampling: ``"poisson"`` or :class:`dpjax.Poisson` ``(q)``; :class:`dpjax.FixedBatch`
        ``(batch_size, dataset_size)`` (replace-one (replace-k) adjacency: sensitivities ``2j``
        with noise std ``noise_multiplier``, Ganesh (2024), Thm 3.3, as in :mod:`dpjax.group`);
        or :class:`dpjax.RandomAllocation` / :class:`dpjax.BallsInBins` (add/remove adjacency):
        then ``epochs`` (the number of epochs) replaces ``sampling_prob`` and ``steps``; the
        search runs on the certified bound of :mod:`dpjax.pld.allocation.accountant` (its
        :func:`~dpjax.pld.allocation.accountant.allocation_noise_multiplier`), traced targets
        get its implicit gradient (:func:`dpjax.pld.allocation.dpsgd.noise_multiplier`).
      options: grid accuracy (default :data:`CALIBRATION_OPTIONS`; Poisson and fixed batches).
      progress: progress on stderr, one tick per round of the search (group calibration can take
        tens of seconds): ``None`` (default) shows it once the call runs over a second (a bar in
        a terminal or notebook, lines in a log; see :mod:`dpjax._base.progress`), ``False`` never,
        ``True`` always.

    Returns:
      float (scalar inputs) or float64 ndarray of the broadcast shape.

    Raises:
      ValueError: bad input; a vacuous target; a target that needs a noise multiplier outside
        :data:`SIGMA_RANGE` ``[1e-3, 1e4]`` (says which and how to fix it).

    Example::

        >>> dpjax.dpsgd_noise_multiplier(0.01, 1000, 2.0, 1e-5)   # doctest: +SKIP
        0.95910...
        >>> dpjax.dpsgd_noise_multiplier(sample_rate=0.01, epochs=10, target_epsilon=2.0,
        ...                              target_delta=1e-5)                               # doctest: +SKIP
        0.95910...
        >>> dpjax.dpsgd_noise_multiplier(target_epsilon=2.0, target_delta=1e-5,
        ...                              sampling=dpjax.RandomAllocation(100), epochs=10)  # doctest: +SKIP
    """
    from dpjax._base import names as _names
    from dpjax._base import traced as _traced
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd

    name = "dpsgd_noise_multiplier"
    eps, dlt = target_epsilon, target_delta
    scheme = scheme_keywords(name, sampling, sampling_prob, sample_rate=sample_rate)
    q, sampling, dataset_size, batch_size = scheme.sampling_prob, scheme.sampling, scheme.dataset_size, scheme.batch_size
    batches_per_epoch, selections_per_epoch = scheme.batches_per_epoch, scheme.selections_per_epoch
    if allocation_dpsgd.is_allocation(sampling):
        if options is not None:
            raise ValueError(f"options (GridOptions) are for sampling='poisson' and 'fixed_batch'; "
                             f"sampling={sampling!r} plans its own grid (dpjax.pld.allocation.accountant)")
        return allocation_dpsgd.noise_multiplier(name, eps, dlt, scheme=scheme, epochs=epochs, steps=steps,
                                                 group_size=group_size)
    allocation_dpsgd.no_allocation_args(sampling, batches_per_epoch, selections_per_epoch)
    _check_order(steps)
    steps = _names.steps_from_epochs(name, q, steps, epochs, sampling=sampling, dataset_size=dataset_size,
                                     batch_size=batch_size)
    _names.require(name, steps=steps, target_epsilon=eps, target_delta=dlt)
    kw = dict(group_size=group_size, sampling=sampling, dataset_size=dataset_size, batch_size=batch_size,
              options=options)
    if _traced.is_traced(q, steps, eps, dlt):
        return _traced_noise_multiplier(q, steps, eps, dlt, **kw)
    return _noise_multiplier(eps, dlt, q, steps, progress=progress, **kw)


def _check_order(steps) -> None:
    """``steps`` in (0, 1) is a target delta given in the order of earlier releases
    ``(target_epsilon, target_delta, sampling_prob, steps)``: say so instead of a bare range error."""
    from dpjax._base import traced as _traced

    if steps is None or _traced.is_traced(steps) or isinstance(steps, (str, bytes, bool)):
        return
    try:
        v = np.asarray(steps, np.float64)
    except (TypeError, ValueError):
        return
    if v.size and np.all((v > 0) & (v < 1)):
        raise ValueError(
            f"steps must be an integer >= 1, got {steps!r}: dpsgd_noise_multiplier takes (sampling_prob, steps, "
            f"target_epsilon, target_delta), the order of dpsgd_epsilon and dpsgd_delta (earlier releases took "
            f"target_epsilon, target_delta first); keywords work in every release: "
            f"dpsgd_noise_multiplier(sampling_prob=..., steps=..., target_epsilon=..., target_delta=...)")


def _traced_noise_multiplier(q, steps, eps, dlt, **kw):
    """:func:`dpsgd_noise_multiplier` under ``jax.grad`` / ``vmap`` / ``jit`` (see its docstring)."""
    from dpjax._base import traced as _traced

    fixed = kw["sampling"] == "fixed_batch"
    floats = {"target_epsilon": eps, "target_delta": dlt}
    if q is not None and not fixed:
        floats["sampling_prob"] = q
    for name, v, check in (("target_epsilon", eps, _validate.positive), ("target_delta", dlt, _validate.probability_open),
                           ("sampling_prob", None if fixed else q, _validate.probability_open_closed)):
        if v is not None and not _traced.is_traced(v):
            check(name, v)

    def values(target_epsilon, target_delta, steps, sampling_prob=None):
        qq = sampling_prob if sampling_prob is not None else q
        out = _noise_multiplier(target_epsilon, target_delta, qq, steps, progress=False, **kw)
        return np.broadcast_to(np.asarray(out, np.float64), np.shape(target_epsilon))

    def partials(wrt, target_epsilon, target_delta, steps, sampling_prob=None):
        sig = values(target_epsilon, target_delta, steps, sampling_prob)
        parts = {k: np.zeros(sig.shape) for k in wrt}
        qarr = np.broadcast_to(np.asarray(sampling_prob if sampling_prob is not None else
                                          (np.nan if q is None or fixed else q), np.float64), sig.shape)
        for i in np.ndindex(sig.shape):
            d = _sigma_partials(float(sig[i]), None if np.isnan(qarr[i]) else float(qarr[i]), int(steps[i]),
                                float(target_delta[i]), **kw)
            for k in wrt:
                parts[k][i] = d[k]
        return sig, parts

    return _traced.host_call(values, partials, floats, {"steps": steps}, name="dpsgd_noise_multiplier")


def _sigma_partials(sigma, q, steps, delta, *, group_size, sampling, dataset_size, batch_size, options):
    """Implicit derivatives of the calibrated ``sigma`` on the accountant's grid at ``sigma``."""
    from dpjax.group import group_components
    from dpjax.pld.grid.batched import grid_partials
    from dpjax.pld.group_spec import validate_group_spec

    spec = validate_group_spec(q, group_size=group_size, sampling=sampling, dataset_size=dataset_size,
                               batch_size=batch_size)
    comps = group_components(sigma, steps, spec)
    g = grid_partials(comps, noise_multiplier=sigma, sampling_prob=None if sampling == "fixed_batch" else q,
                      target_delta=delta, options=options)
    ds = g["d_delta_d_sigma"]
    return {"target_epsilon": -g["d_delta_d_eps"] / ds, "target_delta": 1.0 / ds,
            "sampling_prob": -g["d_delta_d_q"] / ds}


@float64
def _noise_multiplier(target_epsilon, target_delta, sampling_prob, steps, *, group_size=1, sampling="poisson",
                      dataset_size=None, batch_size=None, options: GridOptions | None = None,
                      progress: bool | None = None):
    """The eager calibration of :func:`dpsgd_noise_multiplier` (concrete arguments)."""
    from dpjax.pld.group_spec import validate_group_spec

    spec = validate_group_spec(sampling_prob, group_size=group_size, sampling=sampling,
                               dataset_size=dataset_size, batch_size=batch_size)
    k, sampling, n_data, b_size = spec.group_size, spec.sampling, spec.dataset_size, spec.batch_size
    q = np.asarray(spec.sampling_prob)
    target = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, delta = target.epsilon, target.delta
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
    # mixture): only the search's starting point.
    if k == 1 and sampling == "poisson":
        # delta >= 1 - (1-q)^T, the probability that the record is sampled at all: met by every
        # noise multiplier (sigma -> 0 has exactly this delta at every epsilon), no smallest one.
        # q = 1: log1p(-1) = -inf and the floor is exactly 1 (the record is always sampled).
        with np.errstate(divide="ignore"):
            floor = -np.expm1(steps_i * np.log1p(-np.minimum(q, 1.0)))
        if np.any(delta >= floor):
            i = int(np.argmax(delta >= floor))
            raise ValueError(_unreachable_message("below", eps[i], delta[i], q[i], steps_i[i], k, sampling))
    guess = _clt_guess(eps, delta, np.minimum(1.0, k * q), steps_i.astype(np.float64))
    bar = _progress.progress(None, "calibrate noise", enabled=progress, unit="rounds",
                             delay=_progress.long_call_delay())
    on_accountant = options == GridOptions()
    try:
        if on_accountant:
            # The default grid: the search's curve is the public accountant itself (one call per
            # probe, or the batch of a round's probes through dpjax.pld.grid.batched.epsilon_many, equal
            # to those calls), so the returned sigma is within RELATIVE_TOLERANCE of the smallest
            # sigma meeting the target on the very curve a user checks it with, and a single
            # target's first call compiles only the accountant's program(s) (one per static grid
            # shape the probes visit).
            evaluate = functools.partial(_evaluate_on_accountant, k=k, sampling=sampling, n_data=n_data,
                                         b_size=b_size)
            target = eps
        else:
            # Search a hair below the target (see _AGREEMENT_MARGIN).
            evaluate = _evaluate
            target = eps * (1 - _AGREEMENT_MARGIN)
        out, reason, searches = _calibrate(target, delta, steps_i, mechs, guess, options=options,
                                           rtol=RELATIVE_TOLERANCE, bar=bar, evaluate=evaluate)
        out = _polish(searches, out, delta, steps_i, mechs, options=options, evaluate=evaluate)
    finally:
        bar.close()
    bad = np.flatnonzero(np.isnan(out))
    if bad.size:
        i = int(bad[0])
        raise ValueError(_unreachable_message(reason[i], eps[i], delta[i], q[i], steps_i[i], k, sampling))
    out = out.reshape(shape)
    return float(out) if out.ndim == 0 else out


#: Supported range of noise multipliers (the CLT guess and the answer must lie inside).
SIGMA_RANGE = (1e-3, 1e4)


def _accountant_kwargs(k, sampling, n_data, b_size):
    kw = dict(group_size=int(k), sampling=sampling)
    if sampling == "fixed_batch":
        kw.update(dataset_size=n_data, batch_size=b_size)
    return kw


def _evaluate_on_accountant(sigmas, deltas, steps, templates, options, *, k, sampling, n_data, b_size):
    """The search's probes evaluated by the public accountant (the ``evaluate`` of
    :func:`_calibrate` with the default grid): one call each for a round of up to two probes
    (one search: the accountant's own compiled program), else the whole round at once through
    :func:`dpjax.pld.grid.batched.epsilon_many` (each value equal to its single call).  ``templates``
    give the sampling probabilities; ``options`` is unused (the accountant plans the default
    grid at each sigma)."""
    from dpjax.group import group_components
    from dpjax.group import group_dpsgd_epsilon as accountant_epsilon
    from dpjax.pld.grid.batched import epsilon_many
    from dpjax.pld.group_spec import validate_group_spec

    kw = _accountant_kwargs(k, sampling, n_data, b_size)
    qs = [None if sampling == "fixed_batch" else float(np.asarray(m.sampling_prob).ravel()[0]) for m in templates]
    if len(sigmas) <= 2:
        scheme = FixedBatch(b_size, n_data) if sampling == "fixed_batch" else "poisson"
        return np.asarray([float(accountant_epsilon(float(s), q, int(t), float(d), group_size=int(k), sampling=scheme))
                           for s, d, t, q in zip(sigmas, deltas, steps, qs)])
    comps = [group_components(float(s), int(t), validate_group_spec(q, **kw)) for s, t, q in zip(sigmas, steps, qs)]
    return epsilon_many(comps, np.asarray(deltas, np.float64))


#: Relative margin above the secant root of :func:`_polish` (covers the curve's round-off).
_POLISH_MARGIN = 1e-9


def _polish(searches, out, delta, steps, templates, *, options, evaluate):
    """Refine each converged search's answer to the crossing of its curve.

    The search stops with a bracket ``[lo, hi]`` of relative width <= 1e-4 (``lo`` infeasible,
    ``hi`` feasible).  On it ``log g`` is nearly linear in ``log sigma``, so the secant root is
    within ~1e-9 of the crossing; the point just above it (by :data:`_POLISH_MARGIN`) is
    evaluated and returned when feasible, else one more secant step between it and ``hi`` is
    tried, else ``hi`` stays.  Every returned sigma is one the curve was evaluated feasible at."""
    out = np.array(out, np.float64)
    todo = [i for i in range(out.size) if np.isfinite(out[i])]
    for _ in range(2):
        probes, owner = [], []
        for i in todo:
            sr = searches[i]
            xl, xh = sr.bracket()
            if not (math.isfinite(xl) and math.isfinite(xh)):
                continue
            yl, yh = sr.y(xl), sr.y(xh)
            if not (math.isfinite(yl) and math.isfinite(yh)) or not yl > 0 >= yh:
                continue
            x = xh - yh * (xh - xl) / (yh - yl) + math.log1p(_POLISH_MARGIN)
            if not xl < x < xh:
                continue
            probes.append(math.exp(x))
            owner.append(i)
        if not probes:
            break
        owner_a = np.asarray(owner)
        vals = evaluate(np.asarray(probes), delta[owner_a], steps[owner_a], [templates[i] for i in owner], options)
        todo = []
        for s, i, v in zip(probes, owner, vals):
            searches[i].add(s, float(v))
            if searches[i].points[-1][1] <= 0:  # feasible: g(s) <= target
                out[i] = s
            else:
                todo.append(i)
    return out


def _unreachable_message(reason, eps, delta, q, steps, group_size, sampling):
    """Why no noise multiplier in :data:`SIGMA_RANGE` is returned, and what would reach one."""
    what = (f"target (epsilon={eps:g}, delta={delta:g}) with sampling_prob={q:g}, steps={steps}"
            + (f", group_size={group_size}" if group_size != 1 else "")
            + (f", sampling={sampling!r}" if sampling != "poisson" else ""))
    lo, hi = SIGMA_RANGE
    if reason == "above":
        return (f"{what} needs a noise multiplier above {hi:g}, outside the supported range "
                f"[{lo:g}, {hi:g}]: the certified epsilon at sigma={hi:g} is still above the target; increase "
                f"target_epsilon or target_delta, or lower sampling_prob or steps")
    if reason == "below":
        floor = 1.0 - (1.0 - q) ** steps if (group_size == 1 and sampling == "poisson") else None
        why = (f" (target_delta >= 1 - (1 - q)^T = {floor:.3g}, the probability that the record "
               f"is sampled at all: every noise multiplier meets it, the target is vacuous)"
               if floor is not None and delta >= floor else "")
        return (f"{what} is met already at sigma={lo:g}, the smallest supported noise multiplier"
                f"{why}; the smallest sufficient sigma is outside the supported range [{lo:g}, {hi:g}]: decrease "
                f"target_epsilon or target_delta")
    return (f"{what}: the calibration search did not close its bracket (internal error: the "
            f"certified epsilon curve is not monotone here); please report it")


