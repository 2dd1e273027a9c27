"""The running random-allocation accountant built from a training scenario."""

from __future__ import annotations

import pytest

import dpjax
from dpjax.interop import RunningAllocationAccountant


@pytest.mark.parametrize("scheme", [dpjax.RandomAllocation(12, 2), dpjax.BallsInBins(12)],
                         ids=["random_allocation", "balls_in_bins"])
def test_from_scenario_is_the_scenario_call(scheme):
    run = dpjax.TrainingScenario(1.3, scheme, epochs=3)
    acc = RunningAllocationAccountant.from_scenario(run)
    assert acc.epochs == 3 and acc.history == [(1.3, 3)]
    assert acc.get_epsilon(1e-5) == dpjax.dpsgd_epsilon(run, 1e-5)
    assert acc.get_delta(2.0) == dpjax.dpsgd_delta(run, 2.0)
    # Later epochs are recorded as usual: one more epoch is the four-epoch scenario.
    acc.epoch(noise_multiplier=1.3)
    assert acc.get_epsilon(1e-5) == dpjax.dpsgd_epsilon(run.replace(epochs=4), 1e-5)


@pytest.mark.parametrize("run, match", [
    (dpjax.TrainingScenario(1.0, dpjax.Poisson(0.1), steps=10), "accounts RandomAllocation and BallsInBins"),
    (dpjax.TrainingScenario(1.0, dpjax.FixedBatch(10, 100), steps=10), "got FixedBatch"),
    (dpjax.TrainingScenario(None, dpjax.BallsInBins(4), epochs=1), "noise_multiplier"),
    ("not a scenario", "dpjax.TrainingScenario"),
])
def test_from_scenario_refusals(run, match):
    with pytest.raises(ValueError, match=match):
        RunningAllocationAccountant.from_scenario(run)
