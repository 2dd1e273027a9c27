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

import dataclasses
import math
from typing import Any

import numpy as np

from dpjax._base import validate as _validate
from dpjax.montecarlo import BallsInBins, evr

__all__ = ["certify_noise", "CertifySettings", "ladder_base_delta", "ladder_minimum_samples",
           "default_certify_samples", "sampler_terms", "SamplerTerms", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_GROWTH"]

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


def _check_key(name: str, key: Any) -> None:
    """An int seed in ``[0, 2**32 - 1]`` or a JAX PRNG key (typed, or raw ``uint32`` data);
    checked without making a key (no JAX work when a record is made)."""
    import jax

    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        _validate.prng_seed(name, key)
        return
    if isinstance(key, jax.Array) and (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
                                       or key.dtype == np.uint32):
        return
    if isinstance(key, np.ndarray) and key.dtype == np.uint32:
        return
    _validate.prng_seed(name, key)  # raises, naming the argument


@dataclasses.dataclass(frozen=True)
class CertifySettings:
    """How a certificate of an optimised ``C`` is computed (Estimate-Verify-Release).

    Used by :func:`certify_noise`, the certify step :func:`dpjax.optimization.certify_result`
    and ``optimize_correlation(..., certify=CertifySettings(...))``.

    Attributes:
      num_samples: verification samples, an integer ``>= 1`` (default ``None``:
        ``"importance_betting"`` sizes it from its calibration sample, between 2^16 and 2^22;
        ``"bernoulli_kl"`` :func:`default_certify_samples`, 2^23 at ``delta = 1e-5``).
      key: int seed in ``[0, 2**32 - 1]`` or JAX key of the certificate's draws (default
        ``None``: for an optimised result, derived from the optimisation's key by a fold the
        optimisation never uses, ``fold_in(key, 2^31 - 1)``, so the draws are independent of
        the optimisation's; :func:`certify_noise` needs it given).
      max_attempts: rungs of the verification ladder, an integer ``>= 1`` (default 8; union
        bound: failure probability times this).
      growth: ratio between rungs, ``> 1`` (default ``None``: the method's, 1.02 for
        ``"bernoulli_kl"``; ``"importance_betting"`` spaces the rungs from its calibration).
      method: ``"importance_betting"`` (default: the variance-reduced certificate,
        docs/design.md §4.2) or ``"bernoulli_kl"`` (plain draws, Hoeffding's bound).
      calibration_samples: draws of the calibration sample, an integer ``>= 1`` (default
        ``None``: the method's, see :func:`dpjax.montecarlo.evr.certify_noise`).

    Example::

        CertifySettings(num_samples=1 << 20, method="bernoulli_kl")

    Raises:
      ValueError: naming the field: a count below 1 or not an integer, ``growth <= 1``, an
        unknown ``method``, a ``key`` that is neither a seed nor a JAX key.
    """

    num_samples: int | None = None
    key: object = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    growth: float | None = None
    method: str = evr.DEFAULT_METHOD
    calibration_samples: int | None = None

    def __post_init__(self):
        def set_(name, value):  # a normalised field of this frozen record
            object.__setattr__(self, name, value)

        if self.num_samples is not None:
            set_("num_samples", _validate.positive_int("num_samples", self.num_samples))
        if self.key is not None:
            _check_key("key", self.key)
        set_("max_attempts", _validate.positive_int("max_attempts", self.max_attempts))
        if self.growth is not None:
            growth = float(_validate.positive("growth", self.growth))
            if not growth > 1.0:
                raise ValueError(f"growth must be > 1, got {self.growth!r}")
            set_("growth", growth)
        set_("method", evr.CertificateMethod.parse(self.method, "method"))
        if self.calibration_samples is not None:
            set_("calibration_samples", _validate.positive_int("calibration_samples", self.calibration_samples))

    def samples_for(self, target_delta: float, certify_delta: float | None = None) -> int | None:
        """The verification sample count for ``target_delta``: ``num_samples``, or for
        ``"bernoulli_kl"`` its default (:func:`default_certify_samples`) -- checked to verify
        ``certify_delta`` (default ``target_delta``) at all; ``None`` for
        ``"importance_betting"`` sized by its calibration.

        Raises:
          ValueError: a ``"bernoulli_kl"`` sample count that cannot verify ``certify_delta``
            (says the minimum).
        """
        if self.method == evr.CertificateMethod.IMPORTANCE_BETTING:
            return self.num_samples
        count = default_certify_samples(target_delta, self.max_attempts) if self.num_samples is None \
            else self.num_samples
        level = target_delta if certify_delta is None else certify_delta
        if ladder_base_delta(count, level, self.max_attempts) is None:
            raise ValueError(
                f"target_delta = {level:g} is below what certify_samples = {count} can "
                f"verify: need certify_samples >= {ladder_minimum_samples(level, self.max_attempts)}")
        return count


def certify_noise(correlation, batches_per_epoch: int, epochs: int, *, target_epsilon: float,
                  target_delta: float, settings: CertifySettings, initial_noise: float | None = None) -> dict:
    """Certified noise multiplier for ``C`` at ``(target_epsilon, target_delta)``.

    :func:`dpjax.montecarlo.evr.certify_noise` on ``BallsInBins(correlation, b, E)`` with the
    ladder, method and samples of ``settings``; returns its
    :class:`~dpjax.montecarlo.Certificate` as a dict (``verified``, ``noise_multiplier`` --
    ``inf`` if not verified --, ``noise_multiplier_estimate``, ``epsilon``, ``delta``,
    ``base_delta``, ``failure_probability``, ``num_tests``, ``num_samples``, ``method``,
    ``reason``, ...).

    Args:
      correlation: ``C`` (:class:`~dpjax.matrices.Toeplitz`, :class:`~dpjax.matrices.BLT`, a
        1-D first column or a dense ``(n, n)`` array; ``n = b * E``).
      batches_per_epoch, epochs: ``b``, ``E`` (integers ``>= 1``).
      target_epsilon, target_delta: the target (``> 0``; ``(0, 1)``).
      settings: :class:`CertifySettings`; its ``key`` is required here.
      initial_noise: the estimate the ladder starts near (default: calibrated afresh).

    Example::

        cert = certify_noise(Toeplitz(jnp.array([1.0, 0.4])), 4, 2, target_epsilon=2.0,
                             target_delta=1e-2, settings=CertifySettings(num_samples=1 << 16, key=3))
        cert["noise_multiplier"], cert["failure_probability"]

    Raises:
      ValueError: ``settings`` not a :class:`CertifySettings` or without a ``key``;
        ``num_samples`` below what can certify ``target_delta`` (says the minimum).
    """
    if not isinstance(settings, CertifySettings):
        raise ValueError(f"settings must be a CertifySettings(...), got {settings!r}")
    if settings.key is None:
        raise ValueError("key: certify_noise needs the key of its draws, CertifySettings(key=...)")
    acc = BallsInBins(correlation, batches_per_epoch, epochs)
    return evr.certify_noise(acc, target_epsilon=target_epsilon, target_delta=target_delta,
                             num_samples=settings.num_samples, key=settings.key, initial_noise=initial_noise,
                             method=settings.method,
                             ladder=evr.Ladder(rungs=settings.max_attempts, growth=settings.growth,
                                               calibration_samples=settings.calibration_samples)).to_dict()


@dataclasses.dataclass(frozen=True)
class SamplerTerms:
    """The training sampler's part of the privacy budget (:func:`sampler_terms`).

    Attributes:
      dataset_size, batch_size: ``N`` and the fixed batch shape ``B`` of the
        :class:`dpjax.sampling.BallsInBinsSampler` the run trains with (``None``: not given, the
        batches are taken as untruncated bins).
      truncation_delta: ``(1 + e^eps) p``, ``p`` bounding the chance that some bin of ``N + 1``
        examples overflows ``B`` (0 when not given).
      certify_delta: ``target_delta - truncation_delta``, the delta the certificate must meet so
        that the sampler's run is ``(target_epsilon, target_delta)``-DP.
    """

    dataset_size: int | None
    batch_size: int | None
    truncation_delta: float
    certify_delta: float


def _smallest_batch_size(dataset_size: int, batches_per_epoch: int, epsilon: float, budget: float) -> int:
    """The smallest ``B`` whose truncation term is at most ``budget`` (the term falls as ``B`` grows)."""
    from dpjax.sampling import balls_in_bins_truncation_delta

    lo, hi = max(1, dataset_size // batches_per_epoch), dataset_size + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if balls_in_bins_truncation_delta(dataset_size, batches_per_epoch, mid, epsilon) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return lo


def sampler_terms(dataset_size, batch_size, batches_per_epoch, target_epsilon, target_delta) -> SamplerTerms:
    """Split ``target_delta`` between truncation of the training batches and the certificate.

    The trained batches come from :class:`dpjax.sampling.BallsInBinsSampler` ``(N, b, E, B)``:
    each bin is padded or truncated to the fixed shape ``B``.  The truncating mechanism differs
    from the accounted one only where some bin overflows, so a certificate of
    ``(eps, target_delta - t)`` for the untruncated batches makes the run
    ``(eps, target_delta)``-DP, ``t = (1 + e^eps) p`` (docs/design.md §7;
    :func:`dpjax.sampling.balls_in_bins_truncation_delta`).  Without ``N`` and ``B`` (both
    ``None``) nothing is subtracted: the certificate then holds for untruncated bins.

    Raises:
      ValueError: only one of ``dataset_size`` / ``batch_size`` given, either not an integer
        >= 1, or a ``batch_size`` whose truncation term leaves no delta to certify (says the
        smallest ``batch_size`` that spends at most 1% of ``target_delta`` on truncation).
    """
    target = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, delta = float(target.epsilon), float(target.delta)
    if dataset_size is None and batch_size is None:
        return SamplerTerms(None, None, 0.0, delta)
    if dataset_size is None or batch_size is None:
        given = "dataset_size" if batch_size is None else "batch_size"
        raise ValueError(f"dataset_size and batch_size go together (the training sampler's N and its fixed batch "
                         f"shape B): give both or neither, got only {given}")
    from dpjax.sampling import balls_in_bins_truncation_delta

    n = _validate.positive_int("dataset_size", dataset_size)
    bs = _validate.positive_int("batch_size", batch_size)
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    trunc = balls_in_bins_truncation_delta(n, b, bs, eps)
    # Half the budget at most: a certificate for less than half of delta would cost far more
    # noise than the few examples a larger batch shape pads.
    if not trunc <= 0.5 * delta:
        good = _smallest_batch_size(n, b, eps, 0.01 * delta)
        raise ValueError(f"batch_size = {bs} truncates too often: the truncation term {trunc:.3g} (bins of mean "
                         f"dataset_size / batches_per_epoch = {n / b:.6g}) exceeds half of target_delta = {delta:g}; "
                         f"batch_size must be >= {_smallest_batch_size(n, b, eps, 0.5 * delta)} "
                         f"({good} spends at most 1% of target_delta)")
    certify_delta = delta - trunc
    # Rounded down where needed, so that the certificate's delta plus the term stays within delta
    # in floating point too.
    while certify_delta + trunc > delta:
        certify_delta = math.nextafter(certify_delta, 0.0)
    return SamplerTerms(n, bs, float(trunc), float(certify_delta))
