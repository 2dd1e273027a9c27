"""The repository speaks to its users: no development-process vocabulary in what they read.

Code, tests, docs, benchmark scripts, examples, notebooks and the README are read by people who
use dpjax, not by the people who built it.  Tracker numbers, checklist labels and notes addressed
to maintainers mean nothing to them, so this test scans those files (``.py``, ``.md``, ``.ipynb``;
``docs/benchmarks.md`` is generated from ``benchmarks/results/*.json`` and skipped) and fails
naming every ``file:line`` that uses such words.  Measurements belong in
``benchmarks/results/*.json``; a comment says why, citing the paper and equation.

The patterns are assembled from pieces so that this file does not match them itself.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

_TRACKER = "iss" + "ue"
_SHOW = "sh" + "ow"
_NOTE = "no" + "te"
_LEAD = "le" + "ad"

#: Case-insensitive patterns of development-process vocabulary.
FORBIDDEN = [
    re.compile(r"\b" + _TRACKER + r"s? \d+\b", re.IGNORECASE),   # tracker numbers
    re.compile(r"(?<![a-z])" + _TRACKER + r"_?\d+", re.IGNORECASE),  # ... inside identifiers
    re.compile(r"(?<![a-z])the_" + _TRACKER + r"_", re.IGNORECASE),      # "the tracker's" cases or keys, in a name
    re.compile(r"must[- ]" + _SHOW, re.IGNORECASE),               # checklist labels
    re.compile(r"closing " + _NOTE, re.IGNORECASE),               # notes to maintainers
    re.compile(r"\bthe " + _LEAD + r"\b", re.IGNORECASE),          # addressing maintainers
]

SUFFIXES = {".py", ".md", ".ipynb"}
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}
SKIP_FILES = {pathlib.Path("docs/benchmarks.md")}   # generated from benchmarks/results/*.json


def _walk(top: pathlib.Path, recursive: bool = True) -> list[pathlib.Path]:
    if not top.is_dir():
        return []
    found = top.rglob("*") if recursive else top.iterdir()
    return sorted(
        p for p in found
        if p.is_file() and p.suffix in SUFFIXES and not SKIP_DIRS.intersection(p.parts)
        and p.relative_to(ROOT) not in SKIP_FILES)


#: The scanned areas; the README stands apart so that its failures are reported on their own.
AREAS = {
    "dpjax": lambda: _walk(ROOT / "dpjax"),
    "tests": lambda: _walk(ROOT / "tests"),
    "docs": lambda: _walk(ROOT / "docs"),
    "benchmarks": lambda: _walk(ROOT / "benchmarks", recursive=False),   # not results/
    "examples": lambda: _walk(ROOT / "examples"),
    "notebooks": lambda: _walk(ROOT / "notebooks"),
    "README": lambda: [p for p in [ROOT / "README.md"] if p.is_file()],
}


def offending_lines(paths) -> list[str]:
    """``file:line: text`` for every line of ``paths`` that matches a forbidden pattern."""
    hits = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        if not any(pattern.search(text) for pattern in FORBIDDEN):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if any(pattern.search(line) for pattern in FORBIDDEN):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return hits


@pytest.mark.parametrize("area", sorted(AREAS))
def test_no_process_vocabulary(area):
    paths = AREAS[area]()
    hits = offending_lines(paths)
    assert not hits, (f"{len(hits)} line(s) in {area} speak about the development process "
                      "rather than to users; rewrite them in plain words:\n" + "\n".join(hits))


def test_scan_covers_the_sources():
    """The scan is not vacuous: it reads this package, this file and the notebooks' generator."""
    scanned = {p.relative_to(ROOT).as_posix() for area in AREAS.values() for p in area()}
    assert "dpjax/__init__.py" in scanned
    assert "tests/test_user_facing_text.py" in scanned
    assert "notebooks/make_notebooks.py" in scanned
    assert "docs/benchmarks.md" not in scanned


@pytest.mark.parametrize("text, bad", [
    ("fixed in " + _TRACKER.capitalize() + " 14, item 6", True),
    ("see " + _TRACKER + "s 3", True),
    ("Must-" + _SHOW + " 2: agreement", True),
    ("the must " + _SHOW + " bound", True),
    ("as in the closing " + _NOTE, True),
    ("The " + _LEAD + " re-measures", True),
    ("def test_the_" + _TRACKER + "_cases_are_rejected", True),
    ("no 0^0 " + _TRACKER + " since theta > 0", False),
    ("the " + _TRACKER + " with q = 1 is the closed form", False),
    ("the " + _LEAD + "ing coefficient", False),
    ("within 0.3% of dp_accounting", False),
])
def test_patterns(text, bad):
    assert any(pattern.search(text) for pattern in FORBIDDEN) is bad
