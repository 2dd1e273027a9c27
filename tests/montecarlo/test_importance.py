"""The variance-reduced (importance-sampled) balls-in-bins estimator: unbiased, the plain
estimator's stream properties (draws from (key, b, s) only; chunk and device invariance), smooth
and differentiable for fixed draws, and summands never above their proven range."""

import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.matrices import BLT, Toeplitz
from dpjax.montecarlo import BLOCK_SIZE, BallsInBins, gram_from_columns, gram_sqrt
from dpjax.montecarlo import importance as imp

TOEPLITZ4 = np.array([1.0, 0.5, 0.25, 0.125])


def _mean_se(sums, m):
    mean = np.asarray(sums.total)[:, 0] / m
    var = np.asarray(sums.total_sq)[:, 0] / m - mean ** 2
    return mean, np.sqrt(np.maximum(var, 0.0) / m)


def _agree(corr, b, e, sigma, eps, m_plain, m_is, key=0):
    """Plain and variance-reduced estimates of both directions, their combined-SE distance."""
    acc = BallsInBins(corr, b, e)
    plain = acc.estimate(sigma, [eps], m_plain, key)
    with jax.enable_x64(True):
        prop = imp.default_proposal(acc.gram, sigma, eps, range_weight=0.3)
        s = imp.importance_sums(jnp.asarray(acc.gram), sigma, jnp.array([eps]), jax.random.key(key + 1), m_is, prop)
    mean, se = _mean_se(s, m_is)
    p_mean = np.array([plain.delta_remove[0], plain.delta_add[0]])
    p_se = np.array([plain.se_remove[0], plain.se_add[0]])
    z = np.abs(mean - p_mean) / np.sqrt(se ** 2 + p_se ** 2)
    return z, mean, p_mean, se, p_se


# The first case's plain estimate takes 2^20 draws: that of _plain_small (the same configuration
# and key), so one compiled program serves both.
@pytest.mark.parametrize("corr,b,e,sigma,eps,m_plain", [
    (Toeplitz(np.array([1.0, 0.5])), 4, 2, 1.0, 1.0, 1 << 20),
    (Toeplitz(np.ones(1)), 16, 4, 1.0, 2.0, 1 << 19),
])
def test_unbiased_small(corr, b, e, sigma, eps, m_plain):
    z, mean, p_mean, se, p_se = _agree(corr, b, e, sigma, eps, m_plain, 1 << 15)
    assert np.all(z < 3.5), (z, mean, p_mean)
    assert np.all(mean > 0)


def _dense(n):
    rng = np.random.default_rng(3)
    c = np.tril(rng.uniform(0.0, 0.3, (n, n)), -1) + np.eye(n)
    return c


# Agreement within 3 combined standard errors at delta ~ 1e-3 on Toeplitz, BLT, dense and
# C = I, b from 2 to 128, both directions.  sigma chosen so that the larger direction is ~1e-3.
NO_BIAS_CONFIGS = [
    ("identity_b2", Toeplitz(np.ones(1)), 2, 8, 1.0, 2.0),
    ("toeplitz_b8", Toeplitz(TOEPLITZ4), 8, 4, 1.0, 2.0),
    ("blt_b16", BLT(np.array([0.9, 0.5]), np.array([0.3, 0.2])), 16, 4, 1.0, 1.5),
    ("dense_b4", _dense(16), 4, 4, 1.0, 1.0),
    ("identity_b128", Toeplitz(np.ones(1)), 128, 4, 1.0, 0.8),
    ("toeplitz_b64", Toeplitz(np.array([1.0, 0.4, 0.3, 0.2, 0.1])), 64, 2, 1.0, 1.5),
]


