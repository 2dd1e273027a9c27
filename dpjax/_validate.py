"""Boundary checks.  Every public entry point validates here, before any numerics run.

Each check raises ``ValueError`` naming the argument and its valid range, and returns the
value converted to a NumPy float64 array (or Python int) so callers can use it directly.
Validation runs on concrete values only: inside ``jit`` the public wrappers are not used
(the pure functions in the layer modules are).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _as_float_array(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number or array of real numbers, got {value!r}") from exc
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return arr


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


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """An integer ``>= minimum``; floats equal to an integer are accepted (1000.0 -> 1000)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from exc
    if math.isnan(f) or math.isinf(f) or f != math.floor(f) or f < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(f)


def one_of(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value
