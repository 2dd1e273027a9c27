"""Planning and bucketing of a sweep (:mod:`dpjax.pld.sweeps.driver`, steps 1 and 2).

:func:`plan_configs` plans every configuration's grid on the host (:class:`Planned`: the
configuration, its :class:`~dpjax.pld.GridPlan` and stacked groups; memoized in this process,
stored in the program store, in worker processes for thousands of configurations:
:func:`plan_parallel`); :func:`bucket_plan` chooses which configurations share a compiled
program under the cost model of :class:`BucketPolicy` (``[(struct, n, members, new)]``, each
member padded to the bucket's FFT length by a sound widening of its window).  :func:`shape_of` /
:func:`struct_of` give a plan's own FFT length and program structure.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import pathlib
import pickle
import threading
from typing import Any

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base import ops as _ops
from dpjax._base import xla as _xla
from dpjax.numerics import cache as _cache
from dpjax.pld.grid import engine
from dpjax.pld.grid.plan import GridOptions, n_freq_at, plan_grid
from dpjax.pld.sweeps.config import SweepConfig, config_components, options_for

jax = _lazy_module("jax")

__all__ = ["Planned", "plan_config", "plan_configs", "join_stores", "PARALLEL_PLANNING_MIN", "plan_worker_main",
           "plan_parallel", "plan_uncached", "shape_of", "struct_of", "BucketPolicy", "COMPILE_COST",
           "CACHED_COMPILE_SHARE", "bucket_plan", "validate_policy"]


@dataclasses.dataclass
class Planned:
    index: int
    cfg: SweepConfig
    plan: Any
    directions: tuple
    want: str
    signature: tuple
    attempt: int = 0
    groups: Any = None

    def signed(self) -> "Planned":
        self.signature = (self.want, self.directions, self.plan.n, self.plan.n_freq is None, _signature(self.groups))
        return self


def _signature(groups) -> tuple:
    sig = []
    for g in groups:
        leaves, tree = _ops.host_tree_flatten(g.mechanism)
        sig.append((type(g.mechanism), repr(tree), tuple(np.shape(x) for x in leaves), len(g.counts)))
    return tuple(sig)


def _query(cfg: SweepConfig, options: GridOptions):
    if cfg.query == "epsilon":
        return "eps", dict(tail_mass=options.tail_fraction * cfg.delta, eps_hint=None, target_delta=cfg.delta)
    return "delta", dict(tail_mass=options.delta_tail_mass, eps_hint=cfg.epsilon, target_delta=None)


def plan_config(index: int, cfg: SweepConfig, options: GridOptions | None, min_width: float = 0.0, attempt: int = 0,
          groups=None) -> Planned:
    options = options_for(cfg, options)
    if groups is None:
        # Host planning is a pure function of the configuration and the options (~5-10 ms):
        # memoized, so re-running a sweep (or resuming one) plans nothing twice.
        p = _plan_memo(cfg, options, min_width)
        return dataclasses.replace(p, index=index, attempt=attempt)
    return plan_uncached(index, cfg, options, min_width, attempt, groups)


def plan_configs(todo: list[int], configs: list[SweepConfig], options: GridOptions | None) -> list[Planned]:
    """The plans of ``configs[i]`` for ``i`` in ``todo``.  With the program store on (the default)
    the whole list is also stored there, keyed by the configurations and options, so that
    a later process sweeping the same configurations plans nothing (planning is a pure function
    of them and of dpjax's sources, which the key covers)."""
    key = repr((_PLAN_CACHE_VERSION, options, [(i, configs[i].key()) for i in todo]))
    stored = _cache.load_object("sweep_plans", key)
    if isinstance(stored, list) and len(stored) == len(todo) and all(
            isinstance(p, Planned) and p.index == i for p, i in zip(stored, todo)):
        return stored
    workers = _planning_workers(len(todo))
    if workers > 1:
        pending = plan_parallel(todo, configs, options, workers)
    else:
        pending = [plan_config(i, configs[i], options) for i in todo]
    if _cache.caching():
        # Stored in the background (pickling ~10^4 plans takes a while); joined before sweep returns.
        thread = threading.Thread(target=_cache.store_object, args=("sweep_plans", key, list(pending)), daemon=True)
        thread.start()
        _STORES.append(thread)
    return pending


#: Background writes of stored plans, joined at the end of every sweep.
_STORES: list = []


def join_stores() -> None:
    while _STORES:
        _STORES.pop().join()


#: Bumped when :class:`Planned` changes shape (stored plans of another layout are not used).
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
    return [plan_config(i, cfg, options) for i, cfg in items]


def plan_worker_main() -> None:  # pragma: no cover - runs in a planning worker process
    """A planning worker: (items, options) pickled on stdin, their plans pickled on stdout."""
    import sys

    items, options = pickle.load(sys.stdin.buffer)
    pickle.dump(_plan_batch(items, options), sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


def plan_parallel(todo, configs, options, workers: int) -> list[Planned]:
    """:func:`plan_config` over ``todo`` in ``workers`` fresh Python processes (``python -c``: nothing of
    this process is re-imported or re-run there, and ``JAX_PLATFORMS=cpu``: a worker never takes an
    accelerator); falls back to planning here if a worker fails."""
    import subprocess
    import sys

    items = [(i, configs[i]) for i in todo]
    size = -(-len(items) // workers)
    parts = [items[k:k + size] for k in range(0, len(items), size)]
    # This dpjax, whatever put it on this process's path.
    root = str(pathlib.Path(__file__).resolve().parents[3])
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    code = f"from {__name__} import plan_worker_main; plan_worker_main()"
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
        return [plan_config(i, configs[i], options) for i in todo]
    planned = [p for part in results for p in part]
    for p in planned:   # the in-process memo serves a second sweep of the same configurations
        if p.attempt == 0:
            _plan_memo_put(p, options)
    return planned


_PLAN_MEMO: dict = {}


_PLAN_MEMO_MAX = 2**17


def _plan_memo(cfg: SweepConfig, options: GridOptions, min_width: float) -> Planned:
    key = (cfg, options, min_width)
    p = _PLAN_MEMO.get(key)
    if p is None:
        p = plan_uncached(-1, cfg, options, min_width, 0, None)
        if len(_PLAN_MEMO) >= _PLAN_MEMO_MAX:
            _PLAN_MEMO.clear()
        _PLAN_MEMO[key] = p
    return p


def _plan_memo_put(p: Planned, options: GridOptions | None) -> None:
    if len(_PLAN_MEMO) < _PLAN_MEMO_MAX:
        _PLAN_MEMO[(p.cfg, options_for(p.cfg, options), 0.0)] = dataclasses.replace(p, index=-1)


def plan_uncached(index: int, cfg: SweepConfig, options: GridOptions, min_width: float = 0.0, attempt: int = 0,
                   groups=None) -> Planned:
    if groups is None:
        groups, _lo, symmetric, _blocked = engine.prepare(config_components(cfg), options.max_distinct)
    directions = ("remove",) if all(getattr(type(g.mechanism), "symmetric", False) for g in groups) \
        else ("remove", "add")
    want, kw = _query(cfg, options)
    plan = plan_grid(groups, directions, options=options, min_width=min_width, **kw)
    if _ROUND_N_POW2 and want == "eps":
        plan = _pow2_plan(plan)
    return Planned(index, cfg, plan, directions, want, (), attempt, groups).signed()


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
    return dataclasses.replace(plan, n=n, n_freq=n_freq_at(plan, n))


def shape_of(p: Planned) -> int:
    """A row's own static size: its FFT length (its supports and kept frequencies are data of the
    program, :mod:`dpjax.pld.grid.program`)."""
    return int(p.plan.n)


def struct_of(p: Planned) -> tuple:
    """A row's program structure: query kind, directions, mechanism structure (a program of
    that structure and at least the row's FFT length can run it)."""
    return p.signature[:2] + p.signature[4:]


@dataclasses.dataclass(frozen=True)
class BucketPolicy:
    """How :func:`sweep` groups configurations into programs (one XLA compile each).

    A program is selected by the configurations' structure and one static size, the FFT length
    ``n``: supports and kept frequencies are data, and the program's loops run over a row's own
    support and frequencies only (:mod:`dpjax.pld.grid.program`).  A configuration may run on a longer
    FFT than its own (the same ``dx``, offsets and supports, a wider window: the wrap-around
    terms only shrink; sound, see the module docstring), at a run cost modelled as

        rows / 4 * (base + per_fft_point * n / 1024 * log2(n) / 15) + per_row

    (``rows`` = directions x discretizations; milliseconds of the 2-core CPU, the FFT terms of
    ``benchmarks/bench_sweep_cost.py``'s fit).  The FFT lengths of a sweep's configurations are
    merged upwards (the smallest length into the next) while a merge saves more compile cost
    than it adds run cost and puts no configuration above ``max_padding`` times its own cost.

    Attributes:
      max_padding: the largest factor by which a configuration's run cost may grow (>= 1).
      compile_cost: cost of compiling a new program (same unit as the run cost; None: the
        backend's default, :data:`COMPILE_COST`, an eighth of it while the program store is on).
      load_cost: cost of a program stored by an earlier process (program store on).
    """

    max_padding: float = 3.0
    compile_cost: float | None = None
    load_cost: float = 150.0
    base: float = 0.2
    per_fft_point: float = 0.07
    per_row: float = 0.3

    def __post_init__(self):
        if not (isinstance(self.max_padding, (int, float)) and self.max_padding >= 1.0):
            raise ValueError(f"max_padding must be a number >= 1, got {self.max_padding!r}")
        if self.compile_cost is not None and not (self.compile_cost >= 0):
            raise ValueError(f"compile_cost must be >= 0 or None, got {self.compile_cost!r}")

    def cost(self, n: int, rows: int) -> float:
        """The bucket-dependent run cost of a configuration in a program of FFT length ``n``."""
        return rows / 4 * (self.base + self.per_fft_point * n / 1024 * math.log2(n) / 15) + self.per_row

    def compile(self) -> float:
        """The compile cost the bucketing weighs: ``compile_cost``, else the backend's default
        (:data:`COMPILE_COST`), of which only :data:`CACHED_COMPILE_SHARE` while the program store
        is on (the program is then kept and reused by later processes)."""
        if self.compile_cost is not None:
            return self.compile_cost
        cost = COMPILE_COST.get(jax.default_backend(), COMPILE_COST["cpu"])
        return cost * CACHED_COMPILE_SHARE if _cache.caching() else cost


#: Default compile cost of a new bucket program, by backend, in the cost model's unit (CPU
#: milliseconds of running configurations).  On a GPU a configuration runs ~10x faster than on
#: the 2-core CPU while a compile takes longer, so a compile weighs more there.
COMPILE_COST = {"cpu": 1000.0, "gpu": 25000.0, "cuda": 25000.0, "rocm": 25000.0, "tpu": 25000.0}


#: The share of :data:`COMPILE_COST` counted while the program store is on (the default).
CACHED_COMPILE_SHARE = 0.125


def _with_n(p: Planned, n: int) -> Planned:
    """``p`` on a longer FFT (same ``dx``, offsets and supports: a wider window, sound and only
    tighter in the wrap-around terms), kept frequencies recomputed for ``n``."""
    if n == p.plan.n:
        return p
    plan = p.plan
    return dataclasses.replace(p, plan=dataclasses.replace(plan, n=n, n_freq=n_freq_at(plan, n))).signed()


def bucket_plan(pending: list[Planned], programs: dict, policy: BucketPolicy, rows: int):
    """Buckets by structure and FFT length (see :class:`BucketPolicy`).

    ``programs``: ``{struct: {n: pay}}`` programs that exist already (``pay`` 0 when compiled in
    this process, ``policy.load_cost`` when serialized on disk): a length with a program costs
    only that.  Returns ``[(struct, n, members, new)]`` (members re-planned on the bucket's
    ``n``; ``new``: the program is not in ``programs``)."""
    by_struct: dict[tuple, dict[int, list[Planned]]] = {}
    for p in pending:
        by_struct.setdefault(struct_of(p), {}).setdefault(shape_of(p), []).append(p)
    C = policy.compile()
    out = []
    for struct, by_n in by_struct.items():
        have = programs.get(struct, {})
        # (n, members, the smallest own length among them) per bucket, merged upwards; lengths with
        # an existing program take part with no members of their own (members may join them).
        buckets = [(n, list(by_n.get(n, [])), n) for n in sorted(set(by_n) | set(have))]
        i = 0
        while i < len(buckets) - 1:
            n, members, own_min = buckets[i]
            nxt, nxt_members, nxt_min = buckets[i + 1]
            pay = have.get(n, C)
            extra = len(members) * (policy.cost(nxt, rows) - policy.cost(n, rows))
            padded = policy.cost(nxt, rows) <= policy.max_padding * policy.cost(own_min, rows)
            if padded and pay > extra:
                buckets[i + 1] = (nxt, members + nxt_members, min(own_min, nxt_min))
                del buckets[i]
                i = max(i - 1, 0)
            else:
                i += 1
        for n, members, _ in buckets:
            if members:
                out.append((struct, n, [_with_n(p, n) for p in members], n not in have))
    return out


def validate_policy(policy) -> BucketPolicy:
    if policy is None:
        return BucketPolicy()
    if not isinstance(policy, BucketPolicy):
        raise ValueError(f"bucketing must be a dpjax.pld.sweeps.driver.BucketPolicy, got {policy!r}")
    return policy
