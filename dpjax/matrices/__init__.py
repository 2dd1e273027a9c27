"""Correlation matrices for matrix-factorization mechanisms (docs/design.md §6).

:class:`Toeplitz`, :class:`BLT` (immutable pytrees with ``.column(n)``, ``.dense(n)``,
``.inverse_column(n)``), :func:`prefix_sum_rmse`, and :func:`correlation_array`, the one
dispatch/validation of correlation-matrix input used by the Monte Carlo accountant, the
calibration and the optimisation loss.  All differentiable in the coefficients.
"""

from dpjax.matrices._structured import (
    BLT,
    Toeplitz,
    correlation_array,
    inverse_toeplitz_column,
    inverse_toeplitz_column_recurrence,
    prefix_sum_rmse,
    toeplitz_dense,
)

__all__ = [
    "BLT",
    "Toeplitz",
    "correlation_array",
    "inverse_toeplitz_column",
    "inverse_toeplitz_column_recurrence",
    "prefix_sum_rmse",
    "toeplitz_dense",
]
