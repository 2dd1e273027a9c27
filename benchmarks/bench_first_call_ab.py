"""First call and steady state of two (or more) dpjax revisions, side by side in alternating
fresh processes on one machine.

Revisions: ``--base`` and ``--after`` each take a directory holding a dpjax checkout, or a git
revision of this repository (exported with ``git archive`` into a temporary directory).  Each
fresh process runs with that directory first on ``PYTHONPATH`` and as its working directory, so
it imports that revision's ``dpjax`` (the child checks).  ``--after`` defaults to this working
tree, uncommitted edits included.  ``--chain REV,REV,...`` measures more than two revisions
round-robin and attributes the change between each revision and the one before it.

Modes:

* ``--mode first`` (default): per case, wall time and CPU time (user + sys of the child, all
  threads; less sensitive than wall time to other processes on a loaded machine, though not
  immune: caches and hyper-threads are shared).  Python cases: fresh process, persistent cache
  off, import included.  CLI cases: ``python -m dpjax ...`` twice with a fresh cache directory;
  ``wall_s``/``cpu_s`` are the second (warm-cache) run, ``first_*`` the first.
* ``--mode steady``: per case, a fresh process (x64 off, persistent cache off) imports dpjax and
  makes the first call (``first_s`` wall, ``first_cpu_s`` CPU time: import included, as in
  ``--mode first``), then ``--calls`` warm calls: ``steady_s`` is their median wall time,
  ``steady_cpu_s`` the median CPU time of the process (all threads) per call.  Cases: B1 and B6 (``dpjax.dpsgd_epsilon``), a group case and
  a heterogeneous (three-phase) noise schedule.  The summary gives per case and revision the
  median over ``--repeat`` processes, the spread, and per repeat the ratio of the other revision's
  steady state to this one's (``> 1``: faster), plus the largest difference of the values.

Repeats alternate the order of the revisions (forward, then backward) so that neither always
runs first.  Check ``uptime`` before trusting wall times; ``load1`` is recorded per row.

    python benchmarks/bench_first_call_ab.py --base 89d5c62 --mode steady --repeat 4
    python benchmarks/bench_first_call_ab.py --chain 89d5c62,43cffde,...,HEAD --mode steady \\
        --cases B1,B6 --repeat 3 --out benchmarks/results/bench_first_call_ab_attribution.json
    python benchmarks/bench_first_call_ab.py --base /path/to/other/checkout \\
        [--cases dpsgd_epsilon,cli:epsilon] [--repeat 1]
"""
import argparse, atexit, io, json, os, pathlib, resource, shutil, statistics, subprocess, sys, tarfile, tempfile, time

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
WRAP = """
import time, json
t0 = time.perf_counter()
{code}
print(json.dumps(dict(seconds=time.perf_counter() - t0, value=float(r))))
"""
PY = {
 "dpsgd_epsilon": "import dpjax\nr = dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)",
 "dpsgd_delta": "import dpjax\nr = dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0)",
 "dpsgd_noise_multiplier": "import dpjax\nr = dpjax.dpsgd_noise_multiplier(0.01, 1000, 2.0, 1e-5)",
 "import_jax_first_array": "import jax, jax.numpy as jnp\nr = float(jnp.ones(()) + 1)",
 "dp_accounting_epsilon": "import dp_accounting\nfrom dp_accounting.pld import pld_privacy_accountant as p\na = p.PLDAccountant(value_discretization_interval=1e-4)\na.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 1000))\nr = a.get_epsilon(1e-5)",
}
CLI = {
 "cli:epsilon": ["epsilon", "--noise-multiplier", "1.0", "--sampling-prob", "0.01", "--steps", "1000", "--delta", "1e-5", "--json"],
 "cli:delta": ["delta", "--noise-multiplier", "1.0", "--sampling-prob", "0.01", "--steps", "1000", "--epsilon", "2", "--json"],
 "cli:noise": ["noise", "--epsilon", "2", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "1000", "--json"],
}
# Steady-state cases: one expression each, evaluated first once, then --calls times.
STEADY = {
 "B1": "dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)",
 "B6": "dpjax.dpsgd_epsilon(1.1, 0.001, 100000, 1e-5)",
 "group": "dpjax.group_epsilon(2.0, 0.01, 2000, 1e-5, group_size=8)",
 "schedule": "schedule(np.repeat([1.2, 1.0, 0.8], [300, 400, 300]), 0.01, 1000, 1e-5)",
}
STEADY_WRAP = """
import time, json, statistics
t0, c0 = time.perf_counter(), time.process_time()
import inspect, numpy as np, dpjax
t_import = time.perf_counter() - t0
# A per-step noise schedule: noise_schedule= where the revision has it (there an array
# noise_multiplier is a batch), else the array as noise_multiplier (older revisions).
if "noise_schedule" in inspect.signature(dpjax.dpsgd_epsilon).parameters:
    schedule = lambda s, q, t, d: dpjax.dpsgd_epsilon(noise_schedule=s, sampling_prob=q, steps=t, target_delta=d)
else:
    schedule = lambda s, q, t, d: dpjax.dpsgd_epsilon(s, q, t, d)
r = {expr}
first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
wall, cpu = [], []
for _ in range({calls}):
    t, c = time.perf_counter(), time.process_time()
    v = {expr}
    wall.append(time.perf_counter() - t); cpu.append(time.process_time() - c)
    assert v == r, (v, r)
print(json.dumps(dict(import_s=t_import, first_s=first, first_cpu_s=first_cpu, steady_s=statistics.median(wall),
                      steady_cpu_s=statistics.median(cpu), steady_runs_s=wall, value=float(r),
                      dpjax_file=dpjax.__file__)))
"""


