"""Optimising correlation matrices through the calibrated noise (docs/design.md §6; Choquette-Choo et al. 2024, §4.2).

* :func:`toeplitz_from_params` -- unconstrained parameters -> non-negative banded Toeplitz ``C``.
* :func:`log_rmse_balls_in_bins` -- the objective ``log(sigma*(C) |A C^{-1}|_F / sqrt(n))``
  with ``sigma*(C)`` calibrated on the balls-in-bins Monte Carlo estimate (implicit gradient).
* :func:`fit` -- a few optax steps on any such loss (a jitted ``value_and_grad`` step).
"""

from dpjax.optimization.loss import fit, log_rmse_balls_in_bins, toeplitz_from_params

__all__ = ["fit", "log_rmse_balls_in_bins", "toeplitz_from_params"]
