"""The one base class of dpjax's string-valued modes (direction, bound, sampling, query, ...).

A mode is a :class:`StrEnum` member: it compares and hashes equal to its string value, so
plain strings are accepted wherever a member is expected (dict keys, static ``jit`` arguments,
JSON), and :meth:`StrEnum.parse` turns a user's string into a member at the public boundary,
with a ``ValueError`` that names the argument and lists the valid values.
"""

from __future__ import annotations

import enum

__all__ = ["StrEnum"]


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
