"""Tight group privacy for DP-SGD (seeds 000, 001; DESIGN.md Sec. 3).

A group of ``k`` examples in DP-SGD with

* Poisson sampling (probability ``q``): each step is dominated by the mixture-of-Gaussians
  mechanism with sensitivities ``0..k`` and weights ``Binomial(k, q)`` (seed 000 Thm 3.1);
* fixed batch size ``B`` out of ``N`` (replace adjacency): sensitivities ``2j``, weights
  ``Hypergeometric(N, k, B)``, noise ``2 sigma`` (seed 000 Thm 3.3; seed 001),

and both reductions are tight (seed 000 Sec. 3.3).  The T-fold composition is accounted by the
same certified FFT-PLD program as every other mechanism (:mod:`dpjax.pld`), with the mixture
PLD of :mod:`dpjax.pld.mog`: no delta_1 has to be found, so no inf for moderate k (unlike the
group-privacy lemma, :func:`dpjax.baselines.group_lemma_epsilon`).

Example::

    >>> import dpjax
    >>> dpjax.group_epsilon(2.0, 0.01, 2000, 1e-5, group_size=8)                     # doctest: +SKIP
    9.698...
    >>> dpjax.group_epsilon(2.0, None, 2000, 1e-5, group_size=8, sampling="fixed_batch",
    ...                     dataset_size=50_000, batch_size=500)                      # doctest: +SKIP
    9.698...
"""

from __future__ import annotations

import math

import numpy as np

from dpjax import _validate
from dpjax._x64 import float64, host_only
from dpjax.pld.mog import SAMPLINGS, GroupSubsampledGaussian

__all__ = ["GroupSpec", "validate_group_args", "group_mechanism", "group_accounting", "group_epsilon", "group_delta", "dpsgd_epsilon"]


class GroupSpec(tuple):
    """Validated group-privacy arguments: ``(group_size, sampling, sampling_prob, dataset_size, batch_size)``."""

    __slots__ = ()

    def __new__(cls, group_size, sampling, sampling_prob, dataset_size, batch_size):
        return super().__new__(cls, (group_size, sampling, sampling_prob, dataset_size, batch_size))

    group_size = property(lambda self: self[0])
    sampling = property(lambda self: self[1])
    sampling_prob = property(lambda self: self[2])
    dataset_size = property(lambda self: self[3])
    batch_size = property(lambda self: self[4])


def validate_group_args(sampling_prob, *, group_size=1, sampling="poisson", dataset_size=None, batch_size=None) -> GroupSpec:
    """Boundary checks for the group keywords of :func:`dpjax.dpsgd_epsilon` (ValueError naming the argument).

    * ``group_size``: integer >= 1 (and <= ``batch_size`` when one is given);
    * ``sampling``: ``"poisson"`` or ``"fixed_batch"``;
    * ``"poisson"``: ``sampling_prob`` in (0, 1];
    * ``"fixed_batch"``: ``dataset_size`` and ``batch_size`` integers with
      ``1 <= batch_size <= dataset_size``; ``sampling_prob`` None or equal to
      ``batch_size / dataset_size`` (relative 1e-9).
    Returns the validated :class:`GroupSpec` (``sampling_prob`` filled in as ``B / N`` for fixed batch).
    """
    _validate.one_of("sampling", sampling, SAMPLINGS)
    k = _validate.positive_int("group_size", group_size)
    n = b = None
    if dataset_size is not None:
        n = _validate.positive_int("dataset_size", dataset_size)
    if batch_size is not None:
        b = _validate.positive_int("batch_size", batch_size)
    if sampling == "fixed_batch":
        if n is None:
            raise ValueError("dataset_size is required for sampling='fixed_batch' (an integer >= 1)")
        if b is None:
            raise ValueError("batch_size is required for sampling='fixed_batch' (an integer in [1, dataset_size])")
    if n is not None and b is not None and b > n:
        raise ValueError(f"batch_size must be <= dataset_size={n}, got {batch_size!r}")
    if b is not None and k > b:
        raise ValueError(f"group_size must be <= batch_size={b}, got {group_size!r}")
    if sampling == "fixed_batch":
        if sampling_prob is not None:
            q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
            if not math.isclose(q, b / n, rel_tol=1e-9):
                raise ValueError(
                    f"sampling_prob must be None or equal batch_size/dataset_size={b / n!r} for sampling='fixed_batch', got {sampling_prob!r}"
                )
        q = b / n
    else:
        if sampling_prob is None:
            raise ValueError("sampling_prob is required for sampling='poisson' (a number in (0, 1])")
        q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    return GroupSpec(k, sampling, q, n, b)


