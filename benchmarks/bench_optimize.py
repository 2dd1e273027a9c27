"""Correlation-matrix optimisation time: dpjax's loop vs the paper's Algorithm 2, one run.

Choquette-Choo et al., "Near exact privacy amplification for matrix mechanisms", Fig. 4
(optimisation time for E in {16, 32, 64} x b in {32, 64, 128}, 300 Adam steps, 2^17 and 2^20
samples per step; 389 s on a V100 at E = 16, b = 128, 2^17; out of memory at E = 64, b = 128,
2^20).

All rows run through the same code path (:func:`dpjax.optimization.optimize_correlation`,
BLT with 4 buffers, eps = 1, delta = 1e-5 as in Fig. 4):

* ``dpjax`` (the defaults): one sample shared by ``resample_every = 10`` steps, the screened
  calibration (:mod:`dpjax.calibration.screened`: one float32 screen of all samples at the
  warm start, :class:`~dpjax.calibration.NewtonIllinois` and the implicit gradient in float64
  on the few thousand samples that can contribute; exact, with a checked bound and a full
  fallback; ``fraction_screened`` reports how often the fallback was not needed);
* ``dpjax_importance`` (``vr`` in the printed table): the variance-reduced in-loop estimate
  (``estimator="importance"``, the default of ``optimize_correlation``), at its default 2^11
  samples per step (``--importance-log2m``): fresh draws every step, Newton/Illinois on the full
  sample, implicit gradient;
* ``anchor``: :class:`~dpjax.calibration.Bisection` (fresh draws every step, 50 full float64
  passes per step, implicit gradient) -- Algorithm 2 as written.

Each configuration runs in its own subprocess (so its peak RSS is its own, reported from
``getrusage``).  Timings: ``compile`` = the first step plus the first draw (trace + compile +
run), ``per step`` = the steady-state mean over the remaining steps ((total - compile) /
(steps - 1), later draws amortised in it), ``300 steps`` = compile + 299 x per step; it is a
measured 300-step total when ``measured_300_steps`` is true, else extrapolated (the anchor).
Samples beyond 2^24 / b entries take the unscreened path, streamed in chunks (bounded memory).

The machine is a shared 2-core CPU with other jobs running: absolute times are inflated by
contention (the load average is recorded); the ratio anchor / dpjax is measured side by side.

Run::

    python benchmarks/bench_optimize.py --quick            # E=16, b=128, 2^17; anchor 5 steps
    python benchmarks/bench_optimize.py --profile          # where a step's time goes
    python benchmarks/bench_optimize.py                    # the full grid (hours on 2 cores)
    python benchmarks/bench_optimize.py --configs 64x128x20 --steps 3 --no-anchor   # memory

Writes ``benchmarks/results/bench_optimize.json`` and prints a table.

Measured on the idle 2-core CPU (load < 2.4 at the start, nothing else running;
bench_optimize_quick.json): E=16, b=128, 2^17, eps=1, 300 steps **75.0 s measured**
(optimize_correlation's whole wall time: compile + first step + first draw 9.3 s, 0.203 s/step,
4.9 solver passes/step, 50% of the steps reusing the previous screen, peak RSS 1.6 GB); the
Algorithm-2 anchor in the same run 5.07 s/step (3 steps; 1526 s extrapolated): **25x per step**.
The previous release (16ef111, no screen reuse), same machine, minutes later
(bench_optimize_quick_base.json): 106.3 s, 0.309 s/step.  The VM was faster than in the
earlier idle run below (148.5 s for that release then), so the 1.52x per step is the reuse's
share.  Grid rows:
bench_optimize_grid17.json (all nine E x b at 2^17, 300 steps each, anchors 2 steps each);
bench_optimize_grid20.json (eight E x b at 2^20, 300 steps, --screened-above-2-24, idle: 100.6-
356.9 s), bench_optimize_grid20_anchors.json (anchors at E = 16, b = 64 and 128: 42.1 and
74.8 s/step; b = 32: 21.8 s/step in bench_optimize_grid20_partial.log) and
bench_optimize_64x128x20.json (300 steps, 826.7 s under load, peak RSS 5.95 GB).

An earlier idle run on the 2-core CPU (load 0.9-1.6; bench_optimize_idle.json,
bench_optimize_profile_idle.json): E=16, b=128, 2^17, eps=1, 300 steps **148.5 s measured**
(compile + first step + first draw 14.0 s, 0.450 s/step), 3.9 solver passes/step, peak RSS
1.48 GB: the <= 120 s target needs 0.36 s/step.  Profile: screened value + gradient 0.283 s
(W32 matmul 0.055, float32 screen 0.097, candidate selection 0.066), draws 0.52 s per sample
(shared by 10 steps); the rest of the 0.450 s is the optimizer update and the loop.

An earlier run on the shared 2-core CPU with load average 19-22 (other jobs; the benchmark
process got ~25% of one core), so absolute times are inflated several-fold:

* E=16, b=128, 2^17, eps=1 (bench_optimize_quick.json), screened path + resample_every=10:
  dpjax **300 steps measured: 1069.9 s** (compile + first step + first draw 101.6 s, steady
  3.24 s/step including 30 draws = 115.7 s), 3.9 solver passes/step (cheap candidate passes),
  100% of steps screened (no full fallback), peak RSS 1.43 GB; anchor (Algorithm 2: fresh draws,
  50 bisection passes, float64) 53.7 s/step over 3 steps (compile 194 s; 300 steps
  extrapolated 16264 s).  Ratio 16.6x per step, 15.2x for 300 steps (anchor extrapolated).
  The <= 120 s target is not met under this load; see the profile for the floor.
* Profile (bench_optimize_profile.json, load 19-22, same process): old step (fresh draws,
  float64 W, Newton jvp passes, float64 reverse pass) 27.1 s vs screened step 3.56 s (7.6x).
  Old pieces: draws 3.74, Cholesky + W 1.36, value pass 2.42, Newton pass 5.84, reverse pass
  4.19.  Screened pieces: W32 = U32 L^T 0.83, float32 screen 1.13, selection (top_k 0.61 in that
  run; the subsampled selection now used is ~6x cheaper), forward total 2.70, value + gradient
  3.56; draws 5.56 per sample, shared by 10 steps (0.56/step).  What is left per step is one
  float32 (m x b) x (b x b) matmul, one float32 screening pass and the amortised draws: the
  floor of any method that looks at every sample once per step.

* CPU seconds (bench_optimize_cpu.json, one process, load 13-18): 20 compiled steps (with 2
  draws and the final evaluation) used 17.4 CPU-s, 0.87 CPU-s per step, at 1.7 s/step wall.
  Inferred, not measured: an idle 2-core machine would need ~0.45-0.9 s per step (1-2
  effective threads), i.e. ~150-270 s for 300 steps plus the compilation, so the <= 120 s target
  is probably still missed by 1.3-2.5x.  The per-step floor of this design is the float32 W
  matmul (4.3 GFLOP) plus one float32 screening pass over 2^24 entries (two logsumexps) plus
  ~0.1 of a draw.

Earlier measurements (before the screened path), load average 25-40:

* E=16, b=128, 2^17, eps=2 (bench_optimize_quick.json): dpjax 41.8 s/step, 6.1 passes/step
  (12 steps, including the cold first step); anchor (Algorithm 2) 76.4 s/step, 52 passes
  (3 steps); ratio 1.8x per step.  Profile (bench_optimize_profile.json, load ~25): draws
  2.49 s, Cholesky + W 0.97 s, one value pass 2.27 s, one Newton (jvp) pass 3.83 s, reverse
  pass 3.05 s, objective 0.002 s, full warm-started step 14.2 s.  The fixed per-step costs
  (draws, W, reverse pass) now outweigh the solver passes.
* E=64, b=128, 2^20, eps=1 (bench_optimize_memory.json): one step, streamed in chunks,
  compile + step 381 s, 5 passes, peak RSS 817 MB (target: within 8 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

EPS, DELTA, BUFFERS = 1.0, 1e-5, 4  # Fig. 4 of the paper: eps = 1, delta = 1e-5
RESAMPLE = 10  # dpjax's default resample_every
SCREENED_ABOVE = False  # --screened-above-2-24
GRID = [(e, b, m) for m in (17, 20) for e in (16, 32, 64) for b in (32, 64, 128)]


def run_one(epochs: int, b: int, log2m: int, steps: int, solver: str,
            resample_every: int = 10, precompute: bool | None = None) -> dict:
    import jax
    import dpjax
    from dpjax.calibration import Bisection, NewtonIllinois
    from dpjax.optimization import (CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)

    param = make_parameterization("blt", b * epochs, num_buffers=BUFFERS)
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(b), epochs=epochs, target_epsilon=EPS,
                                 target_delta=DELTA)
    # "newton": the screened plain estimate; "importance": the variance-reduced estimate (fresh
    # draws every step, full passes); "bisection": Algorithm 2 as written.
    settings = OptimizerSettings(
        num_steps=steps, num_samples=1 << log2m, key=0,
        solver=Bisection() if solver == "bisection" else NewtonIllinois(xtol=1e-9),
        resample_every=resample_every, precompute=precompute if solver == "newton" else None,
        estimator="importance" if solver == "importance" else "plain")
    res = optimize_correlation(param, problem, settings, certify=False, progress=False)
    t = res.timings
    # The first step and the first draw carry the compilations; the rest is steady state
    # (later draws, every resample_every steps, are included in it, amortised).
    first = t["compile_and_first_step"] + t.get("first_draw", 0.0)
    per_step = (t["steps"] - first) / max(1, steps - 1)
    passes = [h["solver_passes"] for h in res.history]
    screened = [h.get("screened", False) for h in res.history]
    return {
        "epochs": epochs, "b": b, "n": b * epochs, "num_samples": 1 << log2m, "solver": solver,
        "resample_every": resample_every if solver == "newton" else 1,
        "steps_run": steps, "compile_and_first_step_s": first,
        "per_step_s": per_step, "steps_total_s": t["steps"], "draws_total_s": t.get("draws", 0.0),
        "extrapolated_300_steps_s": first + 299 * per_step,
        "measured_300_steps": steps == 300,
        "fraction_screened": sum(screened) / max(1, len(screened)),
        "fraction_screen_reused": (sum(h.get("screen_reused", False) for h in res.history)
                                   / max(1, len(res.history))),
        # optimize_correlation's whole wall time: compile, draws, steps, final estimate.
        "optimize_total_s": t["total"],
        "loadavg_at_end": list(os.getloadavg()),
        "mean_solver_passes": sum(passes) / max(1, len(passes)),
        "final_rmse_estimate": res.history[-1]["rmse"] if res.history else None,
        "first_rmse_estimate": res.history[0]["rmse"] if res.history else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "jax_devices": str(jax.devices()),
    }


def profile(epochs: int, b: int, log2m: int) -> dict:
    """Time the pieces of one step (jitted separately, steady state, median of 3)."""
    import jax
    import jax.numpy as jnp
    from dpjax.calibration import DrawPlan, NewtonIllinois, calibrate_on_draws
    from dpjax.montecarlo import draws, gram_matrix, gram_sqrt
    from dpjax.montecarlo.core import delta_from_projections
    from dpjax.optimization import make_parameterization, prefix_sum_error
    from dpjax.calibration.screened import (_screen, _select, calibrate_screened,
                                            default_num_candidates, screened_draws)

    m = 1 << log2m
    param = make_parameterization("blt", b * epochs, num_buffers=BUFFERS)
    with jax.enable_x64(True):
        params = param.init()
        key = jax.random.key(0)
        corr = param.correlation(params)
        gram = gram_matrix(corr, b, epochs)
        sigma = float(calibrate_on_draws(gram, EPS, DELTA, DrawPlan(key=key, num_samples=m)).root)

        def gram_of(p):
            return gram_matrix(param.correlation(p), b, epochs)

        pieces = {
            "gram (modes + M M^T)": (jax.jit(gram_of), (params,)),
            "draws (rng + Box-Muller)": (jax.jit(lambda k: draws(k, b, m)), (key,)),
            "cholesky + W = U L^T": (jax.jit(lambda g, u: u @ gram_sqrt(g).T),
                                     (gram, draws(key, b, m)[1])),
        }
        mi, u = draws(key, b, m)
        w = u @ gram_sqrt(gram).T
        pieces["one delta pass (value)"] = (
            jax.jit(lambda g, w, s: delta_from_projections(g, w, mi, s, EPS)), (gram, w, sigma))
        pieces["one Newton pass (jvp: value+slope)"] = (
            jax.jit(lambda g, w, s: jax.jvp(lambda x: delta_from_projections(g, w, mi, x, EPS),
                                            (s,), (1.0,))), (gram, w, sigma))
        pieces["implicit-gradient reverse pass (vjp)"] = (
            jax.jit(lambda g, w, s: jax.grad(lambda x, gg, ww: delta_from_projections(
                gg, ww, mi, x, EPS), argnums=(0, 1, 2))(s, g, w)), (gram, w, sigma))
        pieces["objective |A C^-1|_F (value+grad)"] = (
            jax.jit(jax.value_and_grad(lambda p: prefix_sum_error(param.correlation(p),
                                                                  b * epochs))), (params,))

        def full(p):
            g = gram_of(p)
            r = calibrate_on_draws(g, EPS, DELTA, DrawPlan(key=key, num_samples=m),
                                   solver=NewtonIllinois(xtol=1e-9), initial_noise=sigma * 1.01)
            return jnp.log(r.root * prefix_sum_error(param.correlation(p), b * epochs))

        pieces["unscreened step (fresh draws, warm start 1%)"] = (jax.jit(jax.value_and_grad(full)),
                                                                  (params,))
        # The screened step's pieces (dpjax.calibration.screened).
        sd = screened_draws(key, b, m)
        lsq = gram_sqrt(gram)
        s0 = jnp.asarray(1.0 / (sigma * 1.01))
        pieces["[screened] draws (shared by R steps)"] = (
            jax.jit(lambda k: screened_draws(k, b, m)), (key,))
        pieces["[screened] gram + cholesky (b x b)"] = (
            jax.jit(lambda p: gram_sqrt(gram_of(p))), (params,))
        pieces["[screened] W32 = U32 L^T (float32 matmul)"] = (
            jax.jit(lambda u32, l: u32 @ l.astype(jnp.float32).T), (sd.u32, lsq))
        w32 = sd.u32 @ lsq.astype(jnp.float32).T
        pieces["[screened] screen losses at sigma_0 (float32)"] = (
            jax.jit(lambda w, g, s: _screen(w, g, sd.mode_index, sd.u_norm, s)), (w32, gram, s0))
        (ypq, yqp), _ = _screen(w32, gram, sd.mode_index, sd.u_norm, s0)
        k = default_num_candidates(m)
        pieces[f"[screened] candidate selection, {k} slots (2 directions)"] = (
            jax.jit(lambda a, c: (_select(a, k), _select(c, k))), (ypq, yqp))

        def screened_fwd(p):
            return calibrate_screened(gram_of(p), EPS, DELTA, sd, solver=NewtonIllinois(xtol=1e-9),
                                      initial_noise=sigma * 1.01).root

        pieces["[screened] calibration forward (all of the above but draws)"] = (
            jax.jit(screened_fwd), (params,))

        def screened_loss(p):
            return jnp.log(screened_fwd(p) * prefix_sum_error(param.correlation(p), b * epochs))

        pieces["[screened] full step (value + gradient, warm start 1%)"] = (
            jax.jit(jax.value_and_grad(screened_loss)), (params,))
        out = {}
        out["loadavg_at_start"] = list(os.getloadavg())
        for name, (fn, args) in pieces.items():
            jax.block_until_ready(fn(*args))
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.append(time.perf_counter() - t0)
            out[name] = sorted(times)[1]
        out["loadavg_at_end"] = list(os.getloadavg())
    return out


def _child(args) -> None:
    if args.profile_one:
        e, b, lm = args.profile_one
        print(json.dumps(profile(e, b, lm)))
        return
    e, b, lm, steps, solver = args.one
    print(json.dumps(run_one(int(e), int(b), int(lm), int(steps), solver, args.resample_every,
                             True if args.screened_above_2_24 else None)))


def _spawn(argv) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    extra = ["--screened-above-2-24"] if SCREENED_ABOVE else []
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--epsilon", str(EPS),
                           "--resample-every", str(RESAMPLE), *extra, *argv], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1500:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    global EPS, RESAMPLE, SCREENED_ABOVE
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="E=16, b=128, 2^17 only; anchor 5 steps")
    ap.add_argument("--configs", nargs="*", default=None, help="ExBxlog2m, e.g. 16x128x17")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--anchor-steps", type=int, default=None,
                    help="steps of the Algorithm-2 anchor (default: --steps; extrapolated to 300)")
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--importance-log2m", type=int, default=11,
                    help="the variance-reduced row's samples per step (log2; its default 2^11); 0: no such row")
    ap.add_argument("--epsilon", type=float, default=EPS, help="target epsilon (Fig. 4: 1)")
    ap.add_argument("--resample-every", type=int, default=RESAMPLE,
                    help="dpjax row: steps sharing one Monte Carlo sample (anchor: always 1)")
    ap.add_argument("--profile", action="store_true", help="per-piece timing at E=16, b=128, 2^17")
    ap.add_argument("--screened-above-2-24", action="store_true",
                    help="dpjax row: the screened path also when m b > 2^24 (precompute=True: the whole "
                         "sample in memory, ~6 GB at m = 2^20, b = 128) instead of the streamed one")
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--profile-one", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_optimize.json"))
    args = ap.parse_args()
    EPS = args.epsilon
    RESAMPLE = args.resample_every
    SCREENED_ABOVE = args.screened_above_2_24
    if args.one or args.profile_one:
        _child(args)
        return
    load = os.getloadavg()
    record = {"machine": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_start": load,
              "note": "shared 2-core CPU under contention from other jobs: absolute times are "
                      "inflated; the anchor/dpjax ratio is from the same run",
              "epsilon": EPS, "delta": DELTA, "family": f"blt, {BUFFERS} buffers",
              "dpjax_resample_every": RESAMPLE, "rows": []}
    if args.profile:
        prof = _spawn(["--profile-one", "16", "128", "17"])
        record["profile_E16_b128_2^17"] = prof
        print("step profile, E=16 b=128 m=2^17 (seconds, median of 3, steady state):")
        for k, v in prof.items():
            print(f"  {k:40s} {v:8.4f}" if isinstance(v, float) else f"  {k}: {v}")
    if args.quick:
        configs = [(16, 128, 17)]
        anchor_steps = args.anchor_steps or 5
    elif args.configs:
        configs = [tuple(int(x) for x in c.split("x")) for c in args.configs]
        anchor_steps = args.anchor_steps or args.steps
    elif args.profile:
        configs = []
        anchor_steps = 0
    else:
        configs = GRID
        anchor_steps = args.anchor_steps or args.steps
    print(f"{'E':>3} {'b':>4} {'m':>8} {'solver':>7} {'steps':>5} {'compile s':>9} {'step s':>8} "
          f"{'300 steps s':>11} {'total s':>8} {'passes':>6} {'reused':>6} {'RSS MB':>7} {'ratio':>6}")
    for e, b, lm in configs:
        row = {"config": f"{e}x{b}x2^{lm}"}
        new = _spawn(["--one", str(e), str(b), str(lm), str(args.steps), "newton"])
        row["dpjax"] = new
        imp = None
        if args.importance_log2m:
            imp = _spawn(["--one", str(e), str(b), str(args.importance_log2m), str(args.steps), "importance"])
            row["dpjax_importance"] = imp
        if not args.no_anchor:
            anc = _spawn(["--one", str(e), str(b), str(lm), str(anchor_steps), "bisection"])
            row["anchor_algorithm2"] = anc
            if "error" not in new and "error" not in anc:
                row["speedup_per_step"] = anc["per_step_s"] / new["per_step_s"]
                row["speedup_300_steps"] = anc["extrapolated_300_steps_s"] / new["extrapolated_300_steps_s"]
        record["rows"].append(row)
        for label, r in (("dpjax", new), ("vr", imp), ("anchor", row.get("anchor_algorithm2"))):
            if r is None:
                continue
            if "error" in r:
                print(f"{e:>3} {b:>4} {1 << lm:>8} {label:>7} ERROR {r['error'][-300:]}")
                continue
            ratio = f"{row.get('speedup_per_step', float('nan')):6.1f}" if label == "anchor" else ""
            print(f"{e:>3} {b:>4} {r['num_samples']:>8} {label:>7} {r['steps_run']:>5} "
                  f"{r['compile_and_first_step_s']:9.2f} {r['per_step_s']:8.3f} "
                  f"{r['extrapolated_300_steps_s']:11.1f} {r['optimize_total_s']:8.1f} "
                  f"{r['mean_solver_passes']:6.1f} {r['fraction_screen_reused']:6.2f} "
                  f"{r['peak_rss_mb']:7.0f} {ratio}")
    record["loadavg_at_end"] = os.getloadavg()
    from _meta import run_metadata

    record["meta"] = run_metadata(__file__)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
