"""One epochs-to-steps rule, never fewer steps than training takes, at every entry point."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax._base.names import epochs_to_steps
from dpjax.interop import get_noise_multiplier
from dpjax.interop.opacus import steps_from_epochs as opacus_steps_from_epochs
from dpjax.sampling import PoissonSampler


def _exact_steps(epochs: str, q: str) -> int:
    """``ceil(epochs / q)`` in exact decimal arithmetic: the steps a run of ``epochs`` passes takes."""
    return math.ceil(Fraction(epochs) / Fraction(q))


def _random_pairs(n: int, seed: int):
    """Decimal (epochs, q) pairs as a user writes them: epochs an integer or one or two decimals,
    q with 1 to 6 significant digits in [1e-5, 1]."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        digits = int(rng.integers(0, 3))
        epochs = f"{rng.uniform(0.01, 200):.{digits}f}"
        if float(epochs) <= 0:
            epochs = "1"
        sig = int(rng.integers(1, 7))
        q = float(f"{10 ** rng.uniform(-5, 0):.{sig}g}")
        q = min(q, 1.0)
        pairs.append((epochs, repr(q)))
    return pairs


def test_seven_epochs_at_seven_percent_are_one_hundred_steps():
    # 7 / 0.07 = 99.99999999999999 in binary floating point: int() accounted 99 steps.
    assert epochs_to_steps(7, 0.07) == 100
    eps_epochs = dpjax.dpsgd_epsilon(1.0, sample_rate=0.07, epochs=7, target_delta=1e-5)
    assert eps_epochs == dpjax.dpsgd_epsilon(1.0, 0.07, 100, 1e-5)
    assert eps_epochs > dpjax.dpsgd_epsilon(1.0, 0.07, 99, 1e-5)


def test_calibration_from_epochs_covers_every_step():
    sigma = dpjax.dpsgd_noise_multiplier(sample_rate=0.07, epochs=7, target_epsilon=1.0, target_delta=1e-5)
    # The 99-step sigma (2.84096) gives epsilon 1.0052 at the 100 steps of 7 epochs.
    assert dpjax.dpsgd_epsilon(sigma, 0.07, 100, 1e-5) <= 1.0
    assert sigma == dpjax.dpsgd_noise_multiplier(0.07, 100, 1.0, 1e-5)


def test_thousand_decimal_pairs_match_the_exact_count_and_the_sampler():
    pairs = _random_pairs(1000, seed=20261206)
    ceilinged = 0
    for epochs, q in pairs:
        want = _exact_steps(epochs, q)
        got = epochs_to_steps(float(epochs), float(q))
        assert got == want, (epochs, q, got, want)
        assert PoissonSampler.from_epochs(1000, float(q), float(epochs), batch_size=8).num_steps == want
        assert opacus_steps_from_epochs(float(epochs), float(q)) == want
        ceilinged += Fraction(epochs) / Fraction(q) != want
    # Both cases occur: exact quotients (rounded to nearest) and partial last epochs (ceiling).
    assert 50 <= ceilinged <= 990


@pytest.mark.parametrize("epochs,q", [(7, 0.07), (3, 0.1), (30, 256 / 60000)])
def test_every_entry_point_counts_the_same_steps(epochs, q):
    steps = epochs_to_steps(epochs, q)
    sigma, delta = 1.0, 1e-5
    want = dpjax.dpsgd_epsilon(sigma, q, steps, delta)
    assert dpjax.dpsgd_epsilon(sigma, sample_rate=q, epochs=epochs, target_delta=delta) == want
    assert pld.dpsgd_epsilon(sigma, sample_rate=q, epochs=epochs, target_delta=delta) == want
    eps = float(want)
    assert dpjax.dpsgd_delta(sigma, sample_rate=q, epochs=epochs, target_epsilon=eps) == dpjax.dpsgd_delta(
        sigma, q, steps, eps)
    assert dpjax.group_epsilon(sigma, sample_rate=q, epochs=epochs, target_delta=delta, group_size=1) == \
        dpjax.group_epsilon(sigma, q, steps, delta, group_size=1)
    assert get_noise_multiplier(target_epsilon=2.0, target_delta=delta, sample_rate=q, epochs=epochs) == \
        get_noise_multiplier(target_epsilon=2.0, target_delta=delta, sample_rate=q, steps=steps)


def test_partial_epochs_round_up():
    assert epochs_to_steps(2.5, 0.3) == 9          # 8.33 steps: the ninth is still trained on
    assert epochs_to_steps(30, 256 / 60000) == 7032  # 7031.25
    assert epochs_to_steps(1e-9, 0.5) == 1
    with pytest.raises(ValueError, match="epochs"):
        epochs_to_steps(0, 0.1)
    with pytest.raises(ValueError, match="sampling_prob"):
        epochs_to_steps(1, 0.0)
