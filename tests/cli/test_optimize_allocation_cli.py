"""``dpjax optimize --amplification random_allocation``: a banded C optimised under random
allocation (Feldman & Shenfeld, "Privacy amplification by random allocation": each epoch, each
example in a fresh uniformly random k-subset of the t batches) on the command line, in process:
the JSON names the scheme, the certified sigma with its certificate (method, samples, failure
probability) and the batches the training loop must draw (dpjax has no sampler for them); the
saved file is the loadable OptimizationResult; bad combinations exit 2 with one line naming the
option, before any work.
"""

from __future__ import annotations

import json

import pytest

from dpjax.cli.main import main
from dpjax.optimization import OptimizationResult

BASE = ["optimize", "--amplification", "random_allocation", "--batches-per-epoch", "4", "--epochs", "2",
        "--epsilon", "2", "--delta", "1e-2", "--optimizer-steps", "3", "--samples", "256", "--certify-samples",
        "16384", "--quiet"]


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out the result would be saved in the current directory


def test_json_names_scheme_certificate_and_batches(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(BASE + ["--selections-per-epoch", "2", "--bands", "2", "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["amplification"] == "random_allocation"
    assert d["sampling"] == {"scheme": "random_allocation", "batches_per_epoch": 4, "selections_per_epoch": 2,
                             "epochs": 2}
    assert (d["batches_per_epoch"], d["epochs"]) == (4, 2)
    assert d["parameterization"] == {"family": "banded", "n": 8, "bands": 2}
    assert len(d["first_column"]) == 8 and d["first_column"][0] == 1.0 and d["first_column"][2:] == [0.0] * 6
    cert = d["certificate"]
    assert cert["verified"] and cert["method"] == "bernoulli_kl" and cert["num_samples"] == 16384
    assert cert["delta"] <= 1e-2 and 0 < cert["failure_probability"] < 1e-2 and cert["epsilon"] == 2.0
    assert d["noise_multiplier"] == cert["noise_multiplier"]
    assert d["rmse"] == pytest.approx(d["noise_multiplier"] * d["error"], rel=1e-14)
    assert d["participation_rate"] == 0.5
    assert d["training_sampler"].startswith("random allocation") and "no batch sampler" in d["training_sampler"]
    saved = OptimizationResult.load(out)
    assert saved.noise_multiplier == d["noise_multiplier"] and saved.sampling == d["sampling"]
    assert len(saved.history) == 3 and not list(tmp_path.glob("r.json.checkpoint.json*"))


@pytest.mark.slow
def test_auto_with_selections_adds_the_random_allocation_candidate(capsys):
    """auto: balls-in-bins, cyclic Poisson and, with --selections-per-epoch, random allocation at
    the same n = b E; the smallest certified rmse wins and the output names its training sampler."""
    argv = ["optimize", "--amplification", "auto", "--batches-per-epoch", "4", "--epochs", "2",
            "--selections-per-epoch", "1", "--epsilon", "2", "--delta", "1e-2", "--optimizer-steps", "3", "--samples",
            "256", "--certify-samples", "16384", "--quiet", "--no-save", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    cands = {c["amplification"]: c for c in d["candidates"]}
    assert set(cands) == {"balls_in_bins", "cyclic_poisson", "random_allocation"}
    certified = [c for c in cands.values() if c["certified"]]
    assert d["rmse"] == min(c["rmse"] for c in certified)
    assert d["training_sampler"] == cands[d["amplification"]]["training_sampler"]
    assert cands["random_allocation"]["family"] == {"family": "banded", "n": 8, "bands": 4}
    assert cands["random_allocation"]["method"] == "bernoulli_kl"
    assert cands["random_allocation"]["participation_rate"] == 0.25


@pytest.mark.parametrize("extra, words", [
    (["--family", "blt"], ["--family", "banded"]),
    (["--bands", "7"], ["--bands", "[1, 6]"]),
    (["--selections-per-epoch", "5"], ["--selections-per-epoch", "[1, 4]"]),
    (["--certify-method", "importance_betting"], ["--certify-method", "bernoulli_kl"]),
    (["--baselines"], ["--baselines"]),
    (["--steps", "8"], ["--steps", "b_min_sep"]),
    (["--dataset-size", "100", "--batch-size", "30"], ["--dataset-size", "random_allocation"]),
    (["--example"], ["--example", "random_allocation"]),
])
def test_bad_random_allocation_combinations_exit_2_naming_the_option(capsys, extra, words):
    _exits_2_with_one_line(capsys, BASE + extra, words)


def test_selections_elsewhere_exit_2(capsys):
    argv = ["optimize", "--selections-per-epoch", "2", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "1",
            "--delta", "1e-2"]
    _exits_2_with_one_line(capsys, argv, ["--selections-per-epoch", "balls_in_bins"])


def _exits_2_with_one_line(capsys, argv, words):
    rc = main(argv + ["--no-save"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert all(w in lines[0] for w in words), lines[0]
