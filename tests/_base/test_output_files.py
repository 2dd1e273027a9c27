"""Files dpjax writes: ``--out`` follows the extension or refuses it before any work, and files
get the permissions any program of the user would give them (the umask; a replaced file keeps
its own), not ``mkstemp``'s owner-only ``0o600``."""

from __future__ import annotations

import os
import stat

import pytest

from dpjax._base import io as _io
from dpjax.cli.main import main

EPSILON = ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "100", "--delta", "1e-5",
           "--quiet"]


@pytest.mark.parametrize("argv,name,formats", [
    (EPSILON, "e.txt", ".json (the JSON object --json prints) or .csv (a CSV table)"),
    (EPSILON, "e", ".json (the JSON object --json prints) or .csv (a CSV table)"),
    (["optimize", "--example", "--quiet"], "ex.csv", ".json (the loadable result"),
    (["sweep", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "100", "--delta", "1e-5", "--quiet"],
     "s.parquet", ".csv (the CSV table, written as rows are computed) or .json"),
])
def test_out_with_another_extension_is_refused_before_any_work(tmp_path, capsys, argv, name, formats):
    path = tmp_path / name
    assert main(argv + ["--out", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and "--out: FILE must end in " + formats in lines[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,head", [("e.json", "{"), ("e.csv", "epsilon,")])
def test_out_writes_the_format_its_extension_names(tmp_path, capsys, name, head):
    assert main(EPSILON + ["--out", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text().startswith(head)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask,want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umask(tmp_path, umask, want):
    old = os.umask(umask)
    try:
        _io.atomic_write(tmp_path / "a.json", "{}")
        assert main(EPSILON + ["--out", str(tmp_path / "cli.json")]) == 0
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.json") == want and _mode(tmp_path / "cli.json") == want


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    old = os.umask(0o077)
    try:
        _io.atomic_write(path, "new")
    finally:
        os.umask(old)
    assert path.read_text() == "new" and _mode(path) == 0o640


def test_the_optimize_default_file_gets_the_umask(tmp_path, monkeypatch):
    """``write_new`` (no --out: a new name, never replacing a file) links the same temp file."""
    from dpjax.cli.optimize import write_new

    old = os.umask(0o022)
    try:
        written = write_new(str(tmp_path / "r.json"), "{}")
    finally:
        os.umask(old)
    assert _mode(written) == 0o644
