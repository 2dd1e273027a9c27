"""Array namespaces: numerics written once, run in NumPy on the host or as JAX programs.

dpjax's accounting numerics (the PLD program, :mod:`dpjax.pld.grid.program`; random allocation,
:mod:`dpjax.pld.allocation.lattice`) are written against an :class:`Ops` value instead of ``jax.numpy``
directly.  :data:`NUMPY` runs them eagerly on the host with NumPy and SciPy (imported on first use): no
compilation, so a
one-shot query costs what its arithmetic costs.  :func:`jax_ops` runs the same code in JAX:
jittable, vmappable, differentiable, on any device.  The two give the same numbers up to the
last bits of the elementary functions (SciPy's and XLA's ``erfc``, ``exp``, ``log`` differ by an
ulp or so; the accounting's round-off allowances cover both).

Only what the numerics need is here: the ``xp`` module for ordinary array functions, and the
few operations whose spelling differs between the backends (functional index updates, loops,
conditionals, materialization, special functions, blocked suffix sums).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["Ops", "NUMPY", "jax_ops", "is_jax", "host_tree_flatten", "tree_flatten", "tree_unflatten", "tree_map"]


class Ops:
    """The array operations of one backend (see :data:`NUMPY`, :func:`jax_ops`).

    Attributes:
      name: ``"numpy"`` or ``"jax"``.
      xp: the array module (``numpy`` or ``jax.numpy``).
      erfc, gammaln: special functions (elementwise, float64).
      scatter_add(n, idx, vals): a length-``n`` array with ``vals`` summed at ``idx`` (out of
        range dropped).
      stop: ``stop_gradient`` (identity in NumPy).
      materialize(fn, ok=True): ``fn()`` computed into buffers (JAX: a ``lax.cond`` whose
        outputs XLA cannot fuse into their consumers; NaN where ``ok`` is False).
      take_along_axis: as ``numpy.take_along_axis``.
      suffix_sum(a): ``s_j = sum_{t >= j} a_t`` along the last axis, blocked (:func:`_np_suffix`).
      suffix_small(a): the same for short arrays (block totals): in JAX, triangular
        multiply-reduces (cheap to compile) instead of dots.
      fori_loop(lo, hi, body, init): ``lax.fori_loop`` (a Python loop in NumPy).
      scan(f, init, xs): ``lax.scan`` without stacked outputs (returns the final carry).
      map(f, xs): ``lax.map``: ``f`` of every leading-axis slice of ``xs``, outputs stacked.
      cond(pred, true_fn, false_fn): ``lax.cond`` (a Python ``if`` on the concrete ``pred`` in NumPy).
      set_at(a, idx, v) / add_at(a, idx, v): functional ``a[idx] = v`` / ``a[idx] += v``.
      dynamic_slice(a, start, size): ``a[..., start:start + size]`` (``start`` traced in JAX).
      dot(a, b), matmul(a, b): matrix products at full float64 precision.
    """

    def __init__(self, name: str, xp, **fns: Callable):
        self.name = name
        self.xp = xp
        for k, v in fns.items():
            setattr(self, k, v)

    def __repr__(self):
        return f"Ops({self.name})"


def is_jax(ops: Ops) -> bool:
    return ops.name == "jax"


#: Block length of the blocked suffix sums (as :func:`dpjax.pld.grid.convert.suffix_sums`).
_SUFFIX_BLOCK = 64


def _np_suffix(a):
    """Suffix sums along the last axis in blocks of 64: within each block (a cumulative sum of at
    most 64 terms), plus the suffix sums of the block totals (recursively).  Every ``s_j`` sums
    only terms ``t >= j``; for non-negative terms the rounding error is below ``(64 + depth) u
    s_j`` (a sequential sum of ``n`` terms would allow ``n u s_j``, far more than the accounting's
    round-off allowance for long windows)."""
    a = np.asarray(a, np.float64)
    n = a.shape[-1]
    if n <= _SUFFIX_BLOCK:
        return np.cumsum(a[..., ::-1], axis=-1)[..., ::-1]
    nb = -(-n // _SUFFIX_BLOCK)
    pad = nb * _SUFFIX_BLOCK - n
    ab = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,))], axis=-1) if pad else a
    ab = ab.reshape(a.shape[:-1] + (nb, _SUFFIX_BLOCK))
    within = np.cumsum(ab[..., ::-1], axis=-1)[..., ::-1]
    after = _np_suffix(within[..., 0])
    after = np.concatenate([after[..., 1:], np.zeros(after.shape[:-1] + (1,))], axis=-1)
    return (within + after[..., None]).reshape(a.shape[:-1] + (nb * _SUFFIX_BLOCK,))[..., :n]


def _scipy_special():
    import scipy.special  # on first use: importing it costs ~0.12 s, more than most queries

    return scipy.special


def _make_numpy() -> Ops:
    def erfc(x):
        return _scipy_special().erfc(x)

    def gammaln(x):
        return _scipy_special().gammaln(x)

    def scatter_add(n, idx, vals):
        idx = np.asarray(idx).reshape(-1)
        vals = np.asarray(vals, np.float64).reshape(-1)
        keep = (idx >= 0) & (idx < n)
        return np.bincount(idx[keep], weights=vals[keep], minlength=n)[:n]

    def fori_loop(lo, hi, body, init, stop=None):
        state = init
        for i in range(int(lo), int(hi)):
            state = body(i, state)
            if stop is not None and stop(state):
                break
        return state

    def scan(f, init, xs):
        leaves = [x for x in _tree_leaves(xs)]
        length = leaves[0].shape[0] if leaves else 0
        carry = init
        for i in range(length):
            carry, _ = f(carry, _tree_map(lambda x: x[i], xs))
        return carry

    def map_(f, xs):
        leaves = [x for x in _tree_leaves(xs)]
        outs = [f(_tree_map(lambda x: x[i], xs)) for i in range(leaves[0].shape[0])]
        return _stack_trees(outs)

    def cond(pred, true_fn, false_fn):
        return true_fn() if bool(np.asarray(pred)) else false_fn()

    def set_at(a, idx, v):
        out = np.array(a, copy=True)
        out[idx] = v
        return out

    def add_at(a, idx, v):
        out = np.array(a, copy=True)
        out[idx] += v
        return out

    def dynamic_slice(a, start, size):
        start = int(start)
        return a[..., start:start + size]

    return Ops("numpy", np, erfc=erfc, gammaln=gammaln, scatter_add=scatter_add, stop=lambda x: x,
               materialize=lambda fn, ok=True: fn(), take_along_axis=np.take_along_axis, suffix_sum=_np_suffix,
               suffix_small=_np_suffix,
               fori_loop=fori_loop, scan=scan, map=map_, cond=cond, set_at=set_at, add_at=add_at,
               dynamic_slice=dynamic_slice, dot=np.dot, matmul=np.matmul)


class _HostTreeDef:
    """The structure of a tree flattened by :func:`tree_flatten` before JAX was imported."""

    __slots__ = ("kind", "meta", "children")

    def __init__(self, kind, meta, children):
        self.kind, self.meta, self.children = kind, meta, children

    def node_data(self):
        """As JAX's ``PyTreeDef.node_data``: ``(class, static fields)`` of a dataclass node."""
        if self.kind == "dataclass":
            return self.meta[0], self.meta[2]
        return self.kind, self.meta

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        kids = ", ".join(map(repr, self.children))
        if self.kind == "dataclass":
            cls, _, static = self.meta
            return f"{cls.__module__}.{cls.__qualname__}{dict(static)}[{kids}]"
        if self.kind == "namedtuple":
            return f"{self.meta.__qualname__}({kids})"
        if self.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.meta, self.children)) + "}"
        return ("[%s]" if self.kind is list else "(%s,)") % kids

    def _key(self):
        return (self.kind, self.meta, self.children)

    def __eq__(self, other):
        return isinstance(other, _HostTreeDef) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


