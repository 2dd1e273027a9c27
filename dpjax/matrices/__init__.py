"""Correlation matrices for matrix-factorization mechanisms (DESIGN.md section 6).

:class:`Toeplitz`, :class:`BLT` (immutable pytrees with ``.column(n)``, ``.dense(n)``,
``.inverse_column(n)``) and :func:`prefix_sum_rmse`.  All differentiable in the coefficients.
"""

from dpjax.matrices._structured import (
    BLT,
    Toeplitz,
    as_first_column,
    inverse_toeplitz_column,
    inverse_toeplitz_column_recurrence,
    prefix_sum_rmse,
    toeplitz_dense,
)

__all__ = [
    "BLT",
    "Toeplitz",
    "as_first_column",
    "inverse_toeplitz_column",
    "inverse_toeplitz_column_recurrence",
    "prefix_sum_rmse",
    "toeplitz_dense",
]
