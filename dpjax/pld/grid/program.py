"""The PLD program: a composition's grid PMFs composed by FFT and read as epsilon or delta
(docs/design.md §2).  Every FFT accounting path of :mod:`dpjax.pld` runs it.

One configuration is a list of *groups* (mechanisms of one kind, stacked, each composed
``counts`` times) planned on one grid (:mod:`dpjax.pld.grid.plan`: spacing ``dx``, FFT length ``n``,
per-direction offsets, support lengths and Chernoff parameters).  The program computes, for
``R = kinds x directions`` rows at once (kind-major: every direction's pessimistic row, then every
direction's optimistic row):

1. **Discretize** each member on its support (:func:`_discretize`, the connect-the-dots split and
   the optimistic matching of :mod:`dpjax.pld.grid.discretize`), optionally exponentially tilted;
2. **compose** in Fourier space: the log-modulus and phase of the kept frequencies, the log-MGF
   at the Chernoff parameters, the ``+inf`` mass and the bound on the dropped frequencies
   (:mod:`dpjax.pld.grid.compose`);
3. **window** the inverse transform between the Chernoff quantiles (or, tilted, over the tail)
   and bound what wrapped around, with the per-bin FFT round-off allowance;
4. **convert** each row to epsilon at the target deltas, or to delta at the target epsilons
   (:mod:`dpjax.pld.grid.convert`).

It returns one packed float64 array ``(directions, kinds, targets + len(DIAGNOSTICS))``.

Written once against an array namespace (:mod:`dpjax._base.ops`): :func:`run_host` runs it in NumPy on
the host (one-shot queries: no compilation, so the first query costs what later ones cost), and
:func:`run_jit` runs a batch of configurations as a compiled JAX program whose static shape is a
small bucketed set (:class:`Spec`): the FFT length, the row layout, the number of targets, each
group's mechanism structure and capacities, the tilted mode.  Supports and kept frequencies are
data, so nearby configurations share one program; padding costs no work (loops run over the
actual support blocks and frequency blocks only).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
from typing import Any, NamedTuple

import numpy as np

from dpjax._base.ops import NUMPY, Ops, is_jax, jax_ops, tree_flatten, tree_map, tree_unflatten
from dpjax._base.x64 import reset_thread
from dpjax.pld.mechanisms import LossCDFs

__all__ = ["DIAGNOSTICS", "UNIT_ROUNDOFF", "FLUSH", "GridLayout", "Spec", "GroupSpec", "Inputs", "run_host", "run_jit",
           "run_host_counts", "host_curve_partials", "composed_rows", "inputs", "host_inputs", "jit_spec",
           "stack_inputs", "conversion_block", "SUPPORT_BLOCK", "FREQ_BLOCK", "DPSGD_QUERY_PROGRAMS"]

UNIT_ROUNDOFF = 2.0**-52
#: Values below this are flushed to 0 (denormals are ~100x slower on x86); the P-mass this can
#: remove is put on the ``+inf`` atom of the pessimistic PMF.
FLUSH = 1e-290
#: The packed diagnostics after each row's values (see :func:`run_host`).
DIAGNOSTICS = ("p_inf", "tail_above", "tail_below", "roundoff", "needed_width", "truncation", "noise_floor",
               "valid_from")
# Rounds of neighbour matching of the optimistic discretization.
_MATCH_ROUNDS = 3
# Block length of the log-MGF sums (the largest of these dividing the support array).
_MGF_BLOCKS = (64, 32, 16)
#: Grid points per block of the compiled program's discretization loop (the configuration's own
#: support decides how many blocks run) and the halo each block evaluates on both sides:
#: ``grid_pmf`` is local (a point's masses depend on the CDFs within 8 points of it).
SUPPORT_BLOCK = 1024
SUPPORT_HALO = 16
#: Frequencies per block of the compiled program's power and inverse loops (the configuration's
#: kept frequencies decide how many run).
FREQ_BLOCK = 512
#: XLA programs that any sequence of one-configuration DP-SGD queries compiles (epsilon, delta,
#: noise multiplier, arrays of them, eps(T) curves, group privacy, fixed batches, and their
#: derivatives under ``jax.grad``): none, since they all run this program on the host
#: (docs/design.md §2.5).  Sweeps and the fixed-grid functions compile it, one program per
#: static :class:`Spec`.
DPSGD_QUERY_PROGRAMS = 0


# ------------------------------------------------------------------------------------------
# Static and dynamic parts


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """The static structure of one group: its mechanism's tree (class and static fields), the
    number of stacked members ``G`` and the length ``M`` of its support arrays (the support
    itself is data, at most ``M``)."""

    treedef: Any
    members: int
    length: int


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything static about a program (hashable: one compiled program per distinct value).

    Attributes:
      n: FFT length.
      directions: the directions (``"remove"`` / ``"add"``).
      kinds: ``("up",)`` or ``("up", "down")``: pessimistic rows, optimistic rows.
      want: ``"eps"`` (targets are deltas) or ``"delta"`` (targets are epsilons).
      targets: number of targets per configuration.
      groups: one :class:`GroupSpec` per group.
      freq: capacity of the kept frequencies of a compiled batch program (the kept count is data
        there; 0: the kept count is ``kept``, static).
      kept: the kept frequencies where ``freq`` is 0.
      tilted: compose the exponentially tilted PMFs and window the tail (the tail pass of tiny
        deltas; see :func:`_window_tilted`).
      floor_free: one more column per row: its epsilon at :func:`floor_free_target` of the first
        target (upper rows; lower rows repeat their value).
    """

    n: int
    directions: tuple
    kinds: tuple
    want: str
    targets: int
    groups: tuple
    freq: int
    kept: int = 0
    tilted: bool = False
    floor_free: bool = False


class Inputs(NamedTuple):
    """The data of one configuration (a leading batch axis in :func:`run_jit`).

    Attributes:
      mechanisms: per group, the mechanism pytree with leaves of shape ``(G,)``.
      counts: per group, ``(G,)`` integers (0 for padding).
      offsets: per group, ``(G, D)`` integer grid offsets per direction.
      support: ``(groups,)`` support length per group (grid points, at most the group's ``M``).
      dx: grid spacing.
      lambdas: ``(D, L)`` Chernoff parameters (with ``tilted``: candidate ``theta > tilt``).
      log_tau: log of the tail level centring the window.
      targets: ``(targets,)`` deltas (``want="eps"``) or epsilons.
      nf: kept frequencies (``n // 2 + 1`` keeps all).
      tilt: ``(D,)`` tilt parameters (used when ``spec.tilted``).
      tilt_from: ``(D,)`` smallest epsilon the tilted curves serve.
      terms: number of stacked members with a positive count (the tilted untilt's error term).
    """

    mechanisms: tuple
    counts: tuple
    offsets: tuple
    support: Any
    dx: Any
    lambdas: Any
    log_tau: Any
    targets: Any
    nf: Any
    tilt: Any
    tilt_from: Any
    terms: Any


# ------------------------------------------------------------------------------------------
# Discretization (docs/design.md §2.1; dpjax.pld.grid.discretize)


def _bin_masses(xp, le, gt):
    """Masses of bins ``(y_j, y_{j+1}]`` from CDF and survival values (last axis)."""
    use_le = le[..., 1:] <= 0.5
    return xp.maximum(xp.where(use_le, le[..., 1:] - le[..., :-1], gt[..., :-1] - gt[..., 1:]), 0.0)


def _shift_right(xp, a):
    """``a`` shifted one place to the right along the last axis (0 in front)."""
    return xp.concatenate([xp.zeros(a.shape[:-1] + (1,)), a[..., :-1]], axis=-1)


def _shift_left(xp, a):
    return xp.concatenate([a[..., 1:], xp.zeros(a.shape[:-1] + (1,))], axis=-1)


def _grid_pmf(ops: Ops, c: LossCDFs, y, dx, kinds):
    """Rows ``(K D, m)`` of grid PMFs from the loss CDFs ``c`` (each ``(D, m)``) at the grid
    ``y`` (``(D, m)``): the pessimistic split for ``"up"``, the optimistic matching for
    ``"down"`` (:mod:`dpjax.pld.grid.discretize`), and the ``+inf`` mass ``(D,)`` of the pessimistic
    PMFs (the P-mass above the last point plus the flush allowance)."""
    xp = ops.xp
    m = y.shape[-1]
    if not is_jax(ops) and tuple(kinds) == ("up",):
        return _grid_pmf_up_host(c, y, dx)
    # Flush values below 1e-290 to 0 (denormal arithmetic is ~100x slower); the P-mass this can
    # remove (< 2 m 1e-290) is put on the +inf atom, so the pessimistic PMF stays an upper bound.
    c = LossCDFs(*(xp.where(v < FLUSH, 0.0, v) for v in c))
    p_bin = _bin_masses(xp, c.p_le, c.p_gt)
    q_bin = _bin_masses(xp, c.q_le, c.q_gt)
    # Split bin j: a at y_j, b at y_{j+1};  a = (q e^{y_{j+1}} - p) / (e^{dx} - 1), exponent capped.
    a = (q_bin * xp.exp(xp.minimum(y[..., 1:], 700.0)) - p_bin) / xp.expm1(dx)
    a = xp.clip(a, 0.0, p_bin)
    b = p_bin - a
    rows = []
    for kind in kinds:
        if kind == "up":
            pmf = xp.concatenate([a, xp.zeros(a.shape[:-1] + (1,))], axis=-1) + _shift_right(
                xp, xp.concatenate([b, xp.zeros(b.shape[:-1] + (1,))], axis=-1))
            first = xp.concatenate([c.p_le[..., :1], xp.zeros(c.p_le.shape[:-1] + (m - 1,))], axis=-1)
            rows.append(pmf + first)
        else:
            rows.append(_optimistic(ops, a, b, p_bin, c.p_gt[..., -1:], dx, m))
    return xp.concatenate(rows, axis=0), c.p_gt[..., -1] + 2 * m * FLUSH


