"""Monte Carlo accounting of matrix mechanisms under balls-in-bins batching (seed 002).

Public API:

* :class:`BallsInBins` -- ``BallsInBins(C, batches_per_epoch, epochs)`` with ``.delta``,
  ``.epsilon``, ``.certify`` (Estimate-Verify-Release), ``.sensitivity``,
  ``.unamplified_epsilon``.
* Pure jittable core (for calibration / optimisation under ``jit`` and ``grad``):
  :func:`delta_estimate`, :func:`monte_carlo_sums`, :func:`gram_from_columns`,
  :func:`gram_from_dense`, :func:`gram_from_modes`, :func:`modes_from_column`,
  :func:`modes_from_dense`, :func:`gram_sqrt`, :func:`sharded_monte_carlo_sums`.
* Direct ``n``-dimensional reference sampler: :func:`direct_monte_carlo_sums`.

See :mod:`dpjax.montecarlo._core` for the math and the common-random-numbers property.
"""

from dpjax.montecarlo._core import (
    BLOCK_SIZE,
    DEFAULT_CHUNK_NORMALS,
    MonteCarloSums,
    delta_estimate,
    direct_monte_carlo_sums,
    estimate_from_sums,
    gram_from_columns,
    gram_from_dense,
    gram_from_modes,
    gram_sqrt,
    modes_from_column,
    modes_from_dense,
    monte_carlo_sums,
    privacy_losses,
    sharded_monte_carlo_sums,
)
from dpjax.montecarlo._normal import normal_from_bits, normal_pairs_from_bits, uniform_open
from dpjax.montecarlo._accountant import (
    BallsInBins,
    Certificate,
    DeltaEstimate,
    certified_delta,
    gaussian_delta,
    gaussian_epsilon,
    minimum_samples,
)

__all__ = [
    "BallsInBins",
    "Certificate",
    "DeltaEstimate",
    "certified_delta",
    "gaussian_delta",
    "gaussian_epsilon",
    "minimum_samples",
    "BLOCK_SIZE",
    "DEFAULT_CHUNK_NORMALS",
    "MonteCarloSums",
    "delta_estimate",
    "direct_monte_carlo_sums",
    "estimate_from_sums",
    "gram_from_columns",
    "gram_from_dense",
    "gram_from_modes",
    "gram_sqrt",
    "modes_from_column",
    "modes_from_dense",
    "monte_carlo_sums",
    "normal_from_bits",
    "normal_pairs_from_bits",
    "uniform_open",
    "privacy_losses",
    "sharded_monte_carlo_sums",
]

# Differentiable calibration (implemented in dpjax.calibration; imported last: it uses the core).
from dpjax.calibration.montecarlo import calibrated_noise  # noqa: E402

__all__ += ["calibrated_noise"]
