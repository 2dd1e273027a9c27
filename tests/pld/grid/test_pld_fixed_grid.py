"""The generic fixed-grid API (dpjax.pld.grid.fixed_grid): closed-form epsilon, gradients, soundness
away from the planning point, stacking, typed enums/records and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import pld

# A heterogeneous composition of two mechanism kinds: Gaussian (symmetric) and Poisson-
# subsampled Gaussian (not), both directions; small counts keep the program small.
COMPONENTS = [(pld.Gaussian(8.0), 20), (pld.PoissonSubsampledGaussian(1.0, 0.05), 200)]
DELTA = 1e-5
# Small FFTs keep the tests fast: a coarser per-step accuracy (1e-5 instead of 8e-9 per
# composed mechanism) and n_min = 2^10; the accountant is run with the same options when compared.
OPTS = pld.GridOptions(per_step_accuracy=1e-7, n_min=2**10)


@pytest.fixture(scope="module")
def grid():
    return pld.plan_fixed_grid(COMPONENTS, target_delta=DELTA, options=OPTS)


def _mechs(s_gauss, s_sub, q=0.05):
    return [pld.Gaussian(s_gauss), pld.PoissonSubsampledGaussian(s_sub, q)]


@pytest.mark.slow  # 20-45 s on 2 cores; moved to the slow tier to keep the default suite near 10 min
def test_plan_is_typed_and_matches_accountant(grid):
    assert isinstance(grid, pld.FixedGrid)
    assert grid.directions == (pld.Direction.REMOVE, pld.Direction.ADD)
    with jax.enable_x64(True):
        eps = float(pld.grid_epsilon_fn(grid, DELTA))
    ref = pld.epsilon(COMPONENTS, DELTA, options=OPTS)
    # Both are certified upper bounds (never below the accountant's certified lower bound);
    # the accountant plans with the same rules, so they agree to its discretization error
    # (GridOptions().relative_accuracy = 1e-3).
    assert ref.epsilon_lower <= eps
    assert eps == pytest.approx(ref.epsilon, rel=1e-3)


def test_closed_form_epsilon_inverts_delta(grid):
    # One jitted program (traced parameters) instead of the functions' eager paths, which
    # tests/pld/test_float32_pld.py checks: ~140 fewer op-by-op compilations.
    @jax.jit
    def closed_form_and_deltas(g, s_gauss, s_sub):
        mechs = _mechs(s_gauss, s_sub)
        eps = pld.grid_epsilon_fn(g, DELTA, mechs)
        return eps, pld.delta_fn(g, eps, mechs), pld.delta_fn(g, eps * (1 - 1e-7), mechs)

    with jax.enable_x64(True):
        eps, at_eps, below_eps = map(float, closed_form_and_deltas(grid, 7.0, 1.1))
    # delta_fn at the closed-form epsilon meets the target (to the round-off of
    # A - e^(eps - y) B with A ~ 1: 1e-13 absolute), and a hair below it does not.
    assert at_eps <= DELTA + 1e-13
    assert below_eps > DELTA - 1e-13


@pytest.mark.slow
def test_epsilon_gradient_vs_finite_differences(grid):
    with jax.enable_x64(True):
        f = jax.jit(lambda a, b, q: pld.grid_epsilon_fn(grid, DELTA, _mechs(a, b, q)))
        x0 = (8.0, 1.0, 0.05)
        g = jax.jit(jax.grad(lambda *x: f(*x), argnums=(0, 1, 2)))(*x0)
        # The certified delta curve has kinks at the grid points: its slope in epsilon jumps by
        # ~ dx x (hazard rate of the loss) per point (dx = 4.5e-4 here), so the closed-form
        # derivative (one segment's) differs from the secant over many segments by up to about
        # that (measured 6e-5 relative); central-difference truncation O(h^2) is ~1e-6.
        h = (1e-3 * 8.0, 1e-3, 1e-3 * 0.05)
        for i in range(3):
            xp, xm = list(x0), list(x0)
            xp[i] += h[i]
            xm[i] -= h[i]
            fd = (float(f(*xp)) - float(f(*xm))) / (2 * h[i])
            assert float(g[i]) == pytest.approx(fd, rel=1e-3), i
    assert float(g[0]) < 0 and float(g[1]) < 0 and float(g[2]) > 0
    # d eps / d delta by the closed form, against finite differences in the target.
    with jax.enable_x64(True):
        gd = float(jax.grad(lambda d: pld.grid_epsilon_fn(grid, d))(DELTA))
        fd = (float(pld.grid_epsilon_fn(grid, DELTA * 1.01)) - float(pld.grid_epsilon_fn(grid, DELTA / 1.01))) \
            / (DELTA * (1.01 - 1 / 1.01))
    assert gd == pytest.approx(fd, rel=2e-2) and gd < 0   # secant over a 2% change of delta


@pytest.mark.slow
def test_sound_far_from_the_planning_point(grid):
    """Less noise than planned (support beyond the planned window): still an upper bound, i.e.
    never below the accountant's certified lower bound planned at those parameters."""
    for s_gauss, s_sub in [(4.0, 0.6), (20.0, 3.0)]:
        comps = [(pld.Gaussian(s_gauss), 20), (pld.PoissonSubsampledGaussian(s_sub, 0.05), 200)]
        with jax.enable_x64(True):
            eps = float(pld.grid_epsilon_fn(grid, DELTA, _mechs(s_gauss, s_sub)))
        ref = pld.epsilon(comps, DELTA, options=OPTS)
        assert eps >= ref.epsilon_lower, (s_gauss, s_sub, eps, ref.epsilon_lower)


