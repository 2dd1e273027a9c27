"""Monte Carlo accounting of matrix mechanisms under balls-in-bins batching (seed 002).

Public API:

* :class:`BallsInBins` -- ``BallsInBins(C, batches_per_epoch, epochs)`` with ``.delta``
  (estimate, standard error), ``.estimate`` (both directions, :class:`DeltaEstimate`),
  ``.epsilon`` (eps_hat(delta)), ``.certify`` (Estimate-Verify-Release, :class:`Certificate`),
  ``.sensitivity``, ``.unamplified_delta`` / ``.unamplified_epsilon`` (no-amplification
  Gaussian baseline).  :func:`minimum_samples`, :func:`certified_delta` for EVR planning;
  :func:`gaussian_delta` / :func:`gaussian_epsilon`.

Example::

    import numpy as np
    from dpjax.matrices import Toeplitz
    from dpjax.montecarlo import BallsInBins

    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), batches_per_epoch=32, epochs=8)
    delta, se = acc.delta(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 20, key=0)
    cert = acc.certify(2.0, epsilon=4.0, target_delta=1e-3, num_samples=1 << 20, key=1)
    cert.verified, cert.delta, cert.failure_probability

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

__all__ += ["calibrated_noise"]


def __getattr__(name):
    # Differentiable calibration, implemented in dpjax.calibration.montecarlo (which imports this
    # package's core): resolved lazily (PEP 562) so that neither package imports the other at
    # import time -- no circular import whichever is imported first.
    if name == "calibrated_noise":
        from dpjax.calibration.montecarlo import calibrated_noise

        return calibrated_noise
    raise AttributeError(f"module 'dpjax.montecarlo' has no attribute {name!r}")
