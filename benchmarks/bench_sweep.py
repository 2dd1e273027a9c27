"""dpjax.sweep against dp_accounting's loop and a loop of single dpjax calls, on two distributions.

Distributions (``--dist``):

* ``narrow`` (seed 0; the distribution the sweep was first tuned on): sigma ~ U[0.6, 3], q
  log-uniform in [1e-3, 3e-2], T log-uniform in [1e2, 3e4] (integer), delta = 1e-5.
* ``broad`` (seed 1): sigma ~ U[0.5, 4], q log-uniform in [10^-3.5, 0.1], T log-uniform in
  [1e2, 1e5], delta log-uniform in [1e-8, 1e-4].

Rows per distribution, each measured in a fresh Python process (import included where stated):

* ``dp_accounting``: ``PLDAccountant(value_discretization_interval=1e-4)`` per configuration
  (its documented usage), the first ``--anchor-subset`` configurations, extrapolated per
  configuration when that is fewer than all.
* ``single-call loop``: ``dpjax.dpsgd_epsilon`` per configuration, persistent cache off: first
  pass (import and every compile included) and second pass (same process).
* ``sweep``: ``dpjax.sweep(configs)`` (brackets on), persistent cache off: first pass (import,
  planning, compiles included) and second pass (same process).
* ``CLI cold`` / ``CLI warm``: ``python -m dpjax sweep --grid FILE --json`` twice with one fresh
  persistent-cache directory: the whole process, the first time with an empty cache, the second
  time warm.
* ``alternating`` (``--alternate R``): one process that runs the sweep and the single-call loop
  once (compiles), then ``R`` rounds of dp_accounting's loop, the sweep and the single-call loop,
  one after the other: the steady-state ratios from neighbouring measurements, robust to the
  load drifting between processes.  The same rounds also time the two same-work comparisons:
  the sweep without the lower end (``with_lower=False``) against the ``dpsgd_epsilon`` loop
  (both upper ends only), and the default sweep against a loop of ``dpsgd_accounting`` (both
  certified brackets).

Every row records wall time and CPU time (user + sys, all threads).  The machine this runs on is
a 2-core CPU usually shared with other jobs: absolute times move with the load (recorded before
and after each row), so speedups are taken against the anchor measured in the same run, and
``--repeat`` alternates the whole set of rows.

Accuracy: every sweep row is compared with dp_accounting at 1e-4; rows outside
[-2e-3, +3e-3] relative are re-checked against dp_accounting at ``--fine-interval`` (1e-6), the
fine reference where the 1e-4 grid is too coarse (small epsilons).  Soundness: dp_accounting's
value must lie at or above the sweep's certified lower end.

``--base PATH`` also runs the dpjax rows from another checkout (e.g. main) in the same run,
alternating, for a before/after comparison.

Device mode (``--device-configs N``; no dp_accounting needed): on JAX's default device (GPU if
there is one), the broad distribution (``--dist`` picks another): ``dpjax.sweep`` first pass
and second pass in one process with the persistent cache off (the Python API's default), a
first pass in a process with an empty persistent cache, and one in a second process with that
cache warm.  Prints and writes JSON (``benchmarks/results/bench_sweep_device.json``; the CPU
distributions write ``bench_sweep_narrow.json`` and ``bench_sweep_broad.json``).

    python benchmarks/bench_sweep.py --dist broad --broad-configs 120 [--repeat 2]
    python benchmarks/bench_sweep.py --dist narrow --narrow-configs 1000 --anchor-subset 100
    python benchmarks/bench_sweep.py --device-configs 10000 --no-anchor
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

CONFIGS = r"""
import numpy as np
def configs(dist, n):
    if dist == "narrow":
        rng = np.random.default_rng(0)
        return [dict(noise_multiplier=float(rng.uniform(0.6, 3.0)),
                     sampling_prob=float(10 ** rng.uniform(-3, np.log10(3e-2))),
                     steps=int(10 ** rng.uniform(2, np.log10(3e4))), delta=1e-5) for _ in range(n)]
    rng = np.random.default_rng(1)
    return [dict(noise_multiplier=float(rng.uniform(0.5, 4.0)), sampling_prob=float(10 ** rng.uniform(-3.5, -1)),
                 steps=int(10 ** rng.uniform(2, 5)), delta=float(10 ** rng.uniform(-8, -4))) for _ in range(n)]
