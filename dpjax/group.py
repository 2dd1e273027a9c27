"""Tight group privacy for DP-SGD (Ganesh (2024), "Tight Group-Level DP Guarantees for DP-SGD
with Sampling via Mixture of Gaussians Mechanisms").

A group of ``k`` examples in DP-SGD with noise multiplier ``sigma`` and

* Poisson sampling (probability ``q``; add/remove adjacency, add/remove-k for the group):
  each step is dominated by the mixture-of-Gaussians mechanism with sensitivities ``0..k``,
  weights ``Binomial(k, q)`` and noise ``sigma`` (Ganesh (2024), Thm 3.1);
* fixed batch size ``B`` out of ``N`` (replace-one adjacency, replace-k for the group):
  sensitivities ``2j``, weights ``Hypergeometric(N, k, B)`` and noise ``sigma``, the run's own
  noise multiplier (Ganesh (2024), Thm 3.3; the hypergeometric weights as in the note "Group
  Privacy for Deep Learning with Differential Privacy").  Replacing an example costs a factor
  2 in sensitivity; nothing doubles the noise, so at k = 1 fixed batch is NOT Poisson DP-SGD.

Both reductions are tight (Ganesh (2024), Sec. 3.3).  The T-fold composition is accounted by
the same certified FFT-PLD program as every other mechanism (:mod:`dpjax.pld`), with the
mixture PLD of :mod:`dpjax.pld.mog`: no delta_1 has to be found, so no inf for moderate k
(unlike the group-privacy lemma, :func:`dpjax.baselines.group_lemma_epsilon`).

Example::

    >>> import dpjax
    >>> dpjax.group_epsilon(2.0, 0.01, 2000, 1e-5, group_size=8)                     # doctest: +SKIP
    9.698...
    >>> dpjax.group_epsilon(2.0, None, 2000, 1e-5, group_size=8, sampling="fixed_batch",
    ...                     dataset_size=50_000, batch_size=500)                      # doctest: +SKIP
    32.03...
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpjax._base import traced as _traced
from dpjax._base import validate as _validate
from dpjax._base.names import steps_from_epochs
from dpjax._base.x64 import float64
from dpjax.pld.group_spec import GroupSpec, Sampling, validate_group_spec
from dpjax.pld.mog import GroupSubsampledGaussian
from dpjax.pld.scenario import FixedBatch, Poisson, SchemeKeywords, accepts_scenario, scheme_keywords

__all__ = ["Sampling", "GroupSpec", "validate_group_args", "group_mechanism", "group_accounting", "group_epsilon",
           "group_delta", "group_dpsgd_epsilon", "group_dpsgd_delta", "group_components"]

# The one validator of group arguments lives in the lowest layer (dpjax.pld.group_spec); this
# is the same function under the name the group API has always exported.
validate_group_args = validate_group_spec


def group_mechanism(noise_multiplier: float, spec: GroupSpec) -> GroupSubsampledGaussian:
    """The (validated) per-step mixture mechanism for ``spec``."""
    if spec.sampling is Sampling.POISSON:
        mech = GroupSubsampledGaussian(float(noise_multiplier), float(spec.group_size), sampling_prob=float(spec.sampling_prob))
    else:
        mech = GroupSubsampledGaussian(
            float(noise_multiplier), float(spec.group_size), dataset_size=float(spec.dataset_size),
            batch_size=float(spec.batch_size), sampling=Sampling.FIXED_BATCH,
        )
    return mech.validate()


def group_components(noise_multiplier, steps, spec: GroupSpec):
    """``[(mechanism, steps)]``: the composition :func:`dpjax.pld.epsilon` accounts for a group
    (the per-step mechanism of ``spec`` at scalar ``noise_multiplier``, ``steps`` times).

    Raises:
      ValueError: ``noise_multiplier`` not a scalar > 0, or ``steps`` not an integer >= 1.
    """
    from dpjax.pld.mechanisms import PoissonSubsampledGaussian

    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    if sigma.ndim != 0:
        raise ValueError(f"noise_multiplier must be a scalar > 0 for group accounting, got shape {sigma.shape}")
    sigma = float(sigma)
    t = _validate.positive_int("steps", steps)
    if spec.group_size == 1:
        # k = 1: the mixture is {0: 1-q, s: q} with noise sigma, s the per-example sensitivity
        # of the adjacency (1 for Poisson add/remove; 2 for fixed-batch replace-one, with
        # q = B/N since Hypergeometric(N, 1, B) = Bernoulli(B/N)).  That is the Poisson-
        # subsampled Gaussian of sensitivity 1 with noise multiplier sigma / s.
        return [(PoissonSubsampledGaussian(sigma / spec.sampling.sensitivity, float(spec.sampling_prob)), t)]
    return [(group_mechanism(sigma, spec), t)]


#: The schemes group privacy is accounted for (Ganesh (2024), Thms 3.1 and 3.3).
_GROUP_SCHEMES = (Poisson, FixedBatch)


@float64
def group_accounting(noise_multiplier: float, sampling_prob: float | None, steps: int, target_delta=None,
                     target_epsilon=None, *, group_size: int = 1, sampling="poisson", options=None,
                     with_lower: bool = True):
    """Group-level DP-SGD accounting: a :class:`dpjax.pld.EpsilonResult` or :class:`~dpjax.pld.DeltaResult`.

    Args:
      noise_multiplier: sigma > 0 (noise std / clip norm).
      sampling_prob: Poisson probability q (``sampling="poisson"``); None with a scheme record.
      steps: number of steps T.
      target_delta / target_epsilon: exactly one of them (scalar or 1-D array).
      group_size: k >= 1 examples protected together.
      sampling: ``"poisson"`` (add/remove adjacency), :class:`dpjax.Poisson` ``(q)``, or
        :class:`dpjax.FixedBatch` ``(batch_size, dataset_size)`` (replace adjacency; noise std
        = ``noise_multiplier``).
      options: :class:`dpjax.pld.GridOptions` (accuracy knobs).
      with_lower: also compute the optimistic lower bracket.
    """
    s = scheme_keywords("group_accounting", sampling, sampling_prob, accepts=_GROUP_SCHEMES)
    return _group_accounting(noise_multiplier, s.sampling_prob, steps, target_delta, target_epsilon,
                             group_size=group_size, sampling=s.sampling, dataset_size=s.dataset_size,
                             batch_size=s.batch_size, options=options, with_lower=with_lower)


def _group_accounting(noise_multiplier, sampling_prob, steps, target_delta, target_epsilon, *, group_size, sampling,
                      dataset_size, batch_size, options, with_lower):
    """:func:`group_accounting` with the scheme as the accounting layer's keywords."""
    from dpjax import pld

    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    spec = validate_group_args(sampling_prob, group_size=group_size, sampling=sampling, dataset_size=dataset_size, batch_size=batch_size)
    comps = group_components(noise_multiplier, steps, spec)
    if target_delta is not None:
        res = pld.epsilon(comps, target_delta, options=options, with_lower=with_lower)
    else:
        res = pld.delta(comps, target_epsilon, options=options, with_lower=with_lower)
    # Name the neighbouring relation: replace(-k) for fixed batches, add/remove(-k) for Poisson.
    return dataclasses.replace(res, adjacency=spec.adjacency)