def _data_fields(cls) -> tuple[list, list]:
    import dataclasses

    fields = dataclasses.fields(cls)
    return ([f.name for f in fields if not f.metadata.get("static", False)],
            [f.name for f in fields if f.metadata.get("static", False)])


def _host_flatten(x, leaves: list) -> _HostTreeDef:
    from dpjax._base import PYTREE_DATACLASSES

    if x is None:
        return _HostTreeDef("none", None, ())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return _HostTreeDef("namedtuple", type(x), tuple(_host_flatten(v, leaves) for v in x))
    if type(x) in (tuple, list):
        return _HostTreeDef(type(x), None, tuple(_host_flatten(v, leaves) for v in x))
    if type(x) is dict:
        keys = tuple(sorted(x))
        return _HostTreeDef("dict", keys, tuple(_host_flatten(x[k], leaves) for k in keys))
    if type(x) in PYTREE_DATACLASSES:
        data, static = _data_fields(type(x))
        return _HostTreeDef("dataclass", (type(x), tuple(data), tuple((k, getattr(x, k)) for k in static)),
                            tuple(_host_flatten(getattr(x, k), leaves) for k in data))
    leaves.append(x)
    return _HostTreeDef("leaf", None, ())


def _host_unflatten(td: _HostTreeDef, it):
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    kids = [_host_unflatten(c, it) for c in td.children]
    if td.kind == "namedtuple":
        return td.meta(*kids)
    if td.kind in (tuple, list):
        return td.kind(kids)
    if td.kind == "dict":
        return dict(zip(td.meta, kids))
    cls, data, static = td.meta
    return cls(**dict(zip(data, kids)), **dict(static))


