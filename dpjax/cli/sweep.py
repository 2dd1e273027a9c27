"""``dpjax sweep``: certified epsilon (or delta) for a grid or a list of DP-SGD configurations
(:data:`DESCRIPTION` is the ``--help`` text).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from dpjax._base import io as _io
from dpjax._base.enums import Adjacency
from dpjax.cli import _args


def parse_values(name: str, text: str, *, integer: bool = False) -> list:
    """``a,b,c`` | ``start:stop:num`` | ``start:stop:num:log`` -> list of numbers."""
    import numpy as np

    text = str(text).strip()
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] not in ("log", "lin")):
                raise ValueError
            start, stop, num = float(parts[0]), float(parts[1]), int(parts[2])
            if num < 1 or not (math.isfinite(start) and math.isfinite(stop)):
                raise ValueError
            if len(parts) == 4 and parts[3] == "log":
                if start <= 0 or stop <= 0:
                    raise ValueError
                values = np.geomspace(start, stop, num)
            else:
                values = np.linspace(start, stop, num)
            values = [float(v) for v in values]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
            if not values:
                raise ValueError
    except ValueError:
        raise ValueError(f"{name} must be a list a,b,c or a range start:stop:num[:log], got {text!r}") from None
    if integer:
        rounded = [int(round(v)) for v in values]
        if any(abs(v - r) > 1e-9 * max(1.0, abs(v)) for v, r in zip(values, rounded)) and ":" not in text:
            raise ValueError(f"{name} must be integers, got {text!r}")
        # A range of integers may repeat after rounding; keep the first of each.
        seen, values = set(), []
        for r in rounded:
            if r not in seen:
                seen.add(r)
                values.append(r)
    return values


def _configs(args):
    from dpjax.pld.sweeps.driver import SweepConfig, sweep_grid

    if args.grid is not None:
        if any(v is not None for v in (args.noise_multiplier, args.sampling_prob, args.steps, args.delta,
                                       args.epsilon)):
            raise ValueError("give either --grid FILE or the value lists (--noise-multiplier ...), not both")
        data = _read_grid(args.grid)
        return [SweepConfig.from_mapping(m) for m in data]
    missing = [n for n, v in (("--noise-multiplier", args.noise_multiplier), ("--sampling-prob", args.sampling_prob),
                              ("--steps", args.steps)) if v is None]
    if missing or (args.delta is None) == (args.epsilon is None):
        raise ValueError("give --grid FILE, or --noise-multiplier, --sampling-prob, --steps and exactly one of "
                         "--delta / --epsilon" + (f" (missing {', '.join(missing)})" if missing else ""))
    return sweep_grid(
        parse_values("noise_multiplier", args.noise_multiplier),
        parse_values("sampling_prob", args.sampling_prob),
        parse_values("steps", args.steps, integer=True),
        None if args.delta is None else parse_values("delta", args.delta),
        None if args.epsilon is None else parse_values("epsilon", args.epsilon),
        parse_values("group_size", args.group_size, integer=True),
    )


def _run_allocation(args, store) -> tuple:
    from dpjax.pld.sweeps.driver import sweep

    from dpjax.pld.scenario import scheme_from_keywords
    from dpjax.pld.sweeps.config import sweep_grid

    if args.grid is not None:
        if any(v is not None for v in (args.noise_multiplier, args.batches_per_epoch, args.epochs, args.delta,
                                       args.epsilon)):
            raise ValueError("give either --grid FILE or the value lists (--noise-multiplier ...), not both")
        configs = [dict(c, sampling=c.get("sampling", args.sampling)) if isinstance(c, dict) else c
                   for c in _read_grid(args.grid)]
    else:
        if args.noise_multiplier is None or args.batches_per_epoch is None or args.epochs is None:
            raise ValueError("--sampling random_allocation / balls_in_bins needs --noise-multiplier, "
                             "--batches-per-epoch and --epochs (or --grid FILE)")
        schemes = [scheme_from_keywords(args.sampling, batches_per_epoch=int(t), selections_per_epoch=int(k))
                   for t in parse_values("batches_per_epoch", args.batches_per_epoch, integer=True)
                   for k in parse_values("selections_per_epoch", args.selections_per_epoch, integer=True)]
        configs = sweep_grid(parse_values("noise_multiplier", args.noise_multiplier), sampling=schemes,
                             epochs=parse_values("epochs", args.epochs, integer=True),
                             delta=None if args.delta is None else parse_values("delta", args.delta),
                             epsilon=None if args.epsilon is None else parse_values("epsilon", args.epsilon))
    if args.sampling_prob is not None or args.steps is not None or args.group_size != "1":
        raise ValueError("--sampling-prob, --steps and --group-size are for --sampling poisson")
    table = sweep(configs, out=store, resume=args.resume, with_lower=not args.no_lower)
    return table, dict(sampling=args.sampling)


def _read_grid(path: str) -> list:
    try:
        with open(path) as f:
            data = _io.loads(f.read())
    except OSError as exc:
        raise ValueError(f"grid: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"grid: {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"grid: {path} must hold a non-empty JSON list of configuration objects")
    return data


def _run(args) -> dict:
    from dpjax.pld.sweeps.driver import SweepExecution, sweep

    if args.resume and args.out is None:
        raise ValueError("--resume needs --out (the file the killed sweep wrote)")
    if args.per_device is not None and args.per_device < 1:
        raise ValueError(f"per_device must be an integer >= 1, got {args.per_device}")
    # --out FILE.json: the result JSON at the end (rows recorded in the journal FILE.journal.jsonl
    # / .csv as they are computed, for --resume); any other FILE: the CSV table (+ FILE.jsonl).
    json_out = args.out is not None and os.path.splitext(args.out)[1].lower() == ".json"
    store = os.path.splitext(args.out)[0] + ".journal.csv" if json_out else args.out
    if args.sampling != "poisson":
        table, extra = _run_allocation(args, store)
    else:
        if args.batches_per_epoch is not None or args.epochs is not None or args.selections_per_epoch != "1":
            raise ValueError("--batches-per-epoch, --selections-per-epoch and --epochs need --sampling "
                             "random_allocation or balls_in_bins")
        configs = _configs(args)
        table = sweep(configs, out=store, resume=args.resume, with_lower=not args.no_lower,
                      execution=SweepExecution(per_device=args.per_device, backend=args.backend))
        extra = {}
    eps = [r["epsilon"] for r in table.rows if r["query"] == "epsilon"]
    # Poisson-sampled DP-SGD (and its groups), random allocation, balls-in-bins: the add/remove
    # neighbouring relation.
    out = dict(adjacency=Adjacency.ADD_OR_REMOVE, **extra, configurations=len(table), out=args.out, programs=table.programs,
               programs_compiled=getattr(table, "compiled", None), programs_loaded=getattr(table, "loaded", None),
               devices=table.devices, seconds=table.seconds,
               resumed=sum(r["path"] == "resumed" for r in table.rows))
    if eps:
        finite = [e for e in eps if math.isfinite(e)]
        out.update(epsilon_min=min(finite) if finite else math.inf, epsilon_max=max(eps))
    if args.out is None or args.rows or json_out:
        # "table", not "rows": "rows" is the CLI's key for one result per comma-list combination.
        out["table"] = [dict(r) for r in table.rows]
    if json_out:
        from dpjax.cli.main import write_out

        write_out(args.out, out)
        if not args.rows:
            out = {k: v for k, v in out.items() if k != "table"}
    return out


def _table_lines(rows) -> list[str]:
    from dpjax.pld.sweeps.driver import ROW_FIELDS

    fields = ROW_FIELDS
    if rows and "batches_per_epoch" in rows[0]:
        from dpjax.pld.allocation.accountant import SWEEP_ROW_FIELDS as fields
    return [",".join(fields)] + [",".join("" if r.get(f) is None else str(r.get(f)) for f in fields)
                                 for r in rows]


def _render(result: dict) -> str:
    return _args.render_fields(result, {"table": _table_lines})


DESCRIPTION = """\
Certified epsilon (or delta) for a grid or a list of DP-SGD configurations.

