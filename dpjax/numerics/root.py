"""Monotone root finding with a fixed iteration count, and its implicit-differentiation adjoint.

The implementation behind :mod:`dpjax.calibration.root`, which documents it and is its public
import path.  It sits with the foundation modules because the Monte Carlo layer
(:mod:`dpjax.montecarlo.calibrate`) solves for noise multipliers with it too, and the
calibration layer builds on the Monte Carlo layer, not the other way round.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import Any, Callable, Tuple

import numpy as np

from dpjax._base import lazy_module as _lazy_module, register_pytree_dataclass as _register_pytree_dataclass
from dpjax._base.results import ResultMixin
from dpjax._base.x64 import float64

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

__all__ = [
    "SolverStatus",
    "Solution",
    "SolverStats",
    "bisect_monotone",
    "ImplicitAdjoint",
    "StopGradientAdjoint",
    "solve_monotone_root",
    "bisect_integer",
    "HostBisection",
    "UPPER_ROOT_ROUNDING",
]

#: How a :class:`Solution` whose root is the bracket's *upper* end (a noise multiplier: the level
#: function decreases) reaches float32 code (:func:`dpjax._base.x64.float64`'s ``rounding``): the
#: root and the upper end rounded up, the lower end down, so the bracket still holds.
UPPER_ROOT_ROUNDING = {"root": "up", "lower": "down", "upper": "up"}

class SolverStatus(enum.IntEnum):
    """Outcome of a root solve, stored as an int32 array in :attr:`Solution.status`.

    An ``IntEnum`` rather than a string enum because the status is computed *inside* traced
    code (``jit``, ``vmap``: one status per batch element, chosen by ``jnp.where`` in the
    solver loop), where only numeric arrays exist; ``int(solution.status) ==
    SolverStatus.CONVERGED`` and ``SolverStatus(int(solution.status))`` work on the values.
    """

    #: The feasible boundary lies inside the bracket; ``root`` is feasible.
    CONVERGED = 0
    #: Even the most favourable end of the bracket violates the target: ``root`` is NaN.
    UNREACHABLE = 1
    #: The whole bracket is feasible: ``root`` is the least-favourable end (feasible, maybe
    #: not optimal).
    MET_AT_BRACKET_END = 2


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class SolverStats(ResultMixin):
    """Solver-specific extras of a :class:`Solution` (``None`` where a solver has no such number).

    Attributes:
      num_passes: int32, evaluations of the level function (for the Monte Carlo calibrations:
        passes over the sample; bisection: ``num_iterations + 2``, the two bracket ends
        included; screened calibration: candidate passes plus the full passes of a fallback).
      screened: bool, screened calibration only: ``True`` when the screened candidates
        sufficed (no full float64 solve).
    """

    num_passes: jax.Array | None = None
    screened: jax.Array | None = None


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class Solution(ResultMixin):
    """Outcome of every root solve and calibration of dpjax (fields have the batch shape of the
    inputs).

    Attributes:
      root: the solution, the end of the final bracket inside the feasible set ``{x: f(x) <=
        target}`` (the *upper* end when ``f`` decreases in ``x``, the *lower* end when it
        increases); NaN when ``status == SolverStatus.UNREACHABLE``.  Differentiable through
        the chosen adjoint (the only field that is).
      lower, upper: the final bracket (``lower <= boundary <= upper``; ``0`` / ``inf`` where a
        solver that starts from a point has not bracketed that side), no gradient.
      status: int32, a :class:`SolverStatus` value.
      stats: :class:`SolverStats` (number of passes, screening outcome).

    ``num_passes`` and ``screened`` read the same fields of ``stats``.  ``to_dict()`` /
    ``to_json(path)`` / ``Solution.load(path)`` (arrays as lists; loaded back as NumPy
    arrays): see :mod:`dpjax._base.results`.
    """

    _nested = {"stats": SolverStats}

    root: jax.Array
    lower: jax.Array
    upper: jax.Array
    status: jax.Array
    stats: SolverStats = SolverStats()

    @property
    def num_passes(self):
        """``stats.num_passes``: evaluations of the level function (passes over a sample)."""
        return self.stats.num_passes

    @property
    def screened(self):
        """``stats.screened``: the screened candidates sufficed (screened calibration only)."""
        return self.stats.screened


def _feasible(value, target):
    # NaN compares False: a NaN evaluation counts as infeasible, i.e. bisection moves towards
    # the safe side.  That is the conservative choice for an accountant.
    return value <= target


def _bisect(fn: Callable, target, lower, upper, *, decreasing: bool, num_iterations: int,
            log_scale: bool, method: str = "bisection"
            ) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Raw bracketing search on ``fn(x) <= target``; returns (root, lower, upper, status_as_float).

    ``method="bisection"``: midpoints.  ``method="illinois"``: the Illinois variant of regula
    falsi (Dowell & Jarratt 1971): secant through the two bracket ends, and the function value
    kept at an end that survives twice in a row is halved, which gives superlinear convergence
    (order ~1.44) for smooth ``fn`` while always keeping a bracket; a non-finite or
    out-of-bracket secant point falls back to the midpoint.  Both keep the invariant
    "``good`` feasible, ``bad`` infeasible", so the returned root is on the safe side either way.
    """
    if method not in ("bisection", "illinois"):
        raise ValueError(f"method must be 'bisection' or 'illinois', got {method!r}")
    lower = jnp.asarray(lower, jnp.result_type(float))
    upper = jnp.asarray(upper, jnp.result_type(float))
    target = jnp.asarray(target, jnp.result_type(float))
    to_t = jnp.log if log_scale else (lambda v: v)
    from_t = jnp.exp if log_scale else (lambda v: v)
    # Both ends in one vmapped call: one copy of fn in the program instead of two (compile time
    # of heavy fns, e.g. FFT compositions, scales with the number of copies).
    f_lower, f_upper = jax.vmap(fn)(jnp.stack([lower, upper]))
    ok_lower = _feasible(f_lower, target)
    ok_upper = _feasible(f_upper, target)
    # Orient the bracket so that `bad` is infeasible and `good` feasible throughout.
    good0, bad0 = (upper, lower) if decreasing else (lower, upper)
    ok_good, ok_bad = (ok_upper, ok_lower) if decreasing else (ok_lower, ok_upper)
    g_good0, g_bad0 = ((f_upper, f_lower) if decreasing else (f_lower, f_upper))
    g_good0, g_bad0 = g_good0 - target, g_bad0 - target

    def body(_, carry):
        t_good, t_bad, x_good, x_bad, g_good, g_bad, last = carry
        t_mid = 0.5 * (t_good + t_bad)
        if method == "illinois":
            t_sec = t_good - g_good * (t_bad - t_good) / (g_bad - g_good)
            inside = jnp.isfinite(t_sec) & ((t_sec - t_good) * (t_sec - t_bad) < 0)
            t_new = jnp.where(inside, t_sec, t_mid)
        else:
            t_new = t_mid
        # Keep the evaluated x itself: recomputing exp(t) outside the loop may differ by an
        # ulp (different XLA kernels), and the returned root must be the point proven feasible.
        x_new = from_t(t_new)
        g_new = fn(x_new) - target
        ok = _feasible(g_new, 0.0)
        # Illinois: an end kept twice in a row has its value halved.
        g_bad_kept = jnp.where(last == 1, 0.5 * g_bad, g_bad)
        g_good_kept = jnp.where(last == -1, 0.5 * g_good, g_good)
        return (jnp.where(ok, t_new, t_good), jnp.where(ok, t_bad, t_new),
                jnp.where(ok, x_new, x_good), jnp.where(ok, x_bad, x_new),
                jnp.where(ok, g_new, g_good_kept), jnp.where(ok, g_bad_kept, g_new),
                jnp.where(ok, 1, -1).astype(jnp.int32))

    init = (to_t(good0), to_t(bad0), good0, bad0, g_good0, g_bad0, jnp.zeros((), jnp.int32))
    _, _, good, bad, _, _, _ = jax.lax.fori_loop(0, num_iterations, body, init)
    status = jnp.where(
        ~ok_good,
        int(SolverStatus.UNREACHABLE),
        jnp.where(ok_bad, int(SolverStatus.MET_AT_BRACKET_END), int(SolverStatus.CONVERGED)),
    )
    # Whole bracket feasible: answer the least-favourable feasible end (the bad end), not a
    # bisection artefact.  Unreachable: NaN, so nothing downstream silently uses a clipped value.
    root = jnp.where(status == int(SolverStatus.CONVERGED), good, jnp.where(ok_bad, bad0, jnp.nan))
    lo, hi = (bad, good) if decreasing else (good, bad)
    return root, lo, hi, status.astype(root.dtype)


