"""Random allocation / balls-in-bins accountant (dpjax.pld.allocation.lattice*, docs/design.md §12)."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from dpjax.pld.allocation import lattice as A
from dpjax.pld.allocation import accountant as R

sys.path.insert(0, str(Path(__file__).parent))
import _allocation_oracle as oracle  # noqa: E402


def _bracket(sigma, t, E, delta, k=1, **kw):
    r = R.allocation_accounting(sigma, t, E, target_delta=delta, selections_per_epoch=k, **kw)
    return float(r.epsilon_lower), float(r.epsilon)


def _oracle_eps(sigma, t, delta, h):
    u, p = oracle.log_sum_density(sigma, t, h=h, width=10.0)
    qm, pm = oracle.normalization(u, p, t)
    assert abs(qm - 1) < 1e-4 and abs(pm - 1) < 1e-4
    return oracle.epsilon(u, p, t, delta)


def _check_against_oracle(sigma, t, delta):
    """The quadrature oracle (two spacings: its own error estimate) lies inside dpjax's bracket."""
    e1 = _oracle_eps(sigma, t, delta, 8e-3)
    e2 = _oracle_eps(sigma, t, delta, 4e-3)
    err = 2.0 * abs(e2 - e1) + 1e-9 * e2
    lo, up = _bracket(sigma, t, 1, delta)
    assert lo - err <= e2 <= up + err, (sigma, t, delta, lo, e2, up, err)
    return lo, e2, up


@pytest.mark.parametrize("sigma,t,delta", [(1.0, 2, 1e-5), (0.8, 3, 1e-4)])
def test_quadrature_oracle_small_t(sigma, t, delta):
    lo, ref, up = _check_against_oracle(sigma, t, delta)
    assert (up - lo) <= 5e-3 * up


@pytest.mark.slow
@pytest.mark.parametrize("sigma,t,delta", [
    (1.0, 2, 1e-5), (0.6, 2, 1e-6), (2.0, 3, 1e-3), (0.8, 4, 1e-4), (1.5, 4, 1e-6),
    (0.5, 5, 1e-5), (1.2, 6, 1e-7), (3.0, 6, 1e-4), (0.9, 7, 1e-9), (1.0, 8, 1e-5),
])
def test_quadrature_oracle_ten_configs(sigma, t, delta):
    lo, ref, up = _check_against_oracle(sigma, t, delta)
    assert (up - lo) <= 5e-3 * up or (up < 0.02 and up - lo <= 1e-4)


def test_blocks_of_k_of_t():
    assert R.allocation_blocks(10, 1, 3) == [(10, 3)]
    assert R.allocation_blocks(10, 2, 3) == [(5, 6)]
    assert R.allocation_blocks(10, 3, 2) == [(3, 4), (4, 2)]    # 3 + 3 + 4 steps
    assert sum(c for _, c in R.allocation_blocks(100, 7, 5)) == 35
    assert sum(tb * c for tb, c in R.allocation_blocks(100, 7, 5)) == 100 * 5


def test_every_step_selected_is_the_exact_gaussian():
    from dpjax.numerics.exact import gaussian_epsilon

    r = R.allocation_accounting(2.0, 10, 3, target_delta=1e-6, selections_per_epoch=10)
    assert r.epsilon == pytest.approx(float(gaussian_epsilon(1e-6, math.sqrt(30) / 2.0)), rel=1e-9)
    assert r.epsilon_lower <= r.epsilon


def test_bracket_and_monotonicity():
    lo1, up1 = _bracket(1.0, 50, 2, 1e-5)
    lo2, up2 = _bracket(1.2, 50, 2, 1e-5)     # more noise: more private
    lo3, up3 = _bracket(1.0, 50, 4, 1e-5)     # more epochs: less private
    for lo, up in ((lo1, up1), (lo2, up2), (lo3, up3)):
        assert 0 < lo <= up and (up - lo) <= 5e-3 * up
    assert up2 < lo1 and up1 < lo3


