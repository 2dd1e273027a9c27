"""Sweeps: thousands of DP-SGD configurations on every core, or in a handful of compiled programs.

``sweep(configs)`` takes a list of configurations (noise multiplier ``sigma``, sampling
probability ``q``, steps ``T``, and either a target ``delta`` (an epsilon query) or a target
``epsilon`` (a delta query), optionally a ``group_size``) and returns a :class:`SweepTable`: one
row per configuration, in input order, with the certified value, its certified bracket
``[lower, upper]`` and the grid used (``n``, ``dx``).

Two backends (``SweepExecution(backend=...)``).  On one CPU device (``"auto"``, the default there) every
configuration runs the PLD program on the host (:func:`dpjax.pld.grid.program.run_host`: NumPy, no
compile), on threads over the usable cores, on its own planned FFT length: the first pass costs
what every later one costs.  With accelerators or several devices (``"compiled"``) the
configurations run in compiled bucket programs sharded over the devices, as below; the rounds,
retries and rows are the same (:class:`~dpjax.pld.sweeps.programs.HostRunner`,
:class:`~dpjax.pld.sweeps.programs.BucketRunner`).

How the compiled backend stays fast.  A compiled bucket program serves every configuration of its structure and
FFT length (supports and kept frequencies are data, :mod:`dpjax.pld.grid.program`), and a compile
costs as much as running a few hundred configurations, while running a configuration on an FFT
four times its own length costs about four times as much.  The sweep therefore

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
   an earlier process left in the program store (below), cost no compile and are filled first.  So a few hundred configurations share a handful of programs and ten thousand
   get tighter ones; a configuration far from the rest keeps a shape near its own;
3. runs every bucket's chunks through the PLD program (:mod:`dpjax.pld.grid.program`, the
   accountant's composition and conversion with both discretizations batched), compiled as one
   small XLA program per stage (:func:`dpjax.pld.grid.program.stage_names`: loss CDFs, PMFs,
   composition, window, conversion; each in a loop over a fixed-size chunk of configurations,
   padding slots never computed, the intermediate arrays kept on the devices between stages;
   a chunk of a long FFT holds fewer configurations, :func:`~dpjax.pld.sweeps.programs.fit_per_device`).
   Programs are compiled ahead, in a background pool of
   :data:`~dpjax.pld.sweeps.programs.COMPILE_WORKERS` threads in run order, so compiling bucket
   ``k + 1`` overlaps running bucket ``k``;
4. applies the accountant's own retry rules to each row's diagnostics (a wrap-around bound over
   budget: re-plan a wider window at the same ``dx``; a frequency-truncation bound that is not
   negligible: keep every frequency); retried rows form the buckets of the next round, on the
   programs already compiled where they fit.  They are rare because the planner sizes every
   window by the Chernoff quantiles of the probe's composed log-MGF at the retry threshold too.
   On the sweep's own grids a first retry keeps the row's FFT length and widens the window at a
   coarser spacing instead (at most :data:`~dpjax.pld.sweeps.programs.RETRY_SPACING` times, within the
   slack), and retried rows may join any program of the sweep's first round by the cost model
   alone: a program compiled for a couple of retried rows would cost the first pass seconds.
   A retried row that no program holds has its program compiled as soon as the row is known,
   behind the round's own compiles, so it overlaps the rest of the round;
5. gives every row the single call's error accounting: a row where the single call would not
   stop at the grid's answer (a direction the grid cannot certify, or an FFT round-off floor
   that matters at the requested delta) is recomputed by :func:`dpjax.pld.epsilon` /
   :func:`dpjax.pld.delta` (path "single": the tilted tail pass and the fallback bounds of
   :mod:`dpjax.pld.fallback`), unless the row's certified bracket or its floor-free bound shows
   that the single call cannot move it by more than :data:`SWEEP_SLACK` (see
   :func:`dpjax.pld.sweeps.programs.needs_single`).

Where the steps live: the configurations, their rows and the grid policy in
:mod:`dpjax.pld.sweeps.config`; planning and bucketing (steps 1-2) in :mod:`dpjax.pld.sweeps.plan`;
the compile pool, the chunks, retries and rows (steps 3-5, :class:`~dpjax.pld.sweeps.programs.BucketRunner`)
in :mod:`dpjax.pld.sweeps.programs`.  This module is the entry point: :func:`sweep` and the public
names (``dpjax.pld.sweeps.driver.SweepConfig``, ``BucketPolicy``, ...) re-exported from there.

Across processes.  With the program store on (the default; :mod:`dpjax.numerics.cache`) each bucket
program is kept as a serialized executable and indexed by its FFT length, and the plans of a
sweep are stored keyed by its configurations: a later process sweeping the same (or similar)
configurations plans nothing it planned before, buckets onto the stored programs and loads them
instead of tracing and compiling.  :attr:`SweepTable.compiled` and :attr:`SweepTable.loaded` count the
programs each sweep compiled and loaded.

Grid policy and slack.  A bucket's run time grows with the FFT length ``n`` and, faster per
point, with the single-step support length ``m`` (loss CDFs, discretization and log-MGF per
point).  The single call's grids (``GridOptions()``: the tighter of 1e-3 relative and 8e-9 per
step, at least 2^16 points) are sized for one answer; for epsilon queries the sweep plans with
:data:`SWEEP_OPTIONS` instead: a relative target of a quarter of :data:`SWEEP_SLACK` on epsilon
(the connect-the-dots law ``0.3 C dx^2 / sigma_c <= 2.5e-4 epsilon``) and no minimum length,
which shortens ``n`` and ``m`` several times on typical DP-SGD configurations.  It is as sound
as any grid (soundness never depends on the plan, docs/design.md §2.4); the only change is
tightness: each epsilon row is within :data:`SWEEP_SLACK` (1e-3) relative of
:func:`dpjax.pld.dpsgd_epsilon` on that configuration (``tests/pld/sweeps/test_sweep.py`` checks it on
random configurations), and the two certified brackets overlap (each value lies above the
other's certified lower end), so neither is below the truth, the exact oracle (q = 1 rows are
answered from the closed form) or dp_accounting's optimistic estimate.  The lower end of the
bracket is computed on the same coarser grid: it is looser than the single call's.
``options=GridOptions()`` restores the single call's grids
(rows then equal it up to the bucket slack of 1e-6 relative: padding only moves the
truncation and wrap-around terms, which stay below ``tail_fraction * delta``).  Delta queries
always use the single call's policy (a relative target on epsilon does not bound the relative
error of small deltas) and keep the planned ``n`` (a longer FFT raises the round-off floor of
deltas below ``GridOptions.delta_tail_mass``); their rows equal :func:`dpjax.pld.dpsgd_delta` up
to the bucket slack.

Devices.  The configuration axis of every chunk is sharded over every device JAX sees
(``jax.sharding.NamedSharding`` on a 1-D mesh named ``"configs"``; the chunk size is a multiple
of the device count).  Eight fake CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) give the same table as one.  Several
processes (one host or many): call ``jax.distributed.initialize()`` in every process before the
sweep and run the same sweep with the same arguments in every process; no scheduler of dpjax's
own is involved.  Every process plans the configurations (planning is deterministic), and every
process returns the whole table.  With one CPU device per process (``backend="auto"``: a CPU
cluster) process ``p`` of ``P`` runs configurations ``p, p + P, ...`` on the host program and the
processes exchange their rows after every step, so the rows are those of the same sweep in one
process, bit for bit.  Otherwise (accelerators, or several devices per process, or
``backend="compiled"``) ``jax.devices()`` lists every process's devices, the global input
arrays are built with ``jax.make_array_from_callback`` (each process supplies only its own
shards) and the output is gathered with ``jax.experimental.multihost_utils.process_allgather``:
the same code path as one device, and the same rows as the compiled backend in one process.
Only process 0 opens ``out``: it journals every row and writes the final files, and the rows it
recovers with ``resume=True`` reach every process, so a sweep whose processes were killed
resumes as a whole.  On CPU each device loops
over its configurations one at a time (32 per chunk by default); on an accelerator each loop
step runs a block of configurations at once (``jax.vmap``, as many as fit
:data:`~dpjax.pld.sweeps.programs.BLOCK_BYTES` of working memory; 256 per chunk by default).
XLA's GPU compiler takes far longer over a bucket program than its CPU compiler
(``benchmarks/bench_sweep_gpu.py`` records both passes), so on a GPU the first sweep of a
process is mostly compiling and later ones run at the device's speed; the program store (on by
default, :mod:`dpjax.numerics.cache`) lets later processes load the programs.

Long sweeps.  ``out="sweep.csv"`` writes rows as they are computed (CSV and JSON lines next to
it, Parquet at the end if ``pyarrow`` is installed; :mod:`dpjax.pld.sweeps.store`), and
``resume=True`` skips every configuration already recorded there: a killed sweep (even
``kill -9``) resumes without recomputing or losing a row, and the final files hold every
configuration exactly once, in input order.  Progress (:mod:`dpjax._base.progress`) shows on stderr: a
bar in a terminal or notebook, lines in a log.

Example::

    >>> import dpjax
    >>> configs = dpjax.pld.sweep_grid(noise_multiplier=[0.8, 1.0, 2.0], sampling_prob=[0.001, 0.01],
    ...                                steps=[1000, 10000], delta=1e-5)          # doctest: +SKIP
    >>> table = dpjax.sweep(configs, out="sweep.csv")                           # doctest: +SKIP
    >>> table.rows[0]["epsilon"], table.rows[0]["lower"], table.rows[0]["upper"]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from dpjax._base import deferred_x64 as _deferred_x64, lazy_module as _lazy_module
from dpjax._base import validate as _validate
from dpjax._base import xla as _xla
from dpjax._base.progress import progress as _progress_bar
from dpjax._base.x64 import host_only
from dpjax.pld.grid import engine
from dpjax.pld.grid.plan import GridOptions
from dpjax.pld.records import SweepTable
from dpjax.pld.sweeps.config import (ROW_FIELDS, SWEEP_OPTIONS, SWEEP_SLACK, SweepConfig, as_configs, matches,
                                     sweep_grid)
from dpjax.pld.sweeps.plan import BucketPolicy, join_stores, plan_configs, struct_of, validate_policy
from dpjax.pld.sweeps.programs import ORIGIN, BucketRunner, HostRunner, exact_row, floor_free_needed, make_mesh

jax = _lazy_module("jax")

__all__ = ["BucketPolicy", "SweepConfig", "SweepExecution", "SweepTable", "sweep", "sweep_grid", "ROW_FIELDS", "SWEEP_OPTIONS",
           "SWEEP_SLACK"]


#: Configurations per device in one program call (the chunk is this times the device count):
#: by platform; an accelerator runs blocks of configurations at once (see :func:`dpjax.pld.sweeps.programs._block_size`).
DEFAULT_PER_DEVICE = {"cpu": 32}


#: ... and on any other platform.
DEFAULT_PER_DEVICE_ACCELERATOR = 256


@dataclasses.dataclass(frozen=True)
class SweepExecution:
    """Where and how a sweep runs; the rows do not depend on it beyond the last bits of the FFTs.

    Attributes:
      devices: devices to shard the configuration axis over (default ``jax.devices()``: all).
      per_device: configurations per device in one program call (None: 32 on CPU, 256 on an
        accelerator), an integer >= 1.
      backend: ``"host"`` (the PLD program in NumPy on each process's cores: nothing compiled;
        several processes share the configurations out), ``"compiled"`` (bucket programs
        sharded over ``devices``), or ``"auto"`` (the default: host where ``devices`` are one CPU
        device per process, compiled otherwise).  The two give the same certified brackets up
        to the last bits of their FFTs (1e-9 relative).
      bucketing: :class:`BucketPolicy` (how configurations share compiled programs; default
        ``BucketPolicy()``).
    """

    devices: Sequence | None = None
    per_device: int | None = None
    backend: str = "auto"
    bucketing: BucketPolicy | None = None

    def __post_init__(self):
        if self.per_device is not None:
            object.__setattr__(self, "per_device", _validate.positive_int("per_device", self.per_device))
        if self.backend not in ("auto", "host", "compiled"):
            raise ValueError(f"backend must be 'auto', 'host' or 'compiled', got {self.backend!r}")
        if self.bucketing is not None:
            validate_policy(self.bucketing)


@host_only("dpjax.pld.grid_epsilon_fn on a grid from dpjax.pld.plan_fixed_grid (jax.vmap over parameters)")
def sweep(configs, *, delta=None, epsilon=None, options: GridOptions | None = None, with_lower: bool = True,
          out=None, resume: bool = False, progress: bool | None = None,
          execution: SweepExecution | None = None) -> SweepTable:
    """Certified epsilon (or delta) for every configuration; one row each, in input order.

    Args:
      configs: a list of configurations (:class:`SweepConfig` or mappings with
        ``noise_multiplier``, ``sampling_prob``, ``steps``, ``delta`` or ``epsilon``, optional
        ``group_size``), or a dict of equal-length columns, or a grid of :func:`sweep_grid`
        (Cartesian products; random allocation and balls-in-bins rows too: mappings with
        ``sampling``, ``noise_multiplier``, ``batches_per_epoch``, ``selections_per_epoch``,
        ``epochs`` and ``delta`` / ``epsilon``, each row the single call's value,
        :func:`dpjax.pld.allocation.accountant.allocation_sweep`).  Or a list of
        :class:`~dpjax.pld.scenario.TrainingScenario` of one scheme (Poisson, random allocation
        or balls-in-bins) with ``delta`` or ``epsilon``.
      delta, epsilon: with a list of scenarios, the target (one number, or one per scenario):
        ``delta`` for epsilon rows, ``epsilon`` for delta rows.  Configurations state their own.
      options: :class:`~dpjax.pld.GridOptions` (accuracy knobs) for every row, as for
        :func:`dpjax.pld.epsilon`.  Default None: :data:`SWEEP_OPTIONS` for epsilon queries
        (within :data:`SWEEP_SLACK` of :func:`dpjax.pld.dpsgd_epsilon`), ``GridOptions()`` for
        delta queries; ``GridOptions()`` gives every row the single call's grid.  Poisson rows only.
      with_lower: also compute the certified lower end of the bracket (about doubles the work).
      out: optional path (e.g. ``"sweep.csv"``): rows are written as they are computed (CSV and
        ``.jsonl``; ``.parquet`` at the end if pyarrow is installed).  Several processes: process 0
        writes it (give every process the same arguments).
      resume: with ``out``, skip configurations already recorded there (a killed sweep resumes).
      progress: show progress on stderr (None: auto, see :mod:`dpjax._base.progress`; False: never).
      execution: :class:`SweepExecution` (devices, configurations per device, backend, bucketing;
        Poisson rows only).
    Returns:
      :class:`SweepTable` (``programs`` = number of distinct batched programs run).
    """
    if execution is None:
        execution = SweepExecution()
    elif not isinstance(execution, SweepExecution):
        raise ValueError(f"execution must be a SweepExecution, got {execution!r}")
    if _scenarios_given(configs):
        configs = scenario_configs(configs, delta=delta, epsilon=epsilon)
    elif delta is not None or epsilon is not None:
        raise ValueError("delta and epsilon are the targets of a list of TrainingScenario; configurations state "
                         "their own (a delta or an epsilon each)")
    if _allocation_rows(configs):
        if options is not None or execution != SweepExecution():
            raise ValueError("options and execution are for Poisson rows; random-allocation rows are each the "
                             "single call's value, computed on the host")
        from dpjax.pld.allocation.accountant import allocation_sweep

        return allocation_sweep(configs, out=out, resume=resume, with_lower=with_lower, progress=progress)
    t0 = time.perf_counter()
    options = None if options is None else engine.grid_options(options)
    if configs is None:
        raise ValueError("configs must be a list of configurations (see dpjax.pld.sweep_grid), got None")
    configs = as_configs(configs)
    if resume and out is None:
        raise ValueError("resume=True needs out (the file a previous run wrote)")
    devices, per_device = _devices(execution.devices, execution.per_device, execution.backend)
    backend = _backend(execution.backend, devices)
    kinds = ("up", "down") if with_lower else ("up",)
    store, done = _open_store(out, resume, configs)
    rows: dict[int, dict] = dict(done)
    todo = [i for i in range(len(configs)) if i not in done]
    show = progress
    if _xla.process_index() != 0:
        show = False   # one bar, on process 0
    with _deferred_x64(), _progress_bar(total=len(configs), desc="sweep", enabled=show,
                                        initial=len(done), unit="cfg") as bar:
        todo = _exact_rows(todo, configs, rows, store, bar)
        if backend == "host" and _xla.process_count() > 1:
            # Each process plans and runs its share (HostRunner shares the rows).
            todo = todo[_xla.process_index()::_xla.process_count()]
        pending = plan_configs(todo, configs, options)
        if backend == "host":
            runner = HostRunner(kinds, options, with_lower, floor_free=floor_free_needed(configs),
                                workers=_xla.usable_cpus())
        else:
            runner = BucketRunner(make_mesh(devices), per_device, per_device * len(devices), kinds,
                                  validate_policy(execution.bucketing), options, with_lower,
                                  {struct_of(p) for p in pending}, floor_free=floor_free_needed(configs))
        runner.run(pending, rows, store, bar)
    join_stores()
    origins = [ORIGIN.get(k) for k in runner.programs if k in runner.made]
    table = SweepTable(rows=tuple(rows[i] for i in range(len(configs))), programs=len(runner.programs),
                       seconds=time.perf_counter() - t0, devices=len(devices),
                       compiled=origins.count("compiled"), loaded=origins.count("loaded"))
    if store is not None:
        store.finalize(table.rows)
    return table


def _scenarios_given(configs) -> bool:
    from dpjax.pld.scenario import TrainingScenario

    return isinstance(configs, (list, tuple)) and bool(configs) and isinstance(configs[0], TrainingScenario)


def _allocation_rows(configs) -> bool:
    """Whether ``configs`` are random-allocation / balls-in-bins rows (mappings naming the scheme)."""
    from dpjax.pld.allocation.dpsgd import is_allocation

    return isinstance(configs, (list, tuple)) and bool(configs) and isinstance(configs[0], dict) \
        and is_allocation(configs[0].get("sampling"))


def scenario_configs(scenarios, *, delta=None, epsilon=None) -> list[dict]:
    """The configurations of a sweep over :class:`~dpjax.pld.scenario.TrainingScenario` values:
    one each, at ``delta`` (epsilon rows) or ``epsilon`` (delta rows), a number or one per
    scenario.  Every scenario has the same kind of scheme and its noise; fixed batches are not
    swept."""
    from dpjax.pld.scenario import FixedBatch, Poisson, TrainingScenario

    if (delta is None) == (epsilon is None):
        raise ValueError("sweep(configs=[TrainingScenario, ...]) needs exactly one of delta and epsilon")
    kinds = {type(s.sampling) for s in scenarios if isinstance(s, TrainingScenario)}
    if len(kinds) != 1 or not all(isinstance(s, TrainingScenario) for s in scenarios):
        raise ValueError("sweep(configs=[...]) needs TrainingScenario values of one sampling scheme, got "
                         f"{sorted(k.__name__ for k in kinds)}")
    if FixedBatch in kinds:
        raise ValueError("sweep does not account FixedBatch scenarios (call dpjax.dpsgd_epsilon for each)")
    name, value = ("delta", delta) if delta is not None else ("epsilon", epsilon)
    targets = list(np.ravel(np.asarray(value, dtype=object)))
    if len(targets) not in (1, len(scenarios)):
        raise ValueError(f"{name} must be one number or one per scenario ({len(scenarios)}), got {len(targets)}")
    targets = targets * len(scenarios) if len(targets) == 1 else targets
    configs = []
    for s, target in zip(scenarios, targets):
        if s.noise_multiplier is None or isinstance(s.noise_multiplier, tuple):
            raise ValueError(f"a swept scenario needs one noise multiplier, got {s.noise_multiplier!r}")
        kw = {**s.keywords(), **s.sampling.keywords()}   # the scheme as the rows spell it
        if isinstance(s.sampling, Poisson):
            kw.pop("sampling")
            kw.setdefault("group_size", 1)
        configs.append({**kw, name: target})
    return configs


def _backend(backend, devices) -> str:
    """``"host"`` or ``"compiled"`` (see :func:`sweep`)."""
    if backend != "auto":
        return backend
    # One CPU device per process (one process, or several after jax.distributed.initialize()):
    # the host program on each process's cores.
    one_cpu_each = (all(d.platform == "cpu" for d in devices) and len(devices) == _xla.process_count()
                    and len({d.process_index for d in devices}) == len(devices))
    return "host" if one_cpu_each else "compiled"


class _OneCPU:
    """Stands in for the one CPU device JAX would list (see :func:`dpjax._base.xla.one_cpu_without_jax`)."""

    platform = "cpu"
    process_index = 0
    id = 0


_ONE_CPU = _OneCPU()


def _devices(devices, per_device, backend="auto"):
    """``(devices, per_device)`` with their defaults: every device, and the platform's chunk size."""
    if devices is None and backend != "compiled" and _xla.one_cpu_without_jax():
        # The host program on this process's cores: no need to import JAX to list one CPU.
        devices = [_ONE_CPU]
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices must not be empty")
    if per_device is None:
        per_device = DEFAULT_PER_DEVICE.get(devices[0].platform, DEFAULT_PER_DEVICE_ACCELERATOR)
    return devices, per_device


