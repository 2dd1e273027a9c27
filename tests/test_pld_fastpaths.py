"""The steady-state fast paths of the PLD accountant against their plain definitions.

* ``convert.epsilon`` (block search, only one block's suffix sums) equals ``eps_at(table(...))``
  (all suffix sums) on random PMFs: same segment, same closed form, so agreement to round-off;
  a broken PMF gives ``inf`` (upper) / ``0`` (lower), never a finite number.
* ``compose.pmf_log_mgf`` (blocked: 64 exponentials shared per block) equals the direct sum: the
  wrap-around bounds are built on it, so it must not drop below the exact value beyond rounding.
* ``compose_directions`` (both directions batched) equals ``compose`` run per direction.
* The planner's vectorized erfc (probe only, never a reported bound) is within 1.2e-7 relative
  of ``math.erfc`` down to underflow.
"""

from __future__ import annotations

import functools

import pytest
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from dpjax import pld
from dpjax.pld import convert
from dpjax.pld.engine import prepare
from dpjax.pld.compose import ComposedPLD, pmf_log_mgf, compose, compose_directions
from dpjax.pld.mechanisms import _np_erfc_nonneg


def _random_pld(seed: int) -> ComposedPLD:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([64, 96, 128, 192, 768, 1024, 3072, 4096]))
    mu, sd, dx = rng.uniform(-2, 4), rng.uniform(0.05, 2), rng.uniform(1e-3, 0.05)
    w_lo = int(rng.integers(-n, 0))
    y = (w_lo + np.arange(n)) * dx
    r = np.exp(-0.5 * ((y - mu) / sd) ** 2) * rng.uniform(0.5, 1.5, n)
    if seed % 3 == 0:
        r[rng.random(n) < 0.3] = 0.0   # holes: plateaus of delta(eps)
    r = r / max(r.sum(), 1e-300) * rng.uniform(0.5, 1.0)
    f = jnp.float64
    return ComposedPLD(pmf=jnp.asarray(r), w_lo=jnp.int64(w_lo), dx=f(dx), p_inf=f(rng.choice([0.0, 1e-8, 1e-3])),
                       tail_above=f(1e-12), tail_below=f(1e-12), roundoff=f(1e-13),
                       roundoff_rel=f(rng.choice([0.0, 1e-12])), log_mgf=jnp.zeros(2), needed_width=f(1.0))


_DELTAS = np.r_[np.geomspace(1e-12, 0.9, 25), 0.999999, 1.0]


@pytest.mark.slow  # ~43 s on 2 cores; moved to the slow tier to keep the default suite near 10 min
@given(st.integers(0, 10_000))
def test_block_epsilon_equals_table_epsilon(seed):
    with jax.enable_x64(True):
        p = _random_pld(seed)
        d = jnp.asarray(_DELTAS)
        for bound in ("upper", "lower"):
            ref = np.asarray(convert.eps_at(convert.table(p, bound), d))
            fast = np.asarray(jax.jit(convert.epsilon, static_argnames="bound")(p, d, bound=bound))
            assert np.array_equal(np.isinf(ref), np.isinf(fast))
            fin = np.isfinite(ref)
            # Same segment and closed form; only the suffix sums are added in another order.
            np.testing.assert_allclose(fast[fin], ref[fin], rtol=1e-12, atol=1e-12)


def test_block_epsilon_refuses_a_broken_pmf():
    with jax.enable_x64(True):
        p = _random_pld(1)
        p = p._replace(pmf=p.pmf.at[3].set(jnp.nan))
        d = jnp.asarray([1e-5, 0.1])
        assert np.all(np.isinf(np.asarray(convert.epsilon(p, d, "upper"))))
        assert np.all(np.asarray(convert.epsilon(p, d, "lower")) == 0.0)


