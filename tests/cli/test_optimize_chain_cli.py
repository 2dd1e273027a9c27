"""``dpjax optimize`` under the schemes accounted by a chain (an exact likelihood ratio by a
forward algorithm, for banded C): b-min-sep sampling (Dong & Ganesh, "Privacy Amplification for
BandMF via b-Min-Sep Subsampling"; ``--amplification b_min_sep``) and random allocation (Feldman
& Shenfeld, "Privacy amplification by random allocation": each epoch, each example in a fresh
uniformly random k-subset of the t batches; ``--amplification random_allocation``), on the
command line, in process.

One table of schemes, each run through the same checks: the JSON names the scheme, the certified
sigma with its certificate (method, samples, failure probability) and what the training loop must
use; the saved file is the loadable OptimizationResult; ``auto`` adds the scheme's candidate when
its options are given (slow tier); bad combinations exit 2 with one line naming the option,
before any work.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpjax.cli.main import main
from dpjax.optimization import OptimizationResult

COMMON = ["--epsilon", "2", "--delta", "1e-2", "--optimizer-steps", "3", "--samples", "512", "--certify-samples",
          "16384", "--quiet"]


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One scheme's command line and what its output must say."""

    name: str
    base: list              # `optimize` with the scheme's options (two bands are added by the JSON test)
    sampling: dict          # the result's `sampling` record
    n: int                  # rounds
    participation_rate: float
    sampler_check: object   # predicate on the `training_sampler` text
    auto: list              # options of an `auto` run that adds the scheme's candidate
    auto_n: int
    auto_rate: float


SCHEMES = [
    Scheme(name="b_min_sep",
           base=["optimize", "--amplification", "b_min_sep", "--min-sep", "4", "--sampling-prob", "0.25", "--steps",
                 "16"] + COMMON,
           sampling={"scheme": "b_min_sep", "min_sep": 4, "sampling_prob": 0.25, "num_rounds": 16,
                     "warm_start": True},
           n=16, participation_rate=0.25 / (1 + 3 * 0.25),
           sampler_check=lambda s: s.startswith("dpjax.sampling.BMinSepSampler(") and "min_sep=4" in s,
           auto=["--batches-per-epoch", "4", "--epochs", "4", "--min-sep", "4", "--sampling-prob", "0.25"],
           auto_n=16, auto_rate=0.25 / 1.75),
    Scheme(name="random_allocation",
           base=["optimize", "--amplification", "random_allocation", "--batches-per-epoch", "4", "--epochs", "2",
                 "--selections-per-epoch", "2"] + COMMON,
           sampling={"scheme": "random_allocation", "batches_per_epoch": 4, "selections_per_epoch": 2, "epochs": 2},
           n=8, participation_rate=0.5,
           sampler_check=lambda s: s.startswith("random allocation") and "no batch sampler" in s,
           auto=["--batches-per-epoch", "4", "--epochs", "2", "--selections-per-epoch", "1"],
           auto_n=8, auto_rate=0.25),
]
BY_NAME = {s.name: s for s in SCHEMES}
IDS = [s.name for s in SCHEMES]


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without --out the result would be saved in the current directory


