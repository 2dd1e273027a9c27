"""Sweeps: thousands of DP-SGD configurations in a handful of compiled programs.

``sweep(configs)`` takes a list of configurations (noise multiplier ``sigma``, sampling
probability ``q``, steps ``T``, and either a target ``delta`` (an epsilon query) or a target
``epsilon`` (a delta query), optionally a ``group_size``) and returns a :class:`SweepTable`: one
row per configuration, in input order, with the certified value, its certified bracket
``[lower, upper]`` and the grid used (``n``, ``dx``).

How it stays fast.  Compilation, not arithmetic, is the cost of a first call: every new FFT
length ``n`` (and support length, frequency count, batch size) is a new XLA program, ~2 s of
CPU to trace and compile, as much as running a few hundred configurations.  Padding every
configuration to one large shape avoids compiles but wastes run time (a configuration on an
FFT four times its own length costs about four times as much).  The sweep therefore

1. plans every configuration's grid on the host with the planner of :func:`dpjax.pld.epsilon`
   (:func:`dpjax.pld.plan_grid`; no compile, 1-5 ms each; in worker processes for sweeps of
   thousands of configurations on a many-core host), for epsilon queries under the sweep's own
   grid policy :data:`SWEEP_OPTIONS` (below), and rounds an epsilon query's FFT length up to a
   power of two;
2. chooses *buckets* by cost (:class:`BucketPolicy`): a configuration runs in a program whose
   static sizes are at least its own (a longer FFT, for epsilon queries: the same ``dx``, offsets
   and supports, a wider window, so only the wrap-around terms change, and they only shrink; a
   longer single-step support: single-step mass moves from the ``+inf`` atom onto grid points,
   each of which contributes at most what the atom did; more kept frequencies: a smaller
   truncation bound), and a model of the run cost per configuration (FFT length x log, support
   length, kept frequencies; fitted by ``benchmarks/bench_sweep_cost.py``) decides which
   configurations share a program: merges that save a compile at a smaller cost in padding are
   made greedily, never one that makes any configuration cost more than
   ``BucketPolicy.max_padding`` times its own shape.  Programs this process already has, or that
   an earlier process serialized in the persistent cache (below), cost no compile and are
   filled first.  So a few hundred configurations share a handful of programs and ten thousand
   get tighter ones; a configuration far from the rest keeps a shape near its own;
3. runs every bucket as ONE jitted program: :func:`dpjax.pld.sweep_program.epsilon_program`
   (the accountant's composition and conversion with both discretizations batched; delta
   queries run the accountant's own program) in a loop over a fixed-size chunk of configurations
   (padding slots are never computed).  Programs are compiled ahead, in a background pool of
   :data:`COMPILE_WORKERS` threads in run order, so compiling bucket ``k + 1`` overlaps running
   bucket ``k``;
4. applies the accountant's own retry rules to each row's diagnostics (a wrap-around bound over
   budget: re-plan a wider window at the same ``dx``; a frequency-truncation bound that is not
   negligible: keep every frequency); retried rows form the buckets of the next round, on the
   programs already compiled where they fit.  They are rare because the planner sizes every
   window by the Chernoff quantiles of the probe's composed log-MGF at the retry threshold too.
   A retried row that no program holds has its program compiled as soon as the row is known,
   behind the round's own compiles, so it overlaps the rest of the round;
5. gives every row the single call's error accounting: a row where the single call would not
   stop at the grid's answer (a direction the grid cannot certify, or an FFT round-off floor
   that matters at the requested delta) is recomputed by :func:`dpjax.pld.epsilon` /
   :func:`dpjax.pld.delta` (path "single": the tilted tail pass and the fallback bounds of
   :mod:`dpjax.pld.fallback`), unless the row's certified bracket or its floor-free bound shows
   that the single call cannot move it by more than :data:`SWEEP_SLACK` (see
   :func:`_needs_single`).

Across processes.  With the persistent cache on (every CLI run; :mod:`dpjax.pld.cache`) each
bucket program is also serialized with :mod:`jax.export` and indexed by its static sizes, and
the plans of a sweep are stored keyed by its configurations: a later process sweeping the same
(or similar) configurations plans nothing it planned before, buckets onto the serialized
programs, deserializes them instead of tracing and lowering, and its XLA compile is a
persistent-cache hit.  :attr:`SweepTable.compiled` and :attr:`SweepTable.loaded` count the
programs each sweep compiled and loaded.

Grid policy and slack.  Profiled on 1,000 random DP-SGD configurations (sigma in
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
Only process 0 should write ``out`` (pass ``out=None`` elsewhere).  On CPU each device loops
over its configurations one at a time (32 per chunk by default); on an accelerator each loop
step runs a block of configurations at once (``jax.vmap``, as many as fit
:data:`BLOCK_BYTES` of working memory; 256 per chunk by default).

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
import heapq
import itertools
import json
import math
import os
import pickle
import threading
import time
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.pld.records import SweepTable

from dpjax import _validate, _xla
from dpjax._progress import progress as _progress_bar
from dpjax._x64 import host_only
from dpjax.pld import accountant as _acc
from dpjax.pld import cache as _cache
from dpjax.pld import engine
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.pld.plan import GridOptions, _n_freq, plan_grid
from dpjax.pld.sweep_program import epsilon_program

__all__ = ["BucketPolicy", "SweepConfig", "SweepTable", "sweep", "sweep_grid", "ROW_FIELDS", "SWEEP_OPTIONS",
           "SWEEP_SLACK"]

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
# Planning and bucketing


def _components(cfg: SweepConfig):
    if cfg.group_size == 1:
        return engine.dpsgd_components(cfg.noise_multiplier, cfg.sampling_prob, cfg.steps)
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


def _plan_all(todo: list[int], configs: list[SweepConfig], options: GridOptions | None) -> list[_Planned]:
    """The plans of ``configs[i]`` for ``i`` in ``todo``.  With the persistent cache on (every CLI
    run) the whole list is also stored there, keyed by the configurations and options, so that
    a later process sweeping the same configurations plans nothing (planning is a pure function
    of them and of dpjax's sources, which the key covers)."""
    key = repr((_PLAN_CACHE_VERSION, options, [(i, configs[i].key()) for i in todo]))
    stored = _cache.load_object("sweep_plans", key)
    if isinstance(stored, list) and len(stored) == len(todo) and all(
            isinstance(p, _Planned) and p.index == i for p, i in zip(stored, todo)):
        return stored
    workers = _planning_workers(len(todo))
    if workers > 1:
        pending = _plan_parallel(todo, configs, options, workers)
    else:
        pending = [_plan(i, configs[i], options) for i in todo]
    if _cache.caching():
        # Stored in the background (pickling ~10^4 plans takes a while); joined before sweep returns.
        thread = threading.Thread(target=_cache.store_object, args=("sweep_plans", key, list(pending)), daemon=True)
        thread.start()
        _STORES.append(thread)
    return pending


#: Background writes of stored plans, joined at the end of every sweep.
_STORES: list = []


def _join_stores() -> None:
    while _STORES:
        _STORES.pop().join()


#: Bumped when :class:`_Planned` changes shape (stored plans of another layout are not used).
_PLAN_CACHE_VERSION = 1

#: Sweeps of at least this many configurations are planned in worker processes when the host
#: has more than two cores (planning is ~1-5 ms of NumPy per configuration, one core each).
PARALLEL_PLANNING_MIN = 2000


def _planning_workers(count: int) -> int:
    cores = _xla.usable_cpus()
    if count < PARALLEL_PLANNING_MIN or cores <= 2:
        return 1
    return min(cores - 1, 32, count // 250)


def _plan_batch(items, options):
    return [_plan(i, cfg, options) for i, cfg in items]


def _plan_worker_main() -> None:  # pragma: no cover - runs in a planning worker process
    """A planning worker: (items, options) pickled on stdin, their plans pickled on stdout."""
    import sys

    items, options = pickle.load(sys.stdin.buffer)
    pickle.dump(_plan_batch(items, options), sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


def _plan_parallel(todo, configs, options, workers: int) -> list[_Planned]:
    """:func:`_plan` over ``todo`` in ``workers`` fresh Python processes (``python -c``: nothing of
    this process is re-imported or re-run there, and ``JAX_PLATFORMS=cpu``: a worker never takes an
    accelerator); falls back to planning here if a worker fails."""
    import subprocess
    import sys

    items = [(i, configs[i]) for i in todo]
    size = -(-len(items) // workers)
    parts = [items[k:k + size] for k in range(0, len(items), size)]
    # This dpjax, whatever put it on this process's path.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    code = "from dpjax.pld import sweeping; sweeping._plan_worker_main()"
    results: list = [None] * len(parts)

    def run(k):
        try:
            proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((parts[k], options)),
                                  capture_output=True, env=env, timeout=3600)
            if proc.returncode == 0:
                results[k] = pickle.loads(proc.stdout)
        except Exception:
            results[k] = None

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(parts)) as pool:
        list(pool.map(run, range(len(parts))))
    if any(r is None for r in results):
        return [_plan(i, configs[i], options) for i in todo]
    planned = [p for part in results for p in part]
    for p in planned:   # the in-process memo serves a second sweep of the same configurations
        if p.attempt == 0:
            _plan_memo_put(p, options)
    return planned


_PLAN_MEMO: dict = {}
_PLAN_MEMO_MAX = 2**17


def _plan_memo(cfg: SweepConfig, options: GridOptions, min_width: float) -> _Planned:
    key = (cfg, options, min_width)
    p = _PLAN_MEMO.get(key)
    if p is None:
        p = _plan_uncached(-1, cfg, options, min_width, 0, None)
        if len(_PLAN_MEMO) >= _PLAN_MEMO_MAX:
            _PLAN_MEMO.clear()
        _PLAN_MEMO[key] = p
    return p


_plan_memo.cache_clear = _PLAN_MEMO.clear


def _plan_memo_put(p: _Planned, options: GridOptions | None) -> None:
    if len(_PLAN_MEMO) < _PLAN_MEMO_MAX:
        _PLAN_MEMO[(p.cfg, _options_for(p.cfg, options), 0.0)] = dataclasses.replace(p, index=-1)


def _plan_uncached(index: int, cfg: SweepConfig, options: GridOptions, min_width: float = 0.0, attempt: int = 0,
                   groups=None) -> _Planned:
    if groups is None:
        groups, _lo, symmetric, _blocked = engine.prepare(_components(cfg), options.max_distinct)
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


def _columns(want: str) -> int:
    """Columns of a row of the bucket program's output: the value, the diagnostics, and for
    epsilon queries the floor-free bound (:func:`dpjax.pld.sweep_program.epsilon_program`)."""
    return 1 + len(engine.DIAGNOSTICS) + (want == "eps")


@functools.lru_cache(maxsize=None)
def _batched(mesh, directions, ms, n, kinds, want, n_freq, block=1):
    """One jitted program for a bucket: the per-configuration program
    (:func:`dpjax.pld.sweep_program.epsilon_program` for epsilon queries, the accountant's
    :func:`dpjax.pld.engine.program` for delta queries) looped over the configurations of a
    chunk, the chunk's leading axis sharded over ``mesh``.

    Each device runs a ``lax.while_loop`` over its own part of the chunk, ``block`` configurations
    per iteration (``jax.vmap`` inside a block), stopping after its ``count`` real configurations
    (padding costs nothing beyond the last block, so one chunk size serves every bucket).  On CPU
    ``block = 1``: vmapping turns the window's dynamic slices and the conversion's lookups into
    batched gathers, measured 6x slower on CPU at n = 98304.  On an accelerator a block of
    configurations per step fills the device (see :func:`_block_size`).
    Output ``(chunk, directions, kinds, columns)``: see :func:`_columns`.
    """
    from jax.sharding import PartitionSpec as P

    def one(g, dx, lam, lt, d, e, support):
        if want == "eps":
            return epsilon_program(g, dx, lam, lt, d, support, directions=directions, ms=ms, n=n, kinds=kinds,
                                   n_freq=n_freq, floor_free=True)
        return engine.program(g, dx, lam, lt, d, e, directions=directions, ms=ms, n=n, kinds=kinds, want=want,
                             n_freq=n_freq)

    def local(count, groups, dx, lambdas, log_tau, deltas, epsilons, support):
        size = dx.shape[0]
        out0 = jnp.zeros((size, len(directions), len(kinds), _columns(want)), jnp.float64)
        xs = (groups, dx, lambdas, log_tau, deltas, epsilons, support)

        def body(state):
            i, out = state
            if block == 1:
                take = lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False)
                val = one(*jax.tree_util.tree_map(take, xs))
                return i + 1, jax.lax.dynamic_update_index_in_dim(out, val, i, 0)
            take = lambda x: jax.lax.dynamic_slice_in_dim(x, i, block)
            val = jax.vmap(one)(*jax.tree_util.tree_map(take, xs))
            return i + block, jax.lax.dynamic_update_slice_in_dim(out, val, i, 0)

        _, out = jax.lax.while_loop(lambda st: st[0] < count[0], body, (jnp.zeros((), count.dtype), out0))
        return out

    spec = P("configs")
    # A name per static shape: the XLA module (and a profile's events) say which bucket ran.
    local.__name__ = local.__qualname__ = (f"sweep_{want}_n{n}_m{max(max(r) for r in ms)}_"
                                           f"f{'all' if n_freq is None else n_freq}_b{block}")
    sharded = jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    return jax.jit(sharded)


#: Working memory of one vmapped block of configurations on an accelerator (bytes).
BLOCK_BYTES = 2**31


def _block_size(mesh, n: int, rows: int, per_device: int) -> int:
    """Configurations per loop step of a bucket program (:func:`_batched`): 1 on CPU; on an
    accelerator the largest power of two dividing ``per_device`` whose working set (about 32
    float64 arrays of ``rows x n`` per configuration) fits :data:`BLOCK_BYTES`."""
    platform = mesh.devices.flat[0].platform
    if platform == "cpu":
        return 1
    fit = max(1, BLOCK_BYTES // (32 * 8 * rows * n))
    b = 1
    while b * 2 <= min(fit, per_device) and per_device % (b * 2) == 0:
        b *= 2
    return b


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


def _shape_of(p: _Planned) -> tuple[int, int, int | None]:
    """A row's own static sizes: FFT length, longest single-step support (every direction and
    group), kept frequencies (None: all)."""
    return p.plan.n, max(max(r) for r in p.plan.ms), p.plan.n_freq


def _struct_of(p: _Planned) -> tuple:
    """A row's program structure: query kind, directions, mechanism structure (a program of
    that structure at least as large as the row's own sizes can run it)."""
    return p.signature[:2] + p.signature[4:]


def _n_freq_at(p: _Planned, n: int) -> int | None:
    """The kept frequencies of ``p`` on an FFT of length ``n`` (the planner's rule, as in
    :func:`_with_n`); None: all."""
    plan = p.plan
    if plan.n_freq is None:
        return None
    if n == plan.n:
        return plan.n_freq
    return _n_freq(n, plan.dx, min(plan.sigma_composed), plan.total_count) or (n // 2 + 1)


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How :func:`sweep` groups configurations into programs (one XLA compile each).

    A configuration's run cost in a program of static sizes ``(n, m, n_freq)`` (FFT length,
    single-step support capacity, kept frequencies) is modelled as

        rows / 4 * (base + per_fft_point * n / 1024 * log2(n) / 15 + per_support_point * s / 1024
                    + per_capacity * m / 1024 + per_frequency * n_freq / 1024) + per_row,

    (``rows`` = directions x discretizations, 4 for DP-SGD with brackets; ``s`` the
    configuration's own support, which an epsilon query's program discretizes, the capacity
    ``m`` for a delta query), fitted to the CPU time of the sweep's program on a 2-core CPU
    (milliseconds; ``benchmarks/bench_sweep_cost.py``).  A configuration runs in a
    program at least as large as its own sizes (a longer FFT: a wider window at the same
    spacing; a longer support: single-step mass moved from the ``+inf`` atom onto grid points;
    more kept frequencies: a smaller truncation bound -- each sound, see the module docstring),
    and its *padding factor* is its cost there over its cost at its own sizes.

    Buckets are chosen greedily: starting from one bucket per distinct own shape, the
    merge that lowers ``sum of run costs + compile cost per new program`` the most is applied
    while one does, and never one that puts any member above ``max_padding``.  So a sweep of a
    few hundred configurations compiles few programs (a compile costs as much as running
    hundreds of configurations) and a configuration far from the others keeps its own shape
    instead of paying for theirs; a sweep of many thousands gets more, tighter programs.
    :func:`sweep` buckets from the configurations alone, so a sweep's rows do not depend on
    what the process or the persistent cache already holds; a bucket whose program exists
    loads it.  (:func:`_bucket_plan` can also start from existing programs, ``load_cost``.)

    Attributes:
      max_padding: the largest padding factor of any configuration (>= 1).
      compile_cost: cost of compiling a new program (same unit as the run cost; None: the
        backend's default, :data:`COMPILE_COST`, an eighth of it while the persistent cache is on).
      load_cost: cost of a program serialized by an earlier process (persistent cache on).
    """

    max_padding: float = 3.0
    compile_cost: float | None = None
    load_cost: float = 150.0
    base: float = 0.2
    per_fft_point: float = 0.07
    per_support_point: float = 0.23
    per_capacity: float = 0.07
    per_frequency: float = 0.1
    per_row: float = 0.3

    def __post_init__(self):
        if not (isinstance(self.max_padding, (int, float)) and self.max_padding >= 1.0):
            raise ValueError(f"max_padding must be a number >= 1, got {self.max_padding!r}")
        if self.compile_cost is not None and not (self.compile_cost >= 0):
            raise ValueError(f"compile_cost must be >= 0 or None, got {self.compile_cost!r}")

    def cost(self, n: int, m: int, n_freq: int | None, rows: int, support: int | None = None) -> float:
        """Run cost of a configuration with single-step support ``support`` (default ``m``) in
        a program of static sizes ``(n, m, n_freq)``."""
        nf = n // 2 + 1 if n_freq is None else n_freq
        support = m if support is None else support
        run = (self.base + self.per_fft_point * n / 1024 * math.log2(n) / 15
               + self.per_support_point * support / 1024 + self.per_capacity * m / 1024
               + self.per_frequency * nf / 1024)
        return rows / 4 * run + self.per_row

    def compile(self) -> float:
        """The compile cost the bucketing weighs: ``compile_cost``, else the backend's default
        (:data:`COMPILE_COST`), of which only :data:`CACHED_COMPILE_SHARE` while the persistent
        cache is on (the program is then serialized and reused by later processes, which load it
        for ``load_cost``: the steady state matters more than this process's compiles)."""
        if self.compile_cost is not None:
            return self.compile_cost
        cost = COMPILE_COST.get(jax.default_backend(), COMPILE_COST["cpu"])
        return cost * CACHED_COMPILE_SHARE if _cache.caching() else cost


#: Default compile cost of a new bucket program, by backend, in the cost model's unit (CPU
#: milliseconds of running configurations): tracing, lowering and XLA's compile of one program
#: took 2.0-2.6 s of CPU time on the 2-core CPU.  On a GPU a configuration runs ~10x faster
#: than on that CPU while a compile takes about as long, so a compile weighs ~10x more there.
COMPILE_COST = {"cpu": 2200.0, "gpu": 25000.0, "cuda": 25000.0, "rocm": 25000.0, "tpu": 25000.0}
#: The share of :data:`COMPILE_COST` counted while the persistent cache is on (every CLI run).
CACHED_COMPILE_SHARE = 0.125


def _round_nf(nf: int | None, n: int) -> int | None:
    """Kept frequencies rounded up to a power of two of at least 512 (None: all, also when that
    reaches half the spectrum)."""
    if nf is None:
        return None
    k = max(512, 1 << (int(nf) - 1).bit_length())
    return None if k >= n // 2 + 1 else k


def _combine_nf(a, b):
    return None if a is None or b is None else max(a, b)


class _Group:
    """A candidate bucket: members, static sizes, the most its members allow the bucket's share of
    their cost to be (``limit``; see :func:`_bucket_plan`), and what compiling its program costs
    (0 for a program this process already has)."""

    def __init__(self, struct, members, n, m, nf_at, limit, pay, fixed=False):
        self.struct, self.members, self.n, self.m = struct, members, n, m
        self.nf_at = nf_at            # {n: kept frequencies of the members at FFT length n}
        self.limit, self.pay, self.fixed = limit, pay, fixed

    def nf(self):
        return self.nf_at[self.n]


def _bucket_plan(pending: list[_Planned], programs: dict, policy: BucketPolicy, rows: int):
    """Cost-based buckets (see :class:`BucketPolicy`).

    ``programs``: ``{struct: [(n, m, n_freq, pay), ...]}`` programs that exist already (``pay``
    0 when compiled in this process, ``policy.load_cost`` when serialized on disk).  Returns
    ``[(struct, (n, m, n_freq), members)]`` (members re-planned on the bucket's ``n``) and, per
    bucket, whether it needs a program not in ``programs``."""
    C = policy.compile()
    F = policy.max_padding
    by_struct: dict[tuple, list[_Planned]] = {}
    for p in pending:
        by_struct.setdefault(_struct_of(p), []).append(p)
    out = []
    for struct, plist in by_struct.items():
        eps = struct[0] == "eps"
        # The part of a row's cost its bucket's sizes decide: an epsilon query's program
        # discretizes the row's own support whatever the bucket's capacity, a delta query's the
        # capacity.  A row's own support term cancels from every comparison of buckets.
        cost = functools.lru_cache(maxsize=None)(
            lambda n, m, nf, eps=eps: policy.cost(n, m, nf, rows, support=0 if eps else m))
        existing = programs.get(struct, [])
        cand_n = sorted({p.plan.n for p in plist} | {e[0] for e in existing})
        groups: list[_Group] = []
        own: dict[tuple, _Group] = {}
        for p in plist:
            n, m, _ = _shape_of(p)
            # Kept frequencies rounded up to a power of two (>= 512): a few initial groups instead
            # of one per row; keeping more frequencies costs little and only tightens the bound.
            nf_at = {k: _round_nf(_n_freq_at(p, k), k) for k in cand_n if k >= n and (eps or k == n)}
            nf = nf_at[n]
            # The bucket's share of the row's cost may reach `limit`: the row then costs at most
            # max_padding times its cost on its own shape (kept frequencies rounded as above, so
            # that its own group always fits, max_padding = 1 included).
            limit = F * policy.cost(n, m, nf, rows) - (policy.cost(n, m, nf, rows) - cost(n, m, nf))
            key = (n, m, nf)
            g = own.get(key)
            if g is None:
                g = own[key] = _Group(struct, [], n, m, nf_at, limit, C)
                groups.append(g)
            else:
                g.nf_at = {k: _combine_nf(g.nf_at[k], v) for k, v in nf_at.items()}
                g.limit = min(g.limit, limit)
            g.members.append(p)
        for n, m, nf, pay in existing:
            groups.append(_Group(struct, [], n, m, {n: nf}, math.inf, pay, fixed=True))

        def merged(a: _Group, b: _Group):
            """(n, m, nf) of a and b together, or None if not allowed."""
            if a.fixed and b.fixed:
                return None
            if b.fixed:
                a, b = b, a
            if a.fixed:   # b joins the existing program a as it is
                n, m, nf = a.n, a.m, a.nf_at[a.n]
                if b.n > n or b.m > m or n not in b.nf_at:
                    return None
                need = b.nf_at[n]
                if (nf is not None) and (need is None or need > nf):
                    return None
                return n, m, nf
            n = max(a.n, b.n)
            if n not in a.nf_at or n not in b.nf_at:
                return None
            return n, max(a.m, b.m), _combine_nf(a.nf_at[n], b.nf_at[n])

        def gain(a: _Group, b: _Group):
            if not (a.members or b.members):
                return None
            shape = merged(a, b)
            if shape is None:
                return None
            c = cost(*shape)
            if c > min(a.limit, b.limit):
                return None
            waste = sum(len(g.members) * (c - cost(g.n, g.m, g.nf())) for g in (a, b) if g.members)
            if a.fixed or b.fixed:
                f, g = (a, b) if a.fixed else (b, a)
                saved = g.pay - (0.0 if f.members else f.pay)
            else:
                saved = a.pay + b.pay - C
            return saved - waste, shape

        def agglomerate(groups, phase):
            """Greedy agglomeration: a heap of pair gains (largest first); an entry is stale once
            either group has changed since it was computed (version counters).  Phase "existing":
            only joins of existing programs (free: no compile); "new": any merge."""
            version = {id(g): 0 for g in groups}
            tick = itertools.count()
            heap = []

            def push(a, b):
                if phase == "existing" and not (a.fixed or b.fixed):
                    return
                r = gain(a, b)
                if r is not None and r[0] > 0:
                    heapq.heappush(heap, (-r[0], next(tick), version[id(a)], version[id(b)], r[1], a, b))

            for i, a in enumerate(groups):
                for b in groups[i + 1:]:
                    push(a, b)
            while heap:
                _, _, va, vb, (n, m, nf), a, b = heapq.heappop(heap)
                if va != version[id(a)] or vb != version[id(b)] or not (a.members or b.members):
                    continue
                if b.fixed:
                    a, b = b, a
                a.members.extend(b.members)
                b.members = []
                a.limit = min(a.limit, b.limit)
                if not a.fixed:
                    a.n, a.m = n, m
                    a.nf_at = {k: _combine_nf(a.nf_at[k], b.nf_at[k]) for k in a.nf_at if k in b.nf_at}
                    a.pay = C
                if not b.fixed:
                    groups.remove(b)
                version[id(a)] += 1
                version[id(b)] += 1
                for g in groups:
                    if g is not a:
                        push(a, g)
            return groups

        def segments(free):
            """The cheapest split of ``free`` (sorted by FFT length, then support) into contiguous
            runs, one new program each (dynamic programming; optimal among such splits)."""
            free = sorted(free, key=lambda g: (g.n, g.m))
            best = [0.0] + [math.inf] * len(free)
            cut = [0] * (len(free) + 1)
            for j in range(len(free)):
                n = free[j].n
                m, nf, limit, rows_in, base = 0, -1, math.inf, 0, 0.0
                for i in range(j, -1, -1):
                    g = free[i]
                    if n not in g.nf_at:
                        break
                    m = max(m, g.m)
                    nf = g.nf_at[n] if nf == -1 else _combine_nf(nf, g.nf_at[n])
                    limit = min(limit, g.limit)
                    rows_in += len(g.members)
                    base += len(g.members) * cost(g.n, g.m, g.nf())
                    c = cost(n, m, nf)
                    if c > limit and i < j:   # (a group alone always fits: its own shape)
                        break
                    total = best[i] + C + rows_in * c
                    if total < best[j + 1]:
                        best[j + 1], cut[j + 1] = total, i
            out, j = [], len(free)
            while j > 0:
                i = cut[j]
                seg = free[i:j]
                n = seg[-1].n
                nf = seg[0].nf_at[n]
                for g in seg[1:]:
                    nf = _combine_nf(nf, g.nf_at[n])
                g0 = _Group(struct, [p for g in seg for p in g.members], n, max(g.m for g in seg), {n: nf},
                            min(g.limit for g in seg), C)
                out.append(g0)
                j = i
            return out

        def objective(gs):
            return sum(g.pay for g in gs if g.members and not g.fixed) + sum(
                len(g.members) * cost(g.n, g.m, g.nf()) for g in gs if g.members)

        groups = agglomerate(groups, "existing")
        fixed = [g for g in groups if g.fixed]
        free = [g for g in groups if not g.fixed and g.members]
        # Two searches for the new programs, the cheaper kept: greedy pairwise merges (any shapes)
        # and the best split into runs along (n, m).
        snapshot = [(g.members[:], g.n, g.m, dict(g.nf_at), g.limit) for g in free]
        greedy = agglomerate([_Group(struct, mem[:], n, m, dict(nf_at), fl, C) for mem, n, m, nf_at, fl in snapshot],
                             "new")
        runs = segments([_Group(struct, mem[:], n, m, dict(nf_at), fl, C) for mem, n, m, nf_at, fl in snapshot])
        groups = fixed + min((greedy, runs), key=objective)
        for g in groups:
            if not g.members:
                continue
            nf = g.nf_at[g.n]
            members = [_with_n(p, g.n) for p in g.members]
            out.append((struct, (g.n, g.m, nf), members, not g.fixed))
    return out


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
    # Each row's own single-step support per group (the longest over directions, as the
    # accountant's program uses): the bucket program discretizes that much (sweep_program).
    support = np.asarray([[max(r[gi] for r in p.plan.ms) for gi in range(len(p.plan.ms[0]))] for p in slots],
                         np.int64)
    count = np.asarray(counts, np.int32)
    sharding = NamedSharding(mesh, PartitionSpec("configs"))
    return jax.tree_util.tree_map(lambda x: _global_array(x, sharding),
                                  (count, groups, dx, lambdas, log_tau, deltas, epsilons, support))


#: Compiled bucket programs of this process, by static sizes and input shapes (a second sweep
#: of the same shapes compiles nothing).
_COMPILED: dict = {}
#: How each was made: "compiled" (traced here) or "loaded" (a serialized program of an earlier process).
_ORIGIN: dict = {}
#: The static sizes of those programs, for the bucketing of later sweeps:
#: ``{(devices, chunk, kinds): {struct: {(n, m, n_freq), ...}}}``.
_SHAPES: dict = {}


def _static_of(first: _Planned, m: int, n_freq: int | None):
    """A bucket's static sizes ``(ms, n_freq)``: support ``m`` for every direction and group."""
    G = len(first.plan.groups[0])
    return tuple(tuple(m for _ in range(G)) for _ in first.directions), n_freq


def _mesh_id(mesh) -> tuple:
    return tuple(str(d) for d in mesh.devices.flat)


def _known_programs(mesh, chunk: int, kinds) -> dict:
    """``{struct: [(n, m, n_freq), ...]}``: bucket programs compiled by earlier sweeps of this process."""
    return {k: sorted(v, key=lambda sh: (sh[0], sh[1], -1 if sh[2] is None else sh[2]))
            for k, v in _SHAPES.get((_mesh_id(mesh), chunk, kinds), {}).items()}


def _struct_id(struct) -> str:
    """A string naming a program structure the same way in every process (mechanism classes by
    their qualified names)."""
    def name(x):
        if isinstance(x, type):
            return f"{x.__module__}.{x.__qualname__}"
        if isinstance(x, tuple):
            return "(" + ",".join(name(v) for v in x) + ")"
        return repr(x)
    return name(struct)


def _disk_programs(mesh, chunk: int, kinds, structs) -> dict:
    """``{struct: [(n, m, n_freq), ...]}`` for the given program structures: bucket programs
    serialized by earlier processes for this device count, chunk size and discretizations
    (persistent cache on; else empty)."""
    if mesh.devices.size != 1:
        return {}
    ids = {_struct_id(st): st for st in structs}
    by_id: dict = {}
    for meta in _cache.exported_index("sweep_program"):
        try:
            if meta["chunk"] != chunk or tuple(meta["kinds"]) != tuple(kinds) or meta["devices"] != 1:
                continue
            by_id.setdefault(meta["struct"], set()).add((int(meta["n"]), int(meta["m"]),
                                                         None if meta["n_freq"] is None else int(meta["n_freq"])))
        except (KeyError, TypeError, ValueError):
            continue
    return {ids[ident]: sorted(shapes, key=lambda sh: (sh[0], sh[1], -1 if sh[2] is None else sh[2]))
            for ident, shapes in by_id.items() if ident in ids}


def _program_key(mesh, first: _Planned, kinds, static, args):
    ms, n_freq = static
    shapes = tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args))
    return (mesh, first.directions, ms, first.plan.n, kinds, first.want, n_freq,
            str(jax.tree_util.tree_structure(args)), shapes)


def _compile(key, mesh, first: _Planned, kinds, static, args, struct=None, chunk=None):
    """The bucket's program, compiled ahead of its first call (thread-safe: runs in the
    background compile pool while other buckets run)."""
    fn = _COMPILED.get(key)
    ms, n_freq = static
    m = max(max(r) for r in ms)
    if fn is None:
        block = _block_size(mesh, first.plan.n, len(first.directions) * len(kinds), _per_device_of(args, mesh))
        with jax.enable_x64(True):
            program = _batched(mesh, first.directions, ms, first.plan.n, kinds, first.want, n_freq, block)
            # With the persistent cache on (every CLI run), a serialized program from an earlier
            # process skips tracing and lowering (~0.4 s a program on 2 cores) and its XLA compile
            # is a persistent-cache hit; its static sizes are indexed so that later processes can
            # bucket configurations onto it (_disk_programs).  Else compile here.
            meta = None
            if struct is not None and chunk is not None:
                meta = dict(struct=_struct_id(struct), n=int(first.plan.n), m=int(m),
                            n_freq=None if n_freq is None else int(n_freq), kinds=list(kinds), chunk=int(chunk),
                            devices=int(mesh.devices.size))
            fn = _cache.exported_compiled(
                "sweep_program", program, args,
                repr((first.directions, ms, first.plan.n, kinds, first.want, n_freq, mesh.devices.size, block)),
                meta=meta,
                compile_options=_xla.compile_options())
            if fn is None:
                fn = program.lower(*args).compile(_xla.compile_options())
        _ORIGIN[key] = "loaded" if getattr(fn, "loaded", False) else "compiled"
        _COMPILED[key] = fn
    if struct is not None and chunk is not None:
        _SHAPES.setdefault((_mesh_id(mesh), chunk, kinds), {}).setdefault(struct, set()).add((first.plan.n, m, n_freq))
    return fn


def _per_device_of(args, mesh) -> int:
    """Configurations per device of a chunk's inputs (``args[2]`` is ``dx``, one per slot)."""
    return int(args[2].shape[0]) // mesh.devices.size


def _validate_policy(policy) -> BucketPolicy:
    if policy is None:
        return BucketPolicy()
    if not isinstance(policy, BucketPolicy):
        raise ValueError(f"bucketing must be a dpjax.pld.sweeping.BucketPolicy, got {policy!r}")
    return policy


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
            row = out[d * per_device + j]
            res = engine.unpack(row[..., :1 + len(engine.DIAGNOSTICS)], p.directions, kinds, (1,))
            if p.want == "eps":
                for di, r in enumerate(res):
                    r["up"]["floor_free"] = float(row[di, kinds.index("up"), -1])
            results[p.index] = res
    return [results[p.index] for p in members], static


def _retry(p: _Planned, res, n_freq, options) -> _Planned | None:
    """The accountant's own retry rules (:func:`dpjax.pld.engine.run`), for the next round:
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
    dir_reports, upper, lower = engine.combine(reports)
    upper, lower = float(np.ravel(upper)[0]), float(np.ravel(lower)[0])
    if p.cfg.query == "epsilon" and _acc.sampling_is_rare(p.cfg.sampling_prob, p.cfg.steps, p.cfg.delta):
        # As the single call (dpjax.pld.accountant.epsilon) does; the test first, on the row's
        # own (q, T, delta), keeps the components off the common path.
        floored = _acc.rare_sampling_floor(_components(p.cfg), p.cfg.delta, upper)
        if floored is not None and float(floored) < upper:
            upper, lower = float(floored), min(lower, float(floored))
    return dict(index=p.index, **_config_fields(p.cfg, upper), lower=lower, upper=upper, grid=grid,
                n=int(dir_reports[0].n), dx=float(dir_reports[0].dx), path=path)


def _needs_single(p: _Planned, res, row: dict) -> bool:
    """True where the single call would not stop at this grid's answer and could give a
    materially different one: a direction the grid could not certify (the single call then falls
    back on the bounds of :mod:`dpjax.pld.fallback`), or an FFT round-off floor that matters at
    the requested delta (the single call then re-runs the composition tilted towards the tail).
    Such rows (tiny ``q T``, small deltas) are recomputed by :func:`dpjax.pld.epsilon` /
    :func:`dpjax.pld.delta`.

    An epsilon row whose floor matters is kept when the tilted pass cannot move it by more than
    :data:`SWEEP_SLACK`: its certified bracket is that narrow (any certified answer, the single
    call's included, is at or above the lower end), or the floor-free bound of every direction
    (its epsilon at :func:`dpjax.pld.sweep_program.floor_free_target`: no smaller round-off
    allowance takes the row below it on this grid) is within half of it (the other half is the grid's own slack)."""
    if p.cfg.query == "epsilon":
        if not math.isfinite(row["upper"]):
            return True
        level = p.cfg.delta
    else:
        if row["upper"] >= 1.0:
            return True
        level = min(float(np.min(r["up"]["value"])) for r in res)
    floor = max(float(r[k]["noise_floor"]) * p.plan.n for r in res for k in r)
    if not (level > 0 and floor > engine.TAIL_PASS_FRACTION * level):
        return False
    if p.cfg.query != "epsilon":
        return True
    upper = row["upper"]
    if upper - row["lower"] <= SWEEP_SLACK * upper:
        return False
    bound = max(float(r["up"].get("floor_free", -math.inf)) for r in res)
    return not (upper - bound <= 0.5 * SWEEP_SLACK * upper)


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
    mech = PoissonSubsampledGaussian(cfg.noise_multiplier, 1.0)
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
#: shorter FFTs and single-step supports on typical DP-SGD configurations.  Slack against
#: :func:`dpjax.pld.dpsgd_epsilon`: see :data:`SWEEP_SLACK`.  Pass ``options=GridOptions()``
#: for the single call's own grids (rows then equal it up to the bucket slack of 1e-6).
SWEEP_OPTIONS = GridOptions(relative_accuracy=1e-4, per_step_accuracy=0.5, n_min=2**12)

#: Stated slack of an epsilon row (default options) against :func:`dpjax.pld.dpsgd_epsilon`:
#: ``|sweep - single| <= SWEEP_SLACK * single`` (relative).  Both are certified upper bounds and
#: their certified brackets overlap, so the difference is also at most the wider bracket.
SWEEP_SLACK = 1e-3

#: Configurations per device in one program call (the chunk is this times the device count):
#: by platform; an accelerator runs blocks of configurations at once (see :func:`_block_size`).
DEFAULT_PER_DEVICE = {"cpu": 32}
#: ... and on any other platform.
DEFAULT_PER_DEVICE_ACCELERATOR = 256


@host_only("dpjax.pld.epsilon_fn on a grid from dpjax.pld.plan_fixed_grid (jax.vmap over parameters)")
def sweep(configs=None, *, noise_multiplier=None, sampling_prob=None, steps=None, delta=None, epsilon=None,
          group_size=1, out=None, resume: bool = False, options: GridOptions | None = None,
          with_lower: bool = True, devices: Sequence | None = None, per_device: int | None = None,
          progress: bool | None = None, progress_bar: bool | None = None,
          bucketing: BucketPolicy | None = None, sampling: str = "poisson",
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
      per_device: configurations per device in one program call (None: 32 on CPU, 256 on an
        accelerator).
      progress: show progress on stderr (None: auto, see :mod:`dpjax._progress`; False: never;
        the keyword of every dpjax function with a bar; ``progress_bar`` is its former name).
      bucketing: :class:`BucketPolicy` (how configurations share compiled programs; default
        ``BucketPolicy()``).
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
    options = None if options is None else engine.grid_options(options)
    if configs is None:
        if noise_multiplier is None or sampling_prob is None or steps is None:
            raise ValueError("give configs, or the grid keywords noise_multiplier, sampling_prob, steps and "
                             "delta (or epsilon)")
        configs = sweep_grid(noise_multiplier, sampling_prob, steps, delta, epsilon, group_size)
    else:
        configs = _as_configs(configs)
    if per_device is not None:
        per_device = _validate.positive_int("per_device", per_device)
    if resume and out is None:
        raise ValueError("resume=True needs out (the file a previous run wrote)")
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices must not be empty")
    if per_device is None:
        per_device = DEFAULT_PER_DEVICE.get(devices[0].platform, DEFAULT_PER_DEVICE_ACCELERATOR)
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
        pending = _plan_all(todo, configs, options)
        policy = _validate_policy(bucketing)
        rows_per_cfg = 0  # directions x kinds, from the first row (the cost model's unit is per row)
        # struct -> [(n, m, n_freq, pay)]: programs this sweep can use without compiling (those of
        # earlier sweeps in this process, those of this sweep, serialized ones from earlier processes).
        known: dict[tuple, list] = {}
        for struct, shapes in _known_programs(mesh, chunk, kinds).items():
            known[struct] = [tuple(sh) + (0.0,) for sh in shapes]
        structs = {_struct_of(p) for p in pending}
        for struct, shapes in _disk_programs(mesh, chunk, kinds, structs).items():
            have = {sh[:3] for sh in known.get(struct, [])}
            known.setdefault(struct, []).extend(tuple(sh) + (policy.load_cost,) for sh in shapes if tuple(sh) not in have)
        inflight: dict = {}                          # program key -> compile future (this sweep)
        made: set = set()                            # program keys this sweep compiled or loaded

        def bucket_jobs(pending, only_new=False):
            """The buckets of ``pending`` (:class:`BucketPolicy`), with their static sizes,
            first-chunk inputs and program keys; ``only_new``: just those needing a new program."""
            nonlocal rows_per_cfg
            rows_per_cfg = rows_per_cfg or len(pending[0].directions) * len(kinds)
            jobs = []
            # Buckets depend on the configurations only, not on which programs happen to exist:
            # the same sweep then gives the same rows (the same grids) in a fresh process, in a
            # warm one and after other sweeps.  A bucket whose program exists (compiled in this
            # process, or serialized by an earlier one) loads it instead of compiling.
            for struct, (n, m, nf), members, _ in _bucket_plan(pending, {}, policy, rows_per_cfg):
                new = not any(sh[:3] == (n, m, nf) for sh in known.get(struct, []))
                if only_new and not new:
                    continue
                entry = known.setdefault(struct, [])
                for i, sh in enumerate(entry):
                    if sh[:3] == (n, m, nf):
                        entry[i] = (n, m, nf, 0.0)   # used now: no further cost to this sweep
                        break
                else:
                    entry.append((n, m, nf, 0.0))
                static = _static_of(members[0], m, nf)
                parts = [members[i:i + chunk] for i in range(0, len(members), chunk)]
                args0 = _chunk_args(parts[0], per_device, mesh)
                jobs.append((parts, static, args0, _program_key(mesh, members[0], kinds, static, args0), struct,
                             len(members) * policy.cost(n, m, nf, rows_per_cfg)))
            # The costliest bucket first: its run then overlaps the other buckets' compiles instead
            # of ending the sweep alone (which bucket holds a row does not change, only the order).
            jobs.sort(key=lambda job: -job[-1])
            return [job[:-1] for job in jobs]

        def submit(key, first, static, args0, struct):
            if key not in inflight:
                if key not in _COMPILED:
                    made.add(key)
                inflight[key] = pool.submit(_compile, key, mesh, first, kinds, static, args0, struct, chunk)
            return inflight[key]

        with concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_WORKERS) as pool:
            while pending:  # rounds: a retried row (rare) goes to the next round's buckets
                jobs = []
                for parts, static, args0, key, struct in bucket_jobs(pending):
                    programs.add(key)
                    # Compile every bucket's program in the background, in run order: compiling
                    # bucket k + 1 overlaps running bucket k.
                    jobs.append((parts, static, args0, submit(key, parts[0][0], static, args0, struct)))
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
                            # Retried rows that no program holds: compile their program now, behind
                            # this round's, so it overlaps the rest of the round instead of running
                            # alone at its end (the next round reuses it).
                            for r_parts, r_static, r_args0, r_key, r_struct in bucket_jobs(pending, only_new=True):
                                submit(r_key, r_parts[0][0], r_static, r_args0, r_struct)
                        if store is not None:
                            store.append(new)
                        bar.update(len(new), programs=len(programs))
    _join_stores()
    origins = [_ORIGIN.get(k) for k in programs if k in made]
    table = SweepTable(rows=tuple(rows[i] for i in range(len(configs))), programs=len(programs),
                       seconds=time.perf_counter() - t0, devices=len(devices),
                       compiled=origins.count("compiled"), loaded=origins.count("loaded"))
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
