"""dpjax.sampling: balls-in-bins and Poisson batch schedules."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.stats

from dpjax.sampling import BallsInBinsSampler, PoissonSampler


def _epoch_members(s, e):
    """All real (mask=True) indices of epoch e, before truncation is applied via the bins."""
    return np.concatenate([s.bin(i) for i in range(s.batches_per_epoch)])


@pytest.mark.parametrize("n,b,e", [(1000, 10, 3), (997, 7, 2), (50, 64, 2)])
def test_every_example_once_per_epoch_before_truncation(n, b, e):
    s = BallsInBinsSampler(n, b, e, batch_size=max(1, n // b), seed=3)
    members = _epoch_members(s, 0)
    np.testing.assert_array_equal(np.sort(members), np.arange(n))
    assert s.bin_sizes.sum() == n and s.order.dtype == np.int32
    # After truncation: each example at most once per epoch, masked entries are exactly the padding.
    for ep in range(e):
        seen = []
        for idx, mask in s.epoch(ep):
            assert idx.shape == (s.batch_size,) and mask.shape == (s.batch_size,)
            assert idx.dtype == np.int32 and mask.dtype == bool
            assert not mask[np.argmin(mask):].any() or mask.all()  # real entries first, then padding
            seen.append(idx[mask])
        seen = np.concatenate(seen)
        assert np.unique(seen).size == seen.size
        dropped = np.maximum(s.bin_sizes - s.batch_size, 0).sum()
        assert seen.size == n - dropped
        assert s.truncated_fraction() == pytest.approx(dropped / n)


def test_same_bins_every_epoch_and_round_robin():
    s = BallsInBinsSampler(300, 5, 4, batch_size=80, seed=1)
    batches = list(s)
    assert len(batches) == s.num_steps == 20
    for t, (idx, mask) in enumerate(batches):
        ref_idx, ref_mask = batches[t % 5]
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_array_equal(mask, ref_mask)


def test_seed_reproducible_and_seed_sensitive():
    a = BallsInBinsSampler(5000, 20, 2, batch_size=300, seed=42)
    b = BallsInBinsSampler(5000, 20, 2, batch_size=300, seed=42)
    c = BallsInBinsSampler(5000, 20, 2, batch_size=300, seed=43)
    for (i1, m1), (i2, m2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(m1, m2)
    assert not np.array_equal(a.order, c.order)
    p = PoissonSampler(5000, 0.01, 10, batch_size=100, seed=7)
    q = PoissonSampler(5000, 0.01, 10, batch_size=100, seed=7)
    for t in range(10):
        np.testing.assert_array_equal(p.batch(t)[0], q.batch(t)[0])


def test_bin_sizes_multinomial_chi_square():
    """Bin sizes ~ Multinomial(N, 1/b): Pearson chi-square at significance 1e-3, seeds 0..199.

    Per draw, X = sum (c_i - N/b)^2 / (N/b) ~ chi2(b - 1) asymptotically (N/b = 100 here);
    the 200 p-values must pass a Kolmogorov-Smirnov test for uniformity at 1e-3, and the pooled
    statistic sum X ~ chi2(200 (b - 1)) a two-sided test at 1e-3.  Deterministic (fixed seeds).
    """
    n, b = 2000, 20
    stats = []
    for seed in range(200):
        c = BallsInBinsSampler(n, b, 1, batch_size=100, seed=seed).bin_sizes
        stats.append(np.sum((c - n / b) ** 2 / (n / b)))
    stats = np.array(stats)
    pvals = scipy.stats.chi2.sf(stats, b - 1)
    assert scipy.stats.kstest(pvals, "uniform").pvalue > 1e-3
    pooled = scipy.stats.chi2.cdf(stats.sum(), 200 * (b - 1))
    assert 5e-4 < pooled < 1 - 5e-4


def test_single_bin_marginal_is_binomial():
    """Marginal of one bin ~ Binomial(N, 1/b): chi-square on 5 pooled cells, 400 seeds, significance 1e-3."""
    n, b = 400, 8
    sizes = np.array([BallsInBinsSampler(n, b, 1, batch_size=60, seed=s).bin_sizes[0] for s in range(400)])
    edges = [-np.inf, 44.5, 48.5, 51.5, 55.5, np.inf]
    obs = np.histogram(sizes, bins=edges)[0]
    cdf = scipy.stats.binom.cdf(np.array(edges[1:-1]), n, 1 / b)
    probs = np.diff(np.concatenate([[0.0], cdf, [1.0]]))
    assert scipy.stats.chisquare(obs, probs * obs.sum()).pvalue > 1e-3


def test_truncation_rate_and_overflow_bound():
    s = BallsInBinsSampler(60_000, 100, 5, batch_size=600, seed=0)
    # Truncating at the mean: E[(K - mu)+] ~ sd / sqrt(2 pi) (normal approximation, 2% here).
    sd = np.sqrt(60_000 * 0.01 * 0.99)
    assert s.truncation_rate() == pytest.approx(sd / np.sqrt(2 * np.pi) / 600, rel=0.02)
    big = BallsInBinsSampler(60_000, 100, 5, batch_size=760, seed=0)
    assert big.overflow_probability() == pytest.approx(100 * scipy.stats.binom.sf(760, 60_001, 0.01), rel=1e-12)
    assert big.overflow_probability() < 2e-8
    assert big.truncation_delta(2.0) == pytest.approx((1 + np.exp(2.0)) * big.overflow_probability())
    assert big.truncated_fraction() == 0.0
    # Empirical truncation over seeds agrees with the exact expectation (se-based tolerance).
    fr = [BallsInBinsSampler(6000, 10, 1, batch_size=600, seed=k).truncated_fraction() for k in range(300)]
    exact = BallsInBinsSampler(6000, 10, 1, batch_size=600).truncation_rate()
    assert abs(np.mean(fr) - exact) < 4 * np.std(fr) / np.sqrt(300)


def test_accountant_uses_the_schedule():
    from dpjax.matrices import Toeplitz

    s = BallsInBinsSampler(1000, 8, 3, batch_size=150, seed=0)
    acc = s.accountant(Toeplitz(np.array([1.0, 0.5])))
    assert (acc.batches_per_epoch, acc.epochs, acc.num_rounds) == (8, 3, s.num_steps)


def test_poisson_sampler_law_and_accounting():
    p = PoissonSampler(10_000, 0.02, 200, batch_size=260, seed=0)
    sizes = np.array([p.sample_size(t) for t in range(200)])
    # Binomial(10000, 0.02): mean 200, sd 14; 200 draws -> mean within 4 se.
    assert abs(sizes.mean() - 200) < 4 * 14 / np.sqrt(200)
    idx, mask = p.batch(3)
    assert mask.sum() == min(sizes[3], 260)
    assert np.unique(idx[mask]).size == mask.sum()
    import dpjax

    assert p.epsilon(1.0, 1e-5) == dpjax.dpsgd_epsilon(1.0, 0.02, 200, 1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_examples=0), "num_examples"),
    (dict(batches_per_epoch=0), "batches_per_epoch"),
    (dict(epochs=1.5), "epochs"),
    (dict(batch_size=-1), "batch_size"),
    (dict(seed=-1), "seed"),
    (dict(num_examples=2**31), "num_examples"),
])
def test_bad_input(kwargs, match):
    base = dict(num_examples=100, batches_per_epoch=4, epochs=2, batch_size=30, seed=0)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BallsInBinsSampler(**base)
    with pytest.raises(ValueError, match="sampling_prob"):
        PoissonSampler(100, 0.0, 10, 5)
    with pytest.raises(ValueError, match="step"):
        BallsInBinsSampler(100, 4, 2, 30).batch(8)


@pytest.mark.slow
def test_ten_million_examples_linear_memory():
    """10M examples: peak RSS growth of building the schedule and streaming an epoch ~ 4 bytes/example."""
    code = textwrap.dedent("""
        import tracemalloc, numpy as np
        from dpjax.sampling import BallsInBinsSampler
        tracemalloc.start()
        s = BallsInBinsSampler(10_000_000, 1000, 2, batch_size=10_500, seed=0)
        total = 0
        for e in range(2):
            for idx, mask in s.epoch(e):
                total += int(mask.sum())
        print(tracemalloc.get_traced_memory()[1], total, s.truncation_rate())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    peak, total = int(out[0]), int(out[1])
    print(f"10M examples, 2 epochs: peak traced memory {peak / 1e6:.1f} MB ({peak / 1e7:.2f} bytes/example), "
          f"expected truncation rate {float(out[2]):.2e}")
    assert total <= 2 * 10_000_000
    # int32 order: 4 bytes/example, plus O(b + B) for sizes and one batch; nothing per epoch or int64.
    assert 4 * 10_000_000 <= peak < 4.5 * 10_000_000