@pytest.mark.slow  # ~10 min on 2 cores: 2^24 plain samples per configuration
@pytest.mark.parametrize("name,corr,b,e,eps,guess", NO_BIAS_CONFIGS, ids=[c[0] for c in NO_BIAS_CONFIGS])
def test_no_bias_against_plain(name, corr, b, e, eps, guess):
    acc = BallsInBins(corr, b, e)
    sigma = acc.calibrate(eps, 1e-3, 1 << 16, 11)
    z, mean, p_mean, se, p_se = _agree(corr, b, e, sigma, eps, 1 << 24, 1 << 20, key=21)
    assert max(p_mean) == pytest.approx(1e-3, rel=0.2)
    assert np.all(z < 3.0), (name, z, mean, p_mean, se, p_se)
    # The certificate's tilted mixture (order 3 and 4 components), on the same plain estimate.
    with jax.enable_x64(True):
        prop = imp.default_proposal(acc.gram, sigma, eps, tilt_weights=(0.0, 0.3, 0.4))
        s = imp.importance_sums(jnp.asarray(acc.gram), sigma, jnp.array([eps]), jax.random.key(23), 1 << 20, prop)
    t_mean, t_se = _mean_se(s, 1 << 20)
    z_t = np.abs(t_mean - p_mean) / np.sqrt(t_se ** 2 + p_se ** 2)
    assert np.all(z_t < 3.0), (name, z_t, t_mean, p_mean, t_se, p_se)


@pytest.mark.slow
def test_draws_are_a_prefix_and_chunk_invariant():
    m = 2 * BLOCK_SIZE + 333
    with jax.enable_x64(True):
        a = imp.importance_draws(jax.random.key(2), 8, m)
        b_ = imp.importance_draws(jax.random.key(2), 8, m + 5000)
        for x, y in zip(a, b_):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y)[:m])
        gram = gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4)
        prop = imp.default_proposal(gram, 0.9, 1.0, range_weight=0.3)
        eps = jnp.array([0.5, 1.0])
        sums = [imp.importance_sums(gram, 0.9, eps, jax.random.key(1), m, prop, chunk_size=c)
                for c in (BLOCK_SIZE, 3 * BLOCK_SIZE, None)]
        # The chunked sums equal the summands of the materialised draws (same stream).
        i, u, cu = imp.importance_draws(jax.random.key(1), 8, m)
        x_f, x_r = imp.importance_summands(gram, u @ gram_sqrt(gram).T, i, cu, 0.9, eps, prop)
        direct = np.stack([np.asarray(x_f.sum(0)), np.asarray(x_r.sum(0))])
        tilted = imp.default_proposal(gram, 0.9, 1.0, range_weight=0.3, tilt_weights=(0.1, 0.2, 0.3))
        t_sums = [imp.importance_sums(gram, 0.9, eps, jax.random.key(1), n, tilted, chunk_size=c)
                  for c, n in ((BLOCK_SIZE, m), (3 * BLOCK_SIZE, m), (None, m), (None, m + 5000))]
    for s in sums:
        np.testing.assert_allclose(np.asarray(s.total), np.asarray(sums[0].total), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(s.maximum), np.asarray(sums[0].maximum), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sums[0].total), direct, rtol=1e-11)
    # Tilted components: the same chunk invariance, and a different estimate from the untilted one.
    for s in t_sums[1:3]:
        np.testing.assert_allclose(np.asarray(s.total), np.asarray(t_sums[0].total), rtol=1e-12)
    assert np.all(np.asarray(t_sums[3].total) > np.asarray(t_sums[0].total))   # a prefix: more terms
    assert not np.allclose(np.asarray(t_sums[0].total)[0], np.asarray(sums[0].total)[0])


def test_materialised_draws_refuse_a_tilted_proposal():
    with jax.enable_x64(True):
        gram = gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4)
        prop = imp.default_proposal(gram, 0.9, 1.0, tilt_weights=(0.0, 0.5, 0.0))
        i, u, cu = imp.importance_draws(jax.random.key(1), 8, 100)
        with pytest.raises(ValueError, match="fwd_tilt"):
            imp.importance_summands(gram, u @ gram_sqrt(gram).T, i, cu, 0.9, jnp.array([1.0]), prop)


# --------------------------------------------------------------------------- tilted components


def _brute_log_z(gram, sigma, k):
    """log Z_k by enumerating every ordered tuple (small b)."""
    import itertools

    g = np.asarray(gram) / sigma ** 2
    b = g.shape[0]
    vals = [sum(g[t[a], t[c]] for a in range(k) for c in range(a + 1, k))
            for t in itertools.product(range(b), repeat=k)]
    return float(np.log(np.sum(np.exp(vals)))) - k * math.log(b)


