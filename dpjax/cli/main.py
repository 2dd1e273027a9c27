"""``dpjax`` command line: one subcommand per accounting task.

Every subcommand accepts ``--json`` (print exactly one JSON object on stdout), ``--out FILE``
(the same JSON object to ``FILE.json``, a CSV table to ``FILE.csv``; another extension is
refused before any work) and ``--quiet`` (no progress; progress goes to stderr only,
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
``parser.set_defaults(render=fn)`` with ``fn(result: dict) -> str`` for the human-readable form
(with ``render_takes_args=True``: ``fn(result, args)``, for options such as ``--verbose``),
and ``parser.set_defaults(vectorized=("epsilon",))`` for list options that ``fn`` handles itself
(it then receives the list and may return a list of row dicts).  Then list the module in
``SUBCOMMAND_MODULES`` below.  A subcommand whose ``--out`` is its own file format (``sweep``'s
CSV, ``optimize``'s loadable result) sets ``owns_out=True`` and writes it itself, and
``out_formats`` (extension -> what is written) when those are not ``.json`` and ``.csv``.
``tests/cli/test_cli_consistency.py`` checks every registered
subcommand against these rules.

Every subcommand runs with JAX's persistent compilation cache on (``~/.cache/dpjax/xla``;
``DPJAX_COMPILATION_CACHE=0`` disables it, ``=<dir>`` relocates it): see :mod:`dpjax.numerics.cache`.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import importlib
import io
import itertools
import math
import os
import re
import sys
import warnings
from typing import Any, Sequence

from dpjax._base import io as _io
from dpjax.cli import _args

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "dpjax.cli.optimize",
    "dpjax.cli.pld",
    "dpjax.cli.calibrate",
    "dpjax.cli.report",
    "dpjax.cli.sweep",
    "dpjax.cli.demo",
    "dpjax.cli.montecarlo",
)

#: How ``dpjax --help`` lists the subcommands: by job, the main one first.
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Optimize a correlated-noise mechanism (the main job)", ("optimize",)),
    ("DP-SGD accounting (certified, PLD accountant)", ("epsilon", "delta", "noise", "report", "sweep", "demo")),
    ("Matrix mechanisms under balls-in-bins batching (Monte Carlo)",
     ("mc-delta", "mc-epsilon", "mc-certify", "mc-calibrate")),
)


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


def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def render_table(rows: list) -> str:
    """Rows of one comma-list run as text: the fields every row shares once (``key  value``),
    then a table with one line per row and one column per field that varies (nested fields are
    in the ``--json`` output)."""
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if _scalar(v) and k not in cols:
                cols.append(k)
    same = [c for c in cols if len(rows) > 1 and len({_cell(r.get(c)) for r in rows}) == 1]
    cols = [c for c in cols if c not in same]
    head = _args.render_fields({c: rows[0].get(c) for c in same}, width=None, skip_none=True) if same else ""
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda items: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(items, widths)))
    table = "\n".join([line(cols)] + [line(row) for row in cells])
    return f"{head}\n\n{table}" if head else table


def _default_render(result: dict) -> str:
    if "rows" in result and isinstance(result["rows"], list):
        return render_table(result["rows"])
    return _args.render_fields(result, width=None)


def _flat(obj: Any, prefix: str = "") -> dict:
    """One CSV row of a (nested) result: nested keys joined with dots, lists as JSON."""
    out: dict = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = _io.dumps(v)
        else:
            out[key] = _io.strict_json_data(v)
    return out


def write_out(path: str, result: dict) -> None:
    """``--out FILE``: the format its extension says -- ``.csv`` a CSV table (one row per result
    row, or one row), ``.json`` the JSON object ``--json`` prints (other extensions are refused
    before the run, :func:`check_out_extension`).  Written atomically
    (:func:`dpjax._base.io.atomic_write`): an interrupted run leaves the previous file, never part of
    a new one."""
    if os.path.splitext(path)[1].lower() == ".csv":
        rows = [_flat(r) for r in result["rows"]] if isinstance(result.get("rows"), list) else [_flat(result)]
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=cols)
        writer.writeheader()
        writer.writerows(rows)
        _io.atomic_write(path, buf.getvalue())
        return
    _io.atomic_write(path, _io.dumps(result) + "\n")


#: ``--out`` formats by extension (a subcommand that writes its own file sets ``out_formats``).
OUT_FORMATS = {".json": "the JSON object --json prints", ".csv": "a CSV table"}


def check_out_extension(args) -> None:
    """``--out FILE``: FILE's extension names one of the subcommand's formats, or the run is
    refused before any work (a file whose name says CSV never receives JSON).  A directory is
    left to the subcommand, which says so."""
    path = getattr(args, "out", None)
    if path is None or os.path.isdir(path):
        return
    formats = getattr(args, "out_formats", OUT_FORMATS)
    ext = os.path.splitext(path)[1].lower()
    if ext not in formats:
        kinds = " or ".join(f"{e} ({what})" for e, what in formats.items())
        raise ValueError(f"--out: FILE must end in {kinds}, got {path!r}")


#: Python argument names whose command-line option has another name.
_FLAG_OF = {"target_epsilon": "epsilon", "target_delta": "delta", "sample_rate": "sampling_prob",
            "num_samples": "samples", "num_buffers": "buffers", "num_steps": "optimizer_steps"}
_HAS_FLAG = re.compile(r"(^|[\s(\[/,'\"])--[a-z]")


def name_the_options(message: str, sub: argparse.ArgumentParser) -> str:
    """``message`` (a library ``ValueError``) in the command line's names: where it names no
    option, each Python argument name that is one of ``sub``'s options (``noise_multiplier``,
    ``target_delta``, ...) becomes the flag (``--noise-multiplier``, ``--delta``).  Names with an
    underscore are replaced anywhere; a plain word (``steps``, ``bands``) only where the message
    starts with it, so that prose keeps its words."""
    if _HAS_FLAG.search(message):
        return message
    flags = {}
    for action in sub._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if long:
            flags[action.dest] = long[0]
    for name, dest in _FLAG_OF.items():
        if dest in flags:
            flags.setdefault(name, flags[dest])
    for name in sorted(flags, key=len, reverse=True):
        if "_" in name:
            message = re.sub(rf"(?<![\w-]){re.escape(name)}\b", flags[name], message)
        elif re.match(rf"{re.escape(name)}\b", message):
            message = flags[name] + message[len(name):]
    return message


#: Spellings that changed meaning or name: an unknown option names its replacement.
RENAMED_OPTIONS = {"optimize": {"--steps": "--optimizer-steps"}}
_NUMBER = re.compile(r"^-(\d|\.\d|inf\b|nan\b)", re.IGNORECASE)


class _ArgumentParser(argparse.ArgumentParser):
    """``allow_abbrev=False`` (a prefix of an option is never taken for it), an unknown option
    is named (with the closest known one) before anything else is checked, and usage errors
    are one line."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        self._check_unknown(args)
        return super().parse_known_args(args, namespace)

    def _check_unknown(self, args) -> None:
        known = set(self._option_string_actions)
        has_commands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        command = self.prog.split()[-1]
        for tok in args:
            if tok == "--":
                break
            if not tok.startswith("-") or _NUMBER.match(tok) or tok == "-":
                if has_commands:
                    break  # the subcommand: what follows is its own
                continue
            flag = tok.split("=", 1)[0]
            if flag in known:
                continue
            hint = RENAMED_OPTIONS.get(command, {}).get(flag)
            prefixed = sorted(k for k in known if k.startswith(flag) and flag.startswith("--"))
            if hint is None and prefixed:
                self.error(f"unknown option {flag} (abbreviations are not accepted: did you mean "
                           f"{' or '.join(prefixed)}?)")
            if hint is None:
                close = difflib.get_close_matches(flag, sorted(k for k in known if k.startswith("--")), n=1,
                                                  cutoff=0.6)
                hint = close[0] if close else None
            self.error(f"unknown option {flag}" + (f" (did you mean {hint}?)" if hint else ""))

    def error(self, message: str):
        # argparse's own usage errors: exit 2 with ONE line (the usage block is in --help).
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dpjax")
    except Exception:  # not installed (PYTHONPATH checkout): the package's own number
        import dpjax

        return dpjax.__version__


