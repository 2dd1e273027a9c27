"""The one base class of dpjax's string-valued modes (direction, bound, sampling, query, ...).

A mode is a :class:`StrEnum` member: it compares and hashes equal to its string value, so
plain strings are accepted wherever a member is expected (dict keys, static ``jit`` arguments,
JSON), and :meth:`StrEnum.parse` turns a user's string into a member at the public boundary,
with a ``ValueError`` that names the argument and lists the valid values.
"""

from __future__ import annotations

import enum

__all__ = ["StrEnum", "Adjacency", "Query", "AllocationSampling"]


class StrEnum(str, enum.Enum):
    """A string flag with meaning: ``Member == "value"`` with the same hash as the string, so
    plain strings are accepted wherever a member is expected (dict keys, static ``jit``
    arguments) and :meth:`parse` validates them at the boundary."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value, name: str | None = None):
        """``value`` as a member; a ``ValueError`` naming the argument ``name`` (default: the
        class name in lower case) and the valid values otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{name or cls.__name__.lower()} must be one of "
                             f"{[m.value for m in cls]}, got {value!r}") from None


class Adjacency(StrEnum):
    """The neighbouring relation a privacy guarantee is stated for: ``ADD_OR_REMOVE`` (datasets
    differ by adding or removing one example, k for a group; the max over the add and remove
    directions, Poisson sampling) or ``REPLACE`` (one example replaced by another, k for a group;
    fixed-size batches).  Every layer reports it, hence its place in the foundation."""

    ADD_OR_REMOVE = "add_or_remove"
    REPLACE = "replace"


class Query(StrEnum):
    """Which side of a privacy target is computed: ``EPSILON`` (the epsilon at a given delta)
    or ``DELTA`` (the delta at a given epsilon)."""

    EPSILON = "epsilon"
    DELTA = "delta"


class AllocationSampling(StrEnum):
    """The DP-SGD batch schemes accounted by random allocation: ``RANDOM_ALLOCATION`` (every
    example in ``k`` of the ``b`` batches of an epoch, uniformly) and ``BALLS_IN_BINS`` (every
    example in one of ``b`` bins, independently).  Defined here because the accountants, the
    interop layer and the command line all name them."""

    RANDOM_ALLOCATION = "random_allocation"
    BALLS_IN_BINS = "balls_in_bins"
