"""dpjax's program store: compiled programs kept on disk, for library users and the CLI alike.

One-configuration queries compile nothing (the PLD program runs on the host, :mod:`dpjax.pld.grid.program`).
What dpjax does compile -- a sweep's bucket programs, the derivative program of traced calls, the
Monte Carlo and RDP programs -- it keeps in this store: the first process compiles a program and
writes its serialized executable (:mod:`jax.experimental.serialize_executable`); every later
process loads it instead of tracing, lowering and compiling (milliseconds instead of seconds).

**On by default**, in ``$XDG_CACHE_HOME/dpjax/programs`` (``~/.cache/dpjax/programs``).
``DPJAX_COMPILATION_CACHE`` means the same in Python and in the CLI: ``0`` (or ``off``, ``false``,
``no``) turns the store off, ``1`` selects the default directory, any other value is the
directory to use.  :func:`enable` / :func:`disable` do the same from Python.

Why not JAX's own persistent compilation cache: turning it on is a global setting
(``jax_compilation_cache_dir``) that would change how the *caller's* programs are cached, which a
library must not do behind its user's back; and it still traces and lowers every program in every
process (JAX keys it by the lowered module), which is most of a program's cost here.  The store
touches no JAX setting and skips tracing too.  (The CLI, which owns its process, also turns on
JAX's cache for the programs it does not build through the store.)

Keys cover the program's name, its static key, the argument tree and types, the JAX version, the
backend and device kind, the machine and a fingerprint of dpjax's source files, so an edited
dpjax or another machine never runs a stale executable; an unreadable or incompatible entry is
recompiled and overwritten.  Host-side results that are pure functions of their key and of
dpjax's sources (a sweep's grid plans) are kept beside the programs as pickles
(:func:`store_object` / :func:`load_object`).  The store directory is trusted like JAX's own
compilation cache.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import pickle
import platform
import threading
from typing import Any, Callable

from dpjax._base import io as _io

__all__ = ["DEFAULT_DIR", "ENVIRONMENT_VARIABLE", "enable", "disable", "store_dir", "caching", "compiled",
           "call", "program_index", "store_object", "load_object", "enable_persistent_cache",
           "enable_from_environment"]

ENVIRONMENT_VARIABLE = "DPJAX_COMPILATION_CACHE"
DEFAULT_DIR = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or (pathlib.Path.home() / ".cache")) / "dpjax" / "programs"
_OFF = ("0", "off", "false", "no")

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"dir": None, "resolved": False}
_MEMORY: dict[str, Callable] = {}
_FINGERPRINT: list[str] = []


def _from_environment() -> pathlib.Path | None:
    value = os.environ.get(ENVIRONMENT_VARIABLE)
    if value is None or value.strip().lower() in ("", "1", "on", "true", "yes"):
        return DEFAULT_DIR
    if value.strip().lower() in _OFF:
        return None
    return pathlib.Path(value).expanduser()


def store_dir() -> pathlib.Path | None:
    """The store's directory, or None when it is off (resolved from ``DPJAX_COMPILATION_CACHE``
    on first use unless :func:`enable` / :func:`disable` was called)."""
    with _LOCK:
        if not _STATE["resolved"]:
            _STATE["dir"], _STATE["resolved"] = _from_environment(), True
        return _STATE["dir"]


def enable(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Keep compiled programs in ``path`` (default :data:`DEFAULT_DIR`)."""
    p = pathlib.Path(path).expanduser() if path is not None else DEFAULT_DIR
    with _LOCK:
        _STATE["dir"], _STATE["resolved"] = p, True
    return p


def disable() -> None:
    """Compile every program in this process and keep nothing on disk."""
    with _LOCK:
        _STATE["dir"], _STATE["resolved"] = None, True


def caching() -> bool:
    """Whether the store is on."""
    return store_dir() is not None


def _source_fingerprint() -> str:
    """SHA-256 of every ``.py`` file of the dpjax package (names and contents), computed once."""
    if not _FINGERPRINT:
        root = pathlib.Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
        _FINGERPRINT.append(h.hexdigest())
    return _FINGERPRINT[0]


def _machine() -> str:
    """What an executable depends on beyond JAX: the backend, its devices and this machine's CPU."""
    import jax

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    devices = jax.devices()
    return "\x00".join([jax.__version__, jax.default_backend(), str(len(devices)), devices[0].device_kind,
                        platform.machine(), hashlib.sha256(flags.encode()).hexdigest()[:16]])


def _key(name: str, static_key: str, leaves, treedef) -> str:
    import jax

    parts = [name, static_key, str(treedef), repr([str(jax.typeof(x)) for x in leaves]),
             str(bool(jax.config.jax_enable_x64)), _machine(), _source_fingerprint()]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:40]


