"""Result records of the PLD layer.

:class:`EpsilonResult` / :class:`DeltaResult` with their per-direction
:class:`DirectionReport` (returned by :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` and
everything built on them; :mod:`dpjax.pld.accountant` re-exports them), :class:`EpsilonCurve`
(returned by :func:`dpjax.pld.epsilon_curve`) and :class:`SweepTable` (returned by
:func:`dpjax.pld.sweep`) are plain records.  They live in this module, which
imports nothing else of :mod:`dpjax.pld`, so that the random-allocation accountant
(:mod:`dpjax.pld.allocation.accountant`) can return them while :mod:`dpjax.pld.curve` and
:mod:`dpjax.pld.sweeps.driver` dispatch to it; both modules re-export them, so
``dpjax.pld.curve.EpsilonCurve`` and ``dpjax.pld.sweeps.driver.SweepTable`` keep working.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpjax._base.enums import Adjacency
from dpjax._base.results import ResultMixin

__all__ = ["DirectionReport", "EpsilonResult", "DeltaResult", "EpsilonCurve", "SweepTable"]


@dataclasses.dataclass(frozen=True)
class DirectionReport(ResultMixin):
    """Per-direction diagnostics (floats; arrays when several targets were asked).

    ``to_dict()`` / ``to_json(path)`` / ``DirectionReport.load(path)``: see :mod:`dpjax._base.results`.
    """

    direction: str
    upper: Any
    lower: Any
    n: int
    dx: float
    p_inf: float
    tail_above: float
    tail_below: float
    roundoff: float
    truncation_budget: float
    noise_floor: float = 0.0

    def as_dict(self, quantity: str) -> dict:
        """JSON-ready diagnostics; ``quantity`` names the bracket (``"epsilon"`` or ``"delta"``)."""
        return {f"{quantity}_upper": _py(self.upper), f"{quantity}_lower": _py(self.lower),
                "n": self.n, "dx": self.dx, "p_inf": self.p_inf, "tail_above": self.tail_above,
                "tail_below": self.tail_below, "roundoff": self.roundoff,
                "noise_floor": self.noise_floor}


@dataclasses.dataclass(frozen=True)
class EpsilonResult(ResultMixin):
    """``epsilon(target_delta)``: certified ``epsilon_upper`` (= ``epsilon``) and ``epsilon_lower``.

    ``epsilon`` is ``inf`` when the upper bound cannot certify ``target_delta`` (``reason`` says
    why).  ``directions`` holds the add/remove (or single symmetric) reports; ``blocked`` is True
    when a long heterogeneous schedule was bracketed by blocks (see :class:`GridOptions`).
    ``adjacency`` names the neighbouring relation (an :class:`~dpjax._base.enums.Adjacency`):
    ``"add_or_remove"`` (the max over the add and remove directions; Poisson sampling) or
    ``"replace"`` (fixed batches, :mod:`dpjax.group`).

    ``to_dict()`` / ``to_json(path)`` / ``EpsilonResult.load(path)`` keep every field (arrays as
    lists; see :mod:`dpjax._base.results`); ``as_dict()`` is the compact report keyed by direction.
    """

    _nested = {"directions": DirectionReport}

    epsilon: Any
    epsilon_lower: Any
    epsilon_upper: Any
    target_delta: Any
    directions: tuple[DirectionReport, ...]
    blocked: bool = False
    reason: str | None = None
    adjacency: Adjacency = Adjacency.ADD_OR_REMOVE

    def as_dict(self) -> dict:
        return dict(
            epsilon=_py(self.epsilon), epsilon_lower=_py(self.epsilon_lower),
            epsilon_upper=_py(self.epsilon_upper), target_delta=_py(self.target_delta),
            blocked=self.blocked, reason=self.reason,
            directions={str(d.direction): d.as_dict("epsilon") for d in self.directions},
        )


@dataclasses.dataclass(frozen=True)
class DeltaResult(ResultMixin):
    """``delta(target_epsilon)``: certified ``delta_upper`` (= ``delta``) and ``delta_lower``.

    ``adjacency``, ``to_dict()`` / ``to_json(path)`` / ``DeltaResult.load(path)``: as for
    :class:`EpsilonResult`.
    """

    _nested = {"directions": DirectionReport}

    delta: Any
    delta_lower: Any
    delta_upper: Any
    target_epsilon: Any
    directions: tuple[DirectionReport, ...]
    blocked: bool = False
    adjacency: Adjacency = Adjacency.ADD_OR_REMOVE

    def as_dict(self) -> dict:
        return dict(
            delta=_py(self.delta), delta_lower=_py(self.delta_lower), delta_upper=_py(self.delta_upper),
            target_epsilon=_py(self.target_epsilon), blocked=self.blocked,
            directions={str(d.direction): d.as_dict("delta") for d in self.directions},
        )


def _py(x):
    a = np.asarray(x, np.float64)
    return float(a) if a.ndim == 0 else a.tolist()


@dataclasses.dataclass(frozen=True)
class EpsilonCurve(ResultMixin):
    """Certified epsilon after each number of steps (``to_dict`` / ``to_json`` / ``load`` from
    :class:`dpjax._base.results.ResultMixin`).

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
    :data:`dpjax.pld.sweeps.driver.ROW_FIELDS`) in input order.

    Row fields (:data:`~dpjax.pld.sweeps.driver.ROW_FIELDS`): the configuration, its target
    (``target_delta`` for an epsilon query, ``target_epsilon`` for a delta query); ``query``
    ("epsilon" or "delta"); the certified value in the queried column (``epsilon`` for an
    epsilon query, ``delta`` for a delta query: an upper bound, ``inf`` / 1 when nothing can be
    certified; the other column is None); ``lower`` / ``upper`` the certified bracket of that
    value (``upper`` is the value); ``grid`` the grid policy it was computed on ("sweep":
    :data:`~dpjax.pld.sweeps.driver.SWEEP_OPTIONS`, within :data:`~dpjax.pld.sweeps.driver.SWEEP_SLACK` of
    the single call; "accountant": the single call's own grid, as
    :func:`dpjax.pld.dpsgd_epsilon`; "custom": the ``options`` given; "closed_form": q = 1, no
    grid) and ``n``, ``dx`` its size and spacing; ``path`` "batched" (bucket program), "exact"
    (q = 1: the closed form, no grid, ``n = dx = 0``), "single" (recomputed by the
    single-configuration accountant) or "resumed" (read back from ``out``).

    ``programs``: distinct bucket programs run; of these, ``compiled`` were traced and compiled
    by this sweep and ``loaded`` from the program store (written by an earlier
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
        ``loaded``; ``to_json`` / ``load`` (from :class:`dpjax._base.results.ResultMixin`) write and read
        it as strict JSON."""
        return dict(rows=[dict(r) for r in self.rows], programs=self.programs, seconds=self.seconds,
                    devices=self.devices, compiled=self.compiled, loaded=self.loaded)

    @classmethod
    def from_dict(cls, data: dict) -> "SweepTable":
        """Rebuild a table from :meth:`to_dict` (or parsed :meth:`to_json`) data."""
        from dpjax._base.io import restore_nonfinite

        rows = tuple({k: restore_nonfinite(v) for k, v in r.items()} for r in data["rows"])
        return cls(rows=rows, programs=int(data.get("programs", 0)), seconds=float(data.get("seconds", 0.0)),
                   devices=int(data.get("devices", 1)), compiled=int(data.get("compiled", 0)),
                   loaded=int(data.get("loaded", 0)))

    def __len__(self) -> int:
        return len(self.rows)