def resolve(rev: str) -> tuple[str, str]:
    """(directory, label) of a revision: an existing directory as it is, else ``git archive``."""
    if os.path.isdir(rev):
        path = os.path.abspath(rev)
        desc = subprocess.run(["git", "-C", path, "describe", "--always", "--dirty"], capture_output=True, text=True)
        return path, f"{path} (working tree at {desc.stdout.strip() or '?'})"
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    subject = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%s", sha], capture_output=True, text=True,
                             check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix=f"dpjax-{sha}-")
    atexit.register(shutil.rmtree, tmp, True)
    data = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", sha], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp, f"{sha} {subject[:100]}"


def run(cmd, root, cache):
    env = dict(os.environ, PYTHONPATH=root, DPJAX_COMPILATION_CACHE=cache, DPJAX_PROGRESS="0")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("JAX_ENABLE_X64", None)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    wall = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert out.returncode == 0, out.stderr[-1500:]
    return wall, cpu, out.stdout.strip().splitlines()[-1]


def measure(mode, name, root, calls):
    load = os.getloadavg()[0]
    if mode == "steady":
        wall, cpu, line = run([sys.executable, "-c", STEADY_WRAP.format(expr=STEADY[name], calls=calls)], root, "0")
        rec = json.loads(line)
        assert rec.pop("dpjax_file").startswith(root), f"the child imported another dpjax than {root}"
        return dict(rec, process_wall_s=wall, process_cpu_s=cpu, load1=load)
    if name in PY:
        wall, cpu, val = run([sys.executable, "-c", WRAP.format(code=PY[name])], root, "0")
        return dict(wall_s=wall, cpu_s=cpu, value=val[:90], load1=load)
    with tempfile.TemporaryDirectory() as tmp:
        w1, c1, v1 = run([sys.executable, "-m", "dpjax", *CLI[name]], root, tmp)
        w2, c2, v2 = run([sys.executable, "-m", "dpjax", *CLI[name]], root, tmp)
    return dict(first_wall_s=w1, first_cpu_s=c1, wall_s=w2, cpu_s=c2, value=v2[:60], load1=load)


def summarize(rows, sides, names):
    """Per case and revision: medians over repeats, spread, and per repeat the ratio against the
    revision before it in ``sides`` and against the first (its time / this one's: > 1 means this
    one is faster), with the largest change of the value."""
    out = []
    for name in names:
        for i, side in enumerate(sides):
            mine = [r for r in rows if r["name"] == name and r["side"] == side]
            if not mine:
                continue
            s = dict(name=name, side=side, revision=mine[0]["revision"], repeats=len(mine))
            for key in ("first_s", "first_cpu_s", "steady_s", "steady_cpu_s"):
                vals = [r[key] for r in mine if key in r]
                if not vals:
                    continue
                s[key] = dict(median=statistics.median(vals), min=min(vals), max=max(vals))
            s["value"] = mine[0]["value"]
            for tag, j in (("previous", i - 1), ("first", 0)):
                if i == 0 or (tag == "first" and i == 1):
                    continue
                other = {r["rep"]: r for r in rows if r["name"] == name and r["side"] == sides[j]}
                pairs = [(other[r["rep"]], r) for r in mine if r["rep"] in other]
                if not pairs:
                    continue
                for key in ("steady_s", "steady_cpu_s", "first_s", "first_cpu_s"):
                    ratios = [p[key] / r[key] for p, r in pairs if key in p and key in r]
                    if not ratios:
                        continue
                    s[f"{key}_ratio_vs_{tag}"] = dict(median=statistics.median(ratios), min=min(ratios),
                                                      max=max(ratios), per_repeat=ratios)
                s[f"max_abs_value_change_vs_{tag}"] = max(abs(p["value"] - r["value"]) for p, r in pairs)
            out.append(s)
    return out