def test_delta_query_is_consistent_with_epsilon_query():
    # (The two queries plan their own grids and tail budgets: their brackets overlap.)
    r = R.allocation_accounting(1.0, 64, 3, target_delta=1e-6)
    d = R.allocation_accounting(1.0, 64, 3, target_epsilon=r.epsilon)
    assert d.delta_lower <= 1e-6 <= d.delta * (1 + 1e-3) and d.delta <= 1e-6 * (1 + 1e-3)
    d_lo = R.allocation_accounting(1.0, 64, 3, target_epsilon=r.epsilon_lower)
    assert d_lo.delta_lower <= 1e-6 * (1 + 1e-3) and d_lo.delta >= 1e-6 * (1 - 1e-3)


def test_balls_in_bins_is_allocation_at_sigma_over_sqrt_epochs():
    a = R.balls_in_bins_accounting(1.5, 32, 4, target_delta=1e-5)
    b = R.allocation_accounting(0.75, 32, 1, target_delta=1e-5)
    assert a.epsilon == b.epsilon and a.epsilon_lower == b.epsilon_lower


def test_vector_targets():
    r = R.allocation_accounting(1.0, 32, 2, target_delta=[1e-4, 1e-6])
    assert r.epsilon.shape == (2,) and r.epsilon[0] < r.epsilon[1]
    d = R.allocation_accounting(1.0, 32, 2, target_epsilon=np.array([0.5, 1.0, 2.0]))
    assert np.all(np.diff(d.delta) < 0) and np.all(d.delta_lower <= d.delta)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(batches_per_epoch=0), "batches_per_epoch"),
    (dict(batches_per_epoch=2.5), "batches_per_epoch"),
    (dict(epochs=0), "epochs"),
    (dict(selections_per_epoch=11), "selections_per_epoch"),
    (dict(target_delta=0.0), "target_delta"),
    (dict(target_delta=1.0), "target_delta"),
])
def test_bad_input(kwargs, match):
    args = dict(noise_multiplier=1.0, batches_per_epoch=10, epochs=2, target_delta=1e-5)
    args.update(kwargs)
    k = args.pop("selections_per_epoch", 1)
    with pytest.raises(ValueError, match=match):
        R.allocation_accounting(args["noise_multiplier"], args["batches_per_epoch"], args["epochs"],
                                target_delta=args["target_delta"], selections_per_epoch=k)


@pytest.mark.slow
def test_k_of_t_reduction_bounds_the_exact_scheme():
    """The blocked scheme's certified delta is at or above a Monte Carlo estimate of the exact
    2-of-4 allocation (ratio: mean over the 6 pairs of exp(sum of the pair's losses))."""
    import itertools

    sigma, t, k, eps = 1.0, 4, 2, 1.0
    rng = np.random.default_rng(3)
    n = 2_000_000
    w = rng.standard_normal((n, t))
    s = 1.0 / sigma
    logz = s * w - 0.5 * s * s
    pairs = list(itertools.combinations(range(t), k))
    v = np.mean([np.exp(logz[:, i] + logz[:, j]) for i, j in pairs], axis=0)
    c = math.exp(eps)
    terms = np.maximum(v - c, 0.0)
    mc, se = terms.mean(), terms.std(ddof=1) / math.sqrt(n)
    up = R.allocation_accounting(sigma, t, 1, target_epsilon=eps, selections_per_epoch=k)
    assert up.delta >= mc - 3 * se


@pytest.mark.slow
@pytest.mark.parametrize("b,E,sigma", [(8, 2, 1.0), (16, 4, 1.5), (32, 1, 0.8), (64, 8, 2.0), (16, 16, 3.0),
                                       (128, 2, 1.2)])
def test_balls_in_bins_agrees_with_monte_carlo(b, E, sigma):
    from dpjax.matrices import Toeplitz
    from dpjax.montecarlo import BallsInBins

    eps = float(R.balls_in_bins_epsilon(sigma, b, E, 1e-3))
    res = R.balls_in_bins_accounting(sigma, b, E, target_epsilon=eps)
    acc = BallsInBins(Toeplitz(np.array([1.0])), batches_per_epoch=b, epochs=E)
    d, se = acc.delta(noise_multiplier=sigma, epsilon=eps, num_samples=1 << 20, key=b * 1000 + E)
    d, se = float(d), float(se)
    assert res.delta_lower - 3 * se <= d <= res.delta + 3 * se, (d, se, res.delta_lower, res.delta)


