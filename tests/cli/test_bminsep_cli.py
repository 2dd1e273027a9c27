"""``dpjax mc-calibrate --sampling b_min_sep``: the b-min-sep Monte Carlo calibration (Dong & Ganesh,
"Privacy Amplification for BandMF via b-Min-Sep Subsampling") on the command line, in process.

The JSON is that of the balls-in-bins mc-calibrate (noise_multiplier, delta_estimate,
standard_error, num_samples; with --certify the certificate's method, num_samples and
failure_probability) plus the sampling setting.  The numbers are the library's
(BMinSep.calibrate / certify_noise with the same seed), compared exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpjax.cli.main import main
from dpjax.montecarlo import BMinSep

BASE = ["mc-calibrate", "--sampling", "b_min_sep", "--min-sep", "3", "--sampling-prob", "0.25", "--steps", "16",
        "--epsilon", "1.5"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_json_matches_the_library(capsys):
    out = _json(capsys, BASE + ["--banded", "1,0.6", "--delta", "0.02", "--samples", "4096", "--seed", "3",
                                "--json"])
    sigma = BMinSep(np.array([1.0, 0.6]), 0.25, 3, 16).calibrate(1.5, 0.02, 4096, key=3)
    assert out["noise_multiplier"] == sigma
    assert out["num_samples"] == 4096 and out["seed"] == 3
    assert out["delta_estimate"] <= 0.02 and out["delta_estimate"] == pytest.approx(0.02, rel=1e-9)
    assert 0 < out["standard_error"] < 0.02
    assert out["sampling"] == "b_min_sep" and out["min_sep"] == 3 and out["banded"] == [1.0, 0.6]
    assert "estimate" in out["guarantee"]


def test_certify_json_reports_method_samples_failure_probability(capsys):
    # Poisson (min_sep = 1), the configuration of the certificate tests of the library.
    out = _json(capsys, ["mc-calibrate", "--sampling", "b_min_sep", "--min-sep", "1", "--sampling-prob", "0.2",
                         "--steps", "8", "--epsilon", "1", "--delta", "0.05", "--certify", "--certify-samples",
                         "8192", "--seed", "4", "--json"])
    cert = out["certificate"]
    assert cert["method"] == "bernoulli_kl" and cert["num_samples"] == 8192
    assert 0 < cert["failure_probability"] < 0.05 and cert["verified"]
    assert cert["delta"] <= 0.05
    assert out["noise_multiplier"] == cert["noise_multiplier"]
    ref = BMinSep(np.ones(1), 0.2, 1, 8).certify_noise(1.0, 0.05, 4, num_samples=8192)
    assert out["noise_multiplier"] == ref.noise_multiplier


def _exits_2_with_one_line(capsys, argv, words):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("extra,words", [
    (["--min-sep", "0"], ["--min-sep", "[1, 1048576]"]),
    (["--sampling-prob", "1.5"], ["--sampling-prob", "(0, 1]"]),
    (["--sampling-prob", "nan"], ["--sampling-prob", "(0, 1]"]),
    (["--banded", "1,0.5,0.2,0.1"], ["--banded", "min_sep = 3"]),
    (["--banded", "1,-0.5"], ["--banded"]),
    (["--toeplitz", "1,0.5"], ["--toeplitz", "b_min_sep"]),
    (["--batches-per-epoch", "4"], ["--batches-per-epoch", "b_min_sep"]),
    (["--certify", "--certify-method", "importance_betting"], ["--certify-method", "bernoulli_kl"]),
])
def test_bad_input_exits_2_with_one_line(capsys, extra, words):
    _exits_2_with_one_line(capsys, BASE + ["--delta", "0.02", "--samples", "1024"] + extra, words)


@pytest.mark.parametrize("argv,words", [
    (["mc-calibrate", "--sampling", "b_min_sep", "--sampling-prob", "0.2", "--steps", "8", "--epsilon", "1",
      "--delta", "0.1"], ["--min-sep", "required"]),
    (["mc-calibrate", "--batches-per-epoch", "4", "--epochs", "2", "--min-sep", "2", "--epsilon", "1",
      "--delta", "0.1"], ["--min-sep", "b_min_sep only"]),
    (["mc-calibrate", "--batches-per-epoch", "4", "--epsilon", "1", "--delta", "0.1"], ["--epochs", "required"]),
])
def test_options_of_the_other_scheme_exit_2(capsys, argv, words):
    _exits_2_with_one_line(capsys, argv, words)
