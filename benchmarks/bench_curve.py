"""eps(T) for 100 values of T: one ``dpjax.epsilon_curve`` call vs 100 separate ``dpsgd_epsilon`` calls.

Case: sigma = 1.0, q = 0.01, delta = 1e-5, T = 100, 200, ..., 10,000 (an epoch every 100 steps).

* first pass: each side in its own fresh process (empty compilation cache), from before the
  import to the last value (compiles included);
* second pass: the same again in that process (programs compiled);
* agreement: max relative difference between the curve and the separate calls, and whether each
  lies inside the other's certified bracket (the stated bound: the union of the two brackets).

The separate calls can take minutes on a loaded 2-core machine (most T plan a new grid shape,
so most calls compile); ``--separate-subset N`` runs every (100/N)-th T only and extrapolates
the time per call (stated in the output).  The machine is shared: absolute times are inflated
by contention.  Writes ``benchmarks/results/bench_curve.json``.

    python benchmarks/bench_curve.py [--separate-subset 100]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

CURVE = r"""
import time, json
t0 = time.perf_counter()
import dpjax
steps = [100 * e for e in range(1, 101)]
c = dpjax.epsilon_curve(1.0, 0.01, steps, 1e-5)
t_first = time.perf_counter() - t0
t1 = time.perf_counter()
dpjax.epsilon_curve(1.0, 0.01, steps, 1e-5)
print(json.dumps(dict(first=t_first, second=time.perf_counter() - t1, epsilon=c.epsilon.tolist(),
                      lower=c.epsilon_lower.tolist(), n=c.n)))
"""

SEPARATE = r"""
import time, json
t0 = time.perf_counter()
from dpjax import pld
steps = [100 * e for e in range(1, 101)][::{stride}]
res = [pld.dpsgd_accounting(1.0, 0.01, t, target_delta=1e-5) for t in steps]
t_first = time.perf_counter() - t0
t1 = time.perf_counter()
for t in steps:
    pld.dpsgd_accounting(1.0, 0.01, t, target_delta=1e-5)
print(json.dumps(dict(first=t_first, second=time.perf_counter() - t1, steps=steps,
                      epsilon=[float(r.epsilon) for r in res], lower=[float(r.epsilon_lower) for r in res])))
"""


def _run(code):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DPJAX_COMPILATION_CACHE="0", DPJAX_PROGRESS="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    from _meta import run_metadata

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--separate-subset", type=int, default=100, help="separate calls on N of the 100 T (divisor of 100)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_curve.json"))
    args = ap.parse_args(argv)
    if args.separate_subset < 1 or 100 % args.separate_subset:
        ap.error("--separate-subset must divide 100")
    stride = 100 // args.separate_subset
    curve = _run(CURVE)
    sep = _run(SEPARATE.format(stride=stride))
    scale = 100 / len(sep["steps"])
    sep_first, sep_second = sep["first"] * scale, sep["second"] * scale
    idx = [t // 100 - 1 for t in sep["steps"]]
    rel = max(abs(curve["epsilon"][i] - e) / e for i, e in zip(idx, sep["epsilon"]))
    inside = all(curve["epsilon"][i] >= lo and e >= curve["lower"][i]
                 for i, e, lo in zip(idx, sep["epsilon"], sep["lower"]))
    rows = [dict(what="epsilon_curve (100 T, one call)", first_s=curve["first"], second_s=curve["second"]),
            dict(what=f"100 separate dpsgd_accounting calls{' (extrapolated from %d)' % len(idx) if scale != 1 else ''}",
                 first_s=sep_first, second_s=sep_second, measured_calls=len(idx))]
    print(f"{'':55} {'first s':>9} {'second s':>9}")
    for r in rows:
        print(f"{r['what']:55} {r['first_s']:9.2f} {r['second_s']:9.2f}")
    print(f"ratio (separate / curve): first {sep_first / curve['first']:.1f}x, second {sep_second / curve['second']:.1f}x; "
          f"max relative difference {rel:.2e}; each inside the other's certified bracket: {inside}; grid n={curve['n']}")
    out = dict(benchmark="bench_curve", case="sigma=1, q=0.01, delta=1e-5, T=100..10000 step 100", rows=rows,
               ratio_first=sep_first / curve["first"], ratio_second=sep_second / curve["second"],
               max_rel_diff=rel, inside_brackets=inside, n=curve["n"],
               note="2-core CPU shared with other jobs: absolute times inflated by contention",
               machine=dict(platform=platform.platform(), python=platform.python_version(), cpu_count=os.cpu_count(),
                            loadavg=os.getloadavg()),
               meta=run_metadata(__file__, argv))
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
