"""A user's first hour: a notebook session of varied DP-SGD queries, the CLI's one-shot query and
the broad sweep, dpjax against dp_accounting, from fresh processes (compiles and imports counted).

Parts (``--parts``, all by default):

* ``session``: ``--queries`` (60) DP-SGD queries drawn by a seeded generator (sigma ~ U[0.6, 4],
  q log-uniform in [3e-4, 0.1], T log-uniform in [100, 30000], delta log-uniform in [1e-8,
  1e-4]), each answered by ``dpjax.dpsgd_epsilon`` and by dp_accounting's ``PLDAccountant``
  (``value_discretization_interval=1e-4``, its documented usage), interleaved query by query, in
  one fresh Python process with an empty dpjax program store; then the same in a second fresh
  process on the store the first one left ("warm").  Per call times; imports timed separately
  (dpjax's includes loading its modules, which it does on first attribute access); the session
  ratio is reported over the calls (``speedup``) and with both imports added
  (``speedup_with_imports``).  Imported one after the other in one process, the second library
  finds the modules both use (SciPy) already loaded, so the ``whole`` rows also time each
  library's whole session alone: a fresh process that imports it and answers the same queries,
  dpjax and dp_accounting alternating ``--repeats`` times, dpjax's first run on an empty store
  and the rest on the store it left (medians).
* ``cli``: ``python -m dpjax epsilon --noise-multiplier 1 --sampling-prob 0.01 --steps 1000
  --delta 1e-5`` in a fresh process on an empty store and again on the warm store, against a
  ``python -c`` script answering the same with dp_accounting; whole processes, imports included,
  alternating, ``--repeats`` times (medians).
* ``sweep``: ``benchmarks/bench_sweep.py``'s broad distribution (``--sweep-configs``
  configurations): dp_accounting's loop, dpjax.sweep's first process (empty store: first and
  second pass) and a second process on the warm store.

dpjax's bytecode is compiled first (``python -m compileall``), as installing a package does:
dp_accounting's is, and with ``PYTHONDONTWRITEBYTECODE`` set an editable checkout would
otherwise compile its sources in every process.

Writes ``benchmarks/results/bench_session.json`` (``--out``) with the machine, date and command.

    python benchmarks/bench_session.py [--queries 60] [--repeats 3] [--parts session,cli,sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _meta import run_metadata  # noqa: E402

QUERIES = r"""
import numpy as np
def queries(n, seed):
    rng = np.random.default_rng(seed)
    return [dict(noise_multiplier=float(rng.uniform(0.6, 4.0)), sampling_prob=float(10 ** rng.uniform(np.log10(3e-4), -1)),
                 steps=int(10 ** rng.uniform(2, np.log10(30000))), delta=float(10 ** rng.uniform(-8, -4)))
            for _ in range(n)]
"""

SESSION = QUERIES + r"""
import json, time
N, SEED = {n}, {seed}
qs = queries(N, SEED)
t = time.perf_counter()
import dpjax
dpjax.dpsgd_epsilon  # dpjax loads its modules on first attribute access: part of its import
import_dpjax = time.perf_counter() - t
t = time.perf_counter()
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
import_dpa = time.perf_counter() - t
dpjax_s, dpa_s, dpjax_eps, dpa_eps = [], [], [], []
for c in qs:
    t = time.perf_counter()
    e = dpjax.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"])
    dpjax_s.append(time.perf_counter() - t)
    dpjax_eps.append(float(e))
    t = time.perf_counter()
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        c["sampling_prob"], dp_accounting.GaussianDpEvent(c["noise_multiplier"])), c["steps"]))
    dpa_eps.append(float(acc.get_epsilon(c["delta"])))
    dpa_s.append(time.perf_counter() - t)
print(json.dumps(dict(import_dpjax_s=import_dpjax, import_dp_accounting_s=import_dpa, dpjax_s=dpjax_s,
                      dp_accounting_s=dpa_s, dpjax_epsilon=dpjax_eps, dp_accounting_epsilon=dpa_eps)))
"""

ALONE = QUERIES + r"""
import json, time
qs = queries({n}, {seed})
t = time.perf_counter()
{body}
print(json.dumps(dict(seconds=time.perf_counter() - t)))
"""

DPJAX_ALONE = r"""
import dpjax
for c in qs:
    dpjax.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"])
"""

DPA_ALONE = r"""
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
for c in qs:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        c["sampling_prob"], dp_accounting.GaussianDpEvent(c["noise_multiplier"])), c["steps"]))
    acc.get_epsilon(c["delta"])
