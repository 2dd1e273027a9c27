"""Sweep configurations and rows (:mod:`dpjax.pld.sweeps.driver`, step 0).

:class:`SweepConfig` (one DP-SGD configuration: ``sigma``, ``q``, ``T``, a target ``delta`` or
``epsilon``, a group size), :func:`sweep_grid` (their Cartesian product), the row columns
:data:`ROW_FIELDS`, the sweep's own grid policy (:data:`SWEEP_OPTIONS`, its stated slack
:data:`SWEEP_SLACK` against the single call), and what the other sweep modules read of a
configuration: its components (:func:`config_components`), its grid options
(:func:`options_for`) and a row's configuration fields (:func:`config_fields`,
:func:`matches` for resumed rows).  Host-side NumPy only; nothing here compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import Query
from dpjax.pld.grid import engine
from dpjax.pld.grid.plan import GridOptions

__all__ = ["ROW_FIELDS", "SWEEP_OPTIONS", "SWEEP_SLACK", "grid_name", "SweepConfig", "sweep_grid", "as_configs",
           "config_components", "options_for", "config_fields", "matches"]


#: Columns of every row, in order (CSV header).
ROW_FIELDS = ("index", "noise_multiplier", "sampling_prob", "steps", "group_size", "target_delta", "target_epsilon",
              "query", "epsilon", "delta", "lower", "upper", "grid", "n", "dx", "path")


#: Stated slack of an epsilon row (default options) against :func:`dpjax.pld.dpsgd_epsilon`:
#: ``|sweep - single| <= SWEEP_SLACK * single`` (relative).  Both are certified upper bounds and
#: their certified brackets overlap, so the difference is also at most the wider bracket.
SWEEP_SLACK = 1e-3


#: The sweep's default grid policy (``options=None``): a relative accuracy target on epsilon of
#: a quarter of :data:`SWEEP_SLACK` (``0.3 C dx^2 / sigma_c <= 2.5e-4 * epsilon``; no per-step
#: target) and no minimum FFT length, instead of the single call's ``GridOptions()`` (the
#: tighter of 1e-3 relative and 8e-9 per step, at least 2^16 points).  Sound whatever the grid
#: (docs/design.md §2.4).  The target is a quarter of the slack, not all of it, because the
#: planning law is a model: a grid's actual error can exceed its target by a small factor.
#: Pass ``options=GridOptions()`` for the single call's own grids (rows then equal it up to the
#: bucket slack of 1e-6).
SWEEP_OPTIONS = GridOptions(relative_accuracy=SWEEP_SLACK / 4, per_step_accuracy=0.5, n_min=2**12)


def grid_name(options: GridOptions | None) -> str:
    """The ``grid`` of a row: ``"sweep"`` (:data:`SWEEP_OPTIONS`), ``"accountant"`` (the single
    call's ``GridOptions()``, as :func:`dpjax.pld.dpsgd_epsilon`) or ``"custom"``."""
    if options == SWEEP_OPTIONS:
        return "sweep"
    return "accountant" if options == GridOptions() else "custom"


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """One configuration.  Exactly one of ``delta`` (epsilon query) and ``epsilon`` (delta query).

    Attributes:
      noise_multiplier: sigma > 0 (noise std / clip norm).
      sampling_prob: Poisson sampling probability q in (0, 1].
      steps: T >= 1.
      delta: target delta in (0, 1) (the row reports the certified epsilon), or None.
      epsilon: target epsilon >= 0 (the row reports the certified delta), or None.
      group_size: k >= 1 examples protected together (Poisson add/remove-k; :mod:`dpjax.group`).
    """

    noise_multiplier: float
    sampling_prob: float
    steps: int
    delta: float | None = None
    epsilon: float | None = None
    group_size: int = 1

    @property
    def query(self) -> Query:
        """What the row computes: ``EPSILON`` at the target ``delta``, else ``DELTA`` at ``epsilon``."""
        return Query.EPSILON if self.delta is not None else Query.DELTA

    def validate(self) -> "SweepConfig":
        s = float(_validate.positive("noise_multiplier", self.noise_multiplier))
        q = float(_validate.probability_open_closed("sampling_prob", self.sampling_prob))
        t = _validate.positive_int("steps", self.steps)
        k = _validate.positive_int("group_size", self.group_size)
        if (self.delta is None) == (self.epsilon is None):
            raise ValueError(f"each configuration needs exactly one of delta and epsilon, got {self!r}")
        d = None if self.delta is None else float(_validate.probability_open("delta", self.delta))
        e = None if self.epsilon is None else float(_validate.nonnegative("epsilon", self.epsilon))
        return SweepConfig(s, q, t, d, e, k)

    def key(self) -> tuple:
        """Identity used by resume (a recorded row belongs to this configuration)."""
        return (self.noise_multiplier, self.sampling_prob, self.steps, self.delta, self.epsilon, self.group_size)

    @classmethod
    def from_mapping(cls, m: dict) -> "SweepConfig":
        if not isinstance(m, dict):
            raise ValueError(f"a configuration must be a mapping with noise_multiplier, sampling_prob, steps and "
                             f"delta (or epsilon), got {m!r}")
        allowed = {"noise_multiplier", "sampling_prob", "steps", "delta", "epsilon", "group_size",
                   "target_delta", "target_epsilon"}
        extra = set(m) - allowed
        if extra:
            raise ValueError(f"unknown configuration field(s) {sorted(extra)}; allowed: {sorted(allowed)}")
        missing = [f for f in ("noise_multiplier", "sampling_prob", "steps") if m.get(f) is None]
        if missing:
            raise ValueError(f"configuration {m!r} is missing {missing}")
        d = m.get("delta", m.get("target_delta"))
        e = m.get("epsilon", m.get("target_epsilon"))
        return cls(m["noise_multiplier"], m["sampling_prob"], m["steps"], d, e, _group_size_field(m)).validate()


def _group_size_field(m: dict):
    """``group_size`` of a mapping: absent or None means 1; anything else is validated as given
    (0 or False is an error, not a silent 1)."""
    k = m.get("group_size")
    return 1 if k is None else k


def _as_list(name, v) -> list:
    if v is None:
        return [None]
    if isinstance(v, (str, bytes)):
        raise ValueError(f"{name} must be a number or a sequence of numbers, got {v!r}")
    a = np.atleast_1d(np.asarray(v, dtype=object))
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a number or a non-empty 1-D sequence, got {v!r}")
    return list(a)


def sweep_grid(noise_multiplier, sampling_prob=None, steps=None, delta=None, epsilon=None, group_size=1, *,
               sampling="poisson", epochs=None) -> list:
    """The Cartesian product of the given values (scalars or sequences), as configurations of
    :func:`dpjax.sweep`.

    Poisson (``sampling="poisson"``, the default): :class:`SweepConfig` values; order:
    ``noise_multiplier`` varies slowest, then ``sampling_prob``, ``steps``, ``delta`` /
    ``epsilon``, ``group_size`` (``itertools.product`` order).

    Random allocation and balls-in-bins: ``sampling`` a :class:`dpjax.RandomAllocation` /
    :class:`dpjax.BallsInBins` or a sequence of them, and ``epochs`` (integers) instead of
    ``sampling_prob``, ``steps`` and ``group_size``: mappings with ``sampling``,
    ``noise_multiplier``, ``batches_per_epoch``, ``selections_per_epoch``, ``epochs`` and the
    target, in the order ``noise_multiplier``, ``sampling``, ``epochs``, ``delta`` / ``epsilon``.

    Exactly one of ``delta`` and ``epsilon``.

    Example::

        >>> sweep_grid([0.8, 1.0], [0.001, 0.01], 1000, delta=1e-5)                     # doctest: +SKIP
        >>> sweep_grid(1.0, sampling=[dpjax.RandomAllocation(t) for t in (10, 100)], epochs=[1, 5],
        ...            delta=1e-5)                                                        # doctest: +SKIP
    """
    if (delta is None) == (epsilon is None):
        raise ValueError("give exactly one of delta and epsilon")
    if not (isinstance(sampling, str) and sampling == "poisson"):
        return _allocation_grid(noise_multiplier, sampling_prob, steps, delta, epsilon, group_size, sampling, epochs)
    if epochs is not None:
        raise ValueError("epochs is for random-allocation and balls-in-bins grids (give steps)")
    out = []
    for s, q, t, d, e, k in itertools.product(
            _as_list("noise_multiplier", noise_multiplier), _as_list("sampling_prob", sampling_prob),
            _as_list("steps", steps), _as_list("delta", delta), _as_list("epsilon", epsilon),
            _as_list("group_size", group_size)):
        out.append(SweepConfig(s, q, t, d, e, k).validate())
    return out


def _allocation_grid(noise_multiplier, sampling_prob, steps, delta, epsilon, group_size, sampling, epochs) -> list:
    """:func:`sweep_grid` of random-allocation / balls-in-bins schemes."""
    from dpjax.pld.scenario import BallsInBins, RandomAllocation

    schemes = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling]
    if not schemes or not all(isinstance(x, (RandomAllocation, BallsInBins)) for x in schemes):
        raise ValueError(f"sampling must be 'poisson', or a RandomAllocation / BallsInBins (or a sequence of them) "
                         f"for a sweep grid, got {sampling!r}")
    if sampling_prob is not None or steps is not None or group_size != 1:
        raise ValueError("sampling_prob, steps and group_size are for Poisson grids; random allocation and "
                         "balls-in-bins take the scheme and epochs")
    if epochs is None:
        raise ValueError("a random-allocation / balls-in-bins grid needs epochs (integers >= 1)")
    out = []
    for s, scheme, e, d, eps in itertools.product(
            _as_list("noise_multiplier", noise_multiplier), schemes, _as_list("epochs", epochs),
            _as_list("delta", delta), _as_list("epsilon", epsilon)):
        kw = scheme.keywords()
        kw.setdefault("selections_per_epoch", 1)
        out.append(dict(kw, noise_multiplier=s, epochs=e, delta=d, epsilon=eps))
    return out


