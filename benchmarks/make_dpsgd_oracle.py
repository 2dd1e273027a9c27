"""Independent lower bounds for the DP-SGD property tests (``tests/pld/test_dpsgd_properties.py``).

Draws random DP-SGD configurations (Poisson sampling and fixed batches) and records, for each,
dp_accounting's *optimistic* PLD epsilon (``pessimistic_estimate=False``, no connect-the-dots,
value interval 1e-3): a lower bound on the true epsilon, computed by an independent
implementation.  dpjax's certified upper end must lie at or above it.  The file records the
command, the package version and the seed, so the draw can be remade.

    python benchmarks/make_dpsgd_oracle.py --out tests/data/dpsgd_oracle.json

Fixed batches (replace adjacency, sensitivity 2 relative to the clip norm) are the subsampled
Gaussian with sensitivity 2 at ``q = batch_size / dataset_size`` in dp_accounting's PLD, the
pair dpjax's fixed-batch accountant bounds at group size 1.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

INTERVAL = 1e-3


def draw(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        sigma = float(10 ** rng.uniform(math.log10(0.4), math.log10(5.0)))
        steps = int(round(10 ** rng.uniform(0, math.log10(3000))))
        delta = float(10 ** rng.uniform(-14, -3))
        if i % 2 == 0:
            q = float(min(1.0, 10 ** rng.uniform(-4, 0.05)))
            out.append(dict(scheme="poisson", sigma=sigma, q=q, steps=steps, delta=delta))
        else:
            n_data = int(rng.choice([1_000, 10_000, 60_000]))
            batch = int(min(n_data, max(1, round(10 ** rng.uniform(-4, 0.05) * n_data))))
            out.append(dict(scheme="fixed_batch", sigma=sigma, dataset_size=n_data, batch_size=batch,
                            q=batch / n_data, steps=steps, delta=delta))
    return out


def optimistic_epsilon(c: dict) -> float:
    from dp_accounting.pld import privacy_loss_distribution as PLD

    sens = 2.0 if c["scheme"] == "fixed_batch" else 1.0
    p = PLD.from_gaussian_mechanism(c["sigma"], sensitivity=sens, sampling_prob=c["q"], pessimistic_estimate=False,
                                    value_discretization_interval=INTERVAL, use_connect_dots=False)
    return float(p.self_compose(c["steps"]).get_epsilon_for_delta(c["delta"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="configurations (half per scheme)")
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--out", default="tests/data/dpsgd_oracle.json")
    args = ap.parse_args(argv)
    import importlib.metadata

    configs = draw(args.n, args.seed)
    t0 = time.time()
    for i, c in enumerate(configs):
        c["dp_accounting_optimistic"] = optimistic_epsilon(c)
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(configs)} configurations, {time.time() - t0:.0f} s", file=sys.stderr)
    meta = dict(command="python benchmarks/make_dpsgd_oracle.py " + " ".join(argv or sys.argv[1:]),
                dp_accounting=importlib.metadata.version("dp-accounting"), seed=args.seed,
                value_discretization_interval=INTERVAL, seconds=round(time.time() - t0, 1),
                note="dp_accounting PLD, pessimistic_estimate=False, use_connect_dots=False: a lower bound "
                     "on epsilon except where its FFT round-off floor adds mass (long compositions at "
                     "deltas below ~1e-10; the tests use it at delta >= 1e-10 only)")
    pathlib.Path(args.out).write_text(json.dumps(dict(meta=meta, configs=configs), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