def _dispatch(query, name, noise_multiplier, sampling_prob, steps, target, *, group_size, sampling, dataset_size,
              batch_size, options):
    """:func:`dpjax.pld.dpsgd.dispatch` with the group's per-step mechanism: one configuration,
    a batch (array ``noise_multiplier`` / ``sampling_prob`` / ``steps`` / target) or a traced
    call (``jax.grad`` / ``vmap`` / ``jit``)."""
    from dpjax.pld.dpsgd import dispatch

    fixed = Sampling.parse(sampling) is Sampling.FIXED_BATCH
    # The group arguments are scalars (they choose the mixture's shape); validated once here.
    if not fixed and sampling_prob is not None and not _traced.is_traced(sampling_prob) \
            and np.ndim(sampling_prob) == 0:
        validate_group_args(sampling_prob, group_size=group_size, sampling=sampling, dataset_size=dataset_size,
                            batch_size=batch_size)
    elif fixed:
        # Not a free parameter: None or B / N, checked here and then left out.
        validate_group_args(None if _traced.is_traced(sampling_prob) else sampling_prob, group_size=group_size,
                            sampling=sampling, dataset_size=dataset_size, batch_size=batch_size)
        sampling_prob = None
    kw = dict(group_size=group_size, sampling=sampling, dataset_size=dataset_size, batch_size=batch_size)

    def components(sigma, q, t):
        spec = validate_group_args(q, **kw)
        return group_components(sigma, t, spec)

    def scalar(sigma, q, t, tg):
        target_kw = {"target_delta": tg, "target_epsilon": None} if query == "epsilon" else \
            {"target_delta": None, "target_epsilon": tg}
        res = _group_accounting(sigma, q, t, **target_kw, **kw, options=options, with_lower=False)
        v = res.epsilon if query == "epsilon" else res.delta
        return float(np.asarray(v)) if np.ndim(v) == 0 else v

    return dispatch(query, name, noise_multiplier, sampling_prob, steps, target, components=components,
                    scalar=scalar, options=options, q_required=not fixed)


