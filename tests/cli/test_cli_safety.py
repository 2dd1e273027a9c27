"""A command line that cannot mislead: no abbreviations, unknown options named, ``--out`` in the
format its extension says, comma lists as a table, plain-text help with an example per command,
commands grouped by job."""

from __future__ import annotations

import argparse
import csv
import json
import re

import pytest

from dpjax.cli.main import COMMAND_GROUPS, build_parser, main


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUBCOMMANDS = sorted(_subparsers())


def _prefixes(sub):
    """A proper prefix of every long option that is not itself an option of ``sub``."""
    known = set(sub._option_string_actions)
    out = []
    for flag in sorted(k for k in known if k.startswith("--") and len(k) > 4):
        for cut in range(len(flag) - 1, 3, -1):
            if flag[:cut] not in known:
                out.append((flag, flag[:cut]))
                break
    return out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_no_abbreviation_is_accepted(name, capsys):
    for flag, prefix in _prefixes(_subparsers()[name]):
        assert main([name, prefix, "1"]) == 2, (name, prefix)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1, (name, prefix, err)
        assert f"unknown option {prefix} " in lines[0] and "did you mean" in lines[0], lines[0]


def test_misspelt_flags_are_rejected_naming_the_flag(capsys):
    base = ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "100"]
    assert main(base + ["--delta", "1e-5", "--noise", "2"]) == 2
    err = capsys.readouterr().err
    assert "unknown option --noise " in err and "--noise-multiplier" in err
    # a typo is named (not reported as the required --delta missing)
    assert main(base + ["--detla", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert "unknown option --detla (did you mean --delta?)" in err and "required" not in err


def test_optimize_steps_names_its_new_spelling(capsys):
    assert main(["optimize", "--example", "--steps", "5"]) == 2
    assert "did you mean --optimizer-steps?" in capsys.readouterr().err


MARKUP = ("``", "::", ":func:", ":mod:", ":class:", ":data:", ":meth:")


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_is_plain_text_with_an_example(name, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([name, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for mark in MARKUP:
        assert mark not in text, (name, mark)
    assert re.search(r"Examples?:\n\s+dpjax " + re.escape(name) + r"\b", text), name


def test_noise_help_is_about_noise_only(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["noise", "--help"])
    assert "mc-calibrate" not in capsys.readouterr().out


def test_commands_grouped_by_job_main_job_first(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^\s{2,}([a-z][a-z-]+)\s{2,}", text.split("commands:")[1], re.M)
    assert listed[0] == "optimize"
    assert listed == [n for _, names in COMMAND_GROUPS for n in names]
    assert set(listed) == set(SUBCOMMANDS)


EPS = ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5,1e-6"]


def test_comma_list_prints_a_table(capsys):
    assert main(EPS + ["--quiet"]) == 0
    shared, table = capsys.readouterr().out.strip().split("\n\n")
    assert "noise_multiplier" in shared and "adjacency" in shared  # what every row shares, once
    lines = table.splitlines()
    assert len(lines) == 3  # header + one line per value
    header = lines[0].split()
    assert header[:2] == ["epsilon", "epsilon_lower"] and "target_delta" in header
    assert [float(line.split()[header.index("target_delta")]) for line in lines[1:]] == [1e-5, 1e-6]


def test_out_writes_what_its_extension_says(tmp_path, capsys):
    js, cs = tmp_path / "e.json", tmp_path / "e.csv"
    assert main(EPS + ["--quiet", "--out", str(js)]) == 0
    assert main(EPS + ["--quiet", "--out", str(cs)]) == 0
    capsys.readouterr()
    rows_json = json.loads(js.read_text())["rows"]
    with open(cs, newline="") as fh:
        rows_csv = list(csv.DictReader(fh))
    assert [float(r["epsilon"]) for r in rows_csv] == [r["epsilon"] for r in rows_json]
    assert [float(r["target_delta"]) for r in rows_csv] == [1e-5, 1e-6]


def test_out_file_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    from dpjax._base import io as _io
    from dpjax.cli.main import write_out

    for name in ("r.json", "r.csv"):
        path = tmp_path / name
        path.write_text("previous result\n")
        # A value that cannot be written (JSON), and a rename that fails (both formats): the
        # previous file stays whole and no temp file is left beside it.
        if name.endswith(".json"):
            with pytest.raises(TypeError):
                write_out(str(path), {"epsilon": object()})
            assert path.read_text() == "previous result\n"

        def refused(*args):
            raise OSError("rename refused")

        with monkeypatch.context() as m:
            m.setattr(_io.os, "replace", refused)
            with pytest.raises(OSError, match="rename refused"):
                write_out(str(path), {"rows": [{"epsilon": 1.5, "target_delta": 1e-5}]})
        assert path.read_text() == "previous result\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            n for n in ("r.json", "r.csv") if (tmp_path / n).exists())
        write_out(str(path), {"rows": [{"epsilon": 1.5, "target_delta": 1e-5}]})
        assert "1.5" in path.read_text()


def test_sweep_out_json_is_json_and_csv_is_csv(tmp_path, capsys):
    argv = ["sweep", "--noise-multiplier", "1,2", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5",
            "--quiet"]
    js, cs = tmp_path / "s.json", tmp_path / "s.csv"
    assert main(argv + ["--out", str(js)]) == 0
    assert main(argv + ["--out", str(cs)]) == 0
    capsys.readouterr()
    table = json.loads(js.read_text())["table"]
    with open(cs, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(table) == len(rows) == 2
    for t, r in zip(table, rows):
        assert float(r["epsilon"]) == t["epsilon"] and r["grid"] == t["grid"] == "sweep"
        assert t["target_delta"] == 1e-5 and t["delta"] is None and t["query"] == "epsilon"


def test_every_cli_flag_is_in_the_names_table():
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "api_names.md").read_text()
    documented = set(re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)`", text))
    flags = set()
    for sub in _subparsers().values():
        flags |= {o for a in sub._actions for o in a.option_strings}
    flags |= {o for a in build_parser()._actions for o in a.option_strings}
    missing = sorted(flags - documented)
    assert not missing, f"document these flags in docs/api_names.md: {missing}"


@pytest.mark.parametrize("name", [n for n in SUBCOMMANDS if "--group-size" in _subparsers()[n]._option_string_actions])
def test_batching_options_are_not_group_privacy_options(name):
    """``--sampling``, ``--dataset-size`` and ``--batch-size`` say how batches are formed; the
    help lists them in their own group, apart from ``--group-size``."""
    groups = {o: g.title for g in _subparsers()[name]._action_groups for a in g._group_actions
              for o in a.option_strings}
    for flag in ("--sampling", "--dataset-size", "--batch-size"):
        if flag in groups:
            assert "group privacy" not in groups[flag], (name, flag, groups[flag])
            if "group privacy" in groups["--group-size"]:
                assert groups[flag].startswith("batching"), (name, flag, groups[flag])
