"""Run metadata for every benchmark result: the machine, the date and the command.

Every script in ``benchmarks/`` that writes ``benchmarks/results/*.json`` adds a ``"meta"``
record made here, so that ``docs/benchmarks.md`` (written by ``benchmarks/render_docs.py``)
can print each table with the machine it ran on, when, and the exact command that reproduces
it::

    from _meta import run_metadata

    out = {"benchmark": "bench_foo", "rows": rows, "meta": run_metadata(__file__, argv)}

A file that merges parts from separate runs keeps one record per part.

The record holds only what the process can observe (nothing is typed in by hand):

* ``date``: UTC time the result was written, ISO 8601 to the second;
* ``command``: ``python benchmarks/<script> <arguments>``, the arguments as parsed by the script
  (``sys.argv[1:]`` unless the script was called with an explicit list);
* ``machine``: platform, CPU model and count, Python, the versions of jax / jaxlib / numpy /
  dpjax and of the anchor libraries that are installed, the JAX backend and devices when JAX is
  already imported, and the load average (the machine may be shared: compare a row only with
  the anchor measured in the same run);
* ``commit``: the git commit of the working tree (with ``+dirty`` when it has local changes),
  when git can tell.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import shlex
import subprocess
import sys
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Distributions whose versions are recorded when installed (the anchors included).
PACKAGES = ("jax", "jaxlib", "numpy", "scipy", "optax", "dpjax", "dp-accounting", "jax-privacy",
            "prv-accountant")


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _jax_runtime() -> dict:
    """Backend and devices, only if the script already imported JAX (never imported here: a
    parent process that times fresh children must not pay for it)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    try:
        return {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
    except Exception:  # noqa: BLE001 - metadata is best-effort
        return {}


def _commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    """What this process can observe of the machine (see the module docstring)."""
    out = {"platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "versions": _versions(), **_jax_runtime()}
    try:
        out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return out


def command(script: str, argv: list[str] | None = None) -> str:
    """``python benchmarks/<script> <args>`` for ``script`` (a path, e.g. ``__file__``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    path = pathlib.Path(script).resolve()
    try:
        shown = path.relative_to(ROOT).as_posix()
    except ValueError:
        shown = path.name
    return shlex.join(["python", shown, *map(str, args)])


def run_metadata(script: str, argv: list[str] | None = None) -> dict:
    """The ``"meta"`` record of one run of ``script`` with arguments ``argv``."""
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {"date": date.isoformat().replace("+00:00", "Z"), "command": command(script, argv),
            "machine": machine(), "commit": _commit()}
