"""DP-SGD accounting under every batching scheme dpjax supports, with one spelling.

``sampling`` names the scheme:

* ``"poisson"`` (default): Poisson sampling with probability ``sampling_prob`` for ``steps``
  steps, add/remove adjacency (:func:`dpjax.pld.dpsgd_epsilon`; groups:
  :func:`dpjax.group.group_epsilon`);
* ``"fixed_batch"``: batches of ``batch_size`` out of ``dataset_size``, replace adjacency
  (:mod:`dpjax.group`);
* ``"random_allocation"``: every example in ``selections_per_epoch`` of the
  ``batches_per_epoch`` steps of each epoch, drawn afresh each epoch, ``epochs`` epochs
  (Feldman & Shenfeld, "Privacy amplification by random allocation"; add/remove adjacency;
  :mod:`dpjax.pld.allocation_accountant`);
* ``"balls_in_bins"``: every example in one of ``batches_per_epoch`` bins for the whole run,
  used once per epoch, ``epochs`` epochs (Choquette-Choo et al. 2024, Def. 3.1, with ``C = I``:
  1-of-``batches_per_epoch`` allocation at noise ``sigma / sqrt(epochs)``).

Examples::

    >>> import dpjax
    >>> dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)                                   # doctest: +SKIP
    >>> dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, sampling="random_allocation",
    ...                     batches_per_epoch=100, epochs=10)                        # doctest: +SKIP
    >>> dpjax.dpsgd_noise_multiplier(2.0, 1e-5, sampling="balls_in_bins",
    ...                              batches_per_epoch=128, epochs=4)                # doctest: +SKIP
"""

from __future__ import annotations

from dpjax import _validate
from dpjax._x64 import host_only

__all__ = ["ALLOCATION_SAMPLINGS", "dpsgd_accounting", "dpsgd_epsilon", "dpsgd_delta", "dpsgd_noise_multiplier"]

#: The ``sampling`` values accounted by :mod:`dpjax.pld.allocation_accountant`.
ALLOCATION_SAMPLINGS = ("random_allocation", "balls_in_bins")
_ALL_SAMPLINGS = ("poisson", "fixed_batch") + ALLOCATION_SAMPLINGS


def _sampling(sampling) -> str:
    value = getattr(sampling, "value", sampling)
    if value not in _ALL_SAMPLINGS:
        raise ValueError(f"sampling must be one of {_ALL_SAMPLINGS}, got {sampling!r}")
    return value


def _allocation_args(sampling, sampling_prob, steps, group_size, dataset_size, batch_size, batches_per_epoch,
                     selections_per_epoch, epochs):
    """Validate the random-allocation / balls-in-bins arguments: ``(t, k, E)``."""
    if batches_per_epoch is None or epochs is None:
        raise ValueError(f"sampling={sampling!r} needs batches_per_epoch (an integer >= 1) and epochs "
                         f"(an integer >= 1)")
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    E = _validate.positive_int("epochs", epochs)
    k = _validate.positive_int("selections_per_epoch", selections_per_epoch, maximum=t)
    if sampling == "balls_in_bins" and k != 1:
        raise ValueError(f"selections_per_epoch must be 1 for sampling='balls_in_bins' (one bin per example), "
                         f"got {selections_per_epoch!r}")
    if sampling_prob is not None:
        raise ValueError(f"sampling_prob is not used with sampling={sampling!r} (give batches_per_epoch, "
                         f"selections_per_epoch and epochs), got {sampling_prob!r}")
    if steps is not None and _validate.positive_int("steps", steps) != t * E:
        raise ValueError(f"steps must equal batches_per_epoch * epochs = {t * E} with sampling={sampling!r} "
                         f"(or be omitted), got {steps!r}")
    if group_size != 1:
        raise ValueError(f"group_size must be 1 with sampling={sampling!r} (group privacy is accounted for "
                         f"poisson and fixed_batch), got {group_size!r}")
    if dataset_size is not None or batch_size is not None:
        raise ValueError(f"dataset_size and batch_size are for sampling='fixed_batch', not {sampling!r}")
    return t, k, E


