"""Balls-in-bins Monte Carlo accountant: dpjax vs jax_privacy's experimental monte_carlo, one run.

For each configuration (banded Toeplitz C with first column [1, 0.5, 0.25, 0.125]; sigma = 1;
eps in {1, 2, 4}) both libraries estimate delta on the same machine in the same process:

* jax_privacy 2.0.0 ``get_privacy_loss_sample(BallsInBinsSampling, ..., num_samples=N)`` (NumPy,
  a Python loop over samples; one direction, the P||Q "positive" samples), then
  ``delta_from_epsilon_and_samples`` per epsilon.  A few hundred samples, after a short warm-up.
* dpjax ``BallsInBins.estimate`` (Gram reduction, jitted, chunked; BOTH directions and all
  three epsilons from each draw).  Cold = first call (trace + compile + run); steady = median
  of 3 later calls with the same shapes; compile ~ cold - steady.

Samples per second counts one sample of (I, U) -> both directions for dpjax, one P-sample for
jax_privacy; the speed-up is the ratio of samples per second (dpjax does at least as much work
per sample).  The two estimates are compared (z-score with both standard errors).

Run:  python benchmarks/bench_montecarlo.py [--quick]
Writes benchmarks/results/bench_montecarlo.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

COLUMN = np.array([1.0, 0.5, 0.25, 0.125])
EPSILONS = np.array([1.0, 2.0, 4.0])
SIGMA = 1.0
CONFIGS = [  # (n, b, dpjax samples, jax_privacy samples)
    (64, 8, 1 << 21, 600),
    (256, 32, 1 << 20, 400),
    (2048, 128, 1 << 18, 250),
]


def bench_jax_privacy(n, b, num_samples):
    from jax_privacy import batch_selection
    from jax_privacy.experimental.monte_carlo import delta_calculation, sample_generation

    strategy = batch_selection.BallsInBinsSampling(iterations=n, cycle_length=b)
    # Warm-up (imports, first-call overheads).
    sample_generation.get_privacy_loss_sample(strategy, SIGMA, COLUMN, seed=0, num_samples=10)
    t0 = time.perf_counter()
    losses, _ = sample_generation.get_privacy_loss_sample(strategy, SIGMA, COLUMN, seed=1, positive_sample=True,
                                                          num_samples=num_samples)
    deltas = [delta_calculation.delta_from_epsilon_and_samples(float(e), losses) for e in EPSILONS]
    wall = time.perf_counter() - t0
    losses = np.asarray(losses)
    terms = np.maximum(0.0, -np.expm1(EPSILONS[None, :] - losses[:, None]))
    se = terms.std(0, ddof=1) / math.sqrt(num_samples)
    return {"num_samples": num_samples, "wall_s": wall, "us_per_sample": wall / num_samples * 1e6,
            "samples_per_s": num_samples / wall, "delta": [float(d) for d in deltas], "standard_error": se.tolist()}


def bench_dpjax(n, b, num_samples):
    from dpjax.montecarlo import BallsInBins

    acc = BallsInBins(COLUMN, batches_per_epoch=b, epochs=n // b)
    t0 = time.perf_counter()
    est = acc.estimate(SIGMA, EPSILONS, num_samples, key=0)
    cold = time.perf_counter() - t0
    steady = []
    for seed in (1, 2, 3):
        t0 = time.perf_counter()
        acc.estimate(SIGMA, EPSILONS, num_samples, key=seed)
        steady.append(time.perf_counter() - t0)
    wall = statistics.median(steady)
    return {"num_samples": num_samples, "cold_s": cold, "steady_s": wall, "compile_s_approx": max(cold - wall, 0.0),
            "steady_runs_s": steady, "us_per_sample": wall / num_samples * 1e6, "samples_per_s": num_samples / wall,
            "delta_remove": est.delta_remove.tolist(), "se_remove": est.se_remove.tolist(),
            "delta_add": est.delta_add.tolist(), "delta": est.delta.tolist()}


def main(argv=None):
    from _meta import run_metadata

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4x fewer samples for both libraries")
    args = parser.parse_args(argv)
    import jax

    rows = []
    for n, b, m_ours, m_jp in CONFIGS:
        if args.quick:
            m_ours, m_jp = m_ours // 4, max(m_jp // 4, 50)
        jp = bench_jax_privacy(n, b, m_jp)
        ours = bench_dpjax(n, b, m_ours)
        z = [(o - j) / math.sqrt(so**2 + sj**2) for o, so, j, sj in
             zip(ours["delta_remove"], ours["se_remove"], jp["delta"], jp["standard_error"])]
        rows.append({"n": n, "b": b, "epochs": n // b, "jax_privacy": jp, "dpjax": ours,
                     "speedup_samples_per_s": ours["samples_per_s"] / jp["samples_per_s"], "z_remove_vs_jax_privacy": z})

    header = (f"{'n':>5} {'b':>4} | {'jax_privacy us/sample':>21} | {'dpjax us/sample':>15} {'cold s':>7} "
              f"{'compile s':>9} | {'speed-up':>8} | z (eps=1,2,4)")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['n']:>5} {r['b']:>4} | {r['jax_privacy']['us_per_sample']:>21.1f} | {r['dpjax']['us_per_sample']:>15.3f} "
              f"{r['dpjax']['cold_s']:>7.2f} {r['dpjax']['compile_s_approx']:>9.2f} | {r['speedup_samples_per_s']:>7.0f}x | "
              + ", ".join(f"{v:+.2f}" for v in r["z_remove_vs_jax_privacy"]))
    out = {
        "benchmark": "bench_montecarlo",
        "description": __doc__,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
                    "loadavg_at_end": list(os.getloadavg())},
        "matrix_first_column": COLUMN.tolist(), "noise_multiplier": SIGMA, "epsilons": EPSILONS.tolist(),
        "results": rows,
        "meta": run_metadata(__file__, argv),
    }
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    path = os.path.join(ROOT, "benchmarks", "results", "bench_montecarlo.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
