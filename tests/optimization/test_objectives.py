"""Workload errors (dpjax.optimization.objectives) against dense NumPy oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpjax.matrices import BLT, Toeplitz, prefix_sum_rmse
from dpjax.optimization import (max_error, prefix_sum_error, sgd_workload, workload_error)

N = 33


def _dense_np(column):
    column = np.asarray(column, dtype=np.float64)
    n = column.size
    i, j = np.indices((n, n))
    return np.where(i >= j, column[np.clip(i - j, 0, n - 1)], 0.0)


def _oracle(c_dense, workload):
    x = workload @ np.linalg.inv(c_dense)
    rows = np.sqrt(np.sum(x * x, axis=1))
    return np.sqrt(np.mean(rows ** 2)), rows.max()


def _blt():
    return BLT(buffer_decays=jnp.array([0.95, 0.6]), output_scales=jnp.array([0.3, 0.2]))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bands=st.integers(1, N))
def test_toeplitz_errors_match_the_dense_oracle(seed, bands):
    rng = np.random.default_rng(seed)
    col = np.concatenate([[1.0], rng.uniform(0.0, 1.0, bands - 1) / np.arange(1, bands) ** 0.5])
    col = col.astype(np.float32).astype(np.float64)  # what a float32 caller's array holds
    c = _dense_np(np.pad(col, (0, N - bands)))
    a = np.tril(np.ones((N, N)))
    rms, mx = _oracle(c, a)
    corr = Toeplitz(jnp.asarray(col))
    assert float(prefix_sum_error(corr, N)) == pytest.approx(rms, rel=1e-9)
    assert float(max_error(corr, N)) == pytest.approx(mx, rel=1e-9)
    # 1-D column and dense inputs give the same numbers.
    assert float(prefix_sum_error(col, N)) == pytest.approx(rms, rel=1e-9)
    assert float(prefix_sum_error(c, N)) == pytest.approx(rms, rel=1e-9)
    assert float(max_error(c, N)) == pytest.approx(mx, rel=1e-9)
    # Consistent with dpjax.matrices.prefix_sum_rmse (sigma = 1).
    assert float(prefix_sum_rmse(corr, 1.0, N)) == pytest.approx(float(prefix_sum_error(corr, N)), rel=1e-12)


def test_blt_and_workload_forms_agree():
    corr = _blt()
    c = _dense_np(np.asarray(corr.column(N)))
    rng = np.random.default_rng(0)
    w = rng.uniform(0.0, 1.0, (7, N)).astype(np.float32).astype(np.float64)
    rms, mx = _oracle(c, w)
    assert float(workload_error(corr, w, N)) == pytest.approx(rms, rel=1e-9)
    assert float(workload_error(corr, w, N, reduction="max")) == pytest.approx(mx, rel=1e-9)
    assert float(workload_error(c, w, N)) == pytest.approx(rms, rel=1e-9)
    # Callable workload: W x as a function.
    wj = jnp.asarray(w)
    with jax.enable_x64(True):
        fn = lambda x: wj.astype(jnp.float64) @ x  # noqa: E731
    assert float(workload_error(corr, fn, N)) == pytest.approx(rms, rel=1e-9)
    # Toeplitz workload (momentum), fast path == dense path == oracle.
    beta = 0.8
    mom_col = (beta ** np.arange(N)).astype(np.float32).astype(np.float64)
    rms_m, mx_m = _oracle(c, _dense_np(mom_col))
    wt = Toeplitz(jnp.asarray(mom_col))
    assert float(workload_error(corr, wt, N)) == pytest.approx(rms_m, rel=1e-9)
    assert float(workload_error(corr, wt, N, reduction="max")) == pytest.approx(mx_m, rel=1e-9)
    assert float(workload_error(c, wt, N)) == pytest.approx(rms_m, rel=1e-9)
    # Prefix sums as a workload == prefix_sum_error.
    assert float(workload_error(corr, np.tril(np.ones((N, N))), N)) == pytest.approx(
        float(prefix_sum_error(corr, N)), rel=1e-9)


def test_sgd_workload():
    np.testing.assert_array_equal(np.asarray(sgd_workload(5)), np.tril(np.ones((5, 5))))
    eta = np.array([1.0, 0.5, 0.5, 0.25])
    w = np.asarray(sgd_workload(4, momentum=0.5, learning_rates=eta))
    # Simulate SGD with momentum on unit gradients e_r: x_t coefficient of g_r.
    expect = np.zeros((4, 4))
    for r in range(4):
        v = x = 0.0
        for t in range(4):
            v = 0.5 * v + (1.0 if t == r else 0.0)
            x = x + eta[t] * v
            expect[t, r] = x
    np.testing.assert_allclose(w, expect, rtol=1e-14)
    corr = Toeplitz(jnp.array([1.0, 0.4]))
    val = float(workload_error(corr, sgd_workload(N, momentum=0.9), N))
    assert np.isfinite(val) and val > 0


def test_gradient_of_prefix_sum_error_matches_finite_differences():
    col = jnp.array([1.0, 0.5, 0.3, 0.2])
    with jax.enable_x64(True):
        col = col.astype(jnp.float64)
        # One compiled program for the values and the gradient, instead of every operation of
        # the error and of its gradient compiled one by one (eager).
        vg = jax.jit(jax.value_and_grad(lambda c: prefix_sum_error(Toeplitz(c), 64)))
        f = lambda c: vg(c)[0]  # noqa: E731
        g = np.asarray(vg(col)[1])
        h = 1e-6
        for k in range(1, 4):
            e = jnp.zeros(4).at[k].set(h)
            fd = (float(f(col + e)) - float(f(col - e))) / (2 * h)
            assert g[k] == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("call,match", [
    (lambda: prefix_sum_error(np.triu(np.ones((4, 4))), 4), "lower triangular"),
    (lambda: prefix_sum_error(-np.eye(4), 4), "non-negative"),
    (lambda: prefix_sum_error(np.eye(4), 5), r"\(n, n\)"),
    (lambda: prefix_sum_error(np.diag([1.0, 0.0, 1.0]), 3), "non-zero diagonal"),
    (lambda: prefix_sum_error(np.array([0.0, 1.0]), 3), "non-zero first entry"),
    (lambda: prefix_sum_error(np.full((3, 3), np.nan), 3), "finite"),
    (lambda: max_error(Toeplitz(jnp.ones(2)), 0), "n"),
    (lambda: workload_error(Toeplitz(jnp.ones(2)), np.ones((3, 5)), 4), "workload must have shape"),
    (lambda: workload_error(Toeplitz(jnp.ones(2)), np.ones((3, 4)), 4, reduction="mean"), "reduction"),
    (lambda: workload_error(Toeplitz(jnp.ones(2)), "prefix", 4), "workload"),
    (lambda: sgd_workload(4, momentum=1.0), "momentum"),
    (lambda: sgd_workload(4, learning_rates=[1.0, 1.0]), "learning_rates"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