def _open_store(out, resume, configs):
    """``(store, done)``: the row store of ``out`` (None without one) and the rows it already
    holds (``{index: row}``, ``path="resumed"``), each checked against its configuration.

    Several processes (``jax.distributed``): only process 0 opens (and later writes) ``out``;
    the rows it recovered, or the reason it refused the file, reach every process."""
    if out is None:
        return None, {}
    store, done, error = None, {}, None
    if _xla.process_index() == 0:
        from dpjax.pld.sweeps.store import SweepStore

        try:
            store = SweepStore(out, ROW_FIELDS, resume=resume)
            for i, row in store.rows.items():
                if i >= len(configs) or not matches(row, configs[i]):
                    raise ValueError(f"{out} holds a row {i} that is not configuration {i} of this sweep; "
                                     f"resume only the sweep that wrote it (or write to a new file)")
                done[i] = dict(row, path="resumed")
        except (OSError, ValueError) as exc:
            if _xla.process_count() == 1:
                raise
            error = f"{type(exc).__name__}: {exc}"
    if _xla.process_count() > 1:
        from dpjax.pld.sweeps.programs import share_rows

        shared = share_rows([{"error": error, "rows": list(done.values())}] if _xla.process_index() == 0 else [])
        if shared[0]["error"] is not None:
            raise ValueError(f"out: process 0 could not use {out}: {shared[0]['error']}")
        done = {int(row["index"]): row for row in shared[0]["rows"]}
    return store, done


def _exact_rows(todo, configs, rows, store, bar) -> list[int]:
    """Answer the ``q = 1`` rows of ``todo`` (group size 1) and return the others.

    Such a row is one Gaussian mechanism: the single-configuration accountant answers it from
    the exact closed form (no grid, no round-off floor), so the sweep does too -- the row then
    equals :func:`dpjax.pld.dpsgd_epsilon` exactly, and is exact."""
    exact = [i for i in todo if configs[i].sampling_prob == 1.0 and configs[i].group_size == 1]
    if not exact:
        return todo
    new = [exact_row(i, configs[i]) for i in exact]
    for row in new:
        rows[row["index"]] = row
    if store is not None:
        store.append(new)
    bar.update(len(new))
    return [i for i in todo if i not in set(exact)]
