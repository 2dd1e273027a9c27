"""``dpjax optimize --amplification b_min_sep``: a banded C optimised under b-min-sep sampling (Dong &
Ganesh, "Privacy Amplification for BandMF via b-Min-Sep Subsampling") on the command line, in
process: the JSON names the scheme, the certified sigma with its certificate (method, samples,
failure probability) and the sampler the training loop must use; the saved file is the loadable
OptimizationResult; bad combinations exit 2 with one line naming the option, before any work.
"""

from __future__ import annotations

import json

import pytest

from dpjax.cli.main import main
from dpjax.optimization import OptimizationResult

BASE = ["optimize", "--amplification", "b_min_sep", "--min-sep", "4", "--sampling-prob", "0.25", "--steps", "16",
        "--epsilon", "2", "--delta", "1e-2", "--optimizer-steps", "3", "--samples", "256", "--certify-samples",
        "16384", "--quiet"]


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out the result would be saved in the current directory


def test_json_names_scheme_certificate_and_sampler(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(BASE + ["--bands", "2", "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["amplification"] == "b_min_sep"
    assert d["sampling"] == {"scheme": "b_min_sep", "min_sep": 4, "sampling_prob": 0.25, "num_rounds": 16,
                             "warm_start": True}
    assert d["parameterization"] == {"family": "banded", "n": 16, "bands": 2}
    assert len(d["first_column"]) == 16 and d["first_column"][0] == 1.0 and d["first_column"][2:] == [0.0] * 14
    cert = d["certificate"]
    assert cert["verified"] and cert["method"] == "bernoulli_kl" and cert["num_samples"] == 16384
    assert cert["delta"] <= 1e-2 and 0 < cert["failure_probability"] < 1e-2 and cert["epsilon"] == 2.0
    assert d["noise_multiplier"] == cert["noise_multiplier"]
    assert d["rmse"] == pytest.approx(d["noise_multiplier"] * d["error"], rel=1e-14)
    assert d["participation_rate"] == pytest.approx(0.25 / (1 + 3 * 0.25), rel=1e-15)
    assert d["training_sampler"].startswith("dpjax.sampling.BMinSepSampler(") and "min_sep=4" in d["training_sampler"]
    saved = OptimizationResult.load(out)
    assert saved.noise_multiplier == d["noise_multiplier"] and saved.sampling == d["sampling"]
    assert len(saved.history) == 3 and not list(tmp_path.glob("r.json.checkpoint.json*"))


@pytest.mark.slow
def test_auto_with_min_sep_and_probability_adds_the_b_min_sep_candidate(capsys):
    """auto: balls-in-bins, cyclic Poisson and, with --min-sep and --sampling-prob, b-min-sep at the
    same n = b E; the smallest certified rmse wins and the output names its training sampler."""
    argv = ["optimize", "--amplification", "auto", "--batches-per-epoch", "4", "--epochs", "4", "--min-sep", "4",
            "--sampling-prob", "0.25", "--epsilon", "2", "--delta", "1e-2", "--optimizer-steps", "3", "--samples",
            "256", "--certify-samples", "16384", "--quiet", "--no-save", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    cands = {c["amplification"]: c for c in d["candidates"]}
    assert set(cands) == {"balls_in_bins", "cyclic_poisson", "b_min_sep"}
    certified = [c for c in cands.values() if c["certified"]]
    assert d["rmse"] == min(c["rmse"] for c in certified)
    assert d["training_sampler"] == cands[d["amplification"]]["training_sampler"]
    assert cands["b_min_sep"]["family"] == {"family": "banded", "n": 16, "bands": 4}
    assert cands["b_min_sep"]["method"] == "bernoulli_kl"
    assert cands["b_min_sep"]["participation_rate"] == pytest.approx(0.25 / 1.75, rel=1e-15)
    assert cands["balls_in_bins"]["participation_rate"] == cands["cyclic_poisson"]["participation_rate"] == 0.25


@pytest.mark.parametrize("extra, words", [
    (["--family", "blt"], ["--family", "banded"]),
    (["--bands", "5"], ["--bands", "[1, 4]"]),
    (["--epochs", "4"], ["--epochs", "does not apply"]),
    (["--certify-method", "importance_betting"], ["--certify-method", "bernoulli_kl"]),
    (["--baselines"], ["--baselines"]),
])
def test_bad_b_min_sep_combinations_exit_2_naming_the_option(capsys, extra, words):
    _exits_2_with_one_line(capsys, BASE + extra, words)


@pytest.mark.parametrize("argv, words", [
    (BASE[:1] + ["--amplification", "b_min_sep", "--sampling-prob", "0.5", "--steps", "8", "--epsilon", "1",
                 "--delta", "1e-2"], ["--min-sep", "required"]),
    (["optimize", "--amplification", "auto", "--min-sep", "4", "--batches-per-epoch", "4", "--epochs", "2",
      "--epsilon", "1", "--delta", "1e-2"], ["--sampling-prob", "auto"]),
    (["optimize", "--min-sep", "4", "--sampling-prob", "0.5", "--batches-per-epoch", "4", "--epochs", "2",
      "--epsilon", "1", "--delta", "1e-2"], ["--min-sep", "balls_in_bins"]),
    (["optimize", "--steps", "8", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "1", "--delta", "1e-2"],
     ["--steps", "b_min_sep"]),
])
def test_b_min_sep_options_elsewhere_exit_2(capsys, argv, words):
    _exits_2_with_one_line(capsys, argv, words)


def _exits_2_with_one_line(capsys, argv, words):
    rc = main(argv + ["--no-save"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert all(w in lines[0] for w in words), lines[0]