def bisect_monotone(fn: Callable[[jax.Array], jax.Array], target, bracket, *,
                    decreasing: bool = True, num_iterations: int = 64,
                    log_scale: bool = False, method: str = "bisection") -> Solution:
    """Bisection for the boundary of ``{x in bracket : fn(x) <= target}``, ``fn`` monotone.

    No gradients (see :func:`solve_monotone_root` for the differentiable version).

    Args:
      fn: scalar -> scalar, monotone on the bracket; pure and jittable.
      target: scalar.
      bracket: ``(lower, upper)`` scalars, ``0 < lower`` if ``log_scale``.
      decreasing: ``True`` if ``fn`` decreases in ``x`` (e.g. delta in the noise multiplier).
      num_iterations: static; the bracket shrinks by 2 (or its log-ratio by 2) per step.
      log_scale: bisect in ``log x`` (relative precision; for positive scale parameters).
      method: ``"bisection"`` (robust, fixed rate) or ``"illinois"`` (bracketing secant,
        superlinear for smooth ``fn``: ~10 steps instead of ~40 for 1e-10 relative).

    Returns:
      :class:`Solution`.
    """
    root, lo, hi, status = _bisect(fn, target, bracket[0], bracket[1], decreasing=decreasing,
                                   num_iterations=num_iterations, log_scale=log_scale,
                                   method=method)
    return _solution(root, lo, hi, status, num_iterations)


