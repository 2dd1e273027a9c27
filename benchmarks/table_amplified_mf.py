"""Issue 10, must-show 2: the amplified matrix-factorization table, every row in one normalization.

Setting (Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for
matrix mechanisms", §5.1): E = 16 epochs, b = 128 batches per epoch (n = 2048), delta = 1e-5,
epsilon in {1, 2, 4, 8}.

Normalization (all rows; see dpjax.optimization.baselines.NORMALIZATION):
    rmse = sigma * |A C^-1|_F / sqrt(n), C lower-triangular with c_0 = 1, sigma the noise
    multiplier (clip norm 1) of the row's (epsilon, delta) guarantee.
    rmse_jp = rmse / E is the same number in jax_privacy's BandMFConfig.rmse normalization
    (sigma_total / k * sqrt(mean per-query squared error), k = E = 16), printed so the rows read
    across with the issue's orientation numbers (N = 65536, B = 512).

Rows (groups, run with --groups; each group's rows are saved as soon as it finishes):
  dpsgd         C = I unamplified (exact Gaussian, sensitivity sqrt(E)); C = I under Poisson
                q = 1/b for n steps (dpjax PLD).
  bib_identity  C = I under balls-in-bins (dpjax Monte Carlo; EVR-certified sigma, 2^23
                certification samples, independent key).
  unamplified   the unamplified optimum of the Toeplitz and BLT(4) families (sensitivity for E
                participations b apart, exact Gaussian sigma).
  banded        jax_privacy's best banded C under cyclic Poisson (its RDP accounting), and the
                same coefficients re-accounted with dpjax's PLD.
  optimized     dpjax's optimized BLT(4) and Toeplitz under balls-in-bins with certified sigma
                (dpjax.optimization.optimize_correlation, when available on this branch).
  recertified   the same optimized C's certified again with --recertify-samples (default 2^25)
                independent samples per set: the ladder's base delta rises from 0.41 delta
                (2^23) to 0.68 delta, which shows what the certificate's sample count costs.

Run:  nohup python benchmarks/table_amplified_mf.py [--groups dpsgd,banded,...] [--quick] &
Each group writes benchmarks/results/table_amplified_mf.<group>.json when it finishes (groups can
run as parallel processes); every run merges them into benchmarks/results/table_amplified_mf.json
and prints the table (--print-only: just merge and print).
Timings are wall-clock on a shared 2-core CPU under heavy contention (inflated).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dpjax.matrices import Toeplitz  # noqa: E402
from dpjax.optimization import baselines as bl  # noqa: E402
from dpjax.optimization import make_parameterization  # noqa: E402

from _meta import run_metadata  # noqa: E402  (benchmarks/_meta.py: machine, date, command)

RESULTS = os.path.join(ROOT, "benchmarks", "results", "table_amplified_mf.json")
GROUPS = ("dpsgd", "bib_identity", "unamplified", "banded", "optimized", "recertified")
#: jax_privacy 2.0, BandMFConfig.rmse normalization, N = 65536, B = 512 (from the issue).
ORIENTATION = {
    "banded_cyclic_poisson_rdp": [3.070, 1.734, 1.025, 0.633],
    "banded_cyclic_poisson_pld": [2.838, 1.613, 0.958, 0.593],
    "dpsgd_poisson": [3.046, 1.997, 1.500, 1.199],
    "unamplified_blt": [4.220, 2.256, 1.223, 0.679],
}


def _group_path(group):
    # One file per group so that groups can run as separate (parallel) processes.
    return RESULTS.replace(".json", f".{group}.json")


def _load():
    data = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            data = json.load(f)
    data.setdefault("groups", {})
    for group in GROUPS:
        path = _group_path(group)
        if os.path.exists(path):
            with open(path) as f:
                data["groups"][group] = json.load(f)
    # Optimized (and re-certified) rows are saved one file per (family, epsilon) as each run
    # finishes.
    import glob

    for group in ("optimized", "recertified"):
        rows = []
        for path in sorted(glob.glob(RESULTS.replace(".json", f".{group}_*.json"))):
            with open(path) as f:
                rows.append(json.load(f))
        if rows:
            data["groups"][group] = {"rows": rows}
    return data


def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _save(data):
    _write(RESULTS, data)


def run_group(group, eps_values, delta, b, epochs, args):
    n = b * epochs
    if group == "dpsgd":
        return ([bl.dpsgd_unamplified(e, delta, b, epochs) for e in eps_values]
                + [bl.dpsgd_poisson(e, delta, b, epochs) for e in eps_values])
    if group == "bib_identity":
        return [bl.balls_in_bins_certified(Toeplitz(jnp.ones(1)), e, delta, b, epochs,
                                           name="dpsgd_balls_in_bins", certify_samples=args.certify_samples,
                                           key=1000 + i)
                for i, e in enumerate(eps_values)]
    if group == "unamplified":
        rows = []
        for family, kw in (("toeplitz", {}), ("blt", {"num_buffers": 4})):
            par = make_parameterization(family, n, **kw)
            rows += bl.unamplified_optimum(par, eps_values, delta, b, epochs,
                                           max_iterations=args.unamplified_iterations)
        return rows
    if group == "banded":
        return bl.banded_cyclic_poisson(eps_values, delta, b, epochs, batch_size=512,
                                        max_optimizer_steps=args.banded_steps)
    if group == "recertified":
        return recertified_rows(eps_values, delta, args)
    if group == "optimized":
        try:
            from dpjax.optimization import optimize_correlation
        except ImportError:
            print("optimized: dpjax.optimization.optimize_correlation is not on this branch yet; skipped",
                  flush=True)
            return []
        return optimized_rows(optimize_correlation, eps_values, delta, b, epochs, args)
    raise ValueError(group)


def optimized_rows(optimize_correlation, eps_values, delta, b, epochs, args):
    """dpjax's optimized BLT(4) and Toeplitz under balls-in-bins, certified sigma."""
    from dpjax.optimization import prefix_sum_error

    n = b * epochs
    rows = []
    families = {"blt": {"num_buffers": 4}, "toeplitz": {}}
    for family in args.families.split(","):
        kw = families[family]
        for i, eps in enumerate(eps_values):
            par = make_parameterization(family, n, **kw)
            t0 = time.perf_counter()
            res = optimize_correlation(par, batches_per_epoch=b, epochs=epochs, target_epsilon=eps,
                                       target_delta=delta, num_steps=args.steps,
                                       num_samples=args.samples, key=2000 + i, progress=None,
                                       certify=True, certify_samples=args.certify_samples)
            secs = time.perf_counter() - t0
            d = res.to_dict()
            sigma = float(d["noise_multiplier"])
            col = np.asarray(d["first_column"], np.float64)
            error = float(prefix_sum_error(Toeplitz(jnp.asarray(col)), n))
            rows.append(bl._row(f"optimized_{family}", eps, delta, b, epochs, sigma, error,  # noqa: SLF001
                                f"dpjax optimize_correlation ({args.steps} steps, {args.samples} samples/step), "
                                f"EVR-certified sigma", column=col,
                                noise_multiplier_estimate=d.get("noise_multiplier_estimate"),
                                certificate=d.get("certificate"), seconds=secs,
                                family=par.to_dict()))
            _write(RESULTS.replace(".json", f".optimized_{family}_eps{eps:g}.json"),
                   {**rows[-1].to_dict(), "meta": run_metadata(__file__)})
            print(f"  optimized {family} eps={eps:g}: sigma={sigma:.4f} rmse={rows[-1].rmse:.4f} "
                  f"({secs:.0f}s)", flush=True)
    return rows


