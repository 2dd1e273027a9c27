"""Where a sweep's steady state spends its time: XLA op time per part, per bucket program.

Runs ``dpjax.sweep`` on a distribution of ``bench_sweep.py`` twice in one process (persistent
cache off; the first pass compiles), and the second pass under JAX's profiler.  Every XLA op
event of the trace is attributed to its program (one per bucket: the module is named after its
static sizes) and, through the compiled HLO's source metadata, to the part of the computation
it implements: the loss CDFs, the grid PMFs (split and matching), the log-MGF, the FFTs, the
transform's modulus/phase/power, the inverse's exp/cos/sin, the window and tail bounds, the
conversion to epsilon, or the rest (the loop over configurations, copies).  Op times add up
over threads (XLA runs independent ops of a program in parallel), so the total can exceed the
wall time.  Host time outside XLA (planning, bucketing, row assembly) is reported from the
wall time of the pass.

    python benchmarks/profile_sweep.py --dist broad --configs 120 [--out benchmarks/results/profile_sweep.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import pathlib
import re
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: (part, function names): an op belongs to the innermost frame of its source stack that names
#: one of these functions (FFT ops by their opcode).
PARTS = (
    ("loss CDFs (erfc)", {"normal_cdf_sf", "normal_small_tail", "_x_of_loss", "loss_cdfs_directions", "loss_cdfs", "mog_loss_cdfs",
                          "_mixture_cdf_sf", "mog_inverse_privacy_loss", "_newton_h",
                          "host_loss_cdfs"}),
    ("grid PMF (split, matching)", {"grid_pmf", "_bin_masses", "grid_pmf.<locals>.<genexpr>"}),
    ("log-MGF", {"pmf_log_mgf"}),
    ("window, tail bounds", {"_window", "window", "chernoff_quantiles",
                             "wrap_tails", "window_start"}),
    ("conversion to epsilon", {"_epsilon_row", "epsilon", "curve_terms", "suffix_sums_small", "eps_at",
                               "delta_at", "table", "suffix_sums"}),
    ("transform: modulus, phase, power", {"_compose.<locals>.body", "compose_directions.<locals>.body"}),
    ("inverse: exp, cos, sin; weights", {"epsilon_program", "compose_directions", "program_jit"}),
)
CONTAINERS = {"while", "conditional", "call", "async-start", "async-done", "parameter", "tuple",
              "get-tuple-element", "constant"}


def _sections(text: str):
    files, funcs, locs, frames = {}, {}, {}, {}
    sec = None
    for line in text.splitlines():
        s = line.strip()
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            sec = s
            continue
        m = re.match(r"^(\d+) (.*)$", s)
        if sec and m:
            i, rest = int(m.group(1)), m.group(2)
            if sec == "FileNames":
                files[i] = rest.strip('"')
            elif sec == "FunctionNames":
                funcs[i] = rest.strip('"')
            else:
                d = dict(re.findall(r"(\w+)=(\d+)", rest))
                if sec == "FileLocations":
                    locs[i] = int(d["function_name_id"])
                else:
                    frames[i] = (int(d["file_location_id"]), int(d.get("parent_frame_id", 0)))
        elif s:
            sec = None
    return funcs, locs, frames


def op_parts(text: str) -> dict:
    """``{instruction name: (opcode, part)}`` of a compiled program's HLO text."""
    funcs, locs, frames = _sections(text)
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
        if not m:
            continue
        name, rest = m.groups()
        op = re.search(r"[\]\}\)] ([a-z][\w\-]*)\(", rest) or re.search(r" ([a-z][\w\-]*)\(", rest)
        opcode = op.group(1) if op else "?"
        sf = re.search(r"stack_frame_id=(\d+)", rest)
        chain, f, seen = [], int(sf.group(1)) if sf else 0, set()
        while f and f in frames and f not in seen:
            seen.add(f)
            loc, parent = frames[f]
            chain.append(funcs.get(locs.get(loc, -1), "?"))
            f = parent
        part = "FFT" if opcode == "fft" else None
        for fn in chain if part is None else ():
            part = next((label for label, names in PARTS if fn in names), None)
            if part:
                break
        out[name] = (opcode, part or "loop, copies, other")
    return out


def trace_ops(run) -> list:
    d = tempfile.mkdtemp()
    import jax

    with jax.profiler.trace(d, create_perfetto_trace=True):
        run()
    path = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)[0]
    return json.load(gzip.open(path))["traceEvents"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dist", choices=("narrow", "broad"), default="broad")
    ap.add_argument("--configs", type=int, default=120)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ["DPJAX_COMPILATION_CACHE"] = "0"
    import bench_sweep

    ns: dict = {}
    exec(bench_sweep.CONFIGS, ns)
    cfg = ns["configs"](args.dist, args.configs)
    import jax
    import dpjax
    from dpjax.pld.sweeps import programs as sweep_run

    t0 = time.perf_counter()
    first = dpjax.sweep(cfg, progress=False)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    dpjax.sweep(cfg, progress=False)
    t_second = time.perf_counter() - t0
    texts = {}
    for fn in sweep_run.COMPILED.values():
        if hasattr(fn, "as_text"):
            text = fn.as_text()
            m = re.match(r"HloModule (\S+?),", text)
            if m:
                texts[m.group(1)] = op_parts(text)
    events = trace_ops(lambda: dpjax.sweep(cfg, progress=False))
    per_prog = collections.defaultdict(collections.Counter)
    for e in events:
        a = e.get("args") or {}
        if e.get("ph") != "X" or "hlo_op" not in a:
            continue
        mod = a.get("hlo_module")
        info = texts.get(mod, {}).get(a["hlo_op"])
        if info is None or info[0] in CONTAINERS:
            continue
        per_prog[mod][info[1]] += e["dur"] / 1e3
    sizes = collections.Counter(f"{r['n']}" for r in first.rows)
    total = collections.Counter()
    for c in per_prog.values():
        total.update(c)
    op_ms = sum(total.values())
    print(f"{args.dist}, {args.configs} configurations: first pass {t_first:.2f} s, second {t_second:.2f} s, "
          f"{first.programs} programs; row FFT lengths {dict(sizes)}")
    print(f"XLA op time of the profiled (second) pass: {op_ms / 1e3:.2f} s "
          f"({op_ms / args.configs:.2f} ms per configuration)")
    for part, ms in total.most_common():
        print(f"  {part:36s} {ms / 1e3:7.3f} s  {100 * ms / op_ms:5.1f}%")
    for mod, c in sorted(per_prog.items()):
        s = sum(c.values())
        print(f"  program {mod}: {s / 1e3:.3f} s; " + ", ".join(f"{k} {100 * v / s:.0f}%" for k, v in c.most_common(4)))
    out = dict(dist=args.dist, configs=args.configs, first_pass_s=t_first, second_pass_s=t_second,
               programs=first.programs, op_seconds=op_ms / 1e3,
               parts={k: v / 1e3 for k, v in total.most_common()},
               per_program={m: {k: v / 1e3 for k, v in c.most_common()} for m, c in per_prog.items()},
               machine=dict(cpu_count=os.cpu_count(), jax=jax.__version__, backend=jax.default_backend(),
                            loadavg=os.getloadavg()))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
