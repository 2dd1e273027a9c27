"""One process of a multi-process run for tests/montecarlo/test_multiprocess.py (and benchmarks/bench_scaling.py).

Usage::

    python tests/montecarlo/_multiprocess_worker.py SPEC_JSON PROCESS_ID NUM_PROCESSES PORT

``NUM_PROCESSES > 1`` joins a ``jax.distributed`` run on ``127.0.0.1:PORT`` with CPU collectives
(gloo); ``NUM_PROCESSES = 1`` runs alone (``XLA_FLAGS`` may force several host devices).  The
spec names the tasks; process 0 prints one JSON line with every task's result, the floats as
``float.hex`` strings so that a comparison is bit for bit.
"""

from __future__ import annotations

import json
import sys
import time


def _hex(x) -> str:
    return float(x).hex()


def _certificate(spec):
    """A certificate of one noise multiplier (fixed seed) by both methods, and a calibration."""
    import numpy as np

    from dpjax.matrices import Toeplitz
    from dpjax.montecarlo import BallsInBins

    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), batches_per_epoch=8, epochs=4)
    n = int(spec.get("samples", 1 << 14))
    out = {}
    for method in ("importance_betting", "bernoulli_kl"):
        cert = acc.certify(2.0, 2.0, 1e-2, n, key=7, method=method)
        out[method] = {k: (_hex(v) if isinstance(v, float) else v) for k, v in cert.to_dict().items()}
    est = acc.estimate(1.3, np.array([1.0, 2.0]), n + 5, key=3)
    out["estimate"] = [_hex(x) for x in np.concatenate([est.delta_remove, est.delta_add, est.standard_error])]
    out["calibrate"] = _hex(acc.calibrate(2.0, 1e-2, n, key=5))
    if spec.get("ladder"):
        cert = acc.certify_noise(2.0, 1e-3, key=11, num_samples=1 << 16)
        out["ladder"] = {k: (_hex(v) if isinstance(v, float) else v) for k, v in cert.to_dict().items()}
    return out


def _optimization_step(spec):
    """One step of the optimization loop (SGD with rate 1, so the new parameters are the old ones
    minus the gradient) and, with ``loss``, the log-RMSE loss of :mod:`dpjax.optimization.loss`
    with its gradient (one program of the caller's: dpjax's sample sums inside it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import dpjax
    from dpjax.optimization import (CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)
    from dpjax.optimization.loss import log_rmse_balls_in_bins

    p = make_parameterization("blt", 16, num_buffers=2)
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(4), epochs=4, target_epsilon=2.0, target_delta=1e-3)
    res = optimize_correlation(p, problem, OptimizerSettings(num_steps=1, optimizer=optax.sgd(1.0), key=3),
                               certify=False, progress=False)
    out = {"history": [[_hex(h["loss"]), _hex(h["noise_multiplier"])] for h in res.history],
           "params": {k: [_hex(x) for x in np.ravel(v)] for k, v in sorted(res.params.items())},
           "estimate": _hex(res.noise_multiplier_estimate)}
    # Eight steps of the default optimizer (Adam): the optimizer's arithmetic must round the same
    # whatever program the step is compiled into (a last-bit difference shows within a few steps).
    res = optimize_correlation(p, problem, OptimizerSettings(num_steps=8, key=3), certify=False, progress=False)
    out["adam"] = {"losses": [_hex(h["loss"]) for h in res.history],
                   "params": {k: [_hex(x) for x in np.ravel(v)] for k, v in sorted(res.params.items())}}
    if not spec.get("loss"):
        return out
    with jax.enable_x64(True):
        def loss(prm):
            return log_rmse_balls_in_bins(prm, batches_per_epoch=4, epochs=4, target_epsilon=2.0, target_delta=1e-3,
                                          num_samples=1 << 11, key=jax.random.key(0))

        value, grad = jax.jit(jax.value_and_grad(loss))(jnp.array([-1.0, -2.0]))
    out["loss"] = [_hex(value)] + [_hex(g) for g in np.asarray(grad)]
    return out


def sweep_configs(count: int, seed: int = 1) -> list[dict]:
    """``count`` random DP-SGD configurations (epsilon queries)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [dict(noise_multiplier=float(s), sampling_prob=float(q), steps=int(t), delta=float(d))
            for s, q, t, d in zip(rng.uniform(0.6, 3.0, count), 10 ** rng.uniform(-3.5, -1.0, count),
                                  rng.integers(10, 3000, count), 10 ** rng.uniform(-8.0, -4.0, count))]


