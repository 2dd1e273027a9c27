"""IEEE arithmetic for host numerics: subnormal numbers kept, not flushed to zero.

XLA:CPU runs its programs with the processor's flush-to-zero and denormals-are-zero modes on, and
a ``jax.pure_callback`` runs its Python function on that thread with those modes still set.  A
thread started there inherits them for good (a new thread copies its creator's floating-point
environment).  NumPy then rounds every result below the smallest normal double (2.2e-308) to 0
and reads every such input as 0.  For accounting that is unsound: Gaussian noise gives a positive
delta at every epsilon, and a certified delta of 5e-324 read back as 0 claims pure DP.

:func:`ieee_arithmetic` is the scope every public numeric entry point and every host callback runs
in: where the modes are set, it switches to the default environment (IEEE, round to nearest, no
flushing) and restores the caller's on exit.  :func:`reset_thread` is the initializer of dpjax's
own worker threads.  Where the modes are off (the usual case) both cost one NumPy probe.

Switching uses the C library's ``fegetenv``/``fesetenv`` through :mod:`ctypes` (glibc and musl on
Linux, macOS).  Elsewhere nothing is switched (:func:`can_switch` is False).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys

import numpy as np

__all__ = ["flushes_subnormals", "ieee_arithmetic", "reset_thread", "can_switch"]

_SUBNORMAL = np.array([np.nextafter(0.0, 1.0)])
_ONE = np.array([1.0])
# Room for any platform's fenv_t (32 bytes on x86-64 glibc, 8 on aarch64, 16 on macOS arm64).
_ENV_BYTES = 256


def flushes_subnormals() -> bool:
    """Whether this thread's arithmetic flushes subnormal doubles to zero (FTZ or DAZ set)."""
    return bool(np.multiply(_SUBNORMAL, _ONE)[0] == 0.0)


@functools.lru_cache(maxsize=1)
def _c_library():
    """``(library, FE_DFL_ENV pointer)``, or ``(None, None)`` where neither is known (loaded on
    first need: only a flushing thread needs it)."""
    try:
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL("libm.so.6")
            except OSError:
                lib = ctypes.CDLL(None)  # the interpreter's own symbols (CPython links libm)
            default = ctypes.c_void_p(-1)  # FE_DFL_ENV is ((const fenv_t *) -1) in glibc and musl
        elif sys.platform == "darwin":
            lib = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
            default = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, "_FE_DFL_ENV")))
        else:
            return None, None
        for fn in (lib.fegetenv, lib.fesetenv):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
        return lib, default
    except (OSError, AttributeError, ValueError):
        return None, None


def can_switch() -> bool:
    """Whether this platform's floating-point environment can be switched (module docstring)."""
    return _c_library()[0] is not None


def reset_thread() -> None:
    """Put this thread in the default floating-point environment if it flushes subnormals (the
    initializer of dpjax's worker threads, which may be started from a flushing thread)."""
    if flushes_subnormals():
        lib, default = _c_library()
        if lib is not None:
            lib.fesetenv(default)


@contextlib.contextmanager
def ieee_arithmetic():
    """Scope with subnormals kept: the default floating-point environment inside where this
    thread's was flushing, the caller's restored on exit."""
    lib, default = _c_library() if flushes_subnormals() else (None, None)
    saved = ctypes.create_string_buffer(_ENV_BYTES) if lib is not None else None
    if saved is None or lib.fegetenv(saved) != 0 or lib.fesetenv(default) != 0:
        yield
        return
    try:
        yield
    finally:
        lib.fesetenv(saved)