Value lists: a,b,c (listed values), start:stop:num (num evenly spaced values, both ends
included), start:stop:num:log (log-spaced).  The grid is the Cartesian product, with
--noise-multiplier varying slowest.  --grid FILE reads a JSON list of objects with
noise_multiplier, sampling_prob, steps and target_delta (or target_epsilon for a delta query;
"delta" / "epsilon" are read too), optionally group_size.  --sampling random_allocation /
balls_in_bins sweeps noise_multiplier, batches_per_epoch, selections_per_epoch, epochs and
target_delta (or target_epsilon) instead (add/remove adjacency; every row is the single call's
value, grid "accountant").

Output: one row per configuration, in input order: the configuration, target_delta or
target_epsilon, the certified epsilon (epsilon queries) or delta (delta queries), the certified
bracket lower / upper of that value, and the grid it was computed on (grid: "sweep", the
sweep's coarser grid, within 1e-3 relative of the single call; "accountant", the single call's
grid, as dpjax epsilon / delta; "closed_form", q = 1, no grid; n, dx).  Both are certified upper
bounds on different grids: a sweep row can differ from dpjax epsilon in the fourth digit.
--out FILE.csv writes the CSV as rows are computed (with the journal FILE.jsonl); --out
FILE.json writes the result JSON (every row) at the end (the rows are journaled in
FILE.journal.jsonl and FILE.journal.csv meanwhile);
--resume continues a killed sweep without recomputing or losing a row.  On one CPU device the
configurations run on the host, on every core, without compiling (--backend auto); with
accelerators or several devices (--backend compiled) they share compiled programs as a cost
model decides (no configuration runs at more than 3x the cost of its own grid shape), sharded
over every device JAX sees; with the program store on (the default here) a later process loads
the programs and plans of an earlier one.

