"""dpjax.sweep: rows equal to single calls (bucket slack stated), inside their brackets, never below
the exact Gaussian oracle at q = 1; 8 fake devices = 1 device; kill -9 + resume; the CLI."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax.cli.main import main
from dpjax.cli.sweep import parse_values

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: The bucket slack (dpjax.pld.sweeping docstring): padding the single-step support length and
#: the kept frequencies to the bucket's largest only moves the truncation / wrap-around terms,
#: which together stay below tail_fraction * delta = 1e-6 delta; stated as 1e-6 relative in epsilon.
SLACK = 1e-6
#: The sweep's own grid policy for epsilon queries (dpjax.pld.sweeping.SWEEP_OPTIONS, 1e-4 relative
#: accuracy) against dpsgd_epsilon's grids: stated as SWEEP_SLACK (1e-3 relative) in the sweep docstring.
SWEEP_SLACK = pld.sweeping.SWEEP_SLACK


def _random_configs(n, seed, t_max=3000):
    rng = np.random.default_rng(seed)
    return [dict(noise_multiplier=float(rng.uniform(0.6, 3.0)), sampling_prob=float(10 ** rng.uniform(-3, np.log10(3e-2))),
                 steps=int(10 ** rng.uniform(2, np.log10(t_max))), delta=1e-5) for _ in range(n)]


def _check_rows_against_single_calls(configs, table, slack=SWEEP_SLACK):
    """Every row within ``slack`` (relative) of the single call, and the two certified brackets
    overlap (each value is above the other's certified lower end: both contain the truth)."""
    assert len(table) == len(configs)
    worst = 0.0
    for i, (c, r) in enumerate(zip(configs, table.rows)):
        assert r["index"] == i and r["query"] == "epsilon"
        assert r["lower"] <= r["epsilon"] == r["upper"]
        res = dpjax.pld.dpsgd_accounting(c["noise_multiplier"], c["sampling_prob"], c["steps"],
                                         target_delta=c["delta"])
        # dpsgd_epsilon is dpsgd_accounting's upper end (without the lower end's program).
        single = dpjax.pld.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"])
        assert abs(single - res.epsilon) <= 1e-9 * single
        assert abs(r["epsilon"] - single) <= slack * single, (i, c, r["epsilon"], single)
        assert r["epsilon"] >= res.epsilon_lower and single >= r["lower"], (i, c, r, single, res.epsilon_lower)
        worst = max(worst, abs(r["epsilon"] - single) / single if single > 0 else 0.0)
    return worst


@pytest.mark.slow  # tens of seconds on 2 cores; the default tier keeps the delta-query, group and 8-device rows
def test_sweep_rows_equal_single_calls_and_exact_oracle():
    configs = _random_configs(6, seed=1)
    # q = 1: DP-SGD without sampling is the Gaussian mechanism, whose epsilon is exact.
    configs += [dict(noise_multiplier=s, sampling_prob=1.0, steps=t, delta=1e-5) for s, t in ((2.0, 10), (5.0, 300))]
    table = dpjax.sweep(configs)
    assert table.programs <= len({(r["n"]) for r in table.rows}) + 2   # a handful: about one per FFT length
    _check_rows_against_single_calls(configs, table)
    # With the single call's own grid policy the rows equal it up to the bucket slack.
    _check_rows_against_single_calls(configs, dpjax.sweep(configs, options=pld.GridOptions()), slack=SLACK)
    for c, r in zip(configs[-2:], table.rows[-2:]):
        exact = float(pld.gaussian_epsilon(c["delta"], np.sqrt(c["steps"]) / c["noise_multiplier"]))
        assert r["epsilon"] >= exact * (1 - 1e-12)
        assert r["lower"] <= exact * (1 + 1e-9)
        assert r["epsilon"] <= exact * 1.003


@pytest.mark.slow
def test_sweep_1000_rows_equal_single_calls():
    configs = _random_configs(1000, seed=2, t_max=30000)
    configs[::50] = [dict(c, sampling_prob=1.0) for c in configs[::50]]
    table = dpjax.sweep(configs)
    worst = _check_rows_against_single_calls(configs, table)
    print(f"1000 rows: max |sweep - dpsgd_epsilon| / dpsgd_epsilon = {worst:.3e}")
    for c, r in zip(configs, table.rows):
        if c["sampling_prob"] == 1.0:
            exact = float(pld.gaussian_epsilon(c["delta"], np.sqrt(c["steps"]) / c["noise_multiplier"]))
            assert r["epsilon"] >= exact * (1 - 1e-12)


def test_sweep_delta_query_and_grid():
    # epsilon 0.5: deltas 8.5e-3 and 1.2e-6.  (At epsilon 1.5, sigma 2 the delta is 9.2e-17: the
    # single call then runs the exponentially tilted tail pass, which the sweep does not, and the
    # sweep's sound but untilted bound is 0.2% higher; see docs/design.md section 2.4.)
    configs = pld.sweep_grid(noise_multiplier=[1.0, 2.0], sampling_prob=0.01, steps=500, epsilon=0.5)
    assert [c.noise_multiplier for c in configs] == [1.0, 2.0]
    table = dpjax.sweep(configs, with_lower=False)
    for c, r in zip(configs, table.rows):
        assert r["query"] == "delta" and r["target_epsilon"] == 0.5 and r["epsilon"] is None
        assert r["grid"] == "accountant"  # delta queries use the single call's grid
        single = pld.dpsgd_delta(c.noise_multiplier, c.sampling_prob, c.steps, 0.5)
        assert abs(r["delta"] - single) <= SLACK * single


@pytest.mark.parametrize("bad, match", [
    (dict(noise_multiplier=0.0, sampling_prob=0.1, steps=10, delta=1e-5), "noise_multiplier"),
    (dict(noise_multiplier=1.0, sampling_prob=1.5, steps=10, delta=1e-5), "sampling_prob"),
    (dict(noise_multiplier=1.0, sampling_prob=0.1, steps=0, delta=1e-5), "steps"),
    (dict(noise_multiplier=1.0, sampling_prob=0.1, steps=10, delta=1.0), "delta"),
    (dict(noise_multiplier=1.0, sampling_prob=0.1, steps=10), "exactly one of delta and epsilon"),
    (dict(noise_multiplier=1.0, sampling_prob=0.1, steps=10, delta=1e-5, sigma=2), "unknown"),
])
def test_sweep_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        dpjax.sweep([bad])


SUBPROCESS_SWEEP = r"""
import json, sys
import jax
import dpjax
configs = json.loads(sys.argv[1])
table = dpjax.sweep(configs, per_device=int(sys.argv[2]), with_lower=True)
print(json.dumps(dict(devices=len(jax.devices()), programs=table.programs,
                      rows=[[r["epsilon"], r["lower"], r["n"]] for r in table.rows])))
"""


def _subprocess_sweep(configs, devices, per_device):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SUBPROCESS_SWEEP, json.dumps(configs), str(per_device)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sweep_eight_devices_same_table():
    configs = _random_configs(6, seed=3, t_max=2000)
    one = dpjax.sweep(configs, devices=dpjax_devices()[:1])
    eight = _subprocess_sweep(configs, devices=8, per_device=1)
    assert eight["devices"] == 8
    for r, (eps, lo, n) in zip(one.rows, eight["rows"]):
        assert n == r["n"]
        assert eps == pytest.approx(r["epsilon"], rel=1e-12, abs=0)
        assert lo == pytest.approx(r["lower"], rel=1e-12, abs=0)


def dpjax_devices():
    import jax

    return jax.devices()


def _journal_rows(path):
    if not path.exists():
        return 0
    return sum(1 for line in path.read_bytes().split(b"\n") if line.strip().endswith(b"}"))


@pytest.mark.slow  # tens of seconds on 2 cores; the default tier keeps the delta-query, group and 8-device rows
def test_sweep_kill_minus_nine_and_resume(tmp_path):
    # Same-shape configurations (one program), one per chunk: rows land one by one.
    configs = [dict(noise_multiplier=float(s), sampling_prob=0.01, steps=300, delta=1e-5)
               for s in np.linspace(1.0, 2.0, 8)]
    grid = tmp_path / "configs.json"
    grid.write_text(json.dumps(configs))
    out = tmp_path / "sweep.csv"
    journal = tmp_path / "sweep.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DPJAX_COMPILATION_CACHE="0")
    cmd = [sys.executable, "-m", "dpjax", "sweep", "--grid", str(grid), "--out", str(out), "--per-device", "1",
           "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while _journal_rows(journal) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    killed_at = _journal_rows(journal)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed_at >= 2, proc.stderr.read().decode()[-2000:]
    # Resume (in-process, through the CLI): every configuration exactly once, input order.
    rc = main(["sweep", "--grid", str(grid), "--out", str(out), "--per-device", "4", "--resume", "--json"])
    assert rc == 0
    lines = out.read_text().strip().splitlines()
    header, body = lines[0].split(","), lines[1:]
    assert header[:10] == ["index", "noise_multiplier", "sampling_prob", "steps", "group_size", "target_delta",
                           "target_epsilon", "query", "epsilon", "delta"]
    assert [int(line.split(",")[0]) for line in body] == list(range(len(configs)))
    jl = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["index"] for r in jl] == list(range(len(configs)))
    resumed = [r for r in jl if r["path"] == "resumed"]
    assert len(resumed) >= min(killed_at, len(configs)) - 1 >= 1   # the rows written before the kill
    # Rows computed before and after the kill sat in buckets of different members (different
    # padding, possibly a different merged FFT length): equal up to the stated sweep slack.
    fresh = dpjax.sweep(configs)
    for r, f in zip(jl, fresh.rows):
        assert r["epsilon"] == pytest.approx(f["epsilon"], rel=SWEEP_SLACK, abs=0)


def test_parse_values():
    assert parse_values("x", "1,2.5") == [1.0, 2.5]
    assert parse_values("x", "0.5:4:8") == pytest.approx(list(np.linspace(0.5, 4, 8)))
    assert parse_values("x", "1e-3:1e-1:3:log") == pytest.approx([1e-3, 1e-2, 1e-1])
    assert parse_values("steps", "1000,10000", integer=True) == [1000, 10000]
    for bad in ("", "1:2", "a,b", "1:2:3:cubic", "0:1:3:log"):
        with pytest.raises(ValueError):
            parse_values("x", bad)


@pytest.mark.slow  # tens of seconds on 2 cores; the default tier keeps the delta-query, group and 8-device rows
def test_cli_sweep_grid_values(capsys, tmp_path):
    out = tmp_path / "s.csv"
    rc = main(["sweep", "--noise-multiplier", "1:2:2", "--sampling-prob", "0.01", "--steps", "300",
               "--delta", "1e-5", "--out", str(out), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["configurations"] == 2
    rows = out.read_text().strip().splitlines()
    assert len(rows) == 3 and rows[1].split(",")[1] == "1.0"
    rc = main(["sweep", "--noise-multiplier", "1", "--sampling-prob", "2", "--steps", "300", "--delta", "1e-5"])
    err = capsys.readouterr().err
    assert rc == 2 and "sampling_prob" in err and "Traceback" not in err
    rc = main(["sweep", "--grid", str(tmp_path / "missing.json")])
    assert rc == 2


def test_sweep_group_size_equals_group_epsilon():
    table = dpjax.sweep([dict(noise_multiplier=2.0, sampling_prob=0.01, steps=200, delta=1e-5, group_size=4)],
                        with_lower=False)
    single = dpjax.group_epsilon(2.0, 0.01, 200, 1e-5, group_size=4)
    assert table.rows[0]["group_size"] == 4
    assert abs(table.rows[0]["epsilon"] - single) <= SWEEP_SLACK * single
