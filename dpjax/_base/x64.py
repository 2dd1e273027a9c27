"""The float64 contract: float64 answers whatever the caller's ``jax_enable_x64`` setting.

Privacy accounting needs double precision: a delta of 1e-10 is below float32's resolution next
to 1, and FFT round-off in float32 is ~1e-7 per bin.  dpjax does not flip the global flag (that
would change the user's own model code).  Instead every public numeric entry point is wrapped in
:func:`float64`.  The contract (docs/design.md §8):

* **x64 on** (the caller enabled it): nothing to do; the function runs as written.
* **Eager call from float32 code**: the call runs inside ``jax.enable_x64(True)``, a scoped
  context manager; the result is float64.
* **Under ``jax.grad`` / ``jax.vjp`` / ``jax.vmap`` from float32 code**: JAX transposes (runs the
  backward pass of) a function *after* it has returned, i.e. outside any scope the function set up
  for itself, and transpose rules that create float64 zeros then get float32 ones and fail with a
  dtype clash.  So a traced call goes through a ``jax.custom_vjp`` whose forward *and* backward
  passes run in the float64 scope.  Inexact traced inputs are promoted to float64 inside; inexact
  outputs are cast to the caller's float dtype (``float32``) at the boundary, and cotangents are
  cast back to each input's dtype.  The arithmetic is float64 throughout; only the one value
  handed back to float32 code is rounded to float32, as any float32 caller's value must be: to
  nearest, or to its safe side where the function says so (``float64(rounding="up")`` for a
  certified upper bound or a noise multiplier).
* **Subnormals**: the call runs in :func:`ieee_arithmetic`, so a thread that
  flushes subnormal doubles to zero (a host callback's) does not turn a tiny certified delta
  into 0.
* **Inside a user's ``jax.jit`` (or ``lax.scan``/``lax.map``/``lax.cond``) traced without x64**:
  float64 operations cannot be staged into a program that is lowered with x64 off (XLA lowering
  canonicalizes some 64-bit types to 32 bits and the program fails to verify), so the call
  raises, at trace time, a ``ValueError`` that names the function and the fix: call it outside
  ``jit``, or trace the region with x64 on (``with jax.enable_x64(True): jax.jit(f)(...)``),
  where it works.  Host-side entry points (grid planning, certificates) cannot be traced at all
  and say so through :func:`require_concrete`.

Forward-mode differentiation (``jax.jvp`` / ``jax.jacfwd``) of a traced call from float32 code is
not supported by a ``custom_vjp`` (JAX raises); with x64 enabled by the caller it works as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import sys
from typing import Any, Callable, Mapping, TypeVar

import numpy as np
from dpjax._base import deferred_x64, jax_loaded, lazy_module as _lazy_module

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

F = TypeVar("F", bound=Callable)

__all__ = ["float64", "x64_enabled", "require_concrete", "host_only", "round_up", "flushes_subnormals",
           "ieee_arithmetic", "reset_thread", "can_switch"]


def x64_enabled() -> bool:
    """Whether 64-bit JAX types are enabled in the current (possibly scoped) configuration."""
    return bool(jax.config.jax_enable_x64)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _under_staging(leaves: list) -> bool:
    """True while tracing into a staged program (jit, scan, cond, ...), not under plain grad/vmap
    (private JAX, with a public fallback: :func:`dpjax._base.jax_private.under_jit`)."""
    from dpjax._base import jax_private as _jax_private

    return _jax_private.under_jit(leaves)


def _is_inexact(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def float64(fn: F | None = None, *, rounding: str | Mapping[str, str] | Callable[..., Any] = "nearest"):
    """Decorator: run ``fn`` in float64 for eager and traced (grad, vmap, jit) float32 callers.

    See the module docstring for the contract.  ``fn`` must be a function of its arguments only
    (no closed-over tracers); non-array arguments (ints, strings, dataclasses of NumPy arrays)
    pass through unchanged.

    ``rounding``: how a traced call hands float64 results to float32 code.  A side is
    ``"nearest"``, ``"up"`` (a certified upper bound or a calibrated noise multiplier, whose safe
    side is up) or ``"down"`` (a lower bound).  ``rounding`` is a side (for a bare array result;
    a record's fields go to nearest), a mapping from a record's field names to sides (the other
    fields to nearest), or a function of the call's arguments by name (defaults applied, as
    keywords) returning either.  The derivative is that of the float64 value.
    """
    if fn is None:
        return functools.partial(float64, rounding=rounding)
    signature = inspect.signature(fn) if callable(rounding) else None

    def side_of(args, kwargs):
        if signature is None:
            return rounding
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return rounding(**bound.arguments)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # Subnormals kept even where the caller's thread flushes them (a host callback's does).
        with ieee_arithmetic():
            return dispatch(*args, **kwargs)

    def dispatch(*args, **kwargs):
        if not jax_loaded():
            # No argument can be a JAX value; JAX is imported (in float64) only if used inside.
            with deferred_x64():
                return fn(*args, **kwargs)
        if x64_enabled():
            return fn(*args, **kwargs)
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        if not any(_is_tracer(leaf) for leaf in leaves):
            with jax.enable_x64(True):
                return fn(*args, **kwargs)
        if _under_staging(leaves):
            raise ValueError(
                f"{fn.__module__}.{fn.__qualname__} was traced inside jax.jit (or lax.scan/map/"
                "cond) with jax_enable_x64 off. dpjax computes in float64, which cannot be staged "
                "into a program lowered without x64. Call it outside jit (eager, grad and vmap "
                "work from float32 code), or trace with x64 on: "
                "`with jax.enable_x64(True): jax.jit(f)(...)`.")
        return _traced_call(fn, leaves, treedef, side_of(args, kwargs))

    wrapper.__wrapped_float64__ = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _traced_call(fn: Callable, leaves: list, treedef, rounding: str = "nearest") -> Any:
    """One traced call of ``fn`` from float32 code, through a float64-scoped ``custom_vjp``."""
    # Inexact tracers are the differentiable inputs; everything else (integer tracers, PRNG keys,
    # concrete arrays, Python scalars) is passed as a non-differentiable operand.
    diff_index = [i for i, leaf in enumerate(leaves) if _is_tracer(leaf) and _is_inexact(leaf)]
    other_index = [i for i, leaf in enumerate(leaves)
                   if i not in set(diff_index) and _is_tracer(leaf)]
    static = {i: leaf for i, leaf in enumerate(leaves) if not _is_tracer(leaf)}
    in_dtypes = [jnp.result_type(leaves[i]) for i in diff_index]
    out_meta: list = []

    def call(diff_values, other_values):
        values = dict(static)
        values.update(zip(diff_index, (jnp.asarray(v, jnp.float64) for v in diff_values)))
        values.update(zip(other_index, other_values))
        args, kwargs = jax.tree_util.tree_unflatten(treedef, [values[i] for i in range(len(leaves))])
        return fn(*args, **kwargs)

    def to_caller(out):
        # Inexact outputs go back in the caller's default float dtype (float32 here).
        with_paths, out_tree = jax.tree_util.tree_flatten_with_path(out)
        out_meta[:] = [out_tree]
        return [_to_float32(leaf, _side(rounding, path, len(with_paths)))
                if _is_inexact(leaf) and jnp.result_type(leaf) == jnp.float64 else leaf
                for path, leaf in with_paths]

    @functools.partial(jax.custom_vjp, nondiff_argnums=())
    def primal(diff_values, other_values):
        with jax.enable_x64(True):
            return to_caller(call(diff_values, other_values))

    def primal_fwd(diff_values, other_values):
        with jax.enable_x64(True):
            out, vjp = jax.vjp(lambda d: to_caller(call(d, other_values)), diff_values)
        return out, (vjp, other_values)

    def primal_bwd(residuals, cotangents):
        vjp, other_values = residuals
        with jax.enable_x64(True):
            (diff_bar,) = vjp(cotangents)
        diff_bar = [jnp.asarray(c).astype(d) for c, d in zip(diff_bar, in_dtypes)]
        other_bar = [_zero_cotangent(v) for v in other_values]
        return diff_bar, other_bar

    primal.defvjp(primal_fwd, primal_bwd)
    out_leaves = primal([leaves[i] for i in diff_index], [leaves[i] for i in other_index])
    return jax.tree_util.tree_unflatten(out_meta[0], out_leaves)


def round_up(value, dtype) -> np.ndarray:
    """``value`` in ``dtype``, rounded toward +inf where ``dtype`` is narrower: the host (NumPy)
    form of the ``"up"`` side, for results handed back from a host callback (the nearest float32
    of a float64 upper bound may lie below it, and below the truth)."""
    value = np.asarray(value, np.float64)
    out = value.astype(dtype)
    if out.dtype == value.dtype:
        return out
    return np.where(out < value, np.nextafter(out, np.asarray(np.inf, out.dtype)), out).astype(dtype)


def _side(rounding, path, num_leaves: int) -> str:
    """The rounding side of the output leaf at ``path`` (see :func:`float64`)."""
    if isinstance(rounding, str):
        return rounding if num_leaves == 1 else "nearest"
    name = getattr(path[0], "name", getattr(path[0], "key", None)) if path else None
    return rounding.get(name, "nearest")


def _to_float32(value, side: str):
    """A float64 array in float32: to nearest, or directed (``"up"``/``"down"``): never on the wrong
    side of the float64 value, one float32 step from the nearest (float32's smallest normal for
    a value below it), with the float64 value's derivative."""
    if side == "nearest":
        return value.astype(jnp.float32)
    if side not in ("up", "down"):
        raise ValueError(f"rounding must be 'nearest', 'up' or 'down', got {side!r}")
    return _directed()(value, side == "up")


