"""Shared test fixtures: the pinned reference values from ../shared/reference/."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from hypothesis import settings

# Hypothesis: deterministic and bounded, so the default suite stays within CI's budget.
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

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
