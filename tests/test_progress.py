"""Progress bars on long calls (issue 13, must-show 3).

A bar is drawn on stderr when stderr is a terminal (tested in a pseudo-terminal with Python's
``pty``), never on stdout (``--json`` output stays one JSON object), not when stderr is a pipe,
and not with ``--quiet``.  The long call is ``dpjax noise`` with compilation (cold, the
persistent cache off): it runs for seconds, past the bar's one-second delay.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from dpjax._progress import Progress, progress_enabled

# DP-SGD (q < 1), so that the call compiles the accountant's program (q = 1 is the exact Gaussian
# closed form: no program, well under the bar's delay).
NOISE = [sys.executable, "-m", "dpjax", "noise", "--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01",
         "--steps", "1000", "--json"]
BAR = "calibrate noise"


def _run(argv, *, stderr_tty: bool):
    env = {**os.environ, "DPJAX_COMPILATION_CACHE": "0"}
    env.pop("DPJAX_PROGRESS", None)
    if not stderr_tty:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        return proc.returncode, proc.stdout, proc.stderr
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read().decode()
    proc.wait(timeout=600)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(sys.platform == "win32", reason="pty is POSIX-only")
def test_bar_in_a_terminal_not_in_json_stdout():
    rc, out, err = _run(NOISE, stderr_tty=True)
    assert rc == 0, err
    assert BAR in err and "rounds" in err, err  # drawn on the terminal
    assert "\r" not in out and BAR not in out
    assert json.loads(out)["noise_multiplier"] > 0  # stdout is exactly the JSON object


@pytest.mark.slow
def test_no_bar_when_stderr_is_not_a_terminal():
    rc, out, err = _run(NOISE, stderr_tty=False)
    assert rc == 0
    assert BAR not in err and "\r" not in err
    json.loads(out)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="pty is POSIX-only")
def test_quiet_turns_the_bar_off_in_a_terminal():
    rc, out, err = _run(NOISE + ["--quiet"], stderr_tty=True)
    assert rc == 0 and BAR not in err
    json.loads(out)


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty,quiet,expect_bar", [(True, False, True), (True, True, False), (False, False, False)])
def test_in_process_bar_follows_tty_and_quiet(monkeypatch, capsys, tty, quiet, expect_bar):
    # The same checks as the subprocess tests, in-process (cheap: the program is compiled once).
    import dpjax._progress as prog
    from dpjax.cli.main import main

    monkeypatch.delenv("DPJAX_PROGRESS", raising=False)
    monkeypatch.setattr(prog, "_GLOBAL_ENABLED", None)
    monkeypatch.setattr(prog, "LONG_CALL_DELAY", 0.0)  # a warm call is fast: show the bar at once
    err = _FakeTerminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    argv = NOISE[3:] + (["--quiet"] if quiet else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    json.loads(out)
    assert (BAR in err.getvalue()) == expect_bar, err.getvalue()
    assert BAR not in out
    assert prog._GLOBAL_ENABLED is None  # --quiet does not leak into later calls


def test_python_argument_and_delay():
    stream = io.StringIO()
    with Progress(3, "x", enabled=True, stream=stream) as bar:
        bar.update(3)
    assert "x: 100%" in stream.getvalue()
    stream = io.StringIO()
    with Progress(3, "x", enabled=True, stream=stream, delay=60.0) as bar:  # a fast call: no trace
        bar.update(3)
    assert stream.getvalue() == ""
    stream = io.StringIO()
    with Progress(3, "x", enabled=False, stream=stream) as bar:
        bar.update(3)
    assert stream.getvalue() == ""
    assert progress_enabled(None, io.StringIO()) is False  # not a TTY: auto is off


def test_calibration_takes_a_progress_argument():
    import inspect

    from dpjax.calibration import dpsgd_noise_multiplier

    assert inspect.signature(dpsgd_noise_multiplier).parameters["progress"].default is None


def test_monte_carlo_bar_ticks_per_chunk_and_never_changes_the_numbers(monkeypatch):
    import numpy as np

    import dpjax._progress as prog
    from dpjax.montecarlo import BallsInBins

    monkeypatch.setattr(prog, "LONG_CALL_DELAY", 0.0)
    acc = BallsInBins(np.array([1.0, 0.5]), 4, 2)
    quiet = acc.estimate(1.0, [0.5, 1.0], 1 << 15, 0, chunk_size=4096, progress=False)
    err = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    shown = acc.estimate(1.0, [0.5, 1.0], 1 << 15, 0, chunk_size=4096, progress=None)  # auto: a "terminal"
    assert "monte carlo: 100%" in err.getvalue() and "8/8" in err.getvalue()
    for field in ("delta", "standard_error", "delta_remove", "delta_add"):
        np.testing.assert_array_equal(getattr(quiet, field), getattr(shown, field))
