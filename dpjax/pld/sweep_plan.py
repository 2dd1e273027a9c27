"""Planning and bucketing of a sweep (:mod:`dpjax.pld.sweeping`, steps 1 and 2).

:func:`plan_configs` plans every configuration's grid on the host (:class:`Planned`: the
configuration, its :class:`~dpjax.pld.GridPlan` and stacked groups; memoized in this process,
stored in the persistent cache, in worker processes for thousands of configurations:
:func:`plan_parallel`); :func:`bucket_plan` chooses which configurations share a compiled
program under the cost model of :class:`BucketPolicy` (``[(struct, (n, m, n_freq), members,
new)]``, each member padded to the bucket's FFT length by a sound widening of its window).
:func:`shape_of` / :func:`struct_of` give a plan's own static sizes and program structure.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import heapq
import itertools
import math
import os
import pickle
import threading
from typing import Any

import jax
import numpy as np

from dpjax import _xla
from dpjax.pld import cache as _cache
from dpjax.pld import engine
from dpjax.pld.plan import GridOptions, n_freq_at, plan_grid
from dpjax.pld.sweep_config import SweepConfig, config_components, options_for

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
        leaves, tree = jax.tree_util.tree_flatten(g.mechanism)
        sig.append((type(g.mechanism), str(tree), tuple(np.shape(x) for x in leaves), len(g.counts)))
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
    """The plans of ``configs[i]`` for ``i`` in ``todo``.  With the persistent cache on (every CLI
    run) the whole list is also stored there, keyed by the configurations and options, so that
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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    code = "from dpjax.pld import sweep_plan; sweep_plan.plan_worker_main()"
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


def shape_of(p: Planned) -> tuple[int, int, int | None]:
    """A row's own static sizes: FFT length, longest single-step support (every direction and
    group), kept frequencies (None: all)."""
    return p.plan.n, max(max(r) for r in p.plan.ms), p.plan.n_freq


def struct_of(p: Planned) -> tuple:
    """A row's program structure: query kind, directions, mechanism structure (a program of
    that structure at least as large as the row's own sizes can run it)."""
    return p.signature[:2] + p.signature[4:]


