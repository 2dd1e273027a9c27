"""Export correlation matrices to jax_privacy and import them back (docs/design.md §6.3).

jax_privacy (an optional extra, imported lazily) represents the strategy matrix ``C`` of a
matrix-factorization mechanism ``A = B C`` either as

* ``jax_privacy.matrix_factorization.buffered_toeplitz.BufferedToeplitz(buf_decay,
  output_scale)``: ``C[0, 0] = 1``, ``c_k = sum_j output_scale_j * buf_decay_j^(k-1)`` for
  ``k >= 1``, buffers sorted by decreasing decay (``BufferedToeplitz.build`` canonicalizes);
  the same convention as :class:`dpjax.matrices.BLT` (``buffer_decays``, ``output_scales``);
* or the first column of a lower-triangular Toeplitz ``C`` (``strategy_coef``, as used by
  ``matrix_factorization.toeplitz``; banded when shorter than ``n``), the same as
  :class:`dpjax.matrices.Toeplitz`'s ``coeffs``.

In both, the noise is added as ``B z = A C^{-1} z`` with the privacy computed for ``C``; dpjax's
noise multiplier for ``C`` applies unchanged (dpjax uses ``c_0 = 1``; jax_privacy's banded
optimiser returns unit-L2-norm coefficients, which :func:`from_jax_privacy` keeps as they are
unless ``normalize=True`` rescales to ``c_0 = 1``: a scaled ``C`` is the same mechanism with the
noise multiplier scaled by the same factor).

Usage::

    from dpjax.optimization import to_jax_privacy, from_jax_privacy
    blt_jp = to_jax_privacy(par.correlation(params))          # a BufferedToeplitz
    coefs = to_jax_privacy(Toeplitz(...), n=2048)             # a float64 array (n,)
    C = from_jax_privacy(blt_jp)                              # a dpjax BLT again
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax.matrices import BLT, Toeplitz

__all__ = ["to_jax_privacy", "from_jax_privacy"]


def _buffered_toeplitz_class():
    try:
        from jax_privacy.matrix_factorization import buffered_toeplitz
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("exporting to jax_privacy needs the optional dependency jax-privacy, the `jax-privacy` "
                          'extra: pip install -e ".[jax-privacy]" in a dpjax checkout (or pip install '
                          '"dpjax[jax-privacy]")') from exc
    return buffered_toeplitz.BufferedToeplitz


def to_jax_privacy(correlation, n: int | None = None, *, parameterization=None):
    """``C`` in jax_privacy's form: a ``BufferedToeplitz`` for a BLT, coefficients for Toeplitz.

    Args:
      correlation: a :class:`~dpjax.matrices.BLT` or :class:`~dpjax.matrices.Toeplitz`, or (with
        ``parameterization``) a parameter pytree of that parameterization.
      n: for Toeplitz, pad/truncate the coefficients to length ``n`` (default: as stored).
      parameterization: optional; ``correlation`` is then its parameters.

    Returns:
      ``BufferedToeplitz`` (float64, canonical decreasing-decay order) or a float64 ``(k,)``
      ``jax.Array`` of Toeplitz coefficients (``strategy_coef``).
    """
    if parameterization is not None:
        correlation = parameterization.correlation(correlation)
        if n is None:
            n = parameterization.n
    if isinstance(correlation, BLT):
        cls = _buffered_toeplitz_class()
        with jax.enable_x64(True):
            return cls.build(buf_decay=np.asarray(correlation.buffer_decays, np.float64),
                             output_scale=np.asarray(correlation.output_scales, np.float64),
                             dtype=jnp.float64)
    if isinstance(correlation, Toeplitz):
        with jax.enable_x64(True):
            if n is None:
                return jnp.asarray(np.asarray(correlation.coeffs, np.float64))
            return correlation.column(_validate.positive_int("n", n))
    raise ValueError("correlation must be a dpjax BLT or Toeplitz (or parameters with "
                     f"parameterization=...), got {type(correlation).__name__}")


def from_jax_privacy(obj, *, normalize: bool = False):
    """A jax_privacy strategy back in dpjax form.

    Args:
      obj: a ``BufferedToeplitz`` (-> :class:`~dpjax.matrices.BLT`; decays must be in (0, 1),
        scales > 0, which dpjax's accountants need) or a 1-D array of Toeplitz coefficients
        (-> :class:`~dpjax.matrices.Toeplitz`; non-negative, ``coef[0] > 0``).
      normalize: divide Toeplitz coefficients by ``coef[0]`` (``c_0 = 1``, dpjax's convention);
        BLTs already have ``c_0 = 1``.

    Raises:
      ValueError: entries outside the ranges above (via the dpjax classes), other types.
    """
    if hasattr(obj, "buf_decay") and hasattr(obj, "output_scale"):
        theta = np.asarray(obj.buf_decay, np.float64).reshape(-1)
        omega = np.asarray(obj.output_scale, np.float64).reshape(-1)
        with jax.enable_x64(True):
            return BLT(buffer_decays=jnp.asarray(theta), output_scales=jnp.asarray(omega))
    if isinstance(obj, (str, bytes)) or obj is None:
        raise ValueError(f"obj must be a BufferedToeplitz or Toeplitz coefficients, got {obj!r}")
    try:
        coef = np.asarray(obj, np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"obj must be a BufferedToeplitz or Toeplitz coefficients, got {type(obj).__name__}") from exc
    if coef.ndim != 1:
        raise ValueError(f"Toeplitz coefficients must be 1-D, got shape {coef.shape}")
    if normalize:
        if coef.size == 0 or not coef[0] > 0:
            raise ValueError("Toeplitz coefficients must have coef[0] > 0 to normalize")
        coef = coef / coef[0]
    with jax.enable_x64(True):
        return Toeplitz(jnp.asarray(coef))
