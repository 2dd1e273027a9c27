"""Group-privacy epsilon (k = 16, T = 2000, CIFAR-10 setting): dpjax vs dp_accounting, side by side.

For each noise multiplier (default 1, 2, 4), Poisson sampling q = 0.01 (and optionally fixed
batch B = 500 of N = 50000), delta = 1e-5:

* dp_accounting 0.6.0: ``PLD.from_mixture_gaussian_mechanism(sd, sensitivities, probs,
  value_discretization_interval=1e-4).self_compose(2000).get_epsilon_for_delta(1e-5)`` (the
  reference rows' method) -- run ONCE per case (it takes ~3-50 s), so its time is a cold time
  (there is nothing to warm up: it is pure NumPy);
* dpjax ``dpjax.dpsgd_epsilon(..., group_size=16)``:
  - cold: a fresh Python process from before ``import dpjax`` to the result (JIT compilation
    included), measured inside the subprocess;
  - first call in this process (compilation + run, imports excluded);
  - steady state: median of ``--repeats`` calls after the first.

Both values and their relative difference are reported (dpjax's is a certified upper bound;
dp_accounting's pessimistic value converges to the truth from above).  Prints a table and writes
``benchmarks/results/bench_group.json``.

    python benchmarks/bench_group.py [--repeats 5] [--sigmas 1,2,4] [--fixed-batch]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
K, T, Q, N, B, DELTA = 16, 2000, 0.01, 50_000, 500, 1e-5

DPJAX_COLD = r"""
import time, json
t0 = time.perf_counter()
import dpjax
from dpjax import FixedBatch
kw = {kw}
eps = dpjax.dpsgd_epsilon({sigma}, {q}, {T}, {delta}, group_size={k}, **kw)
print(json.dumps(dict(eps=eps, seconds=time.perf_counter() - t0)))
"""


def _mixture(sigma: float, sampling: str):
    from scipy.stats import binom, hypergeom
    import numpy as np

    j = np.arange(K + 1)
    if sampling == "poisson":
        return sigma, j.astype(float), binom.pmf(j, K, Q)
    # Fixed batch (replace adjacency, Ganesh (2024), Thm 3.3): sensitivities 2j, noise std sigma.
    return sigma, 2.0 * j, hypergeom.pmf(j, N, K, B)


def run_dp_accounting(sigma: float, sampling: str) -> dict:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    sd, sens, probs = _mixture(sigma, sampling)
    t0 = time.perf_counter()
    pld = pld_lib.from_mixture_gaussian_mechanism(
        sd, list(sens), list(probs), value_discretization_interval=1e-4, log_mass_truncation_bound=-50
    )
    eps = pld.self_compose(T).get_epsilon_for_delta(DELTA)
    return dict(eps=float(eps), seconds=time.perf_counter() - t0)


def _kwargs(sampling: str):
    import dpjax

    return dict(sampling=dpjax.FixedBatch(B, N)) if sampling == "fixed_batch" else {}


def run_dpjax(sigma: float, sampling: str, repeats: int) -> dict:
    import dpjax

    q = None if sampling == "fixed_batch" else Q
    kw = _kwargs(sampling)
    code = DPJAX_COLD.format(kw=repr(kw), sigma=sigma, q=q, T=T, delta=DELTA, k=K)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    cold = json.loads(out.stdout.strip().splitlines()[-1])
    t0 = time.perf_counter()
    eps = dpjax.dpsgd_epsilon(sigma, q, T, DELTA, group_size=K, **kw)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        e = dpjax.dpsgd_epsilon(sigma, q, T, DELTA, group_size=K, **kw)
        times.append(time.perf_counter() - t0)
        assert e == eps
    return dict(eps=float(eps), cold_process_seconds=cold["seconds"], first_call_seconds=first,
                steady_seconds=statistics.median(times), steady_all=times)


def main(argv=None):
    from _meta import run_metadata

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sigmas", default="1,2,4")
    ap.add_argument("--fixed-batch", action="store_true", help="also run fixed-batch sampling")
    args = ap.parse_args(argv)
    sigmas = [float(s) for s in args.sigmas.split(",")]
    samplings = ["poisson"] + (["fixed_batch"] if args.fixed_batch else [])
    rows = []
    for sampling in samplings:
        for sigma in sigmas:
            dj = run_dpjax(sigma, sampling, args.repeats)
            da = run_dp_accounting(sigma, sampling)
            rows.append(dict(
                sampling=sampling, noise_multiplier=sigma, group_size=K, steps=T, delta=DELTA,
                dpjax=dj, dp_accounting=da,
                rel_diff=(dj["eps"] - da["eps"]) / da["eps"],
                speedup_steady=da["seconds"] / dj["steady_seconds"],
                speedup_cold_process=da["seconds"] / dj["cold_process_seconds"],
            ))
    header = (f"{'sampling':>11} {'sigma':>5} {'eps dpjax':>10} {'eps dp_acc':>10} {'rel diff':>9} "
              f"{'dp_acc s':>9} {'dpjax cold':>10} {'1st call':>9} {'steady':>8} {'x steady':>9} {'x cold':>7}")
    print(f"group privacy, k={K}, T={T}, q={Q}, delta={DELTA}  (dp_accounting: ONE run each, 1e-4 grid)")
    print(header)
    for r in rows:
        dj, da = r["dpjax"], r["dp_accounting"]
        print(f"{r['sampling']:>11} {r['noise_multiplier']:5g} {dj['eps']:10.5f} {da['eps']:10.5f} {r['rel_diff']:9.2e} "
              f"{da['seconds']:9.2f} {dj['cold_process_seconds']:10.2f} {dj['first_call_seconds']:9.2f} "
              f"{dj['steady_seconds']:8.3f} {r['speedup_steady']:9.1f} {r['speedup_cold_process']:7.2f}")
    out = dict(
        benchmark="bench_group", machine=dict(platform=platform.platform(), cpus=os.cpu_count(), python=sys.version.split()[0]),
        note=("dp_accounting is run once per case (cold == steady for pure NumPy); dpjax cold = fresh process "
              "incl. import and XLA compilation; steady = median of repeats."),
        rows=rows,
        meta=run_metadata(__file__, argv),
    )
    path = ROOT / "benchmarks" / "results" / "bench_group.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
