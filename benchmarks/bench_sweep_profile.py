"""Where the sweep's steady state goes on the broad distribution, against the single-call loop.

One process, the broad distribution of ``bench_sweep.py`` (seed 1, 120 configurations by
default).  After a first pass of each variant (compiles), ``--rounds`` rounds time, one after the
other:

* ``sweep``: ``dpjax.sweep(configs)``, the default (certified brackets: an upper and a lower
  discretization per direction, buckets by :class:`dpjax.pld.BucketPolicy`);
* ``sweep_upper``: the same without the lower end (``with_lower=False``): half the rows;
* ``sweep_own_shapes``: the default with ``BucketPolicy(max_padding=1.0)``: every configuration
  runs at its own static sizes (no padding; one program per distinct shape);
* ``sweep_upper_own_shapes``: both;
* ``loop``: ``dpjax.dpsgd_epsilon`` per configuration (upper ends only, the single call's grids).

Each variant's share of the default's time says what the lower end and the bucket padding cost.
Per bucket of the default sweep it also records the static sizes, the members and the measured
run time of one chunk (``--per-bucket``).  Writes ``benchmarks/results/bench_sweep_profile.json``.

    python benchmarks/bench_sweep_profile.py [--configs 120] [--rounds 3]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sweep import CONFIGS  # noqa: E402  (the broad distribution, drawn as bench_sweep draws it)

SNIPPET = CONFIGS + r"""
import json, time
N, ROUNDS = {n}, {rounds}
cfg = configs("broad", N)
import jax
import dpjax
from dpjax.pld import BucketPolicy
from dpjax.pld import sweeping as S, sweep_plan as SP, sweep_run as SR

own = BucketPolicy(max_padding=1.0)
variants = dict(
    sweep=lambda: dpjax.sweep(cfg, progress=False),
    sweep_upper=lambda: dpjax.sweep(cfg, progress=False, with_lower=False),
    sweep_own_shapes=lambda: dpjax.sweep(cfg, progress=False, execution=dpjax.SweepExecution(bucketing=own)),
    sweep_upper_own_shapes=lambda: dpjax.sweep(cfg, progress=False, with_lower=False, execution=dpjax.SweepExecution(bucketing=own)),
    loop=lambda: [dpjax.dpsgd_epsilon(c["noise_multiplier"], c["sampling_prob"], c["steps"], c["delta"]) for c in cfg],
)
programs = dict()
for name, f in variants.items():
    out = f()
    if hasattr(out, "programs"):
        programs[name] = out.programs
times = {{name: [] for name in variants}}
for _ in range(ROUNDS):
    for name, f in variants.items():
        t, c = time.perf_counter(), time.process_time()
        f()
        times[name].append([time.perf_counter() - t, time.process_time() - c])

# The default sweep's buckets: static sizes, members, one chunk's run time (program compiled).
configs = [S.SweepConfig.from_mapping(c) for c in cfg]
policy = BucketPolicy()
buckets = []
with jax.enable_x64(True):
    pending = SP.plan_configs(list(range(N)), configs, None)
    mesh = SR.make_mesh(jax.devices())
    kinds = ("up", "down")
    for struct, (n, m, nf), members, _ in SP.bucket_plan(pending, {{}}, policy, 4):
        static = SR.static_of(members[0], m, nf)
        chunk = members[:32]
        args = SR.chunk_args(chunk, 32, mesh)
        fn = SR.compile_program(SR.program_key(mesh, chunk[0], kinds, static, args), mesh, chunk[0], kinds, static, args)
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            runs.append(time.perf_counter() - t)
        buckets.append(dict(n=n, m=m, n_freq=nf, members=len(members), chunk=len(chunk),
                            chunk_run_s=min(runs), modelled_cost_ms=sum(policy.cost(n, m, nf, 4, support=SP.shape_of(p)[1])
                                                                     for p in members)))
own_model = sum(policy.cost(*SP.shape_of(p), 4) for p in pending)
print(json.dumps(dict(times=times, programs=programs, buckets=buckets, own_shapes_modelled_cost_ms=own_model,
                      jax=jax.__version__)))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_sweep_profile.json"))
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DPJAX_COMPILATION_CACHE="0", DPJAX_PROGRESS="0")
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-c", SNIPPET.format(n=args.configs, rounds=args.rounds)],
                          capture_output=True, text=True, env=env, cwd=str(ROOT))
    if proc.returncode != 0:
        sys.exit(proc.stderr[-4000:])
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    t = data["times"]
    base = t["sweep"]
    shares = {name: [v[0] / b[0] for v, b in zip(vals, base)] for name, vals in t.items()}
    print(f"broad distribution, {args.configs} configurations, {args.rounds} rounds (wall s):")
    for name, vals in t.items():
        print(f"  {name:24} " + "  ".join(f"{v[0]:6.2f}" for v in vals)
              + "   share of the default sweep: " + ", ".join(f"{x:.2f}" for x in shares[name])
              + (f"   programs {data['programs'][name]}" if name in data["programs"] else ""))
    for b in data["buckets"]:
        print(f"  bucket n={b['n']} m={b['m']} n_freq={b['n_freq']}: {b['members']} members, "
              f"{b['chunk_run_s'] * 1e3 / b['chunk']:.1f} ms per configuration")
    from _meta import run_metadata

    out = dict(benchmark="bench_sweep_profile", configs=args.configs, rounds=args.rounds, shares=shares, **data,
               machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), loadavg_start=load,
                            loadavg_end=os.getloadavg()),
               meta=run_metadata(__file__, argv))
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
