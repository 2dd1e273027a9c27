"""The float64 contract on the Monte Carlo / calibration / optimization side, cell by cell.

Matrix: every exported traceable function of this side x {eager, grad, vmap, jit} x {x64 on,
x64 off}.  The module runs with x64 OFF (the suite's default, what users see); x64-on cells use
the scoped ``jax.enable_x64(True)``.  The reference for every cell is the same function computed
eagerly with x64 on, at the same inputs.  Inputs are exactly representable in float32 (0.375,
1.25, ...), so float32 and float64 callers pass the same numbers.

Tolerances (justified per cell):

* eager (both flags): the same float64 program on the same inputs -> ``REL_EAGER = 1e-12``.
* grad, x64 on: the same float64 program -> 1e-12; also against central finite differences
  (``fd_rel`` per function: 1e-6 for smooth closed forms with h = 1e-5, where truncation is
  ~h^2 ~ 1e-10 relative and round-off ~1e-16/h ~ 1e-11; 1e-3 for the Monte Carlo functions,
  whose common-random-numbers estimate has kinks, see tests/calibration/test_calibration_montecarlo.py).
* grad, x64 off: the float64 gradient rounded to float32 at the boundary (6e-8 relative), then
  pulled back through the caller's own float32 code (``C(a) = I + a * subdiag``: a float32 sum
  of <= 16 cotangent entries, each rounded at 6e-8) -> ``REL_F32 = 2e-6``.
* vmap, x64 off: values rounded to float32 -> ``REL_F32``; x64 on: batching may reorder
  floating-point reductions (~1e-16 relative per sum), and a bisection (bracket 1.4e-14
  relative) can move by that much -> ``REL_VMAP64 = 1e-10``.
* jit, x64 off: every function here computes in float64 and so raises, at trace time, a
  ``ValueError`` that names ``enable_x64`` (asserted); jit, x64 on: works, compared to the
  reference at ``REL_VMAP64`` (XLA may fuse and reorder reductions differently).

Sizes are small (b = 4, E = 2, 1024 samples) so that every cell is one quick compile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.calibration import calibrated_noise
from dpjax.matrices import Toeplitz, prefix_sum_rmse
from dpjax.montecarlo import (delta_estimate, delta_from_projections, draws, gram_from_columns,
                              gram_from_dense, gram_matrix, gram_sqrt)
from dpjax.optimization import log_rmse_balls_in_bins, toeplitz_from_params
from dpjax.pld import gaussian_delta, gaussian_epsilon

REL_EAGER = 1e-12
REL_F32 = 2e-6
REL_VMAP64 = 1e-10

B, E = 4, 2
N = B * E
M = 1 << 10
KEY = jax.random.key(3)
TARGET = dict(target_epsilon=2.0, target_delta=5e-3)   # 5e-3 >= 1/M: resolvable by 1024 samples


def _corr(a):
    """``C(a) = I + a * subdiag`` built from ``jnp.eye`` in the caller's precision."""
    return jnp.eye(N) + a * jnp.eye(N, k=-1)


# The fixtures are computed eagerly even when first needed inside a test's ``jax.jit`` trace
# (ensure_compile_time_eval): they are constants of the test, not part of the traced program.
@functools.lru_cache(maxsize=None)
def _gram64():
    with jax.ensure_compile_time_eval(), jax.enable_x64(True):
        return np.asarray(gram_matrix(Toeplitz(np.array([1.0, 0.5])), B, E))


@functools.lru_cache(maxsize=None)
def _draws64():
    with jax.ensure_compile_time_eval(), jax.enable_x64(True):
        idx, u = draws(KEY, B, M)
        w = u @ np.asarray(gram_sqrt(_gram64())).T
        return np.asarray(idx), np.asarray(w)


@dataclasses.dataclass(frozen=True)
class Case:
    fn: Callable          # x -> array (the dpjax function's output, untouched)
    x: float              # float32-representable evaluation point
    xs: tuple             # vmap inputs (float32-representable)
    fd_h: float
    fd_rel: float


