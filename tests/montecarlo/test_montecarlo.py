"""Balls-in-bins Monte Carlo accountant: Gram-reduced vs direct sampler, pinned references,
amplification ordering, sharding, and core properties.

Statistical tolerances: every Monte Carlo comparison uses |a - b| <= 3 * sqrt(se_a^2 + se_b^2)
(a two-sided 3-sigma test, false-alarm rate 0.27% per comparison); all keys are fixed, so the
tests are deterministic -- a failure means a real change, not bad luck.
"""

from __future__ import annotations

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
from hypothesis import given
from hypothesis import strategies as st

from dpjax.matrices import Toeplitz
from dpjax.montecarlo import (BLOCK_SIZE, BallsInBins, certified_delta, delta_estimate, direct_monte_carlo_sums,
                              estimate_from_sums, evr_minimum_samples, gram_from_columns,
                              gram_from_dense, gram_sqrt, modes_from_column, modes_from_dense,
                              monte_carlo_sums, normal_from_bits, privacy_losses)
from dpjax.montecarlo import evr, core
from dpjax.pld import gaussian_delta, gaussian_epsilon

TOEPLITZ4 = np.array([1.0, 0.5, 0.25, 0.125])


def _close(a, se_a, b, se_b, k=3.0):
    return abs(a - b) <= k * math.sqrt(se_a**2 + se_b**2)


# ----------------------------------------------------------------------------- normals


def test_box_muller_normals_distribution():
    n = 1 << 20
    with jax.enable_x64(True):
        words = jax.random.bits(jax.random.key(7), (n // 32, 32), jnp.uint64)
        z = np.asarray(normal_from_bits(words, 32)).ravel()
    from scipy import stats

    # Moments within 5 standard errors (SE of mean 1/sqrt(n), of variance sqrt(2/n)).
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    # Tail mass beyond 3: p = 0.0026998, binomial SE sqrt(p/n).
    p3 = 2 * stats.norm.sf(3)
    assert abs(np.mean(np.abs(z) > 3) - p3) < 5 * math.sqrt(p3 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert np.isfinite(z).all() and np.abs(z).max() < 8.6  # r <= sqrt(106 ln 2)


# ----------------------------------------------------------------------------- Gram


# Coefficients padded to one length (trailing zeros: the same matrix) so that Hypothesis explores
# values and band lengths, not array shapes (each new shape would be a new compile).
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=0, max_size=9)
       .map(lambda c: [1.0] + c + [0.0] * (9 - len(c))),
       st.sampled_from([(2, 3), (4, 2), (3, 4)]))
def test_gram_from_columns_equals_dense(coeffs, shape):
    b, e = shape
    with jax.enable_x64(True):
        dense = Toeplitz(np.asarray(coeffs)).dense(b * e)
        np.testing.assert_allclose(np.asarray(modes_from_column(jnp.asarray(coeffs), b, e)),
                                   np.asarray(modes_from_dense(dense, b)), atol=1e-14)
        np.testing.assert_allclose(np.asarray(gram_from_columns(jnp.asarray(coeffs), b, e)),
                                   np.asarray(gram_from_dense(dense, b)), rtol=1e-13, atol=1e-13)


def test_modes_definition_identity():
    # C = I: m_i is the indicator of rounds i, i+b, ...: G = E * I.
    with jax.enable_x64(True):
        g = np.asarray(gram_from_dense(jnp.eye(12), 4))
    np.testing.assert_array_equal(g, 3 * np.eye(4))


def test_cholesky_xla_matches_lapack_and_flags_non_pd():
    """The plain-XLA Cholesky used by gram_sqrt equals LAPACK's factor to round-off; non-PD -> non-finite."""
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        for b in (1, 5, 32):
            a = rng.standard_normal((b, b + 2))
            g = a @ a.T
            l_xla = np.asarray(core.cholesky_xla(jnp.asarray(g)))
            # Both are backward-stable factorizations of a matrix with condition number < 1e4
            # here, so they agree to ~cond * 1e-16 relative to |L|.
            np.testing.assert_allclose(l_xla, np.linalg.cholesky(g), rtol=1e-10, atol=1e-10 * np.abs(g).max())
            assert np.all(np.triu(l_xla, 1) == 0)
        # Indefinite and singular (zero pivot) matrices must not produce a finite factor: the
        # eigen fallback in gram_sqrt depends on it.
        assert not np.all(np.isfinite(np.asarray(core.cholesky_xla(jnp.array([[1.0, 2.0], [2.0, 1.0]])))))
        assert not np.all(np.isfinite(np.asarray(core.cholesky_xla(jnp.zeros((3, 3))))))


def test_gram_sqrt_singular_and_regular():
    with jax.enable_x64(True):
        v = jnp.array([1.0, 2.0, 0.0, 1.0])
        singular = jnp.outer(v, v) + jnp.outer(jnp.array([0.0, 1.0, 1.0, 0.0]), jnp.array([0.0, 1.0, 1.0, 0.0]))
        l_sing = gram_sqrt(singular)  # rank 2: Cholesky fails, eigen fallback
        np.testing.assert_allclose(np.asarray(l_sing @ l_sing.T), np.asarray(singular), atol=1e-12)
        g = gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4)
        l_reg = gram_sqrt(g)
        np.testing.assert_allclose(np.asarray(l_reg @ l_reg.T), np.asarray(g), rtol=1e-12, atol=1e-12)
        assert np.allclose(np.triu(np.asarray(l_reg), 1), 0)  # Cholesky branch
    # Zero columns 0 and 4 of C make mode m_0 = 0: G is singular (eigen branch); the estimate
    # stays finite and equals the one for the same C with that bin's rounds removed... at least
    # it must lie between 0 and the unamplified bound.
    c = np.array(Toeplitz(np.array([1.0, 1.0])).dense(8))
    c[:, 0] = 0.0
    c[:, 4] = 0.0
    acc = BallsInBins(c, 4, 2)
    assert np.linalg.matrix_rank(acc.gram) == 3
    d, se = acc.delta(1.0, 1.0, 4096, 0)
    assert np.isfinite(d) and 0 < d <= acc.unamplified_delta(1.0, 1.0)


