"""Monte Carlo samples per second on 1, 2, 4 and 8 forced CPU devices and on 2 processes.

The plain balls-in-bins sums of :func:`dpjax.montecarlo.sharded_monte_carlo_sums` (b = 128,
E = 16: the n = 2048 matrices of Choquette-Choo et al., *Near exact privacy amplification for
matrix mechanisms*) over every device of every process, each layout in fresh processes started by
``tests/montecarlo/_multiprocess_worker.py``: ``XLA_FLAGS=--xla_force_host_platform_device_count=D`` for
``D`` devices in one process, ``jax.distributed`` on localhost (gloo collectives) for two
processes of one device each.  Each layout times ``--repeats`` calls after a warm-up call (the
median is reported) and records the sums' bits, which must be the same on every layout, the
CPU seconds process 0 spent per call (how many cores it kept busy) and the machine's one-minute
load average before the layout ran (other work on the machine takes cores from it).

Efficiency is the speed-up over one device divided by the number of devices.  Forced host
devices share the machine's cores: past the core count (recorded in ``meta.machine``) the
devices only take turns, so the efficiency there measures the cost of the split, not a
speed-up.  Writes ``benchmarks/results/bench_scaling.json``::

    python benchmarks/bench_scaling.py --samples 524288 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "montecarlo"))

from _meta import run_metadata  # noqa: E402

import _multiprocess_worker as worker  # noqa: E402


def _cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1 << 19, help="Monte Carlo samples per call")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per layout (after one warm-up call)")
    ap.add_argument("--b", type=int, default=128, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--out", default=str(HERE / "results" / "bench_scaling.json"))
    args = ap.parse_args(argv)
    task = {"samples": args.samples, "repeats": args.repeats, "b": args.b, "epochs": args.epochs}
    spec = {"tasks": [["run", "samples_per_second"]], "run": task}
    layouts = [(f"{d} host device{'s' if d > 1 else ''}", 1, d) for d in (1, 2, 4, 8)]
    layouts.append(("2 processes (1 device each)", 2, None))
    rows = []
    for name, processes, devices in layouts:
        load = os.getloadavg()[0]
        res = worker.launch(spec, processes, host_devices=devices, timeout=1800)
        run = res["run"]
        rows.append({"layout": name, "processes": res["processes"], "devices": res["devices"],
                     "seconds": run["seconds"], "samples_per_second": run["samples_per_second"],
                     "first_call_seconds": run["first_call_seconds"],
                     "process0_cpu_seconds": run["cpu_seconds"], "load_average_before": load,
                     "total_bits": run["total"]})
        print(f"{name}: {run['samples_per_second']:.4g} samples/s", file=sys.stderr)
    base = rows[0]["samples_per_second"]
    for r in rows:
        r["speedup"] = r["samples_per_second"] / base
        r["efficiency"] = r["speedup"] / r["devices"]
    same = len({r["total_bits"] for r in rows}) == 1
    out = {"benchmark": "bench_scaling", "samples": args.samples, "batches_per_epoch": args.b, "epochs": args.epochs,
           "repeats": args.repeats, "cores": _cores(), "same_bits_on_every_layout": same, "rows": rows,
           "meta": run_metadata(__file__, argv)}
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
