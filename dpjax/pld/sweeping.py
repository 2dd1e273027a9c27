"""Sweeps: thousands of DP-SGD configurations in a handful of compiled programs.

``sweep(configs)`` takes a list of configurations (noise multiplier ``sigma``, sampling
probability ``q``, steps ``T``, and either a target ``delta`` (an epsilon query) or a target
``epsilon`` (a delta query), optionally a ``group_size``) and returns a :class:`SweepTable`: one
row per configuration, in input order, with the certified value, its certified bracket
``[lower, upper]`` and the grid used (``n``, ``dx``).

How it stays fast on the first call.  Compilation, not arithmetic, is the cost of a first
call: every new FFT length ``n`` (and support length, frequency count, batch size) is a new
XLA program.  The sweep therefore

1. plans every configuration's grid on the host with the planner of :func:`dpjax.pld.epsilon`
   (:func:`dpjax.pld.plan_grid`; no compile, ~5 ms each), for epsilon queries under the sweep's
   own grid policy :data:`SWEEP_OPTIONS` (below), and rounds an epsilon query's FFT length up
   to a power of two;
2. puts configurations with the same program signature in one *bucket*: same query kind,
   directions, FFT length ``n`` and mechanism structure.  A bucket of an epsilon query with
   fewer than :data:`MIN_BUCKET` members moves up to the next larger ``n`` of the same structure
   (same ``dx``, offsets and supports, a wider window: only the wrap-around terms change, and
   they only shrink); rows that are re-planned (step 4) join an already compiled program when
   one holds them.  Inside a bucket the static sizes are padded to the bucket's largest: the
   single-step support length ``m`` (a longer support only moves single-step mass from the
   ``+inf`` atom onto grid points, each of which contributes at most what the atom did: still
   an upper bound, never looser) and the number of kept frequencies (more kept frequencies
   means a smaller truncation bound; all kept when any member keeps all);
3. runs every bucket as ONE jitted program: the accountant's own program
   (:func:`dpjax.pld.accountant._program`) in a loop over a fixed-size chunk of configurations
   (padding slots are never computed), so a sweep compiles one program per bucket (5 on the
   issue's 1,000-configuration DP-SGD distribution, retries included; 8 before the planner sized
   windows by the probe's Chernoff quantiles, step 4, and small buckets joined larger ones
   from 128 members down instead of 24), whatever the number of configurations.
   Programs are compiled ahead, in a background pool of :data:`COMPILE_WORKERS` threads in run
   order, so compiling bucket ``k + 1`` overlaps running bucket ``k``;
4. applies the accountant's own retry rules to each row's diagnostics (a wrap-around bound over
   budget: re-plan a wider window at the same ``dx``; a frequency-truncation bound that is not
   negligible: keep every frequency); retried rows form the buckets of the next round.  They
   are rare because the planner (:func:`dpjax.pld.plan_grid`) sizes every
   window by the Chernoff quantiles of the probe's composed log-MGF at the retry threshold too,
   which a composition far from Gaussian (small ``q * T``) needs: on the issue's distribution 22
   of 1,000 rows re-run (164 with the Cornish-Fisher width alone, each a second run and most a
   second program).  A retried row that no compiled program holds has its program compiled as
   soon as the row is known, behind the round's own compiles, with generous static sizes
   (supports ``n`` long, 4x the kept frequencies) so that rows retried later fit it too: it
   overlaps the rest of the round instead of running alone at the end (measured: first pass
   17.2-17.7 s against 18.0-19.0 s, three runs each, idle 2 cores);
5. gives every row the single call's error accounting: a row where the single call would not
   stop at the grid's answer (a direction the grid cannot certify, or an FFT round-off floor
   that matters at the requested delta, near 1e-12 and below) is recomputed by
   :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` (path "single": the tilted tail pass and
   the fallback bounds of :mod:`dpjax.pld.fallback`).

Grid policy and slack.  Profiled on 1,000 configurations of the issue's distribution (sigma in
[0.6, 3], q in [1e-3, 3e-2], T in [1e2, 3e4], delta 1e-5), the run time of a bucket grows with
the FFT length ``n`` and, about four times faster per point, with the single-step support
length ``m`` (loss CDFs, discretization and log-MGF per point); the single call's grids
(``GridOptions()``: the tighter of 1e-3 relative and 8e-9 per step, at least 2^16 points) put
the median configuration at ``n = 2^16``, ``m = 12288`` (up to 393216 / 196608).  For epsilon
queries the sweep plans with :data:`SWEEP_OPTIONS` instead: a relative target of 1e-4 on
epsilon (the connect-the-dots law ``0.3 C dx^2 / sigma_c <= 1e-4 epsilon``) and no minimum
length, which gives median ``n = 24576``, ``m = 3072`` (before rounding ``n`` to a power of two).
It is as sound as any grid (soundness never depends on the plan, docs/design.md §2.4); the
only change is tightness: each epsilon row is within :data:`SWEEP_SLACK` (1e-3) relative of
:func:`dpjax.pld.dpsgd_epsilon` on that configuration (measured on the 1,000-row test: see
``tests/test_sweep.py``; typically 1e-4), and the two certified brackets overlap (each value
lies above the other's certified lower end), so neither is below the truth, the exact oracle
(q = 1 rows are answered from the closed form) or dp_accounting's optimistic estimate.  The
lower end of the bracket is computed on the same coarser grid: it is looser than the single
call's (median bracket width 3e-4 relative, largest 3e-2 on 100 configurations, against
<= 1.2e-3 for the single call).  ``options=GridOptions()`` restores the single call's grids
(rows then equal it up to the bucket slack of 1e-6 relative: padding only moves the
truncation and wrap-around terms, which stay below ``tail_fraction * delta``).  Delta queries
always use the single call's policy (a relative target on epsilon does not bound the relative
error of small deltas) and keep the planned ``n`` (a longer FFT raises the round-off floor of
deltas below ``GridOptions.delta_tail_mass``); their rows equal :func:`dpjax.pld.dpsgd_delta` up
to the bucket slack.

Devices.  The configuration axis of every chunk is sharded over every device JAX sees
(``jax.sharding.NamedSharding`` on a 1-D mesh named ``"configs"``; the chunk size is a multiple
of the device count).  Eight fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) give the same table as one.  Multi-host:
call ``jax.distributed.initialize()`` in every process before the sweep and run the same sweep
in every process; ``jax.devices()`` then lists every host's devices, the global input arrays are
built with ``jax.make_array_from_callback`` (each process supplies only its own shards; every
process plans the same configurations, planning is deterministic) and the output is gathered
with ``jax.experimental.multihost_utils.process_allgather``: the same code path as one device.
Only process 0 should write ``out`` (pass ``out=None`` elsewhere).

Long sweeps.  ``out="sweep.csv"`` writes rows as they are computed (CSV and JSON lines next to
it, Parquet at the end if ``pyarrow`` is installed; :mod:`dpjax.pld.sweep_store`), and
``resume=True`` skips every configuration already recorded there: a killed sweep (even
``kill -9``) resumes without recomputing or losing a row, and the final files hold every
configuration exactly once, in input order.  Progress (:mod:`dpjax._progress`) shows on stderr: a
bar in a terminal or notebook, lines in a log.

Example::

    >>> import dpjax
    >>> configs = dpjax.pld.sweep_grid(noise_multiplier=[0.8, 1.0, 2.0], sampling_prob=[0.001, 0.01],
    ...                                steps=[1000, 10000], delta=1e-5)          # doctest: +SKIP
    >>> table = dpjax.sweep(configs, out="sweep.csv")                           # doctest: +SKIP
    >>> table.rows[0]["epsilon"], table.rows[0]["lower"], table.rows[0]["upper"]  # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import json
import math
import time
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._results import ResultMixin

from dpjax import _validate
from dpjax._progress import progress as _progress_bar
from dpjax._x64 import host_only
from dpjax.pld import accountant as _acc
from dpjax.pld import cache as _cache
from dpjax.pld.plan import GridOptions, _n_freq, plan_grid

__all__ = ["SweepConfig", "SweepTable", "sweep", "sweep_grid", "ROW_FIELDS", "SWEEP_OPTIONS", "SWEEP_SLACK"]

#: Columns of every row, in order (CSV header).
ROW_FIELDS = ("index", "noise_multiplier", "sampling_prob", "steps", "group_size", "target_delta", "target_epsilon",
              "query", "epsilon", "delta", "lower", "upper", "grid", "n", "dx", "path")


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
    def query(self) -> str:
        return "epsilon" if self.delta is not None else "delta"

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


def sweep_grid(noise_multiplier, sampling_prob, steps, delta=None, epsilon=None, group_size=1) -> list[SweepConfig]:
    """The Cartesian product of the given values (scalars or sequences), as configurations.

    Order: ``noise_multiplier`` varies slowest, then ``sampling_prob``, ``steps``, ``delta`` /
    ``epsilon``, ``group_size`` (``itertools.product`` order).  Exactly one of ``delta`` and
    ``epsilon``.
    """
    if (delta is None) == (epsilon is None):
        raise ValueError("give exactly one of delta and epsilon")
    out = []
    for s, q, t, d, e, k in itertools.product(
            _as_list("noise_multiplier", noise_multiplier), _as_list("sampling_prob", sampling_prob),
            _as_list("steps", steps), _as_list("delta", delta), _as_list("epsilon", epsilon),
            _as_list("group_size", group_size)):
        out.append(SweepConfig(s, q, t, d, e, k).validate())
    return out


def _as_configs(configs) -> list[SweepConfig]:
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


# ------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class SweepTable(ResultMixin):
    """The result of :func:`sweep`: ``rows`` (dicts with :data:`ROW_FIELDS`) in input order.

    Row fields (:data:`ROW_FIELDS`): the configuration, its target (``target_delta`` for an
    epsilon query, ``target_epsilon`` for a delta query); ``query`` ("epsilon" or "delta"); the
    certified value in the queried column (``epsilon`` for an epsilon query, ``delta`` for a
    delta query: an upper bound, ``inf`` / 1 when nothing can be certified; the other column is
    None); ``lower`` / ``upper`` the certified bracket of that value (``upper`` is the value);
    ``grid`` the grid policy it was computed on ("sweep": :data:`SWEEP_OPTIONS`, within
    :data:`SWEEP_SLACK` of the single call; "accountant": the single call's own grid, as
    :func:`dpjax.pld.dpsgd_epsilon`; "custom": the ``options`` given; "closed_form": q = 1, no
    grid) and ``n``, ``dx`` its size and spacing; ``path`` "batched" (bucket
    program), "exact" (q = 1: the closed form, no grid, ``n = dx = 0``), "single" (recomputed by
    the single-configuration accountant) or "resumed" (read
    back from ``out``).
    """

    rows: tuple
    programs: int = 0
    seconds: float = 0.0
    devices: int = 1

    def column(self, name: str) -> np.ndarray:
        return np.asarray([np.nan if r[name] is None else r[name] for r in self.rows], dtype=np.float64)

    @property
    def epsilon(self) -> np.ndarray:
        return self.column("epsilon")

    @property
    def delta(self) -> np.ndarray:
        return self.column("delta")

    def to_dict(self) -> dict:
        """Plain data: ``rows`` (list of dicts), ``programs``, ``seconds``, ``devices``; ``to_json``
        / ``load`` (from :class:`dpjax._results.ResultMixin`) write and read it as strict JSON."""
        return dict(rows=[dict(r) for r in self.rows], programs=self.programs, seconds=self.seconds,
                    devices=self.devices)

    @classmethod
    def from_dict(cls, data: dict) -> "SweepTable":
        """Rebuild a table from :meth:`to_dict` (or parsed :meth:`to_json`) data."""
        from dpjax._results import _restore_floats

        rows = tuple({k: _restore_floats(v) for k, v in r.items()} for r in data["rows"])
        return cls(rows=rows, programs=int(data.get("programs", 0)), seconds=float(data.get("seconds", 0.0)),
                   devices=int(data.get("devices", 1)))

    def __len__(self) -> int:
        return len(self.rows)


# ------------------------------------------------------------------------------------------
# Planning and bucketing


def _components(cfg: SweepConfig):
    if cfg.group_size == 1:
        return _acc._dpsgd_components(cfg.noise_multiplier, cfg.sampling_prob, cfg.steps)
    # Poisson sampling, add/remove-k adjacency: the mixture-of-Gaussians step of Ganesh (2024),
    # Thm 3.1, as dpjax.group builds it (from the pld layer's own modules: no upward import).
    from dpjax.pld.group_spec import validate_group_spec
    from dpjax.pld.mog import GroupSubsampledGaussian

    spec = validate_group_spec(cfg.sampling_prob, group_size=cfg.group_size)
    mech = GroupSubsampledGaussian(cfg.noise_multiplier, float(spec.group_size), sampling_prob=float(spec.sampling_prob))
    return [(mech.validate(), cfg.steps)]


@dataclasses.dataclass
class _Planned:
    index: int
    cfg: SweepConfig
    plan: Any
    directions: tuple
    want: str
    signature: tuple
    attempt: int = 0
    groups: Any = None

    def _signed(self) -> "_Planned":
        self.signature = (self.want, self.directions, self.plan.n, self.plan.n_freq is None, _signature(self.groups))
        return self


def _signature(groups) -> tuple:
    sig = []
    for g in groups:
        leaves, tree = jax.tree_util.tree_flatten(g.mechanism)
        sig.append((type(g.mechanism), str(tree), tuple(np.shape(x) for x in leaves), len(g.counts)))
    return tuple(sig)


def _query(cfg: SweepConfig, options: GridOptions):
    if cfg.query == "epsilon":
        return "eps", dict(tail_mass=options.tail_fraction * cfg.delta, eps_hint=None, target_delta=cfg.delta)
    return "delta", dict(tail_mass=options.delta_tail_mass, eps_hint=cfg.epsilon, target_delta=None)


def _options_for(cfg: SweepConfig, options: GridOptions | None) -> GridOptions:
    """The grid policy of a row: the caller's options, else :data:`SWEEP_OPTIONS` for an epsilon
    query and the single call's ``GridOptions()`` for a delta query (a relative accuracy target on
    epsilon does not bound the relative error of small deltas)."""
    if options is not None:
        return options
    return SWEEP_OPTIONS if cfg.query == "epsilon" else GridOptions()


def _plan(index: int, cfg: SweepConfig, options: GridOptions | None, min_width: float = 0.0, attempt: int = 0,
          groups=None) -> _Planned:
    options = _options_for(cfg, options)
    if groups is None:
        # Host planning is a pure function of the configuration and the options (~5-10 ms):
        # memoized, so re-running a sweep (or resuming one) plans nothing twice.
        p = _plan_memo(cfg, options, min_width)
        return dataclasses.replace(p, index=index, attempt=attempt)
    return _plan_uncached(index, cfg, options, min_width, attempt, groups)


@functools.lru_cache(maxsize=16384)
def _plan_memo(cfg: SweepConfig, options: GridOptions, min_width: float) -> _Planned:
    return _plan_uncached(-1, cfg, options, min_width, 0, None)


def _plan_uncached(index: int, cfg: SweepConfig, options: GridOptions, min_width: float = 0.0, attempt: int = 0,
                   groups=None) -> _Planned:
    if groups is None:
        groups, _lo, symmetric, _blocked = _acc._prepare(_components(cfg), options.max_distinct)
    directions = ("remove",) if all(getattr(type(g.mechanism), "symmetric", False) for g in groups) \
        else ("remove", "add")
    want, kw = _query(cfg, options)
    plan = plan_grid(groups, directions, options=options, min_width=min_width, **kw)
    if _ROUND_N_POW2 and want == "eps":
        plan = _pow2_plan(plan)
    return _Planned(index, cfg, plan, directions, want, (), attempt, groups)._signed()


#: Round every planned FFT length of an epsilon query up to a power of two (``3 * 2^k`` ->
#: ``2^(k+2)``): fewer distinct programs (one compile each) for a slightly longer FFT.
_ROUND_N_POW2 = True


def _pow2_plan(plan):
    """The same plan with ``n`` rounded up to a power of two: same ``dx``, same offsets and
    supports, a wider window (the wrap-around bounds only shrink; soundness never depends on
    the plan, docs/design.md §2.4), and the kept-frequency count recomputed for the new ``n``
    by the planner's own rule."""
    n = 1 << max(0, (int(plan.n) - 1).bit_length())
    if n == plan.n:
        return plan
    n_freq = plan.n_freq
    if n_freq is not None:  # the planner's rule at the new length (an int: all kept if it says None)
        n_freq = _n_freq(n, plan.dx, min(plan.sigma_composed), plan.total_count) or (n // 2 + 1)
    return dataclasses.replace(plan, n=n, n_freq=n_freq)


# ------------------------------------------------------------------------------------------
# The batched program


@functools.lru_cache(maxsize=None)
def _batched(mesh, directions, ms, n, kinds, want, n_freq):
    """One jitted program for a bucket: the accountant's program (:func:`dpjax.pld.accountant._program`)
    looped over the configurations of a chunk, the chunk's leading axis sharded over ``mesh``.

    Each device runs a ``lax.while_loop`` over its own block of the chunk, stopping after its
    ``count`` real configurations (padding costs nothing at run time, so one chunk size serves
    every bucket).  A loop rather than ``jax.vmap``: vmapping turns the window's dynamic slices
    and the conversion's lookups into batched gathers, measured 6x slower on CPU at n = 98304.
    Output ``(chunk, directions, kinds, 1 + 6)``.
    """
    from jax.sharding import PartitionSpec as P

    def one(g, dx, lam, lt, d, e):
        return _acc._program(g, dx, lam, lt, d, e, directions=directions, ms=ms, n=n, kinds=kinds, want=want,
                             n_freq=n_freq)

    def local(count, groups, dx, lambdas, log_tau, deltas, epsilons):
        size = dx.shape[0]
        out0 = jnp.zeros((size, len(directions), len(kinds), 1 + len(_acc._DIAGNOSTICS)), jnp.float64)

        def body(state):
            i, out = state
            take = lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False)
            val = one(jax.tree_util.tree_map(take, groups), take(dx), take(lambdas), take(log_tau), take(deltas),
                      take(epsilons))
            return i + 1, jax.lax.dynamic_update_index_in_dim(out, val, i, 0)

        _, out = jax.lax.while_loop(lambda st: st[0] < count[0], body, (jnp.zeros((), count.dtype), out0))
        return out

    spec = P("configs")
    sharded = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    return jax.jit(sharded)


