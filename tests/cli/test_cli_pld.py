"""``dpjax epsilon`` / ``dpjax delta``: JSON output, bracket, bad input (exit 2, no traceback)."""

from __future__ import annotations

import json

import pytest

from dpjax.cli.main import main

B1 = ["--noise-multiplier", "1.0", "--sampling-prob", "0.01", "--steps", "1000"]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    # The CLI turns on JAX's persistent compilation cache (global config); in-process tests
    # must not change the configuration of the rest of the test session.
    monkeypatch.setenv("DPJAX_COMPILATION_CACHE", "0")


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_epsilon_json(capsys, reference_cases):
    rc, out, _ = _run(capsys, ["epsilon", *B1, "--delta", "1e-5", "--json"])
    assert rc == 0
    res = json.loads(out)
    ref = reference_cases["B1"]["value"]
    assert res["epsilon"] == res["epsilon_upper"]
    assert res["epsilon_lower"] <= ref <= res["epsilon_upper"] <= ref * 1.003   # within 0.3%
    assert set(res["grid"]) == {"remove", "add"}


def test_delta_json_and_text(capsys):
    rc, out, _ = _run(capsys, ["delta", *B1, "--epsilon", "2", "--json"])
    assert rc == 0
    res = json.loads(out)
    assert 0 <= res["delta_lower"] <= res["delta"] == res["delta_upper"] < 1e-5
    rc, out, _ = _run(capsys, ["delta", *B1, "--epsilon", "2"])
    assert rc == 0 and out.startswith("delta")


@pytest.mark.parametrize(
    "argv, word",
    [
        (["epsilon", "--noise-multiplier", "-1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5"],
         "noise_multiplier"),
        (["epsilon", "--noise-multiplier", "1", "--sampling-prob", "2", "--steps", "10", "--delta", "1e-5"],
         "sampling_prob"),
        (["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.1", "--steps", "1.5", "--delta", "1e-5"],
         "steps"),
        (["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.1", "--steps", "10", "--delta", "1"],
         "delta"),
        (["delta", "--noise-multiplier", "1", "--sampling-prob", "0.1", "--steps", "10", "--epsilon", "-1"],
         "epsilon"),
    ],
)
def test_bad_input_exit_2(capsys, argv, word):
    rc, out, err = _run(capsys, argv)
    assert rc == 2
    # the option is named as on the command line (--noise-multiplier) or as in Python
    assert word in err.replace("-", "_") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""


def test_nan_noise_multiplier_is_one_line_naming_the_option(capsys):
    # In process (the real-process smoke test is tests/cli/test_bad_input_cli.py's): NaN through
    # --json gives exit 2, nothing on stdout and one stderr line naming the option.
    rc, out, err = _run(capsys, ["epsilon", "--noise-multiplier", "nan", "--sampling-prob", "0.01", "--steps", "10",
                                 "--delta", "1e-5", "--json"])
    assert rc == 2 and out == ""
    assert "noise_multiplier" in err.replace("-", "_") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cache_environment_switch(tmp_path, monkeypatch):
    """DPJAX_COMPILATION_CACHE="0" (or unset with default_on=False) leaves JAX's config alone."""
    from dpjax.numerics import cache

    monkeypatch.setenv("DPJAX_COMPILATION_CACHE", "0")
    assert cache.enable_from_environment(default_on=True) is None
    monkeypatch.delenv("DPJAX_COMPILATION_CACHE")
    assert cache.enable_from_environment(default_on=False) is None


def test_help_states_the_actual_grid_default(capsys):
    """The --relative-accuracy help names the default the accountant really uses."""
    from dpjax.pld import GridOptions

    assert main(["epsilon", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert GridOptions().relative_accuracy == 1e-3 and GridOptions().per_step_accuracy == 8e-9
    assert "default 1e-3" in out and "8e-9 x steps" in out


def test_text_output_of_the_default_renderer(capsys):
    # `dpjax noise` has no renderer of its own: one "key  value" line per field, keys aligned,
    # floats to 6 significant digits, the same numbers as its --json form.
    argv = ["noise", "--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "1000"]
    rc, text, _ = _run(capsys, argv)
    assert rc == 0
    rc, out, _ = _run(capsys, [*argv, "--json"])
    res = json.loads(out)
    lines = dict(line.split(None, 1) for line in text.strip().splitlines())
    assert float(lines["noise_multiplier"]) == pytest.approx(res["noise_multiplier"], rel=1e-5)
    keys = [line.split(None, 1)[0] for line in text.strip().splitlines()]
    starts = {line.index(line.split(None, 1)[1]) for line in text.strip().splitlines()}
    assert keys == list(res) and len(starts) == 1                     # one value column
