"""Certificates of the optimised n = 2048 matrices: variance-reduced vs Bernoulli-KL vs a plain
2^24-sample estimate on the same C.

Setting (Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for
matrix mechanisms", §5.1): b = 128 batches per epoch, E = 16 epochs, delta = 1e-5, the optimised
BLT(4) and Toeplitz first columns at eps 1, 2, 4, 8 of the table before its regeneration
(``benchmarks/results/certify_n2048_matrices.json``).  For each C, four parts (``--parts``), results
merged into ``benchmarks/results/certify_n2048.json`` (or ``--out``) as they finish:

* ``reference``: the plain Monte Carlo estimate with 2^24 samples (``--ref-samples``): the noise multiplier where
  ``delta_hat = delta`` (both directions, common random numbers).  One pass over the 2^24
  samples evaluates ``delta_hat`` at 9 noise multipliers around a centre (the projections
  ``W = U L^T`` are shared; only the logsumexps differ), and the root is interpolated in
  ``(log sigma, log delta_hat)`` between the bracketing pair (``delta_hat`` of common random
  numbers is piecewise smooth in sigma); its standard error comes from the bracketing points.
* ``importance``: ``evr.certify_noise(method="importance_betting")`` with at most 2^20
  verification samples (``--samples``), and its wall time.
* ``kl``: the Bernoulli-KL certificate, ``method="bernoulli_kl"`` with 2^23 samples
  (``--kl-samples``), and its wall time.
* ``small_delta``: the variance-reduced certificate at delta = 1e-7, eps = 2 (both families),
  with ``--samples`` verification draws.

Every certificate uses its own key (independent of the reference's draws).  Times are wall-clock
(the device and the load average are recorded with each row); both certificate methods of one C
run in the same process, one after the other.  ``reference`` skips a C whose output already has
a reference root (``--force-reference`` recomputes it).

``--out PATH`` writes the JSON there instead of ``benchmarks/results/certify_n2048.json``; a new
``PATH`` starts from a copy of that file, so the output holds every row (the existing references
included) and the parts run now replace theirs.

Run (every part, one command; on an accelerator):
  python benchmarks/certify_n2048.py --out /tmp/certify_n2048.json
CPU smoke test:
  python benchmarks/certify_n2048.py --parts importance --families blt --epsilons 2 \
      --samples 65536 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dpjax.matrices import Toeplitz  # noqa: E402
from dpjax.montecarlo import BallsInBins, core, evr  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "certify_n2048.json")
B, E, DELTA = 128, 16, 1e-5
REF_SAMPLES = 1 << 24
REF_KEY = 424242
GRID = np.array([-0.016, -0.012, -0.008, -0.004, 0.0, 0.004, 0.008, 0.012, 0.016])


MATRICES = os.path.join(ROOT, "benchmarks", "results", "certify_n2048_matrices.json")


def _configs(families, epsilons):
    """The fixed matrices (a snapshot of the table's optimised columns, so that every part
    certifies the same C even after the table is regenerated)."""
    with open(MATRICES) as f:
        mats = json.load(f)["matrices"]
    out = []
    for family in families:
        for eps in epsilons:
            row = mats[f"{family}_eps{eps:g}"]
            row = dict(row, noise_multiplier=row["noise_multiplier_kl_2_23"])
            out.append((family, eps, np.asarray(row["first_column"], np.float64), row))
    return out


def _load():
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            return json.load(f)
    return {"rows": {}}


def _set_output(path):
    """Write results to ``path`` (seeded from the default results file if it does not exist)."""
    global RESULTS
    path = os.path.abspath(path)
    if path != RESULTS and not os.path.exists(path):
        seed = _load()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(seed, f, indent=1)
    RESULTS = path


def _save(update_key, part, value):
    import fcntl

    with open(RESULTS + ".lock", "w") as lock:  # parts run as parallel processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        _save_locked(update_key, part, value)


def _save_locked(update_key, part, value):
    data = _load()  # other parts may have written meanwhile
    data.setdefault("rows", {}).setdefault(update_key, {})[part] = value
    data.update({"batches_per_epoch": B, "epochs": E, "delta": DELTA,
                 "machine": f"{os.cpu_count()} cores, shared (load average recorded per row)"})
    if isinstance(value, dict):
        value.setdefault("device", _device())
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, RESULTS)


@jax.jit
def _chunk(gram, sqrt_gram, sigmas, eps, key, first_block):
    """Sums of both directions' plain terms at every sigma for one chunk of 16 blocks."""
    b = gram.shape[0]
    blocks = first_block + jnp.arange(16)
    mode_index, u = jax.vmap(lambda j: core.draw_block(key, j, b))(blocks)
    mode_index, u = mode_index.reshape(-1), u.reshape(-1, b)
    w = u @ sqrt_gram.T

    def at(sigma):
        y_pq, y_qp = core.privacy_losses_from_projections(gram, w, sigma, mode_index)
        t = jnp.stack([core.hockey_stick_terms(y_pq, eps)[:, 0], core.hockey_stick_terms(y_qp, eps)[:, 0]])
        return t.sum(1), (t * t).sum(1)

    return jax.lax.map(at, sigmas)