def _mesh(devices):
    from jax.sharding import Mesh

    return Mesh(np.asarray(devices), ("configs",))


def _global_array(x: np.ndarray, sharding):
    """A global array sharded along axis 0 (each process supplies its own shards; the same call
    on one host)."""
    x = np.ascontiguousarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def _gather(out) -> np.ndarray:
    if jax.process_count() > 1:  # pragma: no cover - multi-host only
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(out, tiled=True))
    return np.asarray(out)


def _bucket_static(members: list[_Planned]):
    """The bucket's padded static sizes: the largest support length (every direction and
    component) and the most kept frequencies (None: all)."""
    first = members[0]
    D = len(first.directions)
    G = len(first.plan.groups[0])
    m = max(max(p.plan.ms[di][gi] for di in range(D) for gi in range(G)) for p in members)
    ms = tuple(tuple(m for _ in range(G)) for _ in range(D))
    n_freq = None if first.plan.n_freq is None else max(p.plan.n_freq for p in members)
    return ms, n_freq


#: A bucket with fewer members than this joins the next larger FFT length of the same program
#: structure (a compile costs about as much as running ~100-300 configurations).  Measured on the
#: issue's 1,000 configurations (idle 2 cores, two runs each): 128 folds the 78-row n = 8192
#: bucket into n = 16384, 5 programs, first pass 16.4-19.3 s; 24 gave 6 programs, 18.3-22.1 s;
#: second passes alike (5.8-7.5 s).
MIN_BUCKET = 128