def test_tilt_normalizers_match_enumeration_and_the_moment():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.6, 0.3])), 3, 2)
    sigma = 0.9
    log_z = imp.tilt_log_normalizers(acc.gram, sigma)
    for k in imp.TILT_ORDERS:
        assert log_z[k] == pytest.approx(_brute_log_z(acc.gram, sigma, k), rel=1e-12, abs=1e-12)
    # Z_k = E_Q[(P/Q)^k]: a plain Monte Carlo moment under Q (W ~ N(0, G), losses in closed form),
    # at a noise multiplier where the k-th moment's own variance is moderate.
    sigma = 3.0
    log_z = imp.tilt_log_normalizers(acc.gram, sigma)
    rng = np.random.default_rng(0)
    g = np.asarray(acc.gram)
    w = rng.standard_normal((1 << 20, 3)) @ np.linalg.cholesky(g).T
    y = np.log(np.mean(np.exp((sigma * w - 0.5 * np.diagonal(g)) / sigma ** 2), axis=1))
    for k in imp.TILT_ORDERS:
        moment = np.exp(k * y)
        se = moment.std() / math.sqrt(moment.size)
        assert abs(moment.mean() - math.exp(log_z[k])) < 5 * se, (k, moment.mean(), math.exp(log_z[k]))


def test_tilt_sampler_draws_tuples_with_their_weights():
    """The sequential inverse-distribution draws give each ordered tuple the probability
    prod_{a<c} exp(G[i_a, i_c]/sigma^2) / (b^k Z_k) (chi-square goodness of fit, all orders)."""
    from scipy import stats

    import itertools

    acc = BallsInBins(Toeplitz(np.array([1.0, 0.7])), 3, 2)
    sigma = 0.8
    g = np.asarray(acc.gram)
    b = 3
    m = 1 << 16
    with jax.enable_x64(True):
        tables = imp._tilt_tables(jnp.asarray(g), jnp.asarray(sigma), jnp.array([0.1, 0.1, 0.1]))
        u = jax.random.uniform(jax.random.key(3), (m, imp.TILT_WORDS), jnp.float64)
        # Identify the tuple from the centre sum_a G[i_a]: the rows of G are distinct here, and
        # so are the sums of k of them for the weights used (checked by enumeration below).
        for j, k in enumerate(imp.TILT_ORDERS):
            centres = np.asarray(imp._tilt_centres(jnp.asarray(g), tables, jnp.full((m,), j), u))
            tuples = list(itertools.product(range(b), repeat=k))
            # Ordered tuples with the same multiset have the same centre: compare multisets.
            keys = {}
            for t in tuples:
                keys.setdefault(tuple(sorted(t)), []).append(t)
            expected, centre_of = [], []
            for ms, ts in keys.items():
                weight = sum(math.exp(sum(g[t[a], t[c]] for a in range(k) for c in range(a + 1, k)) / sigma ** 2)
                             for t in ts)
                expected.append(weight)
                centre_of.append(g[list(ms)].sum(axis=0))
            expected = np.array(expected) / np.sum(expected)
            centre_of = np.array(centre_of)
            dist = np.linalg.norm(centres[:, None, :] - centre_of[None, :, :], axis=2)
            assert np.all(np.min(dist, axis=1) < 1e-9)
            counts = np.bincount(np.argmin(dist, axis=1), minlength=len(expected))
            assert len({tuple(np.round(c, 9)) for c in centre_of}) == len(centre_of)
            chi2 = np.sum((counts - m * expected) ** 2 / (m * expected))
            assert stats.chi2.sf(chi2, len(expected) - 1) > 1e-3, (k, counts, m * expected)