def _solution(root, lo, hi, status, num_iterations) -> Solution:
    """A bisection's :class:`Solution`: ``num_iterations`` midpoints plus the two bracket ends."""
    passes = jnp.full(jnp.shape(root), num_iterations + 2, jnp.int32)
    return Solution(root=root, lower=lo, upper=hi, status=status.astype(jnp.int32),
                    stats=SolverStats(num_passes=passes))


@dataclasses.dataclass(frozen=True)
class ImplicitAdjoint:
    """Differentiate the root by the implicit function theorem (a ``jax.custom_vjp``).

    At the returned root ``x*`` of ``f(x, theta) = target``::

        theta_bar  = -(x_bar / f_x) * (df/dtheta)^T     (one VJP of f at (x*, theta))
        target_bar =   x_bar / f_x,       f_x = df/dx (x*, theta)

    Both derivatives of ``f`` come from the same reverse pass, whatever the number of solver
    steps; the forward solver (bisection, Newton/Illinois, a screened solve) only has to
    return a root.

    Two entry points, shared with :class:`StopGradientAdjoint`:

    * :meth:`solve` -- bracketing search (:func:`bisect_monotone`) on ``fn(x, theta)``.
      Values closed over by ``fn`` that are JAX tracers (e.g. arrays from an enclosing ``jit``
      or ``grad``, of any dtype) are hoisted into explicit arguments (like
      ``jax.closure_convert``, which however leaves integer tracers closed over and so breaks
      under ``jit``), and receive their gradients the same way.  The bracket gets a zero
      gradient (the root does not depend on it while it is interior).
    * :meth:`apply` -- any forward solver: ``forward(theta, target, consts) -> (outputs,
      aux)`` with ``outputs[0]`` the root, and the level function ``level(x, theta, consts,
      aux)`` whose value equals ``target`` at the root.  ``consts`` (draws, warm starts,
      search ranges) get zero gradients; ``aux`` is what the backward pass needs from the
      forward one.  ``level`` may be a tuple of functions, one per way the forward solver can
      end: ``aux[0]`` (int32) then selects the one that held at the root (``lax.switch``: only
      that one is differentiated).

    Accuracy: exact up to how close ``x*`` is to the true boundary (the solver tolerance) and
    to the smoothness of ``f``.  The derivative is undefined where ``f_x = 0`` (a flat ``f``;
    gives inf/NaN, never a silently wrong finite number) and meaningless when the status is
    not ``SolverStatus.CONVERGED``.
    """

    def solve(self, fn, theta, target, bracket, *, decreasing, num_iterations, log_scale,
              method="bisection"):
        """``_bisect``'s ``(root, lower, upper, status)`` on ``fn(x, theta) <= target``."""
        dtype = jnp.result_type(float)
        lower, upper = jnp.asarray(bracket[0], dtype), jnp.asarray(bracket[1], dtype)
        target = jnp.asarray(target, dtype)
        theta = jax.tree_util.tree_map(jnp.asarray, theta)
        fn_conv, hoisted = _hoist_closure(fn, lower, theta)

        def forward(th, tgt, bracket_):
            th0, hs = th
            out = _bisect(lambda x: fn_conv(x, th0, *hs), tgt, *bracket_, decreasing=decreasing,
                          num_iterations=num_iterations, log_scale=log_scale, method=method)
            return out, ()

        def level(x, th, bracket_, aux):
            th0, hs = th
            return fn_conv(x, th0, *hs)

        return self.apply(forward, level, (theta, tuple(hoisted)), target, (lower, upper))

    def apply(self, forward, level, theta, target, consts=()):
        """``forward(theta, target, consts)[0]``, its first output differentiable implicitly."""
        return _implicit(forward, level, theta, target, consts)