"""

SWEEP_SNIPPET = CONFIGS + r"""
import time, json
DIST, N, PASSES, WITH_LOWER = {dist!r}, {n}, {passes}, {with_lower}
cfg = configs(DIST, N)
t0, c0 = time.perf_counter(), time.process_time()
import dpjax
t_import = time.perf_counter() - t0
out = dict(import_s=t_import)
for k in range(PASSES):
    if k:
        t0, c0 = time.perf_counter(), time.process_time()
    table = dpjax.sweep(cfg, with_lower=WITH_LOWER, progress=False)
    out[f"pass{{k + 1}}_s"] = time.perf_counter() - t0
    out[f"pass{{k + 1}}_cpu_s"] = time.process_time() - c0
    out[f"pass{{k + 1}}_programs"] = table.programs
import jax  # the device, for the record (after the clocks: a host sweep never imports JAX)
out.update(device=str(jax.devices()[0]), devices=len(jax.devices()), jax=jax.__version__)
out.update(epsilon=[r["epsilon"] for r in table.rows], lower=[r["lower"] for r in table.rows],
           n=[r["n"] for r in table.rows], path=[r["path"] for r in table.rows])
print(json.dumps(out))
"""

LOOP_SNIPPET = CONFIGS + r"""
import time, json
DIST, N = {dist!r}, {n}
cfg = configs(DIST, N)
t0, c0 = time.perf_counter(), time.process_time()
import dpjax
out = dict()
for k in range(2):
    if k:
        t0, c0 = time.perf_counter(), time.process_time()
    eps = [dpjax.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"]) for c in cfg]
    out[f"pass{{k + 1}}_s"] = time.perf_counter() - t0
    out[f"pass{{k + 1}}_cpu_s"] = time.process_time() - c0
out["epsilon"] = [float(e) for e in eps]
print(json.dumps(out))
"""

DPA_SNIPPET = CONFIGS + r"""
import time, json
DIST, N, M, INTERVAL, ONLY = {dist!r}, {n}, {m}, {interval}, {only}
cfg = configs(DIST, N)
idx = list(range(M)) if ONLY is None else ONLY
t0, c0 = time.perf_counter(), time.process_time()
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
eps = []
for i in idx:
    c = cfg[i]
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=INTERVAL)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(c["sampling_prob"], dp_accounting.GaussianDpEvent(c["noise_multiplier"])),
        c["steps"]))
    eps.append(acc.get_epsilon(c["delta"]))
print(json.dumps(dict(seconds=time.perf_counter() - t0, cpu_s=time.process_time() - c0, epsilon=eps, index=idx)))
"""

ALTERNATE_SNIPPET = CONFIGS + r"""
import time, json
DIST, N, ROUNDS = {dist!r}, {n}, {rounds}
cfg = configs(DIST, N)
import numpy as np
import dpjax
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

def dpa_loop():
    for c in cfg:
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            c["sampling_prob"], dp_accounting.GaussianDpEvent(c["noise_multiplier"])), c["steps"]))
        acc.get_epsilon(c["delta"])

def sweep():
    dpjax.sweep(cfg, progress=False)

def loop():
    for c in cfg:
        dpjax.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"])

# The same work on both sides: the sweep's upper ends alone against the loop of dpsgd_epsilon
# (upper ends), and the loop of dpsgd_accounting (certified brackets) against the default sweep.
def sweep_upper():
    dpjax.sweep(cfg, progress=False, with_lower=False)