def plain_reference(gram, eps, centre, num_samples=REF_SAMPLES, key=REF_KEY):
    """Root of the plain estimate ``max_dir delta_hat(sigma) = DELTA`` from one pass (see module doc)."""
    with jax.enable_x64(True):
        g = jnp.asarray(gram)
        l = core.gram_sqrt(g)
        sigmas = jnp.asarray(centre * (1.0 + GRID))
        k = core.rbg_key(jax.random.key(key))
        per_chunk = 16 * core.BLOCK_SIZE
        tot = np.zeros((GRID.size, 2))
        tot2 = np.zeros((GRID.size, 2))
        for c in range(num_samples // per_chunk):
            s1, s2 = _chunk(g, l, sigmas, jnp.array([eps]), k, c * 16)
            tot += np.asarray(s1)
            tot2 += np.asarray(s2)
    mean = tot / num_samples
    se = np.sqrt(np.maximum(tot2 / num_samples - mean ** 2, 0.0) / num_samples)
    top = mean.max(axis=1)
    pick = mean.argmax(axis=1)
    sig = centre * (1.0 + GRID)
    above = np.nonzero(top <= DELTA)[0]
    info = {"sigmas": sig.tolist(), "delta_hat": top.tolist(),
            "standard_error": se[np.arange(GRID.size), pick].tolist(), "num_samples": num_samples}
    if above.size == 0 or above[0] == 0:
        info["root"] = None
        info["note"] = "not bracketed by the grid; widen around a new centre"
        return info
    j = above[0]
    x0, x1 = math.log(sig[j - 1]), math.log(sig[j])
    y0, y1 = math.log(top[j - 1]), math.log(max(top[j], 1e-300))
    root = math.exp(x0 + (math.log(DELTA) - y0) * (x1 - x0) / (y1 - y0))
    slope = (y1 - y0) / (x1 - x0)  # d log delta / d log sigma
    rel_se = se[j, pick[j]] / top[j]
    info.update(root=root, log_slope=slope, root_relative_se=abs(rel_se / slope))
    return info


def quick_estimate(acc, eps, guess, num_samples=1 << 16):
    """A variance-reduced estimate of the noise multiplier (grid centre only; two proposal rounds)."""
    sigma = guess
    for _ in range(2):
        prop = evr._proposal(acc, sigma, eps, 0.0)  # noqa: SLF001
        sigma = evr._calibrate_is(acc, eps, jax.random.key(5), num_samples, sigma, prop,  # noqa: SLF001
                                  (1 / DELTA, 1 / DELTA))
    return sigma


def _device():
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')} x{jax.device_count()}, {os.cpu_count()} host cores"


def _cert_row(cert, seconds):
    d = cert.to_dict()
    d["seconds"] = seconds
    d["load_average"] = os.getloadavg()[0]
    return d


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="reference,importance,kl,small_delta")
    parser.add_argument("--families", default="blt,toeplitz")
    parser.add_argument("--epsilons", default="1,2,4,8")
    parser.add_argument("--samples", type=int, default=1 << 20, help="importance: verification samples")
    parser.add_argument("--kl-samples", type=int, default=1 << 23, help="kl: verification samples")
    parser.add_argument("--ref-samples", type=int, default=REF_SAMPLES, help="reference: plain samples")
    parser.add_argument("--out", default=None, help=f"output JSON (default {os.path.relpath(RESULTS, ROOT)})")
    parser.add_argument("--force-reference", action="store_true",
                        help="recompute references that the output already has")
    args = parser.parse_args()
    if args.out:
        _set_output(args.out)
    parts = args.parts.split(",")
    configs = _configs(args.families.split(","), [float(e) for e in args.epsilons.split(",")])
    for family, eps, col, row in configs:
        name = f"{family}_eps{eps:g}"
        acc = BallsInBins(Toeplitz(col), B, E)
        guess = float(row["noise_multiplier"])
        if "importance" in parts:
            # At most --samples verification draws; where that cannot certify (the proven range of the
            # summands is too large for it), say so, and run the certificate with its own sizing
            # (up to 2^22) to show what it needs.
            for part, n in (("importance", args.samples), ("importance_sized", None)):
                if part == "importance_sized" and "error" not in _load()["rows"].get(name, {}).get("importance", {}):
                    continue
                t0 = time.perf_counter()
                try:
                    cert = evr.certify_noise(acc, target_epsilon=eps, target_delta=DELTA, num_samples=n,
                                             key=7000 + int(eps * 16) + (0 if family == "blt" else 1),
                                             initial_noise=guess, method="importance_betting")
                except ValueError as exc:
                    _save(name, part, {"error": str(exc), "seconds": time.perf_counter() - t0,
                                       "num_samples_allowed": n})
                    print(f"{name} {part}: {exc}", flush=True)
                    continue
                secs = time.perf_counter() - t0
                _save(name, part, _cert_row(cert, secs))
                print(f"{name} {part}: sigma {cert.noise_multiplier:.5f} "
                      f"(estimate {cert.noise_multiplier_estimate:.5f}) {cert.num_samples} samples {secs:.0f}s",
                      flush=True)
        if "kl" in parts:
            t0 = time.perf_counter()
            cert = evr.certify_noise(acc, target_epsilon=eps, target_delta=DELTA, num_samples=args.kl_samples,
                                     key=8000 + int(eps * 16) + (0 if family == "blt" else 1), initial_noise=guess,
                                     method="bernoulli_kl")
            secs = time.perf_counter() - t0
            _save(name, "kl", _cert_row(cert, secs))
            print(f"{name} kl: sigma {cert.noise_multiplier:.5f} {secs:.0f}s", flush=True)
        have = _load().get("rows", {}).get(name, {}).get("reference", {}).get("root")
        if "reference" in parts and (have is None or args.force_reference):
            centre = _load().get("rows", {}).get(name, {}).get("importance", {}).get("noise_multiplier_estimate")
            centre = float(centre) if centre else quick_estimate(acc, eps, guess)
            t0 = time.perf_counter()
            info = plain_reference(acc.gram, eps, centre, num_samples=args.ref_samples)
            info["seconds"] = time.perf_counter() - t0
            info["load_average"] = os.getloadavg()[0]
            _save(name, "reference", info)
            print(f"{name} reference: root {info.get('root')} ({info['seconds']:.0f}s)", flush=True)
        if "small_delta" in parts and eps == 2.0:
            t0 = time.perf_counter()
            try:
                cert = evr.certify_noise(acc, target_epsilon=eps, target_delta=1e-7, num_samples=args.samples,
                                         key=9000 + len(name), initial_noise=guess * 1.3,
                                         method="importance_betting")
                _save(name, "small_delta_1e-7", _cert_row(cert, time.perf_counter() - t0))
                print(f"{name} delta=1e-7: sigma {cert.noise_multiplier:.5f} {cert.num_samples} samples", flush=True)
            except ValueError as exc:
                _save(name, "small_delta_1e-7", {"error": str(exc), "seconds": time.perf_counter() - t0})
                print(f"{name} delta=1e-7: {exc}", flush=True)
    _summarise()


