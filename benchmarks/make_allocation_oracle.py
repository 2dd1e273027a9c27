"""Reference brackets for the random-allocation / balls-in-bins property tests
(``tests/pld/allocation/test_allocation_properties.py``): pld-accounting's ``gaussian_allocation_epsilon_range``
(Feldman & Shenfeld's PLD accountant, its default accuracy) on seeded random configurations.

pld-accounting is not a dependency of dpjax (nor of its tests): this script runs in an
environment that has it (``pip install pld-accounting``) and writes its brackets, with the
configurations, the command and the package version, to a JSON file the tests read.

Configurations (``--count`` per scheme, numpy ``default_rng(--seed)``):

* ``random_allocation``: batches per epoch ``t`` log-uniform in [2, 256], selections ``k = 1``
  (60%) or uniform in [2, min(t, 8)] (35%) or ``t - 1`` / ``t`` (5%), epochs log-uniform in
  [1, 8], noise multiplier log-uniform in [0.5, 20], delta log-uniform in [1e-14, 1e-2];
* ``balls_in_bins``: bins ``b`` log-uniform in [2, 512], epochs log-uniform in [1, 64], the noise
  multiplier per observation ``sigma / sqrt(E)`` log-uniform in [0.4, 20], delta as above
  (pld-accounting runs 1-of-``b`` allocation at ``sigma / sqrt(E)``, one epoch: docs/design.md
  §12.5).

Each call runs in a worker process with a time limit (``--timeout``; pld-accounting is slow for
small noise over many epochs); a call that does not finish in time is recorded with its error and
no bracket.  Configurations run cheapest first (steps x epochs x selections); ``--budget`` stops
starting new ones after that many seconds, and the file then holds brackets for the cheapest
part of the set (the others are listed without one).  Results are journaled as they arrive (``--journal``, under ``benchmarks/results/``): an
interrupted run resumes where it stopped.

    python benchmarks/make_allocation_oracle.py --count 1000 --timeout 60
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import pathlib
import sys
import time

import numpy as np

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "allocation_oracle.json"
DEFAULT_JOURNAL = pathlib.Path(__file__).resolve().parent / "results" / "allocation_oracle.journal.jsonl"
SCHEMES = ("random_allocation", "balls_in_bins")


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def draw(scheme: str, rng) -> dict:
    delta = _sig(10 ** rng.uniform(-14, -2), 3)
    if scheme == "random_allocation":
        t = int(round(math.exp(rng.uniform(math.log(2), math.log(256)))))
        u = rng.uniform()
        if u < 0.6 or t == 1:
            k = 1
        elif u < 0.95:
            k = int(rng.integers(2, min(t, 8) + 1))
        else:
            k = int(rng.choice([t - 1, t]))
        E = int(round(math.exp(rng.uniform(0, math.log(8)))))
        sigma = _sig(math.exp(rng.uniform(math.log(0.5), math.log(20))))
        return dict(scheme=scheme, sigma=sigma, t=t, k=max(k, 1), epochs=E, delta=delta)
    b = int(round(math.exp(rng.uniform(math.log(2), math.log(512)))))
    E = int(round(math.exp(rng.uniform(0, math.log(64)))))
    sigma = _sig(math.exp(rng.uniform(math.log(0.4), math.log(20))) * math.sqrt(E))
    return dict(scheme=scheme, sigma=sigma, t=b, k=1, epochs=E, delta=delta)


def configs(count: int, seed: int) -> list[dict]:
    """``count`` configurations per scheme, random allocation first (each scheme its own stream)."""
    out = []
    for i, scheme in enumerate(SCHEMES):
        rng = np.random.default_rng([seed, i])
        out += [dict(draw(scheme, rng), index=j) for j in range(count)]
    return out


def _key(c: dict) -> str:
    return json.dumps({k: c[k] for k in ("scheme", "sigma", "t", "k", "epochs", "delta")}, sort_keys=True)


def _pld_call(c: dict) -> tuple[float, float]:
    import PLD_accounting as P

    if c["scheme"] == "balls_in_bins":
        args = dict(sigma=c["sigma"] / math.sqrt(c["epochs"]), num_steps=c["t"], num_selected=1, num_epochs=1)
    else:
        args = dict(sigma=c["sigma"], num_steps=c["t"], num_selected=c["k"], num_epochs=c["epochs"])
    up, lo = P.gaussian_allocation_epsilon_range(delta=c["delta"], **args)
    return float(up), float(lo)


def _worker(conn):
    while True:
        c = conn.recv()
        if c is None:
            return
        t0 = time.perf_counter()
        try:
            up, lo = _pld_call(c)
            conn.send(dict(upper=up, lower=lo, seconds=time.perf_counter() - t0))
        except Exception as e:  # recorded, not fatal: the test skips configurations without a bracket
            conn.send(dict(error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0))


class Worker:
    """One pld-accounting process (imported once), restarted after a call runs out of time."""

    def __init__(self):
        self.proc = None

    def start(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()

    def call(self, c: dict, timeout: float) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(c)
        if self.conn.poll(timeout):
            return self.conn.recv()
        self.proc.terminate()
        self.proc.join()
        self.proc = None
        return dict(error=f"did not finish within {timeout:g} s", seconds=timeout)

    def close(self):
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(5)


def _write(out: pathlib.Path, meta: dict, cfgs: list[dict], done: dict) -> None:
    rows = []
    for c in cfgs:
        r = done.get(_key(c))
        rows.append(dict(c, **({} if r is None else {k: r[k] for k in ("upper", "lower", "error", "seconds") if k in r})))
    body = dict(meta, computed=sum(1 for r in rows if "lower" in r), failed=sum(1 for r in rows if "error" in r),
                configurations=rows)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=0) + "\n")
    tmp.replace(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000, help="configurations per scheme")
    ap.add_argument("--seed", type=int, default=20260401)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per pld-accounting call")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--journal", type=pathlib.Path, default=DEFAULT_JOURNAL)
    ap.add_argument("--budget", type=float, default=math.inf,
                    help="stop starting new calls after this many seconds (wall) and write what is done")
    args = ap.parse_args(argv)
    from importlib.metadata import version

    cfgs = configs(args.count, args.seed)
    journal = args.journal
    done = {}
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[row["key"]] = row
    meta = dict(
        source="pld-accounting gaussian_allocation_epsilon_range (default epsilon_accuracy); [lower, upper]",
        package="pld-accounting", package_version=version("pld-accounting"),
        command=f"python benchmarks/make_allocation_oracle.py --count {args.count} --seed {args.seed} "
                f"--timeout {args.timeout:g}" + (f" --budget {args.budget:g}" if math.isfinite(args.budget) else ""),
        seed=args.seed, count_per_scheme=args.count, timeout_seconds=args.timeout,
    )
    worker = Worker()
    todo = [c for c in cfgs if _key(c) not in done]
    # Cheapest first (pld-accounting's cost grows with the steps and epochs): a run stopped early
    # holds as many brackets as possible.
    todo.sort(key=lambda c: c["t"] * (c["epochs"] if c["scheme"] == "random_allocation" else 1) * c["k"])
    t_last = t_start = time.time()
    try:
        with journal.open("a") as fh:
            for i, c in enumerate(todo):
                if time.time() - t_start > args.budget:
                    break
                r = worker.call(c, args.timeout)
                r["key"] = _key(c)
                done[r["key"]] = r
                fh.write(json.dumps(r) + "\n")
                fh.flush()
                if time.time() - t_last > 60 or i == len(todo) - 1:
                    _write(args.out, meta, cfgs, done)
                    t_last = time.time()
                    print(f"{len(done)}/{len(cfgs)} done", file=sys.stderr, flush=True)
    finally:
        worker.close()
    _write(args.out, meta, cfgs, done)


if __name__ == "__main__":
    main()