CASES = {
    "gaussian_delta": Case(lambda mu: gaussian_delta(jnp.array([0.5, 2.0]), mu), 1.25, (0.75, 1.25), 1e-5, 1e-6),
    "gaussian_epsilon": Case(lambda mu: gaussian_epsilon(1e-5, mu), 1.25, (0.75, 1.25), 1e-5, 1e-6),
    "prefix_sum_rmse_toeplitz": Case(
        lambda a: prefix_sum_rmse(Toeplitz(jnp.stack([jnp.ones_like(a), a])), 1.5, 16),
        0.375, (0.375, 0.625), 1e-5, 1e-6),
    "prefix_sum_rmse_dense": Case(lambda a: prefix_sum_rmse(_corr(a), 1.5), 0.375, (0.375, 0.625), 1e-5, 1e-6),
    "gram_matrix": Case(lambda a: gram_matrix(_corr(a), B, E), 0.375, (0.375, 0.625), 1e-5, 1e-6),
    "gram_from_columns": Case(lambda a: gram_from_columns(jnp.stack([jnp.ones_like(a), a, 0.5 * a]), B, E),
                              0.375, (0.375, 0.625), 1e-5, 1e-6),
    "gram_from_dense": Case(lambda a: gram_from_dense(_corr(a), B), 0.375, (0.375, 0.625), 1e-5, 1e-6),
    "toeplitz_from_params": Case(lambda p: toeplitz_from_params(jnp.stack([p, 0.5 * p])).coeffs,
                                 -1.5, (-1.5, 0.25), 1e-5, 1e-6),
    "delta_estimate": Case(lambda s: delta_estimate(_gram64(), s, jnp.array([1.0, 2.0]), KEY, M)[0],
                           1.25, (1.25, 1.5), 1e-5, 1e-3),
    "delta_from_projections": Case(lambda s: delta_from_projections(_gram64(), _draws64()[1], _draws64()[0], s, 2.0),
                                   1.25, (1.25, 1.5), 1e-5, 1e-3),
    "calibrated_noise": Case(lambda a: calibrated_noise(_corr(a), B, E, num_samples=M, key=KEY, **TARGET),
                             0.375, (0.375, 0.625), 1e-5, 1e-3),
    "log_rmse_balls_in_bins": Case(
        lambda p: log_rmse_balls_in_bins(jnp.stack([p]), batches_per_epoch=B, epochs=E, num_samples=M,
                                         key=KEY, **TARGET),
        -1.5, (-1.5, -1.0), 1e-5, 1e-3),
}
# The default tier runs the matrix for one function of each kind (exact Gaussian curve, structured
# RMSE, Gram reduction, Monte Carlo estimate, calibration through the implicit adjoint, the
# optimization loss); the slow tier (-m slow) runs every row.  Each row costs several XLA
# compilations, which is what the 10-minute budget of the default suite is spent on.
DEFAULT_TIER = ("gaussian_epsilon", "prefix_sum_rmse_toeplitz", "gram_matrix", "delta_estimate",
                "calibrated_noise", "log_rmse_balls_in_bins")
NAMES = [n if n in DEFAULT_TIER else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)]


def _scalar(case):
    # Weights make every output entry count with a distinct factor in the gradient.
    def f(x):
        out = jnp.asarray(case.fn(x))
        w = jnp.arange(1, out.size + 1, dtype=out.dtype).reshape(out.shape)
        return jnp.sum(out * w)
    return f


@functools.lru_cache(maxsize=None)
def _reference(name):
    """(value, grad, vmapped values), all computed eagerly with x64 on at float64 inputs."""
    case = CASES[name]
    with jax.enable_x64(True):
        value = np.asarray(case.fn(jnp.float64(case.x)))
        grad = float(jax.grad(_scalar(case))(jnp.float64(case.x)))
        batch = np.stack([np.asarray(case.fn(jnp.float64(x))) for x in case.xs])
    return value, grad, batch


def _x(value, x64):
    return jnp.asarray(value, jnp.float64 if x64 else jnp.float32)


def _assert_close(actual, expected, rel):
    actual = np.asarray(actual, np.float64)
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * np.max(np.abs(expected)) * 1e-3)


def test_suite_runs_with_x64_off():
    assert not jax.config.jax_enable_x64


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
@pytest.mark.parametrize("name", NAMES)
def test_eager(name, x64):
    case = CASES[name]
    value, _, _ = _reference(name)
    with jax.enable_x64(x64):
        out = case.fn(_x(case.x, x64))
    # Eager calls return the float64 value even to float32 code.
    assert jnp.asarray(out).dtype == jnp.float64
    _assert_close(out, value, REL_EAGER)


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
@pytest.mark.parametrize("name", NAMES)
def test_grad(name, x64):
    case = CASES[name]
    _, grad, _ = _reference(name)
    with jax.enable_x64(x64):
        g = jax.grad(_scalar(case))(_x(case.x, x64))
    assert g.dtype == (jnp.float64 if x64 else jnp.float32)
    assert np.isfinite(float(g)) and grad != 0.0
    _assert_close(float(g), grad, REL_EAGER if x64 else REL_F32)
    if x64:
        # Central finite differences of the float64 function (common random numbers: fixed key).
        with jax.enable_x64(True):
            f = _scalar(case)
            h = case.fd_h
            fd = (float(f(jnp.float64(case.x + h))) - float(f(jnp.float64(case.x - h)))) / (2 * h)
        _assert_close(float(g), fd, case.fd_rel)


@pytest.mark.parametrize("x64", [False, True], ids=["x64off", "x64on"])
@pytest.mark.parametrize("name", NAMES)
def test_vmap(name, x64):
    case = CASES[name]
    _, _, batch = _reference(name)
    with jax.enable_x64(x64):
        out = jax.vmap(case.fn)(_x(np.array(case.xs), x64))
    out = np.asarray(out)
    assert out.dtype == (np.float64 if x64 else np.float32)
    _assert_close(out, batch, REL_VMAP64 if x64 else REL_F32)


@pytest.mark.parametrize("name", NAMES)
def test_jit_x64_off_raises_naming_the_fix(name):
    case = CASES[name]
    with pytest.raises(ValueError, match="enable_x64") as info:
        jax.jit(case.fn)(_x(case.x, False))
    assert "jit" in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_jit_x64_on(name):
    case = CASES[name]
    value, _, _ = _reference(name)
    with jax.enable_x64(True):
        out = jax.jit(case.fn)(_x(case.x, True))
    _assert_close(out, value, REL_VMAP64)