def _fits(static, old) -> bool:
    """Does the compiled program with static sizes ``old`` hold a bucket that needs ``static``
    (support lengths no longer, kept frequencies no fewer)?"""
    (ms, nf), (ms0, nf0) = static, old
    ok_m = all(a <= b for r, r0 in zip(ms, ms0) for a, b in zip(r, r0))
    ok_f = nf0 is None if nf is None else (nf0 is None or nf <= nf0)
    return ok_m and ok_f


#: Background compile threads of a sweep (XLA compiles each program on one core).
COMPILE_WORKERS = 2


def _with_n(p: _Planned, n: int) -> _Planned:
    """``p`` on a longer FFT (same ``dx``, offsets and supports: a wider window, sound and only
    tighter in the wrap-around terms), kept frequencies recomputed for ``n``."""
    if n == p.plan.n:
        return p
    plan = p.plan
    n_freq = plan.n_freq
    if n_freq is not None:  # the planner's rule at the new length (an int: all kept if it says None)
        n_freq = _n_freq(n, plan.dx, min(plan.sigma_composed), plan.total_count) or (n // 2 + 1)
    return dataclasses.replace(p, plan=dataclasses.replace(plan, n=n, n_freq=n_freq))._signed()


def _buckets(pending: list[_Planned], compiled: dict) -> list[tuple[tuple, list[_Planned]]]:
    """Group configurations into buckets: same program structure (query, directions, all or
    truncated frequencies, mechanism structure) and FFT length.  Small buckets move up to the
    next larger FFT length of the same structure (this round's or an already compiled one,
    ``compiled[structure]`` = set of lengths), so a sweep compiles few programs."""
    by_struct: dict[tuple, dict[int, list[_Planned]]] = {}
    for p in pending:
        struct = (p.signature[:2] + p.signature[3:])
        by_struct.setdefault(struct, {}).setdefault(p.plan.n, []).append(p)
    out = []
    for struct, by_n in by_struct.items():
        have = set(compiled.get(struct, ()))
        sizes = sorted(set(by_n) | have)
        for i, n in enumerate(sizes):
            members = by_n.get(n, [])
            if not members:
                continue
            bigger = [k for k in sizes[i + 1:] if k in have or len(by_n.get(k, ())) > 0]
            # Epsilon queries only: a longer FFT raises the round-off floor of deltas far below
            # GridOptions.delta_tail_mass, so delta rows keep the single call's own n.
            if struct[0] == "eps" and len(members) < MIN_BUCKET and n not in have and bigger:
                by_n.setdefault(bigger[0], []).extend(_with_n(p, bigger[0]) for p in members)
                by_n[n] = []
                continue
            out.append((struct, members))
    return out


def _chunk_args(members: list[_Planned], per_device: int, mesh):
    """The global input arrays of one chunk (``len(members) <= per_device * devices``).

    Layout: device ``d`` gets ``members[d::devices]`` first in its block, then padding (copies of
    the first member, never computed: each device loops over its real count only).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    ndev = mesh.devices.size
    first = members[0]
    slots, counts = [], []
    for d in range(ndev):
        mine = members[d::ndev]
        counts.append(len(mine))
        slots.extend(mine + [first] * (per_device - len(mine)))
    # Stack every leaf of the per-direction groups along a new leading axis.
    groups = jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                                    *[tuple(tuple(g) for g in p.plan.groups) for p in slots])
    dx = np.asarray([p.plan.dx for p in slots], np.float64)
    lambdas = np.stack([np.asarray(p.plan.lambdas, np.float64) for p in slots])
    log_tau = np.asarray([p.plan.log_tau for p in slots], np.float64)
    deltas = np.asarray([[p.cfg.delta if p.cfg.delta is not None else 0.5] for p in slots], np.float64)
    epsilons = np.asarray([[p.cfg.epsilon if p.cfg.epsilon is not None else 0.0] for p in slots], np.float64)
    count = np.asarray(counts, np.int32)
    sharding = NamedSharding(mesh, PartitionSpec("configs"))
    return jax.tree_util.tree_map(lambda x: _global_array(x, sharding),
                                  (count, groups, dx, lambdas, log_tau, deltas, epsilons))


#: Compiled bucket programs of this process, by static sizes and input shapes (a second sweep
#: of the same shapes compiles nothing).
_COMPILED: dict = {}


def _program_key(mesh, first: _Planned, kinds, static, args):
    ms, n_freq = static
    shapes = tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args))
    return (mesh, first.directions, ms, first.plan.n, kinds, first.want, n_freq,
            str(jax.tree_util.tree_structure(args)), shapes)


def _compile(key, mesh, first: _Planned, kinds, static, args):
    """The bucket's program, compiled ahead of its first call (thread-safe: runs in the
    background compile pool while other buckets run)."""
    fn = _COMPILED.get(key)
    if fn is None:
        ms, n_freq = static
        with jax.enable_x64(True):
            program = _batched(mesh, first.directions, ms, first.plan.n, kinds, first.want, n_freq)
            # With the persistent cache on (every CLI run), a serialized program from an earlier
            # process skips tracing and lowering (~0.4 s a program on 2 cores); else compile here.
            fn = _cache.exported_compiled(
                "sweep_program", program, args,
                repr((first.directions, ms, first.plan.n, kinds, first.want, n_freq, mesh.devices.size)))
            if fn is None:
                fn = program.lower(*args).compile()
        _COMPILED[key] = fn
    return fn


def _run_chunk(members: list[_Planned], per_device: int, kinds, mesh, static, fn=None, args=None):
    """Run one chunk of a bucket with the bucket's static sizes ``static = (ms, n_freq)`` (one
    program for every chunk of the bucket); ``fn`` the compiled program (compiled here if None),
    ``args`` the chunk's inputs (built here if None)."""
    ndev = mesh.devices.size
    if args is None:
        args = _chunk_args(members, per_device, mesh)
    if fn is None:
        fn = _compile(_program_key(mesh, members[0], kinds, static, args), mesh, members[0], kinds, static, args)
    out = _gather(fn(*args))
    results = {}
    for d in range(ndev):
        for j, p in enumerate(members[d::ndev]):
            results[p.index] = _acc._unpack(out[d * per_device + j], p.directions, kinds, (1,))
    return [results[p.index] for p in members], static