@pytest.mark.slow
def test_stacked_grids_vmap_like_single_calls():
    grids = [pld.plan_fixed_grid([(pld.PoissonSubsampledGaussian(s, 0.01), 500)], target_delta=DELTA,
                                 options=pld.GridOptions(n_min=2**12, n_max=2**12))
             for s in (0.9, 1.3)]
    stacked = pld.stack_grids(grids)
    sig = jnp.asarray([0.9, 1.3])
    with jax.enable_x64(True):
        both = jax.vmap(lambda g, s: pld.grid_epsilon_fn(g, DELTA, [pld.PoissonSubsampledGaussian(s, 0.01)]))(stacked, sig)
        padded = [jax.tree_util.tree_map(lambda a, i=i: a[i], stacked) for i in range(2)]
        one = [float(pld.grid_epsilon_fn(g, DELTA, [pld.PoissonSubsampledGaussian(s, 0.01)]))
               for g, s in zip(padded, (0.9, 1.3))]
    # Batched and single FFTs round differently; the round-off allowance follows the realized
    # noise (~1e-12 absolute in delta), which moves epsilon by ~1e-12 / |d delta / d eps|,
    # ~1e-7 relative here.
    np.testing.assert_allclose(np.asarray(both), one, rtol=1e-6)


def test_enums_and_typed_composition():
    assert pld.Direction("remove") is pld.Direction.REMOVE and pld.Direction.ADD == "add"
    assert hash(pld.Direction.ADD) == hash("add") and str(pld.Bound.LOWER) == "lower"
    with pytest.raises(ValueError, match=r"direction must be one of \['remove', 'add'\]"):
        pld.Direction.parse("replace")
    with pytest.raises(ValueError, match="bound must be one of"):
        pld.Bound.parse("middle")
    with jax.enable_x64(True):
        grid = pld.plan_fixed_grid([(pld.Gaussian(2.0), 3)], target_epsilon=1.0)
        g = pld.Group(grid.mechanisms[0], grid.counts[0], grid.offsets[0][0])
        out = pld.compose((g,), grid.dx, grid.lambdas[0], grid.log_tau, direction="remove",
                          ms=grid.ms[0], n=grid.n, kinds=("up", "down"))
        assert isinstance(out, pld.Composition) and isinstance(out.up, pld.ComposedPLD)
        # both conversions in one compiled program (eagerly they run op by op)
        up, lo = map(float, jax.jit(lambda u, d: (pld.delta_at(pld.table(u, "upper"), 1.0),
                                                  pld.delta_at(pld.table(d, pld.Bound.LOWER), 1.0)))(out.up, out.down))
        with pytest.raises(ValueError, match="bound must be one of"):
            pld.table(out.up, "upper_bound")
        with pytest.raises(ValueError, match="direction must be one of"):
            pld.compose((g,), grid.dx, grid.lambdas[0], grid.log_tau, direction="sideways",
                        ms=grid.ms[0], n=grid.n)
    # Gaussian mu = sqrt(3)/2: exact delta(1) bracketed by the two certified curves
    from scipy.stats import norm
    mu = np.sqrt(3) / 2
    exact = norm.cdf(-1 / mu + mu / 2) - np.e * norm.cdf(-1 / mu - mu / 2)
    assert lo <= exact <= up and up == pytest.approx(exact, rel=1e-4)


def test_bad_input(grid):
    with pytest.raises(ValueError, match="target_delta or target_epsilon"):
        pld.plan_fixed_grid(COMPONENTS)
    with pytest.raises(ValueError, match="target_delta"):
        pld.plan_fixed_grid(COMPONENTS, target_delta=2.0)
    with pytest.raises(ValueError, match="count"):
        pld.plan_fixed_grid([(pld.Gaussian(1.0), 0)], target_delta=DELTA)
    with pytest.raises(ValueError, match="one per planned"):
        pld.delta_fn(grid, 1.0, [pld.Gaussian(1.0)])
    with pytest.raises(ValueError, match=r"mechanisms\[0\] must be a Gaussian"):
        pld.delta_fn(grid, 1.0, [pld.Laplace(1.0), pld.PoissonSubsampledGaussian(1.0, 0.05)])
    with pytest.raises(ValueError, match="not traceable|cannot be traced"):
        jax.jit(lambda s: pld.plan_fixed_grid([(pld.Gaussian(s), 2)], target_delta=DELTA))(1.0)
