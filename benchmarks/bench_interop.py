"""Interop with dp_accounting and a running accountant: dpjax vs the anchors, side by side.

Three parts, all in one process, delta = 1e-5:

1. ``events``: the 20 DpEvents of tests/interop/test_interop_dp_accounting.py (nested compositions
   included).  dpjax ``dpjax.interop.PLDAccountant().compose(e).get_epsilon(1e-5)`` vs
   dp_accounting 0.6.0 ``PLDAccountant(value_discretization_interval=1e-5)`` (pessimistic,
   the anchor) and its optimistic estimate at 1e-5 (a lower bound on the truth: dpjax must not
   go below it).  Relative difference and wall time of each (dpjax's first call includes JIT
   compilation when the grid size is new; dp_accounting is NumPy, nothing to compile).
2. ``calibrate``: ``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` for DP-SGD
   (q = 0.01, T = 1000, eps = 2) with dpjax's accountant vs dp_accounting's (default interval
   1e-4): sigma, relative difference, wall time (dpjax: first run = compile + run, then a
   second run = steady state).
3. ``running``: 20 epochs of 100 steps (sigma 1, q = 0.01); query epsilon after every epoch
   with ``RunningAccountant(horizon=2000)`` (fixed grid), ``RunningAccountant()`` (full
   composition, cached) and 20 fresh ``dpjax.dpsgd_epsilon`` calls; each variant in its own
   fresh process: total wall time of the 20 queries cold (compilation inside, as a training
   loop sees it) and again in the same process (steady state); ratios fresh / running.

The machine is shared (2 cores, several concurrent jobs): absolute times are inflated; the
ratios are measured side by side in one run.  Prints a table and writes
``benchmarks/results/bench_interop.json``.

    python benchmarks/bench_interop.py [--parts events,calibrate,running] [--interval 1e-5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load_events():
    spec = importlib.util.spec_from_file_location("_events", ROOT / "tests" / "interop" / "test_interop_dp_accounting.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def part_events(interval, start=0, stop=None):

    from dpjax.interop import PLDAccountant, events_to_components

    mod = _load_events()
    rows = []
    for name, event, rel in mod.EVENTS[start:stop]:
        t0 = time.perf_counter()
        ours = PLDAccountant(rel).compose(event).get_epsilon(1e-5)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        comps = events_to_components(event, rel)[0]
        theirs = mod.anchor_epsilon(event, rel, comps, 1e-5, interval)  # RR: dp_accounting's PLDs composed directly
        t_theirs = time.perf_counter() - t0
        floor = mod.optimistic_floor(comps, 1e-5, interval)
        row = dict(event=name, dpjax=ours, dp_accounting=theirs, floor=floor, rel_diff=(ours - theirs) / theirs,
                   above_floor=ours >= floor, dpjax_s=t_ours, dp_accounting_s=t_theirs)
        rows.append(row)
        print(f"{name:34s} dpjax {ours:10.6f}  dp_acc {theirs:10.6f}  floor {floor:10.6f}  "
              f"rel {row['rel_diff']:+.2e}  {t_ours:6.2f}s vs {t_theirs:6.2f}s", flush=True)
    worst = max(abs(r["rel_diff"]) for r in rows)
    print(f"worst |rel diff| {worst:.2e}; all above floor: {all(r['above_floor'] for r in rows)}")
    return dict(rows=rows, worst_rel_diff=worst, interval=interval,
                all_above_floor=all(r["above_floor"] for r in rows))


def part_calibrate():
    import dp_accounting as dpa

    from dpjax.interop import PLDAccountant

    def make(s):
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(s)), 1000)

    cal = dpa.mechanism_calibration.calibrate_dp_mechanism
    out = {}
    for label, acc in (("dpjax_first", PLDAccountant), ("dpjax_steady", PLDAccountant),
                       ("dp_accounting", dpa.pld.PLDAccountant)):
        t0 = time.perf_counter()
        sigma = cal(acc, make, 2.0, 1e-5)
        out[label] = dict(sigma=sigma, seconds=time.perf_counter() - t0)
        print(f"calibrate_dp_mechanism [{label:13s}] sigma {sigma:.8f}  {out[label]['seconds']:.2f}s", flush=True)
    out["rel_diff"] = out["dpjax_steady"]["sigma"] / out["dp_accounting"]["sigma"] - 1
    out["speedup_first"] = out["dp_accounting"]["seconds"] / out["dpjax_first"]["seconds"]
    out["speedup_steady"] = out["dp_accounting"]["seconds"] / out["dpjax_steady"]["seconds"]
    print(f"sigma rel diff {out['rel_diff']:+.2e}; dp_accounting / dpjax time: first {out['speedup_first']:.2f}x, "
          f"steady {out['speedup_steady']:.2f}x")
    return out


RUNNING_SCRIPT = r"""
import json, sys, time
t_import = time.perf_counter()
import dpjax
from dpjax.interop import RunningAccountant
label, epochs, spe, sigma, q, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
runs = []
for r in range(repeats):
    acc = RunningAccountant(horizon=epochs * spe) if label == "fixed_grid" else RunningAccountant()
    eps, times = [], []
    for e in range(1, epochs + 1):
        acc.step(noise_multiplier=sigma, sample_rate=q, num_steps=spe)
        t0 = time.perf_counter()
        eps.append(dpjax.dpsgd_epsilon(sigma, q, e * spe, 1e-5) if label == "fresh" else acc.get_epsilon(1e-5))
        times.append(time.perf_counter() - t0)
    runs.append(dict(total_s=sum(times), first_s=times[0], per_query_s=times, epsilons=eps))