def _commands_text(subparsers) -> str:
    helps = {a.dest: a.help for a in subparsers._choices_actions}
    width = max(len(n) for n in helps)
    lines = []
    for title, names in COMMAND_GROUPS:
        lines.append(f"{title}:")
        lines.extend(f"  {n:<{width}}  {helps[n]}" for n in names if n in helps)
        lines.append("")
    rest = [n for n in helps if not any(n in names for _, names in COMMAND_GROUPS)]
    if rest:
        lines.append("Other:")
        lines.extend(f"  {n:<{width}}  {helps[n]}" for n in rest)
    return "\n".join(lines).rstrip()


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="dpjax",
        usage="dpjax [-h] [--version] COMMAND [options]",
        description="Differential-privacy accounting in JAX (float64, certified upper bounds).  "
                    "Run 'dpjax COMMAND --help' for a command's options and an example.",
        epilog="Example: dpjax optimize --example",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpjax {_version()}",
                        help="print the installed dpjax version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser, prog="dpjax",
                                       title="commands", help=argparse.SUPPRESS)
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(subparsers)
    # The commands by job (argparse would list them in one flat block).
    subparsers.description = _commands_text(subparsers)
    parser._action_groups[-1].description = subparsers.description
    for sub in subparsers.choices.values():
        dests = {a.dest for a in sub._actions}
        g = sub.add_argument_group("output")
        if "json" not in dests:
            g.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        if "out" not in dests:
            g.add_argument("--out", metavar="FILE", default=None,
                           help="also write the result to FILE: CSV if FILE ends in .csv (one line per row), "
                                "the JSON object --json prints if it ends in .json (other names are refused)")
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
    # (dpjax.numerics.cache; DPJAX_COMPILATION_CACHE=0 turns it off, =<dir> relocates it), so a second
    # run of any subcommand skips XLA compilation.
    from dpjax.numerics.cache import enable_from_environment

    enable_from_environment(default_on=True)
    from dpjax._base.progress import get_progress, set_progress

    progress_state = get_progress()[0]  # restored below: a subcommand's switch ends with it
    if args.quiet:
        set_progress(False)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    try:
        check_out_extension(args)
        with warnings.catch_warnings():
            # NumPy overflow warnings from extreme inputs are handled by the accountants (the
            # answer is inf or a ValueError); printing them would break the one-line contract.
            warnings.simplefilter("ignore", RuntimeWarning)
            # Other warnings (e.g. a resumed run's missing screen-state sidecar): one line each.
            warnings.showwarning = lambda message, *_a, **_k: sys.stderr.write(
                f"dpjax {args.command}: warning: {' '.join(str(message).split())}\n")
            result = _combine([args.run(ns) for ns in _expand(args, list_options(sub))])
    except (ValueError, OverflowError) as exc:
        msg = name_the_options(" ".join(str(exc).split()), sub)  # one line, in the options' names
        sys.stderr.write(f"dpjax {args.command}: error: {msg}\n")
        return 2
    finally:
        set_progress(progress_state)
    nans = _nan_fields(result)
    if nans:  # a NaN is a defect, never an answer: refuse to print it as one
        sys.stderr.write(f"dpjax {args.command}: error: the computation gave NaN for {', '.join(nans)} "
                         "at these inputs (outside the range this command handles)\n")
        return 2
    text = _io.dumps(result)
    if args.out is not None and not getattr(args, "owns_out", False):
        try:
            write_out(args.out, result)
        except OSError as exc:
            sys.stderr.write(f"dpjax {args.command}: error: --out: cannot write {args.out!r}: {exc.strerror}\n")
            return 2
    if args.json:
        sys.stdout.write(text + "\n")
    elif "rows" in result and isinstance(result["rows"], list):
        sys.stdout.write(render_table(result["rows"]) + "\n")  # comma lists: one table
    else:
        render = getattr(args, "render", None) or _default_render
        text = render(result, args) if getattr(args, "render_takes_args", False) else render(result)
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
