"""First-call machinery: the host twins of the Gaussian closed form, single queries that compile
nothing (the PLD program on the host), and the CLI's serialized sweep programs.  Timings live in
benchmarks/bench_session.py and bench_first_call.py; these tests check that the shortcuts give the
same numbers as the paths they replace."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax.numerics import exact

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _jitted_epsilon(delta, mu):
    with jax.enable_x64(True):
        return np.asarray(exact._gaussian_epsilon(jnp.asarray(delta, jnp.float64), jnp.asarray(mu, jnp.float64)))


def test_host_gaussian_epsilon_matches_jitted():
    # 300 random (delta, mu) with delta down to 1e-300 and mu in [0.01, 1000]: the host bisection
    # (Python floats, a port of jax's log_ndtr) and the compiled one agree to 1e-12 relative
    # (measured max 3e-13 on 3000 points), and agree exactly on which answers are 0 or inf.
    rng = np.random.default_rng(11)
    delta = 10.0 ** rng.uniform(-300, -0.05, 300)
    mu = 10.0 ** rng.uniform(-2, 3, 300)
    host = exact.host_gaussian_epsilon(delta, mu)
    jitted = _jitted_epsilon(delta, mu)
    assert np.array_equal(host == 0, jitted == 0) and np.array_equal(np.isinf(host), np.isinf(jitted))
    fin = np.isfinite(jitted) & (jitted > 0)
    assert fin.sum() > 200
    np.testing.assert_allclose(host[fin], jitted[fin], rtol=1e-12, atol=0)


def test_host_log_ndtr_matches_jax():
    x = np.concatenate([-np.geomspace(1e-3, 1e3, 400)[::-1], [0.0], np.geomspace(1e-3, 40.0, 400)])
    with jax.enable_x64(True):
        ref = np.asarray(jax.scipy.special.log_ndtr(jnp.asarray(x, jnp.float64)))
    host = np.array([exact.py_log_ndtr(float(v)) for v in x])
    # Absolute agreement: log_ndtr is ~-5e5 at x = -1e3 (ulp 1e-10) and ~-1e-15 near x = 8.
    np.testing.assert_allclose(host, ref, rtol=1e-13, atol=1e-14)


def test_public_gaussian_functions_concrete_and_traced():
    # Concrete scalars take the host path (float64 jax.Array, no compile); grad takes the jitted
    # implicit-function path; both give the same value.
    e = dpjax.pld.gaussian_epsilon(1e-5, 0.5)
    assert isinstance(e, jax.Array) and e.dtype == jnp.float64
    np.testing.assert_allclose(float(e), float(_jitted_epsilon(1e-5, 0.5)), rtol=1e-12)
    d = float(dpjax.pld.gaussian_delta(float(e), 0.5))
    assert d <= 1e-5
    g = jax.grad(lambda m: dpjax.pld.gaussian_epsilon(1e-5, m))(0.5)
    assert np.isfinite(float(g)) and float(g) > 0


def _compile_events(calls):
    """The JAX compile events while ``calls`` run (a listener on jax.monitoring)."""
    events, active = [], [True]

    def listener(name, secs, **kwargs):
        if active[0] and name.startswith("/jax/core/compile/"):
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for call in calls:
            call()
    finally:
        active[0] = False
    return events


def test_single_queries_compile_nothing():
    # Every one-configuration query runs the PLD program on the host (NumPy): new noise
    # multipliers, sampling probabilities, step counts, deltas, epsilon and delta queries, group
    # privacy and fixed batches, first calls included, compile no XLA program.
    rng = np.random.default_rng(5)
    calls = []
    for _ in range(6):
        s, q = float(rng.uniform(0.7, 3.0)), float(10 ** rng.uniform(-3.5, -1))
        t, d = int(10 ** rng.uniform(2, 4)), float(10 ** rng.uniform(-8, -4))
        calls.append(lambda s=s, q=q, t=t, d=d: dpjax.dpsgd_epsilon(s, q, t, d))
        calls.append(lambda s=s, q=q, t=t: dpjax.dpsgd_delta(s, q, t, 1.5))
    calls.append(lambda: dpjax.dpsgd_epsilon(2.0, 0.01, 300, 1e-5, group_size=3))
    calls.append(lambda: dpjax.dpsgd_epsilon(2.0, None, 300, 1e-5, group_size=2, sampling=dpjax.FixedBatch(100, 10_000)))
    calls.append(lambda: dpjax.pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-5))
    assert _compile_events(calls) == []


def test_warm_eager_calls_from_float32_code_trace_nothing():
    # Eager calls with x64 off (as users call): after the first, no tracing, no lowering and no
    # compile (the float64 scope and the jit caches serve them); the listener does see the
    # compile events of a new function, so it would see these.
    assert not jax.config.jax_enable_x64
    events, active = [], [False]

    def listener(name, secs, **kwargs):
        if active[0] and name.startswith("/jax/core/compile/"):
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    calls = [lambda: dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5),
             lambda: dpjax.dpsgd_epsilon(noise_schedule=np.repeat([1.2, 1.0, 0.8], [300, 400, 300]),
                                         sampling_prob=0.01, target_delta=1e-5),
             lambda: dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0)]
    try:
        for call in calls:
            first = call()
            active[0] = True
            assert call() == first and call() == first
            active[0] = False
        assert events == []
        active[0] = True
        jax.jit(lambda x: x * 3.0 + 1.0)(2.0)
        assert any("compile" in e for e in events)
    finally:
        active[0] = False


def _cli(argv, cache):
    env = {**os.environ, "DPJAX_COMPILATION_CACHE": str(cache), "DPJAX_PROGRESS": "0",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "dpjax", *argv], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_cli_single_query_compiles_nothing(tmp_path):
    # With the persistent cache on (every CLI run), anything compiled would be written there:
    # a one-configuration query writes nothing, and answers what the library answers.
    argv = ["delta", "--noise-multiplier", "1.0", "--sampling-prob", "0.01", "--steps", "1000", "--epsilon", "2",
            "--json"]
    first = _cli(argv, tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert first["delta"] == dpjax.pld.dpsgd_accounting(1.0, 0.01, 1000, target_epsilon=2.0).delta
    assert _cli(argv, "0") == first


@pytest.mark.slow
def test_cli_sweep_second_run_loads_serialized_programs(tmp_path):
    # The sweep's bucket programs (shard_map over the configuration axis) go through the same
    # serialized-program path: the second process skips tracing and compiling, same table.
    pytest.importorskip("flatbuffers")
    argv = ["sweep", "--noise-multiplier", "0.8,2", "--sampling-prob", "1e-3,1e-2", "--steps", "1000",
            "--delta", "1e-5", "--backend", "compiled", "--json"]
    table = lambda out: [(r["epsilon"], r["lower"], r["n"], r["dx"]) for r in out["table"]]
    direct = table(_cli(argv, "0"))
    assert table(_cli(argv, tmp_path)) == direct
    artifacts = sorted(tmp_path.glob("sweep_*.xla"))
    assert len(artifacts) >= 1
    stamps = [a.stat().st_mtime_ns for a in artifacts]
    assert table(_cli(argv, tmp_path)) == direct                 # loaded, not recompiled
    assert [a.stat().st_mtime_ns for a in artifacts] == stamps
    artifacts[0].write_bytes(b"not a program")                   # unreadable: recompiled, same table
    assert table(_cli(argv, tmp_path)) == direct