def _retry(p: _Planned, res, n_freq, options) -> _Planned | None:
    """The accountant's own retry rules (:func:`dpjax.pld.accountant._run`), for the next round:
    a frequency truncation that is not negligible -> the same plan with every frequency; a
    wrap-around bound over budget -> a wider window at the same ``dx`` (up to four plans).
    None: the row is final."""
    if n_freq is not None and any(float(r["truncation"]) > 1e-3 * p.plan.tau_wrap for rd in res for r in rd.values()):
        q = dataclasses.replace(p, plan=dataclasses.replace(p.plan, n_freq=None))
        return q._signed()
    budget = 10.0 * p.plan.tau_wrap
    over = any((k == "up" and float(r["tail_above"]) > budget) or float(r["tail_below"]) > budget
               for rd in res for k, r in rd.items())
    if not over or p.plan.n >= _options_for(p.cfg, options).n_max or p.attempt >= 3:
        return None
    needed = [float(r["needed_width"]) for rd in res for r in rd.values()]
    needed = max([w for w in needed if math.isfinite(w)], default=0.0)
    min_width = max(1.05 * needed, 1.5 * p.plan.n * p.plan.dx)
    return _plan(p.index, p.cfg, options, min_width=min_width, attempt=p.attempt + 1, groups=p.groups)