def group_mechanism(noise_multiplier: float, spec: GroupSpec) -> GroupSubsampledGaussian:
    """The (validated) per-step mixture mechanism for ``spec``."""
    if spec.sampling == "poisson":
        mech = GroupSubsampledGaussian(float(noise_multiplier), float(spec.group_size), sampling_prob=float(spec.sampling_prob))
    else:
        mech = GroupSubsampledGaussian(
            float(noise_multiplier), float(spec.group_size), dataset_size=float(spec.dataset_size),
            batch_size=float(spec.batch_size), sampling="fixed_batch",
        )
    return mech.validate()


def _components(noise_multiplier, steps, spec: GroupSpec):
    from dpjax.pld.mechanisms import PoissonSubsampledGaussian

    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    if sigma.ndim != 0:
        raise ValueError(f"noise_multiplier must be a scalar > 0 for group accounting, got shape {sigma.shape}")
    sigma = float(sigma)
    t = _validate.positive_int("steps", steps)
    if spec.group_size == 1:
        # k = 1: the mixture is {0: 1-q, 1: q} with noise sigma (fixed batch: {0, 2} with 2 sigma,
        # q = B/N; Hypergeometric(N, 1, B) = Bernoulli(B/N)) -- exactly the DP-SGD mechanism, so
        # the group answer IS the foundation's DP-SGD epsilon.
        return [(PoissonSubsampledGaussian(sigma, float(spec.sampling_prob)), t)]
    return [(group_mechanism(sigma, spec), t)]


@float64
def group_accounting(
    noise_multiplier: float,
    sampling_prob: float | None,
    steps: int,
    target_delta=None,
    target_epsilon=None,
    *,
    group_size: int = 1,
    sampling: str = "poisson",
    dataset_size: int | None = None,
    batch_size: int | None = None,
    options=None,
    with_lower: bool = True,
):
    """Group-level DP-SGD accounting: a :class:`dpjax.pld.EpsilonResult` or :class:`~dpjax.pld.DeltaResult`.

    Args:
      noise_multiplier: sigma > 0 (noise std / clip norm).
      sampling_prob: Poisson probability q (``sampling="poisson"``); for ``"fixed_batch"`` None or
        ``batch_size / dataset_size``.
      steps: number of steps T.
      target_delta / target_epsilon: exactly one of them (scalar or 1-D array).
      group_size: k >= 1 examples protected together.
      sampling, dataset_size, batch_size: see :func:`validate_group_args`.
      options: :class:`dpjax.pld.GridOptions` (accuracy knobs).
      with_lower: also compute the optimistic lower bracket.
    """
    from dpjax import pld

    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    spec = validate_group_args(sampling_prob, group_size=group_size, sampling=sampling, dataset_size=dataset_size, batch_size=batch_size)
    comps = _components(noise_multiplier, steps, spec)
    if target_delta is not None:
        return pld.epsilon(comps, target_delta, options=options, with_lower=with_lower)
    return pld.delta(comps, target_epsilon, options=options, with_lower=with_lower)


