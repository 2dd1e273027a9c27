"""``jit`` with XLA:CPU compile options tuned for a fast first call (dpjax's compiled programs).

Eager queries run the PLD program on the host and compile nothing (docs/design.md §2.5); what
dpjax still compiles (a sweep's bucket stages on the compiled backend, the PLD program traced
under a user's ``jit``, the closed forms) pays XLA's compile time once per shape.  XLA:CPU has two
code generators for fused elementwise loops: its MLIR "fusion emitters" (the default) and the
older loop emitters (``xla_cpu_use_fusion_emitters=False``).  On dpjax's accountant programs the
older ones compile faster and the programs run as fast (measured when the single query still
compiled its program, in ``benchmarks/results/bench_first_call_ab_emitters.json``: about a fifth
less first-call time, identical values).

The sweep's bucket programs (``dpjax.pld.sweeps.driver``) pass :func:`compile_options` to their
explicit compiles: on the sweep's own per-configuration program the older emitters take about a
third less compile time for a run time within ~10% (docs/design.md §2.5).

The options apply only where they can: a top-level call (JAX refuses ``compiler_options`` on a
``jit`` nested in another trace, so a call under a user's ``jit``/``vmap``/``grad`` uses the plain
program: the same numbers), on the CPU backend (other backends get JAX's defaults), and while
XLA knows the option (an XLA without it makes :func:`jit` fall back to the plain program once,
for the rest of the process).  ``DPJAX_XLA_FAST_COMPILE=0`` turns it off.
"""

from __future__ import annotations

import functools
import os
import weakref
from dpjax._base import jax_loaded, lazy_module as _lazy_module

jax = _lazy_module("jax")


def usable_cpus() -> int:
    """Cores this process may run on: its CPU affinity where the OS reports one (a container's
    or ``taskset``'s limit), else ``os.cpu_count()``.  Sizes dpjax's host-side concurrency."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_index() -> int:
    """``jax.process_index()``; 0 before JAX is imported (no ``jax.distributed`` set-up yet)."""
    return jax.process_index() if jax_loaded() else 0


def process_count() -> int:
    """``jax.process_count()``; 1 before JAX is imported."""
    return jax.process_count() if jax_loaded() else 1


#: Packages whose presence means JAX may find an accelerator (PJRT plugins, TPU runtime).
_ACCELERATOR_PACKAGES = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                         "jax_rocm7_plugin", "libtpu")


def one_cpu_without_jax() -> bool:
    """True when JAX is not imported and would find exactly one device, the CPU: ``JAX_PLATFORMS``
    is ``cpu``, or no accelerator plugin is installed and ``XLA_FLAGS`` does not force several
    host devices.  Host work (the NumPy PLD program) then proceeds without importing JAX; in every
    other case the caller asks JAX for its devices."""
    if jax_loaded():
        return False
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return False
    platforms = os.environ.get("JAX_PLATFORMS", os.environ.get("JAX_PLATFORM_NAME", "")).strip().lower()
    if platforms:
        return platforms == "cpu"
    import importlib.util

    return not any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PACKAGES)


#: XLA debug options for dpjax's one-shot programs on CPU (see the module docstring).
CPU_COMPILE_OPTIONS = {"xla_cpu_use_fusion_emitters": False}

_enabled = os.environ.get("DPJAX_XLA_FAST_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")


def _top_level() -> bool:
    # Private JAX (dpjax._base.jax_private): without it, never pass the options (always valid).
    from dpjax._base import jax_private as _jax_private

    return _jax_private.top_level_trace()


def _use_options() -> bool:
    return _enabled and _top_level() and jax.default_backend() == "cpu"


def _disable() -> None:
    global _enabled
    _enabled = False


def _unknown_option(err: Exception) -> bool:
    return "No such compile option" in str(err)


#: Compiled programs dpjax keeps alive at once, over all its jitted functions.  Each XLA:CPU
#: executable holds ~190 memory mappings (its code and data); Linux allows a process 65,530 by
#: default (``vm.max_map_count``), and the compile after that fails inside LLVM with a
#: segmentation fault.  The accountant compiles one program per grid shape, so a process that
#: accounted a few hundred random configurations (~330 shapes) crashed.  Past this many live
#: programs the other dpjax functions' caches are dropped (a shape used again recompiles):
#: ~36,000 mappings at most, leaving room for the caller's own programs.
MAX_LIVE_PROGRAMS = 192

_INSTANCES: "weakref.WeakSet[_Jit]" = weakref.WeakSet()
_bounded = True


def _bound_live_programs(keep: "_Jit") -> None:
    """Past :data:`MAX_LIVE_PROGRAMS`, drop the programs of every dpjax function but ``keep``
    (the one just called: its programs are in use), and ``keep``'s too if it alone is past."""
    global _bounded
    try:
        live = list(_INSTANCES)
        if sum(j.live_programs() for j in live) > MAX_LIVE_PROGRAMS:
            for j in live:
                if j is not keep:
                    j.clear_cache()
            if keep.live_programs() > MAX_LIVE_PROGRAMS:
                keep.clear_cache()
    except NotImplementedError:  # a JAX without the count: nothing to bound by
        _bounded = False


