"""PLD layers: mechanism CDFs, discretization invariants, fixed-grid jit/vmap/grad, bad input,
regimes the grid cannot hold."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import dpjax
from dpjax import pld


# ------------------------------------------------------------------ mechanisms vs scipy
def _x64(fn):
    with jax.enable_x64(True):
        return jax.device_get(fn())


def test_subsampled_gaussian_cdfs_match_scipy():
    """P(Y <= y) by direct inversion of the loss, against scipy on the mixture; tails keep
    relative accuracy (survival computed directly, never 1 - cdf)."""
    s, q = 0.9, 0.05
    mech = pld.PoissonSubsampledGaussian(s, q)
    y = np.array([-0.04, 0.0, 0.3, 2.0, 8.0])
    c = _x64(lambda: mech.loss_cdfs("remove", jnp.asarray(y)))
    x = s * s * np.log((np.expm1(y) + q) / q) + 0.5
    p_gt = (1 - q) * stats.norm.sf(x / s) + q * stats.norm.sf((x - 1) / s)
    np.testing.assert_allclose(c.p_gt, p_gt, rtol=1e-12)
    np.testing.assert_allclose(c.q_gt, stats.norm.sf(x / s), rtol=1e-12)
    np.testing.assert_allclose(c.p_le + c.p_gt, 1.0, rtol=1e-15)
    # add direction: Y = -l(X), X ~ N(0, s^2):  P(Y <= y) = P(X >= x(-y))
    ca = _x64(lambda: mech.loss_cdfs("add", jnp.asarray(-y)))
    np.testing.assert_allclose(ca.p_le, stats.norm.sf(x / s), rtol=1e-12)


def test_laplace_and_rr_atoms():
    lap = pld.Laplace(2.0, 1.0)   # a = 0.5: atoms +0.5 (P 1/2), -0.5 (P e^-0.5 / 2)
    c = _x64(lambda: lap.loss_cdfs("remove", jnp.asarray([-0.6, -0.5, 0.49, 0.5, 0.5 - 1e-13])))
    np.testing.assert_allclose(c.p_le[:4], [0.0, 0.5 * math.exp(-0.5), 0.5 * math.exp(-0.005), 1.0], rtol=1e-14)
    # Q-mass of the +a atom is e^-a times its P-mass (1/2); the jump of Q's CDF at y = a.
    np.testing.assert_allclose(c.q_le[3] - c.q_le[4], 0.5 * math.exp(-0.5), rtol=1e-9)
    rr = pld.RandomizedResponse(0.96, 2)
    ell = math.log1p(2 * 0.04 / 0.96)   # = log(0.52/0.48), computed as the mechanism does
    assert ell == pytest.approx(math.log(0.52 / 0.48), rel=1e-14)
    # Points 1e-12 inside/outside the atoms (an atom exactly on a query point is ulp-fragile).
    c = _x64(lambda: rr.loss_cdfs("remove", jnp.asarray([-ell - 1e-9, -ell + 1e-12, ell - 1e-9, ell + 1e-12])))
    np.testing.assert_allclose(c.p_le, [0.0, 0.48, 0.48, 1.0], rtol=1e-14)
    np.testing.assert_allclose(c.q_le, [0.0, 0.52, 0.52, 1.0], rtol=1e-14)


def test_discretization_dominates_and_conserves():
    """Connect-the-dots keeps P-mass and Q-mass (sum p e^{-y} over the grid <= 1) and the
    optimistic PMF is below the pessimistic one in the hockey-stick sense."""
    mech = pld.PoissonSubsampledGaussian(1.0, 0.1)
    dx, m, off = 1e-3, 4096, -200
    g = _x64(lambda: pld.discretize(mech, "remove", off, dx, m))
    y = (off + np.arange(m)) * dx
    assert abs(g.pmf_up.sum() + g.p_inf_up - 1.0) < 1e-12
    assert np.all(g.pmf_up >= 0) and np.all(g.pmf_down >= 0)
    assert np.sum(g.pmf_up * np.exp(-y)) <= 1.0 + 1e-12          # Q-mass of the split pair
    for eps in (0.0, 0.5, 1.5):
        up = np.sum(g.pmf_up * np.maximum(0, 1 - np.exp(eps - y))) + g.p_inf_up
        down = np.sum(g.pmf_down * np.maximum(0, 1 - np.exp(eps - y)))
        assert down <= up


# ------------------------------------------------------------------ fixed grid: jit/vmap/grad
@pytest.fixture(scope="module")
def fixed_grid():
    # Planned once at sigma = 1 (tail budget 1e-6 * target_delta); any sigma, q may be traced.
    grid = pld.plan_fixed_grid([(pld.PoissonSubsampledGaussian(1.0, 0.01), 1000)], target_delta=1e-5)

    def delta_fn(eps, sigma, q):
        return pld.delta_fn(grid, eps, [pld.PoissonSubsampledGaussian(sigma, q)])

    return delta_fn


@pytest.fixture(scope="module")
def fixed_grid_jit(fixed_grid):
    # One compiled program, value and gradient, for the gradient, its finite differences and the
    # loop of single calls.
    return jax.jit(jax.value_and_grad(fixed_grid, argnums=(0, 1, 2)))


def test_fixed_grid_grad_matches_finite_differences(fixed_grid_jit):
    with jax.enable_x64(True):
        f = lambda *x: fixed_grid_jit(*x)[0]
        g = fixed_grid_jit(2.0, 1.0, 0.01)[1]
        h = (1e-5, 1e-5, 1e-7)
        x0 = (2.0, 1.0, 0.01)
        for i in range(3):
            xp = list(x0); xm = list(x0)
            xp[i] += h[i]; xm[i] -= h[i]
            fd = (f(*xp) - f(*xm)) / (2 * h[i])
            # central differences of a smooth function: truncation O(h^2) plus round-off
            # ~1e-17/h; 1e-3 relative covers both at these step sizes.
            assert float(g[i]) == pytest.approx(float(fd), rel=1e-3)
        assert float(g[0]) < 0 and float(g[1]) < 0 and float(g[2]) > 0


def test_fixed_grid_vmap_matches_loop_and_accountant(fixed_grid, fixed_grid_jit):
    with jax.enable_x64(True):
        sig = jnp.linspace(0.9, 1.2, 4)
        # one compiled batched program (eager vmap would run the conversions op by op)
        batched = jax.jit(jax.vmap(fixed_grid, in_axes=(None, 0, None)))(2.0, sig, 0.01)
        single = jnp.stack([fixed_grid_jit(2.0, float(s), 0.01)[0] for s in sig])
    # Batched and single FFTs round differently; the a-posteriori round-off allowance
    # (n x largest negative bin, ~1e-13 here) follows the realized noise, so compare to 1e-12.
    np.testing.assert_allclose(batched, single, rtol=1e-9, atol=1e-12)
    # at the planning point it agrees with the public accountant (different tail budget ->
    # slightly different grid: 1% in delta)
    assert float(single[1]) == pytest.approx(dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0), rel=1e-2)
    assert np.all(np.diff(np.asarray(batched)) < 0)   # more noise, less delta


# ------------------------------------------------------------------ vectorized conversions
def test_vectorized_targets_match_scalar_calls():
    deltas = np.array([1e-3, 1e-5, 1e-7])
    res = pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=deltas, with_lower=False)
    assert res.epsilon.shape == (3,) and np.all(np.diff(res.epsilon) > 0)
    one = pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-7, with_lower=False).epsilon
    assert res.epsilon[2] == pytest.approx(one, rel=1e-12)   # same grid (budget from min delta)
    d = pld.delta([(pld.Gaussian(2.0), 4)], [0.0, 1.0, 3.0])
    assert d.delta.shape == (3,) and np.all(np.diff(d.delta) < 0) and np.all(d.delta_lower <= d.delta)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "args, match",
    [
        ((0.0, 0.01, 10, 1e-5), "noise_multiplier"),
        ((-1.0, 0.01, 10, 1e-5), "noise_multiplier"),
        ((float("nan"), 0.01, 10, 1e-5), "noise_multiplier"),
        ((1.0, 0.0, 10, 1e-5), r"sampling_prob.*\(0, 1\]"),
        ((1.0, 1.5, 10, 1e-5), r"sampling_prob.*\(0, 1\]"),
        ((1.0, 0.01, 0, 1e-5), r"steps.*>= 1"),
        ((1.0, 0.01, 2.5, 1e-5), r"steps.*integer"),
        ((1.0, 0.01, 10, 0.0), r"target_delta.*\(0, 1\)"),
        ((1.0, 0.01, 10, 1.0), r"target_delta.*\(0, 1\)"),
        ((1.0, 0.01, 10, float("nan")), "target_delta"),
        ((np.array([1.0, 0.0]), 0.01, 10, 1e-5), "noise_multiplier"),   # a batch with a bad element
        ((np.ones(2), 0.01, np.array([10, 20, 30]), 1e-5), "broadcast"),
    ],
)
def test_bad_input_epsilon(args, match):
    with pytest.raises(ValueError, match=match):
        dpjax.dpsgd_epsilon(*args)


def test_bad_noise_schedule_names_its_length():
    with pytest.raises(ValueError, match="noise_schedule.*length steps"):
        dpjax.dpsgd_epsilon(noise_schedule=np.ones(5), sampling_prob=0.01, steps=10, target_delta=1e-5)


def test_bad_input_delta_and_mechanisms():
    with pytest.raises(ValueError, match=r"target_epsilon.*>= 0"):
        dpjax.dpsgd_delta(1.0, 0.01, 10, -0.5)
    with pytest.raises(ValueError, match="scale"):
        pld.epsilon([(pld.Laplace(0.0), 3)], 1e-5)
    with pytest.raises(ValueError, match="noise_parameter"):
        pld.epsilon([(pld.RandomizedResponse(1.5, 2), 3)], 1e-5)
    with pytest.raises(ValueError, match="count"):
        pld.epsilon([(pld.Gaussian(1.0), 0)], 1e-5)


# ------------------------------------------------------------------ regimes beyond the grid
def test_tiny_sigma_returns_inf_with_reason():
    """sigma = 0.01, one step: the loss sits near 5000, beyond any window we allow; the
    answer must be inf with a reason (or a number >= truth), never NaN."""
    res = pld.dpsgd_accounting(0.01, 1.0, 1, target_delta=1e-5)
    assert not np.isnan(res.epsilon)
    exact_lower = 1 / (2 * 0.01**2)   # the loss mean alone; the true epsilon is larger
    assert res.epsilon >= exact_lower
    if math.isinf(res.epsilon):
        assert res.reason and "target_delta" in res.reason
    assert res.epsilon_lower <= res.epsilon


def test_large_delta_gives_zero_epsilon():
    assert dpjax.dpsgd_epsilon(1.0, 1.0, 1, 0.9) == 0.0


def test_q_one_is_the_gaussian_in_both_directions():
    """q = 1: the subsampled pair is the Gaussian pair; the add direction at y << 0 and y >> 0
    must not cancel (a past bug computed e^y - (1-q) as expm1(y) + q = 0 and reported
    P(Y <= 600) = 1 for sigma = 0.01)."""
    s = 0.01
    y = np.array([-6000.0, -600.0, 0.0, 600.0, 4900.0, 5000.0, 5100.0])
    sub = pld.PoissonSubsampledGaussian(s, 1.0)
    gau = pld.Gaussian(s)
    for d in ("remove", "add"):
        a = _x64(lambda: sub.loss_cdfs(d, jnp.asarray(y)))
        b = _x64(lambda: gau.loss_cdfs(d, jnp.asarray(y)))
        np.testing.assert_allclose(a.p_le, b.p_le, rtol=1e-9, atol=1e-300)
        np.testing.assert_allclose(a.p_gt, b.p_gt, rtol=1e-9, atol=1e-300)


def test_bad_components_and_options():
    with pytest.raises(ValueError, match="not a mechanism"):
        pld.epsilon([(3.0, 2)], 1e-5)
    with pytest.raises(ValueError, match="must not be empty"):
        pld.epsilon([], 1e-5)
    with pytest.raises(ValueError, match="relative_accuracy"):
        pld.GridOptions(relative_accuracy=0.0)
    with pytest.raises(ValueError, match="power of two"):
        pld.GridOptions(n_min=1000)
    with pytest.raises(ValueError, match="GridOptions"):
        pld.epsilon(pld.Gaussian(1.0), 1e-5, options={"n_min": 1024})