def test_blocked_log_mgf_matches_direct_sum():
    rng = np.random.default_rng(0)
    m, dx = 3072, 9.3e-5
    y = (-700 + np.arange(m)) * dx
    p = rng.random(m) * np.exp(-(((y - 0.05) / 0.01) ** 2))
    p[:100] = 0.0
    p /= p.sum()
    lam = np.r_[np.geomspace(1.0, 1e3, 7), -np.geomspace(1.0, 1e3, 7)]
    with jax.enable_x64(True):
        K = np.asarray(pmf_log_mgf(jnp.asarray(p), jnp.asarray(y), jnp.asarray(lam)))
    # Direct sum, with the largest exponent factored out (float64 is enough at these sizes).
    a = lam[:, None] * y[None, :]
    amax = a.max(axis=1, keepdims=True)
    direct = np.log(np.sum(p[None, :] * np.exp(a - amax), axis=1)) + amax[:, 0]
    # Rounding only: |K| <= ~60 here, so 1e-12 relative is ~100 ulps of the sum.
    np.testing.assert_allclose(K, direct, rtol=1e-12, atol=1e-12)


def test_batched_directions_equal_single_direction_compose():
    comps = [(pld.PoissonSubsampledGaussian(1.0, 0.02), 300)]
    dirs = ("remove", "add")
    with jax.enable_x64(True):
        up, _, _, _ = prepare(comps, 256)
        plan = pld.plan_grid(up, dirs, tail_mass=1e-11, eps_hint=None, target_delta=1e-5,
                             options=pld.GridOptions())
        ms = tuple(max(plan.ms[d][g] for d in range(2)) for g in range(len(plan.ms[0])))
        both = compose_directions(plan.groups, plan.dx, plan.lambdas, plan.log_tau, directions=dirs, ms=ms,
                                  n=plan.n, kinds=("up", "down"), n_freq=plan.n_freq)
        for di, d in enumerate(dirs):
            one = compose(plan.groups[di], plan.dx, plan.lambdas[di], plan.log_tau, direction=d, ms=ms, n=plan.n,
                          kinds=("up", "down"), n_freq=plan.n_freq)
            for kind in ("up", "down"):
                for name in ("pmf", "w_lo", "p_inf", "tail_above", "tail_below", "roundoff", "log_mgf"):
                    a = np.asarray(getattr(getattr(both, kind), name))[di]
                    b = np.asarray(getattr(getattr(one, kind), name))
                    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-18, err_msg=f"{d} {kind} {name}")


def test_planner_erfc_accuracy():
    x = np.linspace(0.0, 27.0, 20_001)
    ref = np.array([math.erfc(v) for v in x])
    ok = ref > 1e-300
    assert np.max(np.abs(_np_erfc_nonneg(x[ok]) / ref[ok] - 1.0)) < 1.2e-7


def test_subsampled_gaussian_cdfs_for_all_directions_at_once():
    mech = pld.PoissonSubsampledGaussian(0.9, 0.03)
    y = np.stack([np.linspace(-0.05, 3.0, 257), np.linspace(-2.0, 0.04, 257)])
    with jax.enable_x64(True):
        both = mech.loss_cdfs_directions(("remove", "add"), jnp.asarray(y))
        for di, d in enumerate(("remove", "add")):
            one = mech.loss_cdfs(d, jnp.asarray(y[di]))
            for a, b in zip(both, one):
                np.testing.assert_array_equal(np.asarray(a)[di], np.asarray(b))


