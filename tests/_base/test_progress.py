"""Progress on long calls: a bar in a terminal or notebook, lines in a log, never on stdout.

A bar is drawn on stderr when stderr is a terminal (tested in a pseudo-terminal with Python's
``pty``) or a notebook's; where stderr is a pipe or a file it becomes plain lines every
``DPJAX_PROGRESS_INTERVAL`` seconds (no ``\\r`` redraws); ``--quiet``, ``progress=False`` and
``DPJAX_PROGRESS=0`` turn it off; stdout (``--json``) never sees it.  The long call is
``dpjax noise`` of a group of 8 at four target epsilons, run with ``DPJAX_PROGRESS_DELAY=0`` so
that the meter shows however fast the machine calibrates.  tqdm (the ``progress`` extra) draws the bar when installed; the
built-in bar is checked with tqdm hidden.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

import dpjax._base.progress as prog
from dpjax._base.progress import Progress, progress_enabled

# Group calibration at four targets: several rounds of root finding, each one meter update.
NOISE = [sys.executable, "-m", "dpjax", "noise", "--epsilon", "1,2,4,8", "--delta", "1e-5", "--sampling-prob", "0.01",
         "--steps", "1000", "--group-size", "8", "--json"]
BAR = "calibrate noise"


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.delenv("DPJAX_PROGRESS", raising=False)
    monkeypatch.delenv("DPJAX_PROGRESS_INTERVAL", raising=False)
    monkeypatch.delenv("DPJAX_PROGRESS_DELAY", raising=False)
    monkeypatch.setattr(prog, "_STATE", prog._ProgressState())


def _run(argv, *, stderr_tty: bool, **env_extra):
    env = {**os.environ, "DPJAX_COMPILATION_CACHE": "0", "DPJAX_PROGRESS_DELAY": "0", **env_extra}
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
    assert all(r["noise_multiplier"] > 0 for r in json.loads(out)["rows"])  # stdout is exactly the JSON


def test_lines_in_a_log_when_stderr_is_a_pipe():
    rc, out, err = _run(NOISE, stderr_tty=False, DPJAX_PROGRESS_INTERVAL="0")
    assert rc == 0, err
    lines = [line for line in err.splitlines() if line.startswith(BAR)]
    assert len(lines) >= 2 and "rounds" in lines[-1], err  # one line per interval, and the last
    assert "\r" not in err  # no redraws in a log
    assert all(r["noise_multiplier"] > 0 for r in json.loads(out)["rows"])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="pty is POSIX-only")
def test_quiet_turns_the_bar_off_in_a_terminal():
    rc, out, err = _run(NOISE + ["--quiet"], stderr_tty=True)
    assert rc == 0 and BAR not in err
    json.loads(out)


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.slow
@pytest.mark.parametrize("tty,quiet,expect_bar", [(True, False, True), (True, True, False), (False, False, True),
                                                  (False, True, False)])
def test_in_process_progress_follows_tty_and_quiet(monkeypatch, capsys, tty, quiet, expect_bar):
    # The same checks as the subprocess tests, in-process (cheap: the program is compiled once).
    from dpjax.cli.main import main

    monkeypatch.setattr(prog, "LONG_CALL_DELAY", 0.0)  # a warm call is fast: show the bar at once
    monkeypatch.setenv("DPJAX_PROGRESS_INTERVAL", "0")  # and a log line at once
    err = _FakeTerminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    argv = NOISE[3:] + (["--quiet"] if quiet else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    json.loads(out)
    assert (BAR in err.getvalue()) == expect_bar, err.getvalue()
    if not tty:
        assert "\r" not in err.getvalue()
    assert BAR not in out
    assert prog._STATE.enabled is None  # --quiet does not leak into later calls


def test_delay_environment_variable_hides_a_call_shorter_than_it(monkeypatch, capsys):
    from dpjax.cli.main import main

    monkeypatch.setenv("DPJAX_PROGRESS_INTERVAL", "0")
    monkeypatch.setenv("DPJAX_PROGRESS_DELAY", "3600")
    err = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(NOISE[3:]) == 0
    json.loads(capsys.readouterr().out)
    assert BAR not in err.getvalue()
    monkeypatch.setenv("DPJAX_PROGRESS_DELAY", "0")
    assert main(NOISE[3:]) == 0
    capsys.readouterr()
    assert BAR in err.getvalue()


def test_sweep_json_stdout_stays_clean(monkeypatch, capsys, tmp_path):
    from dpjax.cli.main import main

    monkeypatch.setenv("DPJAX_PROGRESS_INTERVAL", "0")
    rc = main(["sweep", "--noise-multiplier", "1,2", "--sampling-prob", "0.01", "--steps", "200", "--delta", "1e-5",
               "--out", str(tmp_path / "s.csv"), "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["configurations"] == 2  # exactly one JSON object on stdout
    assert "sweep:" in err and "2/2" in err and "100%" not in out and "\r" not in err
    assert err.count("2/2") == 1  # the last line is not written twice


def test_python_argument_delay_and_environment(monkeypatch):
    stream = _FakeTerminal()
    with Progress(3, "x", enabled=True, stream=stream) as bar:
        bar.update(3)
    assert "x: 100%" in stream.getvalue()
    stream = _FakeTerminal()
    with Progress(3, "x", stream=stream, delay=60.0) as bar:  # a fast call: no trace
        bar.update(3)
    assert stream.getvalue() == ""
    stream = _FakeTerminal()
    with Progress(3, "x", enabled=False, stream=stream) as bar:
        bar.update(3)
    assert stream.getvalue() == ""
    monkeypatch.setenv("DPJAX_PROGRESS", "0")
    stream = _FakeTerminal()
    with Progress(3, "x", stream=stream) as bar:
        bar.update(3)
    assert stream.getvalue() == "" and progress_enabled(None, stream) is False
    assert progress_enabled(True, stream) is True  # the call's own argument wins
    monkeypatch.delenv("DPJAX_PROGRESS")
    assert progress_enabled(None, io.StringIO()) is True  # auto: on, as lines where not a terminal


def test_log_mode_writes_lines_at_the_interval_and_a_last_line(monkeypatch):
    monkeypatch.setattr(prog, "_clock", iter([0.0] + [0.5 * i for i in range(1, 200)]).__next__)
    monkeypatch.setenv("DPJAX_PROGRESS_INTERVAL", "2")
    stream = io.StringIO()
    with Progress(20, "long", stream=stream) as bar:  # the clock advances 0.5 s per reading
        for _ in range(20):
            bar.update(1)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert all(line.startswith("long: ") for line in lines)
    assert 3 <= len(lines) < 12 and lines[-1].startswith("long: 100%") and "20/20" in lines[-1]
    stream = io.StringIO()
    with Progress(20, "short", stream=stream) as bar:  # shorter than the interval: nothing
        bar.update(20)
    assert stream.getvalue() == ""


def test_builtin_bar_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # ``import tqdm`` now raises ImportError
    stream = _FakeTerminal()
    with Progress(4, "x", stream=stream) as bar:
        bar.update(4, rmse="1.5")
    text = stream.getvalue()
    assert "x: 100%|####################| 4/4" in text and "rmse=1.5" in text and text.endswith("\n")


def test_tqdm_draws_when_installed(monkeypatch):
    tqdm = pytest.importorskip("tqdm")  # the test extra installs it; the fallback is tested above
    assert tqdm is not None
    stream = _FakeTerminal()
    with Progress(4, "x", stream=stream) as bar:
        assert bar._external is not None
        bar.update(4, rmse="1.5")
    assert "x: 100%" in stream.getvalue() and "4/4" in stream.getvalue() and "rmse=1.5" in stream.getvalue()
    prog.set_progress(backend="builtin")
    stream = _FakeTerminal()
    with Progress(4, "x", stream=stream) as bar:
        assert bar._external is None
        bar.update(4)
    assert "x: 100%|####################| 4/4" in stream.getvalue()


def test_notebook_gets_a_bar_although_its_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(prog, "in_notebook", lambda: True)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    stderr = io.StringIO()  # a kernel's stderr is not a TTY
    monkeypatch.setattr(sys, "stderr", stderr)
    with prog.progress(5, "optimize") as bar:
        assert bar.live
        bar.update(5)
    assert "\roptimize: 100%" in stderr.getvalue()


def test_pluggable_backend():
    calls = []

    class Meter:
        def __init__(self, **kwargs):
            calls.append(("init", kwargs))

        def update(self, n):
            calls.append(("update", n))

        def set_postfix(self, postfix, refresh=True):
            calls.append(("postfix", dict(postfix)))

        def close(self):
            calls.append(("close",))

    prog.set_progress(backend=Meter)
    with prog.progress(7, "sweep", unit="configs", initial=2) as bar:
        bar.update(3, rows="5")
    assert calls[0] == ("init", dict(total=7, desc="sweep", unit="configs", initial=2, delay=0.0))
    assert ("postfix", {"rows": "5"}) in calls and ("update", 3) in calls and calls[-1] == ("close",)
    with pytest.raises(ValueError, match="backend"):
        prog.set_progress(backend="fancy")


def test_one_progress_state(monkeypatch):
    from dpjax.montecarlo import core

    assert not hasattr(core, "_ACTIVE_BAR")  # the Monte Carlo bar lives in dpjax._base.progress's state
    monkeypatch.setattr(prog, "LONG_CALL_DELAY", 0.0)
    with core.progress_bar(3, "mc", enabled=True) as pb:
        assert prog._STATE.active is pb.bar
        core._tick(None)
        assert pb.bar.n == 1
    assert prog._STATE.active is None


def test_calibration_takes_a_progress_argument():
    import inspect

    from dpjax.calibration import dpsgd_noise_multiplier

    assert inspect.signature(dpsgd_noise_multiplier).parameters["progress"].default is None


def test_monte_carlo_bar_ticks_per_chunk_and_never_changes_the_numbers(monkeypatch):
    import numpy as np

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
    log = io.StringIO()  # a log: no per-chunk callbacks compiled unless asked for
    monkeypatch.setattr(sys, "stderr", log)
    from dpjax.montecarlo import core

    with core.progress_bar(8, enabled=None) as pb:
        assert pb.enabled is False
    with core.progress_bar(8, enabled=True) as pb:
        assert pb.enabled is True


class _Clock:
    """A clock the test sets (the meters read ``dpjax._base.progress._clock``; tqdm its ``_time``)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.mark.parametrize("warmup,eta", [(1, "< 7.0s]"), (0, "<03:58]")])
