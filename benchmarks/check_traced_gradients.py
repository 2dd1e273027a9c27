"""Gradients of the traced headline functions against finite differences of the eager calls,
and a fixed grid's looseness flag against the accountant, on random DP-SGD configurations.

* ``gradients``: for random (sigma, q, T) at delta 1e-5, ``jax.grad`` of ``dpjax.dpsgd_epsilon``
  in sigma (from float32 code) against central differences of the eager (float64) calls with
  steps of 1e-3 and 1e-4 relative.  The gradient is the derivative on the accountant's grid at
  the point; the eager calls re-plan their grid at every sigma, so the difference is the
  change of the discretization error with the plan (docs/design.md §5).
* ``looseness``: for random (planned sigma, evaluated sigma, q, T, delta), the fixed grid's
  ``calibration.dpsgd_epsilon_fn(..., with_report=True)`` against ``dpjax.dpsgd_epsilon`` at the
  evaluated sigma: the actual relative excess, the estimate, and the flag.  The claim: no
  unflagged answer more than 1% above the accountant's.

Run:  python benchmarks/check_traced_gradients.py [--gradients 12] [--looseness 40] [--seed 0]
Writes benchmarks/results/check_traced_gradients.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gradients", type=int, default=12)
    ap.add_argument("--looseness", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import jax

    import dpjax
    from dpjax import calibration as cal

    rng = np.random.default_rng(args.seed)
    grads = []
    for _ in range(args.gradients):
        s = float(np.exp(rng.uniform(np.log(0.6), np.log(3.0))))
        q = float(np.exp(rng.uniform(np.log(1e-3), np.log(5e-2))))
        t = int(np.exp(rng.uniform(np.log(100), np.log(10000))))
        f = lambda x: dpjax.dpsgd_epsilon(x, q, t, 1e-5)  # noqa: E731
        g = float(jax.grad(f)(s))
        fd = {h: (f(s * (1 + h)) - f(s * (1 - h))) / (2 * h * s) for h in (1e-3, 1e-4)}
        grads.append(dict(noise_multiplier=s, sampling_prob=q, steps=t, epsilon=f(s), grad=g, fd_1e3=fd[1e-3],
                          fd_1e4=fd[1e-4], rel_1e3=g / fd[1e-3] - 1, rel_1e4=g / fd[1e-4] - 1))
        print(json.dumps(grads[-1]), flush=True)

    warnings.simplefilter("ignore")
    loose = []
    for _ in range(args.looseness):
        q = float(np.exp(rng.uniform(np.log(2e-3), np.log(5e-2))))
        t = int(np.exp(rng.uniform(np.log(50), np.log(5000))))
        d = float(10 ** rng.uniform(-8, -4))
        sp = float(np.exp(rng.uniform(np.log(0.5), np.log(4.0))))
        se = float(sp * np.exp(rng.uniform(-0.5, 0.7)))
        t0 = time.perf_counter()
        grid = cal.dpsgd_grid(sp, q, t, target_delta=d)
        rep = cal.dpsgd_epsilon_fn(se, q, t, d, grid=grid, with_report=True)
        fresh = dpjax.dpsgd_epsilon(se, q, t, d)
        eps = float(rep.epsilon)
        actual = eps / fresh - 1 if fresh > 0 else (0.0 if eps == 0 else math.inf)
        row = dict(sampling_prob=q, steps=t, delta=d, planned_sigma=sp, sigma=se, epsilon=eps, accountant=fresh,
                   excess=actual, estimate=float(rep.excess), loose=bool(rep.loose),
                   unflagged_over_1pct=bool(not rep.loose and actual > 0.01), seconds=time.perf_counter() - t0)
        loose.append({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in row.items()})
        print(json.dumps(loose[-1]), flush=True)

    out = dict(gradients=grads, looseness=loose,
               max_abs_rel_grad_1e3=max(abs(r["rel_1e3"]) for r in grads) if grads else None,
               max_abs_rel_grad_1e4=max(abs(r["rel_1e4"]) for r in grads) if grads else None,
               flagged=sum(r["loose"] for r in loose), unflagged_over_1pct=sum(r["unflagged_over_1pct"] for r in loose))
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "check_traced_gradients.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k not in ("gradients", "looseness")}))


if __name__ == "__main__":
    main()
