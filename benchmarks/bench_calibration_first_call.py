"""First call of one DP-SGD calibration in a fresh process.

Each case runs in its own ``python -c`` subprocess with the persistent XLA compilation cache
off (``JAX_COMPILATION_CACHE_DIR`` and ``DPJAX_COMPILATION_CACHE`` removed from the
environment, ``jax_enable_compilation_cache`` False), so the first call pays for grid
planning, tracing and every XLA compile it needs.  Recorded per case:

* ``import_s``: ``import dpjax`` (lazy; not part of the call);
* ``first_s``: the first ``dpjax.dpsgd_noise_multiplier`` call (wall); ``cpu_first_s``: its
  CPU time (all threads; far less sensitive to other processes than wall time);
* ``second_s``: the same call again (compiled programs cached in the process);
* ``other_s``: a different target of the same kind (how much of the compile is reused);
* ``compiles``: number of XLA programs of the search compiled in the first call.

Contention: on a shared machine (the load average is printed and stored) every number,
compile time above all, is inflated by the other processes; compare runs only at a similar
load.

Run:  python benchmarks/bench_calibration_first_call.py [--repeat 1]
Writes benchmarks/results/bench_calibration_first_call.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, first target, another target of the same kind); (epsilon, delta, q, steps).
CASES = [
    ("once_refused", (0.583, 1.2296519642684441e-05, 0.003014704296372604, 514), (1.0, 1e-6, 0.005, 800)),
    ("once_loose", (0.997, 2.1438288799726377e-09, 0.011793946091293604, 57), (2.0, 1e-8, 0.02, 100)),
    ("typical", (2.0, 1e-5, 0.01, 1000), (4.0, 1e-5, 0.02, 2000)),
]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import jax
jax.config.update("jax_enable_compilation_cache", False)
import dpjax
import dpjax.calibration.pld as cal
t_import = time.perf_counter() - t0
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
c = time.process_time(); t = time.perf_counter(); s1 = dpjax.dpsgd_noise_multiplier(a[2], a[3], a[0], a[1])
first = time.perf_counter() - t; cpu_first = time.process_time() - c
compiles = cal._certified_epsilons.live_programs() if hasattr(cal, "_certified_epsilons") else None
t = time.perf_counter(); dpjax.dpsgd_noise_multiplier(a[2], a[3], a[0], a[1]); second = time.perf_counter() - t
t = time.perf_counter(); s2 = dpjax.dpsgd_noise_multiplier(b[2], b[3], b[0], b[1]); other = time.perf_counter() - t
print(json.dumps(dict(import_s=t_import, first_s=first, cpu_first_s=cpu_first, second_s=second, other_s=other,
                      compiles=compiles, sigma=s1, sigma_other=s2)))
"""


def run_case(name, a, b, root=ROOT):
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_COMPILATION_CACHE_DIR", "DPJAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    # cwd=root: `python -c` puts the working directory first on sys.path.
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(a), json.dumps(b)], env=env, cwd=root,
                         capture_output=True, text=True, check=True)
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec.update(name=name, target=a, other_target=b)
    return rec


def main():
    from _meta import run_metadata

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES))
    ap.add_argument("--baseline", default=None,
                    help="a directory holding another dpjax checkout (e.g. an earlier release), "
                         "run the same cases against it in the same run")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_calibration_first_call.json"))
    args = ap.parse_args()
    wanted = args.cases.split(",")
    rows = []
    for _ in range(args.repeat):
        for (name, a, b), (label, root) in [(c, r) for c in CASES if c[0] in wanted
                                            for r in [("this", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])]:
            load = os.getloadavg()[0]
            rec = run_case(name, a, b, root)
            rec["load_average_1min"] = load
            rec["code"] = label
            rows.append(rec)
            print(f"{label:8s} {name:18s} first {rec['first_s']:7.2f} s (cpu {rec['cpu_first_s']:6.2f} s)  second {rec['second_s']:6.2f} s  "
                  f"other {rec['other_s']:6.2f} s  compiles {rec['compiles']}  import {rec['import_s']:.2f} s  "
                  f"sigma {rec['sigma']:.6g}  load {load:.1f}", flush=True)
    res = dict(benchmark="bench_calibration_first_call", cpu_count=os.cpu_count(), platform=platform.platform(),
               python=sys.version.split()[0], note="fresh process per case, persistent compilation cache off; "
               "timings inflated by machine load (load_average_1min per row)", rows=rows,
               meta=run_metadata(__file__))
    path = args.out
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