def group_epsilon(
    noise_multiplier: float,
    sampling_prob: float | None,
    steps: int,
    target_delta: float,
    *,
    group_size: int = 1,
    sampling: str = "poisson",
    dataset_size: int | None = None,
    batch_size: int | None = None,
    options=None,
) -> float:
    """Certified, tight epsilon of DP-SGD for groups of ``group_size`` examples.

    Args:
      noise_multiplier: sigma > 0.
      sampling_prob: q in (0, 1] for Poisson sampling; None (or B/N) for fixed batch.
      steps: T >= 1.
      target_delta: in (0, 1).
      group_size: k >= 1 (<= batch_size for fixed batch).
      sampling: ``"poisson"`` (add/remove of k examples) or ``"fixed_batch"`` (replace k examples,
        batches of ``batch_size`` drawn without replacement from ``dataset_size``).
    Returns:
      epsilon (float): an upper bound, never below the truth; ``inf`` only when the grid cannot
      certify ``target_delta`` at all.

    Example::

        >>> group_epsilon(1.0, 0.01, 2000, 1e-5, group_size=8)   # doctest: +SKIP
        32.035...   (the group-privacy lemma gives inf here)
    """
    _validate.probability_open("target_delta", target_delta)
    res = group_accounting(
        noise_multiplier, sampling_prob, steps, target_delta=target_delta, group_size=group_size,
        sampling=sampling, dataset_size=dataset_size, batch_size=batch_size, options=options, with_lower=False,
    )
    return float(np.asarray(res.epsilon)) if np.ndim(res.epsilon) == 0 else res.epsilon


def group_delta(
    noise_multiplier: float,
    sampling_prob: float | None,
    steps: int,
    target_epsilon,
    *,
    group_size: int = 1,
    sampling: str = "poisson",
    dataset_size: int | None = None,
    batch_size: int | None = None,
    options=None,
):
    """Certified delta of group-level DP-SGD at ``target_epsilon`` (scalar or 1-D array, >= 0)."""
    _validate.nonnegative("target_epsilon", target_epsilon)
    res = group_accounting(
        noise_multiplier, sampling_prob, steps, target_epsilon=target_epsilon, group_size=group_size,
        sampling=sampling, dataset_size=dataset_size, batch_size=batch_size, options=options, with_lower=False,
    )
    return res.delta


@host_only("dpjax.calibration.epsilon_fn on a grid from dpjax.calibration.dpsgd_grid")
def dpsgd_epsilon(
    noise_multiplier,
    sampling_prob,
    steps,
    target_delta,
    *,
    group_size: int = 1,
    sampling: str = "poisson",
    dataset_size: int | None = None,
    batch_size: int | None = None,
):
    """Certified epsilon of DP-SGD, example-level or for groups of ``group_size`` examples.

    With the defaults (``group_size=1``, ``sampling="poisson"``) this is exactly
    :func:`dpjax.pld.dpsgd_epsilon` (noise schedules included); otherwise the tight
    mixture-of-Gaussians group accountant :func:`group_epsilon`.

    Args:
      noise_multiplier: sigma > 0 (a 1-D per-step schedule only for the example-level Poisson case).
      sampling_prob: Poisson q in (0, 1]; for ``"fixed_batch"`` None or ``batch_size / dataset_size``.
      steps: T >= 1.
      target_delta: in (0, 1).
      group_size: k >= 1.
      sampling: ``"poisson"`` or ``"fixed_batch"`` (then ``dataset_size`` and ``batch_size`` are required).

    Example::

        >>> import dpjax
        >>> dpjax.dpsgd_epsilon(1.0, 0.01, 2000, 1e-5, group_size=8)          # doctest: +SKIP
        32.035...
        >>> dpjax.dpsgd_epsilon(1.0, None, 2000, 1e-5, group_size=8, sampling="fixed_batch",
        ...                     dataset_size=50_000, batch_size=500)          # doctest: +SKIP
        32.030...
    """
    from dpjax.pld import dpsgd_epsilon as example_level

    if group_size == 1 and sampling == "poisson" and dataset_size is None and batch_size is None:
        return example_level(noise_multiplier, sampling_prob, steps, target_delta)
    return group_epsilon(
        noise_multiplier, sampling_prob, steps, target_delta, group_size=group_size, sampling=sampling,
        dataset_size=dataset_size, batch_size=batch_size,
    )