# ----------------------------------------------------------------------------- Gram-reduced vs direct sampler


def _random_dense(n, seed):
    rng = np.random.default_rng(seed)
    c = np.tril(rng.uniform(0.0, 0.6, size=(n, n)))
    np.fill_diagonal(c, 1.0)
    return c


@pytest.mark.parametrize("name, dense, b", [
    ("identity", np.eye(32), 8),
    ("banded_toeplitz", np.asarray(Toeplitz(TOEPLITZ4).dense(32)), 8),
    ("random_dense", _random_dense(24, 3), 6),
])
def test_gram_reduction_agrees_with_direct_sampler(name, dense, b):
    """Gram-reduced vs direct n-dimensional sampler, both directions, 3 SE."""
    m = 1 << 15
    eps = np.array([0.5, 1.0, 2.0])
    sigma = 0.8
    with jax.enable_x64(True):
        dense = jnp.asarray(dense, jnp.float64)
        gram = gram_from_dense(dense, b)
        fast = estimate_from_sums(monte_carlo_sums(gram, sigma, jnp.asarray(eps), jax.random.key(11), m), m)
        direct = estimate_from_sums(
            direct_monte_carlo_sums(modes_from_dense(dense, b), sigma, jnp.asarray(eps), jax.random.key(12), m), m)
    (mf, sf), (md, sd) = [tuple(np.asarray(x) for x in r) for r in (fast, direct)]
    assert (mf[0] > 0.01).all()  # a non-trivial regime, so the comparison has power
    for direction in (0, 1):
        for k in range(eps.size):
            assert _close(mf[direction, k], sf[direction, k], md[direction, k], sd[direction, k]), (
                name, direction, eps[k], mf[direction, k], md[direction, k], sf[direction, k], sd[direction, k])