def recertified_rows(eps_values, delta, args):
    """Each saved optimized row's C certified again with more samples (fresh, independent key)."""
    import glob

    from dpjax.optimization.certify import certify_noise

    rows = []
    m = int(args.recertify_samples)
    for path in sorted(glob.glob(RESULTS.replace(".json", ".optimized_*.json"))):
        with open(path) as f:
            old = json.load(f)
        if old["epsilon"] not in eps_values or abs(old["delta"] - delta) > 0:
            continue
        family = old["name"].replace("optimized_", "")
        done = RESULTS.replace(".json", f".recertified_{family}_eps{old['epsilon']:g}.json")
        if os.path.exists(done):  # kept (delete the file to certify that row again)
            continue
        b, epochs = old["batches_per_epoch"], old["epochs"]
        corr = Toeplitz(jnp.asarray(np.asarray(old["first_column"], np.float64)))
        t0 = time.perf_counter()
        cert = certify_noise(corr, b, epochs, target_epsilon=old["epsilon"], target_delta=delta,
                             num_samples=m, key=jax.random.key(3000 + int(old["epsilon"] * 16)),
                             initial_noise=old["noise_multiplier"])
        secs = time.perf_counter() - t0
        family = old["name"].replace("optimized_", "")
        row = bl._row(f"recertified_{family}", old["epsilon"], delta, b, epochs, cert["noise_multiplier"],  # noqa: SLF001
                      old["error"], f"the optimized_{family} C, EVR-certified with {m} samples per set",
                      column=old["first_column"], certificate=cert, seconds=secs,
                      certified_2_23=old["noise_multiplier"])
        rows.append(row)
        _write(RESULTS.replace(".json", f".recertified_{family}_eps{old['epsilon']:g}.json"),
               {**row.to_dict(), "meta": run_metadata(__file__)})
        print(f"  recertified {family} eps={old['epsilon']:g}: sigma {old['noise_multiplier']:.4f} -> "
              f"{cert['noise_multiplier']:.4f} ({secs:.0f}s)", flush=True)
    return rows


