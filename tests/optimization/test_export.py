"""Export to jax_privacy and back (dpjax.optimization.export); skipped without jax_privacy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.matrices import BLT
from dpjax.optimization import make_parameterization
from dpjax.optimization.export import from_jax_privacy, to_jax_privacy

mf = pytest.importorskip("jax_privacy.matrix_factorization")
N = 40


def test_blt_round_trip_and_conventions_agree():
    par = make_parameterization("blt", N, num_buffers=3)
    rng = np.random.default_rng(0)
    params = {k: v + 0.5 * rng.standard_normal(np.shape(v)) for k, v in par.init().items()}
    blt = par.correlation(params)
    jp = to_jax_privacy(blt)
    assert isinstance(jp, mf.buffered_toeplitz.BufferedToeplitz)
    assert jp.buf_decay.dtype == jnp.float64
    with jax.enable_x64(True):
        # Same matrix: jax_privacy's Toeplitz coefficients and dense form == dpjax's.
        np.testing.assert_allclose(np.asarray(jp.toeplitz_coefs(N)), np.asarray(blt.column(N)), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(jp.materialize(N)), np.asarray(blt.dense(N)), rtol=1e-13, atol=1e-15)
        # Same inverse: jax_privacy's BLT inverse vs dpjax's Newton power-series inverse.
        np.testing.assert_allclose(np.asarray(jp.inverse().toeplitz_coefs(N)),
                                   np.asarray(blt.inverse_column(N)), rtol=1e-8, atol=1e-12)
    back = from_jax_privacy(jp)
    assert isinstance(back, BLT)
    np.testing.assert_allclose(np.asarray(back.column(N)), np.asarray(blt.column(N)), rtol=1e-14)
    # ... and back to the same parameters' matrix.
    again = par.correlation(par.params_from_blt(back))
    np.testing.assert_allclose(np.asarray(again.column(N)), np.asarray(blt.column(N)), rtol=1e-10)
    # The export of parameters directly.
    jp2 = to_jax_privacy(params, parameterization=par)
    np.testing.assert_array_equal(np.asarray(jp2.buf_decay), np.asarray(jp.buf_decay))


def test_toeplitz_round_trip_and_jax_privacy_error_agrees():
    par = make_parameterization("banded", N, bands=6)
    params = par.init()
    corr = par.correlation(params)
    coefs = to_jax_privacy(corr)
    assert coefs.shape == (6,) and coefs.dtype == jnp.float64
    full = to_jax_privacy(params, parameterization=par)
    assert full.shape == (N,)
    back = from_jax_privacy(coefs)
    np.testing.assert_array_equal(np.asarray(back.coeffs), np.asarray(corr.coeffs))
    with jax.enable_x64(True):
        # jax_privacy's per-query error of C on prefix sums == dpjax's prefix_sum_error^2 * n.
        from dpjax.optimization import prefix_sum_error
        pq = mf.toeplitz.per_query_error(strategy_coef=jnp.asarray(full), n=N)
        assert float(jnp.mean(pq)) == pytest.approx(float(prefix_sum_error(corr, N)) ** 2, rel=1e-10)
    # jax_privacy's unit-norm banded coefficients normalize to c_0 = 1.
    unit = np.asarray(coefs) / np.linalg.norm(np.asarray(coefs))
    t = from_jax_privacy(unit, normalize=True)
    np.testing.assert_allclose(np.asarray(t.coeffs), np.asarray(coefs), rtol=1e-14)


@pytest.mark.parametrize("call,match", [
    (lambda: to_jax_privacy(np.eye(3)), "BLT or Toeplitz"),
    (lambda: from_jax_privacy(np.array([1.0, -0.5])), "non-negative"),
    (lambda: from_jax_privacy(np.ones((2, 2))), "1-D"),
    (lambda: from_jax_privacy(np.array([0.0, 1.0]), normalize=True), "coef"),
    (lambda: from_jax_privacy(mf.buffered_toeplitz.BufferedToeplitz(
        buf_decay=np.array([1.2]), output_scale=np.array([0.1]))), "buffer_decays"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_without_jax_privacy_the_error_names_the_extra(monkeypatch):
    """The optional dependency is named where it is needed, with the extra that installs it
    (pyproject.toml defines it)."""
    import pathlib
    import sys
    import tomllib

    monkeypatch.setitem(sys.modules, "jax_privacy", None)   # import jax_privacy... raises ImportError
    monkeypatch.setitem(sys.modules, "jax_privacy.matrix_factorization", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[jax-privacy\]"'):
        to_jax_privacy(BLT(jnp.array([0.9]), jnp.array([0.1])), 8)
    root = pathlib.Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("jax-privacy") for r in extras["jax-privacy"])
    readme = (root / "README.md").read_text()
    assert 'pip install -e ".[jax-privacy]"' in readme
