"""The notebooks call dpjax as it is now (default tier, seconds; the slow tier executes them).

Every code cell of every notebook -- as notebooks/make_notebooks.py generates it and as it is
committed -- is parsed, and every call of a dpjax function, class or method is checked against
the current library without running the accounting:

* the name resolves (a removed or renamed function fails);
* the arguments bind to its signature (``inspect.signature(f).bind``: a removed keyword, a
  missing argument or one too many fails);
* every argument of the accounting vocabulary (``noise_multiplier``, ``sampling_prob``,
  ``steps``, ``target_delta``, ...) whose value the cell states in constants is in its range,
  checked by dpjax's own validators.  An argument given in another function's order lands on a
  parameter whose range it misses: ``dpsgd_noise_multiplier(TARGET, DELTA, 1 / B, B * E)``, the
  order ``(target_epsilon, target_delta, sampling_prob, steps)`` of earlier releases, puts
  ``TARGET`` in ``sampling_prob`` and ``DELTA`` in ``steps``.

Values are known where a cell assigns constants (``B = 100``, ``DELTA = 1e-5``, arithmetic on
them, tuples and lists) and for loop variables over such lists (their first element); other
arguments are checked for binding only.  Objects built from dpjax classes (``acc =
BallsInBins(...)``) are followed to their methods.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import math
import pathlib

import numpy as np
import pytest

from dpjax._base import validate as _validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = ["group_privacy.ipynb", "moments_accountant.ipynb", "matrix_mechanisms.ipynb", "sweeps.ipynb",
         "training.ipynb", "progress.ipynb", "allocation.ipynb"]


def _scalar(check):
    """A validator for integer parameters: arrays are checked element by element."""
    def run(name, value):
        for v in np.ravel(np.asarray(value, dtype=object)):
            check(name, v)
    return run


#: The accounting vocabulary (docs/api_names.md) and the range of each.
VOCABULARY = {
    "noise_multiplier": _validate.positive,
    "sampling_prob": _validate.probability_open_closed,
    "sample_rate": _validate.probability_open_closed,
    "steps": _scalar(_validate.positive_int),
    "target_epsilon": _validate.nonnegative,
    "epsilon": _validate.nonnegative,
    "target_delta": _validate.probability_open,
    "delta": _validate.probability_open,
    "epochs": _validate.positive,
    "batches_per_epoch": _scalar(_validate.positive_int),
    "selections_per_epoch": _scalar(_validate.positive_int),
    "group_size": _scalar(_validate.positive_int),
    "dataset_size": _scalar(_validate.positive_int),
    "batch_size": _scalar(_validate.positive_int),
    "num_samples": _scalar(_validate.positive_int),
}

_UNKNOWN = object()
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b,
           ast.Mod: lambda a, b: a % b, ast.LShift: lambda a, b: a << b}


def _value(node, consts):
    """The value of ``node`` from literals and known constants, or ``_UNKNOWN``."""
    try:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            return consts.get(node.id, _UNKNOWN)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = _value(node.operand, consts)
            return _UNKNOWN if v is _UNKNOWN else -v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = _value(node.left, consts), _value(node.right, consts)
            if a is _UNKNOWN or b is _UNKNOWN or isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
                return _UNKNOWN
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [_value(e, consts) for e in node.elts]
            return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
            v = getattr(math, node.attr, _UNKNOWN)
            return v if isinstance(v, float) else _UNKNOWN
    except (ArithmeticError, TypeError, ValueError):
        return _UNKNOWN
    return _UNKNOWN


class _Checker(ast.NodeVisitor):
    """Walks a notebook's cells in order, tracking imports of dpjax, constants, loop variables
    and objects of dpjax classes, and checks every dpjax call it meets."""

    def __init__(self, notebook: str):
        self.notebook = notebook
        self.modules = {}   # local name -> dotted dpjax path it stands for
        self.consts = {}
        self.objects = {}   # local name -> the dpjax class of the object
        self.problems = []
        self.checked = 0
        self.where = ""
        self.needs_self = False

    # ---- names
    def _import(self, node):
        for alias in node.names:
            if isinstance(node, ast.Import) and alias.name.split(".")[0] == "dpjax":
                local = alias.asname or alias.name.split(".")[0]
                self.modules[local] = alias.name if alias.asname else "dpjax"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dpjax":
                self.modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    visit_Import = _import
    visit_ImportFrom = _import

    def _resolve(self, node):
        """The dpjax object ``node`` names (``None``: not dpjax); a missing one is a problem."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.reverse()
        self.needs_self = False
        if node.id in self.objects:
            obj, path = self.objects[node.id], f"{node.id} ({self.objects[node.id].__name__})"
            if len(parts) == 1:  # a method of the object: its signature on the class has ``self``
                raw = inspect.getattr_static(obj, parts[0], None)
                self.needs_self = inspect.isfunction(raw)
        elif node.id in self.modules:
            path = self.modules[node.id]
            obj = self._import_path(path)
            if obj is None:
                self.problems.append(f"{self.where}: {path} does not exist in dpjax")
                return None
        else:
            return None
        for attr in parts:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{attr}")
                except (ImportError, AttributeError):
                    self.problems.append(f"{self.where}: {path}.{'.'.join(parts)} does not exist in dpjax")
                    return None
        return obj

    @staticmethod
    def _import_path(path):
        try:
            return importlib.import_module(path)
        except ImportError:
            module, _, attr = path.rpartition(".")
            try:
                return getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                return None

    # ---- statements that bind names
    def visit_Assign(self, node):
        self.generic_visit(node)
        value = _value(node.value, self.consts)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self._bind(target.id, node.value, value)
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, list) and \
                    len(value) == len(target.elts):
                for t, v in zip(target.elts, value):
                    if isinstance(t, ast.Name):
                        self.consts[t.id] = v
            else:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        self.consts.pop(name.id, None)

    def _bind(self, name, node, value):
        self.objects.pop(name, None)
        if value is not _UNKNOWN:
            self.consts[name] = value
            return
        self.consts.pop(name, None)
        if isinstance(node, ast.Call):
            cls = self._resolve_quiet(node.func)
            if inspect.isclass(cls):
                self.objects[name] = cls

    def _resolve_quiet(self, node):
        problems = list(self.problems)
        obj = self._resolve(node)
        self.problems = problems
        return obj

    def visit_For(self, node):
        self.visit(node.iter)
        values = _value(node.iter, self.consts)
        if isinstance(node.target, ast.Name):
            if isinstance(values, list) and values:
                self.consts[node.target.id] = values[0]
            else:
                self.consts.pop(node.target.id, None)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_FunctionDef(self, node):
        # A function body runs with its own arguments: check its calls with the constants that
        # the arguments do not shadow.
        saved = dict(self.consts)
        for arg in node.args.args + node.args.kwonlyargs:
            self.consts.pop(arg.arg, None)
        for stmt in node.body:
            self.visit(stmt)
        self.consts = saved

    # ---- the check
    def visit_Call(self, node):
        self.generic_visit(node)
        target = self._resolve(node.func)
        if target is None or not callable(target):
            return
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return
        self.checked += 1
        name = ast.unparse(node.func)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return  # *args / **kwargs: nothing to bind statically
        args = [_value(a, self.consts) for a in node.args]
        kwargs = {k.arg: _value(k.value, self.consts) for k in node.keywords}
        if self.needs_self:
            args = [_UNKNOWN] + args
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            self.problems.append(f"{self.where}: {name}(...) does not bind to {name}{sig}: {exc}")
            return
        for param, value in bound.arguments.items():
            check = VOCABULARY.get(param)
            if check is None or value is _UNKNOWN or value is None:
                continue
            try:
                check(param, value)
            except (ValueError, TypeError) as exc:
                self.problems.append(f"{self.where}: {ast.unparse(node)}: {param} = {value!r} is out of range "
                                     f"({exc})")

    def check_cell(self, index: int, source: str):
        self.where = f"{self.notebook} cell {index}"
        for stmt in ast.parse(source).body:
            self.where = f"{self.notebook} cell {index} line {stmt.lineno}"
            self.visit(stmt)