def as_configs(configs) -> list[SweepConfig]:
    if isinstance(configs, dict):  # columns of equal length
        cols = {k: _as_list(k, v) for k, v in configs.items()}
        lens = {len(v) for v in cols.values()}
        if len(lens) != 1:
            raise ValueError(f"configuration columns must have equal lengths, got { {k: len(v) for k, v in cols.items()} }")
        n = lens.pop()
        configs = [{k: v[i] for k, v in cols.items()} for i in range(n)]
    try:
        items = list(configs)
    except TypeError:
        raise ValueError(f"configs must be a list of configurations (mappings or SweepConfig), got {configs!r}") from None
    if not items:
        raise ValueError("configs must not be empty")
    return [c.validate() if isinstance(c, SweepConfig) else SweepConfig.from_mapping(c) for c in items]


def config_components(cfg: SweepConfig):
    if cfg.group_size == 1:
        return engine.dpsgd_components(cfg.noise_multiplier, cfg.sampling_prob, cfg.steps)
    # Poisson sampling, add/remove-k adjacency: the mixture-of-Gaussians step of Ganesh (2024),
    # Thm 3.1, as dpjax.group builds it (from the pld layer's own modules: no upward import).
    from dpjax.pld.group_spec import validate_group_spec
    from dpjax.pld.mog import GroupSubsampledGaussian

    spec = validate_group_spec(cfg.sampling_prob, group_size=cfg.group_size)
    mech = GroupSubsampledGaussian(cfg.noise_multiplier, float(spec.group_size), sampling_prob=float(spec.sampling_prob))
    return [(mech.validate(), cfg.steps)]


