"""Random-allocation Monte Carlo with correlated noise: samples per second at n = 64 rounds.

``dpjax.montecarlo.RandomAllocation(C, t, E, selections_per_epoch=k).estimate`` (a jitted
``lax.scan`` over rounds whose state is the last ``bands - 1`` participations and the epoch's
count, ``2^(bands-1) (k+1)`` states; BOTH directions from each draw, the delta sums included),
for banded Toeplitz ``C`` with first column ``0.5^d``, ``d < bands``, sigma = 1, eps = 1.  Cold =
first call (trace + compile + run); steady = median of 3 later calls with the same shapes and
other keys; compile ~ cold - steady.  Each row reports the estimate with its standard error and
sample count.  There is no outside implementation to compare with.

Run:  python benchmarks/bench_allocation_mc.py [--samples N]
Writes benchmarks/results/bench_allocation_mc.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIGMA = 1.0
EPSILON = 1.0
NUM_SAMPLES = 1 << 16
CONFIGS = [  # (batches_per_epoch t, epochs E, selections_per_epoch k, bands); n = t E = 64
    (16, 4, 1, 1),
    (16, 4, 2, 1),
    (16, 4, 2, 4),
    (8, 8, 1, 6),
    (16, 4, 4, 6),
]


def _seconds(call):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def bench(t, epochs, k, bands, num_samples):
    from dpjax.montecarlo import RandomAllocation

    acc = RandomAllocation(0.5 ** np.arange(bands), t, epochs, selections_per_epoch=k)
    cold, est = _seconds(lambda: acc.estimate(SIGMA, EPSILON, num_samples, key=0))
    wall = statistics.median(_seconds(lambda: acc.estimate(SIGMA, EPSILON, num_samples, key=s))[0] for s in (1, 2, 3))
    return {"batches_per_epoch": t, "epochs": epochs, "n": t * epochs, "selections_per_epoch": k, "bands": bands,
            "states": 2 ** (bands - 1) * (k + 1), "num_samples": num_samples, "cold_s": cold, "steady_s": wall,
            "compile_s_approx": max(cold - wall, 0.0), "samples_per_s_both_directions": num_samples / wall,
            "delta": float(est.delta[0]), "standard_error": float(est.standard_error[0]),
            "delta_remove": float(est.delta_remove[0]), "delta_add": float(est.delta_add[0])}


def main(argv=None):
    from _meta import run_metadata

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--samples", type=int, default=NUM_SAMPLES, help="samples per configuration")
    m = cli.parse_args(argv).samples
    rows = [bench(t, e, k, w, m) for t, e, k, w in CONFIGS]
    header = (f"{'t':>3} {'E':>3} {'k':>2} {'bands':>5} {'states':>6} | {'samples/s':>10} {'cold s':>7} "
              f"{'compile s':>9} | delta (se, {m} samples)")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['batches_per_epoch']:>3} {r['epochs']:>3} {r['selections_per_epoch']:>2} {r['bands']:>5} "
              f"{r['states']:>6} | {r['samples_per_s_both_directions']:>10.0f} {r['cold_s']:>7.2f} "
              f"{r['compile_s_approx']:>9.2f} | {r['delta']:.4f} ({r['standard_error']:.1e})")
    out = {"benchmark": "bench_allocation_mc", "description": __doc__, "noise_multiplier": SIGMA,
           "epsilon": EPSILON, "rows": rows, "meta": run_metadata(__file__, argv)}
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    path = os.path.join(ROOT, "benchmarks", "results", "bench_allocation_mc.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