def test_shared_lattice_cdfs_equal_per_direction_cdfs():
    # Both directions of a Poisson-subsampled Gaussian from one lattice evaluation: the same
    # arithmetic on the same arguments, so the same CDF values, bit for bit, on random grids
    # where the lattice fits (40 random (sigma, q, dx, m, offsets); where it does not fit, the
    # uncovered points are NaN, never a silently wrong value).
    from dpjax.pld.compose import lattice_length

    # (sigma, q, dx, offsets) are arguments of two programs compiled once per support length m.
    @jax.jit
    def per_direction(s, q, y):
        return pld.PoissonSubsampledGaussian(s, q).loss_cdfs_directions(("remove", "add"), y)

    @functools.partial(jax.jit, static_argnums=(4, 5))
    def lattice(s, q, o, dx, m, length):
        return pld.PoissonSubsampledGaussian(s, q).loss_cdfs_lattice(o, dx, m, length)

    rng = np.random.default_rng(3)
    fitted = 0
    with jax.enable_x64(True):
        for _ in range(40):
            s, q = float(rng.uniform(0.5, 4.0)), float(10 ** rng.uniform(-4, -0.3))
            dx, m = float(10 ** rng.uniform(-5, -3)), int(rng.choice([64, 96, 1024, 3072]))
            o_r = int(np.floor(np.log1p(-q) / dx)) - int(rng.integers(-3, 5))
            o_a = -(o_r + int(rng.integers(m // 4, m + m // 4)))
            mech = pld.PoissonSubsampledGaussian(jnp.asarray(s), jnp.asarray(q))
            length = lattice_length(m)
            o = jnp.asarray([o_r, o_a])
            y = (o[:, None] + jnp.arange(m)[None, :]) * dx
            ref = per_direction(jnp.asarray(s), jnp.asarray(q), y)
            lat = lattice(jnp.asarray(s), jnp.asarray(q), o, jnp.asarray(dx), m, length)
            fits = mech.lattice_fits(np.array([o_r]), np.array([o_a]), dx, m, length)
            fitted += fits
            for a, b in zip(ref, lat):
                a, b = np.asarray(a), np.asarray(b)
                if fits:
                    np.testing.assert_array_equal(a, b)
                else:
                    assert np.all(np.isnan(b) | (a == b))
    assert fitted >= 20


@pytest.mark.parametrize("sigma, q, steps, delta", [(1.0, 0.01, 1000, 1e-5), (1.1, 0.001, 100000, 1e-5),
                                                    (0.6, 0.05, 40, 1e-8)])
def test_accountant_program_with_and_without_the_shared_lattice(sigma, q, steps, delta):
    # The accountant's program on its plan: the shared lattice (its default where it fits) and
    # one CDF evaluation per direction give the same epsilon and diagnostics, bit for bit.
    from dpjax.pld import engine
    from dpjax.pld.compose import lattice_groups
    from dpjax.pld.plan import GridOptions, coarse_shape

    opts = GridOptions()
    groups, _, _, _ = engine.prepare(engine.dpsgd_components(sigma, q, steps), opts.max_distinct)
    dirs = ("remove", "add")
    plan = coarse_shape(pld.plan_grid(groups, dirs, tail_mass=opts.tail_fraction * delta, eps_hint=None,
                                      target_delta=delta, options=opts), opts)
    ms = tuple(max(plan.ms[d][g] for d in range(2)) for g in range(len(plan.ms[0])))
    lattice = lattice_groups(plan.groups, dirs, plan.dx, ms)
    assert lattice == (True,)
    with jax.enable_x64(True):
        out = [np.asarray(engine.program_jit(plan.groups, plan.dx, plan.lambdas, plan.log_tau, np.asarray([delta]),
                                           np.zeros(()), directions=dirs, ms=(ms, ms), n=plan.n,
                                           kinds=("up", "down"), want="eps", n_freq=plan.n_freq, lattice=flag))
               for flag in (lattice, None)]
    np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.parametrize("k", [8, 32, 64, 96, 512, 1024])
def test_suffix_sums_small_equals_reversed_cumsum(k):
    # One level (k <= 32 or not a multiple of 32) and two levels (chunks of 32): the same suffix
    # sums as a reversed cumulative sum, batched along leading axes; non-negative terms, so the
    # relative error is a few dozen ulps at most (bound (32 + k / 32) u).
    rng = np.random.default_rng(k)
    x = rng.random((2, 3, k)) * np.exp(rng.uniform(-30, 0, (2, 3, k)))
    ref = np.flip(np.cumsum(np.flip(x, -1), -1), -1)
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(convert.suffix_sums_small)(jnp.asarray(x)))
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=(32 + k / 32) * 2.0 ** -52, atol=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_epsilon_equals_table_epsilon_at_large_n(seed):
    # n = 2^17 (512 blocks of 256: the two-level block suffix sums and the factored weights
    # e^{y_ref - y_t} both run) against the table's all-suffix-sums form.
    rng = np.random.default_rng(seed)
    n, dx = 2 ** 17, float(rng.uniform(2e-5, 1e-4))
    w_lo = -int(rng.integers(n // 4, n // 2))
    y = (w_lo + np.arange(n)) * dx
    mu, sd = rng.uniform(0.2, 1.0), rng.uniform(0.05, 0.3)
    r = np.exp(-0.5 * ((y - mu) / sd) ** 2)
    if seed == 2:
        r[rng.random(n) < 0.3] = 0.0
    r = r / r.sum() * (1 - 1e-9)
    with jax.enable_x64(True):
        f = jnp.float64
        p = ComposedPLD(pmf=jnp.asarray(r), w_lo=jnp.int64(w_lo), dx=f(dx), p_inf=f(1e-9), tail_above=f(1e-12),
                        tail_below=f(1e-12), roundoff=f(1e-13), roundoff_rel=f(0.0), log_mgf=jnp.zeros(2),
                        needed_width=f(1.0))
        d = jnp.asarray(np.geomspace(1e-8, 0.1, 12))
        for bound in ("upper", "lower"):
            ref = np.asarray(convert.eps_at(convert.table(p, bound), d))
            fast = np.asarray(jax.jit(convert.epsilon, static_argnames="bound")(p, d, bound=bound))
            assert np.all(np.isfinite(ref)) and np.all(ref > 0)
            np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-12)


def test_blocked_log_mgf_gives_inf_outside_the_shared_exponentials_range():
    # One block of 64 points: |lam| dx > ~11.1 would take e^{lam j dx} (j < 64) outside
    # [e^-700, e^700]; such a lam gets K = inf (a trivial, sound bound) for either sign, while
    # |lam| dx = 10 still gives the direct sum to rounding.
    m, dx = 64, 0.02
    y = (-10 + np.arange(m)) * dx
    p = np.exp(-0.5 * ((y - 0.3) / 0.3) ** 2)
    p /= p.sum()
    lam = np.array([1.0, -1.0, 500.0, -500.0, 575.0, -575.0])
    with jax.enable_x64(True):
        K = np.asarray(pmf_log_mgf(jnp.asarray(p), jnp.asarray(y), jnp.asarray(lam)))
    a = lam[:4, None] * y[None, :]
    amax = a.max(axis=1, keepdims=True)
    direct = np.log(np.sum(p[None, :] * np.exp(a - amax), axis=1)) + amax[:, 0]
    np.testing.assert_allclose(K[:4], direct, rtol=1e-12)
    assert np.all(K[4:] == np.inf)


def test_host_gaussian_epsilon_is_zero_matches_the_bisection():
    from dpjax.pld.exact import host_gaussian_epsilon, host_gaussian_epsilon_is_zero

    deltas = np.array([1e-12, 1e-5, 0.1, 0.5, 0.9])
    mus = np.array([0.0, 1e-300, 1e-12, 1e-6, 1e-3, 0.1, 1.0, 10.0])
    d, m = np.meshgrid(deltas, mus)
    zero = host_gaussian_epsilon_is_zero(d, m)
    assert zero.dtype == bool and zero.shape == d.shape
    np.testing.assert_array_equal(zero, host_gaussian_epsilon(d, m) == 0.0)
    assert zero.any() and not zero.all()
