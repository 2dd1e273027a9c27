"""Opt-in persistent XLA compilation cache (cold-start time of the ``dpjax`` CLI).

A first call compiles one XLA program per grid shape (~1-3 s on a small CPU).  JAX can keep
compiled programs on disk; a later *process* then skips compilation for shapes it has seen.
This changes global JAX configuration, so the library never does it on its own: call
:func:`enable_persistent_cache` yourself, or set ``DPJAX_COMPILATION_CACHE=<dir>`` (or ``1``
for ``~/.cache/dpjax/xla``).  Every ``dpjax`` CLI subcommand enables it by default
(``dpjax.cli.main``; a CLI process owns its JAX configuration); ``DPJAX_COMPILATION_CACHE=0``
turns it off.
"""

from __future__ import annotations

import os
import pathlib

import jax

DEFAULT_DIR = pathlib.Path(os.path.expanduser("~")) / ".cache" / "dpjax" / "xla"


def enable_persistent_cache(path: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default ``~/.cache/dpjax/xla``).

    Returns the directory, or None when it could not be created (then nothing changes).
    """
    p = pathlib.Path(path) if path is not None else DEFAULT_DIR
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(p))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return p


def enable_from_environment(default_on: bool) -> pathlib.Path | None:
    """Apply ``DPJAX_COMPILATION_CACHE`` ("0" off, "1" default dir, else a directory)."""
    value = os.environ.get("DPJAX_COMPILATION_CACHE")
    if value is None:
        return enable_persistent_cache() if default_on else None
    if value.strip() in ("", "0", "false", "no", "off"):
        return None
    if value.strip() in ("1", "true", "yes", "on"):
        return enable_persistent_cache()
    return enable_persistent_cache(value)
