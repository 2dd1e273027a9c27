"""The sweep's run-cost model (``dpjax.pld.sweeps.driver.BucketPolicy``): per-configuration CPU time
of a compiled bucket program at several FFT lengths, the compile time of each program, and a
least-squares fit of the model's FFT terms.

For each FFT length ``n`` a bucket program (the sweep's compiled stages) is built for one DP-SGD
configuration (sigma 1, q 0.01, T 3000, delta 1e-6, brackets on: 4 rows) moved onto that length,
compiled with the sweep's compile options (program store off), and run on a chunk of ``--chunk``
copies; the CPU time of the process (all threads; less sensitive than wall time to other jobs
on a shared machine) per configuration is the best of ``--repeat`` calls.  Prints the table and
the fit of ``cost = base + per_fft_point * n/1024 * log2(n)/15`` (milliseconds per 4 rows),
writes ``benchmarks/results/bench_sweep_cost.json``.

    python benchmarks/bench_sweep_cost.py [--chunk 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: FFT lengths measured.
LENGTHS = [8192, 32768, 131072, 262144, 524288]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_sweep_cost.json"))
    args = ap.parse_args(argv)
    os.environ["DPJAX_COMPILATION_CACHE"] = "0"  # measure compiles, not loads
    import jax
    import numpy as np

    from dpjax._base import xla as _xla
    from dpjax.pld.sweeps import plan as sp
    from dpjax.pld.sweeps import programs as sr
    from dpjax.pld.sweeps import driver as sw

    mesh = sr.make_mesh(jax.devices()[:1])
    kinds = ("up", "down")
    cfg = sw.SweepConfig.from_mapping(dict(noise_multiplier=1.0, sampling_prob=0.01, steps=3000, delta=1e-6))
    base = sp.plan_config(0, cfg, None)
    rows = []
    for n in LENGTHS:
        if n < base.plan.n:
            continue
        p = sp._with_n(base, n)
        members = [dataclasses.replace(p, index=i) for i in range(args.chunk)]
        spec = sr.bucket_spec(p, kinds, True)
        xs = sr.chunk_args(members, args.chunk, mesh, kinds)
        c0 = time.process_time()
        fn = sr.compile_program(("bench_sweep_cost", n), mesh, spec, xs)
        c1 = time.process_time()
        jax.block_until_ready(fn(*xs))
        best = math.inf
        for _ in range(args.repeat):
            t = time.process_time()
            jax.block_until_ready(fn(*xs))
            best = min(best, time.process_time() - t)
        row = dict(n=n, rows=len(p.directions) * len(kinds), compile_cpu_s=c1 - c0,
                   cpu_ms_per_config=1e3 * best / args.chunk, loadavg=os.getloadavg()[0])
        rows.append(row)
        print(json.dumps(row), flush=True)
    X = np.array([[1.0, r["n"] / 1024 * math.log2(r["n"]) / 15] for r in rows])
    y = np.array([r["cpu_ms_per_config"] * 4 / r["rows"] for r in rows])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    fit = dict(zip(("base", "per_fft_point"), map(float, coef)))
    pred = X @ coef
    print("fit (ms per 4 rows):", {k: round(v, 4) for k, v in fit.items()})
    print("relative residuals:", [round(float(r), 2) for r in (y - pred) / y])
    out = dict(benchmark="bench_sweep_cost", chunk=args.chunk, rows=rows, fit=fit,
               compile_cpu_s_median=float(np.median([r["compile_cpu_s"] for r in rows])),
               compile_options=_xla.compile_options(),
               machine=dict(cpu_count=os.cpu_count(), jax=jax.__version__, backend=jax.default_backend()))
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
