"""Certification of an optimised ``(C, sigma)``: the ladder of :mod:`dpjax.montecarlo.evr`.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix
mechanisms", §5.2, with the Estimate-Verify-Release bound of Wang et al. 2023 (Thm 9).  The
procedure and its proof live in :func:`dpjax.montecarlo.evr.certify_noise` (calibrate on one
sample, verify a pre-committed ladder of noise multipliers on an independent one, union bound over
the rungs); this module adapts it to correlation-matrix input and returns the certificate as a
JSON-able dict (:class:`~dpjax.optimization.OptimizationResult` stores it as the
:class:`~dpjax.montecarlo.Certificate` record).
"""

from __future__ import annotations

from dpjax import _validate
from dpjax.montecarlo import BallsInBins, evr

__all__ = ["certify_noise", "ladder_base_delta", "ladder_minimum_samples",
           "default_certify_samples", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_GROWTH"]

#: Rungs of the verification ladder (union bound: failure probability x this).
DEFAULT_MAX_ATTEMPTS = evr.DEFAULT_LADDER_RUNGS
#: Ratio between rungs of the Bernoulli-KL ladder.
DEFAULT_GROWTH = evr.DEFAULT_LADDER_GROWTH


def ladder_base_delta(num_samples: int, target_delta: float, attempts: int) -> float | None:
    """Largest ``base_delta`` a ladder of ``attempts`` rungs can verify for ``target_delta``."""
    return evr.base_delta_for_target(num_samples, target_delta, attempts)


def ladder_minimum_samples(target_delta: float, attempts: int) -> int:
    """Fewest samples for which some ``base_delta`` certifies ``target_delta`` with ``attempts`` rungs."""
    return evr.minimum_samples(target_delta, num_tests=attempts)


def default_certify_samples(target_delta: float, attempts: int = DEFAULT_MAX_ATTEMPTS,
                            base_fraction: float = 0.4) -> int:
    """Smallest power of two (>= 2^16) whose ladder ``base_delta >= base_fraction * target``
    (2^23 at ``delta = 1e-5``, 2^20 at ``1e-3`` with the default 8 rungs)."""
    return evr.default_samples(target_delta, attempts, base_fraction)


def certify_noise(correlation, batches_per_epoch: int, epochs: int, *, target_epsilon: float,
                  target_delta: float, num_samples: int | None, key, initial_noise: float | None = None,
                  max_attempts: int = DEFAULT_MAX_ATTEMPTS, growth: float | None = None,
                  calibration_samples: int | None = None, method: str = evr.DEFAULT_METHOD) -> dict:
    """Certified noise multiplier for ``C`` at ``(target_epsilon, target_delta)``.

    :func:`dpjax.montecarlo.evr.certify_noise` on ``BallsInBins(correlation, b, E)`` with
    ``max_attempts`` rungs and ``method`` (``"importance_betting"`` by default,
    ``"bernoulli_kl"``); returns its :class:`~dpjax.montecarlo.Certificate` as a dict
    (``verified``, ``noise_multiplier`` -- ``inf`` if not verified --, ``noise_multiplier_estimate``,
    ``epsilon``, ``delta``, ``base_delta``, ``failure_probability``, ``num_tests``,
    ``num_samples``, ``method``, ``reason``, ...).

    Raises:
      ValueError: ``num_samples`` below what can certify ``target_delta`` (says the minimum).
    """
    acc = BallsInBins(correlation, batches_per_epoch, epochs)
    attempts = _validate.positive_int("max_attempts", max_attempts)
    return evr.certify_noise(acc, target_epsilon=target_epsilon, target_delta=target_delta,
                             num_samples=num_samples, key=key, initial_noise=initial_noise,
                             rungs=attempts, growth=growth, calibration_samples=calibration_samples,
                             method=method).to_dict()
