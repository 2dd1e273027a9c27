"""Host-planned functions under ``jax.grad``, ``jax.vmap`` and ``jax.jit``.

dpjax's headline functions (:func:`dpjax.dpsgd_epsilon`, :func:`dpjax.dpsgd_delta`,
:func:`dpjax.dpsgd_noise_multiplier` and the group variants) plan their grid on the host from
the concrete arguments: the grid's static shape, its spacing and its window all depend on the
values.  A traced argument has no value at trace time, so these functions cannot be staged as
one XLA program.  :func:`host_call` makes them traceable anyway (docs/design.md §8):

* **forward**: a ``jax.pure_callback`` runs the eager, host-planned computation on the concrete
  values once the program executes.  Under ``jax.vmap`` the callback receives the whole batch
  (``vmap_method="broadcast_all"``), so the host function sees one array per argument and can
  evaluate every element in one vectorized pass;
* **backward**: a ``jax.custom_vjp`` whose forward callback also returns the partial derivative
  of the value with respect to every traced float argument, computed on the host on the same
  grid as the value (see :mod:`dpjax.pld.grid.batched`); the backward pass multiplies them by the
  cotangent.  Forward-mode differentiation (``jax.jvp``) is not available (``custom_vjp``).

Arguments that are not traced stay on the host as float64 NumPy values (a Python ``0.01`` is
not rounded to float32 on the way); traced ones arrive in the caller's dtype (float32 with
``jax_enable_x64`` off).  The result has the caller's float dtype: float32 when x64 is off
(the float64 answer rounded once, upward: every value computed here is an upper bound or a
noise multiplier, whose safe side is up), float64 when it is on.  Eager calls never come here.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
from dpjax._base import jax_loaded, lazy_module as _lazy_module
from dpjax._base.x64 import ieee_arithmetic, round_up

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")

__all__ = ["is_tracer", "is_traced", "host_call"]


def is_tracer(x) -> bool:
    """True when ``x`` is a JAX tracer (never before JAX is imported)."""
    return jax_loaded() and isinstance(x, jax.core.Tracer)


def is_traced(*values) -> bool:
    """True when any leaf of ``values`` is a JAX tracer (never before JAX is imported)."""
    if not jax_loaded():
        return False
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(values))


def _float_dtype():
    return jnp.dtype(jnp.float64) if jax.config.jax_enable_x64 else jnp.dtype(jnp.float32)


def _zero_int_cotangent(value):
    return np.zeros(jnp.shape(value), jax.dtypes.float0)


def _inexact(x, dtype):
    return x if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else jnp.asarray(x, dtype)


def host_call(values: Callable[..., np.ndarray], partials: Callable[..., tuple], floats: Mapping,
              ints: Mapping | None = None, *, name: str = "dpjax"):
    """Evaluate a host-planned function of possibly traced arguments.

    Args:
      values: ``values(**arrays) -> ndarray``: the eager computation, elementwise over arrays
        broadcast to one shape (float64 NumPy arrays for ``floats``, int64 for ``ints``); its
        result has that shape.  The result is an upper-side quantity (a certified epsilon or
        delta, a calibrated noise multiplier): in a float32 caller's dtype it is rounded up
        (:func:`dpjax._base.x64.round_up`).
      partials: ``partials(wrt, **arrays) -> (values, {name: d values / d name})`` for the
        argument names in ``wrt`` (a tuple), each of the broadcast shape.
      floats: name -> value (a tracer or a concrete number/array) of the differentiable
        arguments.
      ints: name -> value of integer arguments (traced or not; never differentiated).
      name: the function's name, for error messages.

    Returns:
      a JAX array of the broadcast shape of the arguments (under ``vmap``, with the batch
      axes), in the caller's float dtype.
    """
    ints = dict(ints or {})
    floats = dict(floats)
    traced_f = [k for k, v in floats.items() if isinstance(v, jax.core.Tracer)]
    traced_i = [k for k, v in ints.items() if isinstance(v, jax.core.Tracer)]
    const = {k: np.asarray(v, np.float64) for k, v in floats.items() if k not in traced_f}
    const.update({k: np.asarray(v, np.int64) for k, v in ints.items() if k not in traced_i})
    shape = tuple(np.broadcast_shapes(*(jnp.shape(v) for v in (*floats.values(), *ints.values()))))
    dtype = _float_dtype()
    names = traced_f + traced_i

    def arrays(vals):
        # The callback's traced inputs (with any vmap batch axes) and the host constants,
        # broadcast together (the constants align with the trailing axes).
        out = dict(const)
        for k, v in zip(names, vals):
            out[k] = np.asarray(v, np.int64 if k in traced_i else np.float64)
        keys = list(out)
        return dict(zip(keys, np.broadcast_arrays(*(out[k] for k in keys))))

    # The callbacks run on XLA's thread, which flushes subnormals to zero: IEEE arithmetic inside.
    def host_values(*vals):
        with jax.enable_x64(True), ieee_arithmetic():
            res = values(**arrays(vals))
            return round_up(res, dtype)

    def host_partials(*vals):
        with jax.enable_x64(True), ieee_arithmetic():
            res, parts = partials(tuple(traced_f), **arrays(vals))
            return round_up(res, dtype), [np.asarray(parts[k], dtype) for k in traced_f]

    out_sds = jax.ShapeDtypeStruct(shape, dtype)

    @jax.custom_vjp
    def fn(fvals, ivals):
        return jax.pure_callback(host_values, out_sds, *fvals, *ivals, vmap_method="broadcast_all")

    def fn_fwd(fvals, ivals):
        value, parts = jax.pure_callback(host_partials, (out_sds, [out_sds for _ in fvals]), *fvals, *ivals,
                                         vmap_method="broadcast_all")
        return value, (parts, ivals)

    def fn_bwd(res, ct):
        parts, ivals = res
        return ([(ct * p).astype(d) for p, d in zip(parts, in_dtypes)],
                [_zero_int_cotangent(v) for v in ivals])

    fn.defvjp(fn_fwd, fn_bwd)
    # Integer-typed tracers among the float arguments are promoted (their cotangent is a float).
    fvals = [jnp.broadcast_to(_inexact(floats[k], dtype), shape) for k in traced_f]
    in_dtypes = [jnp.result_type(v) for v in fvals]
    ivals = [jnp.broadcast_to(ints[k], shape) for k in traced_i]
    return fn(fvals, ivals)
