"""Every public path that accounts a DP-SGD run, against one table of reference scenarios
(``tests/helpers.py``): the same value from each spelling, never below what is known of the
truth, and within the accountant's stated accuracy of it."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

import dpjax
from dpjax.cli.main import main
from dpjax.interop.opacus import RunningAccountant
from dpjax.pld.sweeps.config import SWEEP_SLACK
from helpers import TIGHT_RELATIVE, reference_rows

ROWS = reference_rows()


def _per_epoch(run) -> bool:
    return isinstance(run.sampling, (dpjax.RandomAllocation, dpjax.BallsInBins))


def _cli_epsilon(run, delta, tmp_path) -> float:
    path = tmp_path / "run.json"
    run.to_json(str(path))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["epsilon", "--scenario", str(path), "--delta", repr(delta), "--json"])
    assert rc == 0
    return json.loads(buf.getvalue())["epsilon"]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_path_gives_the_call(row, tmp_path):
    run, delta = row.scenario, row.target_delta
    eps = dpjax.dpsgd_epsilon(run, delta)
    # The keyword spelling, the report and the command line are the same call.
    assert dpjax.dpsgd_epsilon(**run.keywords(), target_delta=delta) == eps
    assert dpjax.dpsgd_privacy_report(run, target_delta=(delta,)).epsilon[0] == eps
    assert _cli_epsilon(run, delta, tmp_path) == eps
    if isinstance(run.sampling, dpjax.Poisson) and run.group_size == 1:
        # dpjax.pld's example-level accountant and the Opacus-style running accountant.
        assert dpjax.pld.dpsgd_epsilon(run, delta) == eps
        assert dpjax.pld.dpsgd_accounting(run.noise_multiplier, run.sampling.sampling_prob, run.steps,
                                          target_delta=delta).epsilon == eps
        running = RunningAccountant().step(run).get_epsilon(delta)
        assert running >= eps * (1 - 1e-3) and running <= eps * (1 + 1e-3)
    if isinstance(run.sampling, dpjax.Poisson) and run.group_size == 1 or _per_epoch(run):
        # A curve and a sweep plan grids of their own: within their stated slack of the call.
        curve = dpjax.epsilon_curve(run, delta)
        assert curve.epsilon[-1] == pytest.approx(eps, rel=1e-3)
        swept = dpjax.sweep([run], delta=delta, progress=False).rows[0]["epsilon"]
        assert swept == pytest.approx(eps, rel=SWEEP_SLACK, abs=1e-12)
    # The delta query agrees: a grid accuracy (1e-3 of epsilon) above the certified epsilon, the
    # certified delta is within the target.
    assert dpjax.dpsgd_delta(run, eps * (1 + 1e-3)) <= delta


@pytest.mark.parametrize("row", [r for r in ROWS if {r.exact, r.lower, r.upper, r.estimate} != {None}], ids=lambda r: r.name)
def test_never_below_the_truth_and_tight(row):
    eps = dpjax.dpsgd_epsilon(row.scenario, row.target_delta)
    if row.exact is not None:
        assert eps >= row.exact * (1 - 1e-12)
        assert eps <= row.exact * (1 + 1e-3)         # the accountant's stated accuracy
    if row.lower is not None:
        assert eps >= row.lower * (1 - 1e-12), (eps, row.lower)
    if row.upper is not None:
        assert eps <= row.upper * (1 + TIGHT_RELATIVE), (eps, row.upper)
    if row.estimate is not None:
        assert abs(eps / row.estimate - 1) <= TIGHT_RELATIVE, (eps, row.estimate)


@pytest.mark.parametrize("row", [r for r in ROWS if r.name in ("gaussian_q1", "poisson_b1", "fixed_batch",
                                                              "random_allocation")], ids=lambda r: r.name)
def test_calibration_returns_the_noise(row):
    """The noise multiplier calibrated at the scenario's certified epsilon is its own noise
    multiplier, to the calibration's stated precision (1e-4 relative above the smallest feasible
    one; the certified curve's discretization moves it by up to about 1e-3)."""
    run, delta = row.scenario, row.target_delta
    eps = dpjax.dpsgd_epsilon(run, delta)
    sigma = dpjax.dpsgd_noise_multiplier(run.replace(noise_multiplier=None), eps, delta)
    assert sigma == pytest.approx(run.noise_multiplier, rel=2e-3)
    assert dpjax.dpsgd_epsilon(run.replace(noise_multiplier=sigma), delta) <= eps


def test_group_of_one_is_the_example_and_groups_cost_more():
    group = next(r for r in ROWS if r.name == "poisson_group")
    assert group.scenario.group_size == 4
    run, delta = group.scenario, group.target_delta
    one = dpjax.dpsgd_epsilon(run.replace(group_size=1), delta)
    assert one == dpjax.dpsgd_epsilon(run.noise_multiplier, run.sampling.sampling_prob, run.steps, delta)
    assert dpjax.dpsgd_epsilon(run, delta) > one
    steps = np.array([100, 300])
    assert list(dpjax.dpsgd_epsilon(run.noise_multiplier, run.sampling.sampling_prob, steps, delta,
                                    group_size=4)) == [dpjax.dpsgd_epsilon(run.replace(steps=int(t)), delta)
                                                       for t in steps]
