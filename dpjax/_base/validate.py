"""Boundary checks.  Every public entry point validates here, before any numerics run.

Each check raises ``ValueError`` naming the argument and its valid range, and returns the
value converted to a NumPy float64 array (or Python int) so callers can use it directly.
Validation runs on concrete values only: inside ``jit`` the public wrappers are not used
(the pure functions in the layer modules are).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import numpy as np


def _as_float_array(name: str, value: Any) -> np.ndarray:
    # Refused before any conversion: strings ('1' converts silently), booleans (True is not a
    # number of anything), complex values (the imaginary part would be dropped), empty arrays
    # (every later min/max reduction would fail with NumPy's message) and JAX tracers (say
    # what to use instead).
    if _is_tracer(value):
        raise ValueError(f"{name} must be a concrete number, got a JAX tracer: this entry point validates and "
                         f"plans on the host and cannot be traced by jax.jit/vmap; call it outside the "
                         f"transformation (its documentation names the traceable function to use inside)")
    if isinstance(value, (str, bytes)):
        raise ValueError(f"{name} must be a real number or array of real numbers, got the string {value!r}")
    try:
        raw = np.asarray(value)
    except Exception as exc:  # ragged nesting and the like
        raise ValueError(f"{name} must be a real number or array of real numbers, got {value!r}") from exc
    if raw.dtype == np.bool_:
        raise ValueError(f"{name} must be a real number, not a boolean, got {value!r}")
    if np.iscomplexobj(raw):
        raise ValueError(f"{name} must be real, got a complex value {value!r}")
    if raw.size == 0:
        raise ValueError(f"{name} must not be empty, got {value!r}")
    if raw.dtype.kind in "USV":
        raise ValueError(f"{name} must be a real number or array of real numbers, got {value!r}")
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be a real number or array of real numbers, got {value!r}") from exc
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return arr


def _is_tracer(value: Any) -> bool:
    # A JAX tracer exists only once JAX is imported: NumPy-only callers (the samplers) never pay
    # JAX's import (~0.8 s, ~36 MB) for a check that cannot succeed.
    core = getattr(sys.modules.get("jax"), "core", None)
    return core is not None and isinstance(value, core.Tracer)


def positive(name: str, value: Any, *, allow_inf: bool = False) -> np.ndarray:
    """``value > 0`` (elementwise), finite unless ``allow_inf``."""
    arr = _as_float_array(name, value)
    if not allow_inf and np.isinf(arr).any():
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    if (arr <= 0).any():
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return arr


def nonnegative(name: str, value: Any) -> np.ndarray:
    """``0 <= value < inf`` (elementwise)."""
    arr = _as_float_array(name, value)
    if np.isinf(arr).any() or (arr < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return arr


def probability_open_closed(name: str, value: Any) -> np.ndarray:
    """``0 < value <= 1`` (a sampling probability)."""
    arr = _as_float_array(name, value)
    if ((arr <= 0) | (arr > 1)).any():
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return arr


def probability_open(name: str, value: Any) -> np.ndarray:
    """``0 < value < 1`` (a delta)."""
    arr = _as_float_array(name, value)
    if ((arr <= 0) | (arr >= 1)).any():
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return arr


#: Largest accepted integer count (steps, group sizes, sample counts): every integer up to
#: 2^53 is exact in float64, and the int64 arithmetic of the accountants stays far from overflow.
MAX_INT = 2**53


def positive_int(name: str, value: Any, *, minimum: int = 1, maximum: int = MAX_INT) -> int:
    """An integer in ``[minimum, maximum]``; floats equal to an integer are accepted (1000.0 -> 1000).

    Booleans, strings, NaN, infinities and non-integral values are refused with a ``ValueError``
    naming ``name`` and the range (never an ``OverflowError`` from a later int64 conversion).
    """
    # ">= minimum" first: the wording callers (and their tests) already match on.
    rng = f"an integer >= {minimum} (and <= {'2**53' if maximum == MAX_INT else maximum})"
    if isinstance(value, (bool, np.bool_, str, bytes)) or _is_tracer(value):
        raise ValueError(f"{name} must be {rng}, got {value!r}")
    if isinstance(value, (int, np.integer)):
        v = int(value)
    else:
        try:
            f = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{name} must be {rng}, got {value!r}") from exc
        if math.isnan(f) or math.isinf(f) or f != math.floor(f):
            raise ValueError(f"{name} must be {rng}, got {value!r}")
        v = int(f)
    if v < minimum or v > maximum:
        raise ValueError(f"{name} must be {rng}, got {value!r}")
    return v


#: Largest PRNG seed.  ``jax.random.key`` without x64 keeps only the low 32 bits of an integer
#: seed (``2**32`` gives the key of ``0``; ``2**63`` and above raise ``OverflowError``), so the
#: seeds in ``[0, 2**32 - 1]`` are exactly the ones that name distinct keys.  One rule for every
#: seed of dpjax: the ``key`` of the Monte Carlo entry points, the samplers' ``seed`` and the
#: command's ``--seed``.
MAX_SEED = 2**32 - 1

#: Largest Monte Carlo sample count of one estimate (the library's and the command's ``--samples``).
MAX_SAMPLES = 2**40


def prng_seed(name: str, value: Any, *, key_allowed: bool = True) -> int:
    """An integer seed in ``[0, MAX_SEED]`` (:data:`MAX_SEED`), usable by ``jax.random.key``
    with or without x64.  ``key_allowed``: the argument may also be a JAX PRNG key (the error
    message then says so)."""
    what = f"{'a JAX PRNG key or ' if key_allowed else ''}an integer seed in [0, 2**32 - 1]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    v = int(value)
    if not 0 <= v <= MAX_SEED:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return v


@dataclasses.dataclass(frozen=True)
class PrivacyTarget:
    """A validated privacy target ``(epsilon, delta)``: the one check of target arguments.

    Either part may be ``None`` (a query that computes it).  Construction validates what is
    given, with the messages of :func:`positive` / :func:`nonnegative` /
    :func:`probability_open` naming ``target_epsilon`` / ``target_delta``: ``epsilon`` finite and
    ``> 0`` (``>= 0`` with ``allow_zero_epsilon=True``, for delta queries), ``delta`` in
    ``(0, 1)``.  The fields then hold the validated float64 arrays (any shape: a batch of
    targets is validated element by element).

    Raises:
      ValueError: a target outside its range, naming the argument and the range.
    """

    epsilon: Any = None
    delta: Any = None
    allow_zero_epsilon: bool = False

    def __post_init__(self):
        if self.epsilon is not None:
            check = nonnegative if self.allow_zero_epsilon else positive
            object.__setattr__(self, "epsilon", check("target_epsilon", self.epsilon))
        if self.delta is not None:
            object.__setattr__(self, "delta", probability_open("target_delta", self.delta))