def group_epsilon(noise_multiplier=None, sampling_prob: float | None = None, steps=None, target_delta=None, *,
                  group_size: int = 1, sampling="poisson", options=None, sample_rate=None, epochs=None):
    """Certified, tight epsilon of DP-SGD for groups of ``group_size`` examples.

    Args:
      noise_multiplier: sigma > 0; an array gives one epsilon per entry (a batch, broadcast with
        ``sampling_prob``, ``steps`` and ``target_delta``).
      sampling_prob: q in (0, 1] for Poisson sampling (alias ``sample_rate=``); None with a
        scheme record.
      steps: T >= 1 (or ``epochs=``: ``T = epochs / sampling_prob``
        rounded up, never fewer steps than training takes).
      target_delta: in (0, 1).
      group_size: k >= 1 (<= batch_size for fixed batch).
      sampling: ``"poisson"`` or :class:`dpjax.Poisson` ``(q)`` (add/remove adjacency: adding or
        removing k examples), or :class:`dpjax.FixedBatch` ``(batch_size, dataset_size)``
        (replace adjacency: replacing k examples; batches of ``batch_size`` drawn without
        replacement from ``dataset_size``; the mixture's noise std is ``noise_multiplier``
        itself, Ganesh (2024), Thm 3.3).
      options: :class:`dpjax.pld.GridOptions` (accuracy knobs).
    Returns:
      epsilon (float, or an array for a batch): an upper bound, never below the truth; ``inf``
      only when the grid cannot certify ``target_delta`` at all.  Traceable: under
      ``jax.grad`` / ``jax.vmap`` / ``jax.jit`` (see :mod:`dpjax.pld.dpsgd`), differentiable in
      ``noise_multiplier``, ``sampling_prob`` (Poisson) and ``target_delta``.

    Example::

        >>> group_epsilon(1.0, 0.01, 2000, 1e-5, group_size=8)   # doctest: +SKIP
        32.035...   (the group-privacy lemma gives inf here)
    """
    return _group_query("epsilon", "group_epsilon", noise_multiplier, sampling_prob, steps, target_delta,
                        sample_rate=sample_rate, epochs=epochs, group_size=group_size, sampling=sampling,
                        options=options)


def group_delta(noise_multiplier=None, sampling_prob: float | None = None, steps=None, target_epsilon=None, *,
                group_size: int = 1, sampling="poisson", options=None, sample_rate=None, epochs=None):
    """Certified delta of group-level DP-SGD at ``target_epsilon`` (>= 0): as
    :func:`group_epsilon` (batches and traced calls included)."""
    return _group_query("delta", "group_delta", noise_multiplier, sampling_prob, steps, target_epsilon,
                        sample_rate=sample_rate, epochs=epochs, group_size=group_size, sampling=sampling,
                        options=options)


def _group_query(query, name, noise_multiplier, sampling_prob, steps, target, *, sample_rate, epochs, group_size,
                 sampling, options):
    """The argument handling :func:`group_epsilon` and :func:`group_delta` share: the
    ``sample_rate=`` alias, the scheme record, ``epochs=`` -> steps, then :func:`_dispatch`."""
    s = scheme_keywords(name, sampling, sampling_prob, sample_rate=sample_rate, accepts=_GROUP_SCHEMES)
    return _group_query_keywords(query, name, noise_multiplier, s, steps, target, epochs=epochs,
                                 group_size=group_size, options=options)


def _group_query_keywords(query, name, noise_multiplier, s: SchemeKeywords, steps, target, *, epochs, group_size,
                          options=None):
    steps = steps_from_epochs(name, s.sampling_prob, steps, epochs, sampling=s.sampling,
                              dataset_size=s.dataset_size, batch_size=s.batch_size)
    return _dispatch(query, name, noise_multiplier, s.sampling_prob, steps, target, group_size=group_size,
                     sampling=s.sampling, dataset_size=s.dataset_size, batch_size=s.batch_size, options=options)


