"""Parameterizations of C (dpjax.optimization.parameterizations): validity, config errors, init."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpjax.matrices import BLT, Toeplitz
from dpjax.optimization import (BandedToeplitzParameterization, BLTParameterization,
                                ToeplitzParameterization,
                                make_parameterization, params_from_list, params_to_list,
                                prefix_sum_error, unamplified_loss, unamplified_sensitivity)
from dpjax.optimization.parameterizations import sqrt_prefix_sum_coefficients
from dpjax.montecarlo import gram_matrix

N = 24
CASES = [("toeplitz", {}), ("banded", {"bands": 5}), ("blt", {"num_buffers": 3}), ("dense", {})]


def _dense(par, params):
    corr = par.correlation(params)
    if isinstance(corr, (Toeplitz, BLT)):
        return np.asarray(corr.dense(par.n))
    return np.asarray(corr)


def _random_params(par, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(scale * rng.standard_normal(np.shape(v)), jnp.float64)
            for k, v in par.init().items()}


@pytest.mark.parametrize("family,kw", CASES)
def test_init_is_valid_lower_triangular_nonnegative_unit_diagonal(family, kw):
    par = make_parameterization(family, N, **kw)
    params = par.init()
    c = _dense(par, params)
    assert c.shape == (N, N) and c.dtype == np.float64
    assert np.all(np.triu(c, 1) == 0)
    assert np.all(c >= 0)
    np.testing.assert_array_equal(np.diagonal(c), 1.0)
    np.testing.assert_allclose(np.asarray(par.first_column(params)), c[:, 0], rtol=0, atol=0)
    assert par.num_params() == sum(np.size(v) for v in params.values())


def test_closed_form_init_is_the_sqrt_of_the_prefix_sum_matrix():
    c = sqrt_prefix_sum_coefficients(N)
    dense = np.asarray(Toeplitz(jnp.asarray(c)).dense(N))  # float64 (dpjax entry point)
    sq = dense @ dense
    np.testing.assert_allclose(np.asarray(sq), np.tril(np.ones((N, N))), atol=1e-12)
    par = ToeplitzParameterization(N)
    np.testing.assert_allclose(np.asarray(par.first_column(par.init())), c, rtol=1e-12)
    banded = BandedToeplitzParameterization(N, 4)
    np.testing.assert_allclose(np.asarray(banded.first_column(banded.init()))[:4], c[:4], rtol=1e-12)
    assert np.all(np.asarray(banded.first_column(banded.init()))[4:] == 0)
    # The BLT fit of the square root is close in prefix-sum error (within 5%).
    blt = BLTParameterization(256, 4)
    e_blt = float(prefix_sum_error(blt.correlation(blt.init()), 256))
    e_sqrt = float(prefix_sum_error(Toeplitz(jnp.asarray(sqrt_prefix_sum_coefficients(256))), 256))
    assert e_blt <= 1.05 * e_sqrt


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.1, 30.0))
def test_blt_decays_distinct_in_unit_interval_scales_positive(seed, scale):
    par = BLTParameterization(N, 4)
    blt = par.correlation(_random_params(par, seed, scale))
    theta = np.asarray(blt.buffer_decays)
    omega = np.asarray(blt.output_scales)
    assert np.all((theta > 0) & (theta < 1))
    assert np.all(np.diff(theta) < 0)  # strictly decreasing, hence distinct
    assert np.all(omega > 0)
    # Round trip parameters <- BLT.
    back = par.correlation(par.params_from_blt(blt))
    np.testing.assert_allclose(np.asarray(back.buffer_decays), theta, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(back.output_scales), omega, rtol=1e-9)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), family=st.sampled_from([c[0] for c in CASES]))
def test_any_parameters_give_a_valid_matrix(seed, family):
    par = make_parameterization(family, N, **dict(CASES)[family])
    c = _dense(par, _random_params(par, seed))
    assert np.all(np.isfinite(c)) and np.all(c >= 0) and np.all(np.triu(c, 1) == 0)
    np.testing.assert_array_equal(np.diagonal(c), 1.0)


def test_banded_zero_beyond_bands_and_identity_for_one_band():
    par = BandedToeplitzParameterization(N, 3)
    col = np.asarray(par.first_column(_random_params(par, 0)))
    assert np.all(col[3:] == 0) and np.all(col[1:3] > 0)
    eye = BandedToeplitzParameterization(N, 1)
    assert eye.num_params() == 0
    np.testing.assert_array_equal(_dense(eye, eye.init()), np.eye(N))


def test_correlation_is_jit_and_vmap_safe_and_differentiable():
    par = BLTParameterization(N, 2)
    params = par.init()
    with jax.enable_x64(True):
        col = jax.jit(par.first_column)(params)
        # vmap and grad staged into one program each (eagerly they compile every primitive
        # of the batched and differentiated computation on its own)
        batched = jax.jit(jax.vmap(par.first_column))(jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), params))
        grad = jax.jit(jax.grad(lambda p: jnp.sum(par.first_column(p) ** 2)))(params)
    np.testing.assert_allclose(np.asarray(batched[1]), np.asarray(col), rtol=1e-14)
    assert all(np.isfinite(np.asarray(g)).all() for g in grad.values())
    # From default float32 code: float64 result, and grad works.
    assert par.first_column(params).dtype == jnp.float64
    g32 = jax.grad(lambda p: jnp.sum(par.first_column(p)))(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in g32.values())


@pytest.mark.parametrize("family,kw", CASES)
def test_to_dict_from_dict_and_params_json_round_trip(family, kw):
    par = make_parameterization(family, N, **kw)
    d = json.loads(json.dumps(par.to_dict()))
    assert d["family"] == family == par.name
    again = type(par).from_dict(d)
    assert again == par and hash(again) == hash(par)
    params = _random_params(par, 1)
    back = params_from_list(json.loads(json.dumps(params_to_list(params))))
    np.testing.assert_array_equal(_dense(par, back), _dense(par, params))


def test_init_with_pattern_is_deterministic_and_lowers_the_unamplified_loss():
    b, epochs = 4, 6
    for family, kw in CASES:
        par = make_parameterization(family, b * epochs, **kw)
        p0 = par.init()
        p1 = par.init(batches_per_epoch=b, epochs=epochs, max_iterations=15)
        p2 = par.init(batches_per_epoch=b, epochs=epochs, max_iterations=15)
        np.testing.assert_array_equal(_dense(par, p1), _dense(par, p2))
        with jax.enable_x64(True):
            l0 = float(unamplified_loss(par, p0, b, epochs))
            l1 = float(unamplified_loss(par, p1, b, epochs))
        assert l1 < l0, (family, l0, l1)


def test_unamplified_sensitivity_matches_the_gram_diagonal():
    b, epochs = 4, 5
    col = np.asarray(sqrt_prefix_sum_coefficients(b * epochs))
    with jax.enable_x64(True):
        # One compiled program for both (the same bits as the eager calls, op by op)
        both = jax.jit(lambda c: (gram_matrix(Toeplitz(c), b, epochs), unamplified_sensitivity(c, b, epochs)))
        g, s = both(jnp.asarray(col))
        g, s = np.asarray(g), float(s)
    assert s == pytest.approx(np.sqrt(np.max(np.diagonal(g))), rel=1e-12)


@pytest.mark.parametrize("call,match", [
    (lambda: make_parameterization("lowrank", 8), "family"),
    (lambda: make_parameterization("banded", 8), "bands"),
    (lambda: make_parameterization("banded", 8, bands=9), "bands"),
    (lambda: make_parameterization("banded", 8, bands=0), "bands"),
    (lambda: make_parameterization("blt", 8), "num_buffers"),
    (lambda: make_parameterization("blt", 8, num_buffers=0), "num_buffers"),
    (lambda: make_parameterization("toeplitz", 8, num_buffers=2), "num_buffers"),
    (lambda: make_parameterization("toeplitz", 0), "n"),
    (lambda: make_parameterization("dense", 10_000), "n"),
    (lambda: ToeplitzParameterization(8).init(batches_per_epoch=3, epochs=2), "n must equal"),
    (lambda: ToeplitzParameterization(8).init(batches_per_epoch=4), "together"),
    (lambda: ToeplitzParameterization(8).init(batches_per_epoch=0, epochs=2), "batches_per_epoch"),
    (lambda: BLTParameterization(8, 2).check_params({"scales": jnp.zeros(2)}), "keys"),
    (lambda: ToeplitzParameterization(8).check_params({"coeffs": jnp.zeros(3)}), "shape"),
    (lambda: ToeplitzParameterization(8).check_params({"coeffs": jnp.full(7, jnp.nan)}), "finite"),
])
def test_bad_config_raises_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