def attribution(summary, sides, names):
    """The chain as a table: per revision (after the first), the change of each case against the
    revision before it (steady-state and CPU-time ratios, median over repeats; < 1: slower)."""
    table = []
    for side in sides[1:]:
        rows = {s["name"]: s for s in summary if s["side"] == side}
        if not rows:
            continue
        entry = dict(revision=next(iter(rows.values()))["revision"])
        for name in names:
            s = rows.get(name)
            if s is None or "steady_s_ratio_vs_previous" not in s:
                continue
            entry[name] = dict(steady_ms=round(1e3 * s["steady_s"]["median"], 2),
                               steady_cpu_ms=round(1e3 * s["steady_cpu_s"]["median"], 2),
                               steady_ratio=round(s["steady_s_ratio_vs_previous"]["median"], 3),
                               steady_cpu_ratio=round(s["steady_cpu_s_ratio_vs_previous"]["median"], 3),
                               value_change=s["max_abs_value_change_vs_previous"])
        table.append(entry)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the other revision (a directory or a git revision)")
    ap.add_argument("--after", default=ROOT, help="the revision under test (default: this working tree)")
    ap.add_argument("--chain", help="comma-separated revisions, oldest first (instead of --base/--after)")
    ap.add_argument("--mode", choices=("first", "steady"), default="first")
    ap.add_argument("--cases", help="comma-separated case names (default: every case of the mode)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--calls", type=int, default=7, help="warm calls per process (--mode steady)")
    ap.add_argument("--out", help="results JSON (default benchmarks/results/bench_first_call_ab[_steady].json)")
    ap.add_argument("--note", default="", help="free text stored with the results")
    args = ap.parse_args()
    from _meta import run_metadata  # (machine, date, command)

    if (args.chain is None) == (args.base is None):
        ap.error("give --base (with an optional --after) or --chain")
    revs = args.chain.split(",") if args.chain else [args.base, args.after]
    sides = ["base", "after"] if not args.chain else [f"r{i}" for i in range(len(revs))]
    resolved = [resolve(r) for r in revs]
    roots = dict(zip(sides, (d for d, _ in resolved)))
    labels = dict(zip(sides, (label for _, label in resolved)))
    cases = list(STEADY) if args.mode == "steady" else list(PY) + list(CLI)
    names = args.cases.split(",") if args.cases else cases
    unknown = [n for n in names if n not in cases]
    if unknown:
        ap.error(f"unknown cases for --mode {args.mode}: {unknown} (known: {cases})")
    out_path = args.out or os.path.join(ROOT, "benchmarks", "results",
                                        "bench_first_call_ab" + ("_steady" if args.mode == "steady" else "") + ".json")
    rows = []
    for rep in range(args.repeat):
        order = sides if rep % 2 == 0 else sides[::-1]
        for name in names:
            for side in order:
                rec = dict(name=name, side=side, revision=labels[side], rep=rep,
                           **measure(args.mode, name, roots[side], args.calls))
                rows.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "steady_runs_s"}), flush=True)
                result = dict(benchmark="bench_first_call_ab", mode=args.mode, revisions=labels,
                              cpu_count=os.cpu_count(), calls=args.calls if args.mode == "steady" else None,
                              note=args.note or "compare rows of the same case and repeat; load1 per row",
                              rows=rows, meta=run_metadata(__file__))
                if args.mode == "steady":
                    result["summary"] = summarize(rows, sides, names)
                    if len(sides) > 2:
                        result["attribution"] = attribution(result["summary"], sides, names)
                with open(out_path, "w") as f:
                    json.dump(result, f, indent=1)
    if args.mode == "steady":
        print(f"{'case':9} {'revision':60} {'first s':>8} {'steady ms':>10} {'cpu ms':>7} {'x prev':>14}  value")
        for s in result["summary"]:
            ratio = s.get("steady_s_ratio_vs_previous")
            rtxt = f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]" if ratio else ""
            print(f"{s['name']:9} {s['revision'][:60]:60} {s['first_s']['median']:8.2f} "
                  f"{1e3 * s['steady_s']['median']:10.1f} {1e3 * s['steady_cpu_s']['median']:7.1f} {rtxt:>14}  "
                  f"{s['value']!r}")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