@accepts_scenario("target_delta", name="dpjax.dpsgd_epsilon")
def group_dpsgd_epsilon(noise_multiplier=None, sampling_prob=None, steps=None, target_delta=None, *,
                        group_size: int = 1, sampling="poisson", noise_schedule=None, sample_rate=None, epochs=None):
    """Certified epsilon of DP-SGD, example-level or for groups of ``group_size`` examples.

    Public as :func:`dpjax.dpsgd_epsilon` (the top-level name); named apart from
    :func:`dpjax.pld.dpsgd_epsilon`, the example-level accountant it extends.

    With the defaults (``group_size=1``, ``sampling="poisson"``) this is exactly
    :func:`dpjax.pld.dpsgd_epsilon` (batches, traced calls and ``noise_schedule=`` included);
    otherwise the tight mixture-of-Gaussians group accountant :func:`group_epsilon`.

    Args:
      noise_multiplier: sigma > 0; an array gives one epsilon per entry (a batch).
      sampling_prob: Poisson q in (0, 1] (alias ``sample_rate=``); None with a scheme record.
      steps: T >= 1 (or ``epochs=``: ``T = epochs / sampling_prob``
        rounded up, never fewer steps than training takes).
      target_delta: in (0, 1).
      group_size: k >= 1.
      sampling: ``"poisson"`` (the default: add/remove adjacency, probability ``sampling_prob``)
        or a scheme record that states its sizes: :class:`dpjax.Poisson` ``(q)``,
        :class:`dpjax.FixedBatch` ``(batch_size, dataset_size)`` (replace adjacency; at k = 1 the
        subsampled Gaussian with sensitivity 2, not Poisson DP-SGD),
        :class:`dpjax.RandomAllocation` ``(batches_per_epoch, selections_per_epoch)`` or
        :class:`dpjax.BallsInBins` ``(batches_per_epoch)`` (example level, add/remove adjacency;
        ``epochs`` is then the number of epochs; see :mod:`dpjax.pld.allocation.dpsgd`).
      noise_schedule: a per-step schedule (1-D, length ``steps``) instead of
        ``noise_multiplier`` (example-level Poisson only).

    Traceable: ``jax.grad`` (in ``noise_multiplier``, ``sampling_prob``, ``target_delta``),
    ``jax.vmap`` and ``jax.jit``, from float32 code too (see :mod:`dpjax.pld.dpsgd`).

    Example::

        >>> import dpjax, jax
        >>> dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)                         # doctest: +SKIP
        1.8282...
        >>> jax.grad(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))(1.0)   # doctest: +SKIP
        -3.82...
        >>> dpjax.dpsgd_epsilon(1.0, 0.01, 2000, 1e-5, group_size=8)          # doctest: +SKIP
        32.035...
        >>> dpjax.dpsgd_epsilon(2.0, None, 2000, 1e-5, group_size=8,
        ...                     sampling=dpjax.FixedBatch(500, 50_000))       # doctest: +SKIP
        32.03...
    """
    return _group_dpsgd("epsilon", noise_multiplier, sampling_prob, steps, target_delta, group_size=group_size,
                        sampling=sampling, noise_schedule=noise_schedule, sample_rate=sample_rate, epochs=epochs)


@accepts_scenario("target_epsilon", name="dpjax.dpsgd_delta")
def group_dpsgd_delta(noise_multiplier=None, sampling_prob=None, steps=None, target_epsilon=None, *,
                      group_size: int = 1, sampling="poisson", noise_schedule=None, sample_rate=None, epochs=None):
    """Certified delta of DP-SGD at ``target_epsilon`` (>= 0), example-level or for groups of
    ``group_size`` examples: :func:`group_dpsgd_epsilon` with the target epsilon last, the same
    keywords and the same dispatch.  Public as :func:`dpjax.dpsgd_delta`.

    Example::

        >>> import dpjax
        >>> dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0)                        # doctest: +SKIP
        >>> dpjax.dpsgd_delta(2.0, 0.01, 2000, 32.0, group_size=8)         # doctest: +SKIP
    """
    return _group_dpsgd("delta", noise_multiplier, sampling_prob, steps, target_epsilon, group_size=group_size,
                        sampling=sampling, noise_schedule=noise_schedule, sample_rate=sample_rate, epochs=epochs)


def _group_dpsgd(query, noise_multiplier, sampling_prob, steps, target, *, group_size, sampling, noise_schedule,
                 sample_rate, epochs):
    """:func:`group_dpsgd_epsilon` / :func:`group_dpsgd_delta`: random allocation and
    example-level Poisson go to :mod:`dpjax.pld.dpsgd`, groups and fixed batches to
    :func:`group_epsilon` / :func:`group_delta`."""
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd
    from dpjax.pld import dpsgd as pld_dpsgd

    name = f"dpsgd_{query}"
    s = scheme_keywords(name, sampling, sampling_prob, sample_rate=sample_rate)
    if allocation_dpsgd.is_allocation(s.sampling):
        allocation_dpsgd.allocation_args(s.sampling, steps=steps, batches_per_epoch=s.batches_per_epoch,
                                         selections_per_epoch=s.selections_per_epoch, epochs=epochs,
                                         group_size=group_size)
    if allocation_dpsgd.is_allocation(s.sampling) or (group_size == 1 and s.sampling == "poisson"):
        return pld_dpsgd.query_keywords(query, name, noise_multiplier, s, steps, target, noise_schedule, epochs)
    if noise_schedule is not None:
        raise ValueError("noise_schedule is supported for example-level Poisson DP-SGD only (group_size=1, "
                         "sampling='poisson')")
    return _group_query_keywords(query, f"group_{query}", noise_multiplier, s, steps, target, epochs=epochs,
                                 group_size=group_size)