def test_stream_definition_and_partial_block():
    """The sums equal a hand computation from draw_block for the first m samples (m not a block multiple)."""
    # test_chunk_size_does_not_change_result's m and epsilon shape: its default-chunk program serves here.
    m = 3 * BLOCK_SIZE + 777
    eps = jnp.array([0.5, 1.5])
    with jax.enable_x64(True):
        gram = gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4)
        key = jax.random.key(5)
        sums = monte_carlo_sums(gram, 1.0, eps, key, m)
        idx, u = zip(*[core.draw_block(core.rbg_key(key), j, 8) for j in range(-(-m // BLOCK_SIZE))])
        idx, u = jnp.concatenate(idx)[:m], jnp.concatenate(u)[:m]
        y_pq, y_qp = privacy_losses(gram, gram_sqrt(gram), 1.0, idx, u)
        t_pq = np.maximum(0, 1 - np.exp(np.asarray(eps)[None, :] - np.asarray(y_pq)[:, None]))
        t_qp = np.maximum(0, 1 - np.exp(np.asarray(eps)[None, :] - np.asarray(y_qp)[:, None]))
    np.testing.assert_allclose(np.asarray(sums.total), np.stack([t_pq.sum(0), t_qp.sum(0)]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(sums.total_sq), np.stack([(t_pq**2).sum(0), (t_qp**2).sum(0)]), rtol=1e-12)
    assert np.all(np.bincount(np.asarray(idx), minlength=8) > 0)
    # vmap over blocks gives the same words as one block at a time (the rbg generator's own
    # batching rule would reuse the first key; draw_block's custom_vmap rule prevents that).
    with jax.enable_x64(True):
        rbg_key = core.rbg_key(key)
        batched = jax.vmap(lambda j: core.draw_block(rbg_key, j, 8))(jnp.arange(1, 3))
        for pos, j in enumerate((1, 2)):
            single = core.draw_block(rbg_key, j, 8)
            np.testing.assert_array_equal(np.asarray(batched[0][pos]), np.asarray(single[0]))
            np.testing.assert_allclose(np.asarray(batched[1][pos]), np.asarray(single[1]), rtol=1e-14, atol=1e-14)


def test_single_batch_is_exact_gaussian():
    """b = 1: no amplification, the pair is N(m_0, s^2 I) vs N(0, s^2 I) -- the exact Gaussian oracle
    with sensitivity |m_0| (both directions), so the MC estimate must match it within 3 SE."""
    c = np.asarray(Toeplitz(np.array([1.0, 0.3])).dense(5))
    acc = BallsInBins(c, 1, 5)
    eps = np.array([0.5, 1.0, 3.0])
    est = acc.estimate(1.3, eps, 1 << 15, key=8)
    exact = np.asarray(gaussian_delta(eps, acc.sensitivity / 1.3))
    for k in range(eps.size):
        assert _close(est.delta_remove[k], est.se_remove[k], exact[k], 0.0), (eps[k], est.delta_remove[k], exact[k])
        assert _close(est.delta_add[k], est.se_add[k], exact[k], 0.0), (eps[k], est.delta_add[k], exact[k])


# ----------------------------------------------------------------------------- pinned references


def _family_g(reference_cases, matrix, b=32, epochs=8):
    rows = [c for c in reference_cases.values()
            if c["family"] == "G" and c["params"].get("c_first_column_nonzeros") == matrix and "epsilon" in c["params"]
            and "noise_multiplier" in c["params"] and c["params"]["bins_per_epoch_b"] == b
            and c["params"]["epochs_E"] == epochs]
    assert len(rows) == 9
    return rows


@pytest.mark.parametrize("matrix, b, epochs", [
    ([1.0, 0.5, 0.25, 0.125], 32, 8),
    ([1.0], 32, 8),
    pytest.param([1.0], 128, 16, marks=pytest.mark.slow),
])
def test_agrees_with_pinned_reference_family_g(reference_cases, matrix, b, epochs):
    """Against the pinned balls-in-bins values (both directions) and jax_privacy's MC, 3 combined SE.

    The reference reports the P||Q (remove) direction as ``value`` and Q||P under
    ``reverse_direction_delta_Q_vs_P``; our ``delta`` is the max of the two (= P||Q here).
    """
    rows = _family_g(reference_cases, matrix, b, epochs)
    acc = BallsInBins(np.asarray(matrix), batches_per_epoch=b, epochs=epochs)
    m = 1 << 20
    for sigma in sorted({r["params"]["noise_multiplier"] for r in rows}):
        sub = sorted((r for r in rows if r["params"]["noise_multiplier"] == sigma), key=lambda r: r["params"]["epsilon"])
        eps = np.array([r["params"]["epsilon"] for r in sub])
        est = acc.estimate(sigma, eps, m, key=2024)
        for k, row in enumerate(sub):
            ref, ref_se = row["value"], row["extra"]["standard_error"]
            assert _close(est.delta_remove[k], est.se_remove[k], ref, ref_se), (row["id"], est.delta_remove[k], ref)
            rev = row["extra"]["reverse_direction_delta_Q_vs_P"]
            assert _close(est.delta_add[k], est.se_add[k], rev["value"], rev["standard_error"]), (row["id"], "add")
            assert est.delta[k] == max(est.delta_remove[k], est.delta_add[k])
            jp = row["extra"]["jax_privacy_mc"]
            assert _close(est.delta_remove[k], est.se_remove[k], jp["value"], jp["standard_error"]), (row["id"], "jp")


def test_agrees_with_live_jax_privacy():
    """Live against jax_privacy's monte_carlo estimator with a few thousand samples."""
    from jax_privacy import batch_selection
    from jax_privacy.experimental.monte_carlo import sample_generation

    strategy = batch_selection.BallsInBinsSampling(iterations=256, cycle_length=32)
    n_jp = 1500
    losses, _ = sample_generation.get_privacy_loss_sample(strategy, 1.0, TOEPLITZ4, seed=99, positive_sample=True,
                                                          num_samples=n_jp)
    eps = np.array([1.0, 2.0, 4.0])
    terms = np.maximum(0.0, -np.expm1(eps[None, :] - np.asarray(losses)[:, None]))
    jp_mean, jp_se = terms.mean(0), terms.std(0, ddof=1) / math.sqrt(n_jp)
    # 2^19 draws and three epsilons at b = 32: test_identity_between_poisson_and_unamplified's program.
    est = BallsInBins(TOEPLITZ4, 32, 8).estimate(1.0, eps, 1 << 19, key=3)
    for k in range(3):
        assert _close(est.delta_remove[k], est.se_remove[k], jp_mean[k], jp_se[k]), (eps[k], est.delta_remove[k], jp_mean[k])


# ----------------------------------------------------------------------------- amplification ordering


def test_identity_between_poisson_and_unamplified(reference_cases):
    """For C = I, Poisson PLD (q = 1/b, T = n) <= balls-in-bins <= unamplified Gaussian.

    Poisson value from dpjax's own PLD accountant (``dpjax.pld.dpsgd_delta``), checked against
    the pinned dp_accounting value.  Balls-in-bins keeps each example in the same bin every epoch
    (Choquette-Choo et al. 2024, Def. 3.1), so it is much weaker than Poisson here, by design.
    """
    from dpjax.pld import dpsgd_delta

    rows = _family_g(reference_cases, [1.0])
    acc = BallsInBins(np.eye(256), 32, 8)
    assert acc.sensitivity == pytest.approx(math.sqrt(8), rel=1e-14)
    m = 1 << 19
    for sigma in (0.7, 1.0, 1.5):
        eps = np.array([1.0, 2.0, 4.0])
        d, se = acc.delta(sigma, eps, m, key=77)
        unamp = acc.unamplified_delta(sigma, eps)
        row = next(r for r in rows if r["params"]["noise_multiplier"] == sigma)
        for k, e in enumerate(eps):
            poisson = dpsgd_delta(sigma, 1 / 32, 256, float(e))
            pinned = row["extra"]["poisson_comparison_q=1/b_T=n"][f"pld_delta_at_eps{int(e)}"]
            assert poisson == pytest.approx(pinned, rel=1e-3, abs=1e-12)
            assert poisson < d[k] - 3 * se[k], (sigma, e, poisson, d[k])
            assert d[k] + 3 * se[k] < unamp[k], (sigma, e, d[k], unamp[k])


# ----------------------------------------------------------------------------- sharding


def test_chunk_size_does_not_change_result():
    m = 3 * BLOCK_SIZE + 777
    eps = jnp.array([0.3, 1.0])
    with jax.enable_x64(True):
        gram = gram_from_columns(jnp.asarray(TOEPLITZ4), 8, 4)
        results = [monte_carlo_sums(gram, 0.9, eps, jax.random.key(1), m, chunk) for chunk in (BLOCK_SIZE, 2 * BLOCK_SIZE, None)]
    for r in results[1:]:
        # Same draws; only the order of float additions differs.
        np.testing.assert_allclose(np.asarray(r.total), np.asarray(results[0].total), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(r.total_sq), np.asarray(results[0].total_sq), rtol=1e-12)


_SHARDED_SCRIPT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, numpy as np
    from dpjax.montecarlo import BallsInBins, gram_from_columns, monte_carlo_sums, sharded_monte_carlo_sums
    assert len(jax.devices()) == 8, jax.devices()
    acc = BallsInBins(np.array([1.0, 0.5, 0.25, 0.125]), 8, 4)
    eps = np.array([0.5, 1.0, 2.0])
    m = 9 * 2048 + 5
    sharded = acc.estimate(0.9, eps, m, key=4, chunk_size=2048)
    single = acc.estimate(0.9, eps, m, key=4, chunk_size=2048, devices=[jax.devices()[0]])
    single_big_chunk = acc.estimate(0.9, eps, m, key=4, devices=[jax.devices()[0]])
    print(json.dumps({"sharded": [sharded.delta_remove.tolist(), sharded.delta_add.tolist()],
                      "single": [single.delta_remove.tolist(), single.delta_add.tolist()],
                      "single_big_chunk": [single_big_chunk.delta_remove.tolist(), single_big_chunk.delta_add.tolist()]}))
""")


def test_sharded_equals_single_device():
    """8 fake CPU devices (fresh process: XLA_FLAGS must precede jax init) give the single
    device's sums bit for bit (docs/design.md §14)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # The same chunks, added in the same order on any number of devices: the same bits.
    np.testing.assert_array_equal(res["sharded"], res["single"])
    np.testing.assert_allclose(res["single_big_chunk"], res["single"], rtol=1e-12)


# ----------------------------------------------------------------------------- CRN and gradients


def test_common_random_numbers_and_gradients():
    key = jax.random.key(9)
    m = 1 << 13
    with jax.enable_x64(True):
        coeffs = jnp.asarray(TOEPLITZ4)

        def f(c, sigma):
            return delta_estimate(gram_from_columns(c, 8, 4), sigma, 1.0, key, m)[0]

        # Deterministic for a fixed key.
        assert float(f(coeffs, 1.0)) == float(f(coeffs, 1.0))
        g_c, g_s = jax.grad(f, argnums=(0, 1))(coeffs, 1.0)
        h = 1e-6
        fd_s = (float(f(coeffs, 1.0 + h)) - float(f(coeffs, 1.0 - h))) / (2 * h)
        # The shifted coefficients in NumPy (the same float64 sums as jnp's, without an eager
        # compile per operation).
        fd_c = [(float(f(jnp.asarray(TOEPLITZ4 + h * e), 1.0)) - float(f(jnp.asarray(TOEPLITZ4 - h * e), 1.0)))
                / (2 * h) for e in np.eye(4)]
        # CRN makes the estimate piecewise smooth; central differences at h = 1e-6 agree with
        # autodiff up to O(h^2) and round-off ~1e-16/h = 1e-10.
        assert float(g_s) == pytest.approx(fd_s, rel=1e-5)
        np.testing.assert_allclose(np.asarray(g_c), fd_c, rtol=1e-5, atol=1e-9)
        assert float(g_s) < 0  # more noise, less delta
        # jit + vector epsilon.
        d, se = jax.jit(lambda s: delta_estimate(gram_from_columns(coeffs, 8, 4), s, jnp.array([0.5, 1.0]), key, m))(1.0)
        assert d.shape == (2,) and se.shape == (2,) and float(d[0]) >= float(d[1])


# ----------------------------------------------------------------------------- epsilon, baseline, EVR


def test_epsilon_hat_brackets_target():
    acc = BallsInBins(TOEPLITZ4, 8, 4)
    m = 1 << 14
    eps = acc.epsilon(1.2, 1e-2, m, key=21)
    d_at, _ = acc.delta(1.2, eps, m, key=21)
    width = (2 * acc.unamplified_epsilon(1.2, 1e-2) + 1) / 32**3
    d_below, _ = acc.delta(1.2, max(eps - 2 * width, 0.0), m, key=21)
    assert d_at <= 1e-2 < d_below
    assert eps < acc.unamplified_epsilon(1.2, 1e-2)


def test_gaussian_baseline():
    # delta(eps) of the Gaussian mechanism, cross-checked with direct quadrature of the PLD.
    from scipy import integrate, stats

    mu = 1.7
    for eps in (0.0, 0.5, 2.0):
        loss = lambda x: mu * x - mu**2 / 2  # noqa: E731  (X ~ N(mu, 1) vs N(0, 1))
        quad = integrate.quad(lambda x: stats.norm.pdf(x, mu) * max(0.0, 1 - math.exp(eps - loss(x))), -10, 20)[0]
        assert float(gaussian_delta(eps, mu)) == pytest.approx(quad, rel=1e-8, abs=1e-14)
    e = float(gaussian_epsilon(1e-5, mu))
    assert float(gaussian_delta(e, mu)) <= 1e-5 < float(gaussian_delta(e - 1e-9, mu))


def test_exact_gaussian_tiny_deltas_against_mpmath():
    # dpjax.pld.gaussian_delta in log space vs 60-digit mpmath, down to delta ~ 1e-240: the
    # log-space form keeps ~1e-12 relative accuracy where the direct difference would cancel or
    # underflow (float64 log_ndtr is accurate to ~1e-15 relative; the exp/expm1 steps add a few
    # ulps times |log delta| <= 460).
    import mpmath

    mpmath.mp.dps = 60
    for mu, eps in [(0.5, 0.1), (1.0, 8.0), (2.0, 30.0), (0.3, 3.0), (5.0, 100.0), (10.0, 380.0)]:
        m, e = mpmath.mpf(mu), mpmath.mpf(eps)
        exact = mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)
        ours = float(gaussian_delta(eps, mu))
        assert 0.0 < ours and ours == pytest.approx(float(exact), rel=1e-10), (mu, eps, ours, exact)
    assert float(gaussian_delta(3.0, 0.0)) == 0.0


def testevr_bounds_and_jax_privacy_oracle():
    from jax_privacy.experimental.monte_carlo import delta_calculation

    for m, base in [(1 << 20, 1e-5), (1 << 16, 1e-3), (10**7, 1e-6)]:
        overall, tau, beta = certified_delta(m, base)
        assert overall >= tau * base >= base and beta == pytest.approx(
            math.exp(-m * evr.bernoulli_kl(base, tau * base)), rel=1e-12)
        # jax_privacy reports tau*base + beta*(1 - tau*base) (multi-verification setting); our
        # tau*base + beta is never smaller and at most 1% larger at the optimum.
        jp = delta_calculation.get_overall_delta(m, base)
        assert jp <= overall * (1 + 1e-6) and overall <= 1.01 * jp
    n_min = evr_minimum_samples(1e-4)
    assert evr.base_delta_for_target(n_min, 1e-4) is not None and evr.base_delta_for_target(n_min - 1, 1e-4) is None
    assert 1e4 < n_min < 2e5
    assert evr_minimum_samples(1e-4, 5e-5) > n_min


def test_certify_verified_and_not():
    acc = BallsInBins(TOEPLITZ4, 8, 4)
    m = 1 << 15
    kl = dict(method="bernoulli_kl")   # the plain-draw test and its EVR bound
    ok = acc.certify(3.0, 4.0, 1e-2, m, key=5, **kl)
    assert ok.verified and ok.delta <= 1e-2 and ok.delta_estimate <= ok.base_delta
    assert ok.num_samples == m and 0 < ok.failure_probability < 1e-2 and ok.tau >= 1
    assert ok.delta == pytest.approx(ok.tau * ok.base_delta + ok.failure_probability, rel=1e-9)
    bad = acc.certify(0.7, 1.0, 1e-2, m, key=5, **kl)
    assert not bad.verified and bad.delta == math.inf and bad.delta_estimate > bad.base_delta
    with pytest.raises(ValueError, match="num_samples"):
        acc.certify(3.0, 4.0, 1e-6, 1000, key=5, **kl)


def test_one_default_certificate_method():
    """BallsInBins.certify, certify_noise, optimize_correlation and the CLI share one default."""
    import inspect

    from dpjax.cli.main import build_parser
    from dpjax.montecarlo import evr
    from dpjax.optimization import CertifySettings, certify_result, optimize_correlation

    assert evr.DEFAULT_METHOD == "importance_betting"
    for fn, name in ((BallsInBins.certify, "method"), (BallsInBins.certify_noise, "method"),
                     (BallsInBins.calibrate, "method"), (CertifySettings, "method")):
        assert inspect.signature(fn).parameters[name].default == evr.DEFAULT_METHOD, fn
    # certify_noise and the certify step take CertifySettings; optimize_correlation's certify=True
    # is CertifySettings() and its default.
    assert CertifySettings().method == evr.DEFAULT_METHOD
    # certify_result's default (None) resolves per scheme: balls-in-bins takes CertifySettings().
    from dpjax.optimization.loop import _default_certify_settings

    assert inspect.signature(certify_result).parameters["settings"].default is None
    assert _default_certify_settings(None) == CertifySettings()
    assert _default_certify_settings({"scheme": "b_min_sep"}).method == "bernoulli_kl"
    assert inspect.signature(optimize_correlation).parameters["certify"].default is True
    parser = build_parser()
    common = ["--batches-per-epoch", "2", "--epochs", "2", "--epsilon", "1", "--delta", "0.1"]
    assert parser.parse_args(["mc-certify", *common, "--noise-multiplier", "1"]).certify_method == evr.DEFAULT_METHOD
    # optimize resolves its method per amplification when the arguments are checked.
    from dpjax.cli.optimize import check_args

    args = parser.parse_args(["optimize", *common, "--no-save"])
    check_args(args)
    assert args.certify_method == evr.DEFAULT_METHOD
    # mc-calibrate resolves its default per scheme (b-min-sep has only bernoulli_kl).
    from dpjax.cli.calibrate import certify_method_of

    assert certify_method_of(parser.parse_args(["mc-calibrate", *common])) == evr.DEFAULT_METHOD
    # The default needs no more samples than plain draws would: at 1e-6 a 2^16-sample test runs
    # (plain draws refuse it below evr_minimum_samples, ~1.9e7 samples).
    cert = BallsInBins(TOEPLITZ4, 8, 4).certify(8.0, 4.0, 1e-6, 1 << 16, key=5)
    assert cert.method == "importance_betting" and cert.verified and cert.delta <= 1e-6


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("corr, b, e, name", [
    (np.ones((4, 3)), 2, 2, "square"),
    (np.triu(np.ones((4, 4))), 2, 2, "lower triangular"),
    (-np.eye(4), 2, 2, "non-negative"),
    (np.where(np.eye(4) > 0, np.nan, 0.0), 2, 2, "finite"),
    (np.eye(6), 2, 2, "batches_per_epoch \\* epochs"),
    (np.eye(4), 0, 4, "batches_per_epoch"),
    (np.eye(4), 2, 1.5, "epochs"),
    (np.array([1.0, -0.1]), 2, 2, ">= 0"),
    (np.eye(4) + 0j, 2, 2, "real"),
    (np.ones((2, 2, 2)), 2, 2, "2-D"),
    (np.array([]), 2, 2, "non-empty"),
    ("eye", 2, 2, "real array"),
])
def test_bad_correlation(corr, b, e, name):
    with pytest.raises(ValueError, match=name):
        BallsInBins(corr, b, e)


def test_bad_call_arguments():
    acc = BallsInBins(np.eye(4), 2, 2)
    for kwargs, name in [
        (dict(noise_multiplier=0.0), "noise_multiplier"), (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(noise_multiplier=float("nan")), "noise_multiplier"), (dict(num_samples=0), "num_samples"),
        (dict(num_samples=2.5), "num_samples"), (dict(epsilon=-1.0), "epsilon"), (dict(epsilon=[1.0, np.nan]), "epsilon"),
    ]:
        args = dict(noise_multiplier=1.0, epsilon=1.0, num_samples=100, key=0) | kwargs
        with pytest.raises(ValueError, match=name):
            acc.delta(**args)
    with pytest.raises(ValueError, match="target_delta"):
        acc.certify(1.0, 1.0, 1.5, 1000, 0)
    with pytest.raises(ValueError, match="key"):
        acc.delta(1.0, 1.0, 100, None)


# ----------------------------------------------------------------------------- CLI


def test_cli_mc_delta_and_certify(capsys):
    from dpjax.cli.main import main

    # 2^14 samples at b = 8, one epsilon: the plain and variance-reduced programs that
    # test_epsilon_hat_brackets_target and tests/montecarlo/test_evr.py compile.
    args = ["--toeplitz", "1,0.5,0.25", "--batches-per-epoch", "8", "--epochs", "4", "--noise-multiplier", "1.0",
            "--samples", "16384", "--seed", "3"]
    assert main(["mc-delta", *args, "--epsilon", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    d, se = BallsInBins(np.array([1.0, 0.5, 0.25]), 8, 4).delta(1.0, 2.0, 16384, 3)
    assert out["delta"] == pytest.approx(float(d), rel=1e-12) and out["standard_error"] == pytest.approx(float(se), rel=1e-12)
    assert out["num_samples"] == 16384
    assert main(["mc-certify", *args, "--epsilon", "6", "--target-delta", "0.05", "--json"]) == 0
    cert = json.loads(capsys.readouterr().out)
    assert cert["verified"] is True and cert["delta"] <= 0.05
    assert main(["mc-delta", *args, "--epsilon", "2", "--noise-multiplier", "-1", "--json"]) == 2
    assert "noise_multiplier" in capsys.readouterr().err.replace("-", "_")


# ----------------------------------------------------------------------------- slow


@pytest.mark.slow
def test_large_sample_count_bounded_memory(reference_cases):
    """2^28 samples through the chunked scan (memory ~ one chunk) vs the pinned 2^22-sample value."""
    row = reference_cases["G_bib_toeplitz4_b32_E8_s1_eps2"]
    d, se = BallsInBins(TOEPLITZ4, 32, 8).delta(1.0, 2.0, 1 << 28, key=123)
    assert _close(float(d), float(se), row["value"], row["extra"]["standard_error"])
    assert se < 4e-5


def test_cli_certify_default_seed_is_not_the_calibration_seed():
    # mc-calibrate then mc-certify with default seeds must verify on fresh draws (the draws of a
    # seed are a prefix of one stream, so equal seeds would reuse the calibration's samples).
    from dpjax.cli.main import build_parser

    parser = build_parser()
    common = ["--batches-per-epoch", "2", "--epochs", "2", "--epsilon", "1"]
    cal = parser.parse_args(["mc-calibrate", *common, "--delta", "0.1"])
    cert = parser.parse_args(["mc-certify", *common, "--noise-multiplier", "1", "--delta", "0.1"])
    assert cal.seed == 0 and cert.seed == 1
