"""One direction of imports across all of ``dpjax``, function bodies included.

Every package has one layer, and a module imports only from its own layer or lower ones.  From the
bottom up:

0. ``dpjax._base``, the foundation: validation, float64 scopes, XLA options, result records,
   I/O, progress bars;
1. building blocks on the foundation alone: ``dpjax.numerics`` (the monotone root finder and its
   implicit adjoint, the closed-form Gaussian curve, Renyi-DP of the subsampled Gaussian, the
   compiled-program cache) and ``dpjax.matrices``;
2. ``dpjax.noise`` (streaming correlated noise, on matrices);
3. ``dpjax.pld``: the PLD accountant (grid pipeline, random allocation, sweeps; its fallback
   bounds use the RDP curve of ``dpjax.numerics``);
4. what builds on the PLD accountant: ``dpjax.group``, ``dpjax.baselines`` (RDP, strong
   composition and the group-privacy lemma, for comparison) and ``dpjax.report``;
5. ``dpjax.montecarlo`` (on matrices and the Gaussian curve) and ``dpjax.sampling`` (batch
   schedules, accounted by the Monte Carlo and PLD layers);
6. ``dpjax.calibration``;
7. ``dpjax.optimization``;
8. the front ends: ``dpjax.interop``, ``dpjax.cli``, ``dpjax.__main__`` and the top package
   ``dpjax`` itself (whose ``__init__`` re-exports names on first access; the CLI reads its
   version from it).

So pld, matrices -> montecarlo -> calibration -> optimization -> interop, cli.

The import graph is read from the source (``ast``): every ``import`` and ``from ... import``
statement counts, at module level, in a class body or inside a function (a lazy import is still
a dependency; it only moves the failure to the first call).  ``from dpjax import x`` where ``x``
is a submodule is an edge to ``dpjax.x``; a string that holds code (e.g. for a subprocess) is
not an import.  Importing a submodule counts as an edge to that submodule only (its parent
package's ``__init__`` runs too, but the packages' ``__init__`` modules re-export and import
nothing upward).  Two checks run on the graph: it has no cycle, and no edge goes up a layer.
A fresh interpreter also imports every sub-package first (an import-order cycle would show as
an ImportError there), and the package installs no import hooks.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpjax"

SUBPACKAGES = ["dpjax.pld", "dpjax.matrices", "dpjax.montecarlo", "dpjax.calibration",
               "dpjax.optimization", "dpjax.baselines", "dpjax.group", "dpjax.cli.main"]

#: Layer of each package or top-level module (the longest matching prefix wins; ``"dpjax"``
#: matches only the top package itself).  See the module docstring for the reasons of the order.
LAYERS = {
    "dpjax._base": 0,
    "dpjax.numerics": 1, "dpjax.matrices": 1,
    "dpjax.noise": 2,
    "dpjax.pld": 3,
    "dpjax.group": 4, "dpjax.baselines": 4, "dpjax.report": 4,
    "dpjax.montecarlo": 5, "dpjax.sampling": 5,
    "dpjax.calibration": 6,
    "dpjax.optimization": 7,
    "dpjax.interop": 8, "dpjax.cli": 8, "dpjax.__main__": 8, "dpjax": 8,
}

#: The most modules (``__init__`` included) one folder of the package may hold.
MAX_MODULES_PER_FOLDER = 12


# ------------------------------------------------------------------------------------------
# The checker


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(root: pathlib.Path, package: str) -> dict[str, dict[str, list[tuple[int, bool]]]]:
    """``{module: {imported module: [(line, in_function), ...]}}`` over every module of
    ``package`` (a directory under ``root``); only edges between the package's own modules.

    ``import a.b`` is an edge to the longest prefix of ``a.b`` that is a module;
    ``from a import x`` is an edge to ``a.x`` where that is a module, else to ``a``; relative
    imports are resolved against the importing module's package.
    """
    files = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}

    def known(name: str) -> str | None:
        while name:
            if name in files:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, dict[str, list[tuple[int, bool]]]] = {m: {} for m in files}
    for module, path in files.items():
        pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def add(target, node, in_function):
            if target is not None and target != module:
                graph[module].setdefault(target, []).append((node.lineno, in_function))

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        add(known(alias.name), child, inner)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = pkg.split(".")[: len(pkg.split(".")) - (child.level - 1)]
                        name = ".".join(base + ([child.module] if child.module else []))
                    else:
                        name = child.module or ""
                    for alias in child.names:
                        sub = f"{name}.{alias.name}"
                        add(sub if sub in files else known(name), child, inner)
                visit(child, inner)

        visit(ast.parse(path.read_text(), filename=str(path)), False)
    return graph


def cycles(graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def layer(module: str, layers: dict[str, int] = LAYERS) -> int | None:
    """The layer of ``module``: the entry of the longest matching prefix (the top package's own
    entry matches only itself)."""
    best = None
    for prefix, value in layers.items():
        if module == prefix or ("." in prefix and module.startswith(prefix + ".")):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, value)
    return None if best is None else best[1]


def upward_imports(graph, layers: dict[str, int] = LAYERS) -> list[str]:
    """Every edge that goes up a layer, and every module without a layer, as readable lines."""
    problems = []
    for module in sorted(graph):
        if layer(module, layers) is None:
            problems.append(f"{module} has no layer: add it to LAYERS")
    for module in sorted(graph):
        for target, where in sorted(graph[module].items()):
            lo, hi = layer(module, layers), layer(target, layers)
            if lo is not None and hi is not None and hi > lo:
                line, in_function = where[0]
                problems.append(f"{module} (layer {lo}, line {line}{', in a function' if in_function else ''}) "
                                f"imports {target} (layer {hi})")
    return problems


def _describe(graph, component) -> str:
    members = set(component)
    edges = [f"{a} -> {b} (line {graph[a][b][0][0]})" for a in component for b in sorted(graph[a]) if b in members]
    return f"cycle among {component}: " + "; ".join(edges)


# ------------------------------------------------------------------------------------------
# The checks on dpjax


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, "dpjax")


def test_import_graph_has_no_cycle(graph):
    found = cycles(graph)
    assert not found, "\n".join(_describe(graph, c) for c in found)


def test_no_module_imports_a_higher_layer(graph):
    problems = upward_imports(graph)
    assert not problems, "\n".join(problems)


def test_every_layer_entry_names_a_module(graph):
    # A stale entry (a module moved or renamed) would silently stop checking anything.
    stale = [prefix for prefix in LAYERS
             if not any(m == prefix or m.startswith(prefix + ".") for m in graph)]
    assert not stale, stale


def test_no_folder_holds_more_than_twelve_modules():
    sizes = {str(d.relative_to(ROOT)): len(list(d.glob("*.py")))
             for d in [PACKAGE, *PACKAGE.rglob("*")] if d.is_dir() and d.name != "__pycache__"}
    crowded = {d: n for d, n in sizes.items() if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, crowded
    assert sizes["dpjax"] >= 2  # the walk saw the package


@pytest.mark.parametrize("module", SUBPACKAGES)
def test_imports_first_in_a_fresh_interpreter(module):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_no_import_hooks_installed():
    # The package must not need a sys.meta_path finder to resolve its import order (third-party
    # packages may add their own, e.g. absl's reload detector: only dpjax's count).
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import sys; import dpjax, dpjax.calibration, dpjax.optimization; "
            "print(sum(type(f).__module__.startswith('dpjax') for f in sys.meta_path))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "0"


# ------------------------------------------------------------------------------------------
# The checker itself


def test_checker_reports_an_added_upward_import(graph):
    # One extra edge from the PLD accountant up to the calibration layer: reported as an upward
    # import, and as a cycle (the PLD calibration reaches the accountant through pld.grid.batched).
    assert "dpjax.calibration.pld" not in graph["dpjax.pld.accountant"]
    extra = {m: dict(edges) for m, edges in graph.items()}
    extra["dpjax.pld.accountant"]["dpjax.calibration.pld"] = [(1, True)]
    problems = upward_imports(extra)
    assert any(p.startswith("dpjax.pld.accountant (layer 3, line 1, in a function) imports "
                            "dpjax.calibration.pld (layer 6)") for p in problems), problems
    assert any({"dpjax.pld.accountant", "dpjax.calibration.pld"} <= set(c) for c in cycles(extra))
    # ... and a module outside every entry of LAYERS is reported, not skipped.
    extra["dpjax.newmodule"] = {}
    assert "dpjax.newmodule has no layer: add it to LAYERS" in upward_imports(extra)


def test_checker_on_a_synthetic_package(tmp_path):
    # A lazy import is an edge; `from pkg import sub` is an edge to the submodule, not to the
    # package; relative imports resolve; code in a string is not an import.
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_base.py").write_text("X = 1\n")
    (pkg / "low" / "__init__.py").write_text("from . import core\n")
    (pkg / "low" / "core.py").write_text(textwrap.dedent("""\
        from pkg import _base

        def later():
            from pkg import high          # lazy and upward
            return high

        CODE = "from pkg.high import thing; import pkg.high"   # a string, not an import
        """))
    (pkg / "high.py").write_text("from .low.core import later\nthing = later\n")
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.low.core"] == {"pkg._base": [(1, False)], "pkg.high": [(4, True)]}
    assert g["pkg.low"] == {"pkg.low.core": [(1, False)]}
    assert g["pkg.high"] == {"pkg.low.core": [(1, False)]}
    assert cycles(g) == [["pkg.high", "pkg.low.core"]]
    layers = {"pkg._base": 0, "pkg.low": 1, "pkg.high": 2, "pkg": 2}
    assert layer("pkg._base", layers) == 0
    assert upward_imports(g, layers) == ["pkg.low.core (layer 1, line 4, in a function) imports pkg.high (layer 2)"]


def test_lazy_pld_names_match_their_static_imports():
    """``dpjax.pld`` loads its names on first access (``_ATTRS``) and states the same imports under
    ``TYPE_CHECKING`` for static analysis (the API reference): the two lists must agree."""
    import ast

    import dpjax.pld

    tree = ast.parse(pathlib.Path(dpjax.pld.__file__).read_text())
    static = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                static.update({alias.asname or alias.name: imp.module for alias in imp.names})
    assert static == dpjax.pld._ATTRS
    assert sorted(dpjax.pld.__all__) == sorted(static)


def test_test_folders_mirror_the_package():
    """``tests/`` is laid out like ``dpjax/``: each folder of tests is a package of dpjax
    (``tests/pld/grid`` holds the tests of ``dpjax/pld/grid``); tests of top-level modules and of
    the project as a whole stay at the top."""
    tests = pathlib.Path(__file__).resolve().parent
    package = tests.parent / "dpjax"
    folders = [p for p in tests.rglob("*") if p.is_dir() and p.name not in ("data", "__pycache__")
               and "data" not in p.relative_to(tests).parts]
    assert folders, "tests/ has no package folders"
    for folder in folders:
        rel = folder.relative_to(tests)
        assert (package / rel / "__init__.py").exists(), f"tests/{rel} mirrors no package dpjax/{rel}"
        assert any(folder.glob("test_*.py")), f"tests/{rel} holds no test module"
