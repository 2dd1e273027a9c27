"""dpjax.epsilon_curve: eps(T) for many T from one transform, equal to separate calls within the
union of the two certified brackets, never below the exact oracle at q = 1."""

from __future__ import annotations

import numpy as np
import pytest

import dpjax
from dpjax import pld


def _check_against_separate(curve, sigma, q, delta, idx):
    for i in idx:
        t = int(curve.steps[i])
        single = pld.dpsgd_accounting(sigma, q, t, target_delta=delta)
        # Both are certified upper bounds: each lies above the other's certified lower end, so
        # they differ by at most the union of the brackets.
        assert curve.epsilon_lower[i] <= curve.epsilon[i]
        assert curve.epsilon[i] >= single.epsilon_lower * (1 - 1e-12)
        assert single.epsilon >= curve.epsilon_lower[i] * (1 - 1e-12)
        width = max(curve.epsilon[i], single.epsilon) - min(curve.epsilon_lower[i], single.epsilon_lower)
        assert abs(curve.epsilon[i] - single.epsilon) <= width
        assert abs(curve.epsilon[i] - single.epsilon) <= 1e-3 * single.epsilon   # relative_accuracy


def test_curve_matches_separate_calls():
    steps = [50 * e for e in range(1, 13)]
    curve = dpjax.epsilon_curve(1.0, 0.01, steps, 1e-5)
    assert list(curve.steps) == steps and not curve.recomputed.any()
    assert np.all(np.diff(curve.epsilon) > 0)        # more steps, less privacy
    _check_against_separate(curve, 1.0, 0.01, 1e-5, [0, 5, 11])


def test_curve_exact_oracle_q1_and_order():
    steps = [400, 1, 25, 100, 25]
    curve = dpjax.epsilon_curve(4.0, 1.0, steps, 1e-6, with_lower=True)
    assert list(curve.steps) == steps and curve.epsilon[2] == curve.epsilon[4]
    for t, e, lo in zip(steps, curve.epsilon, curve.epsilon_lower):
        exact = float(pld.gaussian_epsilon(1e-6, np.sqrt(t) / 4.0))
        assert lo * (1 - 1e-9) <= exact <= e * (1 + 1e-12)
        assert e <= exact * 1.003 + 1e-9


@pytest.mark.slow
def test_curve_100_values_match_100_separate_calls():
    steps = [100 * e for e in range(1, 101)]
    curve = dpjax.epsilon_curve(1.0, 0.01, steps, 1e-5)
    _check_against_separate(curve, 1.0, 0.01, 1e-5, range(100))


@pytest.mark.parametrize("kw, match", [
    (dict(noise_multiplier=0.0), "noise_multiplier"), (dict(sampling_prob=0.0), "sampling_prob"),
    (dict(steps=[10, 0]), "steps"), (dict(steps=[]), "steps"), (dict(target_delta=1.0), "target_delta"),
])
def test_curve_bad_input(kw, match):
    args = dict(noise_multiplier=1.0, sampling_prob=0.01, steps=[10, 20], target_delta=1e-5) | kw
    with pytest.raises(ValueError, match=match):
        dpjax.epsilon_curve(**args)


def test_curve_at_tiny_delta_has_the_single_calls_error_accounting():
    # At delta 1e-14 the FFT round-off floor matters; the curve ignored the single call's tilted
    # tail pass and gave 6.36, 3.57, 6.46, 8.01 for T = 1, 10, 100, 1000 (single call: 4.5437 at
    # T = 1000), not monotone in T.
    steps = [1, 10, 100, 1000]
    curve = dpjax.epsilon_curve(1.0, 0.01, steps, 1e-14)
    assert np.all(np.diff(curve.epsilon) >= 0), curve.epsilon
    for t, eps in zip(steps, curve.epsilon):
        single = dpjax.dpsgd_epsilon(1.0, 0.01, t, 1e-14)
        if t >= 10:
            assert abs(eps - single) <= 1e-5 * single, (t, eps, single)
        else:
            # Same accounting on the curve's grid (planned for T = 1000): within 2% at one step.
            assert eps <= 1.02 * single, (t, eps, single)
