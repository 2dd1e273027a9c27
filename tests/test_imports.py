"""One direction of imports: pld, matrices -> montecarlo -> calibration -> optimization.

Two checks: every sub-package imports cleanly when it is the *first* dpjax module a fresh
interpreter imports (a cycle hidden by import order shows up as an ImportError for one of them),
and a static (``ast``) check that no lower layer imports a higher one at module level.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpjax"

SUBPACKAGES = ["dpjax.pld", "dpjax.matrices", "dpjax.montecarlo", "dpjax.calibration",
               "dpjax.optimization", "dpjax.baselines", "dpjax.group", "dpjax.cli.main"]


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


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _module_level_imports(path: pathlib.Path) -> list[str]:
    """Absolute names of the dpjax modules ``path`` imports at module level (not in functions).

    Module level includes ``if``/``try`` blocks at the top and class bodies (they run at import
    time); only function bodies are skipped.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    found: list[str] = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                found.append(name)
                found.extend(f"{name}.{alias.name}" for alias in child.names)
            visit(child)

    visit(tree)
    return [name for name in found if name == "dpjax" or name.startswith("dpjax.")]


def _files(subpackage: str) -> list[pathlib.Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


FORBIDDEN = {
    "pld": ("dpjax.montecarlo", "dpjax.calibration", "dpjax.optimization"),
    "matrices": ("dpjax.montecarlo", "dpjax.calibration", "dpjax.optimization"),
    "montecarlo": ("dpjax.calibration", "dpjax.optimization"),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(layer):
    files = _files(layer)
    assert files, f"no modules found under dpjax/{layer}"
    offenders = []
    for path in files:
        for name in _module_level_imports(path):
            if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[layer]):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, offenders

