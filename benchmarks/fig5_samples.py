"""Issue 10, must-show 3: how many Monte Carlo samples per optimisation step are enough (Fig. 5).

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix
mechanisms", §5.1.4: optimising ``C`` with few samples per step (~2^9) gives about the same final
RMSE as with many (2^20) for eps <= 2, and ~10% more at eps = 4.

Measured here: for eps in {1, 2, 4} (delta = 1e-5) and m in {2^9, 2^11, 2^13, 2^15} samples per
step, optimise ``C`` (``dpjax.optimization.optimize_correlation``, same init, steps, optimizer and
seed for every m), then evaluate every final ``C`` the same way: ``sigma`` calibrated on an
estimate with 2^17 samples from one fixed evaluation key that no optimisation used, and
``rmse = sigma |A C^-1|_F / sqrt(n)``.  Reported: ``rmse(m) / rmse(2^17) - 1`` (the reference
run optimises with 2^17 samples per step).  Not certified (a comparison of ``C``s, not a
release).

Run:  nohup python benchmarks/fig5_samples.py [--full] [--family toeplitz] [--steps 300] &
Default is a reduced grid (b = 32, E = 4, n = 128); --full is the paper's b = 128, E = 16.
Writes benchmarks/results/fig5_samples[_full].json after every run (partial results survive).
Wall-clock times are on a shared, heavily contended 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dpjax.calibration import calibrated_noise  # noqa: E402
from dpjax.matrices import Toeplitz  # noqa: E402
from dpjax.optimization import make_parameterization, prefix_sum_error  # noqa: E402

EVAL_SAMPLES = 1 << 17
EVAL_KEY = 987654321


def evaluate(first_column, b, epochs, eps, delta):
    """``(sigma, rmse)`` of ``C`` at the common evaluation sample (2^17 draws, fixed key)."""
    corr = Toeplitz(jnp.asarray(np.asarray(first_column, np.float64)))
    sigma = float(calibrated_noise(corr, b, epochs, target_epsilon=eps, target_delta=delta,
                                   num_samples=EVAL_SAMPLES, key=jax.random.key(EVAL_KEY)))
    return sigma, sigma * float(prefix_sum_error(corr, b * epochs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="b = 128, E = 16 (n = 2048)")
    parser.add_argument("--family", default="toeplitz", choices=["toeplitz", "blt"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--epsilons", default="1,2,4")
    parser.add_argument("--log2-samples", default="9,11,13,15,17")
    parser.add_argument("--learning-rate", type=float, default=None)
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    from dpjax.optimization import optimize_correlation

    from _meta import run_metadata

    b, epochs = (128, 16) if args.full else (32, 4)
    delta = 1e-5
    eps_values = [float(e) for e in args.epsilons.split(",")]
    sample_counts = [1 << int(k) for k in args.log2_samples.split(",")]
    out = os.path.join(ROOT, "benchmarks", "results",
                       f"fig5_samples{'_full' if args.full else ''}_{args.family}.json")
    data = {"batches_per_epoch": b, "epochs": epochs, "delta": delta, "family": args.family,
            "steps": args.steps, "evaluation": f"sigma from {EVAL_SAMPLES} samples, fixed key {EVAL_KEY}",
            "runs": []}
    if os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
        if all(old.get(k) == data[k] for k in ("batches_per_epoch", "epochs", "family", "steps")):
            data["runs"] = old.get("runs", [])
    done = {(r["epsilon"], r["num_samples"]) for r in data["runs"]}
    kw = {"num_buffers": 4} if args.family == "blt" else {}
    for eps in eps_values:
        for m in sample_counts:
            if (eps, m) in done:
                continue
            par = make_parameterization(args.family, b * epochs, **kw)
            # Fig. 5 is about fresh samples per step (Algorithm 2's setting): no sharing.
            extra = {"resample_every": 1}
            if args.learning_rate is not None:
                from dpjax.optimization.loop import default_optimizer

                extra["optimizer"] = default_optimizer(args.learning_rate)
            t0 = time.perf_counter()
            res = optimize_correlation(par, batches_per_epoch=b, epochs=epochs, target_epsilon=eps,
                                       target_delta=delta, num_steps=args.steps, num_samples=m,
                                       key=17, progress=False, certify=False, **extra)
            secs = time.perf_counter() - t0
            d = res.to_dict()
            sigma, rmse = evaluate(d["first_column"], b, epochs, eps, delta)
            data["runs"].append({"epsilon": eps, "num_samples": m, "seconds": secs,
                                 "noise_multiplier_eval": sigma, "rmse_eval": rmse,
                                 "rmse_estimate": d.get("rmse_estimate"), "status": d.get("status"),
                                 "meta": run_metadata(__file__)})
            print(f"eps={eps:g} m=2^{m.bit_length() - 1}: rmse_eval={rmse:.4f} ({secs:.0f}s)", flush=True)
            summarize(data)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out + ".tmp", "w") as f:
                json.dump(data, f, indent=1)
            os.replace(out + ".tmp", out)
    summarize(data)
    print_table(data)


def summarize(data):
    ref = {r["epsilon"]: r["rmse_eval"] for r in data["runs"] if r["num_samples"] == 1 << 17}
    for r in data["runs"]:
        if r["epsilon"] in ref:
            r["increase_vs_2^17"] = r["rmse_eval"] / ref[r["epsilon"]] - 1.0


def print_table(data):
    counts = sorted({r["num_samples"] for r in data["runs"]})
    print(f"RMSE increase vs 2^17 samples/step (b={data['batches_per_epoch']}, E={data['epochs']}, "
          f"{data['family']}, {data['steps']} steps)")
    print("eps   " + "".join(f"  2^{m.bit_length() - 1:<6d}" for m in counts))
    for eps in sorted({r["epsilon"] for r in data["runs"]}):
        cells = []
        for m in counts:
            r = [x for x in data["runs"] if x["epsilon"] == eps and x["num_samples"] == m]
            v = r[0].get("increase_vs_2^17") if r else None
            cells.append(f"{100 * v:+7.2f}%" if v is not None else f"{'-':>8s}")
        print(f"{eps:<5g} " + "".join(f"  {c}" for c in cells))


if __name__ == "__main__":
    main()
