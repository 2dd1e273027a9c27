"""Random allocation: dpjax against the ``pld-accounting`` package (Feldman & Shenfeld's PLD method),
side by side in one run.

For every configuration (the three anchors, then random ones: sigma in [0.5, 4], delta in [1e-9,
1e-3] (log-uniform), every eighth with k = 2 or 3 selections per epoch; the first 20 (the speed
set) with batches per epoch t in [10, 300] (log-uniform) and 1-8 epochs, the rest with t in
[10, 2000] and 1-20 epochs, cheapest first), each library runs in a fresh process:

* pld-accounting: ``gaussian_allocation_epsilon_range`` (its default accuracy) -- its upper and
  lower bound, the first call's time, and a second call's time where the first took < 60 s
  (it has no warm-up: no JIT is installed with it);
* dpjax: ``allocation_accounting`` -- the first call in the process (NumPy, nothing to compile),
  the steady state of repeated one-shot calls, and the jitted ``allocation_epsilon_fn`` on the same plan:
  its compile (first call) and its steady state.

Results are appended to ``benchmarks/results/bench_allocation.jsonl`` as they arrive (a killed run
resumes: configurations already there are skipped); ``--summary`` writes
``benchmarks/results/bench_allocation.json`` (ratios, soundness checks, bracket widths); ``--record
NAME`` keeps a separate record (``NAME.jsonl``, ``NAME.json``); ``--which dpjax --reuse-pld RECORD`` rechecks dpjax's brackets against
pld-accounting's bounds in an earlier record (soundness and width only: its times are not side by
side).

    python benchmarks/bench_allocation.py --count 40 [--summary]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results"
RAW = RESULTS / "bench_allocation.jsonl"
SUMMARY = RESULTS / "bench_allocation.json"

ANCHORS = [
    dict(sigma=1.0, t=100, k=1, epochs=1, delta=1e-5, kind="anchor"),
    dict(sigma=1.5, t=128, k=1, epochs=16, delta=1e-5, kind="anchor"),
    dict(sigma=0.8, t=1000, k=1, epochs=5, delta=1e-6, kind="anchor"),
]


def _draw(rng, t_max: int, e_max: int, i: int, kind: str) -> dict:
    t = int(round(math.exp(rng.uniform(math.log(10), math.log(t_max)))))
    k = int(rng.choice([2, 3])) if i % 8 == 7 else 1
    return dict(sigma=round(float(rng.uniform(0.5, 4.0)), 4), t=t, k=min(k, t), epochs=int(rng.integers(1, e_max + 1)),
                delta=float(f"{10 ** rng.uniform(-9, -3):.3g}"), kind=kind)


def random_configs(count: int, seed: int = 2026) -> list[dict]:
    """``count`` random configurations: the first 20 (the speed set) with t in [10, 300] and at
    most 8 epochs -- pld-accounting's fastest regime, where dpjax's fixed per-call costs weigh
    most -- then the rest over the full ranges (t up to 2000, up to 20 epochs), cheapest first."""
    rng = np.random.default_rng(seed)
    speed = [_draw(rng, 300, 8, i, "random") for i in range(min(count, 20))]
    rest = [_draw(rng, 2000, 20, i, "random_full") for i in range(max(0, count - 20))]
    rest.sort(key=lambda c: c["t"] * c["epochs"] * c["k"])
    return speed + rest

PLD_CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
import PLD_accounting as P
t_import = time.perf_counter() - t0
def call():
    return P.gaussian_allocation_epsilon_range(delta=cfg["delta"], sigma=cfg["sigma"], num_steps=cfg["t"],
                                               num_selected=cfg["k"], num_epochs=cfg["epochs"])
t0 = time.perf_counter(); up, lo = call(); t1 = time.perf_counter() - t0
t2 = None
if t1 < 60.0:
    t0 = time.perf_counter(); call(); t2 = time.perf_counter() - t0
print(json.dumps(dict(upper=up, lower=lo, first=t1, second=t2, import_seconds=t_import)))
"""

DPJAX_CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
from dpjax.pld import allocation_accountant as R
t_import = time.perf_counter() - t0
args = (cfg["sigma"], cfg["t"], cfg["epochs"])
kw = dict(target_delta=cfg["delta"], selections_per_epoch=cfg["k"])
t0 = time.perf_counter(); r = R.allocation_accounting(*args, **kw); first = time.perf_counter() - t0
steady = []
for _ in range(3):
    t0 = time.perf_counter(); R.allocation_accounting(*args, **kw); steady.append(time.perf_counter() - t0)
