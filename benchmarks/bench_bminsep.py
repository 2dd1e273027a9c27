"""b-min-sep Monte Carlo sampler: dpjax vs jax_privacy's NumPy sample generation, one run.

Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep Subsampling" (arXiv 2602.09338).
For each configuration (banded Toeplitz C with first column [1, 0.5, 0.25, 0.125], warm start,
sigma = 1, eps = 1) both libraries draw privacy-loss samples on the same machine in the same
process:

* jax_privacy ``sample_generation.get_privacy_loss_sample(BMinSepSampling, ...,
  num_samples=N)`` (NumPy: geometric gaps for the participation, FFT correlation, a Python loop
  over rounds vectorised over samples), once with ``positive_sample=True`` (remove direction) and
  once with ``False`` (add direction), after a short warm-up.  Its rate is given per direction
  and per sample of both directions (the two calls together).
* dpjax ``BMinSep.estimate`` (jitted ``lax.scan`` over rounds, chunked; BOTH directions from each
  draw, the delta sums included).  Cold = first call (trace + compile + run); steady = median of 3
  later calls with the same shapes and other keys; compile ~ cold - steady.

The headline ratio compares samples of both directions per second (dpjax's steady state over
jax_privacy's two calls); the ratio against one jax_privacy direction is also written.  The two
remove-direction deltas are compared (z-score with both standard errors) as a check that both
sample the same thing.  (With three or more bands jax_privacy 2.0's ratio is off in the last
bands - 1 rounds: at n = 64 it raises its remove delta by 3.5e-4, about a quarter of its
standard error here.)

Run:  python benchmarks/bench_bminsep.py [--quick]
Writes benchmarks/results/bench_bminsep.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

COLUMN = np.array([1.0, 0.5, 0.25, 0.125])
SIGMA = 1.0
EPSILON = 1.0
CONFIGS = [  # (n, min_sep, sampling_prob, dpjax samples, jax_privacy samples per direction)
    (64, 8, 0.1, 1 << 19, 100_000),
    (256, 16, 0.05, 1 << 17, 25_000),
]


def _terms(losses):
    terms = -np.expm1(np.minimum(EPSILON - np.asarray(losses), 0.0))
    return float(terms.mean()), float(terms.std(ddof=1) / math.sqrt(terms.size))


def bench_jax_privacy(n, b, p, num_samples):
    from jax_privacy import batch_selection
    from jax_privacy.experimental.monte_carlo import sample_generation

    strategy = batch_selection.BMinSepSampling(sampling_prob=p, iterations=n, min_sep=b)
    sample_generation.get_privacy_loss_sample(strategy, SIGMA, COLUMN, seed=0, num_samples=100)  # warm-up
    walls, deltas = {}, {}
    for name, positive, seed in (("remove", True, 1), ("add", False, 2)):
        t0 = time.perf_counter()
        losses, _ = sample_generation.get_privacy_loss_sample(strategy, SIGMA, COLUMN, seed=seed,
                                                              positive_sample=positive, num_samples=num_samples)
        walls[name] = time.perf_counter() - t0
        deltas[name] = _terms(losses)
    both = walls["remove"] + walls["add"]
    return {"num_samples_per_direction": num_samples, "wall_s": walls,
            "samples_per_s_one_direction": num_samples / walls["remove"],
            "samples_per_s_both_directions": num_samples / both,
            "delta_remove": deltas["remove"][0], "se_remove": deltas["remove"][1],
            "delta_add": deltas["add"][0], "se_add": deltas["add"][1]}


def bench_dpjax(n, b, p, num_samples):
    from dpjax.montecarlo import BMinSep

    acc = BMinSep(COLUMN, p, b, n)
    t0 = time.perf_counter()
    est = acc.estimate(SIGMA, EPSILON, num_samples, key=0)
    cold = time.perf_counter() - t0
    steady = []
    for seed in (1, 2, 3):
        t0 = time.perf_counter()
        acc.estimate(SIGMA, EPSILON, num_samples, key=seed)
        steady.append(time.perf_counter() - t0)
    wall = statistics.median(steady)
    return {"num_samples": num_samples, "cold_s": cold, "steady_s": wall, "compile_s_approx": max(cold - wall, 0.0),
            "steady_runs_s": steady, "samples_per_s_both_directions": num_samples / wall,
            "delta_remove": float(est.delta_remove[0]), "se_remove": float(est.se_remove[0]),
            "delta_add": float(est.delta_add[0]), "se_add": float(est.se_add[0])}


def main(argv=None):
    from _meta import run_metadata

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4x fewer samples for both libraries")
    args = parser.parse_args(argv)

    rows = []
    for n, b, p, m_ours, m_jp in CONFIGS:
        if args.quick:
            m_ours, m_jp = m_ours // 4, m_jp // 4
        jp = bench_jax_privacy(n, b, p, m_jp)
        ours = bench_dpjax(n, b, p, m_ours)
        z = (ours["delta_remove"] - jp["delta_remove"]) / math.hypot(ours["se_remove"], jp["se_remove"])
        rows.append({"n": n, "min_sep": b, "sampling_prob": p, "bands": COLUMN.size, "jax_privacy": jp, "dpjax": ours,
                     "ratio_both_directions": ours["samples_per_s_both_directions"]
                     / jp["samples_per_s_both_directions"],
                     "ratio_vs_one_jax_privacy_direction": ours["samples_per_s_both_directions"]
                     / jp["samples_per_s_one_direction"],
                     "z_remove": z})

    header = (f"{'n':>4} {'b':>3} {'p':>5} | {'jax_privacy samples/s':>21} | {'dpjax samples/s':>15} "
              f"{'cold s':>7} {'compile s':>9} | {'ratio':>6} | z remove")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['n']:>4} {r['min_sep']:>3} {r['sampling_prob']:>5} | "
              f"{r['jax_privacy']['samples_per_s_both_directions']:>21.0f} | "
              f"{r['dpjax']['samples_per_s_both_directions']:>15.0f} {r['dpjax']['cold_s']:>7.2f} "
              f"{r['dpjax']['compile_s_approx']:>9.2f} | {r['ratio_both_directions']:>5.1f}x | {r['z_remove']:+.2f}")
    print("(samples/s: samples of both directions per second; jax_privacy one direction: "
          + ", ".join(f"{r['jax_privacy']['samples_per_s_one_direction']:.0f}" for r in rows) + ")")
    out = {
        "benchmark": "bench_bminsep",
        "description": __doc__,
        "matrix_first_column": COLUMN.tolist(), "noise_multiplier": SIGMA, "epsilon": EPSILON,
        "results": rows,
        "meta": run_metadata(__file__, argv),
    }
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    path = os.path.join(ROOT, "benchmarks", "results", "bench_bminsep.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
