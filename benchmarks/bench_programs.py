"""Every XLA program a PLD query or sweep compiles: its size (HLO instructions after XLA's
optimizations) and its compile time, on this machine.

Single queries, arrays of them, eps(T) curves, calibration, group privacy and the derivatives of
traced calls run the PLD program on the host and compile nothing (``tests/pld/grid/test_program_count.py``
checks it); what compiles is

* the sweeps' bucket programs: one per stage of the PLD program
  (``dpjax.pld.grid.program.stage_names``) for each bucket structure.  The buckets listed are those of the
  broad sweep distribution (``bench_sweep.py --dist broad``) and of its variants that change the
  program's structure: upper end only, delta queries, deltas below the floor-free threshold,
  group privacy;
* the wrappers a user's ``jax.jit`` builds around a traced query (a host callback and its
  derivative rule: the user's own program, listed for completeness).

Each program is lowered and compiled from scratch (the program store off), one at a time, in
this process; the compile is XLA's (``Lowered.compile``) with dpjax's options, as the sweeps
compile.  Writes ``benchmarks/results/bench_programs.json``.

    python benchmarks/bench_programs.py [--configs 120] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _meta import run_metadata  # noqa: E402


def hlo_instructions(text: str) -> int:
    """Instructions of an optimized HLO module (every ``name = type op(...)`` line)."""
    return sum(1 for line in text.splitlines() if re.search(r"^\s*(ROOT )?%?[\w.\-]+ = ", line))


def _compile(lower, repeats: int):
    """``(lowering seconds, median compile seconds, HLO instructions)`` of a fresh compile."""
    import jax

    from dpjax._base import xla as _xla

    # JAX keeps compiled executables in memory by module (the sweep runner may have compiled this
    # very program in its background pool): cleared so that every repeat is a real compile.
    jax.clear_caches()
    t = time.perf_counter()
    lowered = lower()
    lower_s = time.perf_counter() - t
    times, exe = [], None
    for _ in range(repeats):
        jax.clear_caches()
        t = time.perf_counter()
        exe = lowered.compile(_xla.compile_options())
        times.append(time.perf_counter() - t)
    return lower_s, statistics.median(times), hlo_instructions(exe.as_text()), exe


def sweep_programs(configs: list[dict], label: str, with_lower: bool, repeats: int) -> list[dict]:
    import jax

    from dpjax.pld.grid import program as prog
    from dpjax.pld.sweeps import plan as sweep_plan
    from dpjax.pld.sweeps import programs as sweep_run
    from dpjax.pld.sweeps.config import as_configs
    from dpjax.pld.sweeps.plan import BucketPolicy

    cfgs = as_configs(configs)
    kinds = ("up", "down") if with_lower else ("up",)
    mesh = sweep_run.make_mesh(jax.devices()[:1])
    rows = []
    with jax.enable_x64(True):
        pending = sweep_plan.plan_configs(list(range(len(cfgs))), cfgs, None)
        runner = sweep_run.BucketRunner(mesh, 32, 32, kinds, BucketPolicy(), None, with_lower,
                                        {sweep_plan.struct_of(p) for p in pending},
                                        floor_free=sweep_run.floor_free_needed(cfgs))
        seen = set()
        for parts, spec, args, key, struct, per_device in runner.jobs(pending):
            if key in seen:
                continue
            seen.add(key)
            programs = sweep_run._batched(mesh, spec, 1)
            prev = None
            for stage, program in zip(prog.stage_names(spec), programs):
                stage_args = (args[0], args[1], prev)
                lower_s, compile_s, hlo, exe = _compile(lambda: program.lower(*stage_args), repeats)
                rows.append(dict(family="sweep bucket", case=label, stage=stage, n=int(spec.n), kinds=list(kinds),
                                 want=spec.want, floor_free=bool(spec.floor_free), members=len(parts[0]),
                                 per_device=per_device, structure=sweep_run._struct_id(struct),
                                 hlo_instructions=hlo, lower_s=lower_s, compile_s=compile_s))
                print(f"{label:>28s} n={spec.n:>7d} {stage:>10s}: {hlo:5d} instr, compile {compile_s:.3f} s",
                      flush=True)
                prev = exe(*stage_args)
    return rows


def traced_programs(repeats: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    import dpjax

    cases = [
        ("jax.jit(dpsgd_epsilon)", lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5)),
        ("jax.jit(jax.grad(dpsgd_epsilon))", jax.grad(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))),
        ("jax.jit(dpsgd_noise_multiplier)", lambda e: dpjax.dpsgd_noise_multiplier(0.01, 1000, e, 1e-5)),
    ]
    rows = []
    for name, fn in cases:
        lower_s, compile_s, hlo, _ = _compile(lambda fn=fn: jax.jit(fn).lower(jnp.float32(1.1)), repeats)
        rows.append(dict(family="user jit of a traced query", case=name, stage="", hlo_instructions=hlo,
                         lower_s=lower_s, compile_s=compile_s))
        print(f"{name:>40s}: {hlo:5d} instr, compile {compile_s:.3f} s", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=120, help="configurations of the broad distribution planned")
    ap.add_argument("--repeats", type=int, default=3, help="compiles per program (the median is reported)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_programs.json"))
    args = ap.parse_args(argv)
    os.environ["DPJAX_COMPILATION_CACHE"] = "0"
    from bench_sweep import CONFIGS

    from dpjax.numerics import cache

    cache.disable()
    namespace: dict = {}
    exec(CONFIGS, namespace)  # the broad distribution exactly as bench_sweep.py draws it
    broad = namespace["configs"]("broad", args.configs)
    rows = []
    rows += sweep_programs(broad, "broad (with lower ends)", True, args.repeats)
    rows += sweep_programs(broad, "broad, upper ends only", False, args.repeats)
    rows += sweep_programs([dict(c, delta=1e-5) for c in broad[:8]], "delta 1e-5 (no floor-free column)", True,
                           args.repeats)
    rows += sweep_programs([dict({k: v for k, v in c.items() if k != "delta"}, epsilon=2.0) for c in broad[:8]],
                           "delta queries (epsilon 2)", True, args.repeats)
    rows += sweep_programs([dict(c, group_size=4) for c in broad[:8]], "group size 4", True, args.repeats)
    rows += traced_programs(args.repeats)
    sweep_rows = [r for r in rows if r["family"] == "sweep bucket"]
    out = dict(benchmark="bench_programs", rows=rows,
               summary=dict(programs=len(sweep_rows), max_compile_s=max(r["compile_s"] for r in sweep_rows),
                            max_hlo_instructions=max(r["hlo_instructions"] for r in sweep_rows),
                            over_half_second=sum(r["compile_s"] > 0.5 for r in sweep_rows)),
               meta=run_metadata(__file__, argv))
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