@dataclasses.dataclass(frozen=True)
class StopGradientAdjoint:
    """No derivative: the root is returned under ``lax.stop_gradient`` (gradients are zero).

    For code paths that only need the value (the final certificate, CLI, benchmarks): it skips
    tracing the backward pass.  The entry points of :class:`ImplicitAdjoint`.
    """

    def solve(self, fn, theta, target, bracket, *, decreasing, num_iterations, log_scale,
              method="bisection"):
        """``_bisect``'s ``(root, lower, upper, status)`` on ``fn(x, theta) <= target``."""
        def forward(th, tgt, bracket_):
            out = _bisect(lambda x: fn(x, th), tgt, *bracket_, decreasing=decreasing,
                          num_iterations=num_iterations, log_scale=log_scale, method=method)
            return out, ()

        return self.apply(forward, None, theta, target, (bracket[0], bracket[1]))

    def apply(self, forward, level, theta, target, consts=()):
        """``forward(theta, target, consts)[0]`` on stopped-gradient inputs; ``level`` unused."""
        theta, target, consts = jax.lax.stop_gradient((theta, target, consts))
        return jax.lax.stop_gradient(forward(theta, target, consts)[0])


def _hoist_closure(fn, x_example, theta):
    """``fn(x, theta)`` -> ``(fn_conv(x, theta, *hoisted), hoisted)``: every closed-over tracer
    becomes an explicit argument, so the custom VJP never captures a tracer of another trace."""
    closed = jax.make_jaxpr(fn)(x_example, theta)
    consts = list(closed.consts)
    is_tracer = [isinstance(c, jax.core.Tracer) for c in consts]
    hoisted = [c for c, t in zip(consts, is_tracer) if t]

    def fn_conv(x, th, *hoisted_values):
        it = iter(hoisted_values)
        all_consts = [next(it) if t else c for c, t in zip(consts, is_tracer)]
        (out,) = jax.core.eval_jaxpr(closed.jaxpr, all_consts, *jax.tree_util.tree_leaves((x, th)))
        return out

    return fn_conv, hoisted


def _implicit_primal(forward, level, theta, target, consts):
    return forward(theta, target, consts)[0]


@functools.cache
def _implicit_vjp():
    # Built on first use: defining the solver must not import JAX (see dpjax._base).
    fn = jax.custom_vjp(_implicit_primal, nondiff_argnums=(0, 1))
    fn.defvjp(_implicit_fwd, _implicit_bwd)
    return fn


def _implicit(forward, level, theta, target, consts):
    return _implicit_vjp()(forward, level, theta, target, consts)


