"""``dpjax noise`` and ``dpjax mc-calibrate``: JSON output and bad-input exit codes."""

from __future__ import annotations

import json

import pytest

from dpjax.cli.main import main


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow  # 20-45 s on 2 cores; moved to the slow tier to keep the default suite near 10 min
def test_noise_json_matches_reference(capsys, reference_cases):
    out = _json(capsys, ["noise", "--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01",
                         "--steps", "1000", "--json"])
    # family F (dp_accounting, 1e-5 grid): tolerance as in test_calibration_pld (2e-4).
    assert out["noise_multiplier"] == pytest.approx(reference_cases["F_q0.01_T1000_eps2"]["value"], rel=2e-4)


def test_mc_calibrate_json_reports_estimate_and_samples(capsys):
    out = _json(capsys, ["mc-calibrate", "--toeplitz", "1,0.5", "--batches-per-epoch", "8",
                         "--epochs", "2", "--epsilon", "2", "--delta", "1e-3", "--samples", "8192",
                         "--json"])
    assert out["num_samples"] == 8192
    # The estimate at the calibrated sigma is the target (to the 1e-14 bracket).
    assert out["delta_estimate"] == pytest.approx(1e-3, rel=1e-9)
    assert out["delta_estimate"] <= 1e-3
    assert 0 < out["standard_error"] < 1e-3


@pytest.mark.parametrize("argv", [
    ["noise", "--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "1000",
     "--group-size", "0"],
    ["noise", "--epsilon", "2", "--delta", "1e-5", "--steps", "1000"],
    ["noise", "--epsilon", "-1", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "1000"],
    # (mc-calibrate with num_samples < 1/delta is no longer refused: an estimate may use any
    # sample count; only certification demands enough.)
    ["mc-calibrate", "--batches-per-epoch", "8", "--epochs", "2", "--epsilon", "2", "--delta",
     "1e-6", "--samples", "0"],
])
def test_bad_input_exits_2(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and "\n" == err[-1] and err.count("\n") == 1
