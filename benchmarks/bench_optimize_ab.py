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

``--mode program`` times the step's compiled work without the run's variation: after the
optimisation, each process calls the step function the loop calls (the private
``dpjax.optimization.loop._compiled``'s first function, in both revisions) on the arguments it
received at two steps (the middle and the last), ``--calls`` times each, blocking on each result;
it reports the minimum and the median per call and the solver passes of those steps (equal on both
sides when the two revisions do the same work).  A whole run mixes steps of different solver pass
counts and the machine's noise between processes; repeated calls on fixed arguments do not.
Where the step is several programs (a ``programs`` attribute: the parameters' side, the
calibration with and without its gradient, the update), each program is also timed on that step's
inputs, so that ``solve_with_gradient - solve`` is the cost of the gradient at the root.

Run::

    python benchmarks/bench_optimize_ab.py --base 66fc150 --repeat 3 --out benchmarks/results/bench_optimize_ab_66fc150.json
    python benchmarks/bench_optimize_ab.py --base 66fc150 --mode program --batches 8 --repeat 8 --out ...
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
mode, calls = {mode!r}, {calls}
captured, programs = [], []
if mode == "program":
    import jax
    import dpjax.optimization.loop as loop
    compiled = loop._compiled

    def spying(*a, **k):
        fns = compiled(*a, **k)
        programs.append(fns[0])

        def spy(*args):
            captured.append(args)
            return fns[0](*args)
        return (spy,) + tuple(fns[1:])
    loop._compiled = spying
t = time.perf_counter()
run(1)
warm = time.perf_counter() - t
captured.clear()
t, c = time.perf_counter(), time.process_time()
res = run(steps)
wall, cpu = time.perf_counter() - t, time.process_time() - c
row = dict(warmup_s=warm, total_s=wall, per_step_s=wall / steps, per_step_cpu_s=cpu / steps,
           final_rmse_estimate=float(res.rmse_estimate), dpjax_file=dpjax.__file__)
if mode == "program":
    jax.config.update("jax_enable_x64", True)  # the loop runs its steps in float64 too
    step, at = programs[-1], sorted({{len(captured) // 2, len(captured) - 1}})
    row["program"] = []
    for k in at:
        args = captured[k]
        passes = int(jax.device_get(step(*args)[3][2]))
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(step(*args))
            times.append(time.perf_counter() - t0)
        times.sort()
        row["program"].append(dict(step=k, solver_passes=passes, calls=calls, min_s=times[0],
                                   median_s=times[len(times) // 2]))
        progs = getattr(step, "programs", None)
        if progs is not None:  # a step of several programs: each one on this step's inputs
            params, opt_state, eps, delta, sample, step_index, sigma0, _ = args
            (gram, sqrt_gram, err), (start, proposal) = progs["prep"](params, eps, sigma0)
            solve_args = (gram, sqrt_gram, eps, delta, sample, step_index, start, proposal)
            root, _, bars = progs["solve_with_gradient"](*solve_args)
            inputs = dict(prep=(params, eps, sigma0), solve=solve_args, solve_with_gradient=solve_args,
                          update=(params, opt_state, eps, sigma0, root, err, bars))
            parts = {{}}
            for name, fn in progs.items():
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    jax.block_until_ready(fn(*inputs[name]))
                    times.append(time.perf_counter() - t0)
                times.sort()
                parts[name] = dict(min_s=times[0], median_s=times[len(times) // 2])
            row["program"][-1]["parts"] = parts
print(json.dumps(row))
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
    ap.add_argument("--mode", choices=("run", "program"), default="run",
                    help="run: wall time of the whole run per step; program: also repeated calls of the step")
    ap.add_argument("--calls", type=int, default=200, help="calls per captured step (--mode program)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sides = {"base": resolve(args.base), "after": resolve(args.after)}
    code = CHILD.format(epochs=args.epochs, b=args.batches, steps=args.steps, buffers=args.buffers,
                        mode=args.mode, calls=args.calls)
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
    if args.mode == "program":
        # Per captured step: the median over processes of each process's minimum and median call.
        for side in ("base", "after"):
            progs = [r["program"] for r in rows if r["side"] == side]
            summary[side]["program"] = [dict(
                step=p0["step"], solver_passes=sorted({p[i]["solver_passes"] for p in progs}),
                min_s_median=statistics.median(p[i]["min_s"] for p in progs),
                median_s_median=statistics.median(p[i]["median_s"] for p in progs),
                **({"parts_min_s_median": {name: statistics.median(p[i]["parts"][name]["min_s"] for p in progs)
                                           for name in p0["parts"]}} if "parts" in p0 else {}))
                for i, p0 in enumerate(progs[0])]
        summary["program_base_over_after"] = [dict(
            step=b["step"], min=b["min_s_median"] / a["min_s_median"],
            median=b["median_s_median"] / a["median_s_median"])
            for b, a in zip(summary["base"]["program"], summary["after"]["program"])]
    result = dict(benchmark="bench_optimize_ab", revisions={k: v[1] for k, v in sides.items()},
                  problem=dict(family="blt", buffers=args.buffers, epochs=args.epochs, batches_per_epoch=args.batches,
                               target_epsilon=1.0, target_delta=1e-5, steps=args.steps),
                  mode=args.mode, calls=args.calls,
                  cpu_count=os.cpu_count(), cpus_usable=sorted(os.sched_getaffinity(0)),
                  machine=platform.platform(), rows=rows, summary=summary)
    for side in ("base", "after"):
        s = summary[side]
        print(f"{side:6s} {sides[side][1][:60]:60s} per step {s['per_step_s_median'] * 1e3:8.1f} ms "
              f"[{s['per_step_s_min'] * 1e3:.1f}-{s['per_step_s_max'] * 1e3:.1f}]")
    print("base / after per repeat:", " ".join(f"{x:.2f}" for x in summary["base_over_after"]))
    for side in ("base", "after") if args.mode == "program" else ():
        for p in summary[side]["program"]:
            print(f"{side:6s} step {p['step']} ({p['solver_passes']} passes): one call min {p['min_s_median'] * 1e3:.3f}"
                  f" ms, median {p['median_s_median'] * 1e3:.3f} ms (medians over processes)")
            if "parts_min_s_median" in p:
                print("         its programs, min per call:", ", ".join(
                    f"{name} {t * 1e3:.3f} ms" for name, t in p["parts_min_s_median"].items()))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
