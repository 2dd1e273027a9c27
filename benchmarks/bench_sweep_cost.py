"""The sweep's cost model (``dpjax.pld.sweeping.BucketPolicy``): per-configuration CPU time of a
bucket program at several static sizes, the compile time of each program, and a least-squares
fit of the model's coefficients.

For each static shape ``(n, m, n_freq)`` (FFT length, single-step support capacity, kept
frequencies) and own support (the row's support, at most ``m``) a
bucket program is built for one DP-SGD configuration (sigma 1, q 0.01, T 3000, delta 1e-6, brackets
on: 4 rows), compiled with the sweep's compile options, and run on a chunk of ``--chunk``
copies; the CPU time of the process (all threads; less sensitive than wall time to other jobs on
a shared machine) per configuration is the best of ``--repeat`` calls.  Prints the table and the
fit of ``cost = base + per_fft_point * n/1024 * log2(n)/15 + per_support_point * support/1024 + per_capacity * m/1024
+ per_frequency * n_freq/1024`` (milliseconds), writes ``benchmarks/results/bench_sweep_cost.json``.

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

#: (n, m, n_freq, support): FFT length, support capacity, kept frequencies, the row's own support.
SHAPES = [(8192, 1024, 512, 1024), (8192, 8192, 512, 8192), (8192, 8192, 512, 1024), (32768, 2048, 512, 2048),
          (32768, 16384, 512, 16384), (32768, 16384, 512, 2048), (32768, 2048, 4096, 2048),
          (131072, 2048, 1024, 2048), (131072, 32768, 1024, 32768), (131072, 32768, 1024, 2048),
          (131072, 4096, 16384, 4096), (262144, 65536, 4096, 65536)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_sweep_cost.json"))
    args = ap.parse_args(argv)
    import jax
    import numpy as np
    from dpjax import _xla
    from dpjax.pld import sweep_plan as sp, sweep_run as sr, sweeping as sw

    jax.config.update("jax_enable_x64", True)
    mesh = sr.make_mesh(jax.devices()[:1])
    kinds = ("up", "down")
    cfg = sw.SweepConfig.from_mapping(dict(noise_multiplier=1.0, sampling_prob=0.01, steps=3000, delta=1e-6))
    base = sp.plan_config(0, cfg, None)
    rows = []
    for n, m, nf, support in SHAPES:
        p = sp._with_n(base, n)
        ms = tuple(tuple(support for _ in r) for r in p.plan.ms)
        p = dataclasses.replace(p, plan=dataclasses.replace(p.plan, n_freq=nf, ms=ms)).signed()
        members = [dataclasses.replace(p, index=i) for i in range(args.chunk)]
        static = sr.static_of(p, m, nf)
        xs = sr.chunk_args(members, args.chunk, mesh)
        program = sr._batched(mesh, p.directions, static[0], n, kinds, "eps", nf)
        c0 = time.process_time()
        lowered = program.lower(*xs)
        c1 = time.process_time()
        compiled = lowered.compile(_xla.compile_options())
        c2 = time.process_time()
        jax.block_until_ready(compiled(*xs))
        best = math.inf
        for _ in range(args.repeat):
            t = time.process_time()
            jax.block_until_ready(compiled(*xs))
            best = min(best, time.process_time() - t)
        row = dict(n=n, m=m, n_freq=nf, support=support, trace_lower_cpu_s=c1 - c0, compile_cpu_s=c2 - c1,
                   cpu_ms_per_config=1e3 * best / args.chunk, loadavg=os.getloadavg()[0])
        rows.append(row)
        print(json.dumps(row), flush=True)
    X = np.array([[1.0, r["n"] / 1024 * math.log2(r["n"]) / 15, r["support"] / 1024, r["m"] / 1024,
                   r["n_freq"] / 1024] for r in rows])
    y = np.array([r["cpu_ms_per_config"] for r in rows])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    fit = dict(zip(("base", "per_fft_point", "per_support_point", "per_capacity", "per_frequency"),
                   map(float, coef)))
    pred = X @ coef
    print("fit (ms):", {k: round(v, 4) for k, v in fit.items()})
    print("relative residuals:", [round(float(r), 2) for r in (y - pred) / y])
    out = dict(benchmark="bench_sweep_cost", chunk=args.chunk, rows=rows, fit=fit,
               compile_cpu_s_median=float(np.median([r["compile_cpu_s"] + r["trace_lower_cpu_s"] for r in rows])),
               compile_options=_xla.compile_options(),
               machine=dict(cpu_count=os.cpu_count(), jax=jax.__version__, backend=jax.default_backend()))
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