Examples:
  dpjax sweep --noise-multiplier 0.5:4:64 --sampling-prob 1e-3:1e-1:32:log \\
      --steps 1000,10000 --delta 1e-5 --out sweep.csv [--resume]
  dpjax sweep --grid configs.json --out sweep.json
  dpjax sweep --sampling random_allocation --noise-multiplier 0.8,1,1.5 --batches-per-epoch 32,128 \\
      --epochs 1,4 --delta 1e-5 --json"""


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="certified epsilon/delta for a grid or list of DP-SGD configurations",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default=None, metavar="FILE", help="JSON list of configuration objects")
    p.add_argument("--noise-multiplier", default=None, metavar="VALUES", help="sigma values (list or range)")
    p.add_argument("--sampling-prob", default=None, metavar="VALUES", help="q values in (0, 1]")
    p.add_argument("--steps", "--train-steps", dest="steps", default=None, metavar="VALUES",
                   help="training steps T (integers)")
    p.add_argument("--delta", "--target-delta", dest="delta", default=None, metavar="VALUES",
                   help="target deltas (epsilon queries)")
    p.add_argument("--epsilon", "--target-epsilon", dest="epsilon", default=None, metavar="VALUES",
                   help="target epsilons (delta queries)")
    p.add_argument("--group-size", default="1", metavar="VALUES", help="group sizes k (Poisson; default 1)")
    p.add_argument("--sampling", type=_args.choice("poisson", "random_allocation", "balls_in_bins"), default="poisson",
                   help="poisson (default; --sampling-prob, --steps) or random_allocation / balls_in_bins "
                        "(--batches-per-epoch, --selections-per-epoch, --epochs); add/remove adjacency")
    p.add_argument("--batches-per-epoch", default=None, metavar="VALUES", help="steps per epoch t (integers)")
    p.add_argument("--selections-per-epoch", default="1", metavar="VALUES",
                   help="steps per example per epoch k (random_allocation; default 1)")
    p.add_argument("--epochs", default=None, metavar="VALUES", help="numbers of epochs E (integers)")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="FILE.csv: the CSV table, written as rows are computed (plus FILE.jsonl, and FILE.parquet "
                        "with pyarrow); FILE.json: the result JSON with every row, at the end (rows journaled "
                        "in FILE.journal.jsonl / .csv meanwhile)")
    p.add_argument("--resume", action="store_true", help="continue a killed sweep recorded in --out")
    p.add_argument("--no-lower", action="store_true", help="skip the certified lower end of each bracket (~2x faster)")
    p.add_argument("--per-device", type=_args.integer(1, 2**20), default=None,
                   help="configurations per device per program call, an integer >= 1 (default 32 on CPU, 256 on "
                        "an accelerator)")
    p.add_argument("--backend", type=_args.choice("auto", "host", "compiled"), default="auto",
                   help="host (the program in NumPy on this machine's cores, nothing compiled), compiled "
                        "(programs sharded over every device) or auto (default: host on a single CPU device)")
    p.add_argument("--rows", action="store_true", help="also print every row (always when --out is not given)")
    # --out is the sweep's own table (CSV + JSON lines), not a copy of the --json object.
    p.set_defaults(run=_run, render=_render, owns_out=True,
                   out_formats={".csv": "the CSV table, written as rows are computed",
                                ".json": "the result JSON with every row, at the end"})