def host_tree_flatten(x):
    """``(leaves, structure)`` flattened as JAX does, always on the host, whether or not JAX is
    imported: a structure whose ``repr`` names each node's class and static fields, the same in
    every process (a key for programs and stored plans)."""
    leaves: list = []
    return leaves, _host_flatten(x, leaves)


def tree_flatten(x):
    """``jax.tree_util.tree_flatten``; before JAX is imported, the same flattening on the host
    (tuples, lists, dicts, named tuples, None and dpjax's registered dataclasses), so the host
    program never imports JAX."""
    from dpjax._base import jax_loaded

    if jax_loaded():
        import jax

        return jax.tree_util.tree_flatten(x)
    return host_tree_flatten(x)


def tree_unflatten(treedef, leaves):
    """The inverse of :func:`tree_flatten` (either kind of tree structure)."""
    if isinstance(treedef, _HostTreeDef):
        return _host_unflatten(treedef, iter(leaves))
    import jax

    return jax.tree_util.tree_unflatten(treedef, leaves)


def tree_map(f, x):
    """``jax.tree_util.tree_map`` over one tree (host flattening before JAX is imported)."""
    leaves, treedef = tree_flatten(x)
    return tree_unflatten(treedef, [f(leaf) for leaf in leaves])


def _tree_leaves(x) -> list:
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _tree_leaves(item)]
    if isinstance(x, dict):
        return [leaf for k in sorted(x) for leaf in _tree_leaves(x[k])]
    if hasattr(x, "__dataclass_fields__"):
        return tree_flatten(x)[0]
    return [x]


