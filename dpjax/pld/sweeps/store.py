"""Incremental, resumable storage of sweep rows (CSV + JSON lines, Parquet at the end).

A sweep of thousands of configurations may be killed (out of time, ``kill -9``, a node lost).
:class:`SweepStore` makes every finished row durable as soon as it is computed and lets the next
run pick up where the last one stopped:

* the **journal** is the JSON-lines file (``<out stem>.jsonl``): one object per row, appended,
  flushed and ``fsync``-ed after every chunk.  A kill can leave at most one partial last line;
  on resume it is cut off (that row is recomputed, not lost) and rows are keyed by their
  ``index``, so a row recorded twice counts once;
* the **CSV** (``out``) is appended alongside for people watching a long sweep; on resume it is
  rebuilt from the journal (it may end in a partial line too);
* at the end both are rewritten atomically (:func:`dpjax._base.io.atomic_write`) in input order, one
  row per configuration, and ``<out stem>.parquet`` is written if ``pyarrow`` is installed.

Without ``resume`` an existing file is overwritten.
"""

from __future__ import annotations

import csv
import io
import math
import os
import pathlib
from typing import Iterable, Sequence

from dpjax._base import io as _io

__all__ = ["SweepStore", "read_rows"]


def _paths(out) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    out = pathlib.Path(out)
    if out.suffix == ".jsonl":
        return out.with_suffix(".csv"), out, out.with_suffix(".parquet")
    return out, out.with_suffix(".jsonl"), out.with_suffix(".parquet")


def read_rows(path) -> dict[int, dict]:
    """Rows of a journal (``.jsonl``) keyed by ``index``; a partial last line is ignored."""
    rows: dict[int, dict] = {}
    path = pathlib.Path(path)
    if not path.exists():
        return rows
    with open(path, "rb") as f:
        data = f.read()
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = _io.loads(line)
        except ValueError:  # a partial line from a killed writer
            continue
        if isinstance(obj, dict) and "index" in obj:
            rows[int(obj["index"])] = obj
    return rows


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else ("-inf" if v < 0 else "nan"))
    return v


class SweepStore:
    """Row storage for one sweep output path (see the module docstring).

    Args:
      out: the CSV path (``.jsonl`` and ``.parquet`` siblings are derived from it).
      fields: column order.
      resume: keep and return the rows already recorded (``rows``) instead of starting over.
    """

    def __init__(self, out, fields: Sequence[str], *, resume: bool):
        self.csv_path, self.jsonl_path, self.parquet_path = _paths(out)
        self.fields = tuple(fields)
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: dict[int, dict] = read_rows(self.jsonl_path) if resume else {}
        # Start from a clean journal holding exactly the recovered rows (drops any partial line)
        # and a CSV rebuilt from it.
        self._rewrite(sorted(self.rows.values(), key=lambda r: r["index"]))
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self._csv = open(self.csv_path, "a", encoding="utf-8", newline="")

    def _csv_text(self, rows: Iterable[dict], header: bool) -> str:
        buf = io.StringIO()
        w = csv.writer(buf)
        if header:
            w.writerow(self.fields)
        for r in rows:
            w.writerow([_csv_value(r.get(f)) for f in self.fields])
        return buf.getvalue()

    def _jsonl_text(self, rows: Iterable[dict]) -> str:
        return "".join(_io.dumps({f: r.get(f) for f in self.fields}) + "\n" for r in rows)

    def _rewrite(self, rows: list[dict]) -> None:
        _io.atomic_write(self.jsonl_path, self._jsonl_text(rows))
        _io.atomic_write(self.csv_path, self._csv_text(rows, header=True))

    def append(self, rows: list[dict]) -> None:
        """Record finished rows durably (journal first, then CSV)."""
        if not rows:
            return
        self._jsonl.write(self._jsonl_text(rows))
        self._jsonl.flush()
        os.fsync(self._jsonl.fileno())
        self._csv.write(self._csv_text(rows, header=False))
        self._csv.flush()
        for r in rows:
            self.rows[int(r["index"])] = r

    def finalize(self, rows: Sequence[dict]) -> None:
        """Rewrite CSV and journal in input order (one row per configuration); Parquet if pyarrow."""
        self._jsonl.close()
        self._csv.close()
        rows = list(rows)
        self._rewrite(rows)
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return
        cols = {f: [r.get(f) for r in rows] for f in self.fields}
        pq.write_table(pa.table(cols), str(self.parquet_path))
