"""Shared test fixtures: the pinned reference values from ../shared/reference/."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import pytest

from hypothesis import settings

# Hypothesis: deterministic and bounded, so the default suite stays within CI's budget.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One compilation cache per test session.  JAX's persistent compilation cache in a directory of
# the session, set in the environment before pytest-xdist starts its workers, so the workers and
# every child process a test starts share each compiled program instead of compiling it again
# (JAX reads the JAX_* variables when it is imported; nothing here imports it).  Loaded programs
# are the compiled ones, so no value changes; tests of dpjax's own program store set
# DPJAX_COMPILATION_CACHE themselves.
_SESSION_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="dpjax-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _SESSION_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


def pytest_unconfigure(config):
    # The process that made the directory removes it (the xdist controller, or a plain run).
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


_REFERENCE_CANDIDATES = [
    pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "reference.json",
    pathlib.Path(__file__).resolve().parents[2] / "shared" / "reference" / "reference.json",
]


def _load_reference():
    for path in _REFERENCE_CANDIDATES:
        if path.exists():
            with open(path) as f:
                return json.load(f)
    raise FileNotFoundError("reference.json not found in " + ", ".join(map(str, _REFERENCE_CANDIDATES)))


@pytest.fixture(scope="session")
def reference_cases() -> dict:
    """Reference cases keyed by id (``"A1"``, ``"B3"``, ...).  "inf" strings become float('inf')."""
    data = _load_reference()
    out = {}
    for case in data["cases"]:
        value = case["value"]
        if value == "inf":
            case = dict(case, value=float("inf"))
        out[case["id"]] = case
    return out


@pytest.fixture(autouse=True)
def _no_persistent_compilation_cache(monkeypatch):
    # Every CLI subcommand turns on JAX's persistent compilation cache (a global setting) unless
    # DPJAX_COMPILATION_CACHE=0; tests calling dpjax.cli.main.main in-process must not change
    # the configuration of the rest of the session.
    monkeypatch.setenv("DPJAX_COMPILATION_CACHE", "0")


#: Memory mappings above which a test module's end drops JAX's compiled programs.  Each XLA:CPU
#: executable holds ~190 mappings and Linux allows a process 65,530 (``vm.max_map_count``); a
#: single test worker that runs the whole suite compiles thousands of programs, and its next
#: compile past the limit fails inside LLVM with a segmentation fault.  (dpjax bounds its own
#: accountant programs, dpjax._base.xla.MAX_LIVE_PROGRAMS; the tests compile many other programs.)
_MAPPINGS_LIMIT = 30000


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:  # not Linux: no such limit to keep under
        return 0


@pytest.fixture(scope="module", autouse=True)
def _bounded_memory_mappings():
    yield
    if _mappings() > _MAPPINGS_LIMIT:
        import jax

        jax.clear_caches()