def test_the_eta_leaves_out_the_compiling_first_step(monkeypatch, warmup, eta):
    """A first step of 100 s (compilation) then steps of 1 s: 7 steps left take 7 s, which the
    ETA says with ``warmup=1``; averaging the first step in gives 102 s / 3 * 7 = 3:58."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    clock = _Clock()
    monkeypatch.setattr(prog, "_clock", clock)
    bar = Progress(10, "optimize", stream=_FakeTerminal(), warmup=warmup)
    assert bar._external is None
    for t in (100.0, 101.0, 102.0):
        clock.t = t
        bar.update(1)
    assert bar.line().startswith("optimize:  30%") and bar.line().endswith(f"[01:42{eta}"), bar.line()
    bar.close()


def test_tqdm_eta_leaves_out_the_compiling_first_step(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    clock = _Clock()
    monkeypatch.setattr(prog, "_clock", clock)
    monkeypatch.setattr(tqdm.std, "time", clock)  # tqdm reads its clock from there at construction
    bar = Progress(10, "optimize", stream=_FakeTerminal(), warmup=1)
    ext = bar._external
    assert ext is not None
    for t in (100.0, 101.0, 102.0):
        clock.t = t
        bar.update(1)
    d = ext.format_dict
    # The rate counts the two steps after the compiling one: 1 step/s, 7 steps left.
    assert (d["n"], d["initial"], d["elapsed"]) == (3, 1, 2.0)
    assert "<00:07" in str(ext), str(ext)
    bar.close()


def test_elapsed_meter_shows_a_call_of_unknown_length(monkeypatch):
    """The certificate's meter: the seconds elapsed, redrawn by a thread, lines in a log."""
    import time

    monkeypatch.setenv("DPJAX_PROGRESS_INTERVAL", "0")
    monkeypatch.setenv("DPJAX_PROGRESS_DELAY", "0")
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with prog.elapsed_meter("certify", enabled=True, interval=0.02):
        time.sleep(0.2)
    lines = err.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("certify: ") and line.endswith("s elapsed") for line in lines)
    err.truncate(0)
    with prog.elapsed_meter("certify", enabled=False, interval=0.02):
        time.sleep(0.05)
    assert err.getvalue() == ""
