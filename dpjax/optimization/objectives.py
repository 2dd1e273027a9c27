"""Noise-free workload errors of a matrix mechanism (docs/design.md §6.2).

Releasing ``x + C^{-1} z`` with ``z ~ N(0, sigma^2 I)`` and answering the linear workload ``W``
(``m`` queries over ``n`` rounds) gives the error ``W C^{-1} z``.  The functions here return the
error **per unit noise multiplier**; multiply by ``sigma`` for the RMSE / max error:

* :func:`prefix_sum_error` ``= |A C^{-1}|_F / sqrt(n)`` (``A`` lower-triangular ones): the RMSE of
  prefix sums over ``sigma`` (Choquette-Choo et al. 2024, §4.2).  Equal to
  ``dpjax.matrices.prefix_sum_rmse(C, 1.0, n)``.
* :func:`max_error` ``= max_i |(A C^{-1})[i, :]|_2``: the largest per-query standard deviation.
* :func:`workload_error` for any workload ``W``: a ``(m, n)`` matrix, a lower-triangular Toeplitz
  workload (:class:`dpjax.matrices.Toeplitz`, e.g. prefix sums or momentum), or a callable
  linear map ``f: (n,) -> (m,)`` (``W x = f(x)``; e.g. :func:`sgd_workload`'s learning-rate
  and momentum workload); ``reduction="rms"`` gives ``|W C^{-1}|_F / sqrt(m)``, ``"max"`` the
  largest row norm.

Cost.  For Toeplitz/BLT ``C`` (a :class:`~dpjax.matrices.Toeplitz`, :class:`~dpjax.matrices.BLT`
or a 1-D first column) ``C^{-1}`` is Toeplitz with the column ``v = 1/c(x) mod x^n`` (Newton
iteration, O(n log n)); ``A C^{-1}`` is Toeplitz with column ``w = cumsum(v)``, whose row ``i``
holds ``w_0..w_i`` and whose ``k``-th diagonal holds ``n - k`` copies of ``w_k``, so

    |A C^{-1}|_F^2 = sum_k (n - k) w_k^2,      max_i |row_i|^2 = sum_k w_k^2  (the last row).

A Toeplitz workload is the same with ``u = w_W * v`` (an FFT product).  Matrix and callable
workloads, and dense ``C``, form ``C^{-1}`` (``n x n``).

Input validation (ValueError naming the argument) runs on concrete inputs: ``C`` non-negative,
lower triangular, finite, non-zero diagonal, shape ``(n, n)``; workload shape ``(m, n)``.
Traced inputs (inside ``jit``/``grad``) are checked for shape only.  Everything is
differentiable in ``C`` (and the workload).

Example::

    from dpjax.matrices import Toeplitz
    from dpjax.optimization import prefix_sum_error, max_error
    C = Toeplitz(jnp.array([1.0, 0.5]))
    prefix_sum_error(C, 64), max_error(C, 64)
    workload_error(C, sgd_workload(64, momentum=0.9), 64)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.x64 import float64
from dpjax.matrices import BLT, Toeplitz, correlation_array, inverse_toeplitz_column, toeplitz_dense
from dpjax.matrices._structured import truncated_product

__all__ = ["prefix_sum_error", "max_error", "workload_error", "sgd_workload", "REDUCTIONS", "Reduction",
           "prefix_sum_error_pure"]

class Reduction(StrEnum):
    """How the per-query errors of a workload reduce to one number: root mean square or max."""

    RMS = "rms"
    MAX = "max"


REDUCTIONS = tuple(r.value for r in Reduction)


# --------------------------------------------------------------------------- pure cores


def _toeplitz_errors(column_of_product, reduction: str):
    """Errors of a lower-triangular Toeplitz ``X`` (``n x n``) from its first column ``u``."""
    n = column_of_product.shape[0]
    sq = column_of_product * column_of_product
    if reduction == "max":
        return jnp.sqrt(jnp.sum(sq))
    return jnp.sqrt(jnp.sum((n - jnp.arange(n)) * sq) / n)


def _matrix_errors(x, reduction: str):
    row_sq = jnp.sum(x * x, axis=1)
    if reduction == "max":
        return jnp.sqrt(jnp.max(row_sq))
    return jnp.sqrt(jnp.sum(row_sq) / x.shape[0])


def _dense_inverse(c):
    n = c.shape[0]
    return jax.scipy.linalg.solve_triangular(c, jnp.eye(n, dtype=c.dtype), lower=True)


def _structure(correlation, n: int):
    """``("column", c)`` for Toeplitz-like input, ``("dense", C)`` for a matrix (no validation)."""
    if isinstance(correlation, (Toeplitz, BLT)):
        return "column", correlation.column(n)
    arr = jnp.asarray(correlation)
    if arr.ndim == 1:
        arr = jnp.pad(arr, (0, n - arr.shape[0])) if arr.shape[0] < n else arr[:n]
        return "column", arr
    return "dense", arr


def prefix_sum_error_pure(correlation, n: int, reduction: str = "rms"):
    """Prefix-sum workload error of ``correlation`` (column ``(n,)`` or dense ``(n, n)``), no
    validation or host conversion: traceable, for use inside ``jit`` / ``grad``.  ``reduction``:
    ``"rms"`` or ``"max"`` over the ``n`` rows of ``A C^{-1}``."""
    kind, c = _structure(correlation, n)
    if kind == "column":
        return _toeplitz_errors(jnp.cumsum(inverse_toeplitz_column(c)), reduction)
    # A C^{-1} = cumsum over rows of C^{-1}.
    return _matrix_errors(jnp.cumsum(_dense_inverse(c), axis=0), reduction)


def _workload_error_pure(correlation, workload, n: int, reduction: str):
    kind, c = _structure(correlation, n)
    if isinstance(workload, Toeplitz) and kind == "column":
        u = truncated_product(workload.column(n), inverse_toeplitz_column(c), n)
        return _toeplitz_errors(u, reduction)
    if kind == "column":
        inv = toeplitz_dense(inverse_toeplitz_column(c))
    else:
        inv = _dense_inverse(c)
    if isinstance(workload, Toeplitz):
        x = toeplitz_dense(workload.column(n)) @ inv
    elif callable(workload):
        x = jax.vmap(workload, in_axes=1, out_axes=1)(inv)
        x = x.reshape(-1, n) if x.ndim == 1 else x
    else:
        x = jnp.asarray(workload) @ inv
    return _matrix_errors(x, reduction)


# --------------------------------------------------------------------------- validation


def _is_concrete_tree(x) -> bool:
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def _validated(correlation, n):
    n = _validate.positive_int("n", n)
    if isinstance(correlation, (Toeplitz, BLT)):
        return correlation, n  # validated by the class when concrete
    arr = correlation_array(correlation, n, name="correlation")
    if arr.ndim == 2 and _is_concrete_tree(correlation):
        if (np.diagonal(np.asarray(arr)) == 0).any():
            raise ValueError("correlation must have a non-zero diagonal (C must be invertible)")
    if arr.ndim == 1 and _is_concrete_tree(correlation) and float(np.asarray(arr)[0]) == 0.0:
        raise ValueError("correlation (a Toeplitz first column) must have a non-zero first entry c[0]")
    return arr, n


# --------------------------------------------------------------------------- public


@float64
def prefix_sum_error(correlation, n: int):
    """``|A C^{-1}|_F / sqrt(n)``: prefix-sum RMSE per unit noise multiplier (scalar float64).

    Args:
      correlation: :class:`~dpjax.matrices.Toeplitz`, :class:`~dpjax.matrices.BLT`, a 1-D first
        column (O(n log n)), or a dense ``(n, n)`` lower-triangular non-negative array (O(n^3)).
      n: number of rounds.
    """
    correlation, n = _validated(correlation, n)
    return prefix_sum_error_pure(correlation, n, "rms")


@float64
def max_error(correlation, n: int):
    """``max_i |(A C^{-1})[i, :]|_2``: the largest prefix-sum error std per unit noise multiplier.

    For Toeplitz ``C`` this is the last row, ``|cumsum(v)|_2`` with ``v`` the column of
    ``C^{-1}``.  Arguments as :func:`prefix_sum_error`.
    """
    correlation, n = _validated(correlation, n)
    return prefix_sum_error_pure(correlation, n, "max")


@float64
def workload_error(correlation, workload, n: int, *, reduction: str = "rms"):
    """Error of workload ``W`` per unit noise multiplier: ``|W C^{-1}|_F / sqrt(m)`` or max row norm.

    Args:
      correlation: as :func:`prefix_sum_error`.
      workload: ``(m, n)`` array; a :class:`~dpjax.matrices.Toeplitz` (lower-triangular Toeplitz
        workload, ``m = n``; O(n log n) with Toeplitz ``C``); or a callable linear map
        ``f(x: (n,)) -> (m,)`` (jax-traceable; applied to the columns of ``C^{-1}``).
      n: number of rounds.
      reduction: ``"rms"`` (root mean over the ``m`` queries of the squared error) or ``"max"``.
    """
    reduction = Reduction.parse(reduction, "reduction").value
    correlation, n = _validated(correlation, n)
    if workload is None or isinstance(workload, (str, bytes)):
        raise ValueError(f"workload must be an (m, n) array, a Toeplitz or a callable, got {workload!r}")
    if not isinstance(workload, Toeplitz) and not callable(workload):
        if jnp.iscomplexobj(workload):
            raise ValueError("workload must be real")
        try:
            w = jnp.asarray(workload, jnp.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"workload must be an (m, n) array, a Toeplitz or a callable, got {workload!r}") from exc
        if w.ndim != 2 or w.shape[1] != n or w.shape[0] < 1:
            raise ValueError(f"workload must have shape (m, n) = (m, {n}) with m >= 1, got {w.shape}")
        if _is_concrete_tree(workload) and not np.isfinite(np.asarray(w)).all():
            raise ValueError("workload must be finite (no NaN/inf)")
        workload = w
    return _workload_error_pure(correlation, workload, n, reduction)


@float64
def sgd_workload(n: int, *, momentum: float = 0.0, learning_rates=None):
    """The ``(n, n)`` workload of SGD with momentum and a learning-rate schedule.

    With velocity ``v_t = momentum * v_{t-1} + g_t`` and parameters ``x_t = x_{t-1} - eta_t v_t``,
    ``x_t - x_0 = -sum_{r<=t} W[t, r] g_r`` with ``W = A diag(eta) M``, ``M`` lower-triangular
    Toeplitz with column ``momentum^k`` and ``A`` the prefix-sum matrix.  ``momentum = 0`` and
    ``eta = 1`` give ``W = A``.  The sign is irrelevant to the error.

    Args:
      n: rounds.
      momentum: in ``[0, 1)``.
      learning_rates: ``(n,)`` positive (default all ones).
    """
    n = _validate.positive_int("n", n)
    beta = float(_validate.nonnegative("momentum", momentum))
    if beta >= 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if learning_rates is None:
        eta = jnp.ones((n,), jnp.float64)
    else:
        eta_np = _validate.positive("learning_rates", learning_rates)
        if eta_np.shape != (n,):
            raise ValueError(f"learning_rates must have shape (n,) = ({n},), got {eta_np.shape}")
        eta = jnp.asarray(eta_np, jnp.float64)
    m = toeplitz_dense(beta ** jnp.arange(n, dtype=jnp.float64))
    return jnp.cumsum(eta[:, None] * m, axis=0)
