"""``dpjax optimize``: the JSON keys, bad input exits 2 with one line and writes nothing, and the
text a practitioner reads: the certified sigma to train with, the certificate in one sentence,
the file the result was saved in (a default name that never replaces a file)."""

from __future__ import annotations

import json
import os
import re

import pytest

from dpjax.cli.main import main


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    # Without --out the result is saved in the current directory: keep it out of the checkout.
    monkeypatch.chdir(tmp_path)

BASE = ["optimize", "--family", "blt", "--buffers", "2", "--batches-per-epoch", "4", "--epochs", "2",
        "--epsilon", "2", "--delta", "1e-3", "--optimizer-steps", "3", "--samples", "256",
        "--certify-samples", "65536", "--quiet"]


def test_optimize_json_has_the_documented_keys(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(BASE + ["--json", "--out", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["first_column"]) == 8 and d["first_column"][0] == 1.0
    cert = d["certificate"]
    assert cert["verified"] and cert["delta"] <= 1e-3 and cert["num_samples"] == 65536
    assert 0 < cert["failure_probability"] < 1e-3 and cert["epsilon"] == 2.0
    assert d["noise_multiplier"] == cert["noise_multiplier"]
    assert d["rmse"] == pytest.approx(d["noise_multiplier"] * d["error"], rel=1e-14)
    saved = json.loads(out.read_text())
    assert saved["noise_multiplier"] == d["noise_multiplier"] and len(saved["history"]) == 3
    # The completed run is in r.json: its checkpoint (and any screen-state sidecar) is gone.
    assert not list(tmp_path.glob("r.json.checkpoint.json*"))


@pytest.mark.parametrize("extra,match", [
    (["--epochs", "0"], "--epochs"),
    # The Bernoulli-KL certificate's minimum sample count is checked before anything runs.
    (["--delta", "1e-9", "--certify-method", "bernoulli_kl"], "--certify-samples >= "),
    (["--family", "toeplitz"], "--buffers"),
    (["--epsilon", "-1"], "--epsilon"),
    (["--samples", "0"], "--samples"),
])
def test_bad_input_exits_2_one_line(tmp_path, capsys, extra, match):
    out = tmp_path / "r.json"
    assert main(BASE + extra + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1
    assert not out.exists() and not (tmp_path / "r.json.checkpoint.json").exists()


def test_example_fills_only_what_the_user_left_unset():
    """``--example`` (the README's first command) is the built-in problem; explicit flags win."""
    import argparse

    from dpjax.cli.optimize import EXAMPLE, apply_example

    keys = ("family", "buffers", "batches_per_epoch", "epochs", "epsilon", "delta", "optimizer_steps", "samples")
    args = argparse.Namespace(example=True, **{k: None for k in keys})
    args.optimizer_steps = 7
    apply_example(args)
    assert args.optimizer_steps == 7 and all(getattr(args, k) == EXAMPLE[k] for k in keys if k != "optimizer_steps")
    assert EXAMPLE["batches_per_epoch"] * EXAMPLE["epochs"] <= 64  # "small problems" finish fast


def test_missing_required_option_without_example_exits_2_one_line(capsys):
    assert main(["optimize", "--batches-per-epoch", "4", "--epsilon", "2", "--delta", "1e-5", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--epochs is required" in err[0] and "--example" in err[0]


def test_baselines_rows_in_the_results_units(capsys):
    """``--baselines``: each alternative at the same (eps, delta) in the same normalization, and
    ``gain = rmse(row) / rmse(result) - 1``; the unamplified DP-SGD row is the exact Gaussian."""
    import math

    from dpjax.calibration import gaussian_noise_multiplier

    assert main(BASE + ["--baselines", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in d["baselines"]}
    assert set(rows) == {"dpsgd_unamplified", "dpsgd_poisson", "dpsgd_balls_in_bins", "unamplified_blt"}
    for r in rows.values():
        assert r["gain"] == pytest.approx(r["rmse"] / d["rmse"] - 1.0, rel=1e-12)
    n, epochs = 8, 2
    s = float(gaussian_noise_multiplier(2.0, 1e-3, steps=epochs))
    assert rows["dpsgd_unamplified"]["noise_multiplier"] == pytest.approx(s, rel=1e-9)
    # C = I: |A|_F / sqrt(n) = sqrt((n + 1) / 2).
    assert rows["dpsgd_unamplified"]["rmse"] == pytest.approx(s * math.sqrt((n + 1) / 2), rel=1e-12)
    # Amplification never needs more noise than the unamplified mechanism with the same C.
    assert rows["dpsgd_balls_in_bins"]["noise_multiplier"] < s
    assert rows["dpsgd_poisson"]["noise_multiplier"] < s


@pytest.mark.slow
def test_amplification_auto_prints_every_candidate_and_returns_the_best(capsys):
    argv = [a for a in BASE if a not in ("--certify-samples", "65536")]
    assert main(argv + ["--amplification", "auto", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    cands = {c["amplification"]: c for c in d["candidates"]}
    assert set(cands) == {"balls_in_bins", "cyclic_poisson"}
    certified = [c for c in cands.values() if c["certified"]]
    assert d["rmse"] == min(c["rmse"] for c in certified)
    assert d["amplification"] == min(certified, key=lambda c: c["rmse"])["amplification"]
    # Same units: rmse = sigma * error in every row.
    for c in cands.values():
        assert c["rmse"] == pytest.approx(c["noise_multiplier"] * c["error"], rel=1e-12)
    assert cands["cyclic_poisson"]["method"] == "pld"


def test_amplification_cyclic_poisson_is_the_pld_calibration(capsys):
    from dpjax.calibration import dpsgd_noise_multiplier

    argv = [a for a in BASE if a not in ("--certify-samples", "65536")]
    assert main(argv + ["--amplification", "cyclic_poisson", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    bands = d["bands"]
    assert 4 % bands == 0 and d["certificate"]["method"] == "pld"
    col = d["first_column"]
    assert len(col) == bands and col[0] == 1.0
    z = float(dpsgd_noise_multiplier(sampling_prob=bands / 4, steps=-(-8 // bands), target_epsilon=2.0,
                                     target_delta=1e-3))
    assert d["noise_multiplier"] == pytest.approx(z * sum(c * c for c in col) ** 0.5, rel=1e-9)
    assert d["rmse"] == min(r["rmse"] for r in d["per_bands"])


@pytest.mark.slow
def test_mc_calibrate_certify_json(capsys):
    argv = ["mc-calibrate", "--toeplitz", "1,0.5", "--batches-per-epoch", "8", "--epochs", "2",
            "--epsilon", "2", "--delta", "1e-3", "--certify", "--certify-samples", "65536", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    cert = d["certificate"]
    assert set(("method", "epsilon", "delta", "num_samples", "failure_probability")) <= set(cert)
    assert cert["method"] == "importance_betting" and cert["num_samples"] == 65536 and cert["verified"]
    assert d["noise_multiplier"] == cert["noise_multiplier"] and cert["delta"] <= 1e-3
    assert d["noise_multiplier_estimate"] <= d["noise_multiplier"] <= 1.05 * d["noise_multiplier_estimate"]


def _paragraph(text: str, start: str) -> str:
    """The lines from the one starting with ``start`` to the next blank or capitalised line, joined."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(start))
    out = [lines[i]]
    for line in lines[i + 1:]:
        if not line or line[0].isupper():
            break
        out.append(line)
    return " ".join(out)


def _sentences(text: str) -> int:
    return len(re.findall(r"[.!?](?=\s|$)", text))


def check_practitioner_text(text: str, cwd) -> dict:
    """What the text of a certified run must say; returns the saved result (a dict)."""
    from dpjax.cli.optimize import round_up
    from dpjax.optimization import OptimizationResult

    saved_line = _paragraph(text, "Saved to ")
    path = re.match(r"Saved to (\S+) \(", saved_line).group(1)
    assert os.path.isfile(os.path.join(cwd, path)), path
    res = OptimizationResult.load(os.path.join(cwd, path))
    sigma, cert = res.noise_multiplier, res.certificate
    # The one sigma to train with: the certified one, printed rounded up (never below it).
    shown = re.search(r"^Train with noise multiplier sigma = (\S+) \(certified\)\.$", text, re.M).group(1)
    assert shown == round_up(sigma) and sigma <= float(shown) <= sigma * (1 + 1e-5)
    # The estimate only as a diagnostic: its value appears on the diagnostic line and nowhere else.
    est = f"{res.noise_multiplier_estimate:.6g}"
    diagnostic = _paragraph(text, "Diagnostic only")
    assert est in diagnostic and text.count(est) == 1
    # The certificate in one sentence: method, verification samples, failure probability.
    sentence = _paragraph(text, "Certificate: ")
    assert _sentences(sentence) == 1 and sentence.endswith(".")
    assert cert.method in sentence and f"{cert.num_samples:,} fresh samples" in sentence
    assert f"failure probability at most {cert.failure_probability:.2g}" in sentence
    # What was optimised and for what, in words.
    head = _paragraph(text, "Optimized ")
    for words in ("prefix-sum RMSE", f"n = {res.batches_per_epoch * res.epochs} rounds",
                  f"b = {res.batches_per_epoch} batches per epoch", f"E = {res.epochs} epochs",
                  f"(epsilon, delta) = ({res.target_epsilon:g}, {res.target_delta:g})"):
        assert words in head, words
    return {"path": path, "result": res}


def test_text_names_the_certified_sigma_the_certificate_and_the_saved_file(tmp_path, capsys):
    assert main(BASE) == 0
    text = capsys.readouterr().out
    got = check_practitioner_text(text, tmp_path)
    assert got["path"] == "dpjax-optimize-blt2-b4-E2-eps2-delta0.001.json"
    assert got["result"].certificate.num_samples == 65536
    assert "Details" not in text  # --verbose only


# BASE's problem without the certificate: the same compiled optimisation programs as BASE's runs
# (and test_cli_consistency.py's optimize case), none of its own.
SMALL = [a for a in BASE if a not in ("--certify-samples", "65536")] + ["--no-certify"]


def test_default_file_never_replaces_one_and_out_says_it_replaced(tmp_path, capsys):
    name = "dpjax-optimize-blt2-b4-E2-eps2-delta0.001.json"
    (tmp_path / name).write_text("mine")
    assert main(SMALL + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["out"] == "dpjax-optimize-blt2-b4-E2-eps2-delta0.001-2.json" and d["out_replaced"] is False
    assert (tmp_path / name).read_text() == "mine"
    assert json.loads((tmp_path / d["out"]).read_text())["noise_multiplier_estimate"] == d["noise_multiplier_estimate"]
    assert not list(tmp_path.glob("*.checkpoint.json"))  # no checkpoint without --out
    # --out FILE replaces FILE, and says so.
    assert main(SMALL + ["--out", name]) == 0
    text = capsys.readouterr().out
    saved = _paragraph(text, "Saved to ")
    assert saved.startswith(f"Saved to {name} (") and saved.endswith("it replaced the file that was there.")
    assert json.loads((tmp_path / name).read_text())["format"]
    # No certificate: no sigma to train with, and the text says so.
    assert "Train with" not in text and "do not train with the estimate" in text
    assert _sentences(_paragraph(text, "Certificate: ")) == 1


def test_no_save_writes_nothing(tmp_path, capsys):
    assert main(SMALL + ["--no-save"]) == 0
    assert "Not saved (--no-save)." in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == []
    assert main(SMALL + ["--no-save", "--out", "x.json"]) == 2
    assert "--no-save" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_verbose_adds_the_details_and_progress_names_the_stages(capsys, monkeypatch):
    from dpjax._base import progress as _progress

    monkeypatch.setenv("DPJAX_PROGRESS", "1")
    argv = [a for a in BASE if a != "--quiet"] + ["--verbose", "--no-save"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    details = out[out.index("Details (--verbose):"):]
    assert "certificate: verified" in details and "certificate.num_samples = 65536" in details
    assert "first column of C = 1," in details
    # Where stderr is a log (not a terminal): one line per stage, no carriage returns.
    assert "dpjax optimize: optimizing C: 3 optimizer steps" in err and "certify:" in err and "\r" not in err
    assert _progress.get_progress()[0] is None


def _readme_example() -> str:
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    return text.split("It prints\n\n```text\n", 1)[1].split("\n```", 1)[0]


def _shape(text: str) -> str:
    """``text`` with every number masked and whitespace normalised (numbers differ across machines)."""
    return " ".join(re.sub(r"\d[\d.,]*(e[+-]?\d+)?", "#", text).split())


def test_the_readme_shows_the_certified_sigma_the_certificate_and_the_file():
    text = _readme_example()
    assert re.search(r"^Train with noise multiplier sigma = [\d.]+ \(certified\)\.$", text, re.M)
    sentence = _paragraph(text, "Certificate: ")
    assert _sentences(sentence) == 1 and "importance_betting" in sentence
    assert re.search(r"on [\d,]+ fresh samples, with failure probability at most \S+ \(included in delta\)\.$",
                     sentence)
    assert _paragraph(text, "Saved to ").startswith("Saved to dpjax-optimize-blt2-b8-E4-eps2-delta1e-05.json (")
    assert _sentences(_paragraph(text, "Diagnostic only")) == 1


_NUMBER = re.compile(r"\d[\d.,]*(e[+-]?\d+)?")


def _numbers(text: str) -> list[str]:
    return [m.group(0).rstrip(".,") for m in _NUMBER.finditer(text)]


def _same_numbers(got: str, shown: str) -> list[str]:
    """Where the numbers of ``got`` and ``shown`` differ: counts (no decimal point or exponent,
    e.g. ``65,536`` samples) exactly, the others to 1e-3 relative (a new XLA or CPU may change
    the last digits of a Monte Carlo sum; the README's 2.9083 against a run's 2.91755 is 3e-3)."""
    a, b = _numbers(got), _numbers(shown)
    if len(a) != len(b):
        return [f"{len(a)} numbers against {len(b)}"]
    bad = []
    for x, y in zip(a, b):
        if any(c in x + y for c in ".e"):
            fx, fy = float(x.replace(",", "")), float(y.replace(",", ""))
            if abs(fx - fy) > 1e-3 * max(abs(fx), abs(fy)):
                bad.append(f"{x} != {y}")
        elif x != y:
            bad.append(f"{x} != {y}")
    return bad


@pytest.mark.slow
def test_the_example_prints_what_the_readme_shows(tmp_path, capsys):
    """The README's sample output is this command's: the same text and the same numbers."""
    assert main(["optimize", "--example"]) == 0
    text = capsys.readouterr().out
    got = check_practitioner_text(text, tmp_path)
    assert got["path"] == "dpjax-optimize-blt2-b8-E4-eps2-delta1e-05.json"
    assert _shape(text) == _shape(_readme_example())
    assert not _same_numbers(text, _readme_example()), _same_numbers(text, _readme_example())


def test_numbers_are_compared_to_the_digits_that_matter():
    assert _same_numbers("sigma = 2.91755 on 65,536 samples", "sigma = 2.9177 on 65,536 samples") == []
    assert _same_numbers("sigma = 2.91755 on 65,536 samples", "sigma = 2.9083 on 1,048,576 samples") == [
        "2.91755 != 2.9083", "65,536 != 1,048,576"]