@pytest.mark.parametrize("tilt", [(0.5, 0.0, 0.0), (0.0, 0.5, 0.0), (0.0, 0.0, 0.6), (0.2, 0.2, 0.3)])
def test_tilted_estimate_unbiased(tilt):
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 4, 2)
    sigma, eps, m_is = 1.0, 1.0, 1 << 15
    plain = _plain_small()
    with jax.enable_x64(True):
        prop = imp.default_proposal(acc.gram, sigma, eps, tilt_weights=tilt)
        s = imp.importance_sums(jnp.asarray(acc.gram), sigma, jnp.array([eps]), jax.random.key(7), m_is, prop)
    mean, se = _mean_se(s, m_is)
    z = np.abs(mean - plain[0]) / np.sqrt(se ** 2 + plain[1] ** 2)
    assert np.all(z < 3.5), (tilt, z, mean, plain)


_PLAIN = {}


def _plain_small():
    if "v" not in _PLAIN:
        acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 4, 2)
        est = acc.estimate(1.0, [1.0], 1 << 20, 0)
        _PLAIN["v"] = (np.array([est.delta_remove[0], est.delta_add[0]]),
                       np.array([est.se_remove[0], est.se_add[0]]))
    return _PLAIN["v"]


_SHARDED_SCRIPT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, numpy as np
    from dpjax.montecarlo import gram_from_columns, importance as imp
    assert len(jax.devices()) == 8, jax.devices()
    with jax.enable_x64(True):
        gram = gram_from_columns(jnp.array([1.0, 0.5, 0.25, 0.125]), 8, 4)
        prop = imp.default_proposal(gram, 0.9, 1.0, range_weight=0.3, tilt_weights=(0.1, 0.1, 0.2))
        eps = jnp.array([0.5, 1.0])
        m = 9 * 2048 + 5
        bets = jnp.full((2, 2, 1), 3.0)
        sh = imp.sharded_importance_sums(gram, 0.9, eps, jax.random.key(4), m, prop, bets, jnp.array([0.1, 0.05]),
                                         chunk_size=2048)
        one = imp.sharded_importance_sums(gram, 0.9, eps, jax.random.key(4), m, prop, bets, jnp.array([0.1, 0.05]),
                                          chunk_size=2048, devices=[jax.devices()[0]])
    print(json.dumps({k: [np.asarray(getattr(s, k)).tolist() for s in (sh, one)]
                      for k in ("total", "total_sq", "maximum", "log_wealth")}))