def _allocation_accounting(sampling, noise_multiplier, t, k, E, **target):
    from dpjax.pld import allocation_accountant as ra

    if sampling == "balls_in_bins":
        return ra.balls_in_bins_accounting(noise_multiplier, t, E, **target)
    return ra.allocation_accounting(noise_multiplier, t, E, selections_per_epoch=k, **target)


@host_only("dpjax.pld.allocation_accountant.epsilon_fn (random allocation) or "
           "dpjax.calibration.epsilon_fn (Poisson) on a fixed grid")
def dpsgd_accounting(noise_multiplier, sampling_prob=None, steps=None, target_delta=None, target_epsilon=None, *,
                     group_size: int = 1, sampling: str = "poisson", dataset_size=None, batch_size=None,
                     batches_per_epoch=None, selections_per_epoch: int = 1, epochs=None):
    """DP-SGD accounting result (:class:`dpjax.pld.EpsilonResult` / :class:`~dpjax.pld.DeltaResult`,
    with ``epsilon_lower`` and ``adjacency``) under any ``sampling`` (see the module docstring)."""
    sampling = _sampling(sampling)
    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    target = {"target_delta": target_delta} if target_delta is not None else {"target_epsilon": target_epsilon}
    if sampling in ALLOCATION_SAMPLINGS:
        t, k, E = _allocation_args(sampling, sampling_prob, steps, group_size, dataset_size, batch_size,
                                   batches_per_epoch, selections_per_epoch, epochs)
        return _allocation_accounting(sampling, noise_multiplier, t, k, E, **target)
    _no_allocation_args(sampling, batches_per_epoch, selections_per_epoch, epochs)
    if steps is None:
        raise ValueError(f"steps is required for sampling={sampling!r} (an integer >= 1)")
    from dpjax.group import group_accounting

    return group_accounting(noise_multiplier, sampling_prob, steps, group_size=group_size, sampling=sampling,
                            dataset_size=dataset_size, batch_size=batch_size, **target)


def _no_allocation_args(sampling, batches_per_epoch, selections_per_epoch, epochs):
    if batches_per_epoch is not None or epochs is not None or selections_per_epoch != 1:
        raise ValueError(f"batches_per_epoch, selections_per_epoch and epochs are for sampling='random_allocation' "
                         f"or 'balls_in_bins', not {sampling!r}")


@host_only("dpjax.pld.allocation_accountant.epsilon_fn (random allocation) or "
           "dpjax.calibration.epsilon_fn (Poisson) on a fixed grid")
def dpsgd_epsilon(noise_multiplier, sampling_prob=None, steps=None, target_delta=None, *, group_size: int = 1,
                  sampling: str = "poisson", dataset_size=None, batch_size=None, batches_per_epoch=None,
                  selections_per_epoch: int = 1, epochs=None):
    """Certified epsilon of DP-SGD at ``target_delta`` (an upper bound, never below the truth).

    Poisson and fixed-batch arguments as :func:`dpjax.group.dpsgd_epsilon` (with the defaults,
    exactly :func:`dpjax.pld.dpsgd_epsilon`, noise schedules included); for
    ``sampling="random_allocation"`` / ``"balls_in_bins"`` give ``batches_per_epoch``,
    ``epochs`` (and ``selections_per_epoch`` for random allocation) instead of ``sampling_prob``
    and ``steps``.
    """
    sampling = _sampling(sampling)
    if target_delta is None:
        raise ValueError("target_delta is required (a number in (0, 1))")
    if sampling in ALLOCATION_SAMPLINGS:
        _validate.probability_open("target_delta", target_delta)
        res = dpsgd_accounting(noise_multiplier, sampling_prob, steps, target_delta=target_delta,
                               group_size=group_size, sampling=sampling, dataset_size=dataset_size,
                               batch_size=batch_size, batches_per_epoch=batches_per_epoch,
                               selections_per_epoch=selections_per_epoch, epochs=epochs)
        return res.epsilon
    _no_allocation_args(sampling, batches_per_epoch, selections_per_epoch, epochs)
    from dpjax.group import dpsgd_epsilon as grouped

    return grouped(noise_multiplier, sampling_prob, steps, target_delta, group_size=group_size, sampling=sampling,
                   dataset_size=dataset_size, batch_size=batch_size)