"""

DPA_SCRIPT = r"""
import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 1000))
print(acc.get_epsilon(1e-5))
"""

CLI = ["-m", "dpjax", "epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "1000",
       "--delta", "1e-5", "--json"]


def _env(store: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPJAX_COMPILATION_CACHE"] = store
    env["DPJAX_PROGRESS"] = "0"
    return env


def _run(args, store: str):
    load = os.getloadavg()[0]
    t = time.perf_counter()
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(store), cwd=str(ROOT))
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(" ".join(args[:3]) + "\n" + out.stderr[-3000:])
    return out.stdout, wall, dict(load_before=load, load_after=os.getloadavg()[0])


def _summary(rec: dict) -> dict:
    d, a = rec["dpjax_s"], rec["dp_accounting_s"]
    after = d[1:]
    rel = [(x - y) / y for x, y in zip(rec["dpjax_epsilon"], rec["dp_accounting_epsilon"]) if y > 0]
    with_imports = (sum(a) + rec["import_dp_accounting_s"]) / (sum(d) + rec["import_dpjax_s"])
    return dict(queries=len(d), dpjax_total_s=sum(d), dp_accounting_total_s=sum(a), speedup=sum(a) / sum(d),
                speedup_with_imports=with_imports,
                dpjax_first_call_s=d[0], dpjax_median_call_s=statistics.median(d),
                dpjax_calls_after_first_under_100ms=sum(x < 0.1 for x in after) / max(1, len(after)),
                dpjax_max_call_s=max(d), dp_accounting_median_call_s=statistics.median(a),
                import_dpjax_s=rec["import_dpjax_s"], import_dp_accounting_s=rec["import_dp_accounting_s"],
                rel_diff_vs_dp_accounting=dict(min=min(rel), median=statistics.median(rel), max=max(rel)))


def session(n: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        code = SESSION.format(n=n, seed=seed)
        out = {}
        for label in ("fresh process, empty program store", "second process, warm program store"):
            stdout, wall, load = _run(["-c", code], store)
            rec = json.loads(stdout.strip().splitlines()[-1])
            out[label] = dict(summary=_summary(rec), process_wall_s=wall, **load, calls=rec)
    return out


def whole_sessions(n: int, seed: int, repeats: int) -> dict:
    """Each library's whole session (import and queries) alone in a fresh process, alternating."""
    runs = {"dpjax": [], "dp_accounting": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        for _ in range(repeats):
            for lib, body in (("dpjax", DPJAX_ALONE), ("dp_accounting", DPA_ALONE)):
                stdout, wall, load = _run(["-c", ALONE.format(n=n, seed=seed, body=body)], store)
                runs[lib].append(dict(seconds=json.loads(stdout.strip().splitlines()[-1])["seconds"],
                                      process_wall_s=wall, **load))
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    wall = {k: statistics.median(r["process_wall_s"] for r in v) for k, v in runs.items()}
    return dict(queries=n, repeats=repeats, median_s=med, median_process_wall_s=wall,
                speedup=med["dp_accounting"] / med["dpjax"],
                speedup_process_wall=wall["dp_accounting"] / wall["dpjax"],
                dpjax_first_run_empty_store_s=runs["dpjax"][0]["seconds"], runs=runs)


def cli(repeats: int) -> dict:
    rows = {"dpjax CLI, empty program store": [], "dpjax CLI, warm program store": [],
            "dp_accounting script": []}
    values = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            for label in ("dpjax CLI, empty program store", "dpjax CLI, warm program store"):
                stdout, wall, load = _run(CLI, store)
                rows[label].append(dict(seconds=wall, **load))
                values["dpjax"] = json.loads(stdout)["epsilon"]
            stdout, wall, load = _run(["-c", DPA_SCRIPT], "0")
            rows["dp_accounting script"].append(dict(seconds=wall, **load))
            values["dp_accounting"] = float(stdout.strip().splitlines()[-1])
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
    return dict(command="python " + " ".join(CLI), median_s=med, runs=rows, epsilon=values)


def sweep(configs: int) -> dict:
    import bench_sweep as bs

    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        dpa, dpa_wall, _, dpa_load = bs._py(bs.DPA_SNIPPET.format(dist="broad", n=configs, m=configs, interval=1e-4,
                                                                   only=None), ROOT)
        code = bs.SWEEP_SNIPPET.format(dist="broad", n=configs, passes=2, with_lower=True)
        first, first_wall, _, first_load = bs._py(code, ROOT, store)
        code1 = bs.SWEEP_SNIPPET.format(dist="broad", n=configs, passes=1, with_lower=True)
        second, second_wall, _, second_load = bs._py(code1, ROOT, store)
    base = dpa_wall
    rows = [dict(row="dp_accounting loop (1e-4; import incl.)", seconds=dpa_wall, speedup=1.0, **dpa_load),
            dict(row="dpjax.sweep first process, empty program store (import incl.)",
                 seconds=first["import_s"] + first["pass1_s"], programs=first["pass1_programs"],
                 speedup=base / (first["import_s"] + first["pass1_s"]), **first_load),
            dict(row="dpjax.sweep second pass in that process", seconds=first["pass2_s"],
                 speedup=base / first["pass2_s"]),
            dict(row="dpjax.sweep second process, warm program store (import incl.)",
                 seconds=second["import_s"] + second["pass1_s"], speedup=base / (second["import_s"] + second["pass1_s"]),
                 **second_load)]
    return dict(distribution="broad (benchmarks/bench_sweep.py)", configs=configs, rows=rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sweep-configs", type=int, default=120)
    ap.add_argument("--parts", default="session,cli,sweep")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_session.json"))
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "dpjax")], check=True)
    out = dict(benchmark="bench_session", bytecode="dpjax compiled with compileall before the runs")
    if "session" in parts:
        out["session"] = session(args.queries, args.seed)
        for label, rec in out["session"].items():
            print(label, json.dumps(rec["summary"]))
        out["whole_session"] = whole_sessions(args.queries, args.seed, args.repeats)
        print("whole sessions alone", json.dumps(out["whole_session"]["median_s"]),
              f"{out['whole_session']['speedup']:.2f}x")
    if "cli" in parts:
        out["cli"] = cli(args.repeats)
        print("cli", json.dumps(out["cli"]["median_s"]))
    if "sweep" in parts:
        out["sweep"] = sweep(args.sweep_configs)
        for r in out["sweep"]["rows"]:
            print(r["row"], f"{r['seconds']:.2f} s", f"{r['speedup']:.1f}x")
    out["meta"] = run_metadata(__file__, argv if argv is not None else sys.argv[1:])
    path = pathlib.Path(args.out)
    if path.exists() and set(parts) != {"session", "cli", "sweep"}:
        old = json.loads(path.read_text())
        old.update({k: v for k, v in out.items() if k != "meta"})
        old.setdefault("meta_parts", []).append(out["meta"])
        out = old
    path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
