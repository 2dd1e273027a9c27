"""Optimising correlation matrices through the calibrated noise (docs/design.md §6; Choquette-Choo et al. 2024, §4.2).

* :func:`toeplitz_from_params` -- unconstrained parameters -> non-negative banded Toeplitz ``C``.
* :func:`log_rmse_balls_in_bins` -- the objective ``log(sigma*(C) |A C^{-1}|_F / sqrt(n))``
  with ``sigma*(C)`` calibrated on the balls-in-bins Monte Carlo estimate (implicit gradient).
* :func:`fit` -- a few optax steps on any such loss (a jitted ``value_and_grad`` step).
* :mod:`~dpjax.optimization.parameterizations` -- Toeplitz, banded, BLT and dense families of
  ``C`` (static config + unconstrained parameter pytree), :func:`make_parameterization`.
* :func:`optimize_correlation` -- the loop (Newton in-loop calibration, one compiled step,
  checkpoints, resume, certification); :class:`OptimizationResult`.  Its records:
  :class:`CorrelationProblem` (target, scheme ``dpjax.BallsInBins(b)`` with epochs,
  ``dpjax.BMinSepSampling(min_sep, sampling_prob, num_rounds)`` or
  ``dpjax.RandomAllocation(t, selections_per_epoch=k)`` with epochs, objective, training sampler),
  :class:`OptimizerSettings` (steps, optax optimizer, in-loop samples, solver, key),
  :class:`Checkpoint` (path, every, resume), :class:`CertifySettings`.
* :func:`certify_result` -- the certify step of an optimised result;
  :func:`certify_noise` -- Estimate-Verify-Release certificate of a ``C``.
* :mod:`~dpjax.optimization.objectives` -- :func:`prefix_sum_error`, :func:`max_error`,
  :func:`workload_error` (noise-free; multiply by ``sigma``), O(n log n) for Toeplitz/BLT.
* :mod:`~dpjax.optimization.export` -- :func:`to_jax_privacy` / :func:`from_jax_privacy`
  (``BufferedToeplitz`` for BLT, Toeplitz coefficients); jax_privacy imported lazily
  (``pip install -e ".[jax-privacy]"``).
* :func:`training_setup` -- a result (or its file) as the training loop's sampler, streaming
  noise and optax update (:class:`TrainingSetup`).
"""

from dpjax.optimization.certify import CertifySettings, certify_noise, default_certify_samples
from dpjax.optimization.export import from_jax_privacy, to_jax_privacy
from dpjax.optimization.loop import OptimizationResult, certify_result, default_optimizer, optimize_correlation
from dpjax.optimization.loss import fit, log_rmse_balls_in_bins, toeplitz_from_params
from dpjax.optimization.problem import Checkpoint, CorrelationProblem, OptimizerSettings
from dpjax.optimization.objectives import (max_error, prefix_sum_error, sgd_workload,
                                           workload_error)
from dpjax.optimization.training import TrainingSetup, training_setup
from dpjax.optimization.parameterizations import (BandedToeplitzParameterization,
                                                  BLTParameterization, DenseParameterization,
                                                  ToeplitzParameterization, make_parameterization,
                                                  params_from_list, params_to_list,
                                                  unamplified_loss, unamplified_sensitivity)

__all__ = ["fit", "log_rmse_balls_in_bins", "toeplitz_from_params"]
__all__ += [
    "max_error", "prefix_sum_error", "sgd_workload", "workload_error",
    "BandedToeplitzParameterization", "BLTParameterization", "DenseParameterization",
    "ToeplitzParameterization", "make_parameterization", "params_from_list", "params_to_list",
    "unamplified_loss", "unamplified_sensitivity", "from_jax_privacy", "to_jax_privacy",
]
__all__ += ["OptimizationResult", "optimize_correlation", "default_optimizer", "certify_noise",
            "default_certify_samples", "TrainingSetup", "training_setup", "CorrelationProblem",
            "OptimizerSettings", "Checkpoint", "CertifySettings", "certify_result"]
