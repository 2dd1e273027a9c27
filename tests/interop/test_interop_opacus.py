"""dpjax.interop.opacus: get_noise_multiplier, RunningAccountant, step / batch-size calibration.
Query-cost ratios live in benchmarks/bench_interop.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax.interop import RunningAccountant, calibrate_batch_size, calibrate_steps, get_noise_multiplier


def test_running_equals_dpsgd_epsilon_and_state_dict_roundtrip():
    acc = RunningAccountant()
    for _ in range(4):
        acc.step(noise_multiplier=1.1, sample_rate=0.01, num_steps=250)
    eps = acc.get_epsilon(1e-5)
    ref = dpjax.dpsgd_epsilon(1.1, 0.01, 1000, 1e-5)
    assert eps == pytest.approx(ref, rel=1e-9)
    # Per-step calls give the same history as per-phase calls.
    per_step = RunningAccountant()
    for _ in range(1000):
        per_step.step(noise_multiplier=1.1, sample_rate=0.01)
    assert per_step.history == acc.history == [(1.1, 0.01, 1000)]
    # JSON round trip, then continue training in the restored accountant.
    restored = RunningAccountant().load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert restored.get_epsilon(1e-5) == pytest.approx(ref, rel=1e-9)
    restored.step(noise_multiplier=1.1, sample_rate=0.01, num_steps=1000)
    assert restored.get_epsilon(1e-5) == pytest.approx(dpjax.dpsgd_epsilon(1.1, 0.01, 2000, 1e-5), rel=1e-9)


@pytest.mark.slow  # two phases: two grid plans and compilations
def test_heterogeneous_phases_and_fast_path():
    acc = RunningAccountant(horizon=600)
    acc.step(noise_multiplier=1.0, sample_rate=0.02, num_steps=300)
    acc.step(noise_multiplier=1.5, sample_rate=0.02, num_steps=300)
    exact = acc.get_epsilon(1e-5, exact=True)
    ref = pld.epsilon([(pld.PoissonSubsampledGaussian(1.0, 0.02), 300),
                       (pld.PoissonSubsampledGaussian(1.5, 0.02), 300)], 1e-5)
    assert exact == pytest.approx(float(ref.epsilon), rel=1e-9)
    fast = acc.get_epsilon(1e-5)
    # Fixed grid planned at the horizon: certified (never below the optimistic bound) and tight.
    assert float(ref.epsilon_lower) <= fast
    assert fast == pytest.approx(exact, rel=2e-3)
    assert acc.get_delta(exact) <= 1e-5 * (1 + 1e-6)


def test_fast_path_certified_below_horizon():
    acc = RunningAccountant(horizon=2000)
    acc.step(noise_multiplier=1.0, sample_rate=0.01, num_steps=400)
    fast = acc.get_epsilon(1e-5)
    res = pld.dpsgd_accounting(1.0, 0.01, 400, target_delta=1e-5)
    assert float(res.epsilon_lower) <= fast <= float(res.epsilon_upper) * (1 + 2e-3)


def test_empty_and_bad_input():
    acc = RunningAccountant()
    assert acc.get_epsilon(1e-5) == 0.0 and len(acc) == 0
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.step(noise_multiplier=0.0, sample_rate=0.1)
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="num_steps"):
        acc.step(noise_multiplier=1.0, sample_rate=0.1, num_steps=0)
    with pytest.raises(ValueError, match="delta"):
        acc.get_epsilon(1.0)
    with pytest.raises(ValueError, match="state"):
        acc.load_state_dict({"history": []})
    with pytest.raises(ValueError, match="exactly one"):
        get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01)
    with pytest.raises(ValueError, match="accountant"):
        get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.01, steps=10, accountant="rdp")


@pytest.mark.slow  # compiles the calibration program
def test_get_noise_multiplier_opacus_convention():
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.02, epochs=4)
    steps = int(4 / 0.02)
    assert dpjax.dpsgd_epsilon(sigma, 0.02, steps, 1e-5) <= 2.0 + 1e-9
    assert dpjax.dpsgd_epsilon(sigma * 0.99, 0.02, steps, 1e-5) > 2.0


@pytest.mark.slow  # ~35 certified evaluations at varying grid sizes (compiles)
def test_calibrate_steps_and_batch_size():
    t = calibrate_steps(noise_multiplier=1.0, sample_rate=0.02, target_epsilon=2.0, target_delta=1e-5)
    assert dpjax.dpsgd_epsilon(1.0, 0.02, t, 1e-5) <= 2.0 < dpjax.dpsgd_epsilon(1.0, 0.02, t + 1, 1e-5)
    b = calibrate_batch_size(noise_multiplier=1.0, num_examples=10_000, steps=500, target_epsilon=2.0,
                             target_delta=1e-5)
    assert dpjax.dpsgd_epsilon(1.0, b / 10_000, 500, 1e-5) <= 2.0 < dpjax.dpsgd_epsilon(1.0, (b + 1) / 10_000, 500, 1e-5)
