"""Monte Carlo sums spread over every device of every process, added in one order.

A Monte Carlo sum over ``m`` samples is cut into chunks whose size depends on ``m`` and ``b``
only.  Device ``d`` of ``D`` computes chunks ``d c .. (d + 1) c - 1`` (``c = ceil(chunks / D)``;
chunks past the last one are empty and contribute zeros), every device's per-chunk sums are
gathered (``all_gather``), and every device adds them in chunk order, starting from zero.  So
the result is the same bits on one device, on eight, or on the devices of several processes
(``jax.distributed``):

* the draws of sample ``s`` depend on the key and ``s`` only (:mod:`dpjax.montecarlo.core`);
* a chunk is the same computation on arrays of the same shapes wherever it runs;
* the chunk sums are added in one order, the one a single device's loop uses.

The same computation must also compile to the same arithmetic, and a program for several devices
passes through XLA's SPMD partitioning, which changes which of XLA's algebraic rewrites fire
(docs/design.md §14).  So the chunk loop's inputs and results pass through
``lax.optimization_barrier``, every chunk runs under the same ``lax.cond`` on every layout, and
the per-sample code multiplies by reciprocals it forms instead of dividing by broadcast scalars.

Derivatives are formed the same way (a ``jax.custom_vjp``): the VJP of every chunk, gathered
and added in chunk order, so a gradient does not depend on the layout either.  Forward-mode
slopes (the Newton steps of a calibration) are per-chunk ``jax.jvp`` results added the same way.

The devices are a ``jax.sharding.Mesh`` with one axis; ``devices=None`` means ``jax.devices()``,
every device of every process.  With one device nothing is mapped: the same per-device function
runs directly.  Everything else (the solver's iterations, the proposal, the Gram matrix) is
replicated: every device computes it from the same replicated inputs.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: The mesh axis the samples are spread over.
AXIS = "samples"
#: Fold operations of :func:`fold`.
ADD, MAX = "add", "max"


def device_tuple(devices=None) -> tuple:
    """``devices`` as a tuple (default ``jax.devices()``: every device of every process)."""
    devs = tuple(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("devices must not be empty")
    return devs


@functools.lru_cache(maxsize=32)
def mesh_of(devices: tuple):
    """A one-axis mesh (axis :data:`AXIS`) over ``devices``."""
    from jax.sharding import Mesh

    return Mesh(np.array(devices, dtype=object), (AXIS,))


class Layout(NamedTuple):
    """How a sum's chunks are laid out over devices (static).

    ``rows``: samples per chunk of materialised arrays (their leading axis holds
    ``len(devices) * per_device * rows`` samples, device ``d``'s block first); 0 when every chunk
    draws its own samples.
    """

    devices: tuple
    num_chunks: int
    rows: int = 0

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def per_device(self) -> int:
        return -(-self.num_chunks // len(self.devices))

    @property
    def padded_rows(self) -> int:
        """Rows of a materialised array: every device's chunks, the last ones past the sample."""
        return self.num_devices * self.per_device * self.rows


def fold(parts, ops):
    """Sequential fold over the leading axis of every leaf of ``parts`` (``ops``: a matching
    pytree of :data:`ADD` / :data:`MAX`, or one of them for every leaf), starting from zeros:
    ``((0 + p_0) + p_1) + ...``, the order of a single device's loop."""
    if isinstance(ops, str):
        ops = jax.tree_util.tree_map(lambda _: ops, parts)
    init = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape[1:], p.dtype), parts)

    def combine(op, a, b):
        return jnp.maximum(a, b) if op == MAX else a + b

    def body(carry, x):
        return jax.tree_util.tree_map(combine, ops, carry, x), None

    out, _ = jax.lax.scan(body, init, parts)
    return out


def _shard_spec():
    from jax.sharding import PartitionSpec as P

    return P(AXIS)


def run(layout: Layout, per_chunk: Callable, rep, shard, ops):
    """Fold over chunks ``c`` of ``per_chunk(c, rep, shard_c)`` in chunk order (see the module
    docstring).  ``rep``: replicated inputs; ``shard``: materialised arrays laid out by
    ``layout`` (``shard_c`` their ``rows`` rows of chunk ``c``; ``()`` when the chunks draw their
    own samples).  The result is replicated."""
    cpd, rows = layout.per_device, layout.rows

    def chunk(c, rep_, part):
        # Chunks past the last one (the last devices' spare slots) contribute zeros, added after
        # every real chunk: they change no sum.  The guard is there on every layout, one device
        # included, so that every chunk is compiled in the same context (XLA's rewrites of an
        # expression can depend on what surrounds it).
        shapes = jax.eval_shape(per_chunk, c, rep_, part)
        return jax.lax.cond(c < layout.num_chunks, lambda: per_chunk(c, rep_, part),
                            lambda: jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))

    def local(rep_, shard_, d):
        # XLA's algebraic simplifier rewrites expressions across operations (exp(a) exp(b) into
        # exp(a + b), a / exp(b) into a exp(-b), ...), and whether a rule fires can depend on
        # the surrounding program (one device or several).  The barrier keeps the chunks'
        # arithmetic apart from whatever computed their inputs.
        rep_ = jax.lax.optimization_barrier(rep_)

        def body(_, j):
            part = (jax.tree_util.tree_map(lambda x: jax.lax.dynamic_slice_in_dim(x, j * rows, rows), shard_)
                    if rows else shard_)
            return None, chunk(d * cpd + j, rep_, part)

        return jax.lax.scan(body, None, jnp.arange(cpd, dtype=jnp.int32))[1]

    if layout.num_devices == 1:
        return jax.lax.optimization_barrier(fold(local(rep, shard, jnp.int32(0)), ops))
    from jax.sharding import PartitionSpec as P

    def mapped(rep_, shard_):
        parts = local(rep_, shard_, jax.lax.axis_index(AXIS))
        parts = jax.tree_util.tree_map(lambda p: jax.lax.all_gather(p, AXIS, tiled=True), parts)
        return fold(parts, ops)

    return jax.lax.optimization_barrier(
        jax.shard_map(mapped, mesh=mesh_of(layout.devices), in_specs=(P(), _shard_spec()), out_specs=P(),
                      check_vma=False)(rep, shard))