""")


@pytest.mark.slow
def test_sharded_equals_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key, (sharded, single) in res.items():
        # The single device's chunks, combined in its order: the same bits (docs/design.md §14).
        np.testing.assert_array_equal(sharded, single, err_msg=key)


@pytest.mark.slow
def test_smooth_and_differentiable_for_fixed_draws():
    key = jax.random.key(9)
    m = 1 << 12
    with jax.enable_x64(True):
        coeffs = jnp.asarray(TOEPLITZ4)
        prop = imp.default_proposal(gram_from_columns(coeffs, 8, 4), 1.0, 1.0)
        i, u, cu = imp.importance_draws(key, 8, m)

        def f(c, sigma):
            g = gram_from_columns(c, 8, 4)
            return imp.importance_delta_from_projections(g, u @ gram_sqrt(g).T, i, cu, sigma, 1.0, prop)

        g_c, g_s = jax.grad(f, argnums=(0, 1))(coeffs, 1.0)
        h = 1e-6
        fd_s = (float(f(coeffs, 1.0 + h)) - float(f(coeffs, 1.0 - h))) / (2 * h)
        fd_c = [(float(f(coeffs + h * e, 1.0)) - float(f(coeffs - h * e, 1.0))) / (2 * h) for e in jnp.eye(4)]
        jitted, eager = jax.jit(f)(coeffs, 1.0), f(coeffs, 1.0)
    assert float(g_s) < 0 and float(g_s) == pytest.approx(fd_s, rel=1e-5)
    np.testing.assert_allclose(np.asarray(g_c), fd_c, rtol=1e-4, atol=1e-9)
    assert float(jitted) == pytest.approx(float(eager), rel=1e-12)


def test_float32_caller_gets_float64():
    gram = np.asarray(gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4))
    # 2^15 draws at b = 8: the program of test_summands_never_exceed_their_proven_range's first case.
    d, se = imp.importance_delta_estimate(gram, 1.0, 1.0, jax.random.key(3), 1 << 15)
    assert np.asarray(d).dtype == np.float64 and 0 < float(d) < 1 and float(se) > 0


@pytest.mark.parametrize("corr,b,e,sigma,eps", [
    (Toeplitz(TOEPLITZ4), 8, 4, 0.8, 1.0),
    (Toeplitz(np.ones(1)), 32, 4, 1.0, 2.0),
    (BLT(np.array([0.9, 0.5]), np.array([0.3, 0.2])), 16, 4, 0.7, 0.5),
    (_dense(12), 3, 4, 1.2, 3.0),
])
def test_summands_never_exceed_their_proven_range(corr, b, e, sigma, eps):
    # 2^15 draws: at b = 16 the compiled sums of test_unbiased_small's second case (and at b = 8
    # those of test_float32_caller_gets_float64).
    acc = BallsInBins(corr, b, e)
    for weight, tilt in ((0.0, (0, 0, 0)), (0.45, (0, 0, 0)), (0.0, (0.9, 0, 0)), (0.0, (0, 0.9, 0)),
                         (0.1, (0.1, 0.2, 0.5))):
        with jax.enable_x64(True):
            prop = imp.default_proposal(acc.gram, sigma, eps, range_weight=weight, tilt_weights=tilt)
            s = imp.importance_sums(jnp.asarray(acc.gram), sigma, jnp.array([eps]), jax.random.key(5), 1 << 15, prop)
        r_f, r_r = imp.summand_range(acc.gram, sigma, eps, prop)
        mx = np.asarray(s.maximum)[:, 0]
        assert mx[0] <= r_f and mx[1] <= r_r, (weight, tilt, mx, r_f, r_r)
        # The range is a bound, not a sample maximum, and not absurd: at most 1/defensive weight.
        assert r_f <= 1 / 0.05 * (1 + 1e-9) and r_r <= 1 / 0.05 * (1 + 1e-9)


@pytest.mark.slow
def test_range_at_an_epsilon_past_the_grids_resolution():
    """At eps = 1e300, eps + step rounds to eps: the grid's intervals are empty (h = 0, log 0) and
    only the tail term 1 / D(eps) remains.  D(eps) = 0.5 + e^(1e300) overflows, so the bound is
    0.0 (the supremum, below e^(-1e300), is below the smallest float), computed without NumPy's
    divide-by-zero warning; certify calls it at every epsilon a user passes."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = imp._sup_ratio(1e300, 0.5, np.array([1.0]), np.array([1.0]))
    assert r == 0.0


def test_range_bound_is_attained_in_the_limit():
    """The P||Q bound is the supremum over all configurations: at the equal-spread configuration
    (every a_J proportional to exp((1+theta) G_JJ/(2 sigma^2))^(1/theta)) near the maximising loss,
    the summand formula reaches it to the grid's 0.1%."""
    acc = BallsInBins(Toeplitz(np.ones(1)), 4, 2)
    sigma, eps = 1.0, 1.0
    prop = imp.Proposal(np.array([0.0, 1.0, 0.0]), np.array([0.0, 2.0, 0.0]), np.zeros(3),
                        np.array([1.0, 0.0, 0.0]), np.zeros(3))
    r_f, _ = imp.summand_range(acc.gram, sigma, eps, prop)
    d = np.diagonal(acc.gram)
    ys = np.linspace(eps + 1e-3, eps + 3, 600)
    with jax.enable_x64(True):
        # One row per loss y. l_J equal (d constant): projections <X, m_J> = sigma^2 y + d/2.
        proj = np.broadcast_to(sigma ** 2 * ys[:, None], (ys.size, 4)) + d / 2
        # The sampled component (theta = 2, mode 0) adds (1 + theta) G[0]: remove it from W.
        w = (proj - 3.0 * acc.gram[0]) / sigma
        x_f, _ = imp._summands(jnp.asarray(acc.gram), jnp.asarray(w), jnp.zeros(ys.size, jnp.int32),
                               jnp.full(ys.size, 0.5), jnp.asarray(1.0), jnp.array([eps]), imp.as_proposal(prop))
        best = float(jnp.max(x_f[:, 0]))
    assert best <= r_f and best >= r_f / 1.01
