"""Runs over several processes (``jax.distributed`` on localhost, CPU collectives) and several
devices give the one-process numbers, bit for bit (docs/design.md §14).

Each run is a set of fresh processes started by ``tests/montecarlo/_multiprocess_worker.py`` (its
``launch`` waits for them within a timeout and kills whatever is left, whatever happens), which
prints every float as ``float.hex``: the comparisons below are exact.

* Monte Carlo: a certificate of one noise multiplier (fixed seed) by both methods, a delta
  estimate and a calibration; the draws of a sample depend on the seed and its global index only,
  and the chunk sums are added in one order on every layout.
* The optimization loop: one step's estimate of the noise multiplier, its loss, and the new
  parameters of an SGD step of rate 1 (the old ones minus the gradient); the losses and
  parameters of eight steps of the default optimizer (Adam); in the slow tier also the log-RMSE
  loss of ``dpjax.optimization.loss`` and its gradient.
* Sweeps: the rows, and a sweep resumed from a journal that a killed run left behind (process 0
  writes the result file; every configuration appears once).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _multiprocess_worker as worker  # noqa: E402

MONTE_CARLO = [["certificate", "certificate"], ["optimization_step", "optimization_step"]]


def _strip(result: dict) -> dict:
    """A run's task results without their timings."""
    return {name: {k: v for k, v in out.items() if k != "seconds_total"}
            for name, out in result.items() if isinstance(out, dict)}


def _journal_lines(path: pathlib.Path) -> list[bytes]:
    return [line for line in path.read_bytes().split(b"\n") if line.strip()] if path.exists() else []