@functools.lru_cache(maxsize=1)
def _directed():
    """The directed float64 -> float32 rounding, built on first use (JAX is imported lazily)."""

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def directed(value, up: bool):
        near = value.astype(jnp.float32)
        wrong = near.astype(jnp.float64) < value if up else near.astype(jnp.float64) > value
        moved = jnp.where(wrong, jnp.nextafter(near, jnp.float32(jnp.inf if up else -jnp.inf)), near)
        # XLA:CPU flushes subnormals to zero (the conversion included, and float64 inputs): a
        # value strictly between 0 and float32's smallest normal, on the side it is rounded away
        # from, goes to that normal.  Its sign and non-zeroness are read from the bits.
        tiny = jnp.finfo(jnp.float32).tiny
        bits = jax.lax.bitcast_convert_type(value, jnp.int64)
        if up:
            sub = (bits > 0) & (value < tiny)
        else:
            sub = (bits < 0) & (bits != jnp.iinfo(jnp.int64).min) & (value > -tiny)  # not -0.0
        return jnp.where(sub, jnp.float32(tiny if up else -tiny), moved)

    @directed.defjvp
    def directed_jvp(up, primals, tangents):
        return directed(primals[0], up), tangents[0].astype(jnp.float32)

    return directed


def _zero_cotangent(value):
    if _is_inexact(value):
        return jnp.zeros(jnp.shape(value), jnp.result_type(value))
    return np.zeros(jnp.shape(value), jax.dtypes.float0)