@pytest.mark.slow
def test_numpy_and_jax_paths_agree():
    import jax

    plan, _ = R.account_blocks(1.0, R.allocation_blocks(40, 1, 3), target_delta=1e-6)
    host = A.eps_of(A.NUMPY, R._run_numpy(plan, 1.0), np.asarray([1e-6, 1e-4]))
    with jax.enable_x64(True):
        up = R.allocation_epsilon_fn(plan, np.asarray([1e-6, 1e-4]), 1.0)
        lo = R.allocation_epsilon_fn(plan, np.asarray([1e-6, 1e-4]), 1.0, bound="lower")
    # (XLA's and SciPy's erfc differ in the last bits.)
    np.testing.assert_allclose(np.asarray(up), host[:2].max(0), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(lo), host[2:].max(0), rtol=1e-9)


@pytest.mark.slow
def test_float32_contract_grad_and_vmap():
    """From default-float32 code: eager, vmap and grad give float64 numerics (float32 outputs)."""
    import jax
    import jax.numpy as jnp

    assert not jax.config.jax_enable_x64
    plan, _ = R.account_blocks(1.0, R.allocation_blocks(16, 1, 2), target_delta=1e-5)
    e = R.allocation_epsilon_fn(plan, 1e-5, 1.0)
    vals = jax.vmap(lambda s: R.allocation_epsilon_fn(plan, 1e-5, s))(jnp.asarray([1.0, 1.1], jnp.float32))
    assert vals.dtype == jnp.float32 and float(vals[0]) == pytest.approx(float(e), rel=1e-6)
    assert float(vals[1]) < float(vals[0])
    g = jax.grad(lambda s: R.allocation_epsilon_fn(plan, 1e-5, s))(jnp.float32(1.0))
    h = 1e-4
    fd = (float(R.allocation_epsilon_fn(plan, 1e-5, 1.0 + h)) - float(R.allocation_epsilon_fn(plan, 1e-5, 1.0 - h))) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=2e-2)
    with pytest.raises(ValueError, match="jax_enable_x64"):
        jax.jit(lambda s: R.allocation_epsilon_fn(plan, 1e-5, s))(jnp.float32(1.0))


@pytest.mark.parametrize("sigma, t, E, delta", [(0.5063, 41, 1, 1.31e-6), (0.7, 20, 3, 1e-6), (1.0, 10, 1, 1e-9)])
def test_heavy_tail_room_is_chosen_before_the_run(monkeypatch, sigma, t, E, delta):
    """Few steps and small noise need a larger lattice room: the host probe of the dominating law's
    out-of-window mass picks it, so the accountant runs once, and the room it picks is needed
    (one step smaller, the run's own check fails)."""
    blocks = R.allocation_blocks(t, 1, E)
    budget = R.AllocationOptions().tail_fraction * delta
    runs = []
    real = R._run_numpy

    def counting(plan, sigma=None):
        runs.append(plan.room)
        return real(plan, sigma)

    monkeypatch.setattr(R, "_run_numpy", counting)
    plan, _ = R.account_blocks(sigma, blocks, target_delta=delta, coarse=False)
    assert plan.room > 1.0
    assert runs == [plan.room]
    smaller = {8.0: 1.0, 64.0: 8.0, 1e9: 64.0}[plan.room]
    comp = real(R.plan_allocation(sigma, blocks, target_delta=delta, room=smaller))
    assert np.max(np.asarray(comp.p_inf)[:2]) > 0.5 * budget


@pytest.mark.parametrize("sigma, t, E, delta, kept", [(0.5063, 41, 1, 1.31e-6, True), (1.0, 100, 1, 1e-5, True),
                                                       (2.6235, 151, 2, 4.8e-4, False), (2.7847, 18, 1, 6.34e-4, False)])
