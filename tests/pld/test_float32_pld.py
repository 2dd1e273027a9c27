"""The float64 contract (dpjax._base.x64) on the PLD / calibration side, seen from float32 code.

Matrix: function x {eager, grad, vmap, jit} x {x64 on, off}.  The suite runs with
``jax_enable_x64`` off (what users have); the x64-on column is computed inside
``jax.enable_x64(True)`` and is the reference for the x64-off cells:

* eager (x64 off): a float64 value equal to the x64-on value (the same float64 program runs in
  a scoped x64 context; 1e-12 relative allows for nothing but summation-order noise);
* grad (x64 off): equal to the x64-on gradient to float32 resolution (the derivative is
  computed in float64 and rounded once to float32 at the boundary: 2^-23 ~ 1.2e-7 relative;
  we allow 1e-6), and one case against central finite differences;
* vmap (x64 off): the x64-on values at the float32-rounded inputs, to float32 resolution;
* jit (x64 off): a ValueError at trace time that names ``enable_x64`` (float64 cannot be staged
  into a program lowered without x64); jit (x64 on): works, same value.

Host-side entry points (plan on the host, return Python floats) give the float64 value from
float32 code; the general ones (``pld.epsilon``, ``calibration.gaussian_noise_multiplier``)
raise a ValueError under ``jit`` saying that they cannot be traced and naming the traceable
alternative, while the DP-SGD headline functions are traceable (tests/pld/test_traced_headline.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax import calibration, pld
from dpjax.pld.grid import fixed_grid

T = 100          # small compositions: fast programs
DELTA = 1e-5
EPS = 1.5
# Small FFTs (n = 3072 here): the contract does not depend on the grid's accuracy.  Grids are
# planned at sigma = 0.9, below the evaluation points (tight there and above).
SMALL = pld.GridOptions(per_step_accuracy=1e-5, n_min=2**10)


def _psg(s):
    return [pld.PoissonSubsampledGaussian(s, 0.01)]


@pytest.fixture(scope="module")
def grids():
    """One fixed grid (generic API), one DP-SGD grid and one delta-curve table, planned once."""
    assert not jax.config.jax_enable_x64, "the suite must run with x64 off (what users have)"
    generic = pld.plan_fixed_grid([(pld.PoissonSubsampledGaussian(0.9, 0.01), T)], target_delta=DELTA,
                                  options=SMALL)
    dpsgd = calibration.dpsgd_grid(0.9, 0.01, T, target_delta=DELTA, options=SMALL)
    with jax.enable_x64(True):
        tab = fixed_grid.tables(generic)[0]
    return dict(generic=generic, dpsgd=dpsgd, table=tab)


def _log_delta_gauss(sigma, eps):
    return jnp.log(calibration.composed_gaussian_delta(eps, sigma, 4))


# name -> (builder(grids) -> f(x) scalar, x0): f is differentiable in its one float argument.
CASES = {
    "pld.delta_fn": (lambda g: lambda s: pld.delta_fn(g["generic"], EPS, _psg(s)), 1.0),
    "pld.grid_epsilon_fn": (lambda g: lambda s: pld.grid_epsilon_fn(g["generic"], DELTA, _psg(s)), 1.0),
    "calibration.dpsgd_epsilon_fn": (
        lambda g: lambda s: calibration.dpsgd_epsilon_fn(s, 0.01, T, DELTA, grid=g["dpsgd"]), 1.0),
    "calibration.dpsgd_delta_fn": (
        lambda g: lambda s: calibration.dpsgd_delta_fn(EPS, s, 0.01, T, grid=g["dpsgd"]), 1.0),
    "calibration.dpsgd_noise_multiplier_core": (
        lambda g: lambda e: calibration.dpsgd_noise_multiplier_core(
            e, DELTA, 0.01, T, (0.8, 1.25), grid=g["dpsgd"], num_iterations=30).root, 1.5),
    "calibration.solve_monotone_root": (
        lambda g: lambda e: calibration.solve_monotone_root(
            _log_delta_gauss, e, math.log(DELTA), (0.1, 100.0), log_scale=True).root, 1.5),
    "calibration.gaussian_noise_multiplier_core": (
        lambda g: lambda e: calibration.gaussian_noise_multiplier_core(e, DELTA, 4).root, 1.5),
    "pld.delta_at": (lambda g: lambda e: pld.delta_at(g["table"], e), 0.5),
    "pld.eps_at": (lambda g: lambda d: pld.eps_at(g["table"], d), 1e-3),
}


# The default tier runs the matrix for one function of each kind (the generic fixed-grid delta,
# the DP-SGD epsilon, a differentiable calibration through the implicit
# adjoint, the closed-form conversion); the slow tier (-m slow) runs every row.  Each row costs
# several XLA compilations, which is what the 10-minute budget of the default suite is spent on.
DEFAULT_TIER = ("pld.delta_fn", "calibration.dpsgd_epsilon_fn",
                "calibration.gaussian_noise_multiplier_core", "pld.eps_at")
NAMES = [n if n in DEFAULT_TIER else pytest.param(n, marks=pytest.mark.slow) for n in CASES]


@pytest.fixture(scope="module")
def reference(grids):
    """The x64-on column, computed lazily per row: value, gradient, vmapped values at the
    float32-rounded inputs, and the jitted value."""
    cache = {}

    def get(name):
        if name not in cache:
            build, x0 = CASES[name]
            with jax.enable_x64(True):
                f = build(grids)
                xs = np.asarray(np.float32([x0, x0 * 1.0625]), np.float64)   # exactly representable
                cache[name] = dict(value=float(f(x0)), grad=float(jax.grad(f)(x0)),
                                   vmap=np.asarray(jax.vmap(f)(jnp.asarray(xs))),
                                   jit=float(jax.jit(f)(x0)))
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_eager_from_float32_is_the_float64_value(name, grids, reference):
    build, x0 = CASES[name]
    v = build(grids)(x0)
    assert v.dtype == np.float64
    assert float(v) == pytest.approx(reference(name)["value"], rel=1e-12)
    assert np.isfinite(float(v))


@pytest.mark.parametrize("name", NAMES)
def test_grad_from_float32_matches_x64_gradient(name, grids, reference):
    build, x0 = CASES[name]
    g = jax.grad(build(grids))(x0)
    assert g.dtype == np.float32
    ref = reference(name)["grad"]
    assert np.isfinite(ref) and ref != 0.0
    assert float(g) == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_from_float32_matches_x64_values(name, grids, reference):
    build, x0 = CASES[name]
    v = jax.vmap(build(grids))(jnp.asarray([x0, x0 * 1.0625], jnp.float32))
    assert v.dtype == np.float32
    np.testing.assert_allclose(np.asarray(v, np.float64), reference(name)["vmap"], rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_jit_without_x64_raises_naming_the_fix(name, grids):
    build, x0 = CASES[name]
    with pytest.raises(ValueError, match=r"enable_x64"):
        jax.jit(build(grids))(x0)


# jit and eager round the FFTs differently, and the certified bound adds an FFT round-off
# allowance that follows the realized noise (sum of negative bins + n x the largest): delta
# values differ by up to ~1e-13 absolute (1e-12 allowed); an epsilon or a calibrated sigma moves
# by that over the slope of delta, ~1e-9 relative here (1e-8 allowed).  The Gaussian functions
# are exact closed forms / 64-step bisections: float64 resolution.
JIT_TOL = {
    "pld.delta_fn": dict(rel=1e-12, abs=1e-12),
    "calibration.dpsgd_delta_fn": dict(rel=1e-12, abs=1e-12),
    "pld.grid_epsilon_fn": dict(rel=1e-8),
    "calibration.dpsgd_epsilon_fn": dict(rel=1e-8),
    "calibration.dpsgd_noise_multiplier_core": dict(rel=1e-8),
}


@pytest.mark.parametrize("name", NAMES)
def test_jit_with_x64_works(name, reference):
    # computed in the reference fixture under enable_x64 (jit vs eager of the same function)
    tol = JIT_TOL.get(name, dict(rel=1e-12))
    assert reference(name)["jit"] == pytest.approx(reference(name)["value"], **tol)


def test_calibration_epsilon_fn_docstring_example_from_float32(grids):
    """calibration.dpsgd_epsilon_fn as its docstring shows, outside enable_x64, used
    to return inf with a NaN gradient."""
    grid = grids["dpsgd"]
    eps = calibration.dpsgd_epsilon_fn(1.0, 0.01, T, DELTA, grid=grid)
    g = jax.grad(lambda s: calibration.dpsgd_epsilon_fn(s, 0.01, T, DELTA, grid=grid))(1.0)
    assert np.isfinite(float(eps)) and np.isfinite(float(g)) and float(g) < 0
    # Against central finite differences of the float64 eager values.  On this coarse grid
    # (dx = 1.6e-3) the slope of the certified delta curve jumps at every grid point by about
    # dx x (hazard rate of the loss), ~1% here, and the closed-form derivative is one segment's
    # slope while the secant (h = 2e-2 spans ~50 segments) averages them: 2e-2 relative.  The
    # tight check (1e-3, default grid) is in test_calibration_pld.py.
    h = 2e-2
    fd = (float(calibration.dpsgd_epsilon_fn(1.0 + h, 0.01, T, DELTA, grid=grid))
          - float(calibration.dpsgd_epsilon_fn(1.0 - h, 0.01, T, DELTA, grid=grid))) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=2e-2)
    # and the value is tight: the accountant's own certified epsilon at sigma = 1 (its own
    # grid, default accuracy) is within 1e-3 relative
    assert float(eps) == pytest.approx(dpjax.dpsgd_epsilon(1.0, 0.01, T, DELTA), rel=1e-3)


def test_gaussian_core_gradient_vs_finite_differences():
    """Exact (smooth) Gaussian calibration: grad from float32 code against central differences
    of the float64 eager values.  d sigma/d eps ~ -1; h = 1e-4 gives truncation ~1e-8 and
    round-off ~1e-16/1e-4 = 1e-12; the float32 rounding of the gradient (1.2e-7) dominates."""
    f = lambda e: calibration.gaussian_noise_multiplier_core(e, DELTA, 4).root
    g = float(jax.grad(f)(1.5))
    h = 1e-4
    fd = (float(f(1.5 + h)) - float(f(1.5 - h))) / (2 * h)
    assert g == pytest.approx(fd, rel=1e-6)


# ------------------------------------------------------------------ host-side entry points
HOST = {
    "dpjax.dpsgd_epsilon": lambda x: dpjax.dpsgd_epsilon(x, 0.01, T, DELTA),
    "dpjax.dpsgd_delta": lambda x: dpjax.dpsgd_delta(x, 0.01, T, EPS),
    "pld.epsilon": lambda x: pld.epsilon([(pld.Gaussian(x), 4)], DELTA, with_lower=False).epsilon,
    "calibration.gaussian_noise_multiplier": lambda x: calibration.gaussian_noise_multiplier(x, DELTA, 4),
    "dpjax.dpsgd_noise_multiplier": lambda x: dpjax.dpsgd_noise_multiplier(0.01, T, x, DELTA),
}
HOST_X = {"dpjax.dpsgd_epsilon": 1.0, "dpjax.dpsgd_delta": 1.0, "pld.epsilon": 2.0,
          "calibration.gaussian_noise_multiplier": 1.5, "dpjax.dpsgd_noise_multiplier": 1.5}


@pytest.mark.parametrize("name", [n for n in HOST if n != "dpjax.dpsgd_noise_multiplier"]
                         + [pytest.param("dpjax.dpsgd_noise_multiplier", marks=pytest.mark.slow)])
def test_host_entry_points_give_float64_values_from_float32_code(name):
    f, x = HOST[name], HOST_X[name]
    v = f(x)
    with jax.enable_x64(True):
        ref = f(x)
    assert isinstance(v, float) and math.isfinite(v)
    assert v == pytest.approx(ref, rel=1e-12)


def test_host_entry_point_values_are_float64_resolution():
    """From float32 code the exact Gaussian calibration resolves sigma to float64 precision:
    its delta is <= target and the sigma 1e-12 below it misses the target."""
    s = calibration.gaussian_noise_multiplier(1.5, DELTA, 4)
    with jax.enable_x64(True):
        assert float(calibration.composed_gaussian_delta(1.5, s, 4)) <= DELTA
        assert float(calibration.composed_gaussian_delta(1.5, s * (1 - 1e-12), 4)) > DELTA


# The headline functions (dpsgd_epsilon, dpsgd_delta, dpsgd_noise_multiplier) are traceable:
# tests/pld/test_traced_headline.py.  The remaining host-side entry points refuse tracers.
HOST_ONLY = ("pld.epsilon", "calibration.gaussian_noise_multiplier")


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("name", HOST_ONLY)
def test_host_entry_points_under_jit_raise_not_traceable(name, x64):
    f, x = HOST[name], HOST_X[name]
    with jax.enable_x64(x64):
        with pytest.raises(ValueError, match=r"cannot be traced.*Use dpjax\."):
            jax.jit(f)(x)
