"""Peak memory of the README's first command, ``dpjax optimize --example``, against a baseline commit.

Each run is a fresh process (``python -m dpjax optimize --example --json --quiet``, plus
``--no-save`` where the version has it) whose peak resident set size is read from the kernel when
it exits (``os.wait4``'s ``ru_maxrss``: the largest RSS of that process alone).  Two versions:

* ``head``: this checkout;
* ``baseline``: ``--baseline`` (a git commit, exported with ``git archive``).

Each version gets its own private persistent compilation cache (``DPJAX_COMPILATION_CACHE``):
its first run starts from an empty cache (``cold``: the example as on a fresh machine, XLA's
compilations included), the ``--repeats`` runs after it find the cache warm (``warm``: the
example's second and later runs).  Warm runs alternate between the versions.  Also recorded per
run: the wall time, the certified noise multiplier and the certificate's sample count.

Run:  python benchmarks/bench_example_memory.py --baseline COMMIT [--repeats 2]
Writes benchmarks/results/bench_example_memory.json.
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
RESULTS = os.path.join(ROOT, "benchmarks", "results", "bench_example_memory.json")


def _has_no_save(path: str) -> bool:
    with open(os.path.join(path, "dpjax", "cli", "optimize.py")) as fh:
        return "--no-save" in fh.read()


def run(path: str, cache: str, workdir: str) -> dict:
    """One fresh ``dpjax optimize --example`` of the version at ``path``: peak RSS, wall time, result."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=path, DPJAX_COMPILATION_CACHE=cache, DPJAX_PROGRESS="0")
    argv = [sys.executable, "-m", "dpjax", "optimize", "--example", "--json", "--quiet"]
    if _has_no_save(path):
        argv.append("--no-save")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(stderr[-2000:])
    d = json.loads(stdout)
    cert = d.get("certificate") or {}
    return {"peak_rss_mib": usage.ru_maxrss / 1024.0, "seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "load_average": load, "noise_multiplier": d["noise_multiplier"],
            "certificate_samples": cert.get("num_samples"), "method": cert.get("method")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git commit to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="warm runs per version (alternating)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "baseline")
        os.makedirs(base)
        subprocess.run(f"git -C {ROOT} archive {args.baseline} | tar -x -C {base}", shell=True, check=True)
        versions = {"head": ROOT, "baseline": base}
        caches = {name: os.path.join(tmp, f"cache-{name}") for name in versions}
        workdir = os.path.join(tmp, "cwd")
        os.makedirs(workdir)
        result = {"benchmark": "bench_example_memory", "baseline_commit": args.baseline,
                  "versions": {name: {"cold": None, "warm": []} for name in versions}}
        for name, path in versions.items():
            r = run(path, caches[name], workdir)
            result["versions"][name]["cold"] = r
            print(f"{name} cold: peak {r['peak_rss_mib']:.0f} MiB, {r['seconds']:.1f} s", flush=True)
        for _ in range(args.repeats):
            for name, path in versions.items():
                r = run(path, caches[name], workdir)
                result["versions"][name]["warm"].append(r)
                print(f"{name} warm: peak {r['peak_rss_mib']:.0f} MiB, {r['seconds']:.1f} s "
                      f"(load {r['load_average']:.1f})", flush=True)
    for v in result["versions"].values():
        v["warm_peak_rss_mib_median"] = statistics.median(r["peak_rss_mib"] for r in v["warm"])
        v["cold_peak_rss_mib"] = v["cold"]["peak_rss_mib"]
    h, b = result["versions"]["head"], result["versions"]["baseline"]
    result["warm_peak_ratio_head_over_baseline"] = h["warm_peak_rss_mib_median"] / b["warm_peak_rss_mib_median"]
    result["cold_peak_ratio_head_over_baseline"] = h["cold_peak_rss_mib"] / b["cold_peak_rss_mib"]
    result["meta"] = run_metadata(__file__, argv)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k.endswith("ratio_head_over_baseline")}))


if __name__ == "__main__":
    main()