print(json.dumps(runs))
"""


def part_running(epochs=20, steps_per_epoch=100, sigma=1.0, q=0.01, repeats=2):
    """Each variant in its own fresh process: run 1 = cold (compilation inside, as a training
    loop sees it), run 2 = the same 20 queries again in that process (steady state)."""
    import subprocess

    out = {}
    for label in ("fixed_grid", "fresh", "full"):
        proc = subprocess.run([sys.executable, "-c", RUNNING_SCRIPT, label, str(epochs), str(steps_per_epoch),
                               str(sigma), str(q), str(repeats)], capture_output=True, text=True, check=True,
                              env=dict(__import__("os").environ, PYTHONPATH=str(ROOT)))
        runs = json.loads(proc.stdout.strip().splitlines()[-1])
        out[label] = dict(cold=runs[0], steady=runs[-1])
        print(f"running [{label:10s}] 20 queries: cold {runs[0]['total_s']:7.2f}s (first {runs[0]['first_s']:.2f}s), "
              f"steady {runs[-1]['total_s']:6.2f}s; final eps {runs[0]['epsilons'][-1]:.6f}", flush=True)
    for kind in ("cold", "steady"):
        out[f"ratio_fresh_over_fixed_grid_{kind}"] = out["fresh"][kind]["total_s"] / out["fixed_grid"][kind]["total_s"]
        out[f"ratio_fresh_over_full_{kind}"] = out["fresh"][kind]["total_s"] / out["full"][kind]["total_s"]
    out["max_rel_diff_fixed_grid_vs_fresh"] = max(abs(a / b - 1) for a, b in zip(
        out["fixed_grid"]["cold"]["epsilons"], out["fresh"]["cold"]["epsilons"]))
    out["full_equals_fresh"] = out["full"]["cold"]["epsilons"] == out["fresh"]["cold"]["epsilons"]
    print(f"fresh / running (fixed grid): cold {out['ratio_fresh_over_fixed_grid_cold']:.2f}x, steady "
          f"{out['ratio_fresh_over_fixed_grid_steady']:.2f}x; fresh / running (full): cold "
          f"{out['ratio_fresh_over_full_cold']:.2f}x, steady {out['ratio_fresh_over_full_steady']:.2f}x; fixed-grid eps "
          f"within {out['max_rel_diff_fixed_grid_vs_fresh']:.1e} of fresh; full == fresh: {out['full_equals_fresh']}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="events,calibrate,running")
    ap.add_argument("--interval", type=float, default=1e-5, help="dp_accounting's value_discretization_interval")
    ap.add_argument("--start", type=int, default=0, help="skip the first START events (resume a partial run)")
    ap.add_argument("--stop", type=int, default=None, help="stop before event STOP")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    from _meta import run_metadata

    # Each part carries its own record: the file merges parts from separate runs.
    meta = run_metadata(__file__, argv)
    out = dict(machine=platform.platform(), python=platform.python_version(),
               note="shared 2-core machine under contention: absolute times inflated; ratios side by side")
    if "events" in parts:
        key = "events" if (args.start, args.stop) == (0, None) else f"events_{args.start}_{args.stop}"
        out[key] = {**part_events(args.interval, args.start, args.stop), "meta": meta}
    if "calibrate" in parts:
        out["calibrate"] = {**part_calibrate(), "meta": meta}
    if "running" in parts:
        out["running"] = {**part_running(), "meta": meta}
    path = ROOT / "benchmarks" / "results" / "bench_interop.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(path.read_text()) if path.exists() else {}
    previous.update(out)
    path.write_text(json.dumps(previous, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
