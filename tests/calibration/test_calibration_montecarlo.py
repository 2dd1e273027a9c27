"""Monte Carlo backend of the calibration: calibrated_noise and BallsInBins.calibrate.

The estimate with common random numbers (fixed key) is a deterministic function of (sigma, C),
so the calibrated sigma and its implicit gradient can be checked exactly against the
accountant's own delta_estimate and against central finite differences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.calibration import calibrated_noise
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins, delta_estimate, gram_matrix

B, E = 8, 2          # small mechanism: n = 16 rounds
M = 1 << 13          # 8192 common random numbers (>= 1/delta)
KW = dict(target_epsilon=1.5, target_delta=2e-3, num_samples=M, key=jax.random.key(7))

# Gradient tolerance 1e-3.  The CRN estimate is piecewise smooth in C: each sample
# adds a kink where its loss crosses epsilon.  Central differences with h = 1e-5 straddle a kink
# only for samples within ~1e-5 of it (a fraction ~1e-5 * density of 8192 samples), and the
# root is resolved to 1e-14 relative, so the FD error is ~1e-6 relative: 1e-3 is safe.
GRAD_REL = 1e-3


def _fd(f, x, h):
    return (float(f(x + h)) - float(f(x - h))) / (2 * h)


def test_calibrated_sigma_solves_the_estimate():
    c = Toeplitz(jnp.array([1.0, 0.5, 0.25]))
    sigma = float(calibrated_noise(c, B, E, **KW))
    with jax.enable_x64(True):
        g = gram_matrix(c, B, E)
        d_at = float(delta_estimate(g, sigma, KW["target_epsilon"], KW["key"], M)[0])
        d_below = float(delta_estimate(g, sigma * (1 - 1e-9), KW["target_epsilon"], KW["key"], M)[0])
    # The same draws as the accountant: at the returned sigma (upper end of a 1e-14 bracket)
    # the estimate meets the target, just below it it does not (up to summation-order
    # round-off ~1e-15 relative).
    assert d_at <= KW["target_delta"] * (1 + 1e-12)
    assert d_below > KW["target_delta"]
    # A 1-D array is a Toeplitz first column, as for BallsInBins.
    assert float(calibrated_noise(np.array([1.0, 0.5, 0.25]), B, E, **KW)) == pytest.approx(sigma, rel=1e-13)
    with pytest.raises(ValueError, match=r"correlation must be non-negative \(entries >= 0\)"):
        calibrated_noise(np.array([1.0, -0.5]), B, E, **KW)
    # The accountant's method gives the same number (thin delegation, same key).
    acc = BallsInBins(c, B, E)
    assert acc.calibrate(KW["target_epsilon"], KW["target_delta"], M, KW["key"]) == pytest.approx(sigma, rel=1e-13)


def test_gradient_banded_toeplitz_vs_finite_differences():
    coeffs = jnp.array([1.0, 0.6, 0.3])
    with jax.enable_x64(True):
        # The float32 numbers as float64: the finite differences below evaluate at float64
        # points, so the gradient's float64 input gives one compiled program for both.
        coeffs = coeffs.astype(jnp.float64)
        # One compiled program for the value and the gradient (compiles dominate this test).
        vg = jax.jit(jax.value_and_grad(lambda c: calibrated_noise(Toeplitz(c), B, E, **KW)))
        f = lambda c: vg(c)[0]  # noqa: E731
        grad = np.asarray(vg(coeffs)[1])
        for i in range(3):
            e = jnp.zeros(3).at[i].set(1.0)
            fd = _fd(lambda t: f(coeffs + t * e), 0.0, 1e-5)
            assert grad[i] == pytest.approx(fd, rel=GRAD_REL), i
    assert np.all(grad > 0)  # more correlation mass on these bands -> more noise needed


def test_gradient_dense_random_c_vs_finite_differences():
    n = B * E
    rng = np.random.default_rng(3)
    c = np.tril(rng.uniform(0.0, 0.4, (n, n)), -1) + np.eye(n)
    with jax.enable_x64(True):
        vg = jax.jit(jax.value_and_grad(lambda cc: calibrated_noise(cc, B, E, **KW)))
        f = lambda cc: vg(cc)[0]  # noqa: E731
        grad = np.asarray(vg(jnp.asarray(c))[1])
        for (i, j) in [(0, 0), (5, 2), (9, 1), (15, 0), (12, 12)]:
            e = np.zeros((n, n))
            e[i, j] = 1.0
            fd = _fd(lambda t: f(jnp.asarray(c + t * e)), 0.0, 1e-5)
            assert grad[i, j] == pytest.approx(fd, rel=GRAD_REL), (i, j)


@pytest.mark.slow  # 20-45 s on 2 cores; moved to the slow tier to keep the default suite near 10 min
def test_vmap_over_matrices_matches_single_calls():
    coeffs = jnp.array([[1.0, 0.2], [1.0, 0.5], [1.0, 0.9]])
    with jax.enable_x64(True):
        f = lambda c: calibrated_noise(Toeplitz(c), B, E, **KW)
        batched_val = jax.jit(jax.vmap(f))(coeffs)
        batched_grad = jax.jit(jax.vmap(jax.grad(f)))(coeffs)
        for k in range(3):
            assert float(batched_val[k]) == pytest.approx(float(f(coeffs[k])), rel=1e-12)
            np.testing.assert_allclose(np.asarray(batched_grad[k]), np.asarray(jax.grad(f)(coeffs[k])),
                                       rtol=1e-9)
    # more correlation -> larger sensitivity -> more noise
    assert float(batched_val[0]) < float(batched_val[1]) < float(batched_val[2])


def test_gradient_wrt_targets_is_consistent():
    # d sigma*/d delta = 1/(d delta_hat/d sigma) < 0 and d sigma*/d eps < 0.
    c = Toeplitz(jnp.array([1.0, 0.5]))
    with jax.enable_x64(True):
        f = lambda e, d: calibrated_noise(c, B, E, target_epsilon=e, target_delta=d,
                                          num_samples=M, key=KW["key"])
        g_eps, g_delta = jax.jit(jax.grad(f, argnums=(0, 1)))(1.5, 2e-3)
        fd_eps = _fd(lambda e: f(e, 2e-3), 1.5, 1e-5)
    assert float(g_eps) == pytest.approx(fd_eps, rel=GRAD_REL)
    assert float(g_eps) < 0 and float(g_delta) < 0


def test_bad_input_and_unreachable_targets():
    c = Toeplitz(jnp.array([1.0, 0.5]))
    kw = dict(KW)
    # Estimate mode: fewer samples than 1/delta are accepted (an estimate; only certification
    # demands enough samples), and the answer is a finite positive sigma.
    s_small = float(calibrated_noise(c, B, E, **{**kw, "target_delta": 1e-4, "num_samples": 64}))
    assert np.isfinite(s_small) and s_small > 0
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrated_noise(c, B, E, **{**kw, "target_epsilon": float("nan")})
    with pytest.raises(ValueError, match="target_delta"):
        calibrated_noise(c, B, E, **{**kw, "target_delta": 1.0})
    n = B * E
    with pytest.raises(ValueError, match="shape"):
        calibrated_noise(np.eye(n + 1), B, E, **kw)
    with pytest.raises(ValueError, match="lower triangular"):
        calibrated_noise(np.eye(n) + np.triu(np.ones((n, n)), 1), B, E, **kw)
    with pytest.raises(ValueError, match="non-negative"):
        calibrated_noise(np.eye(n) - np.tril(np.ones((n, n)), -1), B, E, **kw)
    with pytest.raises(ValueError, match="finite"):
        calibrated_noise(np.where(np.eye(n) > 0, np.nan, 0.0), B, E, **kw)
    with pytest.raises(ValueError, match="real"):
        calibrated_noise(np.eye(n) + 1j * np.eye(n), B, E, **kw)
    # A vacuous target: met even at the bottom of the search range.
    with pytest.raises(ValueError, match="vacuous"):
        calibrated_noise(c, B, E, **{**kw, "target_epsilon": 1e7})
    acc = BallsInBins(c, B, E)
    assert np.isfinite(acc.calibrate(2.0, 1e-6, M, 0))
    with pytest.raises(ValueError, match="num_samples"):
        acc.calibrate(2.0, 1e-6, 0, 0)


@pytest.mark.slow
def test_identity_calibration_matches_reference_family_g(reference_cases):
    case = reference_cases["G_bib_identity_b32_E8_calibrated_sigma_eps2_delta1e-5"]
    p = case["params"]
    m = 1 << 19
    acc = BallsInBins(np.eye(p["rounds_n"]), p["bins_per_epoch_b"], p["epochs_E"])
    sigma = acc.calibrate(p["epsilon"], p["delta"], m, 11)
    # Different random numbers from the reference (2^22 samples, SE 0.0086): the difference
    # has SE ~ 0.0086 * sqrt(2^22/2^19 + 1) = 0.026; 4 SE.
    assert sigma == pytest.approx(case["value"], abs=4 * 0.026)