def compiled(name: str, fn: Callable, args: tuple, static_key: str = "", *, static: dict | None = None,
             meta: dict | None = None, compile_options: dict | None = None) -> Callable:
    """``fn`` (jitted; ``static`` its static keyword arguments, ``static_key`` a string naming them
    and anything else baked into ``fn``) compiled for ``args``: from this process's memory, else
    the store (a serialized executable of an earlier process), else compiled here and written to
    the store.  Returns a callable taking ``*args`` (same tree).  ``meta`` (JSON-able) is recorded
    in ``name``'s index when the program is first stored (:func:`program_index`).  The attribute
    ``loaded`` of the returned callable says whether it came from the store."""
    import jax

    static = static or {}
    leaves, treedef = jax.tree_util.tree_flatten(args)
    key = _key(name, static_key + repr(sorted(static.items())), leaves, treedef)
    run = _MEMORY.get(key)
    if run is not None:
        return run
    directory = store_dir()
    exe, loaded = None, False
    path = directory / f"{name}-{key}.xla" if directory is not None else None
    if path is not None and path.exists():
        exe = _load(path)
        loaded = exe is not None
    if exe is None:
        lowered = fn.lower(*args, **static)
        exe = lowered.compile(compile_options) if compile_options else lowered.compile()
        if path is not None:
            _store(path, exe, directory, name, key, meta)

    def run(*a):
        return exe(*a)

    run.loaded = loaded
    with _LOCK:
        _MEMORY.setdefault(key, run)
    return _MEMORY[key]


def call(name: str, fn: Callable, args: tuple, static: dict) -> Any:
    """``fn(*args, **static)`` through :func:`compiled` (the same program, the same numbers)."""
    return compiled(name, fn, args, static=static)(*args)


def _load(path: pathlib.Path):
    from jax.experimental import serialize_executable

    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
        return serialize_executable.deserialize_and_load(*payload)
    except Exception:  # unreadable or incompatible: recompiled (and overwritten) by the caller
        return None


def _store(path: pathlib.Path, exe, directory: pathlib.Path, name: str, key: str, meta: dict | None) -> None:
    from jax.experimental import serialize_executable

    try:
        payload = serialize_executable.serialize(exe)
        directory.mkdir(parents=True, exist_ok=True)
        _io.atomic_write(path, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        if meta is not None:
            # One line per program, appended (a concurrent writer's line stays whole: a single small
            # write to a file opened for appending).
            with open(_index_path(directory, name), "a") as f:
                f.write(_io.dumps(dict(key=key, meta=meta)) + "\n")
    except Exception:  # a read-only or full disk: this process keeps its compiled program
        pass


def _index_path(directory: pathlib.Path, name: str) -> pathlib.Path:
    ident = "\x00".join([_machine(), _source_fingerprint()])
    return directory / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.index.jsonl"


def program_index(name: str) -> list[dict]:
    """The ``meta`` records of ``name``'s stored programs that this process could load (same
    machine, JAX and dpjax sources; the program file present).  Empty when the store is off."""
    directory = store_dir()
    if directory is None:
        return []
    try:
        lines = _index_path(directory, name).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = _io.loads(line)
            if (directory / f"{name}-{rec['key']}.xla").exists():
                out.append(rec["meta"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _object_path(name: str, key: str) -> pathlib.Path | None:
    directory = store_dir()
    if directory is None:
        return None
    ident = "\x00".join([name, key, _source_fingerprint()])
    return directory / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:40]}.pickle"


def load_object(name: str, key: str) -> Any:
    """The object :func:`store_object` stored under ``(name, key)`` with these dpjax sources, or
    None (store off, nothing stored, or unreadable)."""
    path = _object_path(name, key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:
        return None


def store_object(name: str, key: str, obj: Any) -> None:
    """Store ``obj`` (picklable) under ``(name, key)`` for later processes (store on; written
    atomically; a failure is ignored: the next process recomputes)."""
    path = _object_path(name, key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _io.atomic_write(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        pass


# ------------------------------------------------------------------------------------------
# The CLI's process-wide setting


def enable_persistent_cache(path: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (a process-wide JAX setting: the
    CLI, which owns its process, calls it for the programs it does not build through the store;
    a library user may call it for their own).  Returns the directory, or None when it could not
    be created.  Before JAX is imported the setting waits for its import (a one-shot query that
    runs on the host never imports JAX)."""
    from dpjax._base import when_jax_imported

    p = pathlib.Path(path) if path is not None else DEFAULT_DIR / "xla"
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None

    def apply():
        import jax

        jax.config.update("jax_compilation_cache_dir", str(p))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    when_jax_imported(apply)
    return p


def enable_from_environment(default_on: bool = True) -> pathlib.Path | None:
    """The CLI's setting: the store as ``DPJAX_COMPILATION_CACHE`` says (as in Python), and, where
    the store is on, JAX's own persistent cache inside it (``<store>/xla``)."""
    directory = store_dir() if default_on or ENVIRONMENT_VARIABLE in os.environ else None
    if directory is None:
        disable()
        return None
    return enable_persistent_cache(directory / "xla")