@host_only("dpjax.pld.allocation_accountant.delta_fn (random allocation) or "
           "dpjax.calibration.dpsgd_delta_fn (Poisson) on a fixed grid")
def dpsgd_delta(noise_multiplier, sampling_prob=None, steps=None, target_epsilon=None, *,
                sampling: str = "poisson", batches_per_epoch=None, selections_per_epoch: int = 1, epochs=None):
    """Certified delta of DP-SGD at ``target_epsilon`` (>= 0): Poisson as
    :func:`dpjax.pld.dpsgd_delta`, or ``sampling="random_allocation"`` / ``"balls_in_bins"``."""
    sampling = _sampling(sampling)
    if target_epsilon is None:
        raise ValueError("target_epsilon is required (a number >= 0)")
    if sampling in ALLOCATION_SAMPLINGS:
        _validate.nonnegative("target_epsilon", target_epsilon)
        res = dpsgd_accounting(noise_multiplier, sampling_prob, steps, target_epsilon=target_epsilon,
                               sampling=sampling, batches_per_epoch=batches_per_epoch,
                               selections_per_epoch=selections_per_epoch, epochs=epochs)
        return res.delta
    if sampling != "poisson":
        raise ValueError("dpsgd_delta accounts sampling='poisson', 'random_allocation' or 'balls_in_bins' "
                         "(fixed batches: dpjax.group.group_delta)")
    _no_allocation_args(sampling, batches_per_epoch, selections_per_epoch, epochs)
    from dpjax.pld import dpsgd_delta as poisson

    return poisson(noise_multiplier, sampling_prob, steps, target_epsilon)


def dpsgd_noise_multiplier(target_epsilon, target_delta, sampling_prob=None, steps=None, *, group_size: int = 1,
                           sampling: str = "poisson", dataset_size=None, batch_size=None, options=None,
                           progress=None, batches_per_epoch=None, selections_per_epoch: int = 1, epochs=None):
    """Smallest noise multiplier whose certified epsilon meets ``target_epsilon`` at
    ``target_delta``: :func:`dpjax.calibration.dpsgd_noise_multiplier` for Poisson / fixed
    batches, :func:`dpjax.pld.allocation_accountant.allocation_noise_multiplier` for
    ``sampling="random_allocation"`` / ``"balls_in_bins"`` (its implicit gradient:
    :func:`dpjax.pld.allocation_accountant.noise_multiplier_fn`)."""
    sampling = _sampling(sampling)
    if sampling in ALLOCATION_SAMPLINGS:
        t, k, E = _allocation_args(sampling, sampling_prob, steps, group_size, dataset_size, batch_size,
                                   batches_per_epoch, selections_per_epoch, epochs)
        from dpjax.pld import allocation_accountant as ra

        return ra.allocation_noise_multiplier(target_epsilon, target_delta, t, E, selections_per_epoch=k,
                                              balls_in_bins=sampling == "balls_in_bins", options=options)
    _no_allocation_args(sampling, batches_per_epoch, selections_per_epoch, epochs)
    from dpjax.calibration import dpsgd_noise_multiplier as poisson

    return poisson(target_epsilon, target_delta, sampling_prob, steps, group_size=group_size, sampling=sampling,
                   dataset_size=dataset_size, batch_size=batch_size, options=options, progress=progress)
