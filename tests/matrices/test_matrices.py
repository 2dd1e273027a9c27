"""Structured correlation matrices: Toeplitz / BLT columns, inverses, prefix-sum RMSE, gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpjax.matrices import (BLT, Toeplitz, correlation_array, inverse_toeplitz_column,
                            inverse_toeplitz_column_recurrence, prefix_sum_rmse, toeplitz_dense)

coeff_lists = st.lists(st.floats(0.0, 2.0, allow_nan=False), min_size=0, max_size=12).map(lambda c: [1.0] + c)


def test_toeplitz_dense_entries():
    c = Toeplitz(np.array([1.0, 0.5, 0.25]))
    d = np.asarray(c.dense(5))
    expected = np.array([[1, 0, 0, 0, 0], [0.5, 1, 0, 0, 0], [0.25, 0.5, 1, 0, 0],
                         [0, 0.25, 0.5, 1, 0], [0, 0, 0.25, 0.5, 1]])
    np.testing.assert_array_equal(d, expected)
    np.testing.assert_array_equal(np.asarray(c.column(2)), [1.0, 0.5])  # truncation


@given(coeff_lists, st.sampled_from([1, 2, 7, 16, 40]))
def test_inverse_column_matches_recurrence_and_dense_inverse(coeffs, n):
    # Newton/FFT inverse vs exact forward substitution and vs the dense inverse's first column.
    # Tolerance: FFT products carry ~1e-16 * n * max|v| absolute error per Newton step
    # (log2 n steps); inverse coefficients can grow like (max c)^k, so compare relative to max|v|.
    t = Toeplitz(np.asarray(coeffs))
    v = np.asarray(t.inverse_column(n))
    ref = inverse_toeplitz_column_recurrence(np.asarray(t.column(n)))
    scale = max(1.0, np.abs(ref).max())
    np.testing.assert_allclose(v, ref, rtol=0, atol=1e-11 * scale)
    if np.abs(ref).max() < 1e6:
        dense_inv = np.linalg.inv(np.asarray(t.dense(n)))
        np.testing.assert_allclose(v, dense_inv[:, 0], rtol=0, atol=1e-9 * scale)
        # C^{-1} is Toeplitz: every column is the shifted first column.
        np.testing.assert_allclose(dense_inv, np.asarray(toeplitz_dense(jnp.asarray(ref))), atol=1e-9 * scale)


def test_inverse_column_long():
    t = Toeplitz(np.array([1.0, 0.9, 0.5, 0.3, 0.1]))
    v = np.asarray(t.inverse_column(2048))
    ref = inverse_toeplitz_column_recurrence(np.asarray(t.column(2048)))
    np.testing.assert_allclose(v, ref, atol=1e-12 * max(1, np.abs(ref).max()))


def test_blt_column_formula_and_inverse():
    theta = np.array([0.9, 0.5, 0.1])
    omega = np.array([0.3, 0.2, 0.05])
    blt = BLT(theta, omega)
    col = np.asarray(blt.column(30))
    k = np.arange(1, 30)
    expected = np.concatenate([[1.0], (omega[None, :] * theta[None, :] ** (k[:, None] - 1)).sum(1)])
    np.testing.assert_allclose(col, expected, rtol=1e-14)
    inv = np.linalg.inv(np.asarray(blt.dense(30)))
    np.testing.assert_allclose(np.asarray(blt.inverse_column(30)), inv[:, 0], atol=1e-12)


def test_prefix_sum_rmse_identity_closed_form():
    # C = I: A has column norms^2 n, n-1, ..., 1 -> |A|_F^2 = n(n+1)/2, RMSE = sigma sqrt((n+1)/2).
    for n in (1, 4, 100):
        assert float(prefix_sum_rmse(Toeplitz(np.ones(1)), 2.0, n)) == pytest.approx(2.0 * np.sqrt((n + 1) / 2), rel=1e-13)


@given(coeff_lists, st.sampled_from([1, 5, 30]), st.floats(0.1, 5.0))
def test_prefix_sum_rmse_structured_equals_dense(coeffs, n, sigma):
    t = Toeplitz(np.asarray(coeffs))
    fast = float(prefix_sum_rmse(t, sigma, n))
    dense = float(prefix_sum_rmse(np.asarray(t.dense(n)), sigma))
    # Both are exact up to round-off of a triangular solve / FFT Newton; relative 1e-9 leaves
    # room for inverse coefficients growing to ~1e6.
    assert fast == pytest.approx(dense, rel=1e-9)


def test_prefix_sum_rmse_blt_equals_dense():
    blt = BLT(np.array([0.95, 0.6]), np.array([0.4, 0.1]))
    assert float(prefix_sum_rmse(blt, 1.3, 64)) == pytest.approx(float(prefix_sum_rmse(np.asarray(blt.dense(64)), 1.3)),
                                                                 rel=1e-11)


def test_gradients_match_finite_differences():
    n = 48
    c0 = np.array([1.0, 0.6, 0.3, 0.1])
    with jax.enable_x64(True):
        f = lambda c: prefix_sum_rmse(Toeplitz(c), 1.0, n)  # noqa: E731
        g = np.asarray(jax.grad(f)(jnp.asarray(c0)))
        h = 1e-6
        fd = [(float(f(jnp.asarray(c0 + h * e))) - float(f(jnp.asarray(c0 - h * e)))) / (2 * h) for e in np.eye(4)]
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)  # central differences: O(h^2) error

        theta0, omega0 = np.array([0.9, 0.4]), np.array([0.3, 0.2])
        fb = lambda th, om: prefix_sum_rmse(BLT(th, om), 1.0, n)  # noqa: E731
        gt, go = jax.grad(fb, argnums=(0, 1))(jnp.asarray(theta0), jnp.asarray(omega0))
        fd_t = [(float(fb(jnp.asarray(theta0 + h * e), jnp.asarray(omega0)))
                 - float(fb(jnp.asarray(theta0 - h * e), jnp.asarray(omega0)))) / (2 * h) for e in np.eye(2)]
        fd_o = [(float(fb(jnp.asarray(theta0), jnp.asarray(omega0 + h * e)))
                 - float(fb(jnp.asarray(theta0), jnp.asarray(omega0 - h * e)))) / (2 * h) for e in np.eye(2)]
        np.testing.assert_allclose(np.asarray(gt), fd_t, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(np.asarray(go), fd_o, rtol=1e-6, atol=1e-8)


def test_pytree_and_jit():
    t = Toeplitz(np.array([1.0, 0.5]))
    leaves, treedef = jax.tree_util.tree_flatten(t)
    assert len(leaves) == 1
    with jax.enable_x64(True):
        out = jax.jit(lambda tt: tt.inverse_column(6))(t)
    np.testing.assert_allclose(np.asarray(out), inverse_toeplitz_column_recurrence([1.0, 0.5, 0, 0, 0, 0]), atol=1e-15)
    with pytest.raises(dataclass_frozen_error()):
        t.coeffs = np.ones(2)


def dataclass_frozen_error():
    import dataclasses
    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize("bad, word", [
    (np.array([1.0, -0.5]), "non-negative"),
    (np.array([1.0, np.nan]), "finite"),
    (np.array([0.0, 0.5]), "coeffs[0]"),
    (np.ones((2, 2)), "1-D"),
])
def test_toeplitz_bad_input(bad, word):
    with pytest.raises(ValueError, match="coeffs") as info:
        Toeplitz(bad)
    assert word in str(info.value)


@pytest.mark.parametrize("theta, omega, name", [
    (np.array([1.0]), np.array([0.1]), "buffer_decays"),
    (np.array([0.0]), np.array([0.1]), "buffer_decays"),
    (np.array([0.5]), np.array([0.0]), "output_scales"),
    (np.array([0.5]), np.array([np.nan]), "output_scales"),
    (np.array([0.5, 0.2]), np.array([0.1]), "output_scales"),
])
def test_blt_bad_input(theta, omega, name):
    with pytest.raises(ValueError, match=name):
        BLT(theta, omega)


def test_prefix_sum_rmse_bad_input():
    with pytest.raises(ValueError, match="n must be given"):
        prefix_sum_rmse(Toeplitz(np.ones(1)), 1.0)
    with pytest.raises(ValueError, match="square"):
        prefix_sum_rmse(np.ones((2, 3)), 1.0)
    with pytest.raises(ValueError, match="lower triangular"):
        prefix_sum_rmse(np.ones((3, 3)), 1.0)
    with pytest.raises(ValueError, match="finite"):
        prefix_sum_rmse(np.array([[1.0, 0.0], [np.nan, 1.0]]), 1.0)
    with jax.enable_x64(True):
        assert float(inverse_toeplitz_column(jnp.array([2.0]))[0]) == 0.5


def test_correlation_array_dispatch():
    # Structured and 1-D inputs become the (n,) first column (zero-padded / truncated), dense
    # inputs stay (n, n): exact copies, so equality is exact.
    np.testing.assert_array_equal(np.asarray(correlation_array(Toeplitz(np.array([1.0, 0.5])), 4)),
                                  [1.0, 0.5, 0.0, 0.0])
    blt = BLT(np.array([0.5]), np.array([0.2]))
    np.testing.assert_array_equal(np.asarray(correlation_array(blt, 3)), np.asarray(blt.column(3)))
    np.testing.assert_array_equal(np.asarray(correlation_array(np.array([1.0, 0.5, 0.25]), 2)), [1.0, 0.5])
    dense = np.tril(np.ones((4, 4)))
    out = correlation_array(dense, 4)
    assert out.shape == (4, 4) and out.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(out), dense)
    # Traced input: shape checked, values passed through (differentiable).
    g = jax.grad(lambda a: jnp.sum(correlation_array(jnp.eye(3) * a, 3)))(2.0)
    assert float(g) == pytest.approx(3.0, rel=1e-6)


@pytest.mark.parametrize("bad, n, words", [
    (np.triu(np.ones((3, 3))), 3, "lower triangular"),
    (-np.eye(3), 3, "non-negative"),
    (np.eye(3) + 0j, 3, "real"),
    (np.where(np.eye(3) > 0, np.nan, 0.0), 3, "finite"),
    (np.array([1.0, np.inf]), 3, "finite"),
    (np.eye(4), 3, "(3, 3)"),
    (np.ones((3, 2)), 3, "square"),
    (np.ones((1, 1, 1)), 1, "2-D"),
    (np.array([]), 3, "non-empty"),
    (np.eye(3), 0, ">= 1"),
    ("identity", 3, "real array"),
])
def test_correlation_array_bad_input(bad, n, words):
    with pytest.raises(ValueError) as info:
        correlation_array(bad, n)
    message = str(info.value)
    assert words in message
    assert ("correlation" in message) or ("n (number of rounds)" in message)
