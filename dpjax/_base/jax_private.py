"""Every use of private JAX API in dpjax, in one place, each with a fallback on public API.

JAX may rename or remove anything under ``jax._src`` in any release.  dpjax reads private JAX
in exactly the functions below; each looks the private name up when called and, when it is
missing, falls back to behaviour that gives the same numbers (at worst a slower compile or a
less specific error message).  ``tests/_base/test_jax_private.py`` deletes each private name and checks
the fallback.

=====================================  ==========================================  =======================================
private name                           used for                                    fallback when it is missing
=====================================  ==========================================  =======================================
``jax._src.core.unsafe_am_i_under_a_   the float64 contract (:mod:`dpjax._base.x64`):   the tracers themselves: a staging
jit``                                  raise a clear ValueError when a float64     (jaxpr) tracer under the caller's
                                       call is staged into a float32 ``jit``       grad/vmap tracers means ``jit``
``jax._src.core.trace_state_clean``    :mod:`dpjax._base.xla`: pass XLA:CPU compile     never pass them: JAX's default compile
                                       options only to top-level calls             options, the same program's numbers
``PjitFunction._cache_size``           tests only: count a jitted function's       raise (a test that counts compiles
                                       compiled programs                           cannot run without it)
=====================================  ==========================================  =======================================
"""

from __future__ import annotations

import importlib
from typing import Any

import jax


#: The private names, as (module, attribute).  Looked up at each use, never cached, so that a
#: JAX without one takes the fallback (the tests point these at a missing name to check it).
UNDER_JIT = ("jax._src.core", "unsafe_am_i_under_a_jit")
TRACE_STATE_CLEAN = ("jax._src.core", "trace_state_clean")


def _private(where: tuple[str, str]) -> Any:
    """The private object ``where`` names, or None when this JAX does not have it."""
    module, name = where
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _staging_tracer(x: Any) -> bool:
    """Public-API fallback of :func:`under_jit`: ``x`` is, or wraps (through grad's ``primal`` /
    vmap's ``val``), a tracer of a staged program (a jaxpr tracer: ``jit``, ``scan``, ``cond``)."""
    seen = 0
    while isinstance(x, jax.core.Tracer) and seen < 64:
        if "JaxprTracer" in type(x).__name__:
            return True
        x = getattr(x, "primal", getattr(x, "val", None))
        seen += 1
    return False


def under_jit(leaves: list) -> bool:
    """Whether the current call is being traced into a staged program (``jit``, ``scan``,
    ``cond``, ...), not only under ``grad`` / ``vmap``; ``leaves`` are the call's arguments."""
    fn = _private(UNDER_JIT)
    if fn is not None:
        try:
            return bool(fn())
        except Exception:  # noqa: BLE001 - a changed signature: use the fallback
            pass
    return any(_staging_tracer(leaf) for leaf in leaves)


def top_level_trace() -> bool:
    """Whether no JAX transformation is being traced (a top-level call).  Without the private
    helper: False, so the caller uses JAX's default compile options (the same numbers)."""
    fn = _private(TRACE_STATE_CLEAN)
    if fn is None:
        return False
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001
        return False


def jit_cache_size(jitted: Any) -> int:
    """Number of programs compiled for ``jitted`` (a ``jax.jit`` function): what
    :func:`dpjax._base.xla.jit` bounds its live programs by, and what tests count compiles with.
    ``NotImplementedError`` on a JAX without the private count (the bound is then off)."""
    fn = getattr(jitted, "_cache_size", None)
    if fn is None:
        raise NotImplementedError("this JAX does not expose a jitted function's compiled-program count")
    return int(fn())
