"""Foundation: validation, float64 scopes, XLA options, result records, I/O, progress (private).

Also the three helpers that keep JAX out of a process until something needs it: an eager query
runs on the host in NumPy (docs/design.md §2.5), and importing JAX costs more than answering
most queries.

* :func:`lazy_module` stands in for a module imported on first attribute access
  (``jax = lazy_module("jax")``).
* :func:`jax_loaded` says whether JAX is imported.  Until it is, no argument can be a JAX tracer
  or array, so entry points skip their tracer checks and float64 scopes.
* :func:`when_jax_imported` runs a function once JAX is imported (now, if it already is): how
  dpjax's dataclasses become pytrees without importing JAX themselves.
* :func:`lazy_exports` gives a package its names on first access (PEP 562), so importing it loads
  only what a name needs.
* :class:`deferred_x64` is the float64 scope of an entry point called before JAX is imported:
  if anything inside it uses JAX after all (through a :func:`lazy_module` or by importing it),
  ``jax.enable_x64(True)`` is entered for this thread at that first use and left with the scope,
  so a JAX computation inside never runs in float32.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Callable

__all__ = ["lazy_module", "lazy_exports", "jax_loaded", "when_jax_imported", "deferred_x64",
           "register_pytree_dataclass"]

_local = threading.local()


class deferred_x64:  # noqa: N801 - used as a context manager, like jax.enable_x64
    """Float64 JAX in this thread from the first JAX use inside the scope (see the module
    docstring).  If JAX is already imported, the scope is entered at once."""

    __slots__ = ("_cm",)

    def __init__(self):
        self._cm = None

    def __enter__(self):
        stack = _local.__dict__.setdefault("stack", [])
        stack.append(self)
        if jax_loaded():
            self._activate()
        return self

    def _activate(self) -> None:
        if self._cm is None:
            import jax

            self._cm = jax.enable_x64(True)
            self._cm.__enter__()

    def __exit__(self, *exc):
        _local.stack.pop()
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(*exc)
        return False


def _activate_deferred() -> None:
    """Enter the float64 scope of this thread's outermost pending :class:`deferred_x64`."""
    stack = getattr(_local, "stack", None)
    if stack and stack[0]._cm is None:
        stack[0]._activate()


class lazy_module:  # noqa: N801 - stands in for a module
    """A module imported on first attribute access (``lazy_module("jax.numpy").zeros(3)``)."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        if getattr(_local, "stack", None):
            _activate_deferred()
        return getattr(module, attr)

    def __repr__(self):
        return f"lazy_module({self._name!r})"


def lazy_exports(package: str, attrs: dict[str, str], submodules: tuple[str, ...] = ()):
    """``(__getattr__, __dir__)`` for ``package``'s ``__init__``: each name of ``attrs`` (name ->
    ``"module"``, or ``"module:attribute"`` where the defining name differs) and each sub-module of
    ``submodules`` is imported on first access and then cached in the package (later lookups skip
    ``__getattr__``).  ``package.X`` and ``from package import X`` work as for eager imports."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name):
        if name in attrs:
            module, _, attribute = attrs[name].partition(":")
            value = getattr(importlib.import_module(module), attribute or name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(attrs) | set(submodules))

    return __getattr__, __dir__


def jax_loaded() -> bool:
    """Whether JAX has been imported in this process (by the caller or by dpjax)."""
    return "jax" in sys.modules


_lock = threading.Lock()
_pending: list[Callable[[], None]] = []


def _run_pending() -> None:
    with _lock:
        todo = list(_pending)
        _pending.clear()
    for fn in todo:
        fn()


class _AfterJaxImport:
    """A ``sys.meta_path`` finder that lets the normal finders locate ``jax`` and runs the pending
    callbacks right after ``jax/__init__.py`` has executed (before ``import jax`` returns), so a
    caller's ``import jax; jax.jit(f)(dpjax_record)`` sees dpjax's pytrees registered."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "jax":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        inner = loader.exec_module

        def exec_module(module):
            try:
                inner(module)
            finally:
                try:
                    del loader.exec_module  # back to the class's method
                except AttributeError:
                    pass
            # Only after a successful import (a failed one leaves the finder for the next try).
            _uninstall()
            _run_pending()
            _activate_deferred()

        loader.exec_module = exec_module
        return spec


_finder = _AfterJaxImport()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def when_jax_imported(fn: Callable[[], None]) -> None:
    """Run ``fn()`` now if JAX is imported, else right after the process imports it."""
    if jax_loaded():
        fn()
        return
    with _lock:
        _pending.append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    if jax_loaded():  # imported by another thread meanwhile
        _uninstall()
        _run_pending()


#: The dataclasses registered by :func:`register_pytree_dataclass` (for the host tree functions of
#: :mod:`dpjax._base.ops`, which flatten them as JAX will, before JAX is imported).
PYTREE_DATACLASSES: set = set()


def register_pytree_dataclass(cls):
    """``jax.tree_util.register_dataclass`` applied once JAX is imported (a class decorator).

    As in JAX, fields with ``metadata={"static": True}`` are static; the others are leaves."""
    PYTREE_DATACLASSES.add(cls)

    def register():
        import jax

        jax.tree_util.register_dataclass(cls)

    when_jax_imported(register)
    return cls

