"""Opt-in persistent XLA compilation cache (cold-start time of the ``dpjax`` CLI).

A first call compiles one XLA program per grid shape (~1-3 s on a small CPU).  JAX can keep
compiled programs on disk; a later *process* then skips compilation for shapes it has seen.
This changes global JAX configuration, so the library never does it on its own: call
:func:`enable_persistent_cache` yourself, or set ``DPJAX_COMPILATION_CACHE=<dir>`` (or ``1``
for ``~/.cache/dpjax/xla``).  Every ``dpjax`` CLI subcommand enables it by default
(``dpjax.cli.main``; a CLI process owns its JAX configuration); ``DPJAX_COMPILATION_CACHE=0``
turns it off.

Tracing and lowering are not skipped by JAX's cache (it keys compiled programs by the lowered
module, so every process traces and lowers again: ~1.3 s of a ``dpjax epsilon`` run on 2 cores).
So while the persistent cache is on, the accountant's programs are also kept as serialized
:mod:`jax.export` artifacts (``<cache dir>/exported``; :func:`exported_call`): a later process
deserializes the lowered module instead of tracing the Python code, and its compile is a
persistent-cache hit.  The artifact's key covers the program's name, its static arguments, the
argument tree (mechanism classes and static fields included) and types, the JAX version, the
backend and a fingerprint of dpjax's source files, so an edited dpjax never runs a stale
program.  The sweep's bucket programs (``shard_map`` over the configuration axis, one device)
take the same path through :func:`exported_compiled`, which returns the compiled program itself
(the sweep compiles ahead, in background threads), and are listed in an index of their static
sizes (:func:`exported_index`) so that a later sweep can bucket its configurations onto them.
Host-side results that are pure functions of their key and of dpjax's sources (the sweep's grid
plans) are kept as pickles (:func:`store_object` / :func:`load_object`).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import pickle
import threading
from typing import Any, Callable

import jax

from dpjax import _io, _xla

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
    global _EXPORT_DIR
    _EXPORT_DIR = p / "exported"
    return p


def disable_exported_programs() -> None:
    """Stop using (and writing) serialized programs (:func:`exported_call` then calls directly)."""
    global _EXPORT_DIR
    _EXPORT_DIR = None


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


# ------------------------------------------------------------------------------------------
# Serialized (jax.export) programs: skip tracing and lowering in later processes.

_EXPORT_DIR: pathlib.Path | None = None
_LOADED: dict[str, Callable] = {}
_LOCK = threading.Lock()
_FINGERPRINT: str | None = None


def _source_fingerprint() -> str:
    """SHA-256 of every ``.py`` file of the dpjax package (names and contents), computed once."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        root = pathlib.Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def exported_call(name: str, fn: Callable, args: tuple, static: dict) -> Any:
    """``fn(*args, **static)`` (``fn`` jitted, ``static`` its static arguments), through a
    serialized :mod:`jax.export` artifact when the persistent cache is on (see the module
    docstring): the first process exports (traces and lowers once, as the call would), writes
    the artifact and runs it; later processes load it and run it.  The same lowered module either
    way, so the same compiled program and the same numbers.  Any failure (an unexportable
    argument, an unreadable file) falls back to the direct call."""
    export_dir = _EXPORT_DIR
    if export_dir is None:
        return fn(*args, **static)
    try:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = _artifact_key(name, repr(sorted(static.items())), treedef, leaves)
    except Exception:
        return fn(*args, **static)
    call = _LOADED.get(key)
    if call is not None:
        return call(*leaves)
    with _LOCK:
        call = _LOADED.get(key)
        if call is not None:
            return call(*leaves)
        exp = _load_or_export(export_dir, name, key, fn, leaves, treedef, static)
        if exp is None:
            return fn(*args, **static)
        call = _xla.jit(exp.call)  # a one-shot accountant program: dpjax._xla's compile options
        out = _first_call(call, exp, leaves)
        _LOADED[key] = call
        return out


def _artifact_key(name: str, static_key: str, treedef, leaves) -> str:
    """The artifact's key: program name, static arguments, argument tree and types, JAX version,
    backend, x64 mode and the dpjax source fingerprint (see the module docstring)."""
    parts = [name, static_key, str(treedef), repr([str(jax.typeof(leaf)) for leaf in leaves]), jax.__version__,
             jax.default_backend(), str(bool(jax.config.jax_enable_x64)), _source_fingerprint()]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:40]


