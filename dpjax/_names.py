"""One vocabulary: the names of the DP-SGD accounting family and their accepted aliases.

The accounting functions take the five quantities of DP-SGD accounting in ONE order, leaving
out the one they compute (docs/api_names.md)::

    noise_multiplier, sampling_prob, steps, target_epsilon, target_delta

    dpsgd_epsilon(noise_multiplier, sampling_prob, steps, target_delta)
    dpsgd_delta(noise_multiplier, sampling_prob, steps, target_epsilon)
    dpsgd_noise_multiplier(sampling_prob, steps, target_epsilon, target_delta)

Opacus-style keyword spellings are accepted as aliases (:data:`ALIASES`): ``sample_rate=``
for ``sampling_prob``, ``delta=`` / ``epsilon=`` for the targets, and ``epochs=`` instead of
``steps`` (``steps = int(epochs / sample_rate)``, Opacus's convention).  Giving a name and its
alias together is an error.
"""

from __future__ import annotations

from dpjax import _validate

__all__ = ["ALIASES", "resolve_aliases", "steps_from_epochs"]

#: alias -> canonical keyword.
ALIASES = {"sample_rate": "sampling_prob", "delta": "target_delta", "epsilon": "target_epsilon"}


def resolve_aliases(fn_name: str, bound: dict, aliases: dict) -> dict:
    """Move alias keywords (``aliases``: alias -> value, None when not given) onto their
    canonical names in ``bound`` (canonical name -> value, None when not given)."""
    out = dict(bound)
    for alias, value in aliases.items():
        if value is None:
            continue
        name = ALIASES[alias]
        if out.get(name) is not None:
            raise ValueError(f"{fn_name}: give {name} or its alias {alias}=, not both")
        out[name] = value
    return out


def steps_from_epochs(fn_name: str, sampling_prob, steps, epochs):
    """``steps``, or ``int(epochs / sampling_prob)`` (Opacus's convention) when ``epochs`` is given."""
    if epochs is None:
        return steps
    if steps is not None:
        raise ValueError(f"{fn_name}: give steps or epochs=, not both")
    if sampling_prob is None:
        raise ValueError(f"{fn_name}: epochs= needs sampling_prob (steps = int(epochs / sampling_prob))")
    e = float(_validate.positive("epochs", epochs))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    t = int(e / q)
    if t < 1:
        raise ValueError(f"epochs / sampling_prob must give at least one step, got {e:g} / {q:g}")
    return t


def require(fn_name: str, **values) -> None:
    """A ``ValueError`` naming the first required argument that was not given (None)."""
    for name, value in values.items():
        if value is None:
            raise ValueError(f"{fn_name}: missing required argument {name}")
