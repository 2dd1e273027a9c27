"""First-call cost of this checkout against another one (e.g. main before a change), side by side.

Per case, alternating base / this checkout in fresh processes: wall time and CPU time (user + sys
of the child, all threads; less sensitive than wall time to other processes on a loaded machine,
though not immune: caches and hyper-threads are shared).  Python cases: fresh process, persistent
cache off, import included.  CLI cases: ``python -m dpjax ...`` twice with a fresh cache
directory; ``wall_s``/``cpu_s`` are the second (warm-cache) run, ``first_*`` the first.

    python benchmarks/bench_first_call_ab.py --base /path/to/other/checkout \
        [--cases dpsgd_epsilon,cli:epsilon] [--repeat 1] [--out benchmarks/results/bench_first_call_ab.json]
"""
import argparse, json, os, pathlib, resource, subprocess, sys, tempfile, time

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
def run(cmd, root, cache):
    env = dict(os.environ, PYTHONPATH=root, DPJAX_COMPILATION_CACHE=cache, DPJAX_PROGRESS="0")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    wall = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert out.returncode == 0, out.stderr[-500:]
    return wall, cpu, out.stdout.strip().splitlines()[-1][:90]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--base", required=True, help="the other checkout (its dpjax/ is imported for the base rows)")
ap.add_argument("--cases", default=",".join(list(PY) + list(CLI)))
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "bench_first_call_ab.json"))
args = ap.parse_args()
from _meta import run_metadata  # noqa: E402  (machine, date, command)

ROOTS = {"base": args.base, "after": ROOT}
names = args.cases.split(",")
reps = args.repeat
rows = []
for rep in range(reps):
    for name in names:
        for side, root in ROOTS.items():
            load = os.getloadavg()[0]
            if name in PY:
                wall, cpu, val = run([sys.executable, "-c", WRAP.format(code=PY[name])], root, "0")
                rec = dict(name=name, side=side, rep=rep, wall_s=wall, cpu_s=cpu, value=val, load1=load)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    w1, c1, v1 = run([sys.executable, "-m", "dpjax", *CLI[name]], root, tmp)
                    w2, c2, v2 = run([sys.executable, "-m", "dpjax", *CLI[name]], root, tmp)
                rec = dict(name=name, side=side, rep=rep, first_wall_s=w1, first_cpu_s=c1, wall_s=w2, cpu_s=c2,
                           value=v2[:60], load1=load)
            rows.append(rec); print(json.dumps(rec), flush=True)
            with open(args.out, "w") as f:
                json.dump(dict(benchmark="bench_first_call_ab", base=args.base, cpu_count=os.cpu_count(),
                               note="2-core CPU shared with other jobs: wall times inflated by contention "
                                    "(load1 per row); compare base and after rows of the same case",
                               rows=rows, meta=run_metadata(__file__)), f, indent=1)