def _summarise():
    """Each row's certified noise multipliers against its reference root (``summary`` of the JSON)."""
    import fcntl

    with open(RESULTS + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _load()
        summary = {}
        for name, row in sorted(data.get("rows", {}).items()):
            root = row.get("reference", {}).get("root")
            entry = {"reference_root": root}
            for part in ("importance", "kl"):
                cert = row.get(part, {})
                sigma = cert.get("noise_multiplier")
                if sigma is None:
                    continue
                entry[part] = {"noise_multiplier": sigma, "num_samples": cert.get("num_samples"),
                               "seconds": cert.get("seconds"), "device": cert.get("device")}
                if root and isinstance(sigma, (int, float)) and math.isfinite(sigma):
                    entry[part]["gap_to_reference"] = sigma / root - 1.0
            small = row.get("small_delta_1e-7", {})
            if "noise_multiplier" in small:
                entry["small_delta_1e-7"] = {k: small.get(k) for k in ("noise_multiplier", "noise_multiplier_estimate",
                                                                        "num_samples", "verified", "seconds")}
            summary[name] = entry
            gaps = {p: f"{100 * entry[p]['gap_to_reference']:+.2f}%" for p in ("importance", "kl")
                    if "gap_to_reference" in entry.get(p, {})}
            print(f"{name}: reference {root} {gaps}", flush=True)
        data["summary"] = summary
        tmp = RESULTS + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, RESULTS)


if __name__ == "__main__":
    main()
