"""``dpjax optimize``: output paths, ``--buffers`` and ``--resume`` are checked before any work
(one line, status 2, nothing on stdout), and a resumed run says when its screen-state sidecar is
missing or unreadable instead of crashing or saying nothing."""

from __future__ import annotations

import glob
import json
import os

import pytest

from dpjax.cli.main import main


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    # Without --out the result is saved in the current directory: keep it out of the checkout.
    monkeypatch.chdir(tmp_path)

SMALL = ["optimize", "--batches-per-epoch", "4", "--epochs", "2", "--epsilon", "2", "--delta", "1e-3",
         "--samples", "512", "--checkpoint-every", "1", "--quiet", "--no-certify"]


def _one_line_error(capsys, argv, *words):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_out_is_an_existing_directory(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    _one_line_error(capsys, SMALL + ["--optimizer-steps", "1", "--out", str(tmp_path / "d")], "--out", "is a directory")


def test_out_in_an_unwritable_place(capsys):
    _one_line_error(capsys, SMALL + ["--optimizer-steps", "1", "--out", "/proc/x.json"], "--out", "cannot write")


def test_checkpoint_path_is_a_directory(tmp_path, capsys):
    (tmp_path / "r.json.checkpoint.json").mkdir()
    _one_line_error(capsys, SMALL + ["--optimizer-steps", "1", "--out", str(tmp_path / "r.json")], "checkpoint",
                    "is a directory")


def test_default_buffers_never_exceed_n(tmp_path, capsys):
    argv = ["optimize", "--batches-per-epoch", "2", "--epochs", "1", "--epsilon", "1", "--delta", "1e-3",
            "--optimizer-steps", "1", "--samples", "256", "--no-certify", "--quiet", "--json"]
    assert main(argv) == 0   # was: "num_buffers must be in [1, n] = [1, 2], got 4" for a flag never given
    out = json.loads(capsys.readouterr().out)
    assert out["parameterization"]["num_buffers"] == 2
    _one_line_error(capsys, argv[:1] + ["--buffers", "4"] + argv[1:], "--buffers", "[1, n] = [1, 2]", "got 4")


def test_resume_without_a_checkpoint(tmp_path, capsys):
    _one_line_error(capsys, SMALL + ["--optimizer-steps", "1", "--out", str(tmp_path / "none.json"), "--resume"],
                    "--resume", "no checkpoint")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_resume_with_a_damaged_or_missing_sidecar(tmp_path, capsys, damage):
    # The screen-state sidecar belongs to the plain estimator's screened path.
    import dpjax
    from dpjax.optimization import (Checkpoint, CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)
    from dpjax.optimization.loop import default_optimizer

    out = str(tmp_path / "r.json")
    plain = SMALL + ["--estimator", "plain"]
    # The checkpoint a run killed after 2 steps leaves (a completed CLI run removes its own):
    # the same configuration as the command line's.
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(4), epochs=2, target_epsilon=2.0, target_delta=1e-3)
    optimize_correlation(make_parameterization("blt", 8, num_buffers=4), problem,
                         OptimizerSettings(num_steps=2, num_samples=512, optimizer=default_optimizer(0.05), key=0,
                                           estimator="plain"),
                         certify=False, checkpoint=Checkpoint(out + ".checkpoint.json", every=1), progress=False)
    sidecars = glob.glob(out + ".checkpoint.json.screen-*.npz")
    assert len(sidecars) == 1
    if damage == "truncate":   # was a 33-line zipfile.BadZipFile traceback and status 1
        with open(sidecars[0], "r+b") as f:
            f.truncate(100)
    else:                      # was a silent resume
        os.remove(sidecars[0])
    rc = main(plain + ["--optimizer-steps", "3", "--out", out, "--resume", "--json"])
    stdout, err = capsys.readouterr()
    assert rc == 0
    assert json.loads(stdout)["status"] == "completed"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "sidecar" in lines[0], err
    assert ("cannot be read" if damage == "truncate" else "is missing") in lines[0]
