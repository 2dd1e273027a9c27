"""Monte Carlo accounting of matrix mechanisms under balls-in-bins, b-min-sep and random-allocation batching.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near Exact Privacy Amplification for Matrix
Mechanisms" (2024).  Layering: :mod:`dpjax.pld`, :mod:`dpjax.matrices` -> this package ->
:mod:`dpjax.calibration` -> :mod:`dpjax.optimization`; nothing here imports the calibration or
optimization layers, not even inside a function.  The solvers that ``BallsInBins.calibrate``
and Estimate-Verify-Release need live in :mod:`dpjax.montecarlo.calibrate` (their public
import path is :mod:`dpjax.calibration`).

Public API:

* :class:`BallsInBins` -- ``BallsInBins(C, batches_per_epoch, epochs)`` with ``.delta``
  (estimate, standard error), ``.estimate`` (both directions, :class:`DeltaEstimate`),
  ``.epsilon`` (eps_hat(delta)), ``.certify`` (Estimate-Verify-Release, :class:`Certificate`),
  ``.calibrate`` (a convenience call into :func:`dpjax.calibration.calibrate_accountant`),
  ``.sensitivity``, ``.unamplified_delta`` / ``.unamplified_epsilon`` (no-amplification
  Gaussian baseline, :func:`dpjax.pld.gaussian_delta`).  :func:`evr_minimum_samples`,
  :func:`certified_delta` for Estimate-Verify-Release planning; :mod:`dpjax.montecarlo.evr`, the
  one Estimate-Verify-Release module (the :class:`Certificate` record, the ladder
  :func:`~dpjax.montecarlo.evr.certify_noise`).

Example::

    import numpy as np
    from dpjax.matrices import Toeplitz
    from dpjax.montecarlo import BallsInBins

    acc = BallsInBins(Toeplitz(np.array([1.0, 0.5, 0.25])), batches_per_epoch=32, epochs=8)
    delta, se = acc.delta(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 20, key=0)
    cert = acc.certify(2.0, epsilon=4.0, target_delta=1e-3, num_samples=1 << 20, key=1)
    cert.verified, cert.delta, cert.failure_probability

* Public pure, jittable core (:mod:`dpjax.montecarlo.core`; the calibration and optimisation
  layers build on it): draws (:func:`draws`), privacy losses (:func:`privacy_losses`,
  :func:`privacy_losses_from_projections`), estimators (:func:`delta_estimate`,
  :func:`delta_from_projections`, :func:`monte_carlo_sums`, :func:`sharded_monte_carlo_sums`,
  :func:`estimate_from_sums`), Gram matrices (:func:`gram_matrix`, :func:`gram_from_columns`,
  :func:`gram_from_dense`, :func:`gram_from_modes`, :func:`modes_from_column`,
  :func:`modes_from_dense`, :func:`gram_sqrt`), keys (:func:`as_prng_key`, :func:`rbg_key`).
* Direct ``n``-dimensional reference sampler: :func:`direct_monte_carlo_sums`.
* b-min-sep sampling (Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep
  Subsampling", arXiv 2602.09338): :class:`BMinSep` ``(C, sampling_prob, min_sep, num_rounds)``
  for banded ``C`` (at most ``min_sep`` bands) with ``.estimate`` (:class:`DeltaEstimate`),
  ``.delta``, ``.privacy_losses``; the pure jitted functions (likelihood ratio by the forward
  recursion, loss samples, delta sums) live in :mod:`dpjax.montecarlo.bminsep`.
* Random allocation (Feldman & Shenfeld, "Privacy amplification by random allocation"; each
  example in ``k`` of the ``t`` rounds of every epoch, re-drawn each epoch):
  :class:`RandomAllocation` ``(C, batches_per_epoch, epochs, selections_per_epoch=k)`` for banded
  ``C`` (at most ``allocation.MAX_BANDS`` bands), the same methods as :class:`BMinSep`; the exact
  likelihood ratio (a forward algorithm over the last participations and the epoch's count) and
  the pure jitted functions live in :mod:`dpjax.montecarlo.allocation`.

The differentiable calibration of the noise multiplier lives in the calibration layer:
:func:`dpjax.calibration.calibrated_noise` (it is not re-exported here).

Devices: every estimate, calibration and certificate spreads its samples over ``jax.devices()``
(every device of every process after ``jax.distributed.initialize()``; ``devices=`` takes a
subset) and adds the per-chunk sums in one order, so its numbers are the same bits on one device,
on several, or on several processes (docs/design.md §14, docs/multi_process.md).
"""

from dpjax.montecarlo.core import (
    BLOCK_SIZE,
    DEFAULT_CHUNK_NORMALS,
    MonteCarloSums,
    as_prng_key,
    delta_estimate,
    delta_from_projections,
    direct_monte_carlo_sums,
    draws,
    estimate_from_sums,
    gram_from_columns,
    gram_from_dense,
    gram_from_modes,
    gram_matrix,
    gram_sqrt,
    modes_from_column,
    modes_from_dense,
    monte_carlo_sums,
    privacy_losses,
    privacy_losses_from_projections,
    rbg_key,
    sharded_monte_carlo_sums,
)
from dpjax.montecarlo._normal import normal_from_bits, normal_pairs_from_bits, uniform_open
from dpjax.montecarlo import evr
from dpjax.montecarlo import bminsep
from dpjax.montecarlo._accountant import (
    BallsInBins,
    Certificate,
    DeltaEstimate,
    EpsilonEstimate,
    certified_delta,
    evr_minimum_samples,
)
from dpjax.montecarlo.bminsep import BMinSep
from dpjax.montecarlo import allocation
from dpjax.montecarlo.allocation import RandomAllocation

__all__ = [
    "BallsInBins",
    "BMinSep",
    "bminsep",
    "RandomAllocation",
    "allocation",
    "Certificate",
    "DeltaEstimate",
    "EpsilonEstimate",
    "certified_delta",
    "evr_minimum_samples",
    "evr",
    "BLOCK_SIZE",
    "DEFAULT_CHUNK_NORMALS",
    "MonteCarloSums",
    "as_prng_key",
    "delta_estimate",
    "delta_from_projections",
    "direct_monte_carlo_sums",
    "draws",
    "estimate_from_sums",
    "gram_from_columns",
    "gram_from_dense",
    "gram_from_modes",
    "gram_matrix",
    "gram_sqrt",
    "modes_from_column",
    "modes_from_dense",
    "monte_carlo_sums",
    "normal_from_bits",
    "normal_pairs_from_bits",
    "privacy_losses",
    "privacy_losses_from_projections",
    "rbg_key",
    "sharded_monte_carlo_sums",
    "uniform_open",
]
