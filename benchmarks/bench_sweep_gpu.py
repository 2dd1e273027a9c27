"""dpjax.sweep on JAX's default device (a GPU where there is one), in one process.

The configurations are ``bench_sweep.py``'s (``--dist broad``: sigma ~ U[0.5, 4], q log-uniform
in [10^-3.5, 0.1], T log-uniform in [1e2, 1e5], delta log-uniform in [1e-8, 1e-4]; seed 1).
Each pass is timed and printed as soon as it ends, and the JSON file is rewritten after every
pass, so a run stopped by a time limit still leaves what it measured.  The persistent cache is
off (the Python API's default), so the first pass includes planning, tracing and every compile;
later passes reuse the compiled programs.  The epsilons of the last pass are kept, to be compared
with a CPU sweep of the same configurations (``--compare FILE`` on a machine without the device).

    python benchmarks/bench_sweep_gpu.py --configs 10000 --passes 3 --out results/bench_sweep_gpu.json
    python benchmarks/bench_sweep_gpu.py --compare results/bench_sweep_gpu.json --subset 300
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _meta import run_metadata  # noqa: E402
from bench_sweep import CONFIGS  # noqa: E402  (the shared configuration draw)

_ns: dict = {}
exec(CONFIGS, _ns)
configs = _ns["configs"]


def measure(args) -> None:
    out_path = pathlib.Path(args.out)
    cfg = configs(args.dist, args.configs)
    t0 = time.perf_counter()
    import jax

    import dpjax
    out = dict(benchmark="bench_sweep_gpu", dist=args.dist, configs=args.configs, import_s=time.perf_counter() - t0,
               device=str(jax.devices()[0]), backend=jax.default_backend(), rows=[],
               note=f"dpjax.sweep of {args.configs} configurations ({args.dist}) in one process on "
                    f"{jax.devices()[0]} ({jax.default_backend()}), persistent cache off: pass 1 includes "
                    "planning, tracing and every XLA compile; later passes reuse the programs.")
    print(f"{args.configs} configurations ({args.dist}) on {out['device']} ({out['backend']}, jax {out['jax']})",
          flush=True)
    for k in range(args.passes):
        t0 = time.perf_counter()
        table = dpjax.sweep(cfg, progress=False)
        seconds = time.perf_counter() - t0
        eps = [float(r["epsilon"]) for r in table.rows]
        paths = {p: sum(r["path"] == p for r in table.rows) for p in sorted(set(r["path"] for r in table.rows))}
        out["rows"].append(dict(pass_=k + 1, seconds=seconds, configs_per_s=args.configs / seconds,
                                programs=table.programs, compiled=table.compiled, paths=paths,
                                rows_inf=sum(e == float("inf") for e in eps)))
        out["epsilon"] = eps
        print(f"pass {k + 1}: {seconds:.2f} s, {args.configs / seconds:.0f} configurations/s, programs "
              f"{table.programs}, compiled {table.compiled}, paths {paths}", flush=True)
        out["meta"] = run_metadata(__file__, sys.argv[1:])
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, indent=1))


def compare(args) -> None:
    """The device's epsilons against a sweep of the first ``--subset`` configurations here."""
    import numpy as np

    import dpjax
    path = pathlib.Path(args.compare)
    data = json.loads(path.read_text())
    n = min(args.subset, len(data["epsilon"]))
    cfg = configs(data["dist"], data["configs"])[:n]
    here = np.array(dpjax.sweep(cfg, progress=False).epsilon, dtype=float)
    there = np.array(data["epsilon"][:n], dtype=float)
    finite = np.isfinite(here) & np.isfinite(there)
    rel = np.abs(there[finite] - here[finite]) / np.maximum(here[finite], 1e-300)
    data["compare"] = dict(rows=n, both_finite=int(finite.sum()), same_infinite=int(np.sum(~np.isfinite(here)
                                                                                           & ~np.isfinite(there))),
                           max_rel_diff=float(rel.max()) if rel.size else 0.0,
                           median_rel_diff=float(np.median(rel)) if rel.size else 0.0)
    print(json.dumps(data["compare"]))
    path.write_text(json.dumps(data, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", choices=("narrow", "broad"), default="broad")
    ap.add_argument("--configs", type=int, default=10000)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "bench_sweep_gpu.json"))
    ap.add_argument("--compare", default=None, help="compare a device run's epsilons with a sweep on this machine")
    ap.add_argument("--subset", type=int, default=300)
    args = ap.parse_args(argv)
    if args.compare:
        compare(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