def _stack_trees(trees: list):
    """Leaf-wise ``np.stack`` of trees of one structure (tuples, lists, dicts, arrays)."""
    first = trees[0]
    if isinstance(first, (tuple, list)):
        return type(first)(_stack_trees([t[i] for t in trees]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _stack_trees([t[k] for t in trees]) for k in first}
    return np.stack(trees)


def _tree_map(f, x):
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_tree_map(f, v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_tree_map(f, v) for v in x)
    if isinstance(x, dict):
        return {k: _tree_map(f, v) for k, v in x.items()}
    if hasattr(x, "__dataclass_fields__"):
        return tree_map(f, x)
    return f(x)


def _make_jax() -> Ops:
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import gammaln

    def scatter_add(n, idx, vals):
        return jnp.zeros(n, jnp.float64).at[idx.reshape(-1)].add(vals.reshape(-1), mode="drop")

    def materialize(fn, ok=True):
        # Without a buffer XLA fuses (duplicates) a large expansion (erfc) into every consumer:
        # ~10x the run time and a larger program to compile.  optimization_barrier does not
        # prevent this on CPU (it is expanded away before fusion); a cond's output is always
        # materialized.  The other branch (``ok`` False) makes every result NaN, which the
        # accounting turns into epsilon = inf (sound).
        return jax.lax.cond(jnp.asarray(ok), fn, lambda: jax.tree_util.tree_map(
            lambda v: jnp.full(v.shape, jnp.nan, v.dtype), jax.eval_shape(fn)))

    def suffix_sum(a):
        """:func:`_np_suffix` as blocked triangular matrix products along the last axis (XLA:CPU
        lowers ``cumsum`` to an associative scan that compiles slowly; these dots compile fast)."""
        n = a.shape[-1]
        b = _SUFFIX_BLOCK
        if n <= b:
            tri = jnp.tril(jnp.ones((n, n), a.dtype))          # tri[i, j] = 1 for i >= j
            return jnp.dot(a, tri, precision=jax.lax.Precision.HIGHEST)
        nb = -(-n // b)
        ab = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, nb * b - n)]).reshape(a.shape[:-1] + (nb, b))
        within = jnp.dot(ab, jnp.tril(jnp.ones((b, b), a.dtype)), precision=jax.lax.Precision.HIGHEST)
        after = suffix_sum(within[..., 0])
        after = jnp.concatenate([after[..., 1:], jnp.zeros(after.shape[:-1] + (1,), a.dtype)], axis=-1)
        return (within + after[..., None]).reshape(a.shape[:-1] + (nb * b,))[..., :n]

    def suffix_small(x):
        """Suffix sums of a short last axis as triangular multiply-reduces (the mask from iotas,
        not a constant: large constants slow XLA's compile); lengths above 32 that it divides
        in two levels (inside chunks of 32, plus the chunk totals'): relative error below
        ``(32 + k / 32) u`` for non-negative terms."""
        k = x.shape[-1]
        c = 32
        if k > c and k % c == 0:
            xb = x.reshape(x.shape[:-1] + (k // c, c))
            within = suffix_small(xb)
            after = suffix_small(within[..., 0])
            after = jnp.concatenate([after[..., 1:], jnp.zeros(after.shape[:-1] + (1,), x.dtype)], axis=-1)
            return (within + after[..., None]).reshape(x.shape)
        i = jax.lax.iota(jnp.int32, k)
        return jnp.sum(jnp.where(i[None, :] >= i[:, None], x[..., None, :], 0.0), axis=-1)

    def fori_loop(lo, hi, body, init, stop=None):
        return jax.lax.fori_loop(lo, hi, body, init)

    def scan(f, init, xs):
        return jax.lax.scan(f, init, xs)[0]

    def dynamic_slice(a, start, size):
        return jax.lax.dynamic_slice_in_dim(a, start, size, axis=a.ndim - 1)

    def dot(a, b):
        return jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)

    def matmul(a, b):
        return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)

    return Ops("jax", jnp, erfc=jax.lax.erfc, gammaln=gammaln, scatter_add=scatter_add,
               stop=jax.lax.stop_gradient, materialize=materialize, take_along_axis=jnp.take_along_axis,
               suffix_sum=suffix_sum, suffix_small=suffix_small, fori_loop=fori_loop, scan=scan, map=jax.lax.map,
               cond=jax.lax.cond,
               set_at=lambda a, idx, v: a.at[idx].set(v), add_at=lambda a, idx, v: a.at[idx].add(v),
               dynamic_slice=dynamic_slice, dot=dot, matmul=matmul)


NUMPY: Ops = _make_numpy()

_JAX: list[Any] = []


def jax_ops() -> Ops:
    """:class:`Ops` of ``jax.numpy`` (built on first use: importing this module stays cheap)."""
    if not _JAX:
        _JAX.append(_make_jax())
    return _JAX[0]
