"""The training-scenario record (``dpjax.pld.scenario``): every entry point taking it gives the
keyword call's value bit for bit, epochs resolve by the one rule, and bad records are refused
when made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dpjax
from dpjax import BallsInBins, FixedBatch, Poisson, RandomAllocation, TrainingScenario
from dpjax._base.names import epochs_to_steps


def _scenarios(n: int, seed: int) -> list[TrainingScenario]:
    """Random scenarios of every scheme, small enough for the default tier."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sigma = float(rng.uniform(0.8, 3.0))
        kind = i % 4
        if kind == 0:
            q = float(10 ** rng.uniform(-3, -1))
            by_epochs = bool(rng.integers(2))
            out.append(TrainingScenario(sigma, Poisson(q), epochs=float(rng.integers(1, 4)) if by_epochs else None,
                                        steps=None if by_epochs else int(rng.integers(10, 2000)),
                                        group_size=int(rng.choice([1, 1, 2]))))
        elif kind == 1:
            n_data = int(rng.integers(1000, 100000))
            b = int(rng.integers(1, n_data // 50))
            out.append(TrainingScenario(sigma, FixedBatch(b, n_data), steps=int(rng.integers(10, 1000)),
                                        group_size=int(rng.choice([1, 2]))))
        elif kind == 2:
            t = int(rng.integers(2, 40))
            out.append(TrainingScenario(sigma, RandomAllocation(t, int(rng.integers(1, min(t, 3) + 1))),
                                        epochs=int(rng.integers(1, 4))))
        else:
            t = int(rng.integers(2, 40))
            out.append(TrainingScenario(sigma, BallsInBins(t), steps=t * int(rng.integers(1, 4))))
    return out


def _keyword_call(fn, scenario, **targets):
    return fn(**scenario.keywords(), **targets)


@pytest.mark.parametrize("scenario", _scenarios(12, seed=3), ids=lambda s: type(s.sampling).__name__)
def test_epsilon_and_delta_equal_the_keyword_calls(scenario):
    assert dpjax.dpsgd_epsilon(scenario, 1e-6) == _keyword_call(dpjax.dpsgd_epsilon, scenario, target_delta=1e-6)
    assert dpjax.dpsgd_delta(scenario, target_epsilon=1.5) == _keyword_call(dpjax.dpsgd_delta, scenario,
                                                                             target_epsilon=1.5)


def test_keywords_spell_the_scheme_as_the_keyword_functions_do():
    """The keywords are those a user writes for each scheme (so the equality above compares the
    record against the documented keyword usage, not against itself)."""
    assert TrainingScenario(1.0, Poisson(0.07), epochs=7).keywords() == dict(
        sampling_prob=0.07, steps=100, noise_multiplier=1.0)
    assert TrainingScenario(1.0, FixedBatch(70, 1000), steps=20, group_size=2).keywords() == dict(
        sampling=FixedBatch(70, 1000), steps=20, group_size=2, noise_multiplier=1.0)
    assert TrainingScenario(2.0, RandomAllocation(100, 2), epochs=3).keywords() == dict(
        sampling=RandomAllocation(100, 2), epochs=3, noise_multiplier=2.0)
    assert TrainingScenario(2.0, BallsInBins(50), steps=100).keywords() == dict(
        sampling=BallsInBins(50), epochs=2, noise_multiplier=2.0)
    # The case that motivated the one rule: 7 epochs at 0.07 are 100 steps, not int(7 / 0.07) = 99.
    assert dpjax.dpsgd_epsilon(TrainingScenario(1.0, Poisson(0.07), epochs=7), 1e-5) == \
        dpjax.dpsgd_epsilon(1.0, 0.07, 100, 1e-5)


def test_noise_multiplier_report_and_schedule_through_the_record():
    run = TrainingScenario(None, Poisson(0.07), epochs=7)
    assert dpjax.dpsgd_noise_multiplier(run, 2.0, 1e-5) == dpjax.dpsgd_noise_multiplier(0.07, 100, 2.0, 1e-5)
    fixed = TrainingScenario(None, FixedBatch(70, 1000), epochs=7)
    assert fixed.steps == 100
    assert dpjax.dpsgd_noise_multiplier(fixed, target_epsilon=2.0, target_delta=1e-5) == \
        dpjax.dpsgd_noise_multiplier(None, 100, 2.0, 1e-5, sampling=dpjax.FixedBatch(70, 1000))
    report = dpjax.dpsgd_privacy_report(run.replace(noise_multiplier=1.2), target_delta=(1e-5, 1e-7))
    expect = dpjax.dpsgd_privacy_report(1.2, 0.07, 100, target_delta=(1e-5, 1e-7))
    np.testing.assert_array_equal(report.epsilon, expect.epsilon)
    schedule = np.linspace(1.0, 1.5, 50)
    run = TrainingScenario(schedule, Poisson(0.01))
    assert run.steps == 50
    assert dpjax.dpsgd_epsilon(run, 1e-5) == dpjax.dpsgd_epsilon(None, 0.01, 50, 1e-5, noise_schedule=schedule)


def test_epochs_resolve_by_the_one_rule():
    rng = np.random.default_rng(11)
    for _ in range(1000):
        q = round(float(10 ** rng.uniform(-4, 0)), int(rng.integers(2, 6)))
        q = min(max(q, 1e-4), 1.0)
        epochs = round(float(rng.uniform(0.1, 50)), int(rng.integers(0, 3))) or 1.0
        assert TrainingScenario(1.0, Poisson(q), epochs=epochs).steps == epochs_to_steps(epochs, q)
    assert TrainingScenario(1.0, FixedBatch(256, 60000), epochs=30).steps == epochs_to_steps(30, 256 / 60000)
    assert TrainingScenario(1.0, RandomAllocation(100), epochs=3).steps == 300
    assert TrainingScenario(1.0, BallsInBins(7), epochs=2).steps == 14


def test_replace_resolves_the_steps_again():
    run = TrainingScenario(1.0, Poisson(0.07), epochs=7)
    assert run.replace(sampling=Poisson(0.05)).steps == 140
    assert run.replace(steps=10).epochs is None and run.replace(steps=10).steps == 10
    assert run.replace(epochs=1).steps == epochs_to_steps(1, 0.07)
    assert run.replace(noise_multiplier=2.0).noise_multiplier == 2.0
    assert run.adjacency == "add_or_remove"
    assert TrainingScenario(1.0, FixedBatch(10, 100), steps=5).adjacency == "replace"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.steps = 3


@pytest.mark.parametrize("make, match", [
    (lambda: TrainingScenario(1.0, Poisson(0.0), steps=1), "sampling_prob"),
    (lambda: TrainingScenario(1.0, Poisson(1.5), steps=1), "sampling_prob"),
    (lambda: TrainingScenario(-1.0, Poisson(0.1), steps=1), "noise_multiplier"),
    (lambda: TrainingScenario(float("nan"), Poisson(0.1), steps=1), "noise_multiplier"),
    (lambda: TrainingScenario(1.0, Poisson(0.1)), "steps or epochs"),
    (lambda: TrainingScenario(1.0, Poisson(0.1), steps=1, epochs=1), "steps or epochs"),
    (lambda: TrainingScenario(1.0, Poisson(0.1), epochs=float("inf")), "epochs"),
    (lambda: TrainingScenario(1.0, "poisson", steps=1), "sampling must be"),
    (lambda: TrainingScenario(1.0, RandomAllocation(10), steps=15), "multiple of batches_per_epoch"),
    (lambda: TrainingScenario(1.0, RandomAllocation(10), epochs=1.5), "epochs"),
    (lambda: TrainingScenario(1.0, RandomAllocation(10, 11), epochs=1), "selections_per_epoch"),
    (lambda: TrainingScenario(1.0, BallsInBins(10), steps=10, group_size=2), "group_size"),
    (lambda: TrainingScenario(1.0, Poisson(0.1), steps=10, group_size=0), "group_size"),
    (lambda: TrainingScenario(np.ones(5), Poisson(0.1), steps=4), "schedule"),
    (lambda: TrainingScenario(np.ones(5), BallsInBins(5), steps=5), "schedule"),
    (lambda: FixedBatch(10, 5), "batch_size"),
    (lambda: dpjax.dpsgd_epsilon(TrainingScenario(1.0, Poisson(0.1), steps=3), 1e-5, steps=5), "steps given"),
    (lambda: dpjax.dpsgd_epsilon(TrainingScenario(1.0, Poisson(0.1), steps=3), 1e-5, target_delta=1e-6), "twice"),
    (lambda: dpjax.dpsgd_epsilon(TrainingScenario(None, Poisson(0.1), steps=3), 1e-5), "noise_multiplier"),
    (lambda: dpjax.dpsgd_noise_multiplier(TrainingScenario(1.0, Poisson(0.1), steps=3), 2.0, 1e-5), "None"),
    (lambda: dpjax.dpsgd_privacy_report(TrainingScenario(np.ones(3), Poisson(0.1))), "noise_schedule"),
])
def test_bad_records_and_calls_are_refused_with_the_reason(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_epsilon_curve_through_the_record():
    run = TrainingScenario(1.0, Poisson(0.01), steps=1000)
    np.testing.assert_array_equal(dpjax.epsilon_curve(run, 1e-5, steps=[10, 100, 1000]).epsilon,
                                  dpjax.epsilon_curve(1.0, 0.01, [10, 100, 1000], 1e-5).epsilon)
    assert dpjax.epsilon_curve(run, 1e-5).epsilon[0] == dpjax.epsilon_curve(1.0, 0.01, [1000], 1e-5).epsilon[0]
    per_epoch = TrainingScenario(2.0, RandomAllocation(20), epochs=3)
    got = dpjax.epsilon_curve(per_epoch, 1e-5)
    np.testing.assert_array_equal(got.steps, [20, 40, 60])
    np.testing.assert_array_equal(got.epsilon, dpjax.epsilon_curve(2.0, target_delta=1e-5, sampling=dpjax.RandomAllocation(20), epochs=3).epsilon)
    with pytest.raises(ValueError, match="group_size"):
        dpjax.epsilon_curve(run.replace(group_size=2), 1e-5)


@pytest.mark.parametrize("run", [
    TrainingScenario(1.0, Poisson(0.07), epochs=7),
    TrainingScenario(None, FixedBatch(70, 1000), steps=20, group_size=2),
    TrainingScenario(2.0, RandomAllocation(100, 2), epochs=3),
    TrainingScenario(2.0, BallsInBins(10), steps=30),
    TrainingScenario(np.linspace(1.0, 2.0, 5), Poisson(0.1)),
], ids=["poisson-epochs", "fixed-batch", "random-allocation", "balls-in-bins", "schedule"])
def test_saved_and_loaded(run, tmp_path):
    path = tmp_path / "run.json"
    run.to_json(path)
    assert TrainingScenario.load(path) == run
    assert TrainingScenario.from_dict(run.to_dict()).keywords().keys() == run.keywords().keys()


def test_edited_files_are_refused():
    data = TrainingScenario(1.0, Poisson(0.07), epochs=7).to_dict()
    with pytest.raises(ValueError, match="does not match"):
        TrainingScenario.from_dict({**data, "steps": 99})
    with pytest.raises(ValueError, match="scheme"):
        TrainingScenario.from_dict({**data, "sampling": {"scheme": "shuffle", "sampling_prob": 0.1}})
    with pytest.raises(ValueError, match="format"):
        TrainingScenario.from_dict({k: v for k, v in data.items() if k != "format"})
    with pytest.raises(ValueError, match="unknown"):
        TrainingScenario.from_dict({**data, "adjacency": "replace"})
    with pytest.raises(ValueError, match="sampling fields"):
        TrainingScenario.from_dict({**data, "sampling": {"scheme": "poisson", "q": 0.1}})
    with pytest.raises(ValueError, match="required"):
        TrainingScenario.from_dict({**data, "sampling": {"scheme": "poisson"}})


def test_sweep_of_scenarios_equals_the_keyword_sweep_and_single_calls():
    runs = [TrainingScenario(s, Poisson(0.01), steps=t) for s in (1.0, 2.0) for t in (100, 1000)]
    got = dpjax.sweep(runs, delta=1e-5, progress=False)
    grid = dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[1.0, 2.0], sampling_prob=[0.01], steps=[100, 1000], delta=[1e-5]), progress=False)
    assert [r["epsilon"] for r in got.rows] == [r["epsilon"] for r in grid.rows]
    per_epoch = [TrainingScenario(2.0, RandomAllocation(20), epochs=e) for e in (1, 2)]
    rows = dpjax.sweep(per_epoch, delta=[1e-5, 1e-6], progress=False).rows
    assert [r["epsilon"] for r in rows] == [dpjax.dpsgd_epsilon(per_epoch[0], 1e-5),
                                            dpjax.dpsgd_epsilon(per_epoch[1], 1e-6)]
    with pytest.raises(ValueError, match="exactly one of delta and epsilon"):
        dpjax.sweep(runs)
    with pytest.raises(ValueError, match="state their own"):
        dpjax.sweep(dpjax.sweep_grid(1.0, 0.01, 100, delta=1e-5), delta=1e-5)
    with pytest.raises(ValueError, match="one sampling scheme"):
        dpjax.sweep(runs + per_epoch, delta=1e-5)
    with pytest.raises(ValueError, match="FixedBatch"):
        dpjax.sweep([TrainingScenario(1.0, FixedBatch(10, 100), steps=5)], delta=1e-5)


def test_keyword_fixed_batch_epochs_use_the_batch_fraction():
    """The keyword functions resolve ``epochs=`` of a fixed-batch run at ``q = B / N`` as the
    record does (they used to ask for ``sampling_prob`` although ``B / N`` fixes it)."""
    run = TrainingScenario(1.0, FixedBatch(70, 1000), epochs=7)
    kw = dict(sampling=FixedBatch(70, 1000), epochs=7)
    assert dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, **kw) == dpjax.dpsgd_epsilon(run, 1e-5)
    assert dpjax.dpsgd_delta(1.0, target_epsilon=2.0, **kw) == dpjax.dpsgd_delta(run, 2.0)
    assert dpjax.dpsgd_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, **kw) == \
        dpjax.dpsgd_noise_multiplier(run.replace(noise_multiplier=None), 2.0, 1e-5)
    assert dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, **kw) == dpjax.dpsgd_epsilon(1.0, None, 100, 1e-5, sampling=dpjax.FixedBatch(70, 1000))