out = dict(epsilon=r.epsilon, epsilon_lower=r.epsilon_lower, first=first, steady=min(steady),
           import_seconds=t_import)
if cfg.get("jit", True):
    import jax
    plan, _ = R.account_blocks(cfg["sigma"], R.allocation_blocks(cfg["t"], cfg["k"], cfg["epochs"]),
                         target_delta=cfg["delta"])
    f = jax.jit(lambda s: R.allocation_epsilon_fn(plan, cfg["delta"], s))
    with jax.enable_x64(True):
        t0 = time.perf_counter(); e = float(f(cfg["sigma"])); jit_first = time.perf_counter() - t0
        js = []
        for _ in range(5):
            t0 = time.perf_counter(); float(f(cfg["sigma"])); js.append(time.perf_counter() - t0)
    out.update(jit_epsilon=e, jit_first=jit_first, jit_steady=min(js))
print(json.dumps(out))
"""


def _child(code: str, cfg: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(error=f"did not finish within {timeout:g} s")
    if proc.returncode != 0:
        return dict(error=proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _key(cfg: dict) -> str:
    return json.dumps({k: cfg[k] for k in ("sigma", "t", "k", "epochs", "delta")}, sort_keys=True)


def _load(raw: pathlib.Path | None = None) -> dict:
    raw = raw or RAW
    done = {}
    if raw.exists():
        for line in raw.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[_key(row["config"])] = row
    return done


def run(count: int, which: str, timeout: float, jit: bool, shard: tuple[int, int] = (0, 1),
        reuse_pld: str | None = None) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    done = _load()
    # pld-accounting's bounds from an earlier record (a soundness recheck of dpjax alone: the
    # two libraries' times in such a row are not side by side).
    earlier = _load(RESULTS / f"{reuse_pld}.jsonl") if reuse_pld else {}
    for index, cfg in enumerate(ANCHORS + random_configs(count)):
        if index % shard[1] != shard[0]:
            continue
        # The jitted path (compile ~1 min on the shared 2 cores) is timed on the speed set only.
        jit_here = jit and cfg["kind"] in ("anchor", "random")
        key = _key(cfg)
        row = done.get(key, dict(config=cfg))
        changed = False
        if "pld" not in row and "pld" in earlier.get(key, {}):
            row["pld"] = dict(earlier[key]["pld"], reused_from=reuse_pld)
        if which in ("both", "pld") and "pld" not in row:
            row["pld"] = _child(PLD_CHILD, cfg, timeout)
            changed = True
        if which in ("both", "dpjax") and "dpjax" not in row:
            row["dpjax"] = _child(DPJAX_CHILD, dict(cfg, jit=jit_here), timeout)
            changed = True
        if changed:
            row["host"] = dict(cpus=os.cpu_count(), cores_used=len(os.sched_getaffinity(0)), shard=list(shard),
                               loadavg=list(os.getloadavg()), time=time.strftime("%Y-%m-%d %H:%M"))
            with RAW.open("a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
            done[key] = row
            print(json.dumps(row), flush=True)


def summary(note: str | None = None) -> dict:
    rows = list(_load().values())
    out = []
    for r in rows:
        p, d, c = r.get("pld", {}), r.get("dpjax", {}), r["config"]
        if "error" in p or "error" in d or not p or not d:
            out.append(dict(config=c, error=p.get("error") or d.get("error") or "missing"))
            continue
        up, lo = d["epsilon"], d["epsilon_lower"]
        pld_steady = p["second"] if p.get("second") is not None else p["first"]
        reused = p.get("reused_from")
        out.append(dict(
            config=c, dpjax_upper=up, dpjax_lower=lo, pld_upper=p["upper"], pld_lower=p["lower"],
            sound=bool(up >= p["lower"] and lo <= p["upper"]),
            width_rel=(up - lo) / up if up > 0 else 0.0, width_abs=up - lo,
            width_ok=bool((up - lo) <= 5e-3 * up or (up < 0.02 and up - lo <= 1e-4)),
            pld_width_rel=(p["upper"] - p["lower"]) / p["upper"] if p["upper"] > 0 else 0.0,
            pld_first=p["first"], pld_steady=pld_steady, pld_steady_measured=p.get("second") is not None,
            dpjax_first=d["first"], dpjax_steady_numpy=d["steady"], dpjax_jit_first=d.get("jit_first"),
            dpjax_jit_steady=d.get("jit_steady"), jit_matches=(abs(d.get("jit_epsilon", up) - up) <= 1e-9 * max(up, 1)),
            first_ratio=p["first"] / d["first"],
            steady_ratio=pld_steady / min(d["steady"], d.get("jit_steady") or math.inf),
            steady_ratio_numpy=pld_steady / d["steady"],
            jit_first_ratio=(p["first"] / d["jit_first"]) if d.get("jit_first") else None,
            **({"pld_reused_from": reused} if reused else {}),
        ))
    ok = [o for o in out if "error" not in o]
    anchors = [o for o in ok if o["config"]["kind"] == "anchor"]
    rand = [o for o in ok if o["config"]["kind"] == "random"]
    speed = anchors + rand[:20]
    random_all = [o for o in ok if o["config"]["kind"] in ("random", "random_full")]
    res = dict(
        rows=out,
        soundness=dict(configurations=len(ok), random_configurations=len(random_all),
                       all_sound=all(o["sound"] for o in ok),
                       widths_ok=sum(o["width_ok"] for o in ok), max_width_rel=max((o["width_rel"] for o in ok), default=None)),
        speed=dict(configurations=len(speed),
                   min_first_ratio=min((o["first_ratio"] for o in speed), default=None),
                   min_steady_ratio=min((o["steady_ratio"] for o in speed), default=None),
                   min_steady_ratio_numpy=min((o["steady_ratio_numpy"] for o in speed), default=None),
                   first_ratio_10x=sum(o["first_ratio"] >= 10 for o in speed),
                   steady_ratio_100x=sum(o["steady_ratio"] >= 100 for o in speed)),
        note=note or "one fresh process per library and configuration (host and load recorded per row); ratios "
                     "compare the two libraries' runs of the same configuration, made back to back",
    )
    if any(o.get("pld_reused_from") for o in ok):
        # pld-accounting's side comes from an earlier run: no speed-ups, and no times in the rows.
        res["speed"] = None
        res["pld_reused_from"] = sorted({o["pld_reused_from"] for o in ok if o.get("pld_reused_from")})
        for o in ok:
            for k in [k for k in o if "ratio" in k or k.startswith("pld_first") or k.startswith("pld_steady")]:
                del o[k]
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from _meta import run_metadata

    res["benchmark"] = SUMMARY.stem
    res["meta"] = run_metadata(__file__)
    SUMMARY.write_text(json.dumps(res, indent=1))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=40, help="random configurations (after the 3 anchors)")
    ap.add_argument("--which", choices=("both", "pld", "dpjax"), default="both")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds per child process")
    ap.add_argument("--no-jit", action="store_true", help="skip the jitted path (compile is slow on 2 cores)")
    ap.add_argument("--summary", action="store_true", help="only summarize the recorded rows")
    ap.add_argument("--shard", default="0/1",
                    help="I/N: run only configurations whose index is I mod N (N processes, e.g. one per core, "
                         "append to the same record)")
    ap.add_argument("--reuse-pld", default=None, metavar="RECORD",
                    help="take pld-accounting's results from the earlier record RECORD (with --which dpjax: "
                         "recheck dpjax's brackets against bounds already computed; times are then not side by side)")
    ap.add_argument("--note", default=None, help="the summary's note on the machine (default: a generic one)")
    ap.add_argument("--record", default="bench_allocation",
                    help="name of the record and summary in benchmarks/results (NAME.jsonl, NAME.json): a "
                         "separate record for a separate run, e.g. the speed set alone on another machine")
    args = ap.parse_args()
    global RAW, SUMMARY
    RAW, SUMMARY = RESULTS / f"{args.record}.jsonl", RESULTS / f"{args.record}.json"
    i, n = (int(x) for x in args.shard.split("/"))
    if not 0 <= i < n:
        ap.error(f"--shard I/N needs 0 <= I < N, got {args.shard}")
    if not args.summary:
        run(args.count, args.which, args.timeout, jit=not args.no_jit, shard=(i, n), reuse_pld=args.reuse_pld)
    print(json.dumps({k: v for k, v in summary(args.note).items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