def require_concrete(name: str, value: Any, *, use_instead: str) -> None:
    """Raise a ``ValueError`` if ``value`` is a tracer: for host-side entry points.

    Host-side entry points (grid planning, certificates, anything that returns Python floats)
    cannot run inside ``jax.jit``; they say so at trace time and name the traceable alternative.
    """
    if not jax_loaded():
        return
    if any(_is_tracer(leaf) for leaf in jax.tree_util.tree_leaves(value)):
        raise ValueError(
            f"{name} must be a concrete value, got a JAX tracer: this function plans on the host "
            f"and cannot be traced by jax.jit/vmap/grad. Use {use_instead} instead.")


def host_only(use_instead: str) -> Callable[[F], F]:
    """Decorator for host-side entry points: any JAX tracer among the arguments raises the
    :func:`require_concrete` ``ValueError`` (naming ``use_instead``) before anything else runs,
    so that under ``jax.jit`` with x64 off the caller learns that the function is not traceable
    at all (rather than being told to enable x64)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            require_concrete(f"{fn.__module__}.{fn.__qualname__}: every argument", (args, kwargs),
                             use_instead=use_instead)
            with ieee_arithmetic():  # as float64: subnormals kept in a flushing thread
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


# ------------------------------------------------------------------------------------------
# IEEE arithmetic for host numerics: subnormal numbers kept, not flushed to zero.
#
# XLA:CPU runs its programs with the processor's flush-to-zero and denormals-are-zero modes on, and
# a ``jax.pure_callback`` runs its Python function on that thread with those modes still set.  A
# thread started there inherits them for good (a new thread copies its creator's floating-point
# environment).  NumPy then rounds every result below the smallest normal double (2.2e-308) to 0
# and reads every such input as 0.  For accounting that is unsound: Gaussian noise gives a positive
# delta at every epsilon, and a certified delta of 5e-324 read back as 0 claims pure DP.
#
# ``ieee_arithmetic`` is the scope every public numeric entry point and every host callback runs
# in: where the modes are set, it switches to the default environment (IEEE, round to nearest, no
# flushing) and restores the caller's on exit.  ``reset_thread`` is the initializer of dpjax's
# own worker threads.  Where the modes are off (the usual case) both cost one NumPy probe.
#
# Switching uses the C library's ``fegetenv``/``fesetenv`` through :mod:`ctypes` (glibc and musl on
# Linux, macOS).  Elsewhere nothing is switched (``can_switch()`` is False).

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