def _implicit_fwd(forward, level, theta, target, consts):
    out, aux = forward(theta, target, consts)
    return out, (out[0], aux, theta, target, consts)


def _implicit_bwd(forward, level, residuals, cotangents):
    # JAX runs a custom VJP's backward rule when the *caller's* transpose runs, i.e. after the
    # public function's float64 scope (dpjax._base.x64.float64) has exited.  Re-enter it here, so that
    # a float32 caller (jax_enable_x64 off) gets the float64 derivative instead of a
    # float64/float32 dtype clash; cotangents are then cast to the primal dtypes JAX expects.
    root, aux, theta, target, consts = residuals
    with jax.enable_x64(True):
        theta_bar, target_bar = _implicit_cotangents(level, root, aux, theta, target, consts,
                                                     cotangents[0])
    theta_bar = jax.tree_util.tree_map(_cast_like, theta_bar, theta)
    return (theta_bar, _cast_like(target_bar, target),
            jax.tree_util.tree_map(_zero_cotangent, consts))


def _implicit_cotangents(level, root, aux, theta, target, consts, root_bar):
    """Implicit function theorem (Choquette-Choo et al. 2024, §4.2) at the root ``x*``:
    ``d x*/d theta = -(df/dtheta) / (df/dx)``, ``d x*/d target = 1 / (df/dx)``; one reverse
    pass of ``level`` gives both partial derivatives.  The other outputs of the solver (bracket,
    status, counters) carry no gradient (documented)."""
    def partials(f):
        value, vjp = jax.vjp(lambda x, th: f(x, th, consts, aux), root, theta)
        return vjp(jnp.ones_like(value))

    if isinstance(level, (tuple, list)):
        f_x, f_theta = jax.lax.switch(aux[0], [functools.partial(partials, f) for f in level])
    else:
        f_x, f_theta = partials(level)
    w = root_bar / f_x
    theta_bar = jax.tree_util.tree_map(
        lambda g: g if g.dtype == jax.dtypes.float0 else -w * g, f_theta)
    return theta_bar, jnp.broadcast_to(w, jnp.shape(target))


def _cast_like(cotangent, primal):
    dtype = jnp.result_type(primal)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return cotangent  # integer primals take float0 cotangents, passed through unchanged
    return jnp.asarray(cotangent).astype(dtype)