def _n_freq_at(p: Planned, n: int) -> int | None:
    """The kept frequencies of ``p`` on an FFT of length ``n`` (:func:`dpjax.pld.plan.n_freq_at`);
    None: all."""
    return n_freq_at(p.plan, n)


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
    loads it.  (:func:`bucket_plan` can also start from existing programs, ``load_cost``.)

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
    their cost to be (``limit``; see :func:`bucket_plan`), and what compiling its program costs
    (0 for a program this process already has)."""

    def __init__(self, struct, members, n, m, nf_at, limit, pay, fixed=False):
        self.struct, self.members, self.n, self.m = struct, members, n, m
        self.nf_at = nf_at            # {n: kept frequencies of the members at FFT length n}
        self.limit, self.pay, self.fixed = limit, pay, fixed

    def nf(self):
        return self.nf_at[self.n]


def _with_n(p: Planned, n: int) -> Planned:
    """``p`` on a longer FFT (same ``dx``, offsets and supports: a wider window, sound and only
    tighter in the wrap-around terms), kept frequencies recomputed for ``n``."""
    if n == p.plan.n:
        return p
    plan = p.plan
    return dataclasses.replace(p, plan=dataclasses.replace(plan, n=n, n_freq=n_freq_at(plan, n))).signed()


def bucket_plan(pending: list[Planned], programs: dict, policy: BucketPolicy, rows: int):
    """Cost-based buckets (see :class:`BucketPolicy`).

    ``programs``: ``{struct: [(n, m, n_freq, pay), ...]}`` programs that exist already (``pay``
    0 when compiled in this process, ``policy.load_cost`` when serialized on disk).  Returns
    ``[(struct, (n, m, n_freq), members)]`` (members re-planned on the bucket's ``n``) and, per
    bucket, whether it needs a program not in ``programs``.  Each program structure is bucketed
    on its own (:class:`_StructBuckets`)."""
    by_struct: dict[tuple, list[Planned]] = {}
    for p in pending:
        by_struct.setdefault(struct_of(p), []).append(p)
    out = []
    for struct, plist in by_struct.items():
        out.extend(_StructBuckets(struct, policy, rows).buckets(plist, programs.get(struct, [])))
    return out


class _StructBuckets:
    """The buckets of the plans of one program structure ``struct`` (:func:`bucket_plan`): start
    from one group per distinct own shape and the existing programs, join existing programs
    first (free), then keep the cheaper of two searches for the new programs (greedy pairwise
    merges, :meth:`agglomerate`; the best split into runs along ``(n, m)``, :meth:`segments`)."""

    def __init__(self, struct, policy: BucketPolicy, rows: int):
        self.struct, self.policy, self.rows = struct, policy, rows
        self.C = policy.compile()
        self.eps = eps = struct[0] == "eps"
        # The part of a row's cost its bucket's sizes decide: an epsilon query's program
        # discretizes the row's own support whatever the bucket's capacity, a delta query's the
        # capacity.  A row's own support term cancels from every comparison of buckets.
        self.cost = functools.lru_cache(maxsize=None)(
            lambda n, m, nf, eps=eps: policy.cost(n, m, nf, rows, support=0 if eps else m))

    def buckets(self, plist: list[Planned], existing: list) -> list:
        """``[(struct, (n, m, n_freq), members, new)]`` of ``plist`` given ``existing`` programs."""
        struct, C = self.struct, self.C
        groups = self.agglomerate(self.initial_groups(plist, existing), "existing")
        fixed = [g for g in groups if g.fixed]
        free = [g for g in groups if not g.fixed and g.members]
        # Two searches for the new programs, the cheaper kept: greedy pairwise merges (any shapes)
        # and the best split into runs along (n, m).
        snapshot = [(g.members[:], g.n, g.m, dict(g.nf_at), g.limit) for g in free]
        greedy = self.agglomerate([_Group(struct, mem[:], n, m, dict(nf_at), fl, C)
                                   for mem, n, m, nf_at, fl in snapshot], "new")
        runs = self.segments([_Group(struct, mem[:], n, m, dict(nf_at), fl, C) for mem, n, m, nf_at, fl in snapshot])
        groups = fixed + min((greedy, runs), key=self.objective)
        out = []
        for g in groups:
            if not g.members:
                continue
            nf = g.nf_at[g.n]
            members = [_with_n(p, g.n) for p in g.members]
            out.append((struct, (g.n, g.m, nf), members, not g.fixed))
        return out

    def initial_groups(self, plist: list[Planned], existing: list) -> list[_Group]:
        """One group per distinct own shape ``(n, m, n_freq)``, then one per existing program."""
        policy, rows, cost = self.policy, self.rows, self.cost
        cand_n = sorted({p.plan.n for p in plist} | {e[0] for e in existing})
        groups: list[_Group] = []
        own: dict[tuple, _Group] = {}
        for p in plist:
            n, m, _ = shape_of(p)
            # Kept frequencies rounded up to a power of two (>= 512): a few initial groups instead
            # of one per row; keeping more frequencies costs little and only tightens the bound.
            nf_at = {k: _round_nf(_n_freq_at(p, k), k) for k in cand_n if k >= n and (self.eps or k == n)}
            nf = nf_at[n]
            # The bucket's share of the row's cost may reach `limit`: the row then costs at most
            # max_padding times its cost on its own shape (kept frequencies rounded as above, so
            # that its own group always fits, max_padding = 1 included).
            limit = policy.max_padding * policy.cost(n, m, nf, rows) - (policy.cost(n, m, nf, rows) - cost(n, m, nf))
            key = (n, m, nf)
            g = own.get(key)
            if g is None:
                g = own[key] = _Group(self.struct, [], n, m, nf_at, limit, self.C)
                groups.append(g)
            else:
                g.nf_at = {k: _combine_nf(g.nf_at[k], v) for k, v in nf_at.items()}
                g.limit = min(g.limit, limit)
            g.members.append(p)
        for n, m, nf, pay in existing:
            groups.append(_Group(self.struct, [], n, m, {n: nf}, math.inf, pay, fixed=True))
        return groups

    @staticmethod
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

    def gain(self, a: _Group, b: _Group):
        """``(saving, merged shape)`` of joining ``a`` and ``b``, or None if not allowed."""
        cost = self.cost
        if not (a.members or b.members):
            return None
        shape = self.merged(a, b)
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
            saved = a.pay + b.pay - self.C
        return saved - waste, shape

    def agglomerate(self, groups, phase):
        """Greedy agglomeration: a heap of pair gains (largest first); an entry is stale once
        either group has changed since it was computed (version counters).  Phase "existing":
        only joins of existing programs (free: no compile); "new": any merge."""
        version = {id(g): 0 for g in groups}
        tick = itertools.count()
        heap = []

        def push(a, b):
            if phase == "existing" and not (a.fixed or b.fixed):
                return
            r = self.gain(a, b)
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
                a.pay = self.C
            if not b.fixed:
                groups.remove(b)
            version[id(a)] += 1
            version[id(b)] += 1
            for g in groups:
                if g is not a:
                    push(a, g)
        return groups

    def segments(self, free):
        """The cheapest split of ``free`` (sorted by FFT length, then support) into contiguous
        runs, one new program each (dynamic programming; optimal among such splits)."""
        free = sorted(free, key=lambda g: (g.n, g.m))
        best, cut = self._best_cuts(free)
        out, j = [], len(free)
        while j > 0:
            i = cut[j]
            seg = free[i:j]
            n = seg[-1].n
            nf = seg[0].nf_at[n]
            for g in seg[1:]:
                nf = _combine_nf(nf, g.nf_at[n])
            out.append(_Group(self.struct, [p for g in seg for p in g.members], n, max(g.m for g in seg), {n: nf},
                              min(g.limit for g in seg), self.C))
            j = i
        return out

    def _best_cuts(self, free):
        """The dynamic program of :meth:`segments`: ``best[j]`` the least cost of ``free[:j]``,
        ``cut[j]`` where its last run starts."""
        cost, C = self.cost, self.C
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
        return best, cut

    def objective(self, gs):
        """Compiles plus run cost of the groups ``gs``."""
        return sum(g.pay for g in gs if g.members and not g.fixed) + sum(
            len(g.members) * self.cost(g.n, g.m, g.nf()) for g in gs if g.members)


def validate_policy(policy) -> BucketPolicy:
    if policy is None:
        return BucketPolicy()
    if not isinstance(policy, BucketPolicy):
        raise ValueError(f"bucketing must be a dpjax.pld.sweeping.BucketPolicy, got {policy!r}")
    return policy
