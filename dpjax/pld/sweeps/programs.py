"""The bucket programs of a sweep: compile pool, chunks, retries, rows (:mod:`dpjax.pld.sweeps.driver`, step 3).

:func:`compile_program` compiles (or loads a serialized) bucket program for a chunk's static
sizes (kept in :data:`COMPILED`, their origin in :data:`ORIGIN`); :func:`known_programs` /
:func:`disk_programs` list the shapes already available, for the bucketing;
:func:`chunk_args` lays a chunk's plans out over the devices and :func:`run_chunk` runs it
(``[{direction results}]`` per member, as :func:`dpjax.pld.grid.engine.unpack`).  A row whose
wrap-around or truncation term is over budget is re-planned by :func:`retry` (the
accountant's own rules); :func:`grid_row` turns a finished member into a row,
:func:`needs_single` decides when the single call must answer instead (:func:`single_row`),
and :func:`exact_row` answers the ``q = 1`` configurations from the closed form.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math

import numpy as np

from dpjax._base import lazy_module as _lazy_module
from dpjax._base import xla as _xla
from dpjax._base.enums import Query
from dpjax.pld import accountant as _acc
from dpjax.numerics import cache as _cache
from dpjax.pld.grid import engine
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.pld.grid.plan import GridOptions
from dpjax.pld.grid.program import STAGES
from dpjax.pld.sweeps.config import (SWEEP_OPTIONS, SWEEP_SLACK, SweepConfig, config_components, config_fields, grid_name,
                                     options_for)
from dpjax.pld.sweeps.plan import BucketPolicy, Planned, bucket_plan, plan_config

jax = _lazy_module("jax")

__all__ = ["FLOOR_FREE_BELOW", "floor_free_needed", "BLOCK_BYTES", "STAGE_BYTES", "fit_per_device", "Chain", "make_mesh", "COMPILE_WORKERS", "chunk_args", "share_rows",
           "COMPILED", "ORIGIN", "bucket_spec", "known_programs", "disk_programs", "program_key", "compile_program",
           "run_chunk", "run_host", "HostRunner", "retry", "RETRY_SPACING", "grid_row", "needs_single", "single_row", "exact_row", "BucketRunner"]


#: A sweep's epsilon programs compute the floor-free bound (:func:`needs_single`) when one of its
#: epsilon queries has ``delta`` below this.  The FFT round-off floor is far below ``1e-3 delta``
#: above it (the largest measured floors, ``n x floor ~ 5e-11``, mattered at ``delta ~ 5e-8``);
#: without the bound a row whose floor does matter still gets the single call's answer
#: (:func:`needs_single`), so this only trades compile and run time.
FLOOR_FREE_BELOW = 1e-6


def floor_free_needed(configs) -> bool:
    """Whether a sweep over ``configs`` (:class:`~dpjax.pld.sweeps.config.SweepConfig`) compiles the
    floor-free bound into its epsilon programs (see :data:`FLOOR_FREE_BELOW`)."""
    return any(c.query is Query.EPSILON and c.delta < FLOOR_FREE_BELOW for c in configs)


def _has_floor_free(want: str, floor_free: bool) -> bool:
    """Whether a bucket program has the floor-free column: epsilon programs of a sweep that asks
    for it (delta programs never have it)."""
    return want == "eps" and bool(floor_free)


def _columns(want: str, floor_free: bool = True) -> int:
    """Columns of a row of the bucket program's output: the value, the diagnostics, and the
    floor-free bound where :func:`_has_floor_free` (the program's ``floor_free`` column)."""
    return 1 + len(engine.DIAGNOSTICS) + _has_floor_free(want, floor_free)


@functools.lru_cache(maxsize=None)
def _batched(mesh, spec, block=1):
    """The jitted programs of a bucket, one per stage of the PLD program
    (:func:`dpjax.pld.grid.program.stage_names`, compiled :class:`~dpjax.pld.grid.program.Spec` ``spec``), each
    looped over the configurations of a chunk whose leading axis is sharded over ``mesh``:
    ``stage(count, inputs, previous stage's output)``.

    Each device runs a ``lax.while_loop`` over its own part of the chunk, ``block`` configurations
    per iteration (``jax.vmap`` inside a block), stopping after its ``count`` real configurations
    (padding costs nothing beyond the last block, so one chunk size serves every bucket).  On CPU
    ``block = 1``: vmapping turns the window's dynamic slices and the conversion's lookups into
    batched gathers, measured 6x slower on CPU.  On an accelerator a block of configurations per
    step fills the device (see :func:`_block_size`).  The last stage's output is ``(chunk,
    directions, kinds, columns)``: see :func:`_columns`.  The intermediate arrays stay sharded on
    the devices between stages.
    """
    from jax.sharding import PartitionSpec as P

    from dpjax.pld.grid import program as prog

    specs = P("configs")
    out = []
    for stage, fn in zip(prog.stage_names(spec), prog.stage_functions(spec)):
        local = prog.looped(fn, block)
        # A name per stage and static shape: the XLA module (and a profile's events) say which ran.
        local.__name__ = local.__qualname__ = (f"sweep_{stage}_{spec.want}_n{spec.n}_{'_'.join(spec.kinds)}"
                                               f"_b{block}{'_floorfree' if spec.floor_free else ''}")
        out.append(jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=specs, check_vma=False)))
    return tuple(out)