class _Jit:
    """A ``jax.jit`` pair: with :data:`CPU_COMPILE_OPTIONS` (top-level CPU calls) and without.
    Every instance counts towards :data:`MAX_LIVE_PROGRAMS`."""

    def __init__(self, fun, **jit_kwargs):
        # The ``jax.jit`` pair is made on first use: defining a dpjax function must not import
        # JAX (eager queries run in NumPy; see :mod:`dpjax._base`).
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._pair = None
        functools.update_wrapper(self, fun)
        self._live_seen = None   # (programs, limit) at the last bound check
        _INSTANCES.add(self)

    def _jits(self):
        pair = self._pair
        if pair is None:
            pair = self._pair = (jax.jit(self._fun, **self._jit_kwargs),
                                 jax.jit(self._fun, compiler_options=CPU_COMPILE_OPTIONS, **self._jit_kwargs))
        return pair

    @property
    def _plain(self):
        return self._jits()[0]

    @property
    def _fast(self):
        return self._jits()[1]

    def __call__(self, *args, **kwargs):
        out = self._call(*args, **kwargs)
        if _bounded:
            # The total only grows when some function compiles, and each function checks after
            # its own calls: a call that compiled nothing here (same count, same limit) cannot
            # have passed the bound (counting every instance's programs on every call cost
            # ~0.3 ms per accountant call).
            try:
                seen = (self.live_programs(), MAX_LIVE_PROGRAMS)
            except NotImplementedError:
                seen = None
            if seen is None or seen != self._live_seen:
                _bound_live_programs(self)
                if _bounded:
                    self._live_seen = (self.live_programs(), MAX_LIVE_PROGRAMS)
        return out

    def _call(self, *args, **kwargs):
        if not _use_options():
            return self._plain(*args, **kwargs)
        try:
            return self._fast(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - only the unknown-option error is handled
            if not _unknown_option(err):
                raise
            _disable()
            return self._plain(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return (self._fast if _use_options() else self._plain).lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return (self._fast if _use_options() else self._plain).trace(*args, **kwargs)

    def live_programs(self) -> int:
        """Programs compiled and kept for this function (both variants)."""
        from dpjax._base.jax_private import jit_cache_size

        if self._pair is None:
            return 0
        return jit_cache_size(self._plain) + jit_cache_size(self._fast)

    def clear_cache(self):
        if self._pair is None:
            return
        self._plain.clear_cache()
        self._fast.clear_cache()
        # A recompile after this may bring the count back to its last checked value: check again.
        self._live_seen = None


def jit(fun=None, **jit_kwargs):
    """``jax.jit(fun, **jit_kwargs)`` compiled with :data:`CPU_COMPILE_OPTIONS` when called at
    top level on CPU (see the module docstring).  Usable as ``@jit``, ``jit(f, ...)`` and
    ``functools.partial(jit, static_argnames=...)``."""
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    return _Jit(fun, **jit_kwargs)


def compile_options() -> dict:
    """The options a top-level compile of a dpjax one-shot program gets now (``{}`` if none),
    for code that lowers and compiles explicitly (``lowered.compile(compile_options())``)."""
    return dict(CPU_COMPILE_OPTIONS) if _use_options() else {}
