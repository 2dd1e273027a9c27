"""A newcomer's first hour with the ``dpjax`` command, scripted.

Iterates over every REGISTERED subcommand (so subcommands added later are checked too):

* every subcommand has a description and a one-line help; every option has a help string; no
  help cites a paper by an internal file number;
* the same option name means the same thing everywhere (one flag per destination);
* every epsilon / delta / noise-multiplier option accepts a comma list;
* ``--version`` works;
* a bad number for ANY range-checked option exits 2 with one line naming the option;
* ``--json`` parses and names the adjacency, and ``--out FILE`` writes the same JSON
  (``JSON_ARGV``: a cheap invocation per subcommand; a new subcommand must add one).
"""

from __future__ import annotations

import argparse
import json
import re

import pytest

import dpjax
from dpjax.cli._args import MAX_STEPS
from dpjax.cli.main import build_parser, list_options, main

# destinations that must accept comma lists wherever they appear (subcommand -> reason if exempt)
LIST_DESTS = {"epsilon", "delta", "target_delta", "noise_multiplier"}
_SWEEP_VALUES = "sweep parses its own value lists and ranges (a,b,c or a:b:n[:log]) into one table"
LIST_EXEMPT: dict[tuple[str, str], str] = {
    ("sweep", "noise_multiplier"): _SWEEP_VALUES, ("sweep", "delta"): _SWEEP_VALUES,
    ("sweep", "epsilon"): _SWEEP_VALUES,
}

