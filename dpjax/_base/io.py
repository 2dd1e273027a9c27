"""Strict JSON and atomic writes: the one encoder, decoder and file writer of every dpjax record.

RFC 8259 JSON has no ``Infinity`` or ``NaN``, yet dpjax reports them (``epsilon = inf`` when
nothing is certified, ``nan`` when a quantity was not computed).  Every file and ``--json`` line
that dpjax writes spells them as the strings ``"inf"``, ``"-inf"`` and ``"nan"``, and every reader
turns those strings back into floats:

* :func:`strict_json_data` / :func:`dumps` -- plain data (NumPy / JAX arrays and scalars as lists
  and Python numbers, non-finite floats as strings) and its JSON text;
* :func:`restore_nonfinite` / :func:`loads` -- the inverse;
* :func:`atomic_write` -- a file that appears complete or not at all (a kill mid-write leaves the
  previous file): temp file beside the target, ``fsync``, ``os.replace``; a new file gets the
  permissions of the user's umask, a replaced one keeps its own.

Round trip: ``loads(dumps(x)) == x`` for plain data with finite floats, and non-finite floats
come back as the same floats (``nan`` compares unequal to itself, as always).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from typing import Any

__all__ = ["NONFINITE_STRINGS", "strict_json_data", "restore_nonfinite", "dumps", "loads", "write_temp",
           "atomic_write"]

#: The strings that stand for non-finite floats in dpjax's JSON (written: the first three;
#: read: all, so that ``Infinity`` spelled as a string by another writer is understood too).
NONFINITE_STRINGS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan,
                     "Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def strict_json_data(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``"inf"`` / ``"-inf"`` / ``"nan"``.

    Dicts and lists are rebuilt (tuples become lists); NumPy / JAX arrays and scalars become
    (nested) lists and Python numbers first (``tolist``); everything else passes unchanged.
    """
    if isinstance(value, dict):
        return {k: strict_json_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json_data(v) for v in value]
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "tolist"):  # NumPy / JAX arrays and scalars
        return strict_json_data(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def restore_nonfinite(value: Any) -> Any:
    """The inverse of :func:`strict_json_data` on parsed JSON: the strings of
    :data:`NONFINITE_STRINGS` become floats again, in dicts and lists at any depth."""
    if isinstance(value, str):
        return NONFINITE_STRINGS.get(value, value)
    if isinstance(value, dict):
        return {k: restore_nonfinite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_nonfinite(v) for v in value]
    return value


def dumps(value: Any, **json_kwargs) -> str:
    """Strict JSON text of ``value`` (:func:`strict_json_data`; ``json_kwargs`` as for ``json.dumps``)."""
    return json.dumps(strict_json_data(value), allow_nan=False, **json_kwargs)


def loads(text: str | bytes) -> Any:
    """Parsed JSON with the non-finite strings restored to floats (:func:`restore_nonfinite`)."""
    return restore_nonfinite(json.loads(text))


def _umask() -> int:
    """The process's umask, read without changing it where Linux reports it (``/proc``); else
    by the set-and-restore of ``os.umask``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: str) -> int:
    """The permission bits a file written at ``path`` gets: those of the file it replaces, else
    what ``open(path, "w")`` would give a new file (``0o666`` less the umask).  ``mkstemp``
    creates its file ``0o600`` (private to the owner), which is right for a temp file but not
    for a result the user shares."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def write_temp(path: str | os.PathLike, data: str | bytes) -> str:
    """A new temp file beside ``path`` (same directory, hence same file system) holding ``data``
    (text as UTF-8, or bytes), flushed and ``fsync``-ed, with the permissions ``path`` should
    have (:func:`_mode_for`); returns its path.  The caller renames or links it into place and
    removes it if that fails."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically.

    A temp file in the target's directory (``os.replace`` is atomic only within one file
    system) is written, flushed and ``fsync``-ed (:func:`write_temp`), then renamed over
    ``path``: readers, and a run killed at any instant, see the old file or the new one, never a
    partial one.  The temp file is removed if anything fails.
    """
    tmp = write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