def _config_fields(cfg: SweepConfig, value: float) -> dict:
    """A row's configuration and value: the target as ``target_delta`` / ``target_epsilon``, the
    certified value as ``epsilon`` / ``delta`` (the one the query computes; the other is None)."""
    return dict(noise_multiplier=cfg.noise_multiplier, sampling_prob=cfg.sampling_prob, steps=cfg.steps,
                group_size=cfg.group_size, target_delta=cfg.delta, target_epsilon=cfg.epsilon, query=cfg.query,
                epsilon=value if cfg.query == "epsilon" else None, delta=value if cfg.query == "delta" else None)


def _row(p: _Planned, reports, path: str, grid: str) -> dict:
    dir_reports, upper, lower = _acc._combine(reports)
    upper, lower = float(np.ravel(upper)[0]), float(np.ravel(lower)[0])
    return dict(index=p.index, **_config_fields(p.cfg, upper), lower=lower, upper=upper, grid=grid,
                n=int(dir_reports[0].n), dx=float(dir_reports[0].dx), path=path)


def _needs_single(p: _Planned, res, row: dict) -> bool:
    """True where the single call would not stop at this grid's answer: a direction the grid
    could not certify (the single call then falls back on the bounds of
    :mod:`dpjax.pld.fallback`), or an FFT round-off floor that matters at the requested delta
    (the single call then re-runs the composition tilted towards the tail).  Such rows (tiny
    ``q T``, deltas near 1e-12 and below) are recomputed by :func:`dpjax.pld.epsilon` /
    :func:`dpjax.pld.delta`, so every row uses the single call's error accounting."""
    if p.cfg.query == "epsilon":
        if not math.isfinite(row["upper"]):
            return True
        level = p.cfg.delta
    else:
        if row["upper"] >= 1.0:
            return True
        level = min(float(np.min(r["up"]["value"])) for r in res)
    floor = max(float(r[k]["noise_floor"]) * p.plan.n for r in res for k in r)
    return level > 0 and floor > _acc._TAIL_PASS_FRACTION * level