# A cheap run of every subcommand (tiny step counts / sample counts); the expected adjacency.
MC = ["--batches-per-epoch", "2", "--epochs", "2", "--toeplitz", "1,0.5"]
# Calibration and the group (mixture-of-Gaussians) accountant compile for tens of seconds: those
# cases run in the slow tier; every subcommand has a default-tier case too.
SLOW_JSON_CASES = {"noise", "delta-group"}
JSON_ARGV: dict[str, tuple[list[str], str]] = {
    "epsilon": (["--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5,1e-6"],
                "add_or_remove"),
    "delta": (["--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--epsilon", "1,2"],
              "add_or_remove"),
    "delta-group": (["--noise-multiplier", "2", "--steps", "10", "--epsilon", "1,2", "--group-size", "2",
                     "--sampling", "fixed_batch", "--dataset-size", "1000", "--batch-size", "10"], "replace"),
    "noise": (["--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "10"], "add_or_remove"),
    "noise-quick": (["--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "1", "--steps", "1"], "add_or_remove"),
    "report": (["--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5"],
               "add_or_remove"),
    "demo": (["--steps", "10"], "add_or_remove"),
    # test_progress.py's estimate (four batches per epoch, two epochs, 2^15 samples in chunks of 4096): the
    # same compiled Monte Carlo program.
    "mc-delta": (["--batches-per-epoch", "4", "--epochs", "2", "--toeplitz", "1,0.5", "--noise-multiplier", "1",
                  "--epsilon", "0.5,1", "--samples", "32768", "--chunk-size", "4096"], "add_or_remove"),
    # test_results.py's epsilon estimate and certificate (two epochs, 4096 samples): the same compiled
    # Monte Carlo programs.
    "mc-epsilon": (MC + ["--noise-multiplier", "1", "--delta", "0.1", "--samples", "4096"], "add_or_remove"),
    "mc-certify": (MC + ["--noise-multiplier", "1", "--epsilon", "2", "--delta", "0.5", "--samples", "4096"],
                   "add_or_remove"),
    # test_calibration_cli.py's mc-calibrate problem: the same compiled calibration programs.
    "mc-calibrate": (["--toeplitz", "1,0.5", "--batches-per-epoch", "8", "--epochs", "2", "--epsilon", "2",
                      "--delta", "1e-3", "--samples", "8192"], "add_or_remove"),
    # test_optimize_cli.py's problem (BASE), uncertified: the same compiled programs as its runs.
    "optimize": (["--family", "blt", "--buffers", "2", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "2",
                  "--delta", "1e-3", "--optimizer-steps", "3", "--samples", "256", "--no-certify"], "add_or_remove"),
    "sweep": (["--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5"],
              "add_or_remove"),
}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _help_of(name: str) -> str:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((c.help or "") for c in action._choices_actions if c.dest == name)


def _options(sub):
    return [a for a in sub._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


SUBCOMMANDS = sorted(_subparsers())


def test_known_subcommands_are_registered():
    assert {"epsilon", "delta", "noise", "demo", "mc-delta", "mc-epsilon", "mc-certify", "mc-calibrate"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_description_and_help_everywhere(name):
    sub = _subparsers()[name]
    assert (sub.description or "").strip(), f"{name}: no description"
    assert _help_of(name).strip(), f"{name}: no one-line help"
    texts = [sub.description]
    for action in _options(sub):
        assert action.help and action.help is not argparse.SUPPRESS and action.help.strip(), \
            f"{name} {action.option_strings}: no help string"
        texts.append(action.help)
    for text in texts:
        assert not re.search(r"\bseeds?\s*0\d\d\b", text), f"{name}: cite papers by author and title: {text!r}"
        assert "GridOptions.n_max" not in text.replace("= dpjax.pld.GridOptions.n_max", ""), text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_common_output_flags(name):
    dests = {a.dest for a in _options(_subparsers()[name])}
    assert {"json", "out", "quiet"} <= dests


def test_one_flag_per_destination_across_subcommands():
    flags: dict[str, set[str]] = {}
    for name, sub in _subparsers().items():
        for action in _options(sub):
            flags.setdefault(action.dest, set()).add(action.option_strings[0])
    clashes = {d: f for d, f in flags.items() if len(f) > 1}
    assert not clashes, f"the same quantity under different flags: {clashes}"


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_list_valued_options_accept_comma_lists(name):
    sub = _subparsers()[name]
    lists = set(list_options(sub))
    for action in _options(sub):
        if action.dest in LIST_DESTS and (name, action.dest) not in LIST_EXEMPT:
            assert action.dest in lists, f"{name} {action.option_strings[0]} does not accept a comma list"
            assert action.type("0.5,0.25") == [0.5, 0.25]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"dpjax {dpjax.__version__}"


def _range_checked(sub):
    return [a for a in _options(sub) if hasattr(a.type, "interval")]


BAD_VALUES = ["nan", "-1e400", "1e30", "abc"]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_bad_number_for_every_option_exits_2_with_one_line(name, capsys):
    sub = _subparsers()[name]
    checked = _range_checked(sub)
    assert checked or name == "demo"
    for action in checked:
        flag = action.option_strings[0]
        for bad in BAD_VALUES:
            try:
                action.type(bad)
                continue  # a legal value for this option (e.g. 1e30 for an epsilon)
            except argparse.ArgumentTypeError:
                pass
            rc = main([name, flag, bad])
            out, err = capsys.readouterr()
            assert rc == 2 and out == "", (name, flag, bad)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, (name, flag, bad, err)


def test_usage_errors_are_one_line(capsys):
    for argv in (["epsilon"], ["nosuchcommand"], ["delta", "--bogus", "1"], ["epsilon", "--steps"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and "usage:" not in err, (argv, err)


def test_integer_options_name_their_range(capsys):
    assert main(["epsilon", "--steps", "1e30"]) == 2
    err = capsys.readouterr().err
    assert "--steps" in err and f"[1, {MAX_STEPS}]" in err


def test_every_subcommand_has_a_json_case():
    covered = {c if c in SUBCOMMANDS else c.rsplit("-", 1)[0] for c in JSON_ARGV if c not in SLOW_JSON_CASES}
    missing = set(SUBCOMMANDS) - covered
    assert not missing, f"add a cheap invocation and its adjacency to JSON_ARGV for {sorted(missing)}"


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_JSON_CASES else c
                                  for c in sorted(JSON_ARGV)])
def test_json_names_adjacency_and_out_writes_the_same(case, capsys, tmp_path):
    argv, adjacency = JSON_ARGV[case]
    name = case if case in SUBCOMMANDS else case.rsplit("-", 1)[0]
    out_file = tmp_path / "result.json"
    assert main([name, *argv, "--json", "--quiet", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out)  # strict JSON, one object
    assert isinstance(result, dict)
    assert result["adjacency"] == adjacency
    for row in result.get("rows", []):
        assert row["adjacency"] == adjacency
    if name == "optimize":  # --out is the loadable result (a superset of the --json object)
        from dpjax.optimization import OptimizationResult

        saved = OptimizationResult.load(out_file)
        assert saved.noise_multiplier_estimate == result["noise_multiplier_estimate"]
        assert list(saved.first_column) == result["first_column"]
    elif name == "sweep":  # --out FILE.json: the result with every row (FILE.csv: the CSV table)
        saved = json.loads(out_file.read_text())
        assert saved["configurations"] == result["configurations"] == len(saved["table"])
        assert all(r["grid"] == "sweep" and r["epsilon"] >= r["lower"] for r in saved["table"])
    else:
        assert out_file.read_text() == out
    assert "nan" not in out


def test_comma_lists_give_one_row_per_value(capsys):
    argv, _ = JSON_ARGV["epsilon"]
    assert main(["epsilon", *argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["target_delta"] for r in rows] == [1e-5, 1e-6]
    assert rows[0]["epsilon"] < rows[1]["epsilon"]  # smaller delta, larger epsilon
    argv, _ = JSON_ARGV["mc-delta"]
    assert main(["mc-delta", *argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["target_epsilon"] for r in rows] == [0.5, 1.0] and rows[0]["delta"] >= rows[1]["delta"]


def test_grid_limit_message_names_the_cli_flag():
    from dpjax.cli.pld import _cli_reason

    lib = "... too long for GridOptions.n_max=2097152 (raise it)"
    assert _cli_reason(lib) == "... too long for --max-grid-points=2097152 (raise it)"


def test_grid_too_small_says_which_cli_flag_to_raise(capsys):
    # q < 1 (a q = 1 composition is answered in closed form and needs no grid).  The grid cannot
    # certify the target; the answer falls back to the smallest certified bound of
    # dpjax.pld.fallback (here the binomial mixture of Gaussians, half the dominating Gaussian's
    # 560050), and the reason names the CLI flag that would give a tighter one.
    import math

    from dpjax.numerics.exact import gaussian_epsilon

    assert main(["epsilon", "--noise-multiplier", "0.3", "--sampling-prob", "0.5", "--steps", "100000",
                 "--delta", "1e-5", "--max-grid-points", "1024", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["grid"]["remove"]["n"] == 1024 and "fallback" in res["reason"]
    assert res["epsilon"] <= float(gaussian_epsilon(1e-5, math.sqrt(100000) / 0.3))
    assert "--max-grid-points" in res["reason"] and "GridOptions" not in res["reason"]


def test_demo_bracket_shows_enough_digits_to_be_a_bracket():
    from dpjax.cli.demo import _bracket

    text = _bracket(1.8282264761240046, 1.8282416892690323)  # the demo's bracket
    lo, hi = text.split("]")[0].strip("[").split(", ")
    assert lo != hi and float(lo) < float(hi)
    assert float(lo) <= 1.8282264761240046 + 1e-12 or lo.startswith("1.82822")
    assert "width" in text


def test_cli_mode_choices_are_the_library_modes():
    """The command line spells its string modes as literals (importing the modules that define
    them would slow every command's start); they must be the library's enum values, no more and
    no fewer."""
    import argparse

    from dpjax._base.enums import AllocationSampling
    from dpjax.cli.main import build_parser
    from dpjax.montecarlo.evr import CertificateMethod
    from dpjax.optimization.loop import Estimator

    expected = {"--estimator": set(Estimator), "--certify-method": set(CertificateMethod)}
    seen = []
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            interval = getattr(action.type, "interval", "")
            if not interval.startswith("one of "):
                continue
            values = set(interval[len("one of "):].split(", "))
            opt = action.option_strings[-1] if action.option_strings else action.dest
            if opt in expected:
                assert values == {str(v) for v in expected[opt]}, (name, opt, values)
                seen.append((name, opt))
            if opt == "--sampling" and name == "sweep":
                assert values == {"poisson"} | {str(v) for v in AllocationSampling}, values
                seen.append((name, opt))
    # Every such option was found (a renamed option must not silently drop out of the check).
    assert {o for _, o in seen} == {"--estimator", "--certify-method", "--sampling"}, seen
    assert len([s for s in seen if s[1] == "--certify-method"]) == 3, seen