def check_notebook(notebook: str, sources: list[str]) -> tuple[list[str], int]:
    """``(problems, calls checked)`` of the code cells ``sources`` of ``notebook``, in order."""
    checker = _Checker(notebook)
    for index, source in enumerate(sources):
        checker.check_cell(index, source)
    return checker.problems, checker.checked


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "notebooks" / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


@pytest.mark.parametrize("name", NAMES)
def test_generated_notebook_calls_bind_to_the_current_library(name):
    """What ``make_notebooks.py --execute`` runs (the generator needs nbformat, a test extra)."""
    nb = _generator().NOTEBOOKS[name]()
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    problems, checked = check_notebook(name, sources)
    assert not problems, "\n".join(problems)
    # matrix_mechanisms.ipynb only plots data files; every other notebook calls dpjax.
    assert checked >= (0 if name == "matrix_mechanisms.ipynb" else 3), checked


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_calls_bind_to_the_current_library(name):
    """What a reader opens (read as plain JSON)."""
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    sources = [_text(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    problems, checked = check_notebook(name, sources)
    assert not problems, "\n".join(problems)
    assert checked >= (0 if name == "matrix_mechanisms.ipynb" else 3), checked


def test_the_check_catches_the_earlier_argument_order():
    """The call of earlier releases, target first, is caught; the current order passes."""
    setup = "import dpjax\nTARGET, DELTA = 2.0, 1e-5\nB, E = 100, 10\n"
    old = setup + "s = dpjax.dpsgd_noise_multiplier(TARGET, DELTA, 1 / B, B * E)\n"
    problems, checked = check_notebook("old.ipynb", [old])
    assert checked == 1 and len(problems) == 3, problems
    assert "sampling_prob = 2.0 is out of range" in problems[0] and "steps = 1e-05 is out of range" in problems[1]
    assert "target_delta = 1000 is out of range" in problems[2]
    new = setup + ("s = dpjax.dpsgd_noise_multiplier(1 / B, B * E, TARGET, DELTA)\n"
                   "t = dpjax.dpsgd_noise_multiplier(target_epsilon=TARGET, target_delta=DELTA, "
                   "sampling=dpjax.RandomAllocation(B), epochs=E)\n")
    assert check_notebook("new.ipynb", [new]) == ([], 3)
    # A removed keyword, a removed function and a method of a dpjax object are caught too.
    other = setup + ("from dpjax import montecarlo, matrices\nimport numpy as np\n"
                     "dpjax.dpsgd_epsilon(1.0, 0.01, 1000, target_dleta=DELTA)\n"
                     "dpjax.no_such_function(1.0)\n"
                     "acc = montecarlo.BallsInBins(matrices.Toeplitz(np.array([1.0])), batches_per_epoch=B, epochs=E)\n"
                     "for sigma in [0.5, -1.0]:\n"
                     "    acc.certify(noise_multiplier=sigma, epsilon=TARGET, target_delta=DELTA, num_samples=1 << 16, "
                     "key=0)\n"
                     "acc.certify(1.0, TARGET, 2.0, 1 << 16, key=0)\n")
    problems, _ = check_notebook("other.ipynb", [other])
    assert len(problems) == 3, problems
    assert "target_dleta" in problems[0] and "no_such_function" in problems[1]
    assert "target_delta = 2.0 is out of range" in problems[2]