def _zero_cotangent(x):
    """The zero cotangent of a primal ``x``: zeros of its dtype, ``float0`` for integer / bool
    arrays (what a ``jax.custom_vjp`` backward rule returns for a non-differentiated input)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)



@float64
def solve_monotone_root(fn: Callable[[jax.Array, Any], jax.Array], theta: Any, target, bracket,
                        *, decreasing: bool = True, num_iterations: int = 64,
                        log_scale: bool = False, method: str = "bisection",
                        adjoint: ImplicitAdjoint | StopGradientAdjoint = ImplicitAdjoint(),
                        ) -> Solution:
    """Differentiable boundary of ``{x : fn(x, theta) <= target}`` for ``fn`` monotone in ``x``.

    Args:
      fn: ``(x, theta) -> scalar``; ``x`` a float64 scalar, ``theta`` any pytree.  Pure, jittable,
        differentiable in ``x`` and ``theta`` at the root; monotone in ``x`` on the bracket.
      theta: pytree of parameters the root depends on (gradients flow to it).
      target: scalar level (gradients flow to it).
      bracket: ``(lower, upper)``, no gradient.
      decreasing: ``fn`` decreases in ``x`` (so the returned root is the *upper* bracket end).
      num_iterations: static bisection length (compiles once per value).
      log_scale: bisect in ``log x`` (requires ``lower > 0``).
      method: ``"bisection"`` or ``"illinois"`` (see :func:`bisect_monotone`).
      adjoint: :class:`ImplicitAdjoint` (default) or :class:`StopGradientAdjoint`.

    Returns:
      :class:`Solution`; only ``root`` carries gradients.

    Works under ``jit`` and ``vmap`` (call it inside the mapped function).
    """
    root, lo, hi, status = adjoint.solve(fn, theta, target, bracket, decreasing=decreasing,
                                         num_iterations=num_iterations, log_scale=log_scale,
                                         method=method)
    lo, hi, status = jax.lax.stop_gradient((lo, hi, status))
    return _solution(root, lo, hi, status, num_iterations)


def bisect_integer(predicate: Callable[[int], bool], lo: int, hi: int) -> int:
    """Smallest integer ``n`` in ``(lo, hi]`` with ``predicate(n)`` true; host-side, exact.

    ``predicate`` is monotone (false below some ``n``, true from it on; e.g. "``n`` samples
    certify the target", or the negation of "``n`` steps stay within the budget").  The caller
    guarantees ``predicate(hi)`` and that ``predicate(lo)`` is false (or ``lo`` lies below the
    range); neither end is evaluated, so a caller that found ``hi`` by doubling pays nothing
    twice.  ``ceil(log2(hi - lo))`` evaluations.  The *largest* ``n`` with a non-increasing
    ``feasible(n)`` is ``bisect_integer(lambda n: not feasible(n), lo, hi) - 1``.
    """
    lo, hi = int(lo), int(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------------------------------
# Host bisection
#
# The host paths (closed forms on Python floats, NumPy accountants, planning searches) answer
# without compiling anything, so their searches cannot use the jitted loop above.  The same
# contract holds there: the returned end of the final bracket is the one whose predicate was
# evaluated true (or the caller's end, vouched for), never a midpoint that was not tested.

_SAFE_SIDES = ("lower", "upper")
_NO_LIMIT = float("inf")
_SCALES = ("linear", "log")


@dataclasses.dataclass(frozen=True)
class HostBisection:
    """Bisection on the host for the boundary of a monotone predicate, safe side stated.

    ``feasible(x)`` is true on one side of a boundary in the bracket and false on the other;
    ``safe`` names the feasible side and so the end of the final bracket returned as the root:
    ``"lower"`` when ``feasible`` holds below the boundary (e.g. ``f(x) <= target`` for an
    increasing ``f``), ``"upper"`` when it holds above (a decreasing ``f``).  That end is always
    a point at which ``feasible`` was evaluated true, or the caller's own bracket end when
    ``check_ends=False`` and no probe moved it.  A predicate that answers false on NaN moves the
    bracket away from the safe end, the conservative direction.

    Attributes:
      safe: ``"lower"`` or ``"upper"`` (see above).
      scale: ``"linear"`` (midpoint ``0.5 * (lo + hi)``) or ``"log"`` (geometric midpoint
        ``sqrt(lo * hi)``: relative precision for positive scale parameters; the product must
        stay within the float64 range, so brackets within about ``1e-150 .. 1e150``).
      atol: stop once ``hi - lo <= atol`` (linear scale only).
      rtol: stop once ``hi - lo <= rtol * |hi|`` (linear) or ``hi <= lo * (1 + rtol)`` (log).
      max_halvings: stop after this many halvings (alone: a fixed number of them).

    The stopping rule is tested after each halving (the first halving always happens), and
    the search also stops as soon as a halving leaves the bracket unchanged: the midpoint
    rounds to an end, so every later halving would repeat it (the predicate is deterministic),
    and stopping there gives the same bracket as running on.  At most one of ``atol`` /
    ``rtol``; at least one of the three.
    """

    safe: str = "lower"
    scale: str = "linear"
    atol: float | None = None
    rtol: float | None = None
    max_halvings: int | None = None

    def __post_init__(self):
        if self.safe not in _SAFE_SIDES:
            raise ValueError(f"safe must be 'lower' or 'upper', got {self.safe!r}")
        if self.scale not in _SCALES:
            raise ValueError(f"scale must be 'linear' or 'log', got {self.scale!r}")
        if self.atol is not None and self.rtol is not None:
            raise ValueError("atol and rtol: give at most one of them")
        if self.atol is None and self.rtol is None and self.max_halvings is None:
            raise ValueError("atol, rtol, max_halvings: give a stopping rule (at least one of them)")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)
                                          and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.atol is not None and self.scale == "log":
            raise ValueError("atol applies to scale='linear' only (use rtol on a log scale)")
        if self.max_halvings is not None and (isinstance(self.max_halvings, bool)
                                              or not isinstance(self.max_halvings, int)
                                              or self.max_halvings < 0):
            raise ValueError(f"max_halvings must be an int >= 0, got {self.max_halvings!r}")

    # --- Python floats ---
    def solve(self, feasible: Callable[[float], bool], lower: float, upper: float, *,
              check_ends: bool = True) -> Solution:
        """Bisect ``feasible`` on ``[lower, upper]`` (Python floats; one call per probe).

        ``check_ends=True`` evaluates both ends first: the status is
        :attr:`SolverStatus.UNREACHABLE` (root NaN) when the safe end is infeasible,
        :attr:`SolverStatus.MET_AT_BRACKET_END` (root the other end) when both are feasible,
        else :attr:`SolverStatus.CONVERGED`.  ``check_ends=False``: the caller vouches that the
        safe end is feasible and the other one not (status ``CONVERGED``).

        Returns:
          :class:`Solution` of Python floats (``status`` a :class:`SolverStatus`,
          ``stats.num_passes`` the number of predicate calls).
        """
        lo, hi = _host_bracket(lower, upper, self.scale)
        passes = 0
        if check_ends:
            ok_lo, ok_hi = bool(feasible(lo)), bool(feasible(hi))
            passes = 2
            ok_safe, ok_other = (ok_lo, ok_hi) if self.safe == "lower" else (ok_hi, ok_lo)
            if not ok_safe:
                return _host_solution(math.nan, lo, hi, SolverStatus.UNREACHABLE, passes)
            if ok_other:
                other = hi if self.safe == "lower" else lo
                return _host_solution(other, lo, hi, SolverStatus.MET_AT_BRACKET_END, passes)
        lo, hi, n = self._halve(feasible, lo, hi)
        root = lo if self.safe == "lower" else hi
        return _host_solution(root, lo, hi, SolverStatus.CONVERGED, passes + n)

    def root(self, feasible: Callable[[float], bool], lower: float, upper: float) -> float:
        """``solve(feasible, lower, upper, check_ends=False).root`` without the record: the safe
        end of the final bracket, for host loops that need only the float."""
        lo, hi = _host_bracket(lower, upper, self.scale)
        lo, hi, _ = self._halve(feasible, lo, hi)
        return lo if self.safe == "lower" else hi

    def _halve(self, feasible, lo, hi):
        """The halvings on floats: ``(lo, hi, number of halvings)``."""
        log = self.scale == "log"
        lower_safe = self.safe == "lower"
        limit = _NO_LIMIT if self.max_halvings is None else self.max_halvings
        # Width rule: 0 none, 1 ratio (log), 2 relative, 3 absolute.
        if self.rtol is not None:
            rule, tol = (1, 1.0 + self.rtol) if log else (2, self.rtol)
        else:
            rule, tol = (0, 0.0) if self.atol is None else (3, self.atol)
        n = 0
        while n < limit:
            mid = math.sqrt(lo * hi) if log else 0.5 * (lo + hi)
            n += 1
            # A halving that leaves the bracket as it was (the midpoint rounds to the end it
            # replaces) is repeated by every later one: stop there.
            if feasible(mid):
                if lower_safe:
                    same, lo = mid == lo, mid
                else:
                    same, hi = mid == hi, mid
            elif lower_safe:
                same, hi = mid == hi, mid
            else:
                same, lo = mid == lo, mid
            if same:
                break
            if rule == 0:
                continue
            if rule == 1:
                if hi <= lo * tol:
                    break
            elif rule == 2:
                if hi - lo <= tol * abs(hi):
                    break
            elif hi - lo <= tol:
                break
        return lo, hi, n

    # --- NumPy arrays, elementwise ---
    def solve_array(self, feasible: Callable[[np.ndarray], np.ndarray], lower, upper, *,
                    active=None, check_ends: bool = True) -> Solution:
        """Bisect ``feasible`` elementwise on the arrays ``[lower, upper]``: one call of
        ``feasible`` per halving on the whole array of midpoints (a boolean array back).

        Every element is halved until the stopping rule holds for *all* active ones (an element
        that met it early goes on halving with the others); elements where ``active`` is false
        keep their bracket, and their ends need not be finite.  The stopping rule's width test
        and ``check_ends`` act per element as in :meth:`solve`; elements not ``CONVERGED`` by the
        end check are left out of the halving.

        Returns:
          :class:`Solution` of float64 arrays of the broadcast shape (``status`` int32).
        """
        lo, hi = np.broadcast_arrays(np.asarray(lower, np.float64), np.asarray(upper, np.float64))
        lo, hi = lo.copy(), hi.copy()
        act = (np.ones(lo.shape, bool) if active is None
               else np.broadcast_to(np.asarray(active, bool), lo.shape).copy())
        _host_bracket_array(lo, hi, act, self.scale)
        lower_safe = self.safe == "lower"
        status = np.full(lo.shape, int(SolverStatus.CONVERGED), np.int32)
        passes = 0
        if check_ends:
            ok_lo, ok_hi = np.asarray(feasible(lo), bool), np.asarray(feasible(hi), bool)
            passes = 2
            ok_safe, ok_other = (ok_lo, ok_hi) if lower_safe else (ok_hi, ok_lo)
            status = np.where(act & ~ok_safe, int(SolverStatus.UNREACHABLE),
                              np.where(act & ok_other, int(SolverStatus.MET_AT_BRACKET_END),
                                       status)).astype(np.int32)
            act = act & (status == int(SolverStatus.CONVERGED))
        log = self.scale == "log"
        atol, rtol, limit = self.atol, self.rtol, self.max_halvings
        ratio = None if rtol is None or not log else 1.0 + rtol
        masked = not act.all()
        inactive = ~act
        prev = None
        n = 0
        while limit is None or n < limit:
            mid = np.sqrt(lo * hi) if log else 0.5 * (lo + hi)
            # The last halving's midpoint again: that halving moved an end onto it, and this one
            # would move the same end onto the same point (the predicate is deterministic), so
            # the bracket is at its fixed point (adjacent floats) and every later halving too.
            if prev is not None and (mid == prev).all():
                break
            prev = mid
            n += 1
            to_lo = np.asarray(feasible(mid), bool)
            if not lower_safe:
                to_lo = ~to_lo
            if masked:
                lo, hi = np.where(to_lo & act, mid, lo), np.where(inactive | to_lo, hi, mid)
            else:
                lo, hi = np.where(to_lo, mid, lo), np.where(to_lo, hi, mid)
            if ratio is not None:
                done = hi <= lo * ratio
            elif rtol is not None:
                done = hi - lo <= rtol * np.abs(hi)
            elif atol is not None:
                done = hi - lo <= atol
            else:
                continue
            if (done | inactive).all() if masked else done.all():
                break
        root = lo if lower_safe else hi
        if check_ends:
            other = hi if lower_safe else lo
            root = np.where(status == int(SolverStatus.UNREACHABLE), np.nan,
                            np.where(status == int(SolverStatus.MET_AT_BRACKET_END), other, root))
        return Solution(root=root, lower=lo, upper=hi, status=status,
                        stats=SolverStats(num_passes=passes + n))


def _host_bracket(lower, upper, scale):
    lo, hi = float(lower), float(upper)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"bracket must be finite, got ({lower!r}, {upper!r})")
    if lo > hi:
        raise ValueError(f"bracket must have lower <= upper, got ({lower!r}, {upper!r})")
    if scale == "log" and not lo > 0.0:
        raise ValueError(f"bracket must be > 0 on a log scale, got ({lower!r}, {upper!r})")
    return lo, hi


def _host_bracket_array(lo, hi, active, scale):
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(lo) & np.isfinite(hi)
        if np.any(active & ~finite):
            raise ValueError("bracket must be finite where active")
        if np.any(active & (lo > hi)):
            raise ValueError("bracket must have lower <= upper where active")
        if scale == "log" and np.any(active & ~(lo > 0.0)):
            raise ValueError("bracket must be > 0 on a log scale where active")


def _host_solution(root, lo, hi, status, passes) -> Solution:
    return Solution(root=root, lower=lo, upper=hi, status=status,
                    stats=SolverStats(num_passes=passes))
