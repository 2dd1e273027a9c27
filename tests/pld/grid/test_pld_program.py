"""The PLD program (dpjax.pld.grid.program) against plain definitions, on both backends.

* The block-search conversion (only one block's suffix sums) equals ``eps_at(table(...))`` (all
  suffix sums) on random PMFs: same segment, same closed form, agreement to round-off; a broken
  PMF gives ``inf`` (upper) / ``0`` (lower), never a finite number.
* The blocked log-MGF (64 exponentials shared per block) equals the direct sum: the wrap-around
  bounds are built on it, so it must not drop below the exact value beyond rounding.
* The host program (NumPy), the compiled batch program (supports and kept frequencies as data)
  and ``compose`` (one direction, JAX) give the same composed rows and values.
* The planner's vectorized erfc (probe only, never a reported bound) is within 1.2e-7 relative
  of ``math.erfc`` down to underflow.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpjax import pld
from dpjax._base.ops import NUMPY, jax_ops
from dpjax.pld.grid import convert
from dpjax.pld.grid import engine
from dpjax.pld.grid import program as prog
from dpjax.pld.grid.compose import ComposedPLD
from dpjax.pld.mechanisms import _np_erfc_nonneg


def _random_pld(seed: int, n: int | None = None) -> ComposedPLD:
    rng = np.random.default_rng(seed)
    n = n or int(rng.choice([64, 96, 128, 192, 768, 1024, 3072, 4096]))
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


def _program_epsilon(ops, p: ComposedPLD, deltas, bound):
    """The program's conversion of one row (``p``'s constants as ``dpjax.pld.grid.convert.curve_terms``)."""
    xp = ops.xp
    up = bound == "upper"
    const = p.p_inf + p.tail_above + p.roundoff if up else p.p_inf - p.tail_below - p.roundoff
    fa, fb = (1 + p.roundoff_rel, 1 - p.roundoff_rel) if up else (1 - p.roundoff_rel, 1 + p.roundoff_rel)
    row = lambda v: xp.reshape(xp.asarray(v, np.float64), (1,))
    args = (xp.asarray(np.asarray(p.pmf))[None], xp.asarray(np.asarray(p.w_lo))[None],
            xp.asarray(float(p.dx)), row(const), row(fa), row(fb),
            row(np.inf if up else -np.inf), xp.asarray(np.asarray(deltas))[None])
    if ops is NUMPY:
        out = prog._epsilon_rows(ops, *args, p.pmf.shape[-1])
    else:   # as the compiled programs run it: one jitted program, not op by op
        out = _jax_epsilon_rows(*args, n=p.pmf.shape[-1])
    return np.asarray(out)[0]


@functools.partial(jax.jit, static_argnames=("n",))
def _jax_epsilon_rows(r, w_lo, dx, const, fa, fb, a_bad, delta, *, n):
    return prog._epsilon_rows(jax_ops(), r, w_lo, dx, const, fa, fb, a_bad, delta, n)


_DELTAS = np.r_[np.geomspace(1e-12, 0.9, 25), 0.999999, 1.0]


def _check_block_against_table(p, deltas):
    for bound in ("upper", "lower"):
        ref = np.asarray(convert.eps_at(convert.table(p, bound), jnp.asarray(deltas)))
        for ops in (NUMPY, jax_ops()):
            fast = _program_epsilon(ops, p, deltas, bound)
            assert np.array_equal(np.isinf(ref), np.isinf(fast))
            fin = np.isfinite(ref)
            # Same segment and closed form; only the suffix sums are added in another order.
            np.testing.assert_allclose(fast[fin], ref[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # Hypothesis over PMF shapes: each new length compiles the JAX reference
@given(st.integers(0, 10_000))
def test_block_epsilon_equals_table_epsilon(seed):
    with jax.enable_x64(True):
        _check_block_against_table(_random_pld(seed), _DELTAS)


def _large_pld(seed: int) -> ComposedPLD:
    """n = 2^17 with a window narrower than the planner's widest (the factored weights
    e^{y_ref - y_t} stay finite there)."""
    rng = np.random.default_rng(seed)
    n, dx = 2 ** 17, float(rng.uniform(2e-5, 1e-4))
    w_lo = -int(rng.integers(n // 4, n // 2))
    y = (w_lo + np.arange(n)) * dx
    mu, sd = rng.uniform(0.2, 1.0), rng.uniform(0.05, 0.3)
    r = np.exp(-0.5 * ((y - mu) / sd) ** 2)
    if seed == 2:
        r[rng.random(n) < 0.3] = 0.0
    r = r / r.sum() * (1 - 1e-9)
    f = jnp.float64
    return ComposedPLD(pmf=jnp.asarray(r), w_lo=jnp.int64(w_lo), dx=f(dx), p_inf=f(1e-9), tail_above=f(1e-12),
                       tail_below=f(1e-12), roundoff=f(1e-13), roundoff_rel=f(0.0), log_mgf=jnp.zeros(2),
                       needed_width=f(1.0))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_epsilon_equals_table_epsilon_fixed_shapes(seed):
    # n = 3072 and 2^17 (the two-level block suffix sums and the factored weights e^{y_ref - y_t}).
    with jax.enable_x64(True):
        _check_block_against_table(_random_pld(seed, n=3072), _DELTAS)
        _check_block_against_table(_large_pld(seed), np.geomspace(1e-8, 0.1, 12))


def test_block_epsilon_refuses_a_broken_pmf():
    with jax.enable_x64(True):
        p = _random_pld(1)
        p = p._replace(pmf=p.pmf.at[3].set(jnp.nan))
        d = np.asarray([1e-5, 0.1])
        for ops in (NUMPY, jax_ops()):
            assert np.all(np.isinf(_program_epsilon(ops, p, d, "upper")))
            assert np.all(_program_epsilon(ops, p, d, "lower") == 0.0)


def _direct_log_mgf(p, y, lam):
    a = lam[:, None] * y[None, :]
    amax = a.max(axis=1, keepdims=True)
    return np.log(np.sum(p[None, :] * np.exp(a - amax), axis=1)) + amax[:, 0]


def _log_mgf(ops, pmf, y, lambdas):
    """``prog.log_mgf`` on the host, or (JAX) as the compiled programs run it: one jitted program."""
    return prog.log_mgf(ops, pmf, y, lambdas) if ops is NUMPY else _jax_log_mgf(pmf, y, lambdas)


@jax.jit
def _jax_log_mgf(pmf, y, lambdas):
    return prog.log_mgf(jax_ops(), pmf, y, lambdas)


def test_blocked_log_mgf_matches_direct_sum():
    rng = np.random.default_rng(0)
    m, dx = 3072, 9.3e-5
    y = (-700 + np.arange(m)) * dx
    p = rng.random(m) * np.exp(-(((y - 0.05) / 0.01) ** 2))
    p[:100] = 0.0
    p /= p.sum()
    lam = np.r_[np.geomspace(1.0, 1e3, 7), -np.geomspace(1.0, 1e3, 7)]
    direct = _direct_log_mgf(p, y, lam)
    with jax.enable_x64(True):
        for ops in (NUMPY, jax_ops()):
            K = np.asarray(_log_mgf(ops, ops.xp.asarray(p)[None], ops.xp.asarray(y)[None],
                                    ops.xp.asarray(lam)[None]))[0]
            # Rounding only: |K| <= ~60 here, so 1e-12 relative is ~100 ulps of the sum.
            np.testing.assert_allclose(K, direct, rtol=1e-12, atol=1e-12)
        # A length that no block divides is padded with empty points: the same sums.
        K = np.asarray(prog.log_mgf(NUMPY, p[None, :3001], y[None, :3001], lam[None]))[0]
        np.testing.assert_allclose(K, _direct_log_mgf(p[:3001], y[:3001], lam), rtol=1e-12, atol=1e-12)


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
        for ops in (NUMPY, jax_ops()):
            K = np.asarray(_log_mgf(ops, ops.xp.asarray(p)[None], ops.xp.asarray(y)[None],
                                    ops.xp.asarray(lam)[None]))[0]
            np.testing.assert_allclose(K[:4], _direct_log_mgf(p, y, lam[:4]), rtol=1e-12)
            assert np.all(K[4:] == np.inf)


_JAX_SUFFIX = (jax.jit(lambda x: jax_ops().suffix_small(x)), jax.jit(lambda x: jax_ops().suffix_sum(x)))


@pytest.mark.parametrize("k", [8, 32, 64, 96, 512, 1024])
def test_suffix_sums_equal_reversed_cumsum(k):
    # One level and two levels, batched along leading axes; non-negative terms, so the relative
    # error is a few dozen ulps at most (bound (32 + k / 32) u, and (64 + depth) u blocked).
    rng = np.random.default_rng(k)
    x = rng.random((2, 3, k)) * np.exp(rng.uniform(-30, 0, (2, 3, k)))
    ref = np.flip(np.cumsum(np.flip(x, -1), -1), -1)
    with jax.enable_x64(True):
        for ops in (NUMPY, jax_ops()):
            # the JAX versions jitted, as the compiled programs run them (not op by op)
            for fn in ((ops.suffix_small, ops.suffix_sum) if ops is NUMPY else _JAX_SUFFIX):
                got = np.asarray(fn(ops.xp.asarray(x)))
                assert got.shape == x.shape
                np.testing.assert_allclose(got, ref, rtol=(64 + k / 32) * 2.0 ** -52, atol=0.0)


def _plan(sigma, q, steps, delta, directions=("remove", "add")):
    opts = pld.GridOptions()
    groups, _, _, _ = engine.prepare(engine.dpsgd_components(sigma, q, steps), opts.max_distinct)
    return pld.plan_grid(groups, directions, tail_mass=opts.tail_fraction * delta, eps_hint=None,
                         target_delta=delta, options=opts)


def _pow2(plan, at_least: int = 1):
    import dataclasses

    n = max(1 << (int(plan.n) - 1).bit_length(), at_least)
    return dataclasses.replace(plan, n=n)


#: The FFT length of the compiled-batch comparisons: the power of two above the longest of
#: _CONFIGS' plans, so every configuration runs in one compiled program (a longer FFT at the same
#: spacing is a wider window of the same grid; the comparison holds at any length).
_BATCH_N = 2 ** 17


_CONFIGS = [(1.0, 0.01, 1000, 1e-5), (2.0, 0.1, 100, 1e-5), (0.7, 0.003, 3000, 1e-7)]


@pytest.mark.parametrize("shrink", [2, 4, 6, 8])
def test_a_window_too_narrow_still_gives_certified_bounds(shrink):
    """Soundness never depends on the plan: on an FFT far shorter than planned (the same spacing
    and offsets, so most of the composed mass wraps around), the upper ends stay at or above the
    default call's certified lower end and the lower ends at or below its upper end.  The mass
    wrapped from above the window is covered by its Chernoff bound; without it the upper end at
    an eighth of the length falls to 4.72 against a true epsilon of at least 5.4858."""
    import dataclasses

    sigma, q, steps, delta = 1.0, 0.05, 200, 1e-6
    ref = pld.dpsgd_accounting(sigma, q, steps, target_delta=delta)
    plan = _plan(sigma, q, steps, delta)
    short = dataclasses.replace(plan, n=int(plan.n) // shrink)
    inp, spec = prog.host_inputs(short, [delta], kinds=("up", "down"), want="eps")
    out = prog.run_host(inp, spec)                      # (directions, kinds, 1 + diagnostics)
    assert np.max(out[:, 0, 0]) >= ref.epsilon_lower    # the certified epsilon: max over directions
    assert np.max(out[:, 1, 0]) <= ref.epsilon_upper


@pytest.mark.parametrize("sigma, q, steps, delta", _CONFIGS)
def test_compiled_batch_program_equals_the_host_program(sigma, q, steps, delta):
    # The compiled program runs every configuration at the capacity of its FFT length (supports
    # and kept frequencies as data, loops over the real blocks only); the host program on the
    # exact arrays.  Same arithmetic in another backend: the values differ by the two libraries'
    # FFT round-off, which the per-bin noise floor allowance measures (a larger floor raises the
    # upper end and lowers the lower end): within 1e-6 relative (observed 3.7e-7 at delta 1e-7,
    # <= 3e-8 at 1e-5), and every diagnostic but the observed noise floor equal to 1e-9.
    with jax.enable_x64(True):
        plan = _pow2(_plan(sigma, q, steps, delta), at_least=_BATCH_N)
        inp, spec = prog.host_inputs(plan, [delta], kinds=("up", "down"), want="eps")
        host = prog.run_host(inp, spec)
        js = prog.jit_spec(spec)
        assert js.groups[0].length == plan.n and js.freq >= plan.n // 2 + 1
        out = np.asarray(prog.run_jit(np.int32(1), prog.stack_inputs([inp], 8), js))
        assert np.all(out[1:] == 0.0)
        np.testing.assert_allclose(out[0][..., 0], host[..., 0], rtol=1e-6)
        cols = [1 + prog.DIAGNOSTICS.index(c) for c in ("p_inf", "tail_above", "tail_below", "needed_width")]
        np.testing.assert_allclose(out[0][..., cols], host[..., cols], rtol=1e-9, atol=1e-300)


def test_compiled_program_serves_every_support_and_frequency_count_of_its_length():
    # Two configurations of one FFT length, with different supports and kept frequencies, run in
    # one compiled program (one compile per stage), each equal to its own host run.
    from dpjax._base import jax_private as _jax_private

    with jax.enable_x64(True):
        plans = [_pow2(_plan(*c)) for c in [(1.0, 0.01, 1000, 1e-5), (1.3, 0.02, 900, 1e-5)]]
        assert plans[0].n == plans[1].n and plans[0].ms != plans[1].ms
        # Both kinds of rows at n = 2^17: the compiled-batch comparison's program (loaded from
        # the session's compilation cache where that test compiled it first).  Fresh stage
        # functions, so that the count below is of this call's programs.
        items = [prog.host_inputs(p, [1e-5], kinds=("up", "down"), want="eps") for p in plans]
        specs = {prog.jit_spec(s) for _, s in items}
        assert len(specs) == 1
        spec = specs.pop()
        prog._jitted.cache_clear()
        stages = prog._jitted(spec)
        assert len(stages) == len(prog.stage_names(spec))

        def compiled():
            return sum(_jax_private.jit_cache_size(f._fast) + _jax_private.jit_cache_size(f._plain) for f in stages)

        before = compiled()
        out = np.asarray(prog.run_jit(np.int32(2), prog.stack_inputs([i for i, _ in items], 8), spec))
        assert compiled() - before <= len(stages)  # one program per stage
        for k, (inp, s) in enumerate(items):
            np.testing.assert_allclose(out[k][..., 0], prog.run_host(inp, s)[..., 0], rtol=1e-6)


def test_compiled_two_phase_mechanism_equals_the_host_program():
    # Group privacy (a mixture of Gaussians) compiles its inverse loss and its CDFs as separate
    # stages, and a heterogeneous group (two members: a schedule of two noise multipliers) runs
    # its members' discretizations as stacked arrays: both equal the host program (the host
    # evaluates the inverse loss on the whole support at once, the compiled stages per block:
    # their interpolation nodes differ, polished to round-off).
    from dpjax.pld.mog import GroupSubsampledGaussian

    comps = [(GroupSubsampledGaussian(1.1, 3, sampling_prob=0.01), 600),
             (GroupSubsampledGaussian(1.3, 3, sampling_prob=0.01), 400)]
    opts = pld.GridOptions()
    with jax.enable_x64(True):
        groups, _, _, _ = engine.prepare(comps, opts.max_distinct)
        plan = _pow2(pld.plan_grid(groups, ("remove", "add"), tail_mass=opts.tail_fraction * 1e-5, eps_hint=None,
                                   target_delta=1e-5, options=opts))
        inp, spec = prog.host_inputs(plan, [1e-5], kinds=("up", "down"), want="eps")
        assert spec.groups[0].members == 2
        js = prog.jit_spec(spec)
        assert prog.stage_names(js)[0] == "points"
        host = prog.run_host(inp, spec)
        out = np.asarray(prog.run_jit(np.int32(1), prog.stack_inputs([inp], 8), js))
        np.testing.assert_allclose(out[0][..., 0], host[..., 0], rtol=1e-6)


def test_compose_equals_the_program_rows_per_direction():
    comps = [(pld.PoissonSubsampledGaussian(1.0, 0.02), 300)]
    dirs = ("remove", "add")
    with jax.enable_x64(True):
        up, _, _, _ = engine.prepare(comps, 256)
        plan = pld.plan_grid(up, dirs, tail_mass=1e-11, eps_hint=None, target_delta=1e-5, options=pld.GridOptions())
        ms = tuple(max(plan.ms[d][g] for d in range(2)) for g in range(len(plan.ms[0])))
        inp, spec = prog.inputs(dataclasses.replace(plan, ms=(ms, ms)), [0.5], kinds=("up", "down"), want="delta")
        rows = prog.composed_rows(NUMPY, inp, spec)
        for di, d in enumerate(dirs):
            one = pld.compose(plan.groups[di], plan.dx, plan.lambdas[di], plan.log_tau, direction=d, ms=ms,
                              n=plan.n, kinds=("up", "down"), n_freq=plan.n_freq)
            for ki, kind in enumerate(("up", "down")):
                for name in ("w_lo", "p_inf", "tail_above", "tail_below", "roundoff"):
                    a = np.asarray(rows[name])[ki * 2 + di]
                    b = np.asarray(getattr(getattr(one, kind), name))
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-30, err_msg=f"{d} {kind} {name}")
                a, b = np.asarray(rows["pmf"])[ki * 2 + di], np.asarray(getattr(one, kind).pmf)
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * a.max())


def test_planner_erfc_accuracy():
    x = np.linspace(0.0, 27.0, 20_001)
    ref = np.array([math.erfc(v) for v in x])
    ok = ref > 1e-300
    assert np.max(np.abs(_np_erfc_nonneg(x[ok]) / ref[ok] - 1.0)) < 1.2e-7


def test_subsampled_gaussian_cdfs_for_all_directions_at_once():
    mech = pld.PoissonSubsampledGaussian(0.9, 0.03)
    y = np.stack([np.linspace(-0.05, 3.0, 257), np.linspace(-2.0, 0.04, 257)])
    with jax.enable_x64(True):
        for ops in (NUMPY, jax_ops()):
            both = mech.loss_cdfs_directions(("remove", "add"), ops.xp.asarray(y), ops)
            for di, d in enumerate(("remove", "add")):
                one = mech.loss_cdfs(d, ops.xp.asarray(y[di]), ops)
                for a, b in zip(both, one):
                    np.testing.assert_array_equal(np.asarray(a)[di], np.asarray(b))


def test_shared_lattice_cdfs_equal_per_direction_cdfs():
    # Both directions of a Poisson-subsampled Gaussian from one lattice evaluation (the host
    # program's default): the same arithmetic on the same arguments, so the same CDF values, bit
    # for bit, on 40 random grids, with the shortest lattice that fits.
    rng = np.random.default_rng(3)
    for _ in range(40):
        s, q = float(rng.uniform(0.5, 4.0)), float(10 ** rng.uniform(-4, -0.3))
        dx, m = float(10 ** rng.uniform(-5, -3)), int(rng.choice([64, 96, 1024, 3072]))
        o_r = int(np.floor(np.log1p(-q) / dx)) - int(rng.integers(-3, 5))
        o_a = -(o_r + int(rng.integers(m // 4, m + m // 4)))
        mech = pld.PoissonSubsampledGaussian(s, q)
        length = mech.lattice_length(o_r, o_a, dx, m)
        assert mech.lattice_fits(np.array([o_r]), np.array([o_a]), dx, m, length)
        assert not mech.lattice_fits(np.array([o_r]), np.array([o_a]), dx, m, length - 1)
        o = np.asarray([o_r, o_a])
        y = (o[:, None] + np.arange(m)[None, :]) * dx
        ref = mech.loss_cdfs_directions(("remove", "add"), y, NUMPY)
        lat = mech.loss_cdfs_lattice(o, dx, m, length, NUMPY)
        for a, b in zip(ref, lat):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_curve_counts_equal_single_runs():
    # run_host_counts: one discretization and forward transform for every T, each entry equal to
    # the program run with that count, bit for bit (the accumulators are linear in the count).
    plan = _plan(1.0, 0.01, 2000, 1e-5)
    inp, spec = prog.host_inputs(plan, [1e-5], kinds=("up", "down"), want="eps")
    counts = np.array([1, 7, 500, 2000])
    many = prog.run_host_counts(inp, spec, counts)
    for k, t in enumerate(counts):
        one = prog.run_host(inp._replace(counts=(np.asarray([t], np.int64),)), spec)
        np.testing.assert_array_equal(many[k], one)


def test_host_gaussian_epsilon_is_zero_matches_the_bisection():
    from dpjax.numerics.exact import host_gaussian_epsilon, host_gaussian_epsilon_is_zero

    deltas = np.array([1e-12, 1e-5, 0.1, 0.5, 0.9])
    mus = np.array([0.0, 1e-300, 1e-12, 1e-6, 1e-3, 0.1, 1.0, 10.0])
    d, m = np.meshgrid(deltas, mus)
    zero = host_gaussian_epsilon_is_zero(d, m)
    assert zero.dtype == bool and zero.shape == d.shape
    np.testing.assert_array_equal(zero, host_gaussian_epsilon(d, m) == 0.0)
    assert zero.any() and not zero.all()
