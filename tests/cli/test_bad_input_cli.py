"""Hostile command lines get exit status 2 and ONE line naming the option and its valid range
(the Python API's half is tests/test_bad_input.py).

Before: ``--steps 1e30``, ``--group-size 1e30``, ``--seed 99999999999999999999999`` exited 1 with
a traceback; ``noise --steps 99999999999999999999`` reported steps=-9223372036854775808;
argparse errors printed 6-7 usage lines; ``demo --noise-multiplier 1e-300`` printed "nan" in
its JSON.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dpjax.cli.main import main

EPS = ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--delta", "1e-5"]
MC = ["mc-delta", "--batches-per-epoch", "2", "--epochs", "1", "--noise-multiplier", "1", "--epsilon", "1"]
NOISE = ["noise", "--epsilon", "1", "--delta", "1e-5", "--sampling-prob", "0.01"]

# (argv, words that must appear in the one error line)
ROWS = [
    (EPS + ["--steps", "1e30"], ["--steps", "[1, 2147483647]"]),
    (EPS + ["--steps", "10", "--group-size", "1e30"], ["--group-size", "[1, 2147483647]"]),
    (MC + ["--seed", "99999999999999999999999"], ["--seed", "[0, 4294967295]"]),
    (NOISE + ["--steps", "99999999999999999999"], ["--steps", "[1, 2147483647]"]),
    (EPS + ["--steps", "2.5"], ["--steps", "integer"]),
    (EPS + ["--steps", "10", "--delta", "nan"], ["--delta", "(0, 1)"]),
    (EPS + ["--steps", "10", "--noise-multiplier", "inf"], ["--noise-multiplier", "(0, inf)"]),
    (MC + ["--samples", "1e30"], ["--samples", "[1, 1099511627776]"]),
    (["epsilon", "--steps", "10"], ["required", "--delta"]),                  # argparse: one line, no usage
    (["epsilon", "--steps", "10", "--delta", "1e-5"], ["--noise-multiplier is required", "--scenario"]),
    (["epsilon", "--no-such-flag"], ["unknown option --no-such-flag"]),   # named before the required ones
    (["no-such-command"], ["invalid choice"]),
    (["demo", "--noise-multiplier", "1e-300", "--steps", "10", "--json"], ["--noise-multiplier", "0.5"]),
]


@pytest.mark.parametrize("argv,words", ROWS, ids=[" ".join(r[0][:1] + r[0][-2:]) for r in ROWS])
def test_bad_command_line_exits_2_with_one_line(capsys, argv, words):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == "", out  # nothing on stdout: no partial JSON, no "nan"
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "usage:" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_no_traceback_in_a_real_process():
    # The installed entry point, not just main(): stderr is exactly one line.
    proc = subprocess.run([sys.executable, "-m", "dpjax", *EPS, "--steps", "1e30", "--group-size", "1e30"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DPJAX_COMPILATION_CACHE": "0"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


MCB = ["--batches-per-epoch", "4", "--epochs", "2"]
# Values that pass the option's own type check but not the library's: the error the library
# raises must still name the option (in the command line's spelling), not a Python argument.
SEMANTIC = [
    (["mc-certify", "--toeplitz", "0,1", *MCB, "--noise-multiplier", "1", "--epsilon", "1", "--delta", "0.1"],
     "--toeplitz"),
    (["mc-calibrate", "--toeplitz", "0,1", *MCB, "--epsilon", "1", "--delta", "0.1"], "--toeplitz"),
    (["mc-epsilon", "--toeplitz", "0,1", *MCB, "--noise-multiplier", "1", "--delta", "0.1"], "--toeplitz"),
    (["mc-delta", "--toeplitz", "1e308,1e308", *MCB, "--noise-multiplier", "1", "--epsilon", "1"], "--toeplitz"),
    (["mc-delta", "--blt-decays", "0.5,0.2", "--blt-scales", "0.5", *MCB, "--noise-multiplier", "1", "--epsilon",
      "1"], "--blt-decays"),
    (["epsilon", "--noise-multiplier", "1", "--sampling", "random_allocation", "--batches-per-epoch", "10",
      "--selections-per-epoch", "20", "--epochs", "2", "--delta", "1e-5"], "--selections-per-epoch"),
    (["noise", "--epsilon", "1e-9", "--delta", "1e-300", "--sampling-prob", "0.01", "--steps", "100"], "--epsilon"),
    (["optimize", *MCB, "--epsilon", "2", "--delta", "1e-3", "--family", "banded", "--bands", "20", "--no-save"],
     "--bands"),
    (["sweep", "--noise-multiplier", "1", "--sampling-prob", "2", "--steps", "100", "--delta", "1e-5"],
     "--sampling-prob"),
    (["sweep", "--noise-multiplier", "1:0:3", "--sampling-prob", "0.1", "--steps", "100", "--delta", "1e-5"],
     "--noise-multiplier"),
]


@pytest.mark.parametrize("argv,flag", SEMANTIC, ids=[f"{a[0]} {f}" for a, f in SEMANTIC])
def test_a_library_error_names_the_option(capsys, argv, flag):
    assert main(argv + ["--quiet"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert flag in lines[0], lines[0]


def test_messages_keep_their_prose():
    """Only Python names become flags: words of the message stay (``steps`` in a sentence), and
    a message that names an option already is left as it is."""
    from dpjax.cli.main import build_parser, name_the_options

    sub = build_parser()._subparsers._group_actions[0].choices["noise"]
    assert name_the_options("lower sampling_prob or steps", sub) == "lower --sampling-prob or steps"
    assert name_the_options("steps must be >= 1", sub) == "--steps must be >= 1"
    assert name_the_options("--steps and steps_x", sub) == "--steps and steps_x"
    assert name_the_options("increase target_epsilon", sub) == "increase --epsilon"