def options_for(cfg: SweepConfig, options: GridOptions | None) -> GridOptions:
    """The grid policy of a row: the caller's options, else :data:`SWEEP_OPTIONS` for an epsilon
    query and the single call's ``GridOptions()`` for a delta query (a relative accuracy target on
    epsilon does not bound the relative error of small deltas)."""
    if options is not None:
        return options
    return SWEEP_OPTIONS if cfg.query is Query.EPSILON else GridOptions()


def config_fields(cfg: SweepConfig, value: float) -> dict:
    """A row's configuration and value: the target as ``target_delta`` / ``target_epsilon``, the
    certified value as ``epsilon`` / ``delta`` (the one the query computes; the other is None)."""
    return dict(noise_multiplier=cfg.noise_multiplier, sampling_prob=cfg.sampling_prob, steps=cfg.steps,
                group_size=cfg.group_size, target_delta=cfg.delta, target_epsilon=cfg.epsilon, query=cfg.query,
                epsilon=value if cfg.query is Query.EPSILON else None, delta=value if cfg.query is Query.DELTA else None)


def matches(row: dict, cfg: SweepConfig) -> bool:
    def same(a, b):
        if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
            return (a is None or (isinstance(a, float) and math.isnan(a))) and b is None
        return float(a) == float(b)
    given = "delta" if cfg.query is Query.EPSILON else "epsilon"
    # target_delta / target_epsilon; rows of earlier releases held the target in delta / epsilon.
    recorded = row.get("target_" + given, row.get(given))
    return (row.get("query") == cfg.query and same(row.get("noise_multiplier"), cfg.noise_multiplier)
            and same(row.get("sampling_prob"), cfg.sampling_prob) and int(row.get("steps")) == cfg.steps
            and int(row.get("group_size", 1)) == cfg.group_size
            and same(recorded, getattr(cfg, given)))