#: Working memory of one vmapped block of configurations on an accelerator (bytes).
BLOCK_BYTES = 2**31


#: The largest array a stage hands the next, per device (bytes): a chunk of a bucket with long
#: FFTs runs fewer configurations per device (:func:`fit_per_device`).
STAGE_BYTES = 2**29


def fit_per_device(per_device: int, spec) -> int:
    """Configurations per device of a chunk of bucket ``spec``: ``per_device`` halved until the
    largest intermediate array (the members' loss CDFs or PMFs, the composed spectra, the
    windowed rows: about ``8 n max(4 D members, R members, 2 R)`` bytes per configuration, ``R``
    rows of ``D`` directions) fits :data:`STAGE_BYTES`."""
    D = len(spec.directions)
    rows = D * len(spec.kinds)
    members = sum(g.members for g in spec.groups)
    per_config = 8 * spec.n * max(4 * D * members, rows * members, 2 * rows)
    while per_device > 1 and per_device * per_config > STAGE_BYTES:
        per_device //= 2
    return per_device


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


def make_mesh(devices):
    from jax.sharding import Mesh

    return Mesh(np.asarray(devices), ("configs",))


def _global_array(x: np.ndarray, sharding):
    """A global array sharded along axis 0 (each process supplies its own shards; the same call
    on one host)."""
    x = np.ascontiguousarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def _gather(out) -> np.ndarray:
    """A chunk's output on this process: the whole global array (every process's shards, after
    ``jax.distributed.initialize()``)."""
    if not getattr(out, "is_fully_addressable", True):
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(out, tiled=True))
    return np.asarray(out)


