"""``dpjax`` command line: one subcommand per accounting task.

Every subcommand accepts ``--json`` (print exactly one JSON object on stdout), ``--out FILE``
(write the same JSON object to FILE) and ``--quiet`` (no progress; progress goes to stderr only,
a bar in a terminal and lines in a log, so ``--json`` output stays parseable).
Bad input exits with status 2 and a one-line message on stderr (no usage block, no traceback).
``dpjax --version`` prints the installed version.

List-valued options (``type=real_list(...)`` from :mod:`dpjax.cli._args`, e.g. ``--delta
1e-5,1e-6``) accept comma lists: the subcommand runs once per combination of the listed values
and the output is ``{"rows": [...]}`` (one object per combination) instead of one object.

Adding a subcommand: write a module under ``dpjax/cli/`` with a function
``register(subparsers)`` that calls ``subparsers.add_parser(name, help=..., description=...)``,
adds its arguments (every one with a ``help``; numbers with the range-checked types of
:mod:`dpjax.cli._args`), and sets ``parser.set_defaults(run=fn)`` where ``fn(args) -> dict``
returns the result as a JSON-able dict (floats may be ``inf``; they are printed as the JSON
string "inf"; accounting results name their ``adjacency``).  Optionally also
``parser.set_defaults(render=fn)`` with ``fn(result: dict) -> str`` for the human-readable form,
and ``parser.set_defaults(vectorized=("epsilon",))`` for list options that ``fn`` handles itself
(it then receives the list and may return a list of row dicts).  Then list the module in
``SUBCOMMAND_MODULES`` below.  A subcommand whose ``--out`` is its own file format (``sweep``'s
CSV, ``optimize``'s loadable result) sets ``owns_out=True`` and writes it itself.
``tests/test_cli_consistency.py`` checks every registered
subcommand against these rules.

Every subcommand runs with JAX's persistent compilation cache on (``~/.cache/dpjax/xla``;
``DPJAX_COMPILATION_CACHE=0`` disables it, ``=<dir>`` relocates it): see :mod:`dpjax.pld.cache`.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import sys
import warnings
from typing import Any, Sequence

from dpjax.cli import _args

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "dpjax.cli.demo",
    "dpjax.cli.montecarlo",
    "dpjax.cli.pld",
    "dpjax.cli.calibrate",
    "dpjax.cli.optimize",
    "dpjax.cli.sweep",
)


def _jsonable(obj: Any) -> Any:
    """Replace non-finite floats by strings so the output is strict JSON."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.tolist())
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
    return obj


def _nan_fields(obj: Any, prefix: str = "") -> list[str]:
    """Paths of NaN values in a result (a NaN is never a valid answer: it is reported as an error)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _nan_fields(v, f"{prefix}{k}.")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _nan_fields(v, f"{prefix}{i}.")]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _nan_fields(obj.tolist(), prefix)
    if isinstance(obj, float) and math.isnan(obj):
        return [prefix.rstrip(".")]
    return []


def _default_render(result: dict) -> str:
    if "rows" in result and isinstance(result["rows"], list):
        return "\n\n".join(_default_render(r) for r in result["rows"])
    return _args.render_fields(result, width=None)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        # argparse's own usage errors: exit 2 with ONE line (the usage block is in --help).
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("dpjax")
    except Exception:  # not installed (PYTHONPATH checkout): the package's own number
        import dpjax

        return dpjax.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="dpjax",
        description="Differential-privacy accounting in JAX (float64, certified upper bounds).  "
                    "Run 'dpjax COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"dpjax {_version()}",
                        help="print the installed dpjax version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    for sub in subparsers.choices.values():
        dests = {a.dest for a in sub._actions}
        g = sub.add_argument_group("output")
        if "json" not in dests:
            g.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if "out" not in dests:
            g.add_argument("--out", metavar="FILE", default=None,
                           help="also write the JSON object (the same as --json prints) to FILE")
        if "quiet" not in dests:
            g.add_argument("--quiet", action="store_true",
                           help="no progress (it goes to stderr: a bar in a terminal, lines in a log)")
    return parser


def list_options(sub: argparse.ArgumentParser) -> list[str]:
    """Destinations of the comma-list options of a subcommand parser."""
    return [a.dest for a in sub._actions if getattr(a.type, "is_list", False)]


def _expand(args, parser_lists: list[str]) -> list[argparse.Namespace]:
    """One namespace per combination of the (non-vectorized) list-valued options."""
    vectorized = set(getattr(args, "vectorized", ()) or ())
    names = [d for d in parser_lists if d not in vectorized and isinstance(getattr(args, d, None), list)]
    if not names:
        return [args]
    out = []
    for combo in itertools.product(*(getattr(args, d) for d in names)):
        ns = argparse.Namespace(**vars(args))
        for d, v in zip(names, combo):
            setattr(ns, d, v)
        out.append(ns)
    return out


def _combine(results: list) -> dict:
    rows = []
    for r in results:
        rows.extend(r if isinstance(r, list) else [r])
    if len(rows) == 1:
        return rows[0]
    out: dict = {"rows": rows}
    adj = {r.get("adjacency") for r in rows if isinstance(r, dict)}
    if len(adj) == 1 and None not in adj:
        out["adjacency"] = adj.pop()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2): a return code for callers
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0
    # A CLI process owns its JAX configuration: every subcommand keeps compiled programs on disk
    # (dpjax.pld.cache; DPJAX_COMPILATION_CACHE=0 turns it off, =<dir> relocates it), so a second
    # run of any subcommand skips XLA compilation.
    from dpjax.pld.cache import enable_from_environment

    enable_from_environment(default_on=True)
    from dpjax._progress import get_progress, set_progress

    progress_state = get_progress()[0]  # restored below: a subcommand's switch ends with it
    if args.quiet:
        set_progress(False)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    try:
        with warnings.catch_warnings():
            # NumPy overflow warnings from extreme inputs are handled by the accountants (the
            # answer is inf or a ValueError); printing them would break the one-line contract.
            warnings.simplefilter("ignore", RuntimeWarning)
            # Other warnings (e.g. a resumed run's missing screen-state sidecar): one line each.
            warnings.showwarning = lambda message, *_a, **_k: sys.stderr.write(
                f"dpjax {args.command}: warning: {' '.join(str(message).split())}\n")
            result = _combine([args.run(ns) for ns in _expand(args, list_options(sub))])
    except (ValueError, OverflowError) as exc:
        msg = " ".join(str(exc).split())  # one line
        sys.stderr.write(f"dpjax {args.command}: error: {msg}\n")
        return 2
    finally:
        set_progress(progress_state)
    nans = _nan_fields(result)
    if nans:  # a NaN is a defect, never an answer: refuse to print it as one
        sys.stderr.write(f"dpjax {args.command}: error: the computation gave NaN for {', '.join(nans)} "
                         "at these inputs (outside the range this command handles)\n")
        return 2
    text = json.dumps(_jsonable(result))
    if args.out is not None and not getattr(args, "owns_out", False):
        try:
            with open(args.out, "w") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            sys.stderr.write(f"dpjax {args.command}: error: --out: cannot write {args.out!r}: {exc.strerror}\n")
            return 2
    if args.json:
        sys.stdout.write(text + "\n")
    else:
        render = getattr(args, "render", None) or _default_render
        if "rows" in result and render is not _default_render:
            sys.stdout.write("\n\n".join(render(r) for r in result["rows"]) + "\n")
        else:
            sys.stdout.write(render(result) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
