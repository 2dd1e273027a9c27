"""Monte Carlo epsilon never comes as a bare number: the CLI's
``mc-epsilon`` JSON carries the confidence interval and the sample count, and
``BallsInBins.epsilon(..., with_interval=True)`` returns the :class:`EpsilonEstimate`."""

from __future__ import annotations

import json

import numpy as np

from dpjax.cli.main import main
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins, EpsilonEstimate

MC = ["--batches-per-epoch", "2", "--epochs", "1", "--toeplitz", "1,0.5"]


def test_cli_mc_epsilon_reports_interval_and_samples(capsys):
    assert main(["mc-epsilon", *MC, "--noise-multiplier", "1", "--delta", "0.1", "--samples", "2048",
                 "--confidence", "0.9", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_samples"] == 2048 and out["confidence"] == 0.9 and out["resolved"] is True
    assert 0.0 <= out["epsilon_lower"] <= out["epsilon"] <= out["epsilon_upper"] < float("inf")
    assert "interval" in out["note"]


def test_cli_mc_epsilon_unresolvable_delta_is_flagged(capsys):
    # delta far below 1 / samples: no finite upper end, flagged as unresolved (no silent number).
    # (The other tests' sample count: the same compiled programs.)
    assert main(["mc-epsilon", *MC, "--noise-multiplier", "1", "--delta", "1e-9", "--samples", "2048",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resolved"] is False and out["num_samples"] == 2048
    assert "cannot resolve" in out["reason"]


def test_epsilon_with_interval_matches_epsilon_estimate():
    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 2, 1)
    a = acc.epsilon(1.0, 0.1, 2048, 3, with_interval=True)
    b = acc.epsilon_estimate(1.0, 0.1, 2048, 3)
    assert isinstance(a, EpsilonEstimate) and a == b
    assert isinstance(acc.epsilon(1.0, 0.1, 2048, 3), float)   # the old float return is kept