def _single_row(index: int, cfg: SweepConfig, options: GridOptions, with_lower: bool) -> dict:
    """The row from the single-configuration accountant (path "single")."""
    comps = _components(cfg)
    if cfg.query == "epsilon":
        res = _acc.epsilon(comps, cfg.delta, options=options, with_lower=with_lower)
        value, lower, upper = float(res.epsilon), float(res.epsilon_lower), float(res.epsilon_upper)
    else:
        res = _acc.delta(comps, cfg.epsilon, options=options, with_lower=with_lower)
        value, lower, upper = float(res.delta), float(res.delta_lower), float(res.delta_upper)
    rep = res.directions[0]
    return dict(index=index, **_config_fields(cfg, value), lower=lower, upper=upper, grid=grid_name(options),
                n=int(rep.n), dx=float(rep.dx), path="single")


def _exact_row(index: int, cfg: SweepConfig) -> dict:
    """The row of a q = 1 configuration from the closed form (as :func:`dpjax.pld.dpsgd_epsilon`)."""
    mech = _acc.PoissonSubsampledGaussian(cfg.noise_multiplier, 1.0)
    if cfg.query == "epsilon":
        res = _acc.epsilon([(mech, cfg.steps)], cfg.delta)
        value, lower, upper = float(res.epsilon), float(res.epsilon_lower), float(res.epsilon_upper)
    else:
        res = _acc.delta([(mech, cfg.steps)], cfg.epsilon)
        value, lower, upper = float(res.delta), float(res.delta_lower), float(res.delta_upper)
    return dict(index=index, **_config_fields(cfg, value), lower=lower, upper=upper, grid="closed_form", n=0,
                dx=0.0, path="exact")


#: The sweep's default grid policy (``options=None``): a relative accuracy target of 1e-4 on
#: epsilon (``0.3 C dx^2 / sigma_c <= 1e-4 * epsilon``; no per-step target) and no minimum FFT
#: length, instead of the single call's ``GridOptions()`` (the tighter of 1e-3 relative and 8e-9
#: per step, at least 2^16 points).  Sound whatever the grid (docs/design.md §2.4); about 3x
#: shorter FFTs and single-step supports on the issue's DP-SGD distribution.  Slack against
#: :func:`dpjax.pld.dpsgd_epsilon`: see :data:`SWEEP_SLACK`.  Pass ``options=GridOptions()``
#: for the single call's own grids (rows then equal it up to the bucket slack of 1e-6).
SWEEP_OPTIONS = GridOptions(relative_accuracy=1e-4, per_step_accuracy=0.5, n_min=2**12)

#: Stated slack of an epsilon row (default options) against :func:`dpjax.pld.dpsgd_epsilon`:
#: ``|sweep - single| <= SWEEP_SLACK * single`` (relative).  Both are certified upper bounds and
#: their certified brackets overlap, so the difference is also at most the wider bracket.
SWEEP_SLACK = 1e-3

#: Configurations per device in one program call (the chunk is this times the device count).
DEFAULT_PER_DEVICE = 32