def print_table(data, eps_values):
    rows = [r for g in GROUPS for r in data.get("groups", {}).get(g, {}).get("rows", [])]
    names = []
    for r in rows:
        if r["name"] not in names:
            names.append(r["name"])
    print()
    print("RMSE = sigma |A C^-1|_F / sqrt(n)   [in jax_privacy BandMFConfig.rmse normalization = RMSE / E]")
    print(f"{'row':34s}" + "".join(f"  eps={e:<14g}" for e in eps_values))
    for name in names:
        cells = []
        for e in eps_values:
            match = [r for r in rows if r["name"] == name and abs(r["epsilon"] - e) < 1e-12]
            if match:
                r = match[0]
                cells.append(f"{r['rmse']:7.3f} [{r['rmse_jax_privacy']:6.3f}]")
            else:
                cells.append(f"{'-':>16s}")
        print(f"{name:34s}" + "".join(f"  {c:18s}" for c in cells))
        if name in ORIENTATION:
            print(f"{'  (issue, jax_privacy normalization)':34s}"
                  + "".join(f"  {'':7s} [{v:6.3f}]    " for v in ORIENTATION[name]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--quick", action="store_true", help="b=16, E=4 smoke run (not the table)")
    parser.add_argument("--certify-samples", type=int, default=1 << 23)
    parser.add_argument("--unamplified-iterations", type=int, default=1000)
    parser.add_argument("--banded-steps", type=int, default=250)
    parser.add_argument("--steps", type=int, default=300, help="optimization steps (optimized group)")
    parser.add_argument("--samples", type=int, default=1 << 13, help="MC samples per step (optimized group)")
    parser.add_argument("--families", default="blt,toeplitz", help="optimized group: families to run")
    parser.add_argument("--recertify-samples", type=int, default=1 << 25,
                        help="recertified group: samples per certification set (default 2^25)")
    parser.add_argument("--epsilons", default="1,2,4,8")
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting RDP convergence chatter
    eps_values = [float(e) for e in args.epsilons.split(",")]
    delta = 1e-5
    b, epochs = (16, 4) if args.quick else (128, 16)
    data = _load()
    if args.quick:
        global RESULTS
        RESULTS = RESULTS.replace(".json", "_quick.json")
        data = _load()
    data.update({"normalization": bl.NORMALIZATION, "batches_per_epoch": b, "epochs": epochs,
                 "n": b * epochs, "delta": delta, "epsilons": eps_values,
                 "orientation_jax_privacy_normalization": ORIENTATION,
                 "machine": f"{platform.platform()}, {os.cpu_count()} cores (shared, contended)"})
    data.setdefault("groups", {})
    if not args.print_only:
        for group in [g for g in args.groups.split(",") if g]:
            if group not in GROUPS:
                parser.error(f"unknown group {group!r}; choose from {GROUPS}")
            print(f"== {group} ...", flush=True)
            t0 = time.perf_counter()
            rows = run_group(group, eps_values, delta, b, epochs, args)
            secs = time.perf_counter() - t0
            if rows and group not in ("optimized", "recertified"):
                data["groups"][group] = {"rows": [r.to_dict() for r in rows], "seconds": secs,
                                         "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                         "meta": run_metadata(__file__)}
                _write(_group_path(group), data["groups"][group])
            print(f"== {group}: {len(rows)} rows in {secs:.0f}s", flush=True)
            print_table(data, eps_values)
    data["groups"].update(_load()["groups"])  # groups finished by other processes meanwhile
    _save(data)
    print_table(data, eps_values)


if __name__ == "__main__":
    main()