def _grid_pmf_up_host(c: LossCDFs, y, dx):
    """:func:`_grid_pmf` of the pessimistic PMFs alone in NumPy, with fewer passes over the rows
    (temporaries reused in place, the shifted sum written into one output): the same operations
    on the same operands, so the same values bit for bit."""
    m = y.shape[-1]

    def flushed(v):
        return np.where(v < FLUSH, 0.0, v)

    def bins(le, gt):
        le, gt = flushed(le), flushed(gt)
        up = le[..., 1:] - le[..., :-1]
        down = gt[..., :-1] - gt[..., 1:]
        out = np.where(le[..., 1:] <= 0.5, up, down)
        return np.maximum(out, 0.0, out=out), le

    p_bin, p_le = bins(c.p_le, c.p_gt)
    q_bin, _ = bins(c.q_le, c.q_gt)
    a = np.minimum(y[..., 1:], 700.0)
    np.exp(a, out=a)
    np.multiply(q_bin, a, out=a)
    a -= p_bin
    a /= np.expm1(dx)
    np.clip(a, 0.0, p_bin, out=a)
    b = np.subtract(p_bin, a, out=q_bin)
    pmf = np.empty(y.shape)
    pmf[..., :m - 1] = a
    pmf[..., m - 1] = 0.0
    pmf[..., 1:] += b
    pmf[..., 0] += p_le[..., 0]
    p_gt_last = np.where(c.p_gt[..., -1] < FLUSH, 0.0, c.p_gt[..., -1])
    return pmf, p_gt_last + 2 * m * FLUSH


def _optimistic(ops: Ops, a, b, p_bin, p_above, dx, m):
    """The optimistic (dominated, rounded-down) PMF of :func:`dpjax.pld.grid.discretize.grid_pmf`:
    bin ``j``'s atom below ``y_{j+1}`` (deficit ``D_j``) and bin ``j+1``'s above it (excess
    ``E_{j+1}``) merge into an atom at exactly ``y_{j+1}`` in matched shares; the rest of each
    atom is rounded down; the P-mass above the last point is put at it."""
    xp = ops.xp
    D = a * xp.expm1(dx)                     # deficit of atom j below y_{j+1}
    E = b * -xp.expm1(-dx)                   # excess of atom j above y_j
    tiny = 1e-300

    def match(_, state):
        f, u = state                         # fraction not yet matched; fraction moved up
        Dr, Er = f * D, f * E
        s_up = xp.minimum(1.0, _shift_left(xp, Er) / xp.maximum(Dr, tiny))
        r_dn = xp.minimum(1.0, _shift_right(xp, Dr) / xp.maximum(Er, tiny))
        over = xp.maximum(s_up + r_dn, 1.0)
        s_up, r_dn = s_up / over, r_dn / over
        t = xp.minimum(s_up[..., :-1] * Dr[..., :-1], r_dn[..., 1:] * Er[..., 1:])
        up = xp.where(D[..., :-1] > tiny, t / xp.maximum(D[..., :-1], tiny), 0.0)
        dn = xp.where(E[..., 1:] > tiny, t / xp.maximum(E[..., 1:], tiny), 0.0)
        up_p = xp.concatenate([up, xp.zeros(up.shape[:-1] + (1,))], axis=-1)
        dn_p = xp.concatenate([xp.zeros(dn.shape[:-1] + (1,)), dn], axis=-1)
        return xp.maximum(f - up_p - dn_p, 0.0), u + up_p

    # (A loop rather than unrolled rounds: one copy of the round in a compiled program.)
    _, u = ops.fori_loop(0, _MATCH_ROUNDS, match, (xp.ones_like(D), xp.zeros_like(D)))
    u = xp.clip(u, 0.0, 1.0)
    z = xp.zeros(p_bin.shape[:-1] + (1,))
    pmf = xp.concatenate([p_bin * (1.0 - u), z], axis=-1) + xp.concatenate([z, p_bin * u], axis=-1)
    last = xp.concatenate([xp.zeros(p_bin.shape[:-1] + (m - 1,)), p_above], axis=-1)
    return pmf + last


def _cdfs(ops: Ops, mech, directions, y, o=None, dx=None, split=None):
    """The loss CDFs at ``y`` (``(D, L)``, row ``d`` in ``directions[d]``), materialized.  On the
    host, given the grid (offsets ``o``, spacing ``dx``), both directions of a mechanism with a
    shared lattice (:meth:`~dpjax.pld.mechanisms.PoissonSubsampledGaussian.loss_cdfs_lattice`:
    the add direction's points mirror into the remove direction's) come from one evaluation of
    about half the work."""
    xp = ops.xp
    if (o is not None and not is_jax(ops) and tuple(directions) == ("remove", "add")
            and hasattr(mech, "lattice_length")):
        m = y.shape[-1]
        length = mech.lattice_length(int(o[0]), int(o[1]), float(dx), m)
        # The lattice runs from the loss bound log(1 - q) to the grid: where the grid's losses
        # are far from it in units of dx (huge noise multipliers: ~1e11 points at sigma 1e8),
        # the two directions' own m points each are less work.
        if length is not None and length <= 2 * m:
            return mech.loss_cdfs_lattice(o, dx, m, length, ops, split=split)
    if hasattr(mech, "loss_cdfs_directions"):
        return ops.materialize(lambda: mech.loss_cdfs_directions(directions, y, ops))
    per = [ops.materialize(lambda d=d, yd=y[i]: mech.loss_cdfs(d, yd, ops)) for i, d in enumerate(directions)]
    return LossCDFs(*(xp.stack(v) for v in zip(*per)))


def _discretize(ops: Ops, mech, directions, o, dx, m: int, kinds, support=None):
    """``(rows (K D, m), grid losses (K D, m), +inf masses (D,))`` of one member at offsets
    ``o`` (``(D,)``) on ``m`` points.

    ``support`` (compiled program only, traced, ``<= m``): the member's own support; the PMFs
    equal those of ``m = support`` on ``[0, support)`` and are 0 beyond (see
    :func:`_held_cdfs` and :func:`_pmf_from_cdfs`, the two halves, which a compiled program runs
    as separate stages)."""
    xp = ops.xp
    K = len(kinds)
    if support is None:
        y = (o[:, None] + xp.arange(m)[None, :]) * dx
        # On the host outside a worker thread, the upper half of a lattice evaluation runs on the
        # direction thread (the same values: the lattice is pointwise).
        split = None if is_jax(ops) or getattr(_IN_WORKER, "active", False) or _usable_cpus() < 2 else _in_background
        pmf, p_inf = _grid_pmf(ops, _cdfs(ops, mech, directions, y, o, dx, split=split), y, dx, kinds)
        return pmf, xp.concatenate([y] * K, axis=0), p_inf
    pmf, p_inf = _pmf_from_cdfs(ops, _held_cdfs(ops, mech, directions, o, dx, m, support), o, dx, m, kinds,
                                support)
    y = (o[:, None] + xp.arange(m)[None, :]) * dx
    return pmf, xp.concatenate([y] * K, axis=0), p_inf


def _block(m: int) -> int:
    """Block length of the compiled discretization: the largest power of two dividing ``m`` up to
    :data:`SUPPORT_BLOCK`."""
    B = 1
    while 2 * B <= SUPPORT_BLOCK and m % (2 * B) == 0:
        B *= 2
    return B


def _two_phase(mech) -> bool:
    """Whether a mechanism (or its class) computes its loss CDFs in two halves,
    ``loss_points_directions`` (the outputs whose events give the CDFs: an inverse loss, the
    expensive half) and ``cdfs_at_points``, which a compiled program runs as separate stages."""
    return hasattr(mech, "loss_points_directions") and hasattr(mech, "cdfs_at_points")