def _sweep(spec):
    import dpjax

    configs = sweep_configs(int(spec["configs"]), int(spec.get("seed", 1)))
    execution = dpjax.SweepExecution(backend=spec.get("backend", "auto"), per_device=spec.get("per_device"))
    table = dpjax.sweep(configs, out=spec.get("out"), resume=bool(spec.get("resume", False)), progress=False,
                        execution=execution)
    fields = ("epsilon", "lower", "upper", "n", "dx", "grid")
    return {"rows": [[(_hex(r[f]) if isinstance(r[f], float) else r[f]) for f in fields] for r in table.rows],
            "paths": [r["path"] for r in table.rows], "programs": table.programs}


def _samples_per_second(spec):
    """Monte Carlo throughput: plain hockey-stick sums over every device (Choquette-Choo et al.'s
    sampler, b = 128), the median of ``repeats`` timed calls after a warm-up call."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpjax.montecarlo import gram_from_columns, sharded_monte_carlo_sums

    import resource

    b, epochs, m = int(spec.get("b", 128)), int(spec.get("epochs", 16)), int(spec["samples"])
    with jax.enable_x64(True):
        gram = gram_from_columns(jnp.asarray(0.7 ** np.arange(8)), b, epochs)
        key = jax.random.key(0)
        times, cpu = [], []
        for _ in range(int(spec.get("repeats", 3)) + 1):
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            sums = sharded_monte_carlo_sums(gram, 4.0, jnp.array([2.0]), key, m)
            jax.block_until_ready(sums)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            times.append(time.perf_counter() - t0)
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    seconds = float(np.median(times[1:]))
    # CPU seconds of this process (process 0) per timed call: how many cores it kept busy.
    return {"seconds": seconds, "samples_per_second": m / seconds, "first_call_seconds": times[0],
            "cpu_seconds": float(np.median(cpu[1:])), "total": _hex(np.asarray(sums.total)[0, 0])}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the coordinator binds it next)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(spec: dict, num_processes: int = 1, *, host_devices: int | None = None, timeout: float = 600.0,
           env: dict | None = None) -> dict:
    """Run ``spec`` in ``num_processes`` fresh processes (``jax.distributed`` on localhost when more
    than one; ``host_devices`` forces that many CPU devices in each) and return process 0's result.

    Every process is waited for within ``timeout`` seconds and killed if it is still running then
    (or if another failed), so no worker outlives the call; a failure raises ``RuntimeError`` with
    the end of every process's stderr."""
    import os
    import subprocess
    import tempfile

    env = dict(os.environ if env is None else env, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    # Compile in each run: no program store shared with the user's processes (or between runs).
    env.setdefault("DPJAX_COMPILATION_CACHE", "0")
    if host_devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={host_devices}"
    port = free_port()
    procs, logs = [], []
    try:
        for pid in range(num_processes):
            log = tempfile.TemporaryFile()
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, __file__, json.dumps(spec), str(pid), str(num_processes),
                                           str(port)], stdout=subprocess.PIPE if pid == 0 else subprocess.DEVNULL,
                                          stderr=log, env=env))
        deadline = time.monotonic() + timeout
        stdout = procs[0].communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if codes is None or any(codes):
        tails = []
        for pid, log in enumerate(logs):
            log.seek(0)
            tails.append(f"--- process {pid} (exit {procs[pid].returncode}):\n"
                         + log.read().decode("utf-8", "replace")[-3000:])
            log.close()
        why = "timed out" if codes is None else f"exit codes {codes}"
        raise RuntimeError(f"{num_processes}-process run {why}\n" + "\n".join(tails))
    for log in logs:
        log.close()
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("process 0 printed no result")


TASKS = {"certificate": _certificate, "optimization_step": _optimization_step, "sweep": _sweep,
         "samples_per_second": _samples_per_second}


def main(argv) -> int:
    spec = json.loads(argv[1])
    process_id, num_processes, port = int(argv[2]), int(argv[3]), int(argv[4])
    import jax

    # CPU collectives between processes (gloo; the default of recent JAX, set for older ones).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                                   process_id=process_id)
    out = {"processes": jax.process_count(), "devices": len(jax.devices())}
    for name, task in spec["tasks"]:
        t0 = time.perf_counter()
        out[name] = task_out = TASKS[task](spec.get(name, {}))
        task_out["seconds_total"] = time.perf_counter() - t0
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
