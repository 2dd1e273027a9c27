"""``dpjax`` command line: one subcommand per accounting task.

Every subcommand accepts ``--json`` and then prints exactly one JSON object on stdout.
Bad input exits with status 2 and a one-line message on stderr (no traceback).

Adding a subcommand: write a module under ``dpjax/cli/`` with a function
``register(subparsers)`` that calls ``subparsers.add_parser(...)``, adds its arguments, and sets
``parser.set_defaults(run=fn)`` where ``fn(args) -> dict`` returns the result as a JSON-able dict
(floats may be ``inf``; they are printed as the JSON string "inf").  Optionally also
``parser.set_defaults(render=fn)`` with ``fn(result: dict) -> str`` for the human-readable form.
Then list the module in ``SUBCOMMAND_MODULES`` below.

Every subcommand runs with JAX's persistent compilation cache on (``~/.cache/dpjax/xla``;
``DPJAX_COMPILATION_CACHE=0`` disables it, ``=<dir>`` relocates it): see :mod:`dpjax.pld.cache`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any, Sequence

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "dpjax.cli.demo",
    "dpjax.cli.montecarlo",
    "dpjax.cli.pld",
    "dpjax.cli.calibrate",
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


def _default_render(result: dict) -> str:
    width = max((len(k) for k in result), default=0)
    lines = []
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        lines.append(f"{key:<{width}}  {value}")
    return "\n".join(lines)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: exit 2, one line
        self.print_usage(sys.stderr)
        sys.stderr.write(f"dpjax: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="dpjax",
        description="Differential-privacy accounting in JAX (float64, certified upper bounds).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    for sub in subparsers.choices.values():
        if not any(a.dest == "json" for a in sub._actions):
            sub.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0
    # A CLI process owns its JAX configuration: every subcommand keeps compiled programs on disk
    # (dpjax.pld.cache; DPJAX_COMPILATION_CACHE=0 turns it off, =<dir> relocates it), so a second
    # run of any subcommand skips XLA compilation.
    from dpjax.pld.cache import enable_from_environment

    enable_from_environment(default_on=True)
    try:
        result = args.run(args)
    except ValueError as exc:
        sys.stderr.write(f"dpjax {args.command}: error: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(_jsonable(result)) + "\n")
    else:
        render = getattr(args, "render", None) or _default_render
        sys.stdout.write(render(result) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
