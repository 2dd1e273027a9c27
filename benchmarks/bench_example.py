"""The README's first command, ``dpjax optimize --example``: wall time with a warm compilation cache.

Each run is a fresh process (``python -m dpjax optimize --example --json --quiet --no-save``) with the
persistent compilation cache in a private directory (``DPJAX_COMPILATION_CACHE=<tmp>``), warmed
by one unmeasured run per variant.  Two variants alternate, so that they see the same machine
state:

* ``default``: what the command does today (variance-reduced in-loop estimate, variance-reduced
  certificate);
* ``plain_kl``: the previous defaults (``--estimator plain --samples 4096 --certify-method
  bernoulli_kl``: screened plain estimate with 2^12 samples per step, Bernoulli-KL certificate
  with 2^23 samples).

Reported per variant: the median and every wall time, each run's CPU time and peak RSS (from
``os.wait4``: the child alone), the certified noise multiplier and rmse, the certificate's method
and sample count.  The 1-minute load average is recorded next to each
run (the machine is a shared 2-core CPU).

Run:  python benchmarks/bench_example.py [--repeats 3]
Writes benchmarks/results/bench_example.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from _meta import run_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "bench_example.json")
VARIANTS = {
    "default": [],
    "plain_kl": ["--estimator", "plain", "--samples", "4096", "--certify-method", "bernoulli_kl"],
}


def run(extra, cache):
    env = dict(os.environ, DPJAX_COMPILATION_CACHE=cache)
    load = os.getloadavg()[0]
    argv = [sys.executable, "-m", "dpjax", "optimize", "--example", "--json", "--quiet", "--no-save", *extra]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU time and peak RSS
        secs = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(stderr[-2000:])
    d = json.loads(stdout)
    cert = d.get("certificate") or {}
    return {"seconds": secs, "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024.0,
            "load_average": load, "noise_multiplier": d["noise_multiplier"], "rmse": d["rmse"],
            "method": cert.get("method"), "certificate_samples": cert.get("num_samples"),
            "timings": d.get("timings")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="dpjax-example-cache-")
    result = {"cache": "private, warmed by one unmeasured run per variant", "cpu_count": os.cpu_count(),
              "variants": {name: {"args": extra, "runs": []} for name, extra in VARIANTS.items()}}
    for name, extra in VARIANTS.items():
        result["variants"][name]["warmup"] = run(extra, cache)
        print(f"warm-up {name}: {result['variants'][name]['warmup']['seconds']:.1f}s", flush=True)
    for _ in range(args.repeats):
        for name, extra in VARIANTS.items():
            r = run(extra, cache)
            result["variants"][name]["runs"].append(r)
            print(f"{name}: {r['seconds']:.1f}s, CPU {r['cpu_seconds']:.1f}s (load {r['load_average']:.1f}) sigma {r['noise_multiplier']:.5g} "
                  f"rmse {r['rmse']:.5g} {r['method']} {r['certificate_samples']}", flush=True)
    for name, v in result["variants"].items():
        v["median_seconds"] = statistics.median(r["seconds"] for r in v["runs"])
        v["median_cpu_seconds"] = statistics.median(r["cpu_seconds"] for r in v["runs"])
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result["meta"] = run_metadata(__file__)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v["median_seconds"] for k, v in result["variants"].items()}))


if __name__ == "__main__":
    main()
