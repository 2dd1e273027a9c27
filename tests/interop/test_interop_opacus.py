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


# ----------------------------------------------------------------------------- TrainingScenario forms

def _random_poisson_scenarios(seed, count, *, noise=True, max_steps=400):
    """Poisson scenarios with random noise, rate and steps or epochs (epochs resolved by the one rule)."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(count):
        q = float(rng.uniform(0.005, 0.2))
        sigma = float(rng.uniform(0.7, 2.5)) if noise else None
        if i % 2:
            runs.append(dpjax.TrainingScenario(sigma, dpjax.Poisson(q), epochs=float(rng.uniform(0.5, 3.0))))
        else:
            runs.append(dpjax.TrainingScenario(sigma, dpjax.Poisson(q), steps=int(rng.integers(1, max_steps))))
    return runs


def test_step_scenario_records_the_keyword_history():
    for run in _random_poisson_scenarios(0, 4):
        by_scenario = RunningAccountant().step(run)
        by_keywords = RunningAccountant().step(noise_multiplier=run.noise_multiplier,
                                               sample_rate=run.sampling.sampling_prob, num_steps=run.steps)
        assert by_scenario.history == by_keywords.history == [(run.noise_multiplier, run.sampling.sampling_prob,
                                                                run.steps)]
        assert by_scenario.get_epsilon(1e-5) == by_keywords.get_epsilon(1e-5)
    # A noise schedule: each step at its own noise multiplier, as per-step keyword calls record it.
    run = dpjax.TrainingScenario(np.array([1.0, 1.5, 1.0, 2.0]), dpjax.Poisson(0.05))
    per_step = RunningAccountant()
    for sigma in (1.0, 1.5, 1.0, 2.0):
        per_step.step(noise_multiplier=sigma, sample_rate=0.05)
    assert RunningAccountant().step(run).history == per_step.history == [(1.0, 0.05, 2), (1.5, 0.05, 1),
                                                                         (2.0, 0.05, 1)]


def test_step_scenario_refusals_name_the_problem():
    acc = RunningAccountant()
    fixed = dpjax.TrainingScenario(1.0, dpjax.FixedBatch(10, 1000), steps=5)
    with pytest.raises(ValueError, match=r"accounts Poisson sampling \(add/remove adjacency\), got FixedBatch "
                                         r"\(adjacency 'replace'\)"):
        acc.step(fixed)
    with pytest.raises(ValueError, match="accounts Poisson sampling.*got RandomAllocation"):
        acc.step(dpjax.TrainingScenario(1.0, dpjax.RandomAllocation(10), epochs=1))
    with pytest.raises(ValueError, match="accounts Poisson sampling.*got BallsInBins"):
        acc.step(dpjax.TrainingScenario(1.0, dpjax.BallsInBins(10), epochs=1))
    run = dpjax.TrainingScenario(1.0, dpjax.Poisson(0.01), steps=5)
    with pytest.raises(ValueError, match="group_size 1"):
        acc.step(run.replace(group_size=2))
    with pytest.raises(ValueError, match="noise_multiplier.*None"):
        acc.step(run.replace(noise_multiplier=None))
    with pytest.raises(ValueError, match="num_steps given with a TrainingScenario"):
        acc.step(run, num_steps=3)
    with pytest.raises(ValueError, match="noise_multiplier, sample_rate given with a TrainingScenario"):
        acc.step(run, noise_multiplier=1.0, sample_rate=0.01)
    with pytest.raises(ValueError, match="scenario must be a dpjax.TrainingScenario"):
        acc.step(1.0)
    with pytest.raises(ValueError, match="needs noise_multiplier and sample_rate"):
        acc.step(noise_multiplier=1.0)
    assert len(acc) == 0  # nothing recorded by a refused call


def test_calibration_scenario_refusals_name_the_problem():
    run = dpjax.TrainingScenario(1.0, dpjax.Poisson(0.01), steps=50)
    target = dict(target_epsilon=2.0, target_delta=1e-5)
    with pytest.raises(ValueError, match="finds the noise multiplier: give a scenario with noise_multiplier=None"):
        get_noise_multiplier(run, **target)
    with pytest.raises(ValueError, match="sample_rate, steps given with a TrainingScenario"):
        get_noise_multiplier(run.replace(noise_multiplier=None), sample_rate=0.01, steps=50, **target)
    with pytest.raises(ValueError, match="get_noise_multiplier needs sample_rate"):
        get_noise_multiplier(steps=50, **target)
    with pytest.raises(ValueError, match="accounts Poisson sampling.*got FixedBatch"):
        get_noise_multiplier(dpjax.TrainingScenario(None, dpjax.FixedBatch(10, 1000), steps=5), **target)
    with pytest.raises(ValueError, match="max_steps given with a TrainingScenario"):
        calibrate_steps(run, max_steps=10, **target)
    with pytest.raises(ValueError, match="calibrate_steps needs the scenario's noise_multiplier"):
        calibrate_steps(run.replace(noise_multiplier=None), **target)
    with pytest.raises(ValueError, match="one noise multiplier for every step, got a noise schedule of 2"):
        calibrate_steps(dpjax.TrainingScenario(np.array([1.0, 2.0]), dpjax.Poisson(0.01)), **target)
    with pytest.raises(ValueError, match="accounts Poisson sampling.*got FixedBatch.*'replace'"):
        calibrate_batch_size(dpjax.TrainingScenario(1.0, dpjax.FixedBatch(10, 1000), steps=5), num_examples=1000,
                             **target)
    with pytest.raises(ValueError, match="group_size 1"):
        calibrate_batch_size(run.replace(group_size=3), num_examples=1000, **target)
    with pytest.raises(ValueError, match="steps given with a TrainingScenario"):
        calibrate_batch_size(run, num_examples=1000, steps=50, **target)
    with pytest.raises(ValueError, match=r"sampling_prob 0.01 is below 1 / num_examples = 1 / 50"):
        calibrate_batch_size(run, num_examples=50, **target)
    with pytest.raises(ValueError, match=r"max_batch_size must be .*<= 1000|max_batch_size.*1000"):
        calibrate_batch_size(noise_multiplier=1.0, num_examples=1000, steps=50, max_batch_size=1001, **target)
    with pytest.raises(ValueError, match="max_batch_size"):
        calibrate_batch_size(noise_multiplier=1.0, num_examples=1000, steps=50, max_batch_size=0, **target)


def test_largest_batch_at_rate_is_exact():
    from dpjax.interop.opacus import _largest_batch_at_rate

    rng = np.random.default_rng(3)
    for n in rng.integers(1, 100_000, 200):
        n = int(n)
        b = int(rng.integers(1, n + 1))
        assert _largest_batch_at_rate(b / n, n) == b  # a rate B / N gives B back, rounding or not
        q = float(rng.uniform(1.0 / n, 1.0))
        got = _largest_batch_at_rate(q, n)
        assert got / n <= q and (got == n or (got + 1) / n > q)


@pytest.mark.slow  # one calibration per scenario
def test_get_noise_multiplier_scenario_equals_keywords():
    for run in _random_poisson_scenarios(1, 3, noise=False):
        target = dict(target_epsilon=float(np.round(1.0 + run.steps / 200, 3)), target_delta=1e-5)
        keywords = dict(steps=run.steps) if run.epochs is None else dict(epochs=run.epochs)
        assert get_noise_multiplier(run, **target) == get_noise_multiplier(
            sample_rate=run.sampling.sampling_prob, **keywords, **target)


@pytest.mark.slow  # ~20 certified evaluations per search
def test_calibrate_steps_and_batch_size_scenarios_equal_keywords():
    target = dict(target_epsilon=1.5, target_delta=1e-5)
    for run in _random_poisson_scenarios(2, 2, max_steps=2000):
        assert calibrate_steps(run, **target) == calibrate_steps(
            noise_multiplier=run.noise_multiplier, sample_rate=run.sampling.sampling_prob, max_steps=run.steps,
            **target)
    # Every batch size (q = 1) is the keyword form's default search; a smaller rate caps it.
    for run, n in ((dpjax.TrainingScenario(1.3, dpjax.Poisson(1.0), steps=300), 5_000),
                   (dpjax.TrainingScenario(0.9, dpjax.Poisson(0.0123), steps=500), 20_000)):
        cap = {} if run.sampling.sampling_prob == 1.0 else dict(max_batch_size=246)
        assert calibrate_batch_size(run, num_examples=n, **target) == calibrate_batch_size(
            noise_multiplier=run.noise_multiplier, num_examples=n, steps=run.steps, **cap, **target)
