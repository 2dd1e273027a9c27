"""One vocabulary: the names of the DP-SGD accounting family and their accepted aliases.

The accounting functions take the five quantities of DP-SGD accounting in ONE order, leaving
out the one they compute (docs/api_names.md)::

    noise_multiplier, sampling_prob, steps, target_epsilon, target_delta

    dpsgd_epsilon(noise_multiplier, sampling_prob, steps, target_delta)
    dpsgd_delta(noise_multiplier, sampling_prob, steps, target_epsilon)
    dpsgd_noise_multiplier(sampling_prob, steps, target_epsilon, target_delta)

Opacus's keyword spellings are accepted: ``sample_rate=`` for ``sampling_prob``
(:func:`resolve_sample_rate`; giving both is an error) and ``epochs=`` instead of ``steps``
(:func:`epochs_to_steps`: ``epochs / sampling_prob`` steps, rounded up unless it is within
floating-point rounding of an integer).
"""

from __future__ import annotations

import math

from dpjax._base import validate as _validate

__all__ = ["resolve_sample_rate", "steps_from_epochs", "epochs_to_steps"]


def resolve_sample_rate(fn_name: str, sampling_prob, sample_rate):
    """``sampling_prob``, or its Opacus spelling ``sample_rate`` when that is given instead (None
    when neither is); both given is a ``ValueError``."""
    if sample_rate is None:
        return sampling_prob
    if sampling_prob is not None:
        raise ValueError(f"{fn_name}: give sampling_prob or its alias sample_rate=, not both")
    return sample_rate


def epochs_to_steps(epochs, sampling_prob) -> int:
    """The number of steps that ``epochs`` epochs at sampling probability ``sampling_prob`` take.

    The one rule of dpjax (every entry point taking ``epochs=``, the CLI and the Opacus-style
    interop use it): ``epochs / sampling_prob`` rounded to the nearest integer when it is within
    floating-point rounding of one (7 epochs at 0.07 are 100 steps, although ``7 / 0.07`` is
    ``99.99999999999999`` in binary floating point), else rounded up: a partial last epoch is
    still trained on, so the guarantee must cover it.  Never fewer steps than training takes;
    truncating with ``int()`` (Opacus's convention) can certify one step too few.

    Args:
      epochs: a number > 0.
      sampling_prob: in (0, 1].

    Returns:
      an integer >= 1 (a ``ValueError`` when the quotient is not finite).
    """
    e = float(_validate.positive("epochs", epochs))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    x = e / q
    if not math.isfinite(x) or x > 2.0**62:
        raise ValueError(f"epochs / sampling_prob must be a finite number of steps, got {e:g} / {q:g}")
    r = round(x)
    # The decimal-to-binary rounding of epochs and sampling_prob and the division each add at most
    # an ulp-sized relative error: a quotient within 4 ulps of an integer is that integer.
    if abs(x - r) <= 4.0 * math.ulp(max(abs(x), 1.0)):
        return max(int(r), 1)
    return max(int(math.ceil(x)), 1)


def steps_from_epochs(fn_name: str, sampling_prob, steps, epochs, *, sampling="poisson", dataset_size=None,
                      batch_size=None):
    """``steps``, or :func:`epochs_to_steps` of ``epochs`` when ``epochs`` is given; with
    ``sampling="fixed_batch"`` and no ``sampling_prob``, at ``q = batch_size / dataset_size`` (the
    same rule as :class:`dpjax.TrainingScenario` and the CLI)."""
    if epochs is None:
        return steps
    if steps is not None:
        raise ValueError(f"{fn_name}: give steps or epochs=, not both")
    if sampling_prob is None and getattr(sampling, "value", sampling) == "fixed_batch" \
            and dataset_size is not None and batch_size is not None:
        sampling_prob = (_validate.positive_int("batch_size", batch_size)
                         / _validate.positive_int("dataset_size", dataset_size))
    if sampling_prob is None:
        raise ValueError(f"{fn_name}: epochs= needs sampling_prob (steps = epochs / sampling_prob, rounded up)")
    return epochs_to_steps(epochs, sampling_prob)


def require(fn_name: str, **values) -> None:
    """A ``ValueError`` naming the first required argument that was not given (None)."""
    for name, value in values.items():
        if value is None:
            raise ValueError(f"{fn_name}: missing required argument {name}")
