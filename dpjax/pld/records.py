"""Result records of the PLD layer's many-configuration entry points.

:class:`EpsilonCurve` (returned by :func:`dpjax.pld.epsilon_curve`) and :class:`SweepTable`
(returned by :func:`dpjax.pld.sweep`) are plain records.  They live in this module, which
imports nothing else of :mod:`dpjax.pld`, so that the random-allocation accountant
(:mod:`dpjax.pld.allocation_accountant`) can return them while :mod:`dpjax.pld.curve` and
:mod:`dpjax.pld.sweeping` dispatch to it; both modules re-export them, so
``dpjax.pld.curve.EpsilonCurve`` and ``dpjax.pld.sweeping.SweepTable`` keep working.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpjax._results import ResultMixin

__all__ = ["EpsilonCurve", "SweepTable"]


@dataclasses.dataclass(frozen=True)
class EpsilonCurve(ResultMixin):
    """Certified epsilon after each number of steps (``to_dict`` / ``to_json`` / ``load`` from
    :class:`dpjax._results.ResultMixin`).

    Attributes:
      steps: (K,) int64, the numbers of steps, in the order given.
      epsilon: (K,) certified upper bounds (= ``epsilon_upper``; each the smallest certified at
        its ``T`` or at a larger ``T`` of the list).
      epsilon_lower: (K,) certified lower ends of the brackets (0 where not computed).
      epsilon_upper: (K,) = ``epsilon``.
      target_delta: the delta.
      n, dx: the one grid (FFT length, spacing) shared by every ``T``.
      recomputed: (K,) bool, True where that ``T`` went through the single-configuration path
        (:mod:`dpjax.pld.curve`, step 3).
    """

    steps: np.ndarray
    epsilon: np.ndarray
    epsilon_lower: np.ndarray
    epsilon_upper: np.ndarray
    target_delta: float
    n: int
    dx: float
    recomputed: np.ndarray


@dataclasses.dataclass(frozen=True)
class SweepTable(ResultMixin):
    """The result of :func:`dpjax.pld.sweep`: ``rows`` (dicts with
    :data:`dpjax.pld.sweeping.ROW_FIELDS`) in input order.

    Row fields (:data:`~dpjax.pld.sweeping.ROW_FIELDS`): the configuration, its target
    (``target_delta`` for an epsilon query, ``target_epsilon`` for a delta query); ``query``
    ("epsilon" or "delta"); the certified value in the queried column (``epsilon`` for an
    epsilon query, ``delta`` for a delta query: an upper bound, ``inf`` / 1 when nothing can be
    certified; the other column is None); ``lower`` / ``upper`` the certified bracket of that
    value (``upper`` is the value); ``grid`` the grid policy it was computed on ("sweep":
    :data:`~dpjax.pld.sweeping.SWEEP_OPTIONS`, within :data:`~dpjax.pld.sweeping.SWEEP_SLACK` of
    the single call; "accountant": the single call's own grid, as
    :func:`dpjax.pld.dpsgd_epsilon`; "custom": the ``options`` given; "closed_form": q = 1, no
    grid) and ``n``, ``dx`` its size and spacing; ``path`` "batched" (bucket program), "exact"
    (q = 1: the closed form, no grid, ``n = dx = 0``), "single" (recomputed by the
    single-configuration accountant) or "resumed" (read back from ``out``).

    ``programs``: distinct bucket programs run; of these, ``compiled`` were traced and compiled
    by this sweep and ``loaded`` deserialized from the persistent cache (written by an earlier
    process); the rest were compiled by an earlier sweep of this process.
    """

    rows: tuple
    programs: int = 0
    seconds: float = 0.0
    devices: int = 1
    compiled: int = 0
    loaded: int = 0

    def column(self, name: str) -> np.ndarray:
        return np.asarray([np.nan if r[name] is None else r[name] for r in self.rows], dtype=np.float64)

    @property
    def epsilon(self) -> np.ndarray:
        return self.column("epsilon")

    @property
    def delta(self) -> np.ndarray:
        return self.column("delta")

    def to_dict(self) -> dict:
        """Plain data: ``rows`` (list of dicts), ``programs``, ``seconds``, ``devices``, ``compiled``,
        ``loaded``; ``to_json`` / ``load`` (from :class:`dpjax._results.ResultMixin`) write and read
        it as strict JSON."""
        return dict(rows=[dict(r) for r in self.rows], programs=self.programs, seconds=self.seconds,
                    devices=self.devices, compiled=self.compiled, loaded=self.loaded)

    @classmethod
    def from_dict(cls, data: dict) -> "SweepTable":
        """Rebuild a table from :meth:`to_dict` (or parsed :meth:`to_json`) data."""
        from dpjax._io import restore_nonfinite

        rows = tuple({k: restore_nonfinite(v) for k, v in r.items()} for r in data["rows"])
        return cls(rows=rows, programs=int(data.get("programs", 0)), seconds=float(data.get("seconds", 0.0)),
                   devices=int(data.get("devices", 1)), compiled=int(data.get("compiled", 0)),
                   loaded=int(data.get("loaded", 0)))

    def __len__(self) -> int:
        return len(self.rows)
