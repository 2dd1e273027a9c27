"""Data for notebooks/matrix_mechanisms.ipynb: Figs. 2(a), 2(b), 3(a) of Choquette-Choo, Ganesh,
Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix mechanisms" (§5.1).

Setting: n = b E rounds (paper: E = 16, b = 128, n = 2048), delta = 1e-5, eps in
{0.5, 1, 2, 4, 8, 16}.  RMSE = sigma |A C^-1|_F / sqrt(n) throughout (c_0 = 1; see
dpjax.optimization.baselines).  For each C and eps the noise multiplier under

* no amplification: sensitivity (E participations b apart) x the exact Gaussian sigma;
* balls-in-bins: the Monte Carlo *estimate* (calibrated on 2^17 samples by default, one fixed
  key; not certified: these are curves, not releases -- the table script certifies);
* Poisson: C = I with q = 1/b for n steps; a banded C with `bands <= b` under cyclic Poisson
  (q = bands / b, ceil(n / bands) participations), dpjax PLD (certified upper bound).

Fig. 2(a): C = I, % RMSE improvement of balls-in-bins and Poisson over unamplified.
Fig. 2(b): the same for a 64-banded C (jax_privacy's unamplified-optimal banded coefficients).
Fig. 3(a): bands in {1, 2, ..., 256} (up to n), the best RMSE per scheme (Poisson restricted to
bands <= 64 as in the paper), % improvement over the unamplified 256-banded C.
Figs. 3(b) and 5 come from benchmarks/results/table_amplified_mf*.json and fig5_samples*.json.

Run:  python notebooks/matrix_mechanisms_data.py [--reduced] [--samples 131072]
--reduced: b = 16, E = 4 (n = 64), bands up to 64, eps {1, 4}: the slow test tier's grid.
Writes notebooks/data/matrix_mechanisms[_reduced].json (after every figure).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dpjax.calibration import dpsgd_noise_multiplier, gaussian_noise_multiplier  # noqa: E402
from dpjax.matrices import Toeplitz  # noqa: E402
from dpjax.montecarlo import BallsInBins  # noqa: E402
from dpjax.optimization import prefix_sum_error, unamplified_sensitivity  # noqa: E402
from dpjax.optimization.baselines import jax_privacy_banded_coefficients  # noqa: E402

KEY = 31337


def curves_for(coef, eps_values, delta, b, epochs, samples, poisson=True):
    """RMSE of one C (Toeplitz coefficients, any c_0 > 0) under the three schemes, per epsilon."""
    coef = np.asarray(coef, np.float64)
    coef = coef / coef[0]
    n = b * epochs
    corr = Toeplitz(jnp.asarray(coef))
    err = float(prefix_sum_error(corr, n))
    with jax.enable_x64(True):
        sens = float(unamplified_sensitivity(jnp.asarray(coef), b, epochs))
    acc = BallsInBins(corr, b, epochs)
    bands = coef.size
    out = {"bands": int(bands), "error": err, "sensitivity": sens, "unamplified": [], "balls_in_bins": [],
           "poisson": []}
    for eps in eps_values:
        s_un = sens * float(gaussian_noise_multiplier(eps, delta))
        s_bib = float(acc.calibrate(eps, delta, samples, jax.random.key(KEY)))
        out["unamplified"].append(s_un * err)
        out["balls_in_bins"].append(s_bib * err)
        if poisson and bands <= b:
            # Cyclic Poisson (bands <= b): participations touch disjoint row blocks, so sigma is
            # the DP-SGD noise multiplier at q = bands / b, ceil(n / bands) steps, times |c|_2.
            z = float(dpsgd_noise_multiplier(bands / b, math.ceil(n / bands), eps, delta))
            out["poisson"].append(z * float(np.linalg.norm(coef)) * err)
        else:
            out["poisson"].append(None)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--samples", type=int, default=1 << 17)
    parser.add_argument("--figures", default="2a,2b,3a")
    parser.add_argument("--out", default=None, help="output JSON (default notebooks/data/...)")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    if args.reduced:
        b, epochs, eps_values, fixed_bands = 16, 4, [1.0, 4.0], 8
    else:
        b, epochs, eps_values, fixed_bands = 128, 16, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0], 64
    n = b * epochs
    delta = 1e-5
    os.makedirs(os.path.join(HERE, "data"), exist_ok=True)
    out = args.out or os.path.join(HERE, "data", f"matrix_mechanisms{'_reduced' if args.reduced else ''}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    data = {"batches_per_epoch": b, "epochs": epochs, "n": n, "delta": delta, "epsilons": eps_values,
            "balls_in_bins_samples": args.samples, "key": KEY,
            "normalization": "rmse = sigma |A C^-1|_F / sqrt(n), c_0 = 1"}
    if os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        if old.get("n") == n and old.get("balls_in_bins_samples") == args.samples:
            data.update({k: v for k, v in old.items() if k.startswith("fig")})

    def save():
        with open(out + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(out + ".tmp", out)

    figures = args.figures.split(",")
    t0 = time.perf_counter()
    if "2a" in figures and "fig2a" not in data:
        data["fig2a"] = curves_for([1.0], eps_values, delta, b, epochs, args.samples)
        save()
        print(f"fig2a done ({time.perf_counter() - t0:.0f}s)", flush=True)
    if "2b" in figures and "fig2b" not in data:
        coef = jax_privacy_banded_coefficients(n, fixed_bands)
        data["fig2b"] = curves_for(coef, eps_values, delta, b, epochs, args.samples)
        save()
        print(f"fig2b done ({time.perf_counter() - t0:.0f}s)", flush=True)
    if "3a" in figures:
        sweep = data.setdefault("fig3a", {})
        max_bands = min(n, 256)
        bands_list = [1 << k for k in range(int(math.log2(max_bands)) + 1)]
        for bands in bands_list:
            if str(bands) in sweep:
                continue
            coef = np.array([1.0]) if bands == 1 else jax_privacy_banded_coefficients(n, bands)
            sweep[str(bands)] = curves_for(coef, eps_values, delta, b, epochs, args.samples,
                                           poisson=bands <= min(64, b))
            save()
            print(f"fig3a bands={bands} done ({time.perf_counter() - t0:.0f}s)", flush=True)
    save()


if __name__ == "__main__":
    main()
