"""Structured lower-triangular correlation matrices (docs/design.md §6).

* :class:`Toeplitz` -- ``C[i, j] = c[i - j]`` for ``i >= j`` (0 above the diagonal), from the
  first column ``c`` (shorter than ``n``: zero-padded, i.e. banded).
* :class:`BLT` -- buffered linear Toeplitz (Dvijotham et al. 2024; McMahan et al. 2024):
  ``c_0 = 1``, ``c_k = sum_j omega_j * theta_j^(k-1)`` for ``k >= 1``.

Convention: ``c[0] = 1``.  A matrix mechanism releases ``C x + z``; scaling ``C`` by ``a`` is the
same mechanism with noise multiplier ``sigma / a``, so fixing the diagonal to 1 loses nothing and
makes ``sigma`` the noise per round.  :class:`Toeplitz` accepts any ``c[0] > 0`` (the inverse
needs it non-zero); the accountants use ``C`` as given.

Both are immutable pytrees (``jax.tree_util.register_dataclass``): their coefficient arrays are
leaves, so ``jax.grad`` w.r.t. a ``Toeplitz`` / ``BLT`` (or its arrays) works through
:meth:`column`, :meth:`inverse_column`, :func:`prefix_sum_rmse` and the Monte Carlo Gram matrix.
Validation (non-negative, finite, ranges) runs only on concrete values, never under ``jit``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64


def _is_concrete(x) -> bool:
    if isinstance(x, jax.core.Tracer):
        return False
    return isinstance(x, (np.ndarray, jax.Array, list, tuple, float, int, np.floating))


def check_1d_nonnegative(name: str, value, *, allow_empty=False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite, non-negative 1-D array (non-empty unless
    ``allow_empty``); ``name`` is the argument name in the message."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 1 or (arr.size == 0 and not allow_empty):
        raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
    if np.isnan(arr).any() or np.isinf(arr).any():
        raise ValueError(f"{name} must be finite (no NaN/inf), got {value!r}")
    if (arr < 0).any():
        raise ValueError(f"{name} must be non-negative (a non-negative correlation matrix), got {value!r}")


@functools.partial(jax.jit, static_argnums=1)
def _pad_or_truncate(c, n: int):
    k = c.shape[0]
    return jnp.pad(c, (0, n - k)) if k < n else c[:n]


@jax.jit
def toeplitz_dense(column):
    """Dense ``(n, n)`` lower-triangular Toeplitz matrix with first column ``column`` ``(n,)``."""
    n = column.shape[0]
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    return jnp.where(i >= j, jnp.take(column, jnp.clip(i - j, 0, n - 1)), 0.0)


def _next_pow2(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def truncated_product(a, b, length: int):
    """First ``length`` coefficients of the power-series product ``a * b`` (FFT convolution)."""
    size = _next_pow2(a.shape[0] + b.shape[0] - 1)
    prod = jnp.fft.irfft(jnp.fft.rfft(a, size) * jnp.fft.rfft(b, size), size)
    return prod[:length]


@jax.jit
def inverse_toeplitz_column(column):
    """First column of ``C^{-1}`` for lower-triangular Toeplitz ``C`` with first column ``column``.

    ``C^{-1}`` is again lower-triangular Toeplitz; its column ``v`` is the power-series inverse
    ``v(x) = 1 / c(x) mod x^n``.  Newton's iteration ``v <- v (2 - c v) mod x^(2k)`` doubles the
    number of correct coefficients per step (quadratic convergence of Newton's method for the
    reciprocal), so ``ceil(log2 n)`` steps of FFT products: O(n log n), never a dense inverse,
    differentiable.  ``column[0]`` must be non-zero.  Shape ``(n,) -> (n,)``.
    """
    c = jnp.asarray(column, jnp.float64)
    n = c.shape[0]
    v = jnp.reshape(1.0 / c[0], (1,))
    k = 1
    while k < n:
        k2 = min(2 * k, n)
        cv = truncated_product(c[:k2], v, k2)
        correction = truncated_product(v, cv, k2)
        v = 2.0 * jnp.pad(v, (0, k2 - v.shape[0])) - correction
        k = k2
    return v


def inverse_toeplitz_column_recurrence(column):
    """Reference O(n^2) forward substitution ``v_k = -(sum_{j=1..k} c_j v_{k-j}) / c_0`` (NumPy)."""
    c = np.asarray(column, dtype=np.float64)
    n = c.size
    v = np.zeros(n)
    v[0] = 1.0 / c[0]
    for k in range(1, n):
        v[k] = -np.dot(c[1 : k + 1], v[k - 1 :: -1][:k]) / c[0]
    return v


class _LowerTriangularToeplitz:
    """What every lower-triangular Toeplitz matrix derives from its first column ``column(n)``."""

    @float64
    def dense(self, n: int):
        """Dense ``(n, n)`` matrix."""
        return toeplitz_dense(self.column(n))

    @float64
    def inverse_column(self, n: int):
        """First column of ``C^{-1}`` (``(n,)``), O(n log n); see :func:`inverse_toeplitz_column`."""
        return inverse_toeplitz_column(self.column(n))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Toeplitz(_LowerTriangularToeplitz):
    """Lower-triangular Toeplitz correlation matrix ``C[i, j] = coeffs[i - j]`` (``i >= j``).

    Attributes:
      coeffs: ``(k,)`` non-negative first-column coefficients, ``coeffs[0] = 1`` by convention
        (see module docstring).  ``k < n`` means a banded matrix (zeros below band ``k``).

    Example::

        C = Toeplitz(jnp.array([1.0, 0.5, 0.25]))
        C.dense(4)            # (4, 4)
        C.inverse_column(4)   # first column of C^{-1}
        prefix_sum_rmse(C, noise_multiplier=1.0, n=256)
    """

    coeffs: jax.Array

    def __post_init__(self):
        if _is_concrete(self.coeffs):
            check_1d_nonnegative("coeffs", self.coeffs)
            if float(np.asarray(self.coeffs, dtype=np.float64)[0]) <= 0:
                raise ValueError(f"coeffs[0] must be > 0 (the diagonal of C; convention 1), got {self.coeffs!r}")

    @float64
    def column(self, n: int):
        """First column, ``(n,)`` (zero-padded or truncated)."""
        return _pad_or_truncate(jnp.asarray(self.coeffs, jnp.float64), n)



@functools.partial(jax.jit, static_argnums=2)
def _blt_column(theta, omega, n: int):
    powers = jnp.arange(max(n - 1, 0), dtype=jnp.float64)
    # theta^k via exp(k log theta): smooth in theta, no 0^0 issue since theta > 0.
    tail = jnp.exp(powers[:, None] * jnp.log(theta)[None, :]) @ omega
    return jnp.concatenate([jnp.ones((1,), jnp.float64), tail])[:n]


@jax.jit
def _dense_prefix_sum_rmse(c, noise_multiplier):
    size = c.shape[0]
    ones = jnp.tril(jnp.ones((size, size), jnp.float64))
    # X = A C^{-1}  <=>  C^T X^T = A^T (upper-triangular solve).
    x_t = jax.scipy.linalg.solve_triangular(c.T, ones.T, lower=False)
    return noise_multiplier * jnp.sqrt(jnp.sum(x_t * x_t) / size)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BLT(_LowerTriangularToeplitz):
    """Buffered linear Toeplitz matrix: ``c_0 = 1``, ``c_k = sum_j omega_j theta_j^(k-1)``.

    Attributes:
      buffer_decays: ``theta``, ``(d,)`` in ``(0, 1)``.
      output_scales: ``omega``, ``(d,)``, ``> 0``.

    ``C`` is lower-triangular Toeplitz with that first column (docs/design.md §6); its
    inverse is again Toeplitz (a BLT), computed here from the column.

    Example::

        C = BLT(buffer_decays=jnp.array([0.9, 0.5]), output_scales=jnp.array([0.3, 0.2]))
        C.column(5)   # [1, 0.5, 0.37, ...]
    """

    buffer_decays: jax.Array
    output_scales: jax.Array

    def __post_init__(self):
        if _is_concrete(self.buffer_decays) and _is_concrete(self.output_scales):
            theta = np.asarray(self.buffer_decays, dtype=np.float64)
            omega = np.asarray(self.output_scales, dtype=np.float64)
            if theta.ndim != 1 or theta.size == 0:
                raise ValueError(f"buffer_decays must be a non-empty 1-D array, got shape {theta.shape}")
            if omega.shape != theta.shape:
                raise ValueError(
                    f"output_scales must have the shape of buffer_decays {theta.shape}, got {omega.shape}")
            if np.isnan(theta).any() or ((theta <= 0) | (theta >= 1)).any():
                raise ValueError(f"buffer_decays must be in (0, 1), got {self.buffer_decays!r}")
            if np.isnan(omega).any() or np.isinf(omega).any() or (omega <= 0).any():
                raise ValueError(f"output_scales must be finite and > 0, got {self.output_scales!r}")

    @float64
    def column(self, n: int):
        """First column ``(n,)``: ``[1, sum omega, sum omega theta, sum omega theta^2, ...]``."""
        return _blt_column(jnp.asarray(self.buffer_decays, jnp.float64),
                           jnp.asarray(self.output_scales, jnp.float64), n)



@jax.jit
def _prefix_sum_rmse_from_inverse_column(inv_column, noise_multiplier):
    n = inv_column.shape[0]
    # A C^{-1} is lower-triangular Toeplitz with column w = cumsum(v); entry w_k appears on
    # n - k positions of the k-th subdiagonal, so |A C^{-1}|_F^2 = sum_k (n - k) w_k^2.
    w = jnp.cumsum(inv_column)
    frob_sq = jnp.sum((n - jnp.arange(n)) * w * w)
    return noise_multiplier * jnp.sqrt(frob_sq / n)


@float64
def prefix_sum_rmse(correlation, noise_multiplier, n: int | None = None):
    """RMSE of the prefix-sum workload: ``sigma * |A C^{-1}|_F / sqrt(n)`` (docs/design.md §6).

    Args:
      correlation: a :class:`Toeplitz` or :class:`BLT` (then ``n`` is required; O(n log n)),
        or a dense ``(n, n)`` lower-triangular array (triangular solve, O(n^3)).
      noise_multiplier: ``sigma`` (scalar; may be traced).
      n: number of rounds for structured matrices.

    ``A`` is the lower-triangular all-ones matrix.  Differentiable in the coefficients and
    ``sigma``.  Example: ``prefix_sum_rmse(Toeplitz(jnp.ones(1)), 1.0, 4)`` is
    ``sqrt((1+2+3+4)/4)``, the identity's error.
    """
    if _is_concrete(noise_multiplier):
        # A traced sigma (grad/vmap) is the caller's; a concrete one must be a valid noise scale
        # (a negative sigma gave a negative RMSE).
        _validate.positive("noise_multiplier", noise_multiplier)
    if _is_concrete(correlation) and np.iscomplexobj(np.asarray(correlation)):
        raise ValueError("correlation must be real (a non-negative lower-triangular matrix), got a complex array")
    if isinstance(correlation, (Toeplitz, BLT)):
        if n is None:
            raise ValueError("n must be given for a structured (Toeplitz/BLT) correlation matrix")
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return _prefix_sum_rmse_from_inverse_column(correlation.inverse_column(int(n)),
                                                    jnp.asarray(noise_multiplier, jnp.float64))
    c = jnp.asarray(correlation, jnp.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"correlation must be a square (n, n) array, got shape {c.shape}")
    if n is not None and n != c.shape[0]:
        raise ValueError(f"n must equal the size of the correlation matrix {c.shape[0]}, got {n}")
    if _is_concrete(correlation):
        arr = np.asarray(correlation, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ValueError("correlation must be finite (no NaN/inf entries)")
        if np.triu(arr, 1).any():
            raise ValueError("correlation must be lower triangular (zero above the diagonal)")
        if (np.diagonal(arr) == 0).any():
            raise ValueError("correlation must have a non-zero diagonal (C must be invertible)")
    return _dense_prefix_sum_rmse(c, jnp.asarray(noise_multiplier, jnp.float64))


@float64
def correlation_array(correlation, n: int, *, name: str = "correlation"):
    """The one dispatch and validation of correlation-matrix input ``C`` (``n`` rounds).

    Every consumer of a correlation matrix (the Monte Carlo accountant, the calibration, the
    optimisation loss) goes through this function, so all accept the same inputs with the same
    rules:

    * :class:`Toeplitz` / :class:`BLT` -> their first column, ``(n,)`` (validated by the class);
    * a 1-D array -> a Toeplitz first column, zero-padded to ``n`` (banded) or truncated;
    * a 2-D array -> a dense ``(n, n)`` matrix.

    Returns a float64 array: ``ndim == 1`` means "Toeplitz with this first column", ``ndim == 2``
    "dense".  Differentiable in the input (the column / matrix is passed through).

    Raises:
      ValueError (naming ``name`` and the valid range): complex entries; wrong shape (a dense
        matrix must be ``(n, n)``); and, for concrete (non-traced) values, NaN/inf, negative
        entries, or non-zero entries above the diagonal.  Traced values are checked for shape
        and dtype only (their values are unknown at trace time).
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (number of rounds) must be an integer >= 1, got {n!r}")
    if isinstance(correlation, (Toeplitz, BLT)):
        return correlation.column(int(n))
    if isinstance(correlation, (str, bytes)) or correlation is None:
        raise ValueError(f"{name} must be a Toeplitz/BLT matrix or a real array, got {correlation!r}")
    if jnp.iscomplexobj(correlation):
        raise ValueError(f"{name} must be real (a non-negative lower-triangular matrix), got a complex array")
    try:
        arr = jnp.asarray(correlation, jnp.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a Toeplitz/BLT matrix or a real array, got {correlation!r}") from exc
    if arr.ndim == 1:
        if arr.shape[0] == 0:
            raise ValueError(f"{name} (a Toeplitz first column) must be non-empty")
    elif arr.ndim == 2:
        if arr.shape != (n, n):
            raise ValueError(
                f"{name} must be a square (n, n) = ({n}, {n}) matrix (n = batches_per_epoch * "
                f"epochs), got shape {arr.shape}")
    else:
        raise ValueError(f"{name} must be 1-D (a Toeplitz first column) or 2-D (n, n), got shape {arr.shape}")
    if _is_concrete(correlation):
        host = np.asarray(arr)
        if not np.isfinite(host).all():
            raise ValueError(f"{name} must be finite (no NaN/inf entries)")
        if (host < 0).any():
            raise ValueError(f"{name} must be non-negative (entries >= 0), min entry {host.min():.3g}")
        if host.ndim == 2 and np.triu(host, 1).any():
            raise ValueError(f"{name} must be lower triangular (zero above the diagonal)")
        if host.ndim == 1:  # on the host: no compile of the jitted pad on a first call
            return np.pad(host, (0, max(int(n) - host.shape[0], 0)))[: int(n)]
    return _pad_or_truncate(arr, int(n)) if arr.ndim == 1 else arr
