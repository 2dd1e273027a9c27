"""One implementation of ``to_dict`` / ``to_json`` / ``from_dict`` / ``load`` for result objects.

Every public result type of dpjax (:class:`dpjax.pld.EpsilonResult`, :class:`~dpjax.pld.DeltaResult`,
:class:`~dpjax.pld.DirectionReport`, :class:`dpjax.montecarlo.DeltaEstimate`,
:class:`~dpjax.montecarlo.Certificate`, :class:`dpjax.baselines.GroupLemmaResult`,
:class:`dpjax.calibration.Solution`, :class:`dpjax.optimization.OptimizationResult`,
:class:`dpjax.optimization.baselines.BaselineRow`, ...) is a frozen dataclass that inherits
:class:`ResultMixin`:

* ``result.to_dict()`` -- a dict of plain Python values: NumPy / JAX arrays become (nested)
  lists, NumPy / JAX scalars become ``float`` / ``int`` / ``bool``, nested results become dicts,
  tuples become lists.  Non-finite floats stay floats (``inf``, ``nan``).
* ``result.to_json(path=None, **json_kwargs)`` -- strict JSON text (RFC 8259 has no ``Infinity``
  or ``NaN``, so non-finite floats are written as the strings ``"inf"``, ``"-inf"``, ``"nan"``,
  the convention of the ``dpjax`` command's ``--json``; :func:`dpjax._base.io.dumps`); also written
  to ``path`` when given, atomically (:func:`dpjax._base.io.atomic_write`).
* ``Type.from_dict(d)`` / ``Type.load(path_or_json_text)`` -- the inverse: ``"inf"``-style
  strings become floats again, lists in array-valued fields become ``np.ndarray`` (float64,
  or the integer / bool dtype of the values), nested results are rebuilt.  Round trip:
  ``Type.from_dict(r.to_dict())`` and ``Type.load(r.to_json())`` equal ``r`` field by field
  (arrays come back as NumPy arrays, also where the original held JAX arrays).

``json.dumps(dataclasses.asdict(result))`` fails on array fields; use ``result.to_json()``.

Example::

    >>> from dpjax import pld
    >>> res = pld.dpsgd_accounting(1.0, 0.01, 1000, target_delta=1e-5)   # doctest: +SKIP
    >>> text = res.to_json()                                              # doctest: +SKIP
    >>> pld.EpsilonResult.load(text).epsilon == res.epsilon               # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
from typing import Any, ClassVar

import numpy as np

from dpjax._base.io import atomic_write, dumps, loads, restore_nonfinite


def to_plain(value: Any) -> Any:
    """``value`` as plain Python data (dict / list / float / int / bool / str / None)."""
    if isinstance(value, ResultMixin) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, str):  # a StrEnum mode as its plain string
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, bytes) or value is None:
        return value.decode() if isinstance(value, bytes) else value
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if hasattr(value, "__array__") or isinstance(value, np.generic):
        arr = np.asarray(value)
        return arr.tolist()  # 0-d arrays become Python scalars, n-d nested lists
    if isinstance(value, (int, float)):
        return value
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # enum.Enum with str value
        return value.value
    raise TypeError(f"cannot convert {type(value).__name__} to JSON data")


def _as_array_or_scalar(value: Any) -> Any:
    value = restore_nonfinite(value)
    if isinstance(value, list):
        arr = np.asarray(value)
        if arr.dtype == object:
            raise ValueError(f"ragged list cannot become an array: {value!r}")
        return arr.astype(np.float64) if arr.dtype.kind == "f" else arr
    return value


def _short(value: Any) -> str:
    """A field's value in a result's repr: floats (also 0-d arrays) as Python floats, arrays as
    their shape and first values, nested results by their own repr, tuples of results
    by their class and count."""
    if isinstance(value, ResultMixin):
        return repr(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, ResultMixin) for v in value):
        return f"<{len(value)} {type(value[0]).__name__}>"
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # str enums
        return repr(value.value)
    if isinstance(value, (bool, np.bool_)) or value is None or isinstance(value, str):
        return repr(value.item() if isinstance(value, np.bool_) else value)
    if hasattr(value, "__array__") or isinstance(value, (int, float, np.generic)):
        arr = np.asarray(value)
        if arr.ndim == 0:
            v = arr.item()
            return repr(v)
        head = ", ".join(repr(x) for x in arr.reshape(-1)[:3].tolist())
        more = ", ..." if arr.size > 3 else ""
        return f"array{tuple(arr.shape)}[{head}{more}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_short(v)}" for k, v in list(value.items())[:4]) + \
            (", ..." if len(value) > 4 else "") + "}"
    if isinstance(value, (list, tuple)):
        return f"<{type(value).__name__} of {len(value)}>"
    return repr(value)


def concise_repr(obj, fields=None) -> str:
    """``Type(field=value, ...)`` with :func:`_short` values (reprs of dpjax results and
    accountants: floats rather than ``array(...)`` fields)."""
    if fields is None:
        fields = [f.name for f in dataclasses.fields(obj) if f.repr]
    return f"{type(obj).__name__}(" + ", ".join(f"{k}={_short(getattr(obj, k))}" for k in fields) + ")"


class ResultMixin:
    """``to_dict`` / ``to_json`` / ``from_dict`` / ``load`` for a (frozen) result dataclass, and
    a concise ``repr`` (floats, not 0-d arrays; arrays summarized; nested results counted).

    Subclasses may set

    * ``_nested = {"field": ResultClass}`` for fields holding a result or a tuple of results, so
      that :meth:`from_dict` rebuilds them;
    * ``_plain = frozenset({"field", ...})`` for fields of plain data (lists of dicts, ragged or
      string lists) that :meth:`from_dict` keeps as lists instead of making arrays of them;
    * ``_format = "name-1"``: :meth:`to_dict` adds ``"format": "name-1"`` and :meth:`from_dict`
      refuses data without it (a file of another kind);
    * ``_derived = ("name", ...)``: properties that :meth:`to_dict` adds for readers of the
      file and :meth:`from_dict` ignores (they follow from the fields);
    * ``_json_kwargs = {"indent": 1}``: the default ``json.dumps`` options of :meth:`to_json`.
    """

    _nested: ClassVar[dict] = {}
    _plain: ClassVar[frozenset] = frozenset()
    _format: ClassVar[str | None] = None
    _derived: ClassVar[tuple] = ()
    _json_kwargs: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # In the class's own namespace before @dataclass runs, so that the generated
        # field-by-field repr (every array in full) does not replace it.
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = ResultMixin._result_repr

    def _result_repr(self) -> str:
        return concise_repr(self)

    def to_dict(self) -> dict:
        """The fields as plain Python data (arrays -> lists; non-finite floats kept)."""
        data = to_plain(self)
        if self._format is not None:
            data["format"] = self._format
        for name in self._derived:
            data[name] = to_plain(getattr(self, name))
        return data

    def to_json(self, path: str | os.PathLike | None = None, **json_kwargs) -> str:
        """Strict JSON text of :meth:`to_dict` (``inf`` / ``nan`` as strings); written to ``path``
        (atomically: a temp file renamed over it) if given."""
        text = dumps(self.to_dict(), **{**self._json_kwargs, **json_kwargs})
        if path is not None:
            atomic_write(path, text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: dict):
        """Rebuild a result from :meth:`to_dict` (or parsed :meth:`to_json`) data."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k not in cls._derived}
        if cls._format is not None and data.pop("format", None) != cls._format:
            raise ValueError(f"not a {cls.__name__} (format {cls._format!r} expected)")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown fields {sorted(unknown)}")
        kwargs = {}
        for name, value in data.items():
            nested = cls._nested.get(name)
            if nested is not None:
                if isinstance(value, list):
                    kwargs[name] = tuple(nested.from_dict(v) for v in value)
                else:
                    kwargs[name] = nested.from_dict(value) if value is not None else None
            elif name in cls._plain:
                kwargs[name] = restore_nonfinite(value)
            else:
                kwargs[name] = _as_array_or_scalar(value)
        return cls(**kwargs)

    @classmethod
    def load(cls, source: str | os.PathLike):
        """Rebuild a result from a JSON file path or JSON text written by :meth:`to_json`."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            text = pathlib.Path(source).read_text()
        return cls.from_dict(loads(text))