@host_only("dpjax.pld.epsilon_fn on a grid from dpjax.pld.plan_fixed_grid (jax.vmap over parameters)")
def sweep(configs=None, *, noise_multiplier=None, sampling_prob=None, steps=None, delta=None, epsilon=None,
          group_size=1, out=None, resume: bool = False, options: GridOptions | None = None,
          with_lower: bool = True, devices: Sequence | None = None, per_device: int = DEFAULT_PER_DEVICE,
          progress: bool | None = None, progress_bar: bool | None = None, sampling: str = "poisson",
          batches_per_epoch=None, selections_per_epoch=1, epochs=None) -> SweepTable:
    """Certified epsilon (or delta) for every configuration; one row each, in input order.

    Args:
      configs: a list of configurations (:class:`SweepConfig` or mappings with
        ``noise_multiplier``, ``sampling_prob``, ``steps``, ``delta`` or ``epsilon``, optional
        ``group_size``), or a dict of equal-length columns.  Or leave it None and give the grid
        keywords instead.
      noise_multiplier, sampling_prob, steps, delta, epsilon, group_size: a grid
        (:func:`sweep_grid`: Cartesian product, scalars or sequences).
      out: optional path (e.g. ``"sweep.csv"``): rows are written as they are computed (CSV and
        ``.jsonl``; ``.parquet`` at the end if pyarrow is installed).
      resume: with ``out``, skip configurations already recorded there (a killed sweep resumes).
      options: :class:`~dpjax.pld.GridOptions` (accuracy knobs) for every row, as for
        :func:`dpjax.pld.epsilon`.  Default None: :data:`SWEEP_OPTIONS` for epsilon queries
        (within :data:`SWEEP_SLACK` of :func:`dpjax.pld.dpsgd_epsilon`), ``GridOptions()`` for
        delta queries; ``GridOptions()`` gives every row the single call's grid.
      with_lower: also compute the certified lower end of the bracket (about doubles the work).
      devices: devices to shard the configuration axis over (default ``jax.devices()``: all).
      per_device: configurations per device in one program call.
      progress: show progress on stderr (None: auto, see :mod:`dpjax._progress`; False: never;
        the keyword of every dpjax function with a bar; ``progress_bar`` is its former name).
      sampling: ``"poisson"`` (default: the configurations above), or ``"random_allocation"`` /
        ``"balls_in_bins"``: then the grid keywords are ``noise_multiplier``,
        ``batches_per_epoch``, ``selections_per_epoch``, ``epochs`` and ``delta`` / ``epsilon``
        (or ``configs`` with those fields), and every row is the single call's value
        (:func:`dpjax.pld.allocation_accountant.allocation_sweep`).
      batches_per_epoch, selections_per_epoch, epochs: the random-allocation grid keywords
        (``t``, ``k``, ``E``; see ``sampling``).
    Returns:
      :class:`SweepTable` (``programs`` = number of distinct batched programs run).
    """
    if progress is not None and progress_bar is not None:
        raise ValueError("give progress or its former name progress_bar, not both")
    if sampling != "poisson" or batches_per_epoch is not None or epochs is not None:
        from dpjax.pld.allocation_accountant import allocation_sweep

        if sampling not in ("random_allocation", "balls_in_bins"):
            raise ValueError(f"sampling must be one of ('poisson', 'random_allocation', 'balls_in_bins'), got "
                             f"{sampling!r}")
        if sampling_prob is not None or steps is not None or group_size != 1:
            raise ValueError(f"sampling_prob, steps and group_size are for sampling='poisson', not {sampling!r}")
        return allocation_sweep(configs, sampling=sampling, noise_multiplier=noise_multiplier,
                                batches_per_epoch=batches_per_epoch, selections_per_epoch=selections_per_epoch,
                                epochs=epochs, delta=delta, epsilon=epsilon, out=out, resume=resume,
                                with_lower=with_lower, progress=progress if progress_bar is None else progress_bar)
    t0 = time.perf_counter()
    options = None if options is None else _acc._options(options)
    if configs is None:
        if noise_multiplier is None or sampling_prob is None or steps is None:
            raise ValueError("give configs, or the grid keywords noise_multiplier, sampling_prob, steps and "
                             "delta (or epsilon)")
        configs = sweep_grid(noise_multiplier, sampling_prob, steps, delta, epsilon, group_size)
    else:
        configs = _as_configs(configs)
    per_device = _validate.positive_int("per_device", per_device)
    if resume and out is None:
        raise ValueError("resume=True needs out (the file a previous run wrote)")
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices must not be empty")
    mesh = _mesh(devices)
    chunk = per_device * len(devices)
    kinds = ("up", "down") if with_lower else ("up",)

    store = None
    done: dict[int, dict] = {}
    if out is not None:
        from dpjax.pld.sweep_store import SweepStore

        store = SweepStore(out, ROW_FIELDS, resume=resume)
        for i, row in store.rows.items():
            if i >= len(configs) or not _matches(row, configs[i]):
                raise ValueError(f"{out} holds a row {i} that is not configuration {i} of this sweep; "
                                 f"resume only the sweep that wrote it (or write to a new file)")
            done[i] = dict(row, path="resumed")
    rows: dict[int, dict] = dict(done)
    todo = [i for i in range(len(configs)) if i not in done]
    programs = set()
    if progress is not None and progress_bar is not None:
        raise ValueError("give progress or its former name progress_bar, not both")
    show = progress if progress_bar is None else progress_bar
    with jax.enable_x64(True), _progress_bar(total=len(configs), desc="sweep", enabled=show,
                                        initial=len(done), unit="cfg") as bar:
        # A q = 1 row (group size 1) is one Gaussian mechanism: the single-configuration accountant
        # answers it from the exact closed form (no grid, no round-off floor), so the sweep does
        # too -- the row then equals dpjax.pld.dpsgd_epsilon exactly, and is exact.
        exact = [i for i in todo if configs[i].sampling_prob == 1.0 and configs[i].group_size == 1]
        if exact:
            new = [_exact_row(i, configs[i]) for i in exact]
            for row in new:
                rows[row["index"]] = row
            if store is not None:
                store.append(new)
            bar.update(len(new))
            todo = [i for i in todo if i not in set(exact)]
        pending = [_plan(i, configs[i], options) for i in todo]
        # structure -> {n: [static, ...]}: the programs compiled (or compiling) in this sweep
        sizes: dict[tuple, dict[int, list]] = {}
        inflight: dict = {}                          # program key -> compile future (this sweep)

        def bucket_jobs(pending, retry_round, only_new=False):
            """The buckets of ``pending`` with their static sizes, first-chunk inputs and program
            keys.  A bucket runs on a program of this sweep that holds it (the one with the
            shortest support) or gets its own; in a retry round (rows still arriving while the
            first round runs) a new program is made generous, every support ``n`` long and 4x
            the kept frequencies, so that later retried rows fit it too (few rows run on it).
            ``only_new``: just the buckets that need a new program (no inputs built for the rest)."""
            jobs = []
            for struct, members in _buckets(pending, sizes):
                n = members[0].plan.n
                static = _bucket_static(members)
                have = sizes.setdefault(struct, {}).setdefault(n, [])
                fit = [old for old in have if _fits(static, old)]
                if fit:  # an already compiled program of this sweep holds them
                    if only_new:
                        continue
                    static = min(fit, key=lambda st: max(max(r) for r in st[0]))
                else:
                    if retry_round:
                        ms, nf = static
                        ms = tuple(tuple(n for _ in r) for r in ms)
                        nf = None if nf is None else min(n // 2 + 1, 4 * nf)
                        static = (ms, nf)
                    have.append(static)
                parts = [members[i:i + chunk] for i in range(0, len(members), chunk)]
                args0 = _chunk_args(parts[0], per_device, mesh)
                jobs.append((parts, static, args0, _program_key(mesh, members[0], kinds, static, args0)))
            return jobs

        def submit(key, first, static, args0):
            if key not in inflight:
                inflight[key] = pool.submit(_compile, key, mesh, first, kinds, static, args0)
            return inflight[key]

        with concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_WORKERS) as pool:
            while pending:  # rounds: a retried row (rare) goes to the next round's buckets
                jobs = []
                for parts, static, args0, key in bucket_jobs(pending, retry_round=bool(programs)):
                    programs.add(key)
                    # Compile every bucket's program in the background, in run order: compiling
                    # bucket k + 1 overlaps running bucket k.
                    jobs.append((parts, static, args0, submit(key, parts[0][0], static, args0)))
                pending = []
                for parts, static, args0, fut in jobs:
                    fn = fut.result()
                    for k, part in enumerate(parts):
                        results, _ = _run_chunk(part, per_device, kinds, mesh, static, fn,
                                                args=args0 if k == 0 else None)
                        new = []
                        retried = len(pending)
                        for p, res in zip(part, results):
                            again = _retry(p, res, static[1], options)
                            if again is not None:
                                pending.append(again)
                                continue
                            row = _row(p, [(d, p.plan, r) for d, r in zip(p.directions, res)], "batched",
                                       grid_name(_options_for(p.cfg, options)))
                            if _needs_single(p, res, row):
                                row = _single_row(p.index, p.cfg, _options_for(p.cfg, options), with_lower)
                            rows[p.index] = row
                            new.append(row)
                        if len(pending) > retried:
                            # Retried rows that no compiled program holds: compile their program now
                            # (generous sizes, see bucket_jobs), behind this round's, so it overlaps the
                            # rest of the round instead of running alone at its end; the next round
                            # reuses it unless a later retry needs more than it holds.
                            for r_parts, r_static, r_args0, r_key in bucket_jobs(pending, retry_round=True,
                                                                                 only_new=True):
                                submit(r_key, r_parts[0][0], r_static, r_args0)
                        if store is not None:
                            store.append(new)
                        bar.update(len(new), programs=len(programs))
    table = SweepTable(rows=tuple(rows[i] for i in range(len(configs))), programs=len(programs),
                       seconds=time.perf_counter() - t0, devices=len(devices))
    if store is not None:
        store.finalize(table.rows)
    return table


def _matches(row: dict, cfg: SweepConfig) -> bool:
    def same(a, b):
        if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
            return (a is None or (isinstance(a, float) and math.isnan(a))) and b is None
        return float(a) == float(b)
    given = "delta" if cfg.query == "epsilon" else "epsilon"
    # target_delta / target_epsilon; rows of earlier releases held the target in delta / epsilon.
    recorded = row.get("target_" + given, row.get(given))
    return (row.get("query") == cfg.query and same(row.get("noise_multiplier"), cfg.noise_multiplier)
            and same(row.get("sampling_prob"), cfg.sampling_prob) and int(row.get("steps")) == cfg.steps
            and int(row.get("group_size", 1)) == cfg.group_size
            and same(recorded, getattr(cfg, given)))
