"""The headline functions traced: ``jax.vmap`` over 64 noise multipliers against 64 eager calls,
the first traced calls, and the single eager call's steady state against a baseline commit.

Measured (each part in fresh ``python -c`` processes, so nothing is shared between them):

* ``vmap_64``: ``jax.jit(jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5)))`` over
  ``linspace(0.9, 1.2, 64)`` (x64 on, to compare float64 values) against a Python loop of 64
  eager ``dpjax.dpsgd_epsilon`` calls.  Steady state: both warmed up first (every program
  compiled), then ``--repeat`` alternating timings of each; wall and process CPU time (the CPU
  time is far less sensitive to other processes on a shared machine).  Also the largest
  relative difference of the 64 values, and the first (compiling) call of each;
* ``first_grad``: the first ``jax.grad`` of ``dpjax.dpsgd_epsilon`` in sigma and of
  ``dpjax.dpsgd_noise_multiplier`` in epsilon (after one eager call of each, so the time is
  what tracing adds: the derivative's program), and a second gradient at another point;
* ``b1``: the eager steady state ``dpjax.dpsgd_epsilon(1, 0.01, 1000, 1e-5)`` (median of 20
  calls after 3 warm-up calls) in this checkout and in ``--baseline`` (a git commit, exported
  with ``git archive``), alternating fresh processes.

Run:  python benchmarks/bench_traced.py [--repeat 5] [--baseline COMMIT]
Writes benchmarks/results/bench_traced.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from _meta import run_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VMAP = r"""
import json, sys, time
import numpy as np, jax, jax.numpy as jnp
import dpjax
repeat = int(sys.argv[1])
sig = np.linspace(0.9, 1.2, 64)
f = jax.jit(jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5)))
def eager():
    return np.array([dpjax.dpsgd_epsilon(float(s), 0.01, 1000, 1e-5) for s in sig])
out = {}
with jax.enable_x64(True):
    x = jnp.asarray(sig)
    t = time.perf_counter(); ref = eager(); out["eager_first_s"] = time.perf_counter() - t
    t = time.perf_counter(); v = np.asarray(f(x)); out["vmap_first_s"] = time.perf_counter() - t
    out["max_rel_diff"] = float(np.max(np.abs(v / ref - 1)))
    rows = []
    for _ in range(repeat):
        c = time.process_time(); t = time.perf_counter(); eager(); te, ce = time.perf_counter() - t, time.process_time() - c
        c = time.process_time(); t = time.perf_counter(); np.asarray(f(x)); tv, cv = time.perf_counter() - t, time.process_time() - c
        rows.append(dict(eager_wall_s=te, eager_cpu_s=ce, vmap_wall_s=tv, vmap_cpu_s=cv))
    out["repeats"] = rows
print(json.dumps(out))
"""

GRAD = r"""
import json, time
import jax, dpjax
out = {}
dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)
t = time.perf_counter(); g = jax.grad(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))(1.0)
out["grad_epsilon_first_s"] = time.perf_counter() - t; out["grad_epsilon"] = float(g)
t = time.perf_counter(); jax.grad(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))(1.1)
out["grad_epsilon_second_point_s"] = time.perf_counter() - t
dpjax.dpsgd_noise_multiplier(0.01, 1000, 2.0, 1e-5)
t = time.perf_counter(); g = jax.grad(lambda e: dpjax.dpsgd_noise_multiplier(0.01, 1000, e, 1e-5))(2.0)
out["grad_noise_multiplier_first_s"] = time.perf_counter() - t; out["grad_noise_multiplier"] = float(g)
print(json.dumps(out))
"""

B1 = r"""
import json, statistics, time
import dpjax
for _ in range(3):
    dpjax.dpsgd_epsilon(1, 0.01, 1000, 1e-5)
ts = []
for _ in range(20):
    t = time.perf_counter(); dpjax.dpsgd_epsilon(1, 0.01, 1000, 1e-5); ts.append(time.perf_counter() - t)
print(json.dumps(dict(median_s=statistics.median(ts), min_s=min(ts))))
"""


def _env(path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "DPJAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = path
    return env


def _child(code, *args, path=ROOT):
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                         env=_env(path), cwd=path, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="git commit for the B1 comparison")
    ap.add_argument("--b1-pairs", type=int, default=3)
    args = ap.parse_args()
    result = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                  load_average_before=os.getloadavg())
    v = _child(VMAP, args.repeat)
    med = lambda k: statistics.median(r[k] for r in v["repeats"])
    v["median"] = {k: med(k) for k in ("eager_wall_s", "eager_cpu_s", "vmap_wall_s", "vmap_cpu_s")}
    v["speedup_wall"] = v["median"]["eager_wall_s"] / v["median"]["vmap_wall_s"]
    v["speedup_cpu"] = v["median"]["eager_cpu_s"] / v["median"]["vmap_cpu_s"]
    result["vmap_64"] = v
    print(f"vmap 64: max rel diff {v['max_rel_diff']:.2e}; steady wall {v['median']['vmap_wall_s']:.3f} s vs eager "
          f"{v['median']['eager_wall_s']:.3f} s ({v['speedup_wall']:.2f}x), CPU {v['median']['vmap_cpu_s']:.3f} vs "
          f"{v['median']['eager_cpu_s']:.3f} s ({v['speedup_cpu']:.2f}x); first {v['vmap_first_s']:.2f} s vs "
          f"{v['eager_first_s']:.2f} s")
    result["first_grad"] = g = _child(GRAD)
    print("first grad:", json.dumps(g))
    if args.baseline:
        with tempfile.TemporaryDirectory() as base:
            subprocess.run(f"git -C {ROOT} archive {args.baseline} | tar -x -C {base}", shell=True, check=True)
            pairs = []
            for _ in range(args.b1_pairs):
                pairs.append(dict(baseline=_child(B1, path=base)["median_s"], head=_child(B1)["median_s"]))
        b = dict(baseline_commit=args.baseline, pairs=pairs,
                 baseline_median_s=statistics.median(p["baseline"] for p in pairs),
                 head_median_s=statistics.median(p["head"] for p in pairs))
        b["ratio_head_over_baseline"] = b["head_median_s"] / b["baseline_median_s"]
        result["b1"] = b
        print(f"B1 steady state: head {b['head_median_s'] * 1e3:.1f} ms, baseline {b['baseline_median_s'] * 1e3:.1f} ms "
              f"(ratio {b['ratio_head_over_baseline']:.3f})")
    result["load_average_after"] = os.getloadavg()
    result["note"] = ("2-core CPU shared with other jobs (load averages before and after recorded): compare the two "
                      "rows of one run, measured alternately in one process.")
    result["meta"] = run_metadata(__file__)
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "bench_traced.json"), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
