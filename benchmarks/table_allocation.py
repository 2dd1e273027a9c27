"""Epsilon of DP-SGD under four batchings, and the noise multiplier each needs for a target.

For ``b`` batches per epoch and ``E`` epochs (``T = b E`` steps, noise multiplier ``sigma``,
delta 1e-5), certified upper bounds from dpjax:

* **Poisson**: each example in each step with probability ``q = 1/b``
  (``dpjax.dpsgd_epsilon(sigma, 1/b, b E, delta)``);
* **random allocation**: each example in one step of every epoch, drawn afresh each epoch
  (``sampling="random_allocation"``);
* **balls-in-bins**: each example in one bin for the whole run (``C = I``;
  ``sampling="balls_in_bins"``);
* **no amplification**: deterministic batches (each example in a known step of every epoch):
  ``E`` Gaussian steps, one Gaussian with ``mu = sqrt(E) / sigma`` (exact closed form).

    python benchmarks/table_allocation.py    # writes benchmarks/results/table_allocation.json

An interrupted run resumes: rows already in the results file are kept (``--fresh`` recomputes all).

``python benchmarks/render_docs.py`` renders it in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from dpjax.pld.scenario import scheme_from_keywords

RESULTS = pathlib.Path(__file__).parent / "results" / "table_allocation.json"

EPOCHS = (1, 4, 16)
BATCHES = (32, 128, 1024)
SIGMAS = (0.8, 1.0, 1.5, 3.0)
DELTA = 1e-5
TARGETS = (1.0, 4.0)
SCHEMES = ("poisson", "random_allocation", "balls_in_bins", "none")


def epsilon(scheme: str, sigma: float, b: int, E: int) -> float:
    import dpjax
    from dpjax.numerics.exact import gaussian_epsilon

    if scheme == "poisson":
        return float(dpjax.dpsgd_epsilon(sigma, 1.0 / b, b * E, DELTA))
    if scheme == "none":
        return float(gaussian_epsilon(DELTA, math.sqrt(E) / sigma))
    return float(dpjax.dpsgd_epsilon(sigma, target_delta=DELTA, sampling=scheme_from_keywords(scheme, batches_per_epoch=b), epochs=E))


def noise(scheme: str, target: float, b: int, E: int) -> float:
    import dpjax
    from dpjax.calibration import gaussian_noise_multiplier

    if scheme == "poisson":
        return float(dpjax.dpsgd_noise_multiplier(sampling_prob=1.0 / b, steps=b * E, target_epsilon=target,
                                                  target_delta=DELTA))
    if scheme == "none":
        return float(gaussian_noise_multiplier(target, DELTA, E))
    return float(dpjax.dpsgd_noise_multiplier(target_epsilon=target, target_delta=DELTA, sampling=scheme_from_keywords(scheme, batches_per_epoch=b), epochs=E))


def _write(rows: list, sig: list, seconds: float, complete: bool, earlier: list | None = None) -> dict:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from _meta import run_metadata

    out = dict(benchmark="table_allocation", delta=DELTA, epsilon=rows, noise_multiplier=sig, seconds=seconds,
               complete=complete,
               note="certified upper bounds (epsilon) and smallest certified noise multipliers",
               meta=run_metadata(__file__))
    if earlier:
        out["earlier_runs"] = earlier   # the runs whose rows a resumed run kept (their metadata)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(RESULTS)
    return out


def _previous() -> tuple[dict, dict, float, list]:
    """Rows of an earlier (possibly interrupted) run of the same grid, keyed by their parameters,
    the seconds it recorded and its runs' metadata: a long run resumes where it stopped."""
    try:
        old = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}, {}, 0.0, []
    if old.get("delta") != DELTA:
        return {}, {}, 0.0, []
    eps = {(r["epochs"], r["batches_per_epoch"], r["noise_multiplier"]): r for r in old.get("epsilon", [])
           if all(k in r for k in SCHEMES)}
    sig = {(r["epochs"], r["batches_per_epoch"], r["target_epsilon"]): r for r in old.get("noise_multiplier", [])
           if all(k in r for k in SCHEMES)}
    earlier = list(old.get("earlier_runs", [])) + ([old["meta"]] if "meta" in old else [])
    return eps, sig, float(old.get("seconds", 0.0)), earlier


def _row(done: dict, key: tuple, head: dict, value) -> dict:
    """The row ``key`` of an earlier run, else ``head`` with ``value(scheme)`` for every scheme
    (printed as it arrives)."""
    row = done.get(key)
    if row is None:
        row = dict(head, **{scheme: value(scheme) for scheme in SCHEMES})
        print(json.dumps(row), flush=True)
    return row


def run(resume: bool = True) -> dict:
    """Every row, written as it arrives (``complete`` says whether the grid finished); rows an
    earlier run of the same grid recorded are kept (``resume``), and ``seconds`` adds up the runs."""
    done_eps, done_sig, seconds, earlier = _previous() if resume else ({}, {}, 0.0, [])
    if not (done_eps or done_sig):
        earlier = []
    rows, sig = [], []
    t0 = time.perf_counter()
    for E in EPOCHS:
        for b in BATCHES:
            for s in SIGMAS:
                rows.append(_row(done_eps, (E, b, s), dict(epochs=E, batches_per_epoch=b, noise_multiplier=s),
                                 lambda scheme: epsilon(scheme, s, b, E)))
            for target in TARGETS:
                sig.append(_row(done_sig, (E, b, target), dict(epochs=E, batches_per_epoch=b, target_epsilon=target),
                                lambda scheme: noise(scheme, target, b, E)))
            _write(rows, sig, seconds + time.perf_counter() - t0, complete=False, earlier=earlier)
    return _write(rows, sig, seconds + time.perf_counter() - t0, complete=True, earlier=earlier)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fresh", action="store_true", help="recompute every row (default: keep the rows of an "
                                                         "earlier run of the same grid and compute the rest)")
    args = ap.parse_args()
    run(resume=not args.fresh)


if __name__ == "__main__":
    main()