def share_rows(rows: list[dict]) -> list[dict]:
    """Every process's ``rows`` on every process (``jax.distributed``), process by process; the
    rows of this process alone without it.  The rows travel as strict JSON
    (:func:`dpjax._base.io.dumps`), so every float arrives bit for bit."""
    if _xla.process_count() == 1:
        return list(rows)
    from jax.experimental import multihost_utils

    from dpjax._base import io as _io

    data = np.frombuffer(_io.dumps(list(rows)).encode("utf-8"), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    every = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    out = []
    for size, chunk in zip(sizes, every):
        out.extend(_io.loads(bytes(chunk[:int(size)])))
    return out


#: Background compile threads of a sweep (XLA compiles each program on one core).
COMPILE_WORKERS = 2


def _inputs(p: Planned, kinds, floor_free: bool):
    """One member's program inputs and its host :class:`~dpjax.pld.grid.program.Spec`."""
    from dpjax.pld.grid import program as prog

    target = (p.cfg.delta if p.cfg.delta is not None else 0.5) if p.want == "eps" else \
        (p.cfg.epsilon if p.cfg.epsilon is not None else 0.0)
    return prog.inputs(p.plan, [target], kinds=kinds, want=p.want, floor_free=_has_floor_free(p.want, floor_free))


def bucket_spec(first: Planned, kinds, floor_free: bool):
    """The compiled :class:`~dpjax.pld.grid.program.Spec` of a bucket (its FFT length and structure)."""
    from dpjax.pld.grid import program as prog

    return prog.jit_spec(_inputs(first, kinds, floor_free)[1])


def chunk_args(members: list[Planned], per_device: int, mesh, kinds=("up",), floor_free: bool = True):
    """The global input arrays of one chunk (``len(members) <= per_device * devices``):
    ``(count, inputs)``, every :class:`~dpjax.pld.grid.program.Inputs` leaf with a leading slot axis.

    Layout: device ``d`` gets ``members[d::devices]`` first in its block, then padding (copies of
    the first member, never computed: each device loops over its real count only).
    """
    from jax.sharding import NamedSharding, PartitionSpec

    from dpjax.pld.grid import program as prog

    ndev = mesh.devices.size
    first = members[0]
    slots, counts = [], []
    for d in range(ndev):
        mine = members[d::ndev]
        counts.append(len(mine))
        slots.extend(mine + [first] * (per_device - len(mine)))
    items = [_inputs(p, kinds, floor_free)[0] for p in slots]
    inp = prog.stack_inputs(items, len(items))
    count = np.asarray(counts, np.int32)
    sharding = NamedSharding(mesh, PartitionSpec("configs"))
    return jax.tree_util.tree_map(lambda x: _global_array(x, sharding), (count, inp))


#: Compiled bucket programs of this process, by static sizes and input shapes (a second sweep
#: of the same shapes compiles nothing).
COMPILED: dict = {}


#: How each was made: "compiled" (traced here) or "loaded" (a serialized program of an earlier process).
ORIGIN: dict = {}


#: The FFT lengths of those programs, for the bucketing of later sweeps:
#: ``{(devices, chunk, kinds, floor_free): {struct: {n, ...}}}``.
_SHAPES: dict = {}


def _mesh_id(mesh) -> tuple:
    return tuple(str(d) for d in mesh.devices.flat)


def known_programs(mesh, chunk: int, kinds, floor_free: bool = True) -> dict:
    """``{struct: [n, ...]}``: bucket programs compiled by earlier sweeps of this process."""
    return {k: sorted(v) for k, v in _SHAPES.get((_mesh_id(mesh), chunk, kinds, floor_free), {}).items()}


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


def disk_programs(mesh, chunk: int, kinds, structs, floor_free: bool = True) -> dict:
    """``{struct: [n, ...]}`` for the given program structures: bucket programs serialized by
    earlier processes for this device count, chunk size, discretizations and floor-free column
    (program store on; else empty)."""
    if mesh.devices.size != 1:
        return {}
    ids = {_struct_id(st): st for st in structs}
    by_id: dict = {}
    for meta in _cache.program_index(f"sweep_{STAGES[-1]}"):
        try:
            if (meta["chunk"] != chunk or tuple(meta["kinds"]) != tuple(kinds) or meta["devices"] != 1
                    or bool(meta.get("floor_free", True)) != floor_free):
                continue
            by_id.setdefault(meta["struct"], set()).add(int(meta["n"]))
        except (KeyError, TypeError, ValueError):
            continue
    return {ids[ident]: sorted(ns) for ident, ns in by_id.items() if ident in ids}


def program_key(mesh, spec, args):
    shapes = tuple((tuple(x.shape), str(x.dtype)) for x in jax.tree_util.tree_leaves(args))
    return (mesh, spec, str(jax.tree_util.tree_structure(args)), shapes)


class Chain:
    """A bucket's compiled stages, run in turn on a chunk: ``chain(count, inputs)`` -> the last
    stage's output.  ``loaded``: every stage came from the program store."""

    def __init__(self, stages: list):
        self.stages = stages
        self.loaded = all(getattr(f, "loaded", False) for f in stages)

    def __call__(self, count, inp):
        prev = None
        for fn in self.stages:
            prev = fn(count, inp, prev)
        return prev


def _abstract(tree, sharding):
    """Shape-and-dtype placeholders of a stage's output, sharded like the chunk."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def compile_program(key, mesh, spec, args, struct=None, chunk=None):
    """The bucket's program (a :class:`Chain` of its stages), compiled ahead of its first call
    (thread-safe: runs in the background compile pool while other buckets run)."""
    from jax.sharding import NamedSharding, PartitionSpec

    from dpjax.pld.grid import program as prog

    fn = COMPILED.get(key)
    if fn is None:
        block = _block_size(mesh, spec.n, len(spec.directions) * len(spec.kinds), _per_device_of(args, mesh))
        sharding = NamedSharding(mesh, PartitionSpec("configs"))
        with jax.enable_x64(True):
            programs = _batched(mesh, spec, block)
            static_key = repr((_struct_id(struct) if struct is not None else None, spec.n, spec.directions, spec.kinds,
                               spec.want, spec.floor_free, mesh.devices.size, block))
            stages, prev = [], None
            for i, (stage, program) in enumerate(zip(prog.stage_names(spec), programs)):
                stage_args = (args[0], args[1], prev)
                # With the program store on (the default), an earlier process's executable is
                # loaded instead of tracing and compiling; the last stage's record indexes the
                # bucket's FFT length so that later processes can bucket configurations onto it
                # (disk_programs).
                meta = None
                if i == len(programs) - 1 and struct is not None and chunk is not None:
                    meta = dict(struct=_struct_id(struct), n=int(spec.n), kinds=list(spec.kinds), chunk=int(chunk),
                                devices=int(mesh.devices.size), floor_free=bool(spec.floor_free))
                if mesh.devices.size == 1 and _xla.process_count() == 1:
                    stages.append(_cache.compiled(f"sweep_{stage}", program, stage_args, static_key, meta=meta,
                                                  compile_options=_xla.compile_options()))
                else:  # an executable for one device layout: compiled in this process only
                    stages.append(program.lower(*stage_args).compile(_xla.compile_options()))
                prev = _abstract(jax.eval_shape(program, *stage_args), sharding)
            fn = Chain(stages)
        ORIGIN[key] = "loaded" if fn.loaded else "compiled"
        COMPILED[key] = fn
    if struct is not None and chunk is not None:
        _SHAPES.setdefault((_mesh_id(mesh), chunk, tuple(spec.kinds), bool(spec.floor_free)), {}).setdefault(
            struct, set()).add(spec.n)
    return fn


def _per_device_of(args, mesh) -> int:
    """Configurations per device of a chunk's inputs (``args[1].dx``, one per slot)."""
    return int(args[1].dx.shape[0]) // mesh.devices.size


def run_chunk(members: list[Planned], per_device: int, kinds, mesh, spec, fn=None, args=None,
              floor_free: bool = True):
    """Run one chunk of a bucket (compiled :class:`~dpjax.pld.grid.program.Spec` ``spec``: one program
    for every chunk of the bucket); ``fn`` the compiled program (compiled here if None), ``args``
    the chunk's inputs (built here if None); ``floor_free``: the program has the floor-free
    column (a row without it has no ``"floor_free"`` entry)."""
    ndev = mesh.devices.size
    if args is None:
        args = chunk_args(members, per_device, mesh, kinds, floor_free)
    if fn is None:
        fn = compile_program(program_key(mesh, spec, args), mesh, spec, args)
    out = _gather(fn(*args))
    results = {}
    has_free = _has_floor_free(spec.want, floor_free)
    for d in range(ndev):
        for j, p in enumerate(members[d::ndev]):
            results[p.index] = _unpack(p, out[d * per_device + j], kinds, has_free)
    return [results[p.index] for p in members]


def _unpack(p: Planned, row, kinds, has_free: bool):
    """One member's program output ``(D, K, columns)`` as ``[{kind: results}]`` per direction
    (:func:`dpjax.pld.grid.engine.unpack`), with the floor-free bound where the program has it."""
    res = engine.unpack(row[..., :1 + len(engine.DIAGNOSTICS)], p.directions, kinds, (1,))
    if has_free:
        for di, r in enumerate(res):
            r["up"]["floor_free"] = float(row[di, kinds.index("up"), -1])
    return res


def run_host(p: Planned, kinds, floor_free: bool = True):
    """One member on the host (:func:`dpjax.pld.grid.program.run_host`: NumPy, nothing compiled), its
    results as :func:`run_chunk`'s."""
    from dpjax.pld.grid import program as prog

    inp, spec = _inputs(p, kinds, floor_free)
    return _unpack(p, prog.run_host(inp, spec), kinds, _has_floor_free(spec.want, floor_free))


def retry(p: Planned, res, n_freq, options) -> Planned | None:
    """The accountant's own retry rules (:func:`dpjax.pld.grid.engine.run`), for the next round:
    a frequency truncation that is not negligible -> the same plan with every frequency; a
    wrap-around bound over budget -> a wider window at the same ``dx`` (up to four plans).
    None: the row is final."""
    if n_freq is not None and any(float(r["truncation"]) > 1e-3 * p.plan.tau_wrap for rd in res for r in rd.values()):
        q = dataclasses.replace(p, plan=dataclasses.replace(p.plan, n_freq=None))
        return q.signed()
    budget = 10.0 * p.plan.tau_wrap
    over = any((k == "up" and float(r["tail_above"]) > budget) or float(r["tail_below"]) > budget
               for rd in res for k, r in rd.items())
    if not over or p.plan.n >= options_for(p.cfg, options).n_max or p.attempt >= 3:
        return None
    needed = [float(r["needed_width"]) for rd in res for r in rd.values()]
    needed = max([w for w in needed if math.isfinite(w)], default=0.0)
    own = options_for(p.cfg, options)
    n = p.plan.n
    if (p.attempt == 0 and own == SWEEP_OPTIONS and n & (n - 1) == 0 and own.n_min <= n
            and 1.1 * needed <= RETRY_SPACING * n * p.plan.dx):
        # The sweep's own grids: the wider window on the same FFT length at a coarser spacing
        # (at most RETRY_SPACING times: the discretization error, ~dx^2, stays within
        # RETRY_SPACING^2 times the target, a quarter of SWEEP_SLACK), so the row stays in a
        # program of its first round instead of asking for a new one.
        same_n = dataclasses.replace(own, n_max=n)
        return plan_config(p.index, p.cfg, same_n, min_width=1.1 * needed, attempt=p.attempt + 1, groups=p.groups)
    min_width = max(1.05 * needed, 1.5 * n * p.plan.dx)
    return plan_config(p.index, p.cfg, options, min_width=min_width, attempt=p.attempt + 1, groups=p.groups)


#: The largest factor by which a retried sweep row's grid spacing may grow on its FFT length
#: (:func:`retry`): its discretization error then stays below 2.25 times the sweep's target.
RETRY_SPACING = 1.5


def grid_row(p: Planned, reports, path: str, grid: str) -> dict:
    dir_reports, upper, lower = engine.combine(reports)
    upper, lower = float(np.ravel(upper)[0]), float(np.ravel(lower)[0])
    if p.cfg.query is Query.EPSILON and _acc.sampling_is_rare(p.cfg.sampling_prob, p.cfg.steps, p.cfg.delta):
        # As the single call (dpjax.pld.accountant.epsilon) does; the test first, on the row's
        # own (q, T, delta), keeps the components off the common path.
        floored = _acc.rare_sampling_floor(config_components(p.cfg), p.cfg.delta, upper)
        if floored is not None and float(floored) < upper:
            upper, lower = float(floored), min(lower, float(floored))
    return dict(index=p.index, **config_fields(p.cfg, upper), lower=lower, upper=upper, grid=grid,
                n=int(dir_reports[0].n), dx=float(dir_reports[0].dx), path=path)


def needs_single(p: Planned, res, row: dict) -> bool:
    """True where the single call would not stop at this grid's answer and could give a
    materially different one: a direction the grid could not certify (the single call then falls
    back on the bounds of :mod:`dpjax.pld.fallback`), or an FFT round-off floor that matters at
    the requested delta (the single call then re-runs the composition tilted towards the tail).
    Such rows (tiny ``q T``, small deltas) are recomputed by :func:`dpjax.pld.epsilon` /
    :func:`dpjax.pld.delta`.

    An epsilon row whose floor matters is kept when the tilted pass cannot move it by more than
    :data:`SWEEP_SLACK`: its certified bracket is that narrow (any certified answer, the single
    call's included, is at or above the lower end), or the floor-free bound of every direction
    (its epsilon at :func:`dpjax.pld.grid.program.floor_free_target`: no smaller round-off
    allowance takes the row below it on this grid) is within half of it (the other half is the grid's own slack)."""
    if p.cfg.query is Query.EPSILON:
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
    if p.cfg.query is not Query.EPSILON:
        return True
    upper = row["upper"]
    if upper - row["lower"] <= SWEEP_SLACK * upper:
        return False
    bound = max(float(r["up"].get("floor_free", -math.inf)) for r in res)
    return not (upper - bound <= 0.5 * SWEEP_SLACK * upper)


def single_row(index: int, cfg: SweepConfig, options: GridOptions, with_lower: bool) -> dict:
    """The row from the single-configuration accountant (path "single")."""
    comps = config_components(cfg)
    if cfg.query is Query.EPSILON:
        res = _acc.epsilon(comps, cfg.delta, options=options, with_lower=with_lower)
        value, lower, upper = float(res.epsilon), float(res.epsilon_lower), float(res.epsilon_upper)
    else:
        res = _acc.delta(comps, cfg.epsilon, options=options, with_lower=with_lower)
        value, lower, upper = float(res.delta), float(res.delta_lower), float(res.delta_upper)
    rep = res.directions[0]
    return dict(index=index, **config_fields(cfg, value), lower=lower, upper=upper, grid=grid_name(options),
                n=int(rep.n), dx=float(rep.dx), path="single")


def exact_row(index: int, cfg: SweepConfig) -> dict:
    """The row of a q = 1 configuration from the closed form (as :func:`dpjax.pld.dpsgd_epsilon`)."""
    mech = PoissonSubsampledGaussian(cfg.noise_multiplier, 1.0)
    if cfg.query is Query.EPSILON:
        res = _acc.epsilon([(mech, cfg.steps)], cfg.delta)
        value, lower, upper = float(res.epsilon), float(res.epsilon_lower), float(res.epsilon_upper)
    else:
        res = _acc.delta([(mech, cfg.steps)], cfg.epsilon)
        value, lower, upper = float(res.delta), float(res.delta_lower), float(res.delta_upper)
    return dict(index=index, **config_fields(cfg, value), lower=lower, upper=upper, grid="closed_form", n=0,
                dx=0.0, path="exact")


class BucketRunner:
    """Runs a sweep's planned configurations in bucket programs, round after round (a retried
    row, rare, goes to the next round's buckets), filling ``rows`` (``{index: row}``).

    One per sweep.  ``known``: ``struct -> {n: pay}``, the programs the sweep can use without
    compiling (those of earlier sweeps in this process and of this sweep: 0; serialized ones
    from earlier processes: their load cost); ``programs``: the keys of the programs it ran;
    ``made``: those it compiled or loaded itself."""

    def __init__(self, mesh, per_device: int, chunk: int, kinds, policy: BucketPolicy, options, with_lower: bool,
                 structs, floor_free: bool = True):
        self.mesh, self.per_device, self.chunk, self.kinds = mesh, per_device, chunk, kinds
        self.policy, self.options, self.with_lower = policy, options, with_lower
        self.floor_free = floor_free
        self.rows_per_cfg = 0  # directions x kinds, from the first row (the cost model's unit is per row)
        self.known: dict[tuple, dict] = {}
        for struct, ns in known_programs(mesh, chunk, kinds, floor_free).items():
            self.known[struct] = {n: 0.0 for n in ns}
        for struct, ns in disk_programs(mesh, chunk, kinds, structs, floor_free).items():
            entry = self.known.setdefault(struct, {})
            for n in ns:
                entry.setdefault(n, policy.load_cost)
        self.inflight: dict = {}    # program key -> compile future (this sweep)
        self.made: set = set()      # program keys this sweep compiled or loaded
        self.programs: set = set()  # program keys this sweep ran
        self.first_round: dict[tuple, dict] = {}   # struct -> {n: 0.0} of this sweep's first round

    def jobs(self, pending: list[Planned], only_new: bool = False) -> list:
        """The buckets of ``pending`` (:class:`BucketPolicy`) as ``(parts, spec, args0, key,
        struct)``: chunks, compiled spec, first-chunk inputs, program key; ``only_new``: just
        those needing a new program."""
        policy = self.policy
        self.rows_per_cfg = self.rows_per_cfg or len(pending[0].directions) * len(self.kinds)
        jobs = []
        # Buckets depend on the configurations only, not on which programs happen to exist:
        # the same sweep then gives the same rows (the same grids) in a fresh process, in a
        # warm one and after other sweeps.  Retried rows (every round after the first) may also
        # join a program of this sweep's first round (a function of the configurations only),
        # whatever the padding: they are few, and a new program for them would cost a compile.
        retry_round = bool(self.first_round)
        if retry_round:
            policy = dataclasses.replace(policy, max_padding=math.inf)
        for struct, n, members, _ in bucket_plan(pending, self.first_round if retry_round else {}, policy,
                                                 self.rows_per_cfg):
            if not retry_round:
                self.first_round.setdefault(struct, {})[n] = 0.0
            new = n not in self.known.get(struct, {})
            if only_new and not new:
                continue
            self.known.setdefault(struct, {})[n] = 0.0
            spec = bucket_spec(members[0], self.kinds, self.floor_free)
            per_device = fit_per_device(self.per_device, spec)
            size = per_device * self.mesh.devices.size
            parts = [members[i:i + size] for i in range(0, len(members), size)]
            args0 = chunk_args(parts[0], per_device, self.mesh, self.kinds, self.floor_free)
            jobs.append((parts, spec, args0, program_key(self.mesh, spec, args0), struct, per_device,
                         len(members) * policy.cost(n, self.rows_per_cfg)))
        # The costliest bucket first: its run then overlaps the other buckets' compiles instead
        # of ending the sweep alone (which bucket holds a row does not change, only the order).
        jobs.sort(key=lambda job: -job[-1])
        return [job[:-1] for job in jobs]

    def submit(self, pool, key, spec, args0, struct):
        """The compile future of program ``key`` (submitted to ``pool`` once per sweep)."""
        if key not in self.inflight:
            if key not in COMPILED:
                self.made.add(key)
            self.inflight[key] = pool.submit(compile_program, key, self.mesh, spec, args0, struct, self.chunk)
        return self.inflight[key]

    def run(self, pending: list[Planned], rows: dict, store, bar) -> None:
        """Every round of ``pending`` until no row is retried; rows go to ``rows``, ``store``
        (when not None) and the progress ``bar``."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_WORKERS) as pool:
            while pending:
                jobs = []
                for parts, spec, args0, key, struct, per_device in self.jobs(pending):
                    self.programs.add(key)
                    # Compile every bucket's program in the background, in run order: compiling
                    # bucket k + 1 overlaps running bucket k.
                    jobs.append((parts, spec, args0, per_device, self.submit(pool, key, spec, args0, struct)))
                pending = []
                for parts, spec, args0, per_device, fut in jobs:
                    fn = fut.result()
                    for k, part in enumerate(parts):
                        new = self._run_part(pool, part, spec, fn, args0 if k == 0 else None, pending, per_device)
                        for row in new:
                            rows[row["index"]] = row
                        if store is not None:
                            store.append(new)
                        bar.update(len(new), programs=len(self.programs))

    def _run_part(self, pool, part: list[Planned], spec, fn, args, pending: list[Planned],
                  per_device: int) -> list[dict]:
        """Run one chunk; returns its finished rows and appends its retried plans to ``pending``."""
        results = run_chunk(part, per_device, self.kinds, self.mesh, spec, fn, args=args,
                            floor_free=self.floor_free)
        retried = len(pending)
        new = self._rows(part, results, pending)
        if len(pending) > retried:
            # Retried rows that no program holds: compile their program now, behind this
            # round's, so it overlaps the rest of the round instead of running alone at its end
            # (the next round reuses it).
            for r_parts, r_spec, r_args0, r_key, r_struct, _ in self.jobs(pending, only_new=True):
                self.submit(pool, r_key, r_spec, r_args0, r_struct)
        return new

    def _rows(self, part: list[Planned], results, pending: list[Planned]) -> list[dict]:
        """The finished rows of ``part`` (their program ``results``); retried plans go to
        ``pending``."""
        new = []
        for p, res in zip(part, results):
            again = retry(p, res, p.plan.n_freq, self.options)
            if again is not None:
                pending.append(again)
                continue
            options = options_for(p.cfg, self.options)
            row = grid_row(p, [(d, p.plan, r) for d, r in zip(p.directions, res)], "batched", grid_name(options))
            if needs_single(p, res, row):
                row = single_row(p.index, p.cfg, options, self.with_lower)
            new.append(row)
        return new


class HostRunner(BucketRunner):
    """Runs a sweep's planned configurations with the PLD program on the host (NumPy: nothing is
    compiled), ``workers`` configurations at a time on threads (NumPy releases the GIL in its
    array operations and FFTs).  Each configuration runs on its own planned FFT length (no
    buckets: padding to a shared length only pays for a compiled program).  The same rounds,
    retries and rows as :class:`BucketRunner`, whose attributes it keeps (no programs).

    Several processes (``jax.distributed``): process ``p`` of ``P`` runs the configurations
    ``p, p + P, ...`` of the sweep, and after each step every process's new rows are shared
    (:func:`share_rows`), so every process ends with every row and process 0 (the one with a
    ``store``) journals them as they come.  A row is the same whichever process computes it."""

    def __init__(self, kinds, options, with_lower: bool, floor_free: bool = True, workers: int = 1):
        self.kinds, self.options, self.with_lower, self.floor_free = kinds, options, with_lower, floor_free
        self.workers = max(1, int(workers))
        self.programs, self.made = set(), set()

    @property
    def step(self) -> int:
        """Configurations per step (a step's rows are recorded together)."""
        return 16 * self.workers

    def _host(self, p: Planned):
        from dpjax.pld.grid import program as prog

        return prog.worker(run_host, p, self.kinds, self.floor_free)

    def _run_local(self, pool, todo: list[Planned]) -> list[dict]:
        """The rows of ``todo``, every retry round included."""
        out = []
        while todo:
            pending: list[Planned] = []
            results = list(pool.map(self._host, todo))
            out.extend(self._rows(todo, results, pending))
            todo = pending
        return out

    def run(self, pending: list[Planned], rows: dict, store, bar) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.workers) as pool:
            if _xla.process_count() > 1:
                self._run_processes(pool, pending, rows, store, bar)
                return
            while pending:
                todo, pending = pending, []
                for k in range(0, len(todo), self.step):
                    part = todo[k:k + self.step]
                    results = list(pool.map(self._host, part))
                    new = self._rows(part, results, pending)
                    for row in new:
                        rows[row["index"]] = row
                    if store is not None:
                        store.append(new)
                    bar.update(len(new), programs=0)

    def _run_processes(self, pool, mine: list[Planned], rows: dict, store, bar) -> None:
        """``mine``: this process's configurations (see the class docstring).  Every process
        runs the same number of steps (the largest share's), so that the sharing steps match."""
        from jax.experimental import multihost_utils

        # Every process must take part in every sharing step: the step count and size are agreed
        # (hosts may have different numbers of cores).
        agreed = np.asarray(multihost_utils.process_allgather(np.array([len(mine), self.step], np.int32)))
        count, step = int(np.max(agreed.reshape(-1, 2)[:, 0])), int(np.max(agreed.reshape(-1, 2)[:, 1]))
        for k in range(0, count, step):
            new = share_rows(self._run_local(pool, mine[k:k + step]))
            for row in new:
                rows[row["index"]] = row
            if store is not None:
                store.append(new)
            bar.update(len(new), programs=0)

