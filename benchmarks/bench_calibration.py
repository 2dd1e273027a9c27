"""DP-SGD noise calibration: dpjax (batched, one call) vs dp_accounting's calibrate_dp_mechanism.

One run, same machine, same process:

* dpjax ``dpsgd_noise_multiplier`` on a batch of 256 (q, eps) targets (T = 1000, delta = 1e-5)
  in ONE call: cold = first call (grid planning + trace + compile + run), steady = median of
  later calls with the same shapes; per calibration = steady / 256.
* dp_accounting 0.6.0 ``calibrate_dp_mechanism`` (PLDAccountant, default 1e-4 value
  discretization, Brent with an explicit bracket [0.5, 2] x our answer, tol 1e-6) on 2 of those
  configurations only (each takes seconds), timed once after a warm-up.

The values are compared on those two configurations (relative difference; dp_accounting at
1e-4 is itself off by up to ~1e-3 relative, see shared/reference/README.md).

Run:  python benchmarks/bench_calibration.py [--quick]
Writes benchmarks/results/bench_calibration.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS = 1000
DELTA = 1e-5
ANCHOR_CONFIGS = [(0.01, 2.0), (0.02, 4.0)]  # (q, eps) also inside the batch


def batch_targets(size: int):
    side = int(round(size ** 0.5))
    qs = np.geomspace(0.01, 0.04, side)
    qs = np.unique(np.concatenate([qs, [q for q, _ in ANCHOR_CONFIGS]]))[:side]
    epss = np.unique(np.concatenate([np.geomspace(1.0, 8.0, side), [e for _, e in ANCHOR_CONFIGS]]))[:side]
    q, eps = np.meshgrid(qs, epss, indexing="ij")
    return q.ravel(), eps.ravel()


def bench_dpjax(q, eps, repeats: int):
    import dpjax

    t0 = time.perf_counter()
    sigma = dpjax.dpsgd_noise_multiplier(q, STEPS, eps, DELTA)
    cold = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        again = dpjax.dpsgd_noise_multiplier(q, STEPS, eps, DELTA)
        runs.append(time.perf_counter() - t0)
    assert np.array_equal(sigma, again)
    return np.asarray(sigma), cold, statistics.median(runs), runs


def bench_dp_accounting(q, eps, sigma_guess):
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    def make_event(s):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), STEPS)

    def run():
        return dp_accounting.calibrate_dp_mechanism(
            lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4),
            make_event, eps, DELTA,
            bracket_interval=dp_accounting.ExplicitBracketInterval(0.5 * sigma_guess, 2.0 * sigma_guess),
            tol=1e-6)

    run()  # warm-up (imports, caches)
    t0 = time.perf_counter()
    sigma = run()
    return float(sigma), time.perf_counter() - t0


def main():
    from _meta import run_metadata

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="64 targets, 1 repeat, 1 anchor config")
    args = parser.parse_args()
    size = 64 if args.quick else 256
    repeats = 1 if args.quick else 3
    anchors = ANCHOR_CONFIGS[:1] if args.quick else ANCHOR_CONFIGS

    q, eps = batch_targets(size)
    sigma, cold, steady, runs = bench_dpjax(q, eps, repeats)
    per_cal = steady / q.size
    rows = []
    for qa, ea in anchors:
        i = int(np.argmin(np.abs(q - qa) + np.abs(eps - ea)))
        assert abs(q[i] - qa) < 1e-12 and abs(eps[i] - ea) < 1e-12, "anchor config not in batch"
        s_dpa, t_dpa = bench_dp_accounting(qa, ea, float(sigma[i]))
        rows.append(dict(sampling_prob=qa, epsilon=ea, steps=STEPS, delta=DELTA,
                         dpjax_sigma=float(sigma[i]), dp_accounting_sigma=s_dpa,
                         relative_difference=float(sigma[i] / s_dpa - 1),
                         dp_accounting_seconds=t_dpa, dpjax_seconds_per_calibration=per_cal,
                         speedup=t_dpa / per_cal))

    mean_dpa = statistics.mean(r["dp_accounting_seconds"] for r in rows)
    result = dict(
        benchmark="bench_calibration",
        machine=dict(python=platform.python_version(), platform=platform.platform(),
                     cpu_count=os.cpu_count()),
        dpjax=dict(batch_size=int(q.size), steps=STEPS, delta=DELTA,
                   sampling_prob_range=[float(q.min()), float(q.max())],
                   epsilon_range=[float(eps.min()), float(eps.max())],
                   cold_seconds=cold, steady_seconds=steady, steady_runs=runs,
                   steady_seconds_per_calibration=per_cal,
                   compile_and_plan_seconds_estimate=cold - steady),
        dp_accounting=rows,
        speedup_steady_per_calibration=mean_dpa / per_cal,
        meta=run_metadata(__file__),
    )
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "bench_calibration.json"), "w") as f:
        json.dump(result, f, indent=2)

    print(f"dpjax dpsgd_noise_multiplier, batch of {q.size} (T={STEPS}, delta={DELTA}) in one call:")
    print(f"  cold {cold:8.2f} s   steady {steady:8.2f} s   per calibration {per_cal * 1e3:8.1f} ms")
    print(f"{'q':>6} {'eps':>5} {'dpjax sigma':>14} {'dp_acc sigma':>14} {'rel diff':>10} "
          f"{'dp_acc s':>9} {'dpjax s/cal':>11} {'speedup':>8}")
    for r in rows:
        print(f"{r['sampling_prob']:6.3g} {r['epsilon']:5.3g} {r['dpjax_sigma']:14.8f} "
              f"{r['dp_accounting_sigma']:14.8f} {r['relative_difference']:10.2e} "
              f"{r['dp_accounting_seconds']:9.2f} {r['dpjax_seconds_per_calibration']:11.4f} "
              f"{r['speedup']:8.1f}")
    print(f"steady-state speed-up per calibration: {result['speedup_steady_per_calibration']:.1f}x")


if __name__ == "__main__":
    main()