def test_coarse_lattice_is_kept_only_where_its_bracket_is_narrow(sigma, t, E, delta, kept):
    """Epsilon queries on a large lattice run first on one a quarter the size and keep it where the
    bracket is within ``coarse_width`` (relative); elsewhere (a wider coarse bracket, or a small
    lattice: no coarse run) the full lattice runs.  Either way the bracket overlaps the full
    lattice's (both are certified) and is within the default width."""
    opts = R.AllocationOptions()
    blocks = R.allocation_blocks(t, 1, E)
    plan, comp = R.account_blocks(sigma, blocks, target_delta=delta)
    full_plan, full = R.account_blocks(sigma, blocks, target_delta=delta, coarse=False)
    assert full_plan.shape.n == R._lattice_window(opts, t)
    assert (plan.shape.n < full_plan.shape.n) == kept
    large = R._lattice_size(sigma, blocks, delta, opts) >= opts.coarse_min_size
    assert large or not kept
    if large:
        small = dataclasses.replace(opts, lattice_factor=opts.lattice_factor / 4, min_lattice=opts.min_lattice // 4,
                                    coarse_fraction=1.0)
        _, coarse = R.account_blocks(sigma, blocks, target_delta=delta, options=small)
        assert R._narrow(coarse, delta, opts.coarse_width) == kept
    ours, ref = (np.asarray(A.eps_of(A.NUMPY, c, np.asarray(delta))) for c in (comp, full))
    upper, lower = ours[:2].max(), ours[2:].max()
    ref_upper, ref_lower = ref[:2].max(), ref[2:].max()
    assert upper >= ref_lower and ref_upper >= lower
    assert upper - lower <= 5e-3 * upper
    assert R.allocation_accounting(sigma, t, E, target_delta=delta).epsilon == upper
    if kept:
        # The coarse upper end is within coarse_width of the full lattice's.
        assert upper - ref_upper <= opts.coarse_width * upper


@pytest.mark.parametrize("sigma, t", [(1.0, 100.0), (0.5063, 41.0), (2.0, 1000.0)])
def test_host_lattice_laws_on_shorter_prefixes_are_the_full_ones(sigma, t):
    """The host computes each level's lattice laws on the shortest power-of-two prefix holding its
    support; the result equals the laws on the whole lattice exactly (every entry beyond ``b_k``
    is zero, and the entries are computed element-wise: equal up to the last bits NumPy's
    vectorized transcendental functions may vary in with the array layout)."""
    tau = 1e-12
    levels, n = R._levels(sigma, t, tau), 4096
    m = n + n // 4
    geo = A.band_geometry(A.NUMPY, sigma, t, tau, levels=levels, n=n, m=m)
    s = 1.0 / sigma
    with np.errstate(all="ignore"):
        laws, origins = A._lattice_laws(A.NUMPY, s, t, geo["g"], geo["bl"], geo["bh"], m)
        bottom = A._bottom_and_contraction(A.NUMPY, s, t, geo["g"], geo["bl"])
        full, full_origins = A._lattice_laws_on(A.NUMPY, s, t, geo["g"], geo["bl"], geo["bh"], m, bottom)
    support = np.ceil(geo["bh"] / geo["g"]) + 3
    assert np.any(support <= m // 4)                       # some levels do take a short prefix
    np.testing.assert_array_equal(origins, full_origins)
    np.testing.assert_allclose(laws, full, rtol=1e-13, atol=0.0)
    np.testing.assert_array_equal(laws == 0.0, full == 0.0)
    assert np.all(full.sum(-1) > 0)


def test_closed_form_upper_end_covers_the_rounding_of_small_mu_deep_tails():
    # mu ~ 7e-4 at delta ~ 1e-89: the closed form's rounding error (~2e-9 relative) exceeded the
    # plain 1e-9 margin, and the unamplified Gaussian's delta, the bracket's upper end, was below
    # the truth (60-digit mpmath).
    import mpmath as mp

    eps, mu = 0.014184393998722632, 0.0007258931007170726
    upper, lower = R.closed_form_bracket(math.sqrt(3) / mu, [(10, 3)], target_epsilon=eps, mu=mu)
    with mp.workdps(60):
        e, m = mp.mpf(eps), mp.mpf(mu)
        truth = mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)
    assert mp.mpf(float(upper)) >= truth and float(upper) <= float(truth) * (1 + 1e-6)
    assert float(lower) <= float(upper)