def _partial_journal(reference: pathlib.Path, target: pathlib.Path, keep: int) -> None:
    """What a sweep killed after ``keep`` rows leaves: those rows and half of the next line."""
    lines = _journal_lines(reference)
    target.write_bytes(b"\n".join(lines[:keep]) + b"\n" + lines[keep][: len(lines[keep]) // 2])


SMALL = {"tasks": MONTE_CARLO + [["sweep", "sweep"]], "certificate": {"samples": 1 << 13}, "sweep": {"configs": 24}}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The small tasks in one process of one device (the reference), its sweep written to a file."""
    out = tmp_path_factory.mktemp("one") / "one.csv"
    result = worker.launch(dict(SMALL, sweep=dict(SMALL["sweep"], out=str(out))), 1, timeout=600)
    assert result["processes"] == 1 and result["devices"] == 1
    return result, out


@pytest.mark.slow
def test_two_processes_give_the_one_process_numbers(one_process, tmp_path):
    one, one_csv = one_process
    two_csv = tmp_path / "two.csv"
    # The two processes resume from a journal cut after 7 rows and in the middle of the 8th.
    _partial_journal(one_csv.with_suffix(".jsonl"), two_csv.with_suffix(".jsonl"), keep=7)
    two = worker.launch(dict(SMALL, sweep=dict(SMALL["sweep"], out=str(two_csv), resume=True)), 2, timeout=600)
    assert two["processes"] == 2 and two["devices"] == 2
    a, b = _strip(one), _strip(two)
    assert a["certificate"]["importance_betting"]["verified"] and a["certificate"]["bernoulli_kl"]["verified"]
    assert a["certificate"] == b["certificate"]
    assert a["optimization_step"] == b["optimization_step"]
    assert a["sweep"]["rows"] == b["sweep"]["rows"]
    assert b["sweep"]["paths"][:7] == ["resumed"] * 7 and "resumed" not in b["sweep"]["paths"][7:]
    # Process 0 alone wrote the result: every configuration once, in input order, with the
    # values one process writes.
    count = SMALL["sweep"]["configs"]
    rows = [json.loads(line) for line in _journal_lines(two_csv.with_suffix(".jsonl"))]
    assert [r["index"] for r in rows] == list(range(count))
    reference = [json.loads(line) for line in _journal_lines(one_csv.with_suffix(".jsonl"))]
    fields = ("epsilon", "lower", "upper", "n", "dx", "grid")
    assert [[r[f] for f in fields] for r in rows] == [[r[f] for f in fields] for r in reference]
    assert len(two_csv.read_text().splitlines()) == count + 1   # a header and one line each


def _one_device_certificate(spec: dict) -> dict:
    """The worker's certificate task on one device of one process, x64 off: run in this process
    when it is such a process (the worker's function, so the same programs and bits as a fresh
    worker process), else in a fresh worker process."""
    import jax

    if jax.process_count() == 1 and jax.device_count() == 1 and not jax.config.jax_enable_x64:
        return worker.TASKS["certificate"](spec["certificate"])
    one = worker.launch(spec, 1, timeout=600)
    assert one["devices"] == 1
    return _strip(one)["certificate"]


def test_eight_host_devices_give_the_one_process_certificate():
    # The optimization step on eight devices is in the slow tier (its compiles double this test);
    # the reference is the certificate alone in one process of one device.  2^14 samples: the
    # sample count of tests/montecarlo/test_evr.py's certificates of the same accountant, whose
    # compiled sums the reference shares.
    spec = {"tasks": MONTE_CARLO[:1], "certificate": {"samples": 1 << 14}}
    one = _one_device_certificate(spec)
    eight = worker.launch(spec, 1, host_devices=8, timeout=600)
    assert eight["devices"] == 8
    assert one["importance_betting"]["verified"]
    assert _strip(eight)["certificate"] == one


@pytest.mark.slow  # three runs of a 1,000-configuration sweep, a certificate ladder and the loss's gradient
def test_thousand_configuration_sweep_and_ladder_certificate_on_every_layout():
    spec = {"tasks": [["certificate", "certificate"], ["optimization_step", "optimization_step"], ["sweep", "sweep"]],
            "certificate": {"samples": 1 << 14, "ladder": True}, "optimization_step": {"loss": True},
            "sweep": {"configs": 1000, "seed": 2}}
    one = _strip(worker.launch(spec, 1, timeout=1800))
    two = _strip(worker.launch(spec, 2, timeout=1800))
    assert len(one["sweep"]["rows"]) == 1000
    assert two["sweep"] == one["sweep"]
    assert two["certificate"] == one["certificate"]
    assert two["optimization_step"] == one["optimization_step"]
    assert one["certificate"]["ladder"]["verified"] and "loss" in one["optimization_step"]
    spec = {"tasks": spec["tasks"][:2], "certificate": spec["certificate"], "optimization_step": {"loss": True}}
    eight = _strip(worker.launch(spec, 1, host_devices=8, timeout=1800))
    assert eight == {name: one[name] for name in ("certificate", "optimization_step")}


@pytest.mark.slow  # compiles the bucket programs in every process
def test_compiled_sweep_two_processes_equals_one_process():
    spec = {"tasks": [["sweep", "sweep"]], "sweep": {"configs": 200, "seed": 3, "backend": "compiled"}}
    one = _strip(worker.launch(spec, 1, timeout=1800))
    two = _strip(worker.launch(spec, 2, timeout=1800))
    assert one["sweep"]["rows"] == two["sweep"]["rows"]
    assert set(two["sweep"]["paths"]) <= {"batched", "single", "exact"}


@pytest.mark.slow  # a sweep killed with SIGKILL in both processes, then resumed
def test_killed_two_process_sweep_resumes(tmp_path):
    count = 400
    reference = _strip(worker.launch({"tasks": [["sweep", "sweep"]], "sweep": {"configs": count, "seed": 4}}, 1,
                                     timeout=1800))["sweep"]
    out = tmp_path / "sweep.csv"
    journal = out.with_suffix(".jsonl")
    spec = {"tasks": [["sweep", "sweep"]], "sweep": {"configs": count, "seed": 4, "out": str(out), "resume": True}}
    env = dict(os.environ, JAX_PLATFORMS="cpu", DPJAX_COMPILATION_CACHE="0")
    env.pop("XLA_FLAGS", None)
    port = worker.free_port()
    procs = [subprocess.Popen([sys.executable, worker.__file__, json.dumps(spec), str(pid), "2", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env) for pid in range(2)]
    try:
        deadline = time.monotonic() + 900
        while len(_journal_lines(journal)) == 0 and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.05)
        recorded = len(_journal_lines(journal))
        for p in procs:   # the job is torn down: both processes die at once
            p.send_signal(signal.SIGKILL)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert 0 < recorded < count, recorded
    resumed = _strip(worker.launch(spec, 2, timeout=1800))["sweep"]
    assert resumed["rows"] == reference["rows"]
    assert "resumed" in resumed["paths"] and resumed["paths"].count("resumed") < count
    rows = [json.loads(line) for line in _journal_lines(journal)]
    assert [r["index"] for r in rows] == list(range(count))
