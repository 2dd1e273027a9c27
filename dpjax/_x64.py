"""Float64 everywhere, whatever the user's ``jax_enable_x64`` setting.

Privacy accounting needs double precision: a delta of 1e-10 is below float32's
resolution next to 1, and FFT round-off in float32 is ~1e-7 per bin.  dpjax does not
flip the global flag (that would change the user's own model code).  Instead every public
numeric entry point is wrapped in :func:`float64`, which runs the call inside
``jax.enable_x64(True)``, a scoped context manager.  JAX keys its jit cache on the x64
state, so jitted dpjax internals compile once per state and never mix precisions.

Inside jitted internals, create arrays with ``jnp.asarray(x, jnp.float64)``; they are only
ever traced under the context set up here.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import jax

F = TypeVar("F", bound=Callable)


def float64(fn: F) -> F:
    """Decorator: run ``fn`` with 64-bit JAX types enabled (scoped, restored afterwards)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
