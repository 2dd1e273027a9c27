"""BMinSepSampler: the b-min-sep batch schedule (Dong & Ganesh, "Privacy Amplification for BandMF
via b-Min-Sep Subsampling") with fixed batch shapes, and its truncation term.

Statistical checks use |z| <= 4 (a false alarm has probability ~6e-5 per check under a normal
approximation; the seeds are fixed, so each run is deterministic).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from dpjax.montecarlo import BMinSep
from dpjax.sampling import BMinSepSampler

Z = 4.0


def _participations(sampler):
    """``(N, n)`` bool matrix of who is in which (untruncated) batch."""
    x = np.zeros((sampler.num_examples, sampler.steps), bool)
    for t in range(sampler.steps):
        x[sampler.members(t), t] = True
    return x


@pytest.mark.parametrize("p,b", [(0.3, 4), (1.0, 3), (0.2, 1)])
def test_min_separation_and_stationary_rate(p, b):
    s = BMinSepSampler(num_examples=4000, sampling_prob=p, min_sep=b, steps=40, batch_size=4000, seed=5)
    x = _participations(s)
    q = p / (1 + (b - 1) * p)
    assert s.participation_rate == pytest.approx(q, rel=1e-15)
    # No example participates twice within b rounds.
    for row in x[:200]:
        t = np.flatnonzero(row)
        assert np.all(np.diff(t) >= b)
    # Stationary from round 0: the first and the last batches are Binomial(N, q).
    for t in (0, s.steps - 1):
        k = x[:, t].sum()
        assert abs(k - s.num_examples * q) <= Z * math.sqrt(s.num_examples * q * (1 - q)) + 1e-9
    # The mean count per example (independent across examples) is n q.
    counts = x.sum(1)
    se = counts.std(ddof=1) / math.sqrt(counts.size)
    assert abs(counts.mean() - s.steps * q) <= Z * se + 1e-9
    if p == 1.0:  # balls-in-bins: every example exactly every b rounds
        assert np.all(np.abs(counts - s.steps / b) <= 1)


def test_fixed_shapes_truncation_and_reproducibility():
    s = BMinSepSampler(num_examples=500, sampling_prob=0.2, min_sep=2, steps=12, batch_size=60, seed=1)
    assert len(s) == 12 and len(list(s)) == 12
    for t, (idx, mask) in enumerate(s):
        assert idx.shape == mask.shape == (60,) and idx.dtype == np.int32 and mask.dtype == bool
        members = s.members(t)
        assert mask.sum() == min(members.size, 60) == min(s.sample_size(t), 60)
        assert set(idx[mask]) <= set(members) and np.all(idx[~mask] == 0)
    again = BMinSepSampler(num_examples=500, sampling_prob=0.2, min_sep=2, steps=12, batch_size=60, seed=1)
    assert all(np.array_equal(a[0], c[0]) for a, c in zip(s, again))
    other = BMinSepSampler(num_examples=500, sampling_prob=0.2, min_sep=2, steps=12, batch_size=60, seed=2)
    assert not all(np.array_equal(a[0], c[0]) for a, c in zip(s, other))


def test_truncation_term_and_accountant():
    n_ex, p, b, steps = 2000, 0.1, 3, 50
    q = p / (1 + (b - 1) * p)
    bs = 250
    s = BMinSepSampler(num_examples=n_ex, sampling_prob=p, min_sep=b, steps=steps, batch_size=bs, seed=0)
    tail = scipy.stats.binom.sf(bs, n_ex + 1, q)
    assert s.overflow_probability() == pytest.approx(min(1.0, steps * tail), rel=1e-9)
    assert s.truncation_delta(1.0) == pytest.approx(min(1.0, (1 + math.e) * steps * tail), rel=1e-9)
    # Expected batch N q ~ 167: a cap at the mean overflows (bound 1); a cap far above, almost never.
    small = BMinSepSampler(num_examples=n_ex, sampling_prob=p, min_sep=b, steps=steps, batch_size=167, seed=0)
    assert small.truncation_delta(1.0) == 1.0 and small.truncation_rate() > 0.01
    assert s.truncation_rate() < 1e-6 and s.truncation_delta(1.0) < 1e-6
    acc = s.accountant(np.array([1.0, 0.5]))
    assert isinstance(acc, BMinSep)
    assert (acc.sampling_prob, acc.min_sep, acc.num_rounds, acc.warm_start) == (p, b, steps, True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(min_sep=0), "min_sep"),
    (dict(sampling_prob=1.5), "sampling_prob"),
    (dict(sampling_prob=float("nan")), "sampling_prob"),
    (dict(sampling_prob=0.0), "sampling_prob"),
    (dict(steps=0), "steps"),
    (dict(batch_size=0), "batch_size"),
    (dict(num_examples=0), "num_examples"),
])
def test_validation(kwargs, match):
    args = dict(num_examples=100, sampling_prob=0.1, min_sep=2, steps=5, batch_size=10, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BMinSepSampler(**args)
    s = BMinSepSampler(num_examples=100, sampling_prob=0.1, min_sep=2, steps=5, batch_size=10)
    with pytest.raises(ValueError, match="step"):
        s.batch(5)


@pytest.mark.slow
def test_overflow_bound_holds_empirically():
    # The truncation term's overflow probability (a union over rounds of the stationary
    # Binomial(N + 1, q) tail) against the frequency of "some round's batch exceeds B" in 4,000
    # independent schedules of N + 1 examples: never above the bound by more than 3 standard errors.
    n_ex, p, b, steps, reps = 300, 0.2, 3, 30, 4000
    largest = np.array([max(BMinSepSampler(num_examples=n_ex + 1, sampling_prob=p, min_sep=b, steps=steps,
                                           batch_size=n_ex + 1, seed=s).sample_size(t) for t in range(steps))
                        for s in range(reps)])
    for bs in (58, 60, 64):
        bound = BMinSepSampler(num_examples=n_ex, sampling_prob=p, min_sep=b, steps=steps, batch_size=bs,
                               seed=0).overflow_probability()
        freq = float(np.mean(largest > bs))
        assert 1e-3 < bound < 0.5
        assert freq <= bound + 3 * np.sqrt(bound * (1 - bound) / reps), (bs, freq, bound)