def loop_bracket():
    for c in cfg:
        dpjax.pld.dpsgd_accounting(c["noise_multiplier"], c["sampling_prob"], c["steps"], target_delta=c["delta"])

def timed(f):
    t, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - t, time.process_time() - c

parts = (("dpa", dpa_loop), ("sweep", sweep), ("loop", loop), ("sweep_upper", sweep_upper),
         ("loop_bracket", loop_bracket))
for name, f in parts[1:]:
    f()   # first passes (compiles): the rows below are steady state
out = {{name: [] for name, _ in parts}}
for _ in range(ROUNDS):
    for name, f in parts:
        out[name].append(timed(f))
print(json.dumps(out))
"""

WRITE_GRID = CONFIGS + r"""
import json, sys
json.dump(configs({dist!r}, {n}), open(sys.argv[1], "w"))
"""


def _env(root: pathlib.Path, cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPJAX_COMPILATION_CACHE"] = cache         # "0": nothing persisted, nothing read
    env["DPJAX_PROGRESS"] = "0"
    return env


def _run(cmd, root: pathlib.Path, cache: str = "0", parse: bool = True):
    """Run ``cmd`` in a fresh process; (parsed last stdout line or None, wall s, child CPU s, load)."""
    load = os.getloadavg()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(root, cache), cwd=str(root))
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if out.returncode != 0:
        raise RuntimeError(" ".join(map(str, cmd[:3])) + "\n" + out.stderr[-3000:])
    data = json.loads(out.stdout.strip().splitlines()[-1]) if parse else None
    return data, wall, cpu, dict(load_before=load, load_after=os.getloadavg()[0])


def _py(code: str, root: pathlib.Path, cache: str = "0"):
    return _run([sys.executable, "-c", code], root, cache)


def _cli_pair(dist: str, n: int, root: pathlib.Path, with_lower: bool):
    """``dpjax sweep`` twice on one fresh cache directory: (cold, warm) rows."""
    with tempfile.TemporaryDirectory() as tmp:
        grid = os.path.join(tmp, "configs.json")
        subprocess.run([sys.executable, "-c", WRITE_GRID.format(dist=dist, n=n), grid], check=True)
        cache = os.path.join(tmp, "cache")
        cmd = [sys.executable, "-m", "dpjax", "sweep", "--grid", grid, "--json", "--quiet"]
        if not with_lower:
            cmd.append("--no-lower")
        rows = []
        for label in ("CLI cold (empty persistent cache)", "CLI warm (second process, same cache)"):
            data, wall, cpu, load = _run(cmd, root, cache)
            rows.append(dict(row=label, seconds=wall, cpu_s=cpu, programs=data.get("programs"),
                             sweep_seconds=data.get("seconds"), **load))
    return rows


def _fine(dist, n, i, interval, root):
    """dp_accounting at ``interval`` on configuration ``i``, in its own process (memory capped at
    8 GiB, 15 minutes); None if it does not finish."""
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))\n"
            + DPA_SNIPPET.format(dist=dist, n=n, m=0, interval=interval, only=[i]))
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(root, "0"),
                             cwd=str(root), timeout=900)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["epsilon"][0]


def _accuracy(dist, n, sweep, dpa, fine_interval, root):
    """Sweep rows against dp_accounting (1e-4).  A row below it by more than 2e-3 relative is
    re-checked against dp_accounting at the fine interval (its 1e-4 grid overestimates small
    epsilons); a row above it by more than 3e-3 needs no re-check (a finer grid only lowers
    dp_accounting's estimate) and counts as outside."""
    lo_tol, hi_tol = -2e-3, 3e-3
    idx = dpa["index"]
    rel = {i: (sweep["epsilon"][i] - e) / e for i, e in zip(idx, dpa["epsilon"]) if e > 0}
    outside = [i for i, r in rel.items() if not (lo_tol <= r <= hi_tol)]
    below_lower = [i for i, e in zip(idx, dpa["epsilon"]) if e < sweep["lower"][i]]
    fine = {}
    for i in outside:
        if rel[i] < lo_tol:
            e = _fine(dist, n, i, fine_interval, root)
            if e is not None:
                fine[i] = e
    final = dict(rel)
    for i, e in fine.items():
        final[i] = (sweep["epsilon"][i] - e) / e
    worst_lo = min(final.values(), default=0.0)
    worst_hi = max(final.values(), default=0.0)
    bad = sorted(i for i, r in final.items() if not (lo_tol <= r <= hi_tol))
    return dict(compared=len(rel), outside_at_1e4=len(outside), rechecked_at=fine_interval if outside else None,
                min_rel=worst_lo, max_rel=worst_hi, outside_after_recheck=bad,
                within_tolerance=not bad, tolerance=[lo_tol, hi_tol],
                dp_accounting_below_sweep_lower=below_lower,
                fine_rechecks={str(i): dict(sweep=sweep["epsilon"][i], dp_accounting_1e4=dpa["epsilon"][idx.index(i)],
                                            fine=fine[i]) for i in fine})


def _table(title, rows, anchor):
    print(f"\n{title}")
    print(f"{'row':58} {'wall s':>8} {'cpu s':>8} {'x dpa':>7} {'load':>5}")
    for r in rows:
        sp = anchor / r["seconds"] if anchor and r["seconds"] > 0 else None
        r["speedup_vs_dp_accounting"] = sp
        print(f"{r['row'][:58]:58} {r['seconds']:8.2f} {r.get('cpu_s', float('nan')):8.2f} "
              f"{'' if sp is None else f'{sp:6.1f}x':>7} {r.get('load_before', 0):5.1f}")


def bench_distribution(dist, n, args, roots):
    m = min(args.anchor_subset or n, n)
    result = dict(dist=dist, configs=n, anchor_subset=m, rounds=[])
    for rep in range(args.repeat):
        rows, extra = [], {}
        dpa = None
        if not args.no_anchor:
            dpa, wall, cpu, load = _py(DPA_SNIPPET.format(dist=dist, n=n, m=m, interval=1e-4, only=None), roots["after"])
            per = wall / m
            rows.append(dict(row=f"dp_accounting loop (1e-4; import incl.){' extrapolated' if m < n else ''}",
                             seconds=per * n, measured_seconds=wall, measured_configs=m, cpu_s=cpu * n / m, **load))
        for side, root in roots.items():
            tag = "" if side == "after" else f" [{side}]"
            data, wall, cpu, load = _py(SWEEP_SNIPPET.format(dist=dist, n=n, passes=2, with_lower=not args.no_lower),
                                        root)
            rows.append(dict(row=f"sweep first pass (in process, empty cache){tag}", seconds=data["pass1_s"],
                             cpu_s=data["pass1_cpu_s"], programs=data["pass1_programs"], import_s=data["import_s"],
                             process_wall_s=wall, **load))
            rows.append(dict(row=f"sweep second pass (same process){tag}", seconds=data["pass2_s"],
                             cpu_s=data["pass2_cpu_s"], programs=data["pass2_programs"], **load))
            extra[side] = data
            if not args.no_cli:
                for r in _cli_pair(dist, n, root, not args.no_lower):
                    r["row"] += tag
                    rows.append(r)
            if not args.no_loop:
                ln = min(n, args.loop_subset or n)
                loop, wall, cpu, load = _py(LOOP_SNIPPET.format(dist=dist, n=ln), root)
                scale = n / ln
                rows.append(dict(row=f"single-call loop first pass (dpsgd_epsilon){tag}", seconds=loop["pass1_s"] * scale,
                                 cpu_s=loop["pass1_cpu_s"] * scale, measured_configs=ln, **load))
                rows.append(dict(row=f"single-call loop second pass{tag}", seconds=loop["pass2_s"] * scale,
                                 cpu_s=loop["pass2_cpu_s"] * scale, measured_configs=ln, **load))
        if args.alternate and not args.no_anchor:
            alt, wall, cpu, load = _py(ALTERNATE_SNIPPET.format(dist=dist, n=n, rounds=args.alternate), roots["after"])
            ratios = dict(
                sweep_vs_dp_accounting=[d[0] / s_[0] for d, s_ in zip(alt["dpa"], alt["sweep"])],
                sweep_vs_loop=[l[0] / s_[0] for l, s_ in zip(alt["loop"], alt["sweep"])],
                sweep_vs_dp_accounting_cpu=[d[1] / s_[1] for d, s_ in zip(alt["dpa"], alt["sweep"])],
                sweep_vs_loop_cpu=[l[1] / s_[1] for l, s_ in zip(alt["loop"], alt["sweep"])],
                sweep_upper_vs_loop=[l[0] / s_[0] for l, s_ in zip(alt["loop"], alt["sweep_upper"])],
                sweep_vs_loop_bracket=[l[0] / s_[0] for l, s_ in zip(alt["loop_bracket"], alt["sweep"])])
            extra["alternating"] = dict(times=alt, ratios=ratios, **load)
        anchor = rows[0]["seconds"] if dpa is not None else None
        _table(f"{dist}: {n} configurations, round {rep + 1}/{args.repeat}"
               + (f" (dp_accounting timed on {m}, extrapolated)" if dpa is not None and m < n else ""), rows, anchor)
        rnd = dict(rows=rows, programs=extra["after"]["pass1_programs"])
        if "alternating" in extra:
            rnd["alternating"] = extra["alternating"]
            r = extra["alternating"]["ratios"]
            t = extra["alternating"]["times"]
            print("steady state in one process, alternating dp_accounting / sweep / single-call loop "
                  f"({args.alternate} rounds): " + "; ".join(
                      f"dp_accounting {d[0]:.1f} s, sweep {s_[0]:.2f} s, loop {l[0]:.2f} s"
                      for d, s_, l in zip(t["dpa"], t["sweep"], t["loop"])))
            print("  sweep second pass vs dp_accounting: " + ", ".join(f"{x:.1f}x" for x in r["sweep_vs_dp_accounting"])
                  + "; vs the single-call loop: " + ", ".join(f"{x:.2f}x" for x in r["sweep_vs_loop"])
                  + " (CPU: " + ", ".join(f"{x:.1f}x" for x in r["sweep_vs_dp_accounting_cpu"]) + "; "
                  + ", ".join(f"{x:.2f}x" for x in r["sweep_vs_loop_cpu"]) + ")")
            print("  same work: sweep upper ends only vs the dpsgd_epsilon loop: "
                  + ", ".join(f"{x:.2f}x" for x in r["sweep_upper_vs_loop"])
                  + "; sweep (brackets) vs a dpsgd_accounting loop (brackets): "
                  + ", ".join(f"{x:.2f}x" for x in r["sweep_vs_loop_bracket"]))
        sweep2 = next(r for r in rows if r["row"] == "sweep second pass (same process)")
        loop2 = next((r for r in rows if r["row"] == "single-call loop second pass"), None)
        if loop2 is not None:
            rnd["sweep_second_vs_loop_second"] = loop2["seconds"] / sweep2["seconds"]
            rnd["sweep_second_vs_loop_second_cpu"] = loop2["cpu_s"] / sweep2["cpu_s"]
            print(f"sweep second pass vs single-call loop second pass: {rnd['sweep_second_vs_loop_second']:.2f}x wall, "
                  f"{rnd['sweep_second_vs_loop_second_cpu']:.2f}x CPU")
        if dpa is not None and rep == 0:
            acc = _accuracy(dist, n, extra["after"], dpa, args.fine_interval, roots["after"])
            rnd["accuracy"] = acc
            print(f"accuracy: {acc['compared']} rows vs dp_accounting 1e-4, {acc['outside_at_1e4']} outside "
                  f"[-2e-3, +3e-3] re-checked at {acc['rechecked_at']}; after re-check relative error in "
                  f"[{acc['min_rel']:.2e}, {acc['max_rel']:.2e}], outside: {acc['outside_after_recheck']}; "
                  f"dp_accounting below the sweep's certified lower end on {len(acc['dp_accounting_below_sweep_lower'])}")
        if "base" in extra:
            same = sum(a == b for a, b in zip(extra["base"]["epsilon"], extra["after"]["epsilon"]))
            rel = max(abs(a - b) / b for a, b in zip(extra["after"]["epsilon"], extra["base"]["epsilon"]) if b > 0)
            rnd["vs_base"] = dict(identical_rows=same, max_rel_diff=rel)
            print(f"vs base: {same}/{n} rows identical, max relative difference {rel:.2e}")
        result["rounds"].append(rnd)
    return result


DEVICE_SNIPPET = CONFIGS + r"""
import time, json
DIST, N, PASSES = {dist!r}, {n}, {passes}
cfg = configs(DIST, N)
t0 = time.perf_counter()
import dpjax, jax
from dpjax.pld import cache
cache.enable_from_environment(default_on=False)
out = dict(import_s=time.perf_counter() - t0, device=str(jax.devices()[0]), devices=len(jax.devices()),
           jax=jax.__version__, backend=jax.default_backend())
for k in range(PASSES):
    t0 = time.perf_counter()
    table = dpjax.sweep(cfg, progress=False)
    out[f"pass{{k + 1}}_s"] = time.perf_counter() - t0
    out[f"pass{{k + 1}}_programs"] = table.programs
    out[f"pass{{k + 1}}_compiled"] = table.compiled
    out[f"pass{{k + 1}}_loaded"] = table.loaded
    print(json.dumps({{f"pass{{k + 1}}_s": out[f"pass{{k + 1}}_s"]}}), flush=True)
eps = [r["epsilon"] for r in table.rows]
out.update(epsilon_median=sorted(eps)[len(eps) // 2], rows_inf=sum(e == float("inf") for e in eps),
           paths={{p: sum(r["path"] == p for r in table.rows) for p in set(r["path"] for r in table.rows)}})
print(json.dumps(out))
"""


def device_mode(args):
    """Three fresh processes on JAX's default device: the persistent cache off (first and second
    pass: the Python API's default), then on with an empty directory (first pass: a first CLI
    run) and again warm (first pass of a second process)."""
    n, dist = args.device_configs, (args.dist if args.dist != "both" else "broad")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        first, wall1, _, load1 = _py(DEVICE_SNIPPET.format(dist=dist, n=n, passes=2), ROOT, "0")
        rows.append(dict(row="first pass (fresh process, persistent cache off)", seconds=first["pass1_s"],
                         programs=first["pass1_programs"], compiled=first["pass1_compiled"], import_s=first["import_s"],
                         process_wall_s=wall1, **load1))
        rows.append(dict(row="second pass (same process)", seconds=first["pass2_s"], programs=first["pass2_programs"]))
        cold, wall2, _, load2 = _py(DEVICE_SNIPPET.format(dist=dist, n=n, passes=1), ROOT, cache)
        rows.append(dict(row="first pass, persistent cache on and empty (fresh process)", seconds=cold["pass1_s"],
                         programs=cold["pass1_programs"], compiled=cold["pass1_compiled"], import_s=cold["import_s"],
                         process_wall_s=wall2, **load2))
        warm, wall3, _, load3 = _py(DEVICE_SNIPPET.format(dist=dist, n=n, passes=1), ROOT, cache)
        rows.append(dict(row="second process, warm persistent cache (its first pass)", seconds=warm["pass1_s"],
                         programs=warm["pass1_programs"], compiled=warm["pass1_compiled"],
                         loaded=warm["pass1_loaded"], import_s=warm["import_s"], process_wall_s=wall3, **load3))
    print(f"\ndevice mode: {n} configurations ({dist}) on {first['device']} ({first['backend']}, jax {first['jax']})")
    for r in rows:
        print(f"{r['row']:62} {r['seconds']:8.2f} s  programs {r['programs']}, compiled {r.get('compiled', 0)}")
    print(f"epsilon median {first['epsilon_median']:.4g}, rows inf {first['rows_inf']}, paths {first['paths']}")
    return dict(mode="device", dist=dist, configs=n, rows=rows, device=first["device"], backend=first["backend"],
                jax=first["jax"], epsilon_median=first["epsilon_median"], rows_inf=first["rows_inf"],
                paths=first["paths"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", choices=("narrow", "broad", "both"), default="both")
    ap.add_argument("--narrow-configs", type=int, default=1000)
    ap.add_argument("--broad-configs", type=int, default=120)
    ap.add_argument("--anchor-subset", type=int, default=None,
                    help="time dp_accounting on the first N configurations and extrapolate (default: all)")
    ap.add_argument("--loop-subset", type=int, default=None,
                    help="time the single-call loop on the first N configurations and extrapolate (default: all)")
    ap.add_argument("--fine-interval", type=float, default=1e-6)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every row, alternating")
    ap.add_argument("--alternate", type=int, default=3,
                    help="rounds of dp_accounting / sweep / single-call loop steady states alternating in one "
                         "process (0: skip)")
    ap.add_argument("--base", default=None, help="another checkout whose dpjax rows run alongside (before/after)")
    ap.add_argument("--no-anchor", action="store_true", help="skip dp_accounting (and the accuracy check)")
    ap.add_argument("--no-loop", action="store_true", help="skip the single-call loop")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI processes")
    ap.add_argument("--no-lower", action="store_true", help="sweep without the lower end of the bracket")
    ap.add_argument("--device-configs", type=int, default=None,
                    help="device mode: this many configurations on JAX's default device (no dp_accounting)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from importlib import metadata

    # JAX is not imported here: on an accelerator this process would take the device's memory
    # from the child processes that measure (the children record the backend and devices).
    machine = dict(platform=platform.platform(), python=platform.python_version(), cpu_count=os.cpu_count(),
                   jax=metadata.version("jax"), loadavg_start=os.getloadavg())
    results = ROOT / "benchmarks" / "results"
    if args.device_configs is not None:
        out = device_mode(args)
        _write(out, pathlib.Path(args.out) if args.out else results / "bench_sweep_device.json", machine, argv)
        return
    roots = {"after": ROOT}
    if args.base:
        roots = {"base": pathlib.Path(args.base).resolve(), "after": ROOT}
    dists = ("narrow", "broad") if args.dist == "both" else (args.dist,)
    if args.out and len(dists) > 1:
        ap.error("--out names one file: give --dist narrow or --dist broad with it")
    for d in dists:   # one file per distribution, written as soon as it is measured
        out = dict(benchmark="bench_sweep", repeat=args.repeat, with_lower=not args.no_lower, base=args.base,
                   note="2-core CPU shared with other jobs: load averages recorded per row; speedups against "
                        "the dp_accounting loop measured in the same round",
                   results=[bench_distribution(d, args.narrow_configs if d == "narrow" else args.broad_configs,
                                               args, roots)])
        _write(out, pathlib.Path(args.out) if args.out else results / f"bench_sweep_{d}.json", machine, argv)

def _write(out: dict, path: pathlib.Path, machine: dict, argv) -> None:
    from _meta import run_metadata

    out["machine"] = dict(machine, loadavg_end=os.getloadavg())
    out["meta"] = run_metadata(__file__, argv)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