@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_json_names_scheme_certificate_and_sampler(scheme, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(scheme.base + ["--bands", "2", "--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["amplification"] == scheme.name
    assert d["sampling"] == scheme.sampling
    if "batches_per_epoch" in scheme.sampling:
        assert (d["batches_per_epoch"], d["epochs"]) == (4, 2)
    n = scheme.n
    assert d["parameterization"] == {"family": "banded", "n": n, "bands": 2}
    assert len(d["first_column"]) == n and d["first_column"][0] == 1.0 and d["first_column"][2:] == [0.0] * (n - 2)
    cert = d["certificate"]
    assert cert["verified"] and cert["method"] == "bernoulli_kl" and cert["num_samples"] == 16384
    assert cert["delta"] <= 1e-2 and 0 < cert["failure_probability"] < 1e-2 and cert["epsilon"] == 2.0
    assert d["noise_multiplier"] == cert["noise_multiplier"]
    assert d["rmse"] == pytest.approx(d["noise_multiplier"] * d["error"], rel=1e-14)
    assert d["participation_rate"] == pytest.approx(scheme.participation_rate, rel=1e-15)
    assert scheme.sampler_check(d["training_sampler"]), d["training_sampler"]
    saved = OptimizationResult.load(out)
    assert saved.noise_multiplier == d["noise_multiplier"] and saved.sampling == d["sampling"]
    assert len(saved.history) == 3 and not list(tmp_path.glob("r.json.checkpoint.json*"))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES, ids=IDS)
def test_auto_with_the_scheme_options_adds_its_candidate(scheme, capsys):
    """auto: balls-in-bins, cyclic Poisson and, with the scheme's options, the scheme at the same
    n = b E; the smallest certified rmse wins and the output names its training sampler."""
    argv = ["optimize", "--amplification", "auto"] + scheme.auto + COMMON + ["--no-save", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    cands = {c["amplification"]: c for c in d["candidates"]}
    assert set(cands) == {"balls_in_bins", "cyclic_poisson", scheme.name}
    certified = [c for c in cands.values() if c["certified"]]
    assert d["rmse"] == min(c["rmse"] for c in certified)
    assert d["training_sampler"] == cands[d["amplification"]]["training_sampler"]
    assert cands[scheme.name]["family"] == {"family": "banded", "n": scheme.auto_n, "bands": 4}
    assert cands[scheme.name]["method"] == "bernoulli_kl"
    assert cands[scheme.name]["participation_rate"] == pytest.approx(scheme.auto_rate, rel=1e-15)
    if scheme.name == "b_min_sep":
        assert cands["balls_in_bins"]["participation_rate"] == cands["cyclic_poisson"]["participation_rate"] == 0.25


# (scheme, extra options, words the one-line error must contain)
BAD_COMBINATIONS = [
    ("b_min_sep", ["--family", "blt"], ["--family", "banded"]),
    ("b_min_sep", ["--bands", "5"], ["--bands", "[1, 4]"]),
    ("b_min_sep", ["--epochs", "4"], ["--epochs", "does not apply"]),
    ("b_min_sep", ["--certify-method", "importance_betting"], ["--certify-method", "bernoulli_kl"]),
    ("b_min_sep", ["--baselines"], ["--baselines"]),
    ("random_allocation", ["--family", "blt"], ["--family", "banded"]),
    ("random_allocation", ["--bands", "7"], ["--bands", "[1, 6]"]),
    ("random_allocation", ["--selections-per-epoch", "5"], ["--selections-per-epoch", "[1, 4]"]),
    ("random_allocation", ["--certify-method", "importance_betting"], ["--certify-method", "bernoulli_kl"]),
    ("random_allocation", ["--baselines"], ["--baselines"]),
    ("random_allocation", ["--steps", "8"], ["--steps", "b_min_sep"]),
    ("random_allocation", ["--dataset-size", "100", "--batch-size", "30"], ["--dataset-size", "random_allocation"]),
    ("random_allocation", ["--example"], ["--example", "random_allocation"]),
]


@pytest.mark.parametrize("name, extra, words", BAD_COMBINATIONS)
def test_bad_combinations_exit_2_naming_the_option(capsys, name, extra, words):
    _exits_2_with_one_line(capsys, BY_NAME[name].base + extra, words)


# A scheme's options where they do not apply, or missing where they are needed.
MISPLACED_OPTIONS = [
    (["optimize", "--amplification", "b_min_sep", "--sampling-prob", "0.5", "--steps", "8", "--epsilon", "1",
      "--delta", "1e-2"], ["--min-sep", "required"]),
    (["optimize", "--amplification", "auto", "--min-sep", "4", "--batches-per-epoch", "4", "--epochs", "2",
      "--epsilon", "1", "--delta", "1e-2"], ["--sampling-prob", "auto"]),
    (["optimize", "--min-sep", "4", "--sampling-prob", "0.5", "--batches-per-epoch", "4", "--epochs", "2",
      "--epsilon", "1", "--delta", "1e-2"], ["--min-sep", "balls_in_bins"]),
    (["optimize", "--steps", "8", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "1", "--delta", "1e-2"],
     ["--steps", "b_min_sep"]),
    (["optimize", "--selections-per-epoch", "2", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "1",
      "--delta", "1e-2"], ["--selections-per-epoch", "balls_in_bins"]),
]


@pytest.mark.parametrize("argv, words", MISPLACED_OPTIONS)
def test_scheme_options_elsewhere_exit_2(capsys, argv, words):
    _exits_2_with_one_line(capsys, argv, words)


def _exits_2_with_one_line(capsys, argv, words):
    rc = main(argv + ["--no-save"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert all(w in lines[0] for w in words), lines[0]