def per_device(layout: Layout, fn: Callable, rep, shard=()):
    """``fn(first_sample, count, rep, shard_local)`` on every device, its outputs laid out as
    ``layout``'s materialised arrays: device ``d`` covers samples ``first_sample = d per_device rows``
    to ``first_sample + count`` (``count = per_device rows``)."""
    count = layout.per_device * layout.rows
    if layout.num_devices == 1:
        return fn(jnp.int32(0), count, rep, shard)
    from jax.sharding import PartitionSpec as P

    def mapped(rep_, shard_):
        return fn(jax.lax.axis_index(AXIS) * count, count, rep_, shard_)

    return jax.shard_map(mapped, mesh=mesh_of(layout.devices), in_specs=(P(), _shard_spec()),
                         out_specs=_shard_spec(), check_vma=False)(rep, shard)


def sample_range(draw_block: Callable, block_size: int, first_sample, count: int, aligned: bool):
    """Samples ``first_sample .. first_sample + count - 1`` of a blocked stream: the blocks that
    hold them (``draw_block(j)``, a pytree of ``(block_size, ...)`` arrays, vmapped over ``j``),
    concatenated and sliced.  ``aligned``: ``first_sample`` is a multiple of ``block_size``."""
    first_block = first_sample // block_size
    blocks = -(-count // block_size) + (0 if aligned else 1)
    drawn = jax.vmap(draw_block)(first_block + jnp.arange(blocks, dtype=jnp.int32))
    drawn = jax.tree_util.tree_map(lambda x: x.reshape((blocks * block_size,) + x.shape[2:]), drawn)
    if aligned:
        return jax.tree_util.tree_map(lambda x: x[:count], drawn)
    offset = first_sample - first_block * block_size
    return jax.tree_util.tree_map(lambda x: jax.lax.dynamic_slice_in_dim(x, offset, count), drawn)


def _zero_cotangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def total(layout: Layout, per_chunk: Callable, diff, const, shard):
    """The sum over chunks of ``per_chunk(c, diff, const, shard_c, differentiable)`` (with
    ``differentiable=False``), differentiable in ``diff`` through a custom VJP that adds the
    chunks' VJPs (``per_chunk(..., differentiable=True)``) in chunk order.  ``const`` and
    ``shard`` get zero cotangents."""
    return run(layout, lambda c, r, s: per_chunk(c, r[0], r[1], s, False), (diff, const), shard, ADD)


def _total_fwd(layout, per_chunk, diff, const, shard):
    return total(layout, per_chunk, diff, const, shard), (diff, const, shard)


def _total_bwd(layout, per_chunk, residuals, cotangent):
    diff, const, shard = residuals
    # Run in float64 whatever the caller's scope (the backward pass runs after the public
    # function's float64 scope has exited; see dpjax._base.x64).
    with jax.enable_x64(True):
        def chunk_vjp(c, r, s):
            d, k, ct = r
            _, vjp = jax.vjp(lambda x: per_chunk(c, x, k, s, True), d)
            return vjp(ct)[0]

        diff_bar = run(layout, chunk_vjp, (diff, const, cotangent), shard, ADD)
    return (diff_bar, jax.tree_util.tree_map(_zero_cotangent, const),
            jax.tree_util.tree_map(_zero_cotangent, shard))


total.defvjp(_total_fwd, _total_bwd)


def total_and_slope(layout: Layout, per_chunk: Callable, diff, const, shard):
    """``(total, d total / d diff[0])``: the sum of :func:`total` and its derivative along the first
    leaf of ``diff`` (a scalar, the noise multiplier), each chunk's by ``jax.jvp``, added in chunk
    order.  No autodiff runs through it."""
    def chunk(c, r, s):
        d, k = r
        return jax.jvp(lambda x: per_chunk(c, (x,) + tuple(d[1:]), k, s, False), (d[0],), (jnp.ones_like(d[0]),))

    return run(layout, chunk, (tuple(diff), const), shard, ADD)