def exported_compiled(name: str, jitted: Callable, args: tuple, static_key: str, meta: dict | None = None,
                      compile_options: dict | None = None) -> Callable | None:
    """``jitted`` (no static arguments left; ``static_key`` names what was baked into it) compiled
    for ``args``, through a serialized :mod:`jax.export` artifact when the persistent cache is on:
    a later process deserializes the lowered module (no tracing, no lowering) and its compile is
    a persistent-cache hit.  Returns a callable taking ``*args`` (same tree), or None when the
    cache is off or anything fails (the caller then compiles directly).  Single-process,
    single-device programs only (the artifact records the device count; the sweep's CLI runs).

    ``meta`` (JSON-able): recorded in ``name``'s index when the artifact is first written, so
    that later processes can list what exists (:func:`exported_index`).  ``compile_options``:
    XLA options of the compile (as ``lowered.compile(compile_options)``)."""
    export_dir = _EXPORT_DIR
    if export_dir is None or jax.process_count() != 1:
        return None
    try:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        if any(len(getattr(leaf, "sharding", None).device_set) != 1 for leaf in leaves
               if hasattr(leaf, "sharding")):
            return None
        key = _artifact_key(name, static_key, treedef, leaves)
        with _LOCK:
            loaded = (export_dir / f"{name}-{key}.jaxexport").exists()
            exp = _load_or_export(export_dir, name, key, jitted, leaves, treedef, {}, meta=meta)
        if exp is None:
            return None
        call = jax.jit(exp.call)
        lowered = _with_backend_hook(exp, lambda: call.lower(*leaves))
        # Outside the lock: the sweep compiles programs in parallel.
        compiled = lowered.compile(compile_options) if compile_options else lowered.compile()
    except Exception:
        return None

    def run(*a):
        return compiled(*jax.tree_util.tree_leaves(a))

    run.loaded = loaded   # deserialized from an earlier process's artifact (not traced here)
    return run


def _with_backend_hook(exp, fn):
    """``fn()`` (which lowers ``exp``), skipping the LAPACK-kernel initialization when ``exp`` has
    no LAPACK custom call (see :func:`_first_call`; private JAX: :mod:`dpjax._jax_private`)."""
    from dpjax import _jax_private

    try:
        skip = b"lapack" not in bytes(exp.mlir_module_serialized)
    except Exception:  # noqa: BLE001 - an Exported without its module: nothing to skip
        skip = False
    with _jax_private.backends_initialization_skipped(skip):
        return fn()


def _first_call(call, exp, leaves):
    """The first call (it lowers the exported module into a program).  Lowering a module
    exported for CPU initializes JAX's LAPACK kernels, which imports ``scipy.linalg`` (~0.3 s of
    a CLI run on 2 cores); a module with no LAPACK custom call does not need them, so then the
    initialization is skipped for this lowering (private JAX hook: if it moved, nothing is
    skipped)."""
    return _with_backend_hook(exp, lambda: call(*leaves))


def _object_path(name: str, key: str) -> pathlib.Path | None:
    export_dir = _EXPORT_DIR
    if export_dir is None:
        return None
    ident = "\x00".join([name, key, _source_fingerprint()])
    return export_dir / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:40]}.pickle"


def caching() -> bool:
    """Whether serialized programs and stored objects are in use (the persistent cache is on)."""
    return _EXPORT_DIR is not None


def load_object(name: str, key: str) -> Any:
    """The object :func:`store_object` stored under ``(name, key)`` with these dpjax sources, or
    None (persistent cache off, nothing stored, or unreadable).  For host-side results that are
    pure functions of their key (the sweep's grid plans), so that a later process skips
    recomputing them.  The cache directory is trusted like JAX's own compilation cache."""
    path = _object_path(name, key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:
        return None


def store_object(name: str, key: str, obj: Any) -> None:
    """Store ``obj`` (picklable) under ``(name, key)`` for later processes (persistent cache on;
    written atomically; a failure is ignored: the next process recomputes)."""
    path = _object_path(name, key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _io.atomic_write(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        pass


def _index_path(export_dir: pathlib.Path, name: str) -> pathlib.Path:
    """``name``'s index of artifacts for this JAX version, backend, x64 mode and dpjax source."""
    ident = "\x00".join([jax.__version__, jax.default_backend(), str(bool(jax.config.jax_enable_x64)),
                         _source_fingerprint()])
    return export_dir / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.index.jsonl"


def exported_index(name: str) -> list[dict]:
    """The ``meta`` records of ``name``'s serialized programs that this process could load (same
    JAX version, backend, x64 mode and dpjax sources; the artifact file present).  Empty when
    the persistent cache is off or nothing was recorded.  Unreadable lines are skipped."""
    export_dir = _EXPORT_DIR
    if export_dir is None:
        return []
    try:
        lines = _index_path(export_dir, name).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = _io.loads(line)
            if (export_dir / f"{name}-{rec['key']}.jaxexport").exists():
                out.append(rec["meta"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _load_or_export(export_dir, name, key, fn, leaves, treedef, static, meta=None):
    from jax import export

    path = export_dir / f"{name}-{key}.jaxexport"
    exp = None
    try:
        if path.exists():
            exp = export.deserialize(bytearray(path.read_bytes()))
    except Exception:
        exp = None
    if exp is None:
        try:
            def flat(*flat_args):
                return fn(*jax.tree_util.tree_unflatten(treedef, flat_args), **static)

            exp = export.export(jax.jit(flat))(*leaves)
        except Exception:
            return None
        try:
            export_dir.mkdir(parents=True, exist_ok=True)
            _io.atomic_write(path, exp.serialize())
            if meta is not None:
                # One line per artifact, appended (a concurrent writer's line stays whole: a single
                # small write to a file opened for appending).
                with open(_index_path(export_dir, name), "a") as f:
                    f.write(_io.dumps(dict(key=key, meta=meta)) + "\n")
        except Exception:  # read-only cache: run it anyway, this process only
            pass
    return exp
