"""From an optimised correlation matrix to a training loop: the sampler, the noise, the update.

:func:`training_setup` turns an :class:`~dpjax.optimization.OptimizationResult` (or the file
``dpjax optimize`` saved) into what a training loop needs to run the mechanism that was
certified:

* the batches: :class:`dpjax.sampling.BallsInBinsSampler` with the result's ``b`` and ``E`` and
  the training set's size ``N`` and fixed batch shape ``B`` (the ones the result was certified
  for, when it records them), or for a b-min-sep result (``result.sampling``)
  :class:`dpjax.sampling.BMinSepSampler` ``(N, p, min_sep, n, B)``;
* the noise: the streaming generator of ``C^{-1} z`` for the result's ``C``
  (:func:`dpjax.noise.streaming_noise`);
* the update: :func:`dpjax.noise.correlated_noise_aggregate`, an optax transformation that clips
  each example's gradient, sums, adds the correlated noise at the certified noise multiplier and
  divides by ``B``; chain an optimiser after it;
* the guarantee: ``(epsilon, delta)`` of that run, the certificate's delta plus the truncation
  term of the sampler (docs/design.md §7), at most the result's target when the result was
  certified for this sampler (``dpjax optimize --dataset-size N --batch-size B``).

Usage::

    setup = dpjax.optimization.training_setup("result.json", seed=0)
    tx = optax.chain(setup.transform, optax.sgd(0.5, momentum=0.9))
    state = tx.init(params)
    for indices, mask in setup.sampler:
        grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x[indices], y[indices])
        updates, state = tx.update(grads, state, params, mask=mask)
        params = optax.apply_updates(params, updates)
    setup.epsilon, setup.delta        # the certified guarantee of this run
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dpjax._base import validate as _validate

__all__ = ["TrainingSetup", "training_setup"]


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """What :func:`training_setup` returns: the training-side objects of one certified result.

    Attributes:
      sampler: the :class:`dpjax.sampling.BallsInBinsSampler` ``(N, b, E, B, seed)``, or the
        :class:`dpjax.sampling.BMinSepSampler` ``(N, p, min_sep, n, B, seed)`` of a b-min-sep
        result.
      noise: the :class:`dpjax.noise.StreamingNoise` of ``C^{-1} z``.
      transform: :func:`dpjax.noise.correlated_noise_aggregate` at the certified sigma
        (``optax.GradientTransformationExtraArgs``; ``update(per_example_grads, state, params,
        mask=mask)``).
      correlation: ``C`` (:class:`dpjax.matrices.BLT` or :class:`~dpjax.matrices.Toeplitz`).
      noise_multiplier: the certified sigma.
      clip_norm: the clipping norm the transform uses (noise std ``sigma * clip_norm``).
      epsilon, delta: the run's certified guarantee: ``delta`` is the certificate's delta plus
        ``truncation_delta``.
      truncation_delta: the delta of truncating the sampler's bins to ``B``.
      certified_for_sampler: whether the result's certificate already subtracted this sampler's
        truncation term (then ``delta <= target_delta`` of the result).
    """

    sampler: Any
    noise: Any
    transform: Any
    correlation: Any
    noise_multiplier: float
    clip_norm: float
    epsilon: float
    delta: float
    truncation_delta: float
    certified_for_sampler: bool


def _load(result):
    from dpjax.optimization.loop import OptimizationResult

    if isinstance(result, OptimizationResult):
        return result
    if isinstance(result, (str, os.PathLike)):
        return OptimizationResult.load(result)
    raise ValueError(f"result must be an OptimizationResult or the path of its JSON file, got {type(result).__name__}")


def _sizes(res, dataset_size, batch_size) -> tuple[int, int]:
    """``N`` and ``B``: the result's, or the caller's where the result has none (both then)."""
    given = {"dataset_size": dataset_size, "batch_size": batch_size}
    stored = {"dataset_size": res.dataset_size, "batch_size": res.batch_size}
    out = {}
    for name in given:
        if given[name] is not None:
            value = _validate.positive_int(name, given[name])
            if stored[name] is not None and value != stored[name]:
                raise ValueError(f"{name} = {value} differs from the {stored[name]} the result was certified for; "
                                 f"train with {name} = {stored[name]} or certify again for {value}")
            out[name] = value
        elif stored[name] is not None:
            out[name] = stored[name]
        else:
            raise ValueError(f"{name} is needed: the result records no training sampler (it was certified for "
                             "untruncated bins); give dataset_size and batch_size, the delta of truncation is then "
                             "added to the certificate's")
    return out["dataset_size"], out["batch_size"]


def training_setup(result, *, dataset_size: int | None = None, batch_size: int | None = None,
                   clip_norm: float = 1.0, seed: int = 0) -> TrainingSetup:
    """The sampler, the streaming noise and the optax update of a certified optimisation result.

    Args:
      result: an :class:`~dpjax.optimization.OptimizationResult` or the path of its JSON file
        (``dpjax optimize --out``), with a verified certificate.
      dataset_size, batch_size: ``N`` and the fixed batch shape ``B``; default the ones the
        result was certified for (``CorrelationProblem(dataset_size=, batch_size=)``), which
        they must equal when both are known.  For a result certified without a sampler they are
        required, and the returned ``delta`` is the certificate's plus the truncation term
        (possibly above the result's target).
      clip_norm: > 0, the L2 clipping norm of each example's gradient.
      seed: an integer in ``[0, 2**32 - 1]``: the sampler's schedule and, through a fold of it,
        the Gaussian draws.

    Returns:
      :class:`TrainingSetup`.

    Raises:
      ValueError: a result without a verified certificate, a random-allocation result (dpjax
        has no sampler for it), a dense ``C`` (no streaming
        generator), sizes that differ from the certified ones, bad arguments (naming them).
    """
    import math

    import jax

    from dpjax.noise import correlated_noise_aggregate, streaming_noise
    from dpjax.sampling import BallsInBinsSampler, BMinSepSampler

    res = _load(result)
    cert = res.certificate
    sigma = res.noise_multiplier
    if cert is None or not cert.verified or not (math.isfinite(sigma) and sigma > 0):
        raise ValueError("result has no certified noise multiplier (certificate missing or not verified); "
                         "train only with a certified one")
    if res.parameterization.get("family") == "dense":
        raise ValueError("result has a dense C: training_setup streams C^-1 z for Toeplitz, banded and BLT "
                         "correlation matrices only")
    if res.sampling is not None and res.sampling.get("scheme") == "random_allocation":
        raise ValueError("result is certified for random allocation (each example in a fresh uniform k-subset of "
                         "each epoch's t batches), and dpjax has no batch sampler for it (dpjax.sampling offers "
                         "BallsInBinsSampler, PoissonSampler and BMinSepSampler); draw the k-of-t allocation in "
                         "your training loop and train with result.noise_multiplier")
    clip = float(_validate.positive("clip_norm", clip_norm))
    seed = _validate.prng_seed("seed", seed, key_allowed=False)
    n, bs = _sizes(res, dataset_size, batch_size)
    s = res.sampling
    sampler = (BallsInBinsSampler(n, res.batches_per_epoch, res.epochs, bs, seed=seed) if s is None else
               BMinSepSampler(n, s["sampling_prob"], s["min_sep"], s["num_rounds"], bs, seed=seed))
    trunc = sampler.truncation_delta(cert.epsilon)
    correlation = res.correlation()
    noise = streaming_noise(correlation)
    # The draws' key is a fold of the seed that the schedule (NumPy's PCG64 of the seed) never uses.
    key = jax.random.fold_in(jax.random.key(seed), 1)
    transform = correlated_noise_aggregate(noise, sigma, clip, bs, key)
    return TrainingSetup(sampler=sampler, noise=noise, transform=transform, correlation=correlation,
                         noise_multiplier=float(sigma), clip_norm=clip, epsilon=float(cert.epsilon),
                         delta=float(cert.delta) + trunc, truncation_delta=trunc,
                         certified_for_sampler=res.dataset_size is not None)