def _held_blocks(ops: Ops, values, o, dx, m: int, support, width: int):
    """``values(yc, start)`` (``yc`` the ``(D, B)`` grid losses from point ``start``, held at the
    last support point ``support - 1`` beyond it) block by block (``B =`` :func:`_block`), up to
    one block past the support: as far as :func:`_pmf_from_cdfs` reads; ``(width, D, m + B)``."""
    import jax

    xp = ops.xp
    D = o.shape[0]
    support = xp.clip(support, 1, m)
    B = _block(m)
    last = support - 1

    def body(k, buf):
        j = k * B + xp.arange(B)
        yc = (o[:, None] + xp.minimum(j, last)[None, :]) * dx
        return jax.lax.dynamic_update_slice_in_dim(buf, values(yc, k * B), k * B, axis=2)

    return jax.lax.fori_loop(0, (support + B - 1) // B + 1, body, xp.zeros((width, D, m + B)))


def _held_points(ops: Ops, mech, directions, o, dx, m: int, support):
    """A two-phase mechanism's points (:func:`_two_phase`) at the held grid, ``(1, D, m + B)``."""
    return _held_blocks(ops, lambda yc, start: mech.loss_points_directions(directions, yc, ops)[None],
                        o, dx, m, support, 1)


def _held_cdfs(ops: Ops, mech, directions, o, dx, m: int, support, points=None):
    """The loss CDFs ``(4, D, m + B)`` (``p_le, p_gt, q_le, q_gt``) at the grid points ``j``,
    held at their value at the last support point ``support - 1`` beyond it (bins there carry
    no mass, so the matching of the last real bins is unchanged).  ``points``: a two-phase
    mechanism's :func:`_held_points` (else they are computed here)."""
    import jax

    B = _block(m)
    if _two_phase(mech):
        if points is None:
            points = _held_points(ops, mech, directions, o, dx, m, support)

        def values(yc, start):
            z = jax.lax.dynamic_slice_in_dim(points[0], start, B, axis=1)
            return ops.xp.stack(list(ops.materialize(lambda: mech.cdfs_at_points(directions, z, ops))))
    else:
        def values(yc, start):
            return ops.xp.stack(list(_cdfs(ops, mech, directions, yc)))
    return _held_blocks(ops, values, o, dx, m, support, 4)


def _pmf_from_cdfs(ops: Ops, held, o, dx, m: int, kinds, support):
    """``(rows (K D, m), +inf masses (D,))`` from :func:`_held_cdfs`: ``grid_pmf`` in
    ``ceil(support / B)`` blocks, each with a halo of :data:`SUPPORT_HALO` points (the matching
    of the optimistic rows looks a few bins either side).  ``grid_pmf``'s end terms belong to the
    support's ends: the P-mass below ``y_0`` (in the first block) and the optimistic PMF's P-mass
    above the last point (added at ``support - 1``)."""
    import jax

    xp = ops.xp
    D, K = held.shape[1], len(kinds)
    support = xp.clip(support, 1, m)
    B = _block(m)
    H = SUPPORT_HALO
    L = B + 2 * H
    last = support - 1
    held = xp.concatenate([held, xp.zeros(held.shape[:2] + (H,))], axis=2)  # room for the last halo

    def body(k, buf):
        s = xp.maximum(k * B - H, 0)
        j = s + xp.arange(L)
        y = (o[:, None] + j[None, :]) * dx
        c = LossCDFs(*jax.lax.dynamic_slice_in_dim(held, s, L, axis=2))
        rows, _ = _grid_pmf(ops, c, y, dx, kinds)
        # (The optimistic end term is added once below: the block's own is in its halo.)
        keep = jax.lax.dynamic_slice_in_dim(rows, k * B - s, B, axis=1)
        return jax.lax.dynamic_update_slice_in_dim(buf, keep, k * B, axis=1)

    pmf = jax.lax.fori_loop(0, (support + B - 1) // B, body, xp.zeros((K * D, m)))
    gt_last = jax.lax.dynamic_index_in_dim(held[1], last, axis=1, keepdims=False)
    gt_last = xp.where(gt_last < FLUSH, 0.0, gt_last)
    # A block's rows put their end terms at their window's first point (P-mass below it: kept
    # only by the first block, whose window starts at 0) and last point (the optimistic P-mass
    # above it: in the halo, never kept); the support's own optimistic end term goes here.
    # Beyond the support the held CDFs leave empty bins: those entries are 0.
    is_down = xp.asarray(np.repeat([kind == "down" for kind in kinds], D))
    pmf = pmf.at[:, last].add(xp.where(is_down, xp.concatenate([gt_last] * K), 0.0))
    return pmf, gt_last + 2 * support * FLUSH


# ------------------------------------------------------------------------------------------
# Log-MGF and Chernoff bounds (docs/design.md §2.4; dpjax.pld.grid.compose)


def log_mgf(ops: Ops, pmf, y, lambdas):
    """``K(lam) = log sum_i pmf_i e^{lam y_i}`` per row: ``pmf``, ``y`` ``(R, m)`` (``y`` a grid),
    ``lambdas`` ``(R, L)`` -> ``(R, L)``.

    Blocks of ``b = 64`` (or 32, 16) consecutive points share their exponentials ``e^{lam j dx}``
    (a matrix product), so only ``m / b`` exponentials per ``lam`` are taken; ``ref`` (the mean)
    keeps exponents in range.  Overflow gives ``K = inf`` (a trivial, sound bound), as does a
    ``lam`` whose shared exponentials would leave ``[e^-700, e^700]``; underflowing terms are
    covered by adding 1e-300 to the sum, so ``K`` never drops below the exact value beyond
    float64 rounding."""
    xp = ops.xp
    R, m = pmf.shape
    b = next((c for c in _MGF_BLOCKS if m % c == 0), None)
    if b is None:  # pad with empty points (they contribute nothing)
        pad = -m % 64
        dx_ = y[:, 1:2] - y[:, :1] if m > 1 else xp.zeros((R, 1))
        pmf = xp.concatenate([pmf, xp.zeros((R, pad))], axis=-1)
        y = xp.concatenate([y, y[:, -1:] + dx_ * xp.arange(1, pad + 1)[None, :]], axis=-1)
        m, b = m + pad, 64
    dx = y[:, 1] - y[:, 0] if m > 1 else xp.zeros(R)
    ref = xp.sum(pmf * y, axis=-1) / xp.maximum(xp.sum(pmf, axis=-1), 1e-300)          # (R,)
    inner_exp = lambdas[:, :, None] * (xp.arange(b)[None, :] * dx[:, None])[:, None, :]  # (R, L, b)
    inner_ok = xp.all(xp.abs(inner_exp) < 700.0, axis=-1)                                # (R, L)
    E = xp.exp(xp.minimum(inner_exp, 700.0))
    blocks = pmf.reshape(R, m // b, b)                                                  # (R, m/b, b)
    if is_jax(ops):
        S = ops.matmul(E, xp.swapaxes(blocks, 1, 2))                                   # (R, L, m/b)
    else:
        # NumPy's own loop, not BLAS: a multithreaded BLAS call (OpenBLAS threads this size) leaves
        # its threads spinning on the other cores for a while after it returns, where the host
        # program's direction thread runs.
        S = np.einsum("rlb,rkb->rlk", E, blocks)
    with np.errstate(over="ignore", invalid="ignore"):
        outer = xp.exp(lambdas[:, :, None] * (y[:, ::b] - ref[:, None])[:, None, :])    # (R, L, m/b)
        terms = xp.where(S > 0, S * outer, 0.0)
    s = xp.sum(terms, axis=-1) + 1e-300
    return xp.where(inner_ok, lambdas * ref[:, None] + xp.log(s), np.inf)


def chernoff_quantiles(xp, K, lam, log_tau):
    """``(l, h)`` per row: the Chernoff bounds put mass <= ``tau`` below ``l`` and above ``h``."""
    pos = lam > 0
    h = xp.min(xp.where(pos, (K - log_tau) / xp.where(pos, lam, 1.0), np.inf), axis=-1)
    lo = xp.max(xp.where(~pos, (K - log_tau) / xp.where(pos, 1.0, lam), -np.inf), axis=-1)
    return lo, h


def wrap_tails(xp, K, lam, w_lo, dx, n):
    """Chernoff bounds on the mass at or above the window top and at or below the bottom."""
    pos = lam > 0
    hi = ((w_lo + n) * dx)[:, None]
    lo = ((w_lo - 1) * dx)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        above = xp.min(xp.where(pos, K - lam * hi, np.inf), axis=-1)
        below = xp.min(xp.where(pos, np.inf, K - lam * lo), axis=-1)
        above = xp.where(xp.isnan(above), 1.0, xp.minimum(xp.exp(above), 1.0))
        below = xp.where(xp.isnan(below), 1.0, xp.minimum(xp.exp(below), 1.0))
    return above, below


# ------------------------------------------------------------------------------------------
# Composition


def _tile(xp, a, K):
    return xp.concatenate([a] * K, axis=0)


def _member_points(ops: Ops, inp: Inputs, spec: Spec):
    """Every two-phase member's held points (:func:`_held_points`; None for the other groups),
    per group ``(G, 1, D, M + B)``: the first stage of a compiled program with such a
    mechanism."""
    out = []
    for gi, gspec in enumerate(spec.groups):
        if not _two_phase(_mechanism_class(gspec)):
            out.append(None)
            continue

        def one(member, gi=gi, m=gspec.length):
            mech, o = member
            return _held_points(ops, mech, spec.directions, o, inp.dx, m, inp.support[gi])

        out.append(_over_members(ops, one, (inp.mechanisms[gi], inp.offsets[gi]), gspec.members))
    return tuple(out)


def _member_cdfs(ops: Ops, inp: Inputs, spec: Spec, points=None):
    """Every member's held loss CDFs (:func:`_held_cdfs`), per group ``(G, 4, D, M + B)``;
    ``points``: :func:`_member_points` (a previous stage), if any."""
    out = []
    for gi, gspec in enumerate(spec.groups):
        pts = None if points is None else points[gi]

        def one(member, gi=gi, m=gspec.length):
            mech, o = member[:2]
            return _held_cdfs(ops, mech, spec.directions, o, inp.dx, m, inp.support[gi],
                              member[2] if len(member) > 2 else None)

        members = (inp.mechanisms[gi], inp.offsets[gi]) + (() if pts is None else (pts,))
        out.append(_over_members(ops, one, members, gspec.members))
    return tuple(out)


def _mechanism_class(gspec: GroupSpec):
    """The mechanism class of a group (from its tree's node data; None when not a registered
    dataclass)."""
    data = gspec.treedef.node_data()
    return data[0] if isinstance(data, tuple) and data and isinstance(data[0], type) else None


def _member_pmfs(ops: Ops, inp: Inputs, spec: Spec, held):
    """Every member's rows and ``+inf`` masses from its held CDFs (``held``:
    :func:`_member_cdfs`), per group ``(pmf (G, R, M), p_inf (G, D))``: the second stage."""
    out = []
    for gi, gspec in enumerate(spec.groups):
        def one(member, gi=gi, m=gspec.length):
            o, h = member
            return _pmf_from_cdfs(ops, h, o, inp.dx, m, spec.kinds, inp.support[gi])

        out.append(_over_members(ops, one, (inp.offsets[gi], held[gi]), gspec.members))
    return tuple(out)


def _over_members(ops: Ops, fn, members, count: int):
    """``fn`` of every member (leading axis ``count``), outputs stacked."""
    if count == 1:
        out = fn(_index(members, 0))
        return tuple(v[None] for v in out) if isinstance(out, tuple) else out[None]
    return ops.map(fn, members)


def _compose(ops: Ops, inp: Inputs, spec: Spec, nf_len: int, members_pmf=None):
    """The accumulated log-modulus and phase of the first ``nf_len`` frequencies of every row
    (beyond the configuration's ``nf`` they are unused), log-MGFs, the ``+inf`` mass, the bound on
    the dropped frequencies and the total offset (see :mod:`dpjax.pld.grid.compose`).

    ``members_pmf``: the members' discretizations (:func:`_member_pmfs`, earlier stages of a
    compiled program); None discretizes each member inside the loop (one member's arrays
    alive at a time)."""
    xp = ops.xp
    D, K = len(spec.directions), len(spec.kinds)
    R = D * K
    n = spec.n
    half = n // 2 + 1
    dx = inp.dx
    lam_rows = _tile(xp, inp.lambdas, K)                                   # (R, L)
    tilt_rows = _tile(xp, inp.tilt, K)                                      # (R,)
    dynamic = spec.freq > 0
    carry = dict(logabs=xp.zeros((R, nf_len)), angle=xp.zeros((R, nf_len)), K=xp.zeros(lam_rows.shape),
                 log_fin=xp.zeros(D), log_hi=xp.zeros(R), offset=xp.zeros(D, np.int64), total=xp.zeros(()),
                 Kt=xp.zeros(R), rel_t=xp.zeros(R), absK=xp.zeros(R), bad=xp.zeros(R, bool))
    freq = xp.arange(half)

    for gi, gspec in enumerate(spec.groups):
        m = gspec.length

        def step(carry, member, m=m, gi=gi):
            mech, c_int, o = member[:3]
            if not is_jax(ops) and int(c_int) == 0:
                # A padding member (count 0, from bucketing the member count) adds exact zeros
                # to every accumulator: the host skips it.
                return carry, None
            c = xp.asarray(c_int).astype(np.float64)
            if members_pmf is None:
                pmf, y, p_inf_up = _discretize(ops, mech, spec.directions, o, dx, m, spec.kinds,
                                               inp.support[gi] if dynamic else None)
            else:
                pmf, p_inf_up = member[3:]
                y = _tile(xp, (o[:, None] + xp.arange(m)[None, :]) * dx, len(spec.kinds))
            K_acc = carry["K"] + xp.where(c > 0, c * log_mgf(ops, pmf, y, lam_rows), 0.0)
            Kt, rel_t, absK, bad = carry["Kt"], carry["rel_t"], carry["absK"], carry["bad"]

            if spec.tilted:
                # p~ = p e^{tilt y - K_k(tilt)} in log space (no overflow; empty bins stay 0).
                Kk = log_mgf(ops, pmf, y, tilt_rows[:, None])[:, 0]                    # (R,)
                bad_k = (c > 0) & ~xp.isfinite(Kk)
                Kk = xp.where(xp.isfinite(Kk), Kk, 0.0)
                logp = xp.log(xp.where(pmf > 0, pmf, 1.0))
                x = logp + tilt_rows[:, None] * y - Kk[:, None]
                bad_k = bad_k | ((c > 0) & xp.any(x > 700.0, axis=-1))
                pmf = xp.where(pmf > 0, xp.exp(xp.minimum(x, 700.0)), 0.0)
            else:
                Kk, bad_k = xp.zeros(R), xp.zeros(R, bool)
            live = c > 0
            Kt = Kt + xp.where(live, c * Kk, 0.0)
            # exp(x) with x carrying an absolute error ~u (|log p| + lam |y| + |K_k|): a relative
            # error of every tilted bin (|log p| <= 745 for float64).
            rel_t = rel_t + xp.where(live, c * (tilt_rows * xp.max(xp.abs(y), axis=-1) + xp.abs(Kk) + 750.0), 0.0)
            absK = absK + xp.where(live, c * xp.abs(Kk), 0.0)
            bad = bad | bad_k
            F = xp.fft.rfft(pmf, n, axis=-1)
            sq = xp.real(F) ** 2 + xp.imag(F) ** 2
            # Dropped frequencies only need a bound on |F^c|: the largest |F_k| among them, raised
            # to c (one max-reduction instead of a log and an exp per frequency).
            dropped = freq[None, :] >= inp.nf
            top = xp.max(xp.where(dropped, sq, 0.0), axis=-1)
            log_hi = xp.where(inp.nf < half, 0.5 * xp.log(xp.maximum(top, 1e-300)), 0.0)
            logabs, angle = _power(ops, carry["logabs"], carry["angle"], F, sq, c, inp.nf, nf_len, dynamic)
            log_fin = carry["log_fin"] + xp.where(live, c * xp.log1p(-p_inf_up), 0.0) if "up" in spec.kinds \
                else carry["log_fin"]
            # Only O mod n matters (circular index); reduce first so huge counts cannot overflow.
            off = xp.mod(carry["offset"] + xp.mod(xp.asarray(c_int), n) * xp.mod(o, n), n)
            return dict(logabs=logabs, angle=angle, K=K_acc, log_fin=log_fin,
                        log_hi=carry["log_hi"] + xp.where(live, c * log_hi, 0.0), offset=off,
                        total=carry["total"] + c, Kt=Kt, rel_t=rel_t, absK=absK, bad=bad), None

        members = (inp.mechanisms[gi], inp.counts[gi], inp.offsets[gi])
        if members_pmf is not None:
            members = members + tuple(members_pmf[gi])
        if gspec.members == 1:
            carry, _ = step(carry, _index(members, 0))
        else:
            carry = ops.scan(step, carry, members)
    return carry


def _index(tree, i):
    return tree_map(lambda a: a[i], tree)



def _power(ops: Ops, logabs, angle, F, sq, c, nf, nf_len: int, dynamic: bool):
    """Add ``c log|F|`` and ``c arg F`` on the kept frequencies (``< nf``): the first ``nf_len ==
    nf``, or (``dynamic``, a compiled batch program) a loop over the :data:`FREQ_BLOCK` blocks
    that hold kept frequencies."""
    xp = ops.xp
    if not dynamic:
        Fk = F[:, :nf_len]
        return (logabs + c * 0.5 * xp.log(xp.maximum(sq[:, :nf_len], 1e-300)),
                angle + c * xp.arctan2(xp.imag(Fk), xp.real(Fk)))
    import jax

    half = F.shape[-1]
    pad = nf_len - half
    if pad > 0:
        F = xp.concatenate([F, xp.zeros(F.shape[:-1] + (pad,), F.dtype)], axis=-1)
        sq = xp.concatenate([sq, xp.zeros(sq.shape[:-1] + (pad,))], axis=-1)

    def body(k, state):
        la, an = state
        s = k * FREQ_BLOCK
        Fb = jax.lax.dynamic_slice_in_dim(F, s, FREQ_BLOCK, axis=1)
        sqb = jax.lax.dynamic_slice_in_dim(sq, s, FREQ_BLOCK, axis=1)
        la_b = jax.lax.dynamic_slice_in_dim(la, s, FREQ_BLOCK, axis=1) + c * 0.5 * xp.log(xp.maximum(sqb, 1e-300))
        an_b = jax.lax.dynamic_slice_in_dim(an, s, FREQ_BLOCK, axis=1) + c * xp.arctan2(xp.imag(Fb), xp.real(Fb))
        return (jax.lax.dynamic_update_slice_in_dim(la, la_b, s, axis=1),
                jax.lax.dynamic_update_slice_in_dim(an, an_b, s, axis=1))

    return jax.lax.fori_loop(0, (nf + FREQ_BLOCK - 1) // FREQ_BLOCK, body, (logabs, angle))


def _spectrum(ops: Ops, logabs, angle, nf, half: int, dynamic: bool):
    """``(F, sum |F|)``: the composed transform on the kept frequencies (0 beyond) and the sum of
    its moduli there (``dynamic``: a loop over the blocks holding kept frequencies)."""
    xp = ops.xp
    if not dynamic:
        mag = xp.exp(logabs)
        F = mag * (xp.cos(angle) + 1j * xp.sin(angle))
        if F.shape[-1] < half:
            F = xp.concatenate([F, xp.zeros(F.shape[:-1] + (half - F.shape[-1],), F.dtype)], axis=-1)
        return F, xp.sum(mag, axis=-1)
    import jax

    R, cap = logabs.shape

    def body(k, state):
        buf, total = state
        s = k * FREQ_BLOCK
        la = jax.lax.dynamic_slice_in_dim(logabs, s, FREQ_BLOCK, axis=1)
        an = jax.lax.dynamic_slice_in_dim(angle, s, FREQ_BLOCK, axis=1)
        kept = (s + xp.arange(FREQ_BLOCK))[None, :] < nf
        mag = xp.where(kept, xp.exp(la), 0.0)
        Fb = mag * (xp.cos(an) + 1j * xp.sin(an))
        return jax.lax.dynamic_update_slice_in_dim(buf, Fb, s, axis=1), total + xp.sum(mag, axis=-1)

    F, total = jax.lax.fori_loop(0, (nf + FREQ_BLOCK - 1) // FREQ_BLOCK, body,
                                 (xp.zeros((R, max(cap, half)), np.complex128), xp.zeros(R)))
    return F[:, :half], total


# ------------------------------------------------------------------------------------------
# Windows (docs/design.md §2.2, §2.4)


def _rotate(ops: Ops, circ, start, n: int):
    """``window[t] = circ[(start + t) mod n]`` per row (``start`` ``(R,)``)."""
    xp = ops.xp
    if not is_jax(ops):
        return np.stack([np.roll(circ[i], -int(start[i])) for i in range(circ.shape[0])])
    import jax

    # One dynamic slice of the doubled array per row (rows unrolled: under vmap the slices would
    # become a gather of n indices).
    return xp.stack([jax.lax.dynamic_slice_in_dim(xp.concatenate([circ[i], circ[i]]), start[i], n)
                     for i in range(circ.shape[0])])


def _floor(xp, r, floor_prior, kinds, D: int):
    """The per-bin round-off allowance: every bin of an upper row may carry the largest negative
    excursion ``nu`` seen; a lower row loses ``max(nu, floor_prior)`` per bin (errors of the low
    frequencies spread over every bin as an offset of either sign; a positive offset is invisible
    in the negative bins).  Applied per bin, so only the bins above epsilon count.  Rows are
    kind-major (``D`` per kind)."""
    nu = xp.maximum(-xp.min(r, axis=-1), 0.0)
    rows, floors = [], []
    for ki, kind in enumerate(kinds):
        sl = slice(ki * D, (ki + 1) * D)
        if kind == "up":
            rows.append(xp.maximum(r[sl], 0.0) + nu[sl, None])
            floors.append(nu[sl])
        else:
            f = xp.maximum(nu[sl], floor_prior[sl])
            rows.append(xp.maximum(r[sl] - f[:, None], 0.0))
            floors.append(f)
    return xp.concatenate(rows, axis=0), xp.concatenate(floors)


def _window(ops: Ops, circ, K, lam, offset, log_tau, dx, n):
    """Ordinary windows: centred between the Chernoff quantiles; returns ``(r, w_lo, above,
    below, width)``."""
    xp = ops.xp
    lo, h = chernoff_quantiles(xp, K, lam, log_tau)
    centre = 0.5 * (h + lo)
    centre = xp.where(xp.isfinite(centre), centre, 0.0)
    w_lo = xp.floor(centre / dx).astype(np.int64) - n // 2
    r = _rotate(ops, circ, xp.mod(w_lo - offset, n), n)
    above, below = wrap_tails(xp, K, lam, w_lo, dx, n)
    return r, w_lo, above, below, h - lo


def _window_tilted(ops: Ops, circ, K, theta, offset, lam, y_v, log_tau, dx, n):
    """Tilted windows over the tilted distribution's upper part (see :mod:`dpjax.pld.grid.compose`):
    the top ``h`` is the smallest with ``exp(K(theta) - theta h + lam (h - y_v)) <= tau`` for some
    candidate ``theta > lam``; wrap-around from above is bounded that way (untilted on kept bins at
    or above ``y_v``), from below by ``e^{-lam n dx}``.  Returns ``(r, w_lo, above, below, width)``
    of the tilted domain (untilted later)."""
    xp = ops.xp
    ok = (theta > lam[:, None]) & xp.isfinite(K)
    with np.errstate(invalid="ignore", divide="ignore"):
        h = xp.min(xp.where(ok, (K - log_tau - lam[:, None] * y_v[:, None]) / xp.where(ok, theta - lam[:, None], 1.0),
                            np.inf), axis=-1)
    # (Capped so the index stays in int64; a capped top only makes tail_above larger.)
    h = xp.clip(xp.where(xp.isfinite(h), h, y_v + n * dx), y_v, y_v + 1e4)
    w_lo = xp.ceil(h / dx).astype(np.int64) - n
    r = _rotate(ops, circ, xp.mod(w_lo - offset, n), n)
    hi = (w_lo + n) * dx
    with np.errstate(invalid="ignore", over="ignore"):
        above = xp.min(xp.where(ok, K - theta * hi[:, None] + lam[:, None] * (hi - xp.minimum(y_v, hi))[:, None],
                                np.inf), axis=-1)
        above = xp.where(xp.isnan(above), 1.0, xp.minimum(xp.exp(above), 1.0))
    below = xp.minimum(xp.exp(-lam * n * dx), 1.0)
    return r, w_lo, above, below, hi - w_lo * dx


def _windows(ops: Ops, carry, inp: Inputs, spec: Spec, nf_len: int):
    """The composed rows back from the frequency domain, windowed, with their error terms:
    ``(r, w_lo, p_inf, above, below, roundoff, roundoff_rel, width, floor, valid_from)``."""
    xp = ops.xp
    n = spec.n
    D, K = len(spec.directions), len(spec.kinds)
    R = D * K
    half = n // 2 + 1
    dx = inp.dx
    nf = inp.nf
    F, mag_sum = _spectrum(ops, carry["logabs"], carry["angle"], nf, half, spec.freq > 0)
    # sum over the dropped k of prod_g |F_g(k)|^{c_g} <= (half - nf) prod_g max_k |F_g(k)|^{c_g}
    truncation = xp.where(nf < half, 2.0 * (half - nf) * xp.exp(carry["log_hi"]), 0.0)
    circ = xp.fft.irfft(F, n, axis=-1)
    roundoff_rel = xp.full(R, 8.0 * UNIT_ROUNDOFF) * (math.log2(n) + carry["total"])
    # A-priori per-bin error of the composed PMF from relative errors roundoff_rel of every kept
    # coefficient: (2/n) sum_k roundoff_rel |F_k| (inverse real FFT); only the lower rows use it.
    floor_prior = roundoff_rel * (2.0 / n) * mag_sum
    is_up = xp.asarray(np.repeat([k == "up" for k in spec.kinds], D))
    lam_rows = _tile(xp, inp.lambdas, K)
    offset = _tile(xp, carry["offset"], K)
    tilt_rows = _tile(xp, inp.tilt, K)
    y_v = _tile(xp, inp.tilt_from, K)

    def ordinary():
        r, w_lo, above, below, width = _window(ops, circ, carry["K"], lam_rows, offset, inp.log_tau, dx, n)
        r, floor = _floor(xp, r, floor_prior, spec.kinds, D)
        return (r, w_lo, above, below, truncation, roundoff_rel, width, floor, xp.full(R, -np.inf))

    def tilt_window():
        r, w_lo, above, below, width = _window_tilted(ops, circ, carry["K"], lam_rows, offset, tilt_rows, y_v,
                                                      inp.log_tau, dx, n)
        y = (w_lo[:, None] + xp.arange(n)[None, :]) * dx
        # Untilt factor e^{Kt - lam y}: bins where it would exceed e^600 are dropped; the curves
        # serve eps >= valid_from only (the bins below it are set to 0).
        log_s = carry["Kt"][:, None] - tilt_rows[:, None] * y
        with np.errstate(divide="ignore"):
            valid_from = xp.maximum(xp.maximum(w_lo * dx, (carry["Kt"] - 600.0) / tilt_rows), y_v)
        valid_from = xp.where(carry["bad"], np.inf, valid_from)
        s = xp.where((log_s <= 600.0) & (y >= valid_from[:, None]), xp.exp(xp.minimum(log_s, 600.0)), 0.0)
        # Per-bin noise floor in the tilted domain, then untilted with the bin: tiny in the tail.
        r, floor = _floor(xp, r, floor_prior, spec.kinds, D)
        r = r * s
        # exp(Kt - lam y): Kt = fl(sum_k c_k K_k) carries an absolute error <= terms u sum |c_k K_k|.
        rel_untilt = 2.0 * UNIT_ROUNDOFF * ((inp.terms + 1) * carry["absK"] + tilt_rows * xp.max(xp.abs(y), axis=-1)
                                            + 2.0)
        # Aliased mass from above is amplified by the untilt: the lower rows subtract it too.
        below = xp.where(is_up, below, xp.minimum(below + above, 1.0))
        rel = roundoff_rel + 2.0 * UNIT_ROUNDOFF * carry["rel_t"] + rel_untilt
        return (r, w_lo, above, below, xp.zeros(R), rel, width, floor, valid_from)

    out = tilt_window() if spec.tilted else ordinary()
    r, w_lo, above, below, roundoff, rel, width, floor, valid_from = out
    p_inf = xp.where(is_up, _tile(xp, -xp.expm1(carry["log_fin"]), K), 0.0)
    return r, w_lo, p_inf, above, below, roundoff, rel, width, floor, valid_from, truncation


# ------------------------------------------------------------------------------------------
# Conversion (docs/design.md §2.3; dpjax.pld.grid.convert)


def conversion_block(n: int) -> int:
    """Block length of the conversion: the power of two nearest above ``sqrt(n)`` dividing ``n``,
    so the suffix sums over block totals (``(n/b)^2`` terms compiled) and those inside the located
    block (``b^2`` per target) both stay near ``n``."""
    b = 1
    while b * b < n and n % (2 * b) == 0:
        b *= 2
    return b


def _weights(xp, dx, n: int, b: int):
    """``e^{y_ref - y_t} = e^{(n/2 - t) dx}`` as block starts times offsets within a block (``n/b
    + b`` exponentials instead of ``n``), and ``e^{y_{ib} - y_ref}`` at the block starts."""
    starts = (n // 2 - xp.arange(0, n, b)) * dx
    return xp.exp(starts)[:, None] * xp.exp(-xp.arange(b) * dx)[None, :], xp.exp(-starts)


def _epsilon_rows(ops: Ops, r, w_lo, dx, const, fa, fb, a_bad, delta, n: int):
    """Per row and target, the smallest ``eps >= 0`` with the row's ``delta(eps) <= delta``
    (``inf`` if none): ``r`` ``(R, n)``, ``w_lo``/``const``/``fa``/``fb``/``a_bad`` ``(R,)``,
    ``delta`` ``(R, K)`` -> ``(R, K)``.

    ``delta(eps) = fa sum_{t > j} r_t + const - e^{eps - y_ref} fb sum_{t > j} w_t`` on segment
    ``j`` (``w_t = r_t e^{y_ref - y_t}``).  ``delta(y_j)`` is evaluated at the first point of
    every block from the block totals' suffix sums, the last block whose start is above the
    target is located (:func:`_epsilon_locate`), and only its ``b`` suffix sums are formed; the
    segment is the one after the last grid point with ``delta(y_j) > delta`` (never below a full
    count where round-off makes the curve non-monotone), where the closed form ``y_ref + log((A
    - delta) / B)`` holds (:func:`_epsilon_solve`).  ``a_bad``: what a NaN coefficient becomes
    (``inf`` for upper rows, ``-inf`` for lower)."""
    loc = _epsilon_locate(ops, r, dx, const, fa, fb, delta, n)
    return _epsilon_solve(ops, loc, w_lo, dx, const, fa, fb, a_bad, delta, n)


def _epsilon_locate(ops: Ops, r, dx, const, fa, fb, delta, n: int) -> dict:
    """The first half of :func:`_epsilon_rows`: per row and target, the located block ``blk``
    (``-1``: none above the target), its points ``r_blk``/``w_blk`` ``(R, K, b)``, the suffix
    sums after it and the whole window's sums (small arrays: a compiled program's stage
    boundary)."""
    xp = ops.xp
    R = r.shape[0]
    b = conversion_block(n)
    nb = n // b
    wmat, start_weights = _weights(xp, dx, n, b)
    rb = r.reshape(R, nb, b)
    wb = rb * wmat
    s_r = ops.suffix_small(xp.sum(rb, axis=-1))                               # (R, nb)
    s_w = ops.suffix_small(xp.sum(wb, axis=-1))
    fa_, fb_, c_ = fa[:, None], fb[:, None], const[:, None]
    D_start = (s_r - rb[..., 0]) * fa_ + c_ - start_weights * (s_w - wb[..., 0]) * fb_
    blk = xp.max(xp.where(D_start[:, None, :] > delta[:, :, None], xp.arange(nb), -1), axis=-1)   # (R, K)
    at = xp.maximum(blk, 0)
    nxt = at + 1
    after = nxt < nb
    nxt = xp.minimum(nxt, nb - 1)
    return dict(blk=blk, r_blk=ops.take_along_axis(rb, at[:, :, None], axis=1),                # (R, K, b)
                w_blk=ops.take_along_axis(wb, at[:, :, None], axis=1),
                r_after=xp.where(after, ops.take_along_axis(s_r, nxt, axis=1), 0.0),           # (R, K)
                w_after=xp.where(after, ops.take_along_axis(s_w, nxt, axis=1), 0.0),
                r_all=s_r[:, :1], w_all=s_w[:, :1])                                            # (R, 1)


def _epsilon_solve(ops: Ops, loc: dict, w_lo, dx, const, fa, fb, a_bad, delta, n: int):
    """The second half of :func:`_epsilon_rows`: the segment inside the located block and its
    closed form."""
    xp = ops.xp
    b = conversion_block(n)
    blk = loc["blk"]
    any_above = blk >= 0
    blk = xp.maximum(blk, 0)
    incl = ops.suffix_small(xp.stack([loc["r_blk"], loc["w_blk"]]))             # (2, R, K, b)
    sums = xp.concatenate([incl[..., 1:], xp.zeros(incl.shape[:-1] + (1,))], axis=-1)   # terms t > j
    sr = sums[0] + loc["r_after"][..., None]
    sw = sums[1] + loc["w_after"][..., None]
    fa_, fb_, c_ = fa[:, None], fb[:, None], const[:, None]
    # The located block's coefficients at every point (K, b), and the whole window's (none above).
    A_blk, B_blk = sr * fa_[..., None] + c_[..., None], sw * fb_[..., None]
    A0, B0 = loc["r_all"] * fa_ + c_, loc["w_all"] * fb_                        # (R, 1)
    y_ref = ((w_lo + n // 2) * dx)[:, None]
    start = blk * b                                                            # (R, K)
    y_blk = ((w_lo[:, None] + start)[..., None] + np.arange(b)) * dx
    with np.errstate(over="ignore", invalid="ignore"):
        hit = (A_blk - xp.exp(y_blk - y_ref[..., None]) * B_blk) > delta[..., None]
    last = xp.maximum(xp.max(xp.where(hit, np.arange(b), -1), axis=-1), 0)      # (R, K)
    j = xp.where(any_above, start + last, -1)
    at_last = np.arange(b) == last[..., None]
    A = xp.where(any_above, xp.sum(xp.where(at_last, A_blk, 0.0), axis=-1), A0)
    B = xp.where(any_above, xp.sum(xp.where(at_last, B_blk, 0.0), axis=-1), B0)
    bad = xp.isnan(A) | xp.isnan(B)
    A = xp.where(bad, a_bad[:, None], A)
    B = xp.where(bad, 0.0, B)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (A - delta) / B
        eps = y_ref + xp.log(xp.where(ratio > 0, ratio, 1.0))
    w0 = w_lo[:, None]
    lo_end = xp.where(j >= 0, (w0 + j) * dx, -np.inf)
    hi_end = xp.where(j + 1 <= n - 1, (w0 + j + 1) * dx, np.inf)
    eps = xp.where((ratio > 0) & (B > 0), xp.clip(eps, lo_end, hi_end), hi_end)
    eps = xp.where(j >= n - 1, np.inf, eps)
    # A NaN / inf anywhere in the PMF or the constants: no bound (upper: inf, lower: 0).
    broken = ~(xp.isfinite(loc["r_all"]) & xp.isfinite(loc["w_all"]) & xp.isfinite(c_) & xp.isfinite(fa_))
    eps = xp.where(broken, xp.where(a_bad[:, None] > 0, np.inf, 0.0), eps)
    return xp.maximum(eps, 0.0)


def _delta_rows(ops: Ops, r, w_lo, dx, const, fa, fb, a_bad, eps, n: int):
    """Per row and target epsilon, ``delta(eps)`` (clipped to [0, 1]): the segment holding
    ``eps`` and its closed form ``A_j - e^{eps - y_ref} B_j`` (sums over ``t > j``); shapes as
    :func:`_epsilon_rows`."""
    xp = ops.xp
    R = r.shape[0]
    b = conversion_block(n)
    wmat, _ = _weights(xp, dx, n, b)
    w = (r.reshape(R, n // b, b) * wmat).reshape(R, n)
    zero = xp.zeros((R, 1))
    A = xp.concatenate([ops.suffix_sum(r), zero], axis=-1) * fa[:, None] + const[:, None]
    B = xp.concatenate([ops.suffix_sum(w), zero], axis=-1) * fb[:, None]
    bad = xp.isnan(A) | xp.isnan(B)
    A = xp.where(bad, a_bad[:, None], A)
    B = xp.where(bad, 0.0, B)
    y0 = (w_lo * dx)[:, None]
    y_ref = ((w_lo + n // 2) * dx)[:, None]
    j = xp.clip(xp.floor((eps - y0) / dx).astype(np.int64), -1, n - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        d = ops.take_along_axis(A, j + 1, axis=1) - xp.exp(xp.minimum(eps - y_ref, 700.0)) * \
            ops.take_along_axis(B, j + 1, axis=1)
    return xp.clip(d, 0.0, 1.0)


def floor_free_target(delta, floor, fa, n):
    """The target at which an upper row's epsilon is a lower bound on the epsilon it would give
    without its round-off allowance: ``delta + nu fa n``.

    The upper curve is ``delta_up(eps) = delta_0(eps) + F(eps)``: ``delta_0`` the same conversion
    of the clipped bins ``max(r, 0)``, ``F`` the per-bin allowance ``nu`` summed over the bins
    above ``eps`` with weights ``fa - e^{eps - y} fb`` in ``[0, fa]``, so ``0 <= F <= nu fa n``.
    Where ``delta_0`` meets ``delta``, at ``u0``, ``delta_up(u0) <= delta + nu fa n``;
    ``delta_up`` is non-increasing, so its epsilon at that target is at most ``u0``.  The row's
    answer minus that epsilon bounds what any smaller round-off floor (the accountant's tilted
    tail pass) could take off it on this grid."""
    return delta + floor * fa * n


# ------------------------------------------------------------------------------------------
# The program


def _program(ops: Ops, inp: Inputs, spec: Spec):
    nf_len = _kept(inp, spec)
    return _finish(ops, _compose(ops, inp, spec, nf_len), inp, spec, nf_len)


def _kept(inp: Inputs, spec: Spec) -> int:
    """Length of the frequency accumulators: the capacity of a compiled batch program (the kept
    count is data there), else the kept count itself (concrete)."""
    return spec.freq if spec.freq > 0 else int(min(spec.kept, spec.n // 2 + 1))


def _finish(ops: Ops, carry, inp: Inputs, spec: Spec, nf_len: int):
    """Windows and conversion of composed rows ``carry``: the packed ``(D, K, targets + 8)``."""
    return _convert(ops, _windows(ops, carry, inp, spec, nf_len), inp, spec)


def _convert(ops: Ops, windowed, inp: Inputs, spec: Spec):
    """The values at the targets and the diagnostics of windowed rows (:func:`_windows`), packed
    ``(D, K, targets + 8)``."""
    return _convert_finish(ops, _convert_locate(ops, windowed, inp, spec), inp, spec)


def _row_terms(ops: Ops, windowed, inp: Inputs, spec: Spec):
    """``(const, fa, fb, a_bad, targets)`` of the conversion of windowed rows: the added mass,
    the round-off factors, what a NaN becomes, and the targets ``(R, targets [+ 1])`` (with the
    floor-free target where the spec has that column)."""
    xp = ops.xp
    D = len(spec.directions)
    R = D * len(spec.kinds)
    _, _, p_inf, above, below, roundoff, rel, _, floor, _, _ = windowed
    is_up = xp.asarray(np.repeat([k == "up" for k in spec.kinds], D))
    const = xp.where(is_up, p_inf + above + roundoff, p_inf - below - roundoff)
    fa = xp.where(is_up, 1.0 + rel, 1.0 - rel)
    fb = xp.where(is_up, 1.0 - rel, 1.0 + rel)
    a_bad = xp.where(is_up, np.inf, -np.inf)
    targets = xp.broadcast_to(xp.asarray(inp.targets, np.float64).reshape(1, -1), (R, spec.targets))
    if spec.floor_free:
        targets = xp.concatenate([targets, floor_free_target(targets[:, :1], floor[:, None], fa[:, None], spec.n)],
                                 axis=1)
    return const, fa, fb, a_bad, targets


def _convert_locate(ops: Ops, windowed, inp: Inputs, spec: Spec):
    """First half of :func:`_convert`: ``(windowed rows without the PMFs, located blocks)`` for
    epsilon programs (:func:`_epsilon_locate`), ``(windowed rows without the PMFs, deltas)`` for
    delta programs (a compiled program's stage boundary: no ``(R, n)`` array crosses it)."""
    const, fa, fb, a_bad, targets = _row_terms(ops, windowed, inp, spec)
    r, w_lo = windowed[0], windowed[1]
    rest = (None,) + tuple(windowed[1:])
    if spec.want == "eps":
        return rest, _epsilon_locate(ops, r, inp.dx, const, fa, fb, targets, spec.n)
    return rest, _delta_rows(ops, r, w_lo, inp.dx, const, fa, fb, a_bad, targets, spec.n)


def _convert_finish(ops: Ops, located, inp: Inputs, spec: Spec):
    """Second half of :func:`_convert`: the epsilons from the located blocks, the packed rows."""
    xp = ops.xp
    D, K = len(spec.directions), len(spec.kinds)
    rest, found = located
    _, w_lo, p_inf, above, below, roundoff, rel, width, floor, valid_from, truncation = rest
    const, fa, fb, a_bad, targets = _row_terms(ops, rest, inp, spec)
    if spec.want == "eps":
        both = _epsilon_solve(ops, found, w_lo, inp.dx, const, fa, fb, a_bad, targets, spec.n)
    else:
        both = found
    is_up = xp.asarray(np.repeat([k == "up" for k in spec.kinds], D))
    diag = [p_inf, above, below, roundoff, width, truncation, floor, valid_from]
    if spec.floor_free:
        diag.append(xp.where(is_up, both[:, -1], both[:, 0]))
    rows = xp.concatenate([both[:, :spec.targets], xp.stack(diag, axis=1)], axis=1)
    return rows.reshape(K, D, -1).transpose(1, 0, 2)


def run_host(inp: Inputs, spec: Spec) -> np.ndarray:
    """The program of one configuration in NumPy (no compilation): ``(D, K, targets + 8)``.

    ``spec.groups[g].length`` must equal ``inp.support[g]`` here (the arrays are the support).
    One mechanism in two directions (DP-SGD): the loss CDFs of both directions are evaluated
    once (on their shared lattice), and each direction's rows are then composed, windowed and
    converted on their own thread (:func:`_by_direction`; the rows of one direction never
    depend on the other's, so the values are those of one joint run, bit for bit)."""
    if not _ALLOCATOR_TUNED:
        _tune_allocator()
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        if _splittable(spec):
            return _by_direction(inp, spec)
        return np.asarray(_program(NUMPY, inp, spec), np.float64)


#: Bytes of freed heap that glibc keeps mapped (``mallopt(M_TOP_PAD)``), set once on the first
#: host run.  A host program allocates and frees NumPy temporaries of a few MB; by default glibc
#: returns the freed top of its heap to the OS after each call and the next call faults the pages
#: back in: 2,000-3,500 page faults per DP-SGD query, a quarter of its time on 2 cores (measured
#: with ``resource.getrusage``).  Keeping 64 MiB mapped removes them (~800 faults per call
#: remain).  Process-wide but without effect on any value: it only changes how much freed memory
#: stays mapped.  ``DPJAX_MALLOC_TOP_PAD`` sets it in bytes; ``0`` leaves glibc's default alone.
MALLOC_TOP_PAD = 64 << 20
_ALLOCATOR_TUNED: list = []


def _tune_allocator() -> None:
    _ALLOCATOR_TUNED.append(True)
    try:
        pad = int(os.environ.get("DPJAX_MALLOC_TOP_PAD", MALLOC_TOP_PAD))
    except ValueError:
        pad = MALLOC_TOP_PAD
    if pad <= 0:
        return
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        if name is None or "libc" not in name:
            return
        libc = ctypes.CDLL(name)
        if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version"):  # glibc only
            libc.mallopt(-2, ctypes.c_int(min(pad, 2**31 - 1)))                # M_TOP_PAD
    except (OSError, AttributeError, ValueError):
        pass


#: Threads of :func:`_by_direction` (built on first use); its calls from inside its own threads or
#: other dpjax worker threads run serially (no nested pools).
_DIRECTION_POOL: list = []
_IN_WORKER = threading.local()


def _splittable(spec: Spec) -> bool:
    return (len(spec.directions) == 2 and len(spec.groups) == 1 and spec.groups[0].members == 1
            and not spec.tilted and spec.freq == 0)


def _direction_inputs(inp: Inputs, d: int) -> Inputs:
    """``inp`` restricted to direction ``d`` (offsets, Chernoff parameters and tilts per direction)."""
    return inp._replace(offsets=tuple(o[..., d:d + 1] for o in inp.offsets), lambdas=inp.lambdas[d:d + 1],
                        tilt=inp.tilt[d:d + 1], tilt_from=inp.tilt_from[d:d + 1])


def _by_direction(inp: Inputs, spec: Spec) -> np.ndarray:
    ops = NUMPY
    D = len(spec.directions)
    m = spec.groups[0].length
    o = np.asarray(inp.offsets[0][0])
    mech = _index(inp.mechanisms[0], 0)
    y = (o[:, None] + np.arange(m)[None, :]) * inp.dx
    threaded = _usable_cpus() >= 2 and not getattr(_IN_WORKER, "active", False)
    c = _cdfs(ops, mech, spec.directions, y, o, inp.dx, split=_in_background if threaded else None)
    nf_len = _kept(inp, spec)

    def one(d: int):
        with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
            pmf, p_inf = _grid_pmf(ops, LossCDFs(*(v[d:d + 1] for v in c)), y[d:d + 1], inp.dx, spec.kinds)
            sub = _direction_inputs(inp, d)
            sub_spec = dataclasses.replace(spec, directions=(spec.directions[d],))
            carry = _compose(ops, sub, sub_spec, nf_len, ((pmf[None], p_inf[None]),))
            return np.asarray(_finish(ops, carry, sub, sub_spec, nf_len), np.float64)

    if not threaded:
        parts = [one(d) for d in range(D)]
    else:
        pool = _direction_pool()
        other = pool.submit(worker, one, 1)
        parts = [one(0), other.result()]
    return np.concatenate(parts, axis=0)


def _in_background(fn, *args):
    """``fn(*args)`` on the direction thread; returns the getter of its result."""
    return _direction_pool().submit(worker, fn, *args).result


def worker(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with this thread marked as a worker: :func:`run_host` inside it
    runs its directions serially (for callers that already spread calls over threads)."""
    before = getattr(_IN_WORKER, "active", False)
    _IN_WORKER.active = True
    try:
        return fn(*args, **kwargs)
    finally:
        _IN_WORKER.active = before


def _direction_pool():
    if not _DIRECTION_POOL:
        import concurrent.futures

        _DIRECTION_POOL.append(concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="dpjax-direction", initializer=reset_thread))
    return _DIRECTION_POOL[0]


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_host_counts(inp: Inputs, spec: Spec, counts) -> np.ndarray:
    """:func:`run_host` of one mechanism (one group, one member) composed ``T`` times, for every
    ``T`` of ``counts``, from ONE discretization and forward transform (Koskela & Honkela 2021,
    §5.5: the composed transform of ``T`` identical steps is ``F^T``): ``(len(counts), D, K,
    targets + 8)``.  The composed accumulators are linear in the count, so each entry equals
    :func:`run_host` with that count, bit for bit."""
    if len(spec.groups) != 1 or spec.groups[0].members != 1 or spec.tilted:
        raise ValueError("run_host_counts composes one untilted mechanism (one group, one member)")
    n = spec.n
    one = inp._replace(counts=(np.ones(1, np.int64),))
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        nf_len = _kept(inp, spec)
        carry = _compose(NUMPY, one, spec, nf_len)
        o = np.asarray(inp.offsets[0][0], np.int64)
        out = []
        for t in np.asarray(counts, np.int64).reshape(-1):
            c = float(t)
            scaled = dict(carry, logabs=c * carry["logabs"], angle=c * carry["angle"], K=c * carry["K"],
                          log_fin=c * carry["log_fin"], log_hi=c * carry["log_hi"], total=np.float64(c),
                          offset=np.mod(np.mod(int(t), n) * np.mod(o, n), n))
            out.append(_finish(NUMPY, scaled, inp._replace(counts=(np.asarray([t], np.int64),)), spec, nf_len))
        return np.asarray(out, np.float64)


#: The stages of a compiled program, each its own XLA program (a compile of the whole was 1-1.5 s
#: on a 2-core CPU; each stage alone compiles in a fraction of that, and a stage's program is
#: shared by every bucket with its shapes).  A chunk's intermediate arrays stay on the device.
#: ``points`` runs only for two-phase mechanisms (:func:`_two_phase`).
STAGES = ("points", "cdfs", "pmf", "compose", "window", "locate", "convert")


def stage_names(spec: Spec) -> tuple:
    """The :data:`STAGES` a compiled program of ``spec`` runs."""
    phased = any(_two_phase(_mechanism_class(g)) for g in spec.groups)
    return STAGES if phased else STAGES[1:]


def stage_functions(spec: Spec) -> tuple:
    """The stages (:func:`stage_names`) of a compiled program of ``spec`` as JAX functions of one
    configuration ``(inp, previous stage's output) -> output``."""
    ops = jax_ops()
    nf_len = _kept(None, spec)
    fns = dict(points=lambda inp, prev: _member_points(ops, inp, spec),
               cdfs=lambda inp, prev: _member_cdfs(ops, inp, spec, prev),
               pmf=lambda inp, prev: _member_pmfs(ops, inp, spec, prev),
               compose=lambda inp, prev: _compose(ops, inp, spec, nf_len, prev),
               window=lambda inp, prev: _windows(ops, prev, inp, spec, nf_len),
               locate=lambda inp, prev: _convert_locate(ops, prev, inp, spec),
               convert=lambda inp, prev: _convert_finish(ops, prev, inp, spec))
    return tuple(fns[name] for name in stage_names(spec))


def looped(fn, block: int = 1):
    """``fn(inp, prev)`` of one configuration as ``local(count, inp, prev)`` over a batch (every
    leaf with a leading axis): a ``lax.while_loop`` over the first ``count[0]`` configurations,
    ``block`` per iteration (``jax.vmap`` inside a block; the count a multiple of it or the
    batch padded), outputs 0 beyond them."""
    import jax
    import jax.numpy as jnp

    def local(count, inp, prev):
        size = jax.tree_util.tree_leaves(inp)[0].shape[0]
        first = jax.tree_util.tree_map(lambda x: x[0], (inp, prev))
        shapes = jax.eval_shape(fn, *first)
        out0 = jax.tree_util.tree_map(lambda sd: jnp.zeros((size,) + sd.shape, sd.dtype), shapes)

        def body(state):
            i, out = state
            if block == 1:
                take = lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False)
                val = fn(*jax.tree_util.tree_map(take, (inp, prev)))
                put = lambda o, v: jax.lax.dynamic_update_index_in_dim(o, v, i, 0)
            else:
                take = lambda x: jax.lax.dynamic_slice_in_dim(x, i, block)
                val = jax.vmap(fn)(*jax.tree_util.tree_map(take, (inp, prev)))
                put = lambda o, v: jax.lax.dynamic_update_slice_in_dim(o, v, i, 0)
            return i + block, jax.tree_util.tree_map(put, out, val)

        return jax.lax.while_loop(lambda st: st[0] < count[0], body, (jnp.zeros((), count.dtype), out0))[1]

    return local


@functools.lru_cache(maxsize=None)
def _jitted(spec: Spec):
    """One jitted program per stage of ``spec`` (:func:`stage_names`), looped over a batch."""
    from dpjax._base import xla as _xla

    return tuple(_xla.jit(looped(fn)) for fn in stage_functions(spec))


def run_jit(count, inp: Inputs, spec: Spec):
    """The compiled program (its stages in turn, :func:`stage_names`) of the first ``count`` configurations
    of a batch (every :class:`Inputs` leaf with a leading axis, the capacity); returns
    ``(capacity, D, K, targets + 8)`` (rows past ``count`` are 0)."""
    count = np.asarray(count, np.int32).reshape(1)
    prev = None
    for program in _jitted(spec):
        prev = program(count, inp, prev)
    return prev


# ------------------------------------------------------------------------------------------
# From a grid plan


@dataclasses.dataclass(frozen=True)
class GridLayout:
    """The grid one configuration runs on: what :func:`inputs` reads of a plan.  A
    :class:`~dpjax.pld.grid.plan.GridPlan` has every field (pass it as it is, or
    ``dataclasses.replace`` it to run it with other Chernoff parameters, FFT length, ...); this
    record is for layouts built by hand.

    Attributes:
      groups: ``groups[d]`` the :class:`~dpjax.pld.grid.compose.Group` tuple of direction ``d``
        (same mechanisms and counts in every direction, their own offsets).
      dx: grid spacing.
      lambdas: ``(D, L)`` Chernoff parameters per direction (the tilted mode's candidate ones).
      log_tau: log of the tail level that centres the window.
      directions: the ``D`` directions.
      ms: ``ms[d]`` the support lengths of direction ``d``'s groups.
      n: FFT length.
      n_freq: frequencies kept (None: all).
    """

    groups: tuple
    dx: Any
    lambdas: Any
    log_tau: Any
    directions: tuple
    ms: tuple
    n: int
    n_freq: int | None = None


def host_inputs(plan, targets, *, kinds, want, tilt=None, tilt_from=None, lambdas=None, floor_free=False):
    """``(Inputs, Spec)`` of one configuration planned by :func:`dpjax.pld.grid.plan.plan_grid` (a
    :class:`~dpjax.pld.grid.plan.GridPlan`), for :func:`run_host` (see :func:`inputs`)."""
    layout = plan if lambdas is None else dataclasses.replace(plan, lambdas=lambdas)
    return inputs(layout, targets, kinds=kinds, want=want, tilt=tilt, tilt_from=tilt_from, floor_free=floor_free)


def inputs(layout: GridLayout, targets, *, kinds, want, tilt=None, tilt_from=None, floor_free=False,
           traced: bool = False):
    """``(Inputs, Spec)`` of one configuration on ``layout`` (a :class:`GridLayout` or a
    :class:`~dpjax.pld.grid.plan.GridPlan`).  Each group's arrays are its support (the largest
    any direction asked for); ``layout.n_freq`` frequencies are kept (None: all; the tilted mode
    keeps all).  ``tilt`` / ``tilt_from`` (``(D,)``): the tilted mode.  ``traced``: mechanism
    parameters, counts and the scalars may be JAX values (a program under ``jit``): they are kept
    as they are instead of converted to NumPy."""
    groups, dx, lambdas, log_tau = layout.groups, layout.dx, layout.lambdas, layout.log_tau
    directions, ms, n, n_freq = layout.directions, layout.ms, layout.n, layout.n_freq
    asf = (lambda x: x) if traced else (lambda x: np.asarray(x, np.float64))
    asi = (lambda x: x) if traced else (lambda x: np.asarray(x, np.int64))
    D = len(directions)
    specs, mechs, counts, offsets, support = [], [], [], [], []
    terms = 0
    for gi in range(len(groups[0])):
        g = groups[0][gi]
        m = max(int(ms[d][gi]) for d in range(D))
        leaves, treedef = tree_flatten(g.mechanism)
        G = int(np.shape(g.counts)[0])
        mechs.append(tree_unflatten(treedef, [asf(x) for x in leaves]))
        counts.append(asi(g.counts))
        offsets.append(_stack_last([asi(groups[d][gi].offsets) for d in range(D)], traced))
        support.append(m)
        specs.append(GroupSpec(treedef=treedef, members=G, length=m))
        terms += G if traced else int(np.count_nonzero(np.asarray(g.counts)))
    half = n // 2 + 1
    tilted = tilt is not None
    nf = half if (n_freq is None or tilted) else min(int(n_freq), half)
    inp = Inputs(mechanisms=tuple(mechs), counts=tuple(counts), offsets=tuple(offsets),
                 support=np.asarray(support, np.int64), dx=asf(dx), lambdas=asf(lambdas), log_tau=asf(log_tau),
                 targets=asf(targets).reshape(-1), nf=np.int64(nf),
                 tilt=asf(np.zeros(D) if tilt is None else tilt).reshape(D),
                 tilt_from=asf(np.zeros(D) if tilt_from is None else tilt_from).reshape(D),
                 terms=np.int64(terms))
    spec = Spec(n=int(n), directions=tuple(str(d) for d in directions), kinds=tuple(kinds), want=want,
                targets=int(inp.targets.shape[0]), groups=tuple(specs), freq=0, kept=int(nf), tilted=tilted,
                floor_free=floor_free)
    return inp, spec


def _stack_last(arrays, traced):
    if traced:
        import jax.numpy as jnp

        return jnp.stack([jnp.asarray(a) for a in arrays], axis=-1)
    return np.stack(arrays, axis=-1)


def jit_spec(spec: Spec) -> Spec:
    """The compiled program's :class:`Spec` for configurations of host spec ``spec``: every
    group's support arrays as long as the FFT (the support itself is data: the discretization
    loop runs over its blocks only) and room for every frequency (the kept count is data)."""
    half = spec.n // 2 + 1
    freq = -(-half // FREQ_BLOCK) * FREQ_BLOCK
    groups = tuple(dataclasses.replace(g, length=spec.n) for g in spec.groups)
    return dataclasses.replace(spec, groups=groups, freq=freq, kept=0)


def stack_inputs(items: list, capacity: int) -> Inputs:
    """A batch of :func:`inputs` values of one compiled spec as :func:`run_jit` inputs, padded to
    ``capacity`` with copies of the last item."""
    import jax

    items = list(items) + [items[-1]] * (capacity - len(items))
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *items)


# ------------------------------------------------------------------------------------------
# The delta curve at one epsilon: its value, smooth slope and parameter derivatives (host)


def _curve_sums(r, y0, y_ref, dx, n, eps):
    """Per row, ``(sum_{t > j} r_t, sum_{t > j} r_t e^{y_ref - y_t}, j, frac)`` at the segment
    ``j`` holding ``eps`` (``frac`` its position inside the segment)."""
    t = np.arange(n)[None, :]
    j = np.clip(np.floor((eps - y0) / dx).astype(np.int64), -1, n - 1)
    frac = np.clip((eps - (y0 + j * dx)) / dx, 0.0, 1.0)
    w = r * np.exp(y_ref - (y0 + t * dx))
    return w, j, frac


def host_curve_partials(inp: Inputs, spec: Spec, eps: float, tangents) -> dict:
    """Per direction, the certified (upper) delta curve of one mechanism composed ``T`` times
    (one group, one member, untilted, ``spec.kinds == ("up",)``) at ``eps``: ``delta``, its
    smooth ``slope`` in ``eps``, and its derivative along each tangent (``partials``, one row per
    tangent) -- all on this grid, on the host, nothing compiled.

    ``tangents``: ``[(mechanism_plus, mechanism_minus, h)]``: the mechanism at ``theta + h`` and
    ``theta - h`` along one parameter.  The single-step PMFs' derivative is their central
    difference (the discretization is a smooth function of the parameters on a fixed grid: its
    truncation error is ``O(h^2)``, far below the values' accuracy), carried through the
    composition exactly by the chain rule ``d(F^T) = T F^(T-1) dF`` on the kept frequencies, the
    window placement and the allowances (wrap-around bounds, round-off) held at their values:
    the derivative of the curve the grid certifies, not of its error terms.  The slope is that of
    the smooth curve the grid interpolates: each segment's chord slope is the exact slope at
    (about) the segment's middle, and between middles it is interpolated linearly (``O(dx^2)``);
    the grid's own slope steps at every grid point."""
    if len(spec.groups) != 1 or spec.groups[0].members != 1 or spec.tilted or spec.kinds != ("up",):
        raise ValueError("host_curve_partials: one untilted mechanism (one group, one member), upper rows")
    n, D = spec.n, len(spec.directions)
    half = n // 2 + 1
    m = spec.groups[0].length
    mech = _index(inp.mechanisms[0], 0)
    T = int(np.asarray(inp.counts[0])[0])
    o = np.asarray(inp.offsets[0])[0]
    dx = float(inp.dx)
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        rows = composed_rows(NUMPY, inp, spec)
        nf = _kept(inp, spec)
        r, w_lo = rows["pmf"], np.asarray(rows["w_lo"])
        rel = np.asarray(rows["roundoff_rel"])
        const = np.asarray(rows["p_inf"] + rows["tail_above"] + rows["roundoff"])
        fa, fb = 1.0 + rel, 1.0 - rel
        y0 = (w_lo * dx)[:, None]
        y_ref = ((w_lo + n // 2) * dx)[:, None]
        w, j, frac = _curve_sums(r, y0, y_ref, dx, n, eps)
        t = np.arange(n)[None, :]

        def above(k, x):
            return np.sum(np.where(t > k, x, 0.0), axis=-1, keepdims=True)

        e = np.exp(np.minimum(eps - y_ref, 700.0))
        delta = np.clip(above(j, r) * fa[:, None] + const[:, None] - e * above(j, w) * fb[:, None], 0.0, 1.0)
        wb = w * fb[:, None]
        bj, b_next, b_prev = above(j, wb), above(j + 1, wb), above(j - 1, wb)
        bj = np.where(frac >= 0.5, bj + (b_next - bj) * (frac - 0.5), bj + (b_prev - bj) * (0.5 - frac))
        slope = -e * bj
        # The single step and the composed transform's factor T F^(T-1) on the kept frequencies.
        pmf1, _, p1 = _discretize(NUMPY, mech, spec.directions, o, dx, m, ("up",))
        F1 = np.fft.rfft(pmf1, n, axis=-1)[:, :nf]
        power = T * np.exp((T - 1) * (0.5 * np.log(np.maximum(np.abs(F1) ** 2, 1e-300))
                                      + 1j * np.arctan2(F1.imag, F1.real)))
        offset = np.mod(np.mod(T, n) * np.mod(o, n), n)
        start = np.mod(w_lo - offset, n)
        partials = []
        for plus, minus, h in tangents:
            pp, _, p_plus = _discretize(NUMPY, plus, spec.directions, o, dx, m, ("up",))
            pm, _, p_minus = _discretize(NUMPY, minus, spec.directions, o, dx, m, ("up",))
            dF = np.fft.rfft((pp - pm) / (2.0 * h), n, axis=-1)[:, :nf]
            dPhi = np.concatenate([power * dF, np.zeros((D, half - nf), complex)], axis=-1)
            dr = np.stack([np.roll(row, -int(s)) for row, s in zip(np.fft.irfft(dPhi, n, axis=-1), start)])
            dw = dr * np.exp(y_ref - (y0 + t * dx))
            dp_inf = T * (1.0 - p1) ** (T - 1) * (p_plus - p_minus) / (2.0 * h)
            d = above(j, dr) * fa[:, None] + dp_inf[:, None] - e * above(j, dw) * fb[:, None]
            partials.append(d[:, 0])
    return dict(delta=delta[:, 0], slope=slope[:, 0], partials=np.asarray(partials).reshape(len(tangents), D))


def composed_rows(ops: Ops, inp: Inputs, spec: Spec) -> dict:
    """The composed, windowed rows of one configuration before conversion: ``pmf`` ``(R, n)``
    (non-negative, the per-bin round-off allowance applied), ``w_lo``, ``p_inf``, ``tail_above``,
    ``tail_below``, ``roundoff``, ``roundoff_rel``, ``needed_width``, ``truncation``,
    ``noise_floor``, ``valid_from`` ``(R,)`` and ``log_mgf`` ``(R, L)`` (the fields of
    :class:`dpjax.pld.grid.compose.ComposedPLD`, rows kind-major)."""
    nf_len = _kept(inp, spec)
    carry = _compose(ops, inp, spec, nf_len)
    r, w_lo, p_inf, above, below, roundoff, rel, width, floor, valid_from, truncation = _windows(
        ops, carry, inp, spec, nf_len)
    return dict(pmf=r, w_lo=w_lo, p_inf=p_inf, tail_above=above, tail_below=below, roundoff=roundoff,
                roundoff_rel=rel, log_mgf=carry["K"], needed_width=width, truncation=truncation, noise_floor=floor,
                valid_from=valid_from)
