"""Per-step time of the correlation-matrix optimisation, two revisions side by side.

Each repeat runs one fresh process per revision, alternating (base, after, after, base, ...).
A process imports that revision's dpjax (the revision's directory first on ``PYTHONPATH``, as
:mod:`bench_first_call_ab` does), runs one optimisation step to compile and warm up, then the
timed optimisation of ``--steps`` steps with certification off; ``per_step_s`` is its wall time
divided by the steps.  Both revisions run the same problem (BLT with ``--buffers`` buffers,
``E`` epochs of ``b`` batches, eps 1, delta 1e-5, the default in-loop estimator and sample
count, key 0), each through its own spelling of :func:`dpjax.optimization.optimize_correlation`
(keywords before the problem records, the records after), and the final RMSE estimates of the
two are printed so that a per-step difference is one of the same work.

Run::

    python benchmarks/bench_optimize_ab.py --base 66fc150 --repeat 3 --out benchmarks/results/bench_optimize_ab_66fc150.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_first_call_ab import resolve  # noqa: E402

CHILD = """
import inspect, json, time
import dpjax
from dpjax.optimization import make_parameterization, optimize_correlation
E, b, steps, buffers = {epochs}, {b}, {steps}, {buffers}
par = make_parameterization("blt", n=E * b, num_buffers=buffers)
if "problem" in inspect.signature(optimize_correlation).parameters:
    from dpjax.optimization import CorrelationProblem, OptimizerSettings
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(b), epochs=E, target_epsilon=1.0, target_delta=1e-5)
    run = lambda k: optimize_correlation(par, problem, OptimizerSettings(num_steps=k), certify=False, progress=False)
else:
    run = lambda k: optimize_correlation(par, batches_per_epoch=b, epochs=E, target_epsilon=1.0, target_delta=1e-5,
                                         num_steps=k, certify=False, progress=False)
t = time.perf_counter()
run(1)
warm = time.perf_counter() - t
t, c = time.perf_counter(), time.process_time()
res = run(steps)
wall, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps(dict(warmup_s=warm, total_s=wall, per_step_s=wall / steps, per_step_cpu_s=cpu / steps,
                      final_rmse_estimate=float(res.rmse_estimate), dpjax_file=dpjax.__file__)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision or directory of the base")
    ap.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="git revision or directory (default: this working tree)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batches", type=int, default=32)
    ap.add_argument("--buffers", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sides = {"base": resolve(args.base), "after": resolve(args.after)}
    code = CHILD.format(epochs=args.epochs, b=args.batches, steps=args.steps, buffers=args.buffers)
    rows = []
    for rep in range(args.repeat):
        order = ("base", "after") if rep % 2 == 0 else ("after", "base")
        for side in order:
            directory, label = sides[side]
            env = dict(os.environ, PYTHONPATH=directory, JAX_ENABLE_X64="0", DPJAX_COMPILATION_CACHE="0")
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], cwd=directory, env=env, capture_output=True,
                                 text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if not row["dpjax_file"].startswith(directory):
                raise RuntimeError(f"{side} imported {row['dpjax_file']}, not the revision in {directory}")
            row.update(side=side, revision=label, rep=rep, process_wall_s=time.perf_counter() - t,
                       load1=os.getloadavg()[0])
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for side in ("base", "after"):
        per = [r["per_step_s"] for r in rows if r["side"] == side]
        summary[side] = dict(per_step_s_median=statistics.median(per), per_step_s_min=min(per),
                             per_step_s_max=max(per),
                             final_rmse_estimate=[r["final_rmse_estimate"] for r in rows if r["side"] == side])
    summary["base_over_after"] = [b["per_step_s"] / a["per_step_s"] for b, a in zip(
        [r for r in rows if r["side"] == "base"], [r for r in rows if r["side"] == "after"])]
    result = dict(benchmark="bench_optimize_ab", revisions={k: v[1] for k, v in sides.items()},
                  problem=dict(family="blt", buffers=args.buffers, epochs=args.epochs, batches_per_epoch=args.batches,
                               target_epsilon=1.0, target_delta=1e-5, steps=args.steps),
                  cpu_count=os.cpu_count(), machine=platform.platform(), rows=rows, summary=summary)
    for side in ("base", "after"):
        s = summary[side]
        print(f"{side:6s} {sides[side][1][:60]:60s} per step {s['per_step_s_median'] * 1e3:8.1f} ms "
              f"[{s['per_step_s_min'] * 1e3:.1f}-{s['per_step_s_max'] * 1e3:.1f}]")
    print("base / after per repeat:", " ".join(f"{x:.2f}" for x in summary["base_over_after"]))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
