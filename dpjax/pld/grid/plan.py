"""Grid choice (Python side, concrete values, outside jit).

From the mechanisms, their counts and the requested accuracy this picks the grid spacing ``dx``,
the FFT length ``n`` (a power of two), each mechanism's grid offset and support length ``m`` and
the Chernoff parameters.  Only tightness depends on these choices: soundness never does, because
every truncation and wrap-around is bounded inside the jitted program and added to the upper
bound.

Rules (Koskela & Honkela 2021, §5; Doroshenko et al. 2022 for the ``dx^2`` law):

* Single-mechanism support ``[y_lo, y_hi]``: ``P(Y > y_hi) <= tau_inf / C`` (that mass goes to
  the ``+inf`` atom, so the composition of ``C = sum c_k`` mechanisms loses at most
  ``tau_inf``) and ``P(Y <= y_lo) <= tau_inf / C`` (lumped onto ``y_lo``: sound, slightly loose).
  Found on a fixed log-spaced probe of 1001 loss values within +-650 (one vectorized call),
  extended to +-1e4 only when a single step has mass beyond +-650 at that level.
* Spacing: the connect-the-dots error in epsilon behaves like ``0.3 C dx^2 / sigma_c`` (measured
  against dp_accounting and the exact Gaussian oracle), ``sigma_c`` the std of the composed loss;
  ``dx`` is chosen so that this is ``<= min(relative_accuracy * eps_estimate,
  max(per_step_accuracy * C, 1e-3 * relative_accuracy * eps_estimate))``, and made finer for
  free while the FFT stays at ``n_min`` points.
  The FFT length is the smallest ``2^k`` or ``3 * 2^k`` that holds the window at that ``dx``.
* Window: the wider of the single support and ``2.2 z sigma_c`` with ``z = sqrt(2 log(1/tau_wrap))``; the exact
  placement happens inside the jitted program from the log-MGF.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
from typing import Sequence


from dpjax._base import ops as _ops
import numpy as np

from dpjax.pld.grid.compose import Group

# Widest window (in loss units) for which exp(+-width/2) stays finite in float64.
MAX_WINDOW_WIDTH = 1300.0

# Probe losses: log-spaced magnitudes from 1e-8 to MAX_WINDOW_WIDTH / 2 (500 points each side).
_G = np.linspace(-8.0, math.log10(MAX_WINDOW_WIDTH / 2), 500)
PROBE_LOSSES = np.concatenate([-(10.0 ** _G[::-1]), [0.0], 10.0 ** _G])
# The same probe continued at the same ratio up to +-PROBE_MAX_LOSS, used only when a single
# step has mass beyond +-650 at the truncation level (one Gaussian with mu ~ 45: epsilon ~ 1000;
# the window can sit anywhere, only its width is limited).  Without it that mass went to the
# +inf atom and epsilon came out inf.  Ordinary plans are unchanged (same probe, same cost).
PROBE_MAX_LOSS = 1e4
_G_STEP = (_G[-1] - _G[0]) / (len(_G) - 1)
_G_EXT = np.r_[_G, _G[-1] + _G_STEP * np.arange(1, math.ceil((math.log10(PROBE_MAX_LOSS) - _G[-1]) / _G_STEP) + 1)]
PROBE_LOSSES_EXTENDED = np.concatenate([-(10.0 ** _G_EXT[::-1]), [0.0], 10.0 ** _G_EXT])


@dataclasses.dataclass(frozen=True)
class GridOptions:
    """Accuracy and size knobs of the accountant.

    Attributes:
      relative_accuracy: target discretization error of epsilon, relative to epsilon.
      per_step_accuracy: target discretization error of epsilon per composed mechanism
        (absolute; the grid meets the tighter of the two targets).  Connect-the-dots errors add
        up linearly over a composition of ``C`` mechanisms (``~0.3 C dx^2 / sigma_c``), like
        dp_accounting's at a fixed ``value_discretization_interval`` (~7e-9 C at 1e-4, measured
        on DP-SGD against the pinned references): 8e-9 keeps the default grid at least as
        accurate as that anchor on short and long compositions alike (errors vs the pinned
        references: B1 5.0e-6 vs 6.9e-6, B6 8.3e-4 vs 9.6e-4) at a fraction of its cost.  It is
        never pushed below ``1e-3 * relative_accuracy * epsilon`` (large epsilon or few steps:
        a finer grid would only cost time).  For
        tighter values lower both targets (``GridOptions(relative_accuracy=1e-5,
        per_step_accuracy=1e-10)``).
      tail_fraction: truncation + wrap-around budget relative to the target delta (eps queries).
      delta_tail_mass: the same budget, absolute, for delta(eps) queries.
      n_min, n_max: bounds on the FFT length (powers of two; the length itself is a power of two
        or three times one, the smallest that holds the accuracy).  Below ``n_min`` accuracy is free;
        when ``n_max`` cannot hold the requested accuracy ``dx`` is widened (looser but sound).
      max_distinct: up to this many distinct mechanisms are composed member by member (each
        transform multiplied into the running product inside one ``lax.scan``: memory ``O(n)``
        whatever the count, time linear in it).  Longer heterogeneous schedules are blocked
        (upper bound: each block's least private member; lower bound: its most private one),
        except schedules of Gaussian mechanisms (``Gaussian``, or ``PoissonSubsampledGaussian``
        with ``sampling_prob = 1``), which compose exactly as one Gaussian and are merged into it.
        The default was 256, where blocking put ``geomspace(0.7, 3.0, 1000)`` (q = 0.01, delta
        1e-5) 0.67% above its member-by-member value (2.1931 vs 2.1786); with 4096 blocks the
        spread inside a block is 16x smaller.
    """

    relative_accuracy: float = 1e-3
    per_step_accuracy: float = 8e-9
    tail_fraction: float = 1e-6
    delta_tail_mass: float = 1e-13
    n_min: int = 2**16
    n_max: int = 2**21
    max_distinct: int = 4096

    def __post_init__(self):
        for name in ("relative_accuracy", "per_step_accuracy", "tail_fraction", "delta_tail_mass"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1):
                raise ValueError(f"{name} must be in (0, 1), got {v!r}")
        for name in ("n_min", "n_max"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 64 and v & (v - 1) == 0):
                raise ValueError(f"{name} must be a power of two >= 64, got {v!r}")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min must be <= n_max, got {self.n_min} > {self.n_max}")
        if not (isinstance(self.max_distinct, int) and self.max_distinct >= 1):
            raise ValueError(f"max_distinct must be an integer >= 1, got {self.max_distinct!r}")


@dataclasses.dataclass(frozen=True)
class GridPlan:
    """A concrete grid shared by all directions (see :func:`plan_grid`).

    ``groups[d]``, ``ms[d]`` and ``lambdas[d]`` belong to ``directions[d]`` (offsets and support
    lengths differ per direction; ``n`` and ``dx`` are common so one program serves all).
    """

    directions: tuple[str, ...]
    n: int
    dx: float
    ms: tuple[tuple[int, ...], ...]
    groups: tuple[tuple[Group, ...], ...]
    lambdas: np.ndarray
    log_tau: float
    tau_wrap: float
    tau_inf: float
    sigma_composed: tuple[float, ...]
    total_count: int
    n_freq: int | None = None
    mean_composed: tuple[float, ...] = ()


def _pow2(x: float) -> int:
    return 1 << max(0, int(math.ceil(math.log2(max(x, 1.0)))))


def _fft_size(x: float) -> int:
    """Smallest FFT length >= x of the form 2^k or 3 * 2^k (XLA's FFT is as fast per point
    for both); halves the average over-allocation of powers of two."""
    p = _pow2(x)
    three = 3 * (p // 4)
    return three if three >= x and three >= 64 else p


def _probe(mechanism, directions, y):
    """The loss CDFs of every stacked mechanism at the probe losses ``y``, per direction
    ``[(p_le (G, L), p_gt (G, L))]``, on the host (the mechanisms' NumPy backend, :mod:`dpjax._base.ops`:
    nothing compiled)."""
    from dpjax._base.ops import NUMPY

    leaves, treedef = _ops.tree_flatten(mechanism)
    leaves = [np.atleast_1d(np.asarray(x, np.float64)) for x in leaves]
    G = leaves[0].shape[0] if leaves else 1
    members = [_ops.tree_unflatten(treedef, [x[g] for x in leaves]) for g in range(G)]
    y = np.asarray(y, np.float64)
    out = []
    for d in directions:
        cdfs = [m.loss_cdfs(d, y, NUMPY) for m in members]
        out.append((np.stack([np.asarray(c.p_le) for c in cdfs]), np.stack([np.asarray(c.p_gt) for c in cdfs])))
    return out


# Host-side probing is used up to this many stacked mechanisms (math.erfc runs per element).
_HOST_PROBE_MAX = 16


# Host probes of the last few mechanisms, keyed by their concrete parameters: a loop that accounts
# one mechanism at more step counts or deltas (a running accountant, an epsilon curve) probes it
# once.  The probe depends on nothing else (the losses ``y`` are the module's fixed probe grids).
_HOST_PROBE_CACHE: "collections.OrderedDict[tuple, list]" = collections.OrderedDict()
_HOST_PROBE_CACHE_SIZE = 32
_HOST_PROBE_LOCK = threading.Lock()   # (the sweep plans in threads)


def _host_probe(mechanism, directions, y):
    """The probe in NumPy (no XLA compile) when the mechanism provides ``host_loss_cdfs`` and
    concrete parameters; None otherwise.  The arrays returned are read-only (cached)."""
    if not hasattr(type(mechanism), "host_loss_cdfs"):
        return None
    try:
        leaves, treedef = _ops.tree_flatten(mechanism)
        leaves = [np.asarray(x) for x in leaves]
    except Exception:  # traced parameters (a plan made inside a transformation)
        return None
    if any(x.ndim != 1 or x.shape[0] > _HOST_PROBE_MAX for x in leaves):
        return None
    key = (type(mechanism), treedef, tuple((x.dtype.str, x.shape, x.tobytes()) for x in leaves), tuple(directions),
           id(y), len(y))
    cacheable = y is PROBE_LOSSES or y is PROBE_LOSSES_EXTENDED
    if cacheable:
        with _HOST_PROBE_LOCK:
            hit = _HOST_PROBE_CACHE.get(key)
            if hit is not None:
                _HOST_PROBE_CACHE.move_to_end(key)
                return hit
    out = []
    for d in directions:
        c = mechanism.host_loss_cdfs(d, y)
        p_le, p_gt = np.array(c.p_le, np.float64), np.array(c.p_gt, np.float64)
        p_le.setflags(write=False)
        p_gt.setflags(write=False)
        out.append((p_le, p_gt))
    if cacheable:
        with _HOST_PROBE_LOCK:
            _HOST_PROBE_CACHE[key] = out
            while len(_HOST_PROBE_CACHE) > _HOST_PROBE_CACHE_SIZE:
                _HOST_PROBE_CACHE.popitem(last=False)
    return out


def _probe_masses(p_le, p_gt):
    """(G, B) probe-bin masses (differences of whichever of CDF / survival is below 1/2)."""
    p_le, p_gt = np.atleast_2d(np.asarray(p_le)), np.atleast_2d(np.asarray(p_gt))
    use_le = p_le[:, 1:] <= 0.5
    return np.maximum(np.where(use_le, p_le[:, 1:] - p_le[:, :-1], p_gt[:, :-1] - p_gt[:, 1:]), 0.0)


def _probe_stats(p_le, p_gt, mass, tau_single: float, y):
    p_le, p_gt = np.atleast_2d(np.asarray(p_le)), np.atleast_2d(np.asarray(p_gt))
    # support: first probe point with P(Y > y) <= tau, last with P(Y <= y) <= tau
    ok_hi = p_gt <= tau_single
    i_hi = np.where(ok_hi.any(axis=1), ok_hi.argmax(axis=1), len(y) - 1)
    ok_lo = p_le <= tau_single
    i_lo = np.where(ok_lo.any(axis=1), len(y) - 1 - ok_lo[:, ::-1].argmax(axis=1), 0)
    y_hi = y[i_hi]
    y_lo = np.minimum(y[i_lo], y_hi - 1e-12)
    mid = 0.5 * (y[1:] + y[:-1])
    tot = np.maximum(mass.sum(axis=1), 1e-300)
    mean = mass @ mid / tot
    dev = mid[None, :] - mean[:, None]
    var = np.maximum((mass * dev * dev).sum(axis=1) / tot, 0.0)
    k3 = (mass * dev * dev * dev).sum(axis=1) / tot
    return y_lo, y_hi, mean, var, k3


# Chernoff search grid (multiples of the Gaussian optimum z / sigma_c; ratio 1.58) and the
# spread of the values handed to the jitted program around the best one (ratio 1.41).
_LAMBDA_GRID = np.geomspace(1e-5, 10.0, 31)
_LAMBDA_SPREAD = np.geomspace(0.5, 2.0, 5)
_LAMBDA_FALLBACK = np.geomspace(0.3, 3.0, 5)
# The same ratio continued seven decades further down, searched only when the optimum of one
# side sits at the lowest point of _LAMBDA_GRID: a composed loss that is mostly a point mass near
# 0 with rare large values (DP-SGD with q T far below delta: sigma_c ~ 1e-5, so z / sigma_c ~ 1e6
# while the best lam is ~1) asked for a window of thousands of loss units (capped at 1300, so
# dx = 6e-4 at n_max), and epsilon came out at dx / 2 instead of 0.
_LAMBDA_GRID_LOW = np.geomspace(1e-12, 10.0, 66)


def _probe_log_mgf_terms(masses_d, counts, mid):
    """Per group with a used mechanism: ``(log_mass, mid, counts)`` over the probe bins that hold
    mass (most of the probe bins lie outside the loss support; empty bins contribute
    ``exp(-inf) = 0`` to the log-MGF, so they are dropped once, before any ``lam``)."""
    terms = []
    for mass, c in zip(masses_d, counts):
        c = np.broadcast_to(np.asarray(c, np.float64), (mass.shape[0],))
        keep = c > 0
        if not keep.any():
            continue
        mk = mass[keep]
        nz = np.any(mk > 0, axis=0)
        if not nz.any():
            continue
        with np.errstate(divide="ignore"):
            terms.append((np.log(mk[:, nz]), mid[nz], c[keep]))     # (G', B'), (B',), (G',)
    return terms


def _probe_log_mgf(terms, lam):
    """The composed log-MGF ``K(lam) = sum_k c_k log sum_b m_kb e^{lam y_b}`` of the probe masses
    at each ``lam`` (1-D), as a log-sum-exp per mechanism."""
    K = np.zeros(lam.shape[0])
    for log_mass, mid, ck in terms:
        # In chunks of 64 mechanisms: a (lam, G', B') array for a schedule of 10^4 distinct
        # mechanisms would be ~5 GB.
        for j0 in range(0, log_mass.shape[0], 64):
            a = lam[:, None, None] * mid[None, None, :] + log_mass[None, j0:j0 + 64]  # (lam, <=64, B')
            amax = np.max(a, axis=2, keepdims=True)
            amax = np.where(np.isfinite(amax), amax, 0.0)
            with np.errstate(divide="ignore", over="ignore"):
                lse = np.log(np.sum(np.exp(a - amax), axis=2)) + amax[..., 0]  # (lam, <=64)
            K = K + lse @ ck[j0:j0 + 64]
    return K


# The Chernoff search evaluates the log-MGF at every _CHERNOFF_STRIDE-th point of its grid first,
# then only around the best of those (see _chernoff_search).
_CHERNOFF_STRIDE = 4


def _grid_minimizers(terms, grid, log_tau: float):
    """``(quantile, q10)``, each ``(2, L)``: the Chernoff curves of both signs on ``grid`` (row 0 at
    ``+grid``, row 1 at ``-grid``), ``inf`` at the grid points that were not evaluated: every
    ``_CHERNOFF_STRIDE``-th point (and the last), then the points within a stride of the best of
    those, per sign and curve.

    Both curves, ``(K(lam) + a) / lam`` with ``a = -log tau`` and ``a = -log tau - log 10`` (and
    their mirror images for ``lam < 0``), are unimodal along the grid: for a convex ``K`` the
    derivative's numerator ``lam K' - K - a`` is nondecreasing (its derivative is
    ``lam K'' >= 0``), so each decreases and then increases.  The grid minimum of a unimodal
    sequence lies within a stride of its best sampled point, so this finds the same minima as
    evaluating every point, with about half the exponentials (the planner's largest host-side
    cost)."""
    L = grid.shape[0]
    lam = np.stack([grid, -grid])                                   # (2, L)
    sign = np.broadcast_to(np.array([[1.0], [-1.0]]), (2, L))
    quantile, q10 = np.full((2, L), np.inf), np.full((2, L), np.inf)
    done = np.zeros((2, L), bool)

    def evaluate(mask):
        K = _probe_log_mgf(terms, lam[mask])
        with np.errstate(invalid="ignore"):
            q = sign[mask] * (K - log_tau) / lam[mask]
            q_10 = sign[mask] * (K - log_tau - math.log(10.0)) / lam[mask]
        quantile[mask] = np.where(np.isfinite(q), q, np.inf)
        q10[mask] = np.where(np.isfinite(q_10), q_10, np.inf)
        done[mask] = True

    first = np.zeros((2, L), bool)
    first[:, ::_CHERNOFF_STRIDE] = True
    first[:, -1] = True
    evaluate(first)
    near = np.zeros((2, L), bool)
    for curve in (quantile, q10):
        for r, i in enumerate(np.argmin(curve, axis=1)):
            near[r, max(0, i - _CHERNOFF_STRIDE + 1):i + _CHERNOFF_STRIDE] = True
    if (near & ~done).any():
        evaluate(near & ~done)
    return quantile, q10


def _chernoff_search(masses_d, counts, lam_gauss: float, log_tau: float, mid, factors=_LAMBDA_GRID):
    """Chernoff parameters ``(+lam_1..+lam_5, -lam_1..-lam_5)`` for one direction.

    Any ``lam`` gives a valid wrap-around bound (the bound itself is evaluated inside the jitted
    program on the discretized PMF), so this choice only affects tightness.  For a near-Gaussian
    composed loss the best ``lam`` is ``z / sigma_c``; for a heavy-tailed one (the remove
    direction of a Poisson-subsampled Gaussian when ``q * T`` is small) it is orders of magnitude
    smaller, and a grid around ``z / sigma_c`` gives bounds that saturate at 1 (the accountant
    then returned inf).  So: evaluate the composed log-MGF ``K(lam)`` of the probe masses on a
    wide log grid (both signs), take the ``lam`` that minimizes the Chernoff quantile
    ``(K(lam) - log tau) / lam`` on each side, and return values within 2x of it per sign (the
    bound is flat near its optimum).  The grid minimum is found without evaluating every grid
    point (:func:`_grid_minimizers`).

    Returns ``(lambdas, width)``: the parameters and the best Chernoff window ``h - l`` of the
    probe masses (``inf`` when a side found no finite bound), an estimate of the width the
    jitted program's own bounds will ask for.
    """
    grid = lam_gauss * factors
    terms = _probe_log_mgf_terms(masses_d, counts, mid)
    out, width = [], 0.0
    # h(lam) for sign=+1 (row 0), -l(lam) for sign=-1 (row 1): minimize
    quantiles, q10s = _grid_minimizers(terms, grid, log_tau)
    for sign, quantile, q10 in zip((1.0, -1.0), quantiles, q10s):
        if not np.isfinite(quantile).any():
            out.append(sign * lam_gauss * _LAMBDA_FALLBACK)
            width = math.inf
            continue
        i = int(np.argmin(quantile))
        if i == 0 and factors is _LAMBDA_GRID:
            return _chernoff_search(masses_d, counts, lam_gauss, log_tau, mid, factors=_LAMBDA_GRID_LOW)
        # The width at the program's retry threshold (mass 10 tau outside each side, see
        # dpjax.pld.grid.engine.run): h - l = h + (-l).
        width += float(np.min(q10))
        out.append(sign * grid[i] * _LAMBDA_SPREAD)
    return np.concatenate(out), width


# Frequency truncation (compose's n_freq) from this many composed mechanisms on.
_TRUNCATE_MIN_COUNT = 64


def _n_freq(n: int, dx: float, sigma_c: float, total: int) -> int | None:
    """Frequencies to keep (see :func:`dpjax.pld.grid.compose`): a composed loss with std
    ``sigma_c`` has ``|phi(w)| ~ exp(-sigma_c^2 w^2 / 2)``, below 1e-347 from
    ``w = 40 / sigma_c`` on; we keep 4x that (the exponent 16x) and let the compose program
    bound what is dropped (sound whatever this returns; the accountant re-runs without
    truncation if the bound is not negligible)."""
    half = n // 2 + 1
    if total < _TRUNCATE_MIN_COUNT or not sigma_c > 0:
        return None
    k_cut = 40.0 * n * dx / (2.0 * math.pi * sigma_c)
    k = 64 * int(math.ceil(4.0 * k_cut / 64.0))
    return k if k < half // 2 else None


def n_freq_at(plan: GridPlan, n: int) -> int | None:
    """The kept frequencies of ``plan`` on an FFT of length ``n`` (same ``dx``, a wider window):
    the planner's rule (:func:`_n_freq`) at the new length, an int (every frequency) where the
    rule keeps all; None when ``plan`` keeps every frequency; ``plan.n_freq`` at its own ``n``."""
    if plan.n_freq is None:
        return None
    if n == plan.n:
        return plan.n_freq
    return _n_freq(n, plan.dx, min(plan.sigma_composed), plan.total_count) or (n // 2 + 1)


# The per-step target never asks for more than this fraction of the relative target: a predicted
# discretization error of 1e-6 * epsilon is negligible against ``relative_accuracy`` (1e-3), and
# finer grids only cost time.  Binds only where ``epsilon > 8e-3 * steps`` at the defaults (large
# epsilon or few steps, e.g. ``linspace(4.7, 1.3, 2197)`` at q = 1, delta 1e-6, epsilon 269:
# n = 2^19 points without it, n_min = 2^16 with it; error 2.7e-10 vs 1.2e-8 relative);
# ordinary DP-SGD runs (epsilon ~ 1 over 1e3..1e5 steps) keep the per-step target.
_FINEST_RELATIVE = 1e-3


def _discretization_target(options: GridOptions, eps_scale: float, total: int) -> float:
    """Absolute error target of epsilon for the grid spacing (``0.3 C dx^2 / sigma_c <= it``).

    ``min(relative_accuracy * eps, max(per_step_accuracy * C, 1e-3 * relative_accuracy * eps))``:
    the tighter of the two targets of :class:`GridOptions`, but not finer than 1e-3 of the
    relative one.  Tightness only (soundness never depends on ``dx``).
    """
    rel = options.relative_accuracy * eps_scale
    return min(rel, max(options.per_step_accuracy * max(total, 1), _FINEST_RELATIVE * rel))


def plan_grid(
    groups: Sequence[Group],
    directions: tuple[str, ...],
    *,
    tail_mass: float,
    eps_hint: float | None,
    target_delta: float | None,
    options: GridOptions,
    min_width: float = 0.0,
) -> GridPlan:
    """Choose one grid for composing ``groups`` in every direction (see module docstring).

    ``groups`` carry counts; their ``offsets`` are ignored and replaced.  ``min_width`` (loss units)
    forces a wider window at the same ``dx`` (a retry after a wrap-around bound came out over
    budget passes the width the Chernoff bounds asked for).  The window is also sized by the Chernoff quantiles of the probe masses' composed log-MGF at the
    accountant's retry threshold (10 tau outside each side), not only by the Cornish-Fisher
    spread: the jitted program's wrap-around check asks for that width, so a composition far
    from Gaussian (small ``q * T``: mostly a point mass at 0 plus a Poisson count of sampled
    steps) no longer needs a second run on a wider window, which is a second XLA program.
    Measured: on 1,000 random DP-SGD configurations (sigma in [0.6, 3], q in [1e-3, 3e-2], T in
    [1e2, 3e4]) 164 sweep rows re-ran without it (asking for 1.02-2.6x the planned width), 22
    with it; a single ``dpsgd_accounting(1.5709, 0.0019644, 167, 1e-5)`` compiled 2 programs in
    4.6 s, now 1 in 2.8 s.  Of 300 such configurations under the single call's grid policy, 220
    plan exactly as before, 70 get a wider window at the same ``n`` (a larger ``dx``, still
    within the accuracy target) and 10 a doubled ``n``.  Tightness and speed only: soundness
    never depends on the plan.
    """
    counts = [np.asarray(g.counts, np.int64) for g in groups]
    total = int(sum(int(c.sum()) for c in counts))
    tau_inf = 0.5 * tail_mass
    tau_wrap = 0.5 * tail_mass
    tau_single = tau_inf / max(total, 1)
    z = math.sqrt(2.0 * math.log(1.0 / tau_wrap))
    probe_y, probes = _probe_groups(groups, directions, counts, tau_single)
    probe_mid = 0.5 * (probe_y[1:] + probe_y[:-1])
    masses = [[_probe_masses(*probes[gi][di]) for gi in range(len(groups))] for di in range(len(directions))]
    per_dir = [_direction_needs(probes, masses[di], di, counts, total, z, tau_single, tau_wrap, probe_y, probe_mid,
                                eps_hint=eps_hint, target_delta=target_delta, options=options)
               for di in range(len(directions))]
    n, dx = _common_grid(per_dir, options, min_width)
    all_groups, all_ms = [], []
    for stats, *_ in per_dir:
        new_groups, ms = _placed_groups(groups, counts, stats, n, dx)
        all_groups.append(new_groups)
        all_ms.append(ms)
    return GridPlan(
        n_freq=_n_freq(n, dx, min(p[1] for p in per_dir), total),
        directions=tuple(directions), n=n, dx=dx, ms=tuple(all_ms), groups=tuple(all_groups),
        lambdas=np.stack([p[5] for p in per_dir]), log_tau=math.log(tau_wrap), tau_wrap=tau_wrap, tau_inf=tau_inf,
        sigma_composed=tuple(p[1] for p in per_dir), total_count=total,
        mean_composed=tuple(p[4] for p in per_dir),
    )


def _probe_groups(groups, directions, counts, tau_single):
    """``(probe_y, probes)``: every group's loss masses at the probe losses, ``probes[group][direction]
    = (p_le, p_gt)``; probed again further out (:data:`PROBE_LOSSES_EXTENDED`) when a used group
    has more than ``tau_single`` beyond the ordinary probes."""
    def probe_all(y):  # [group][direction] -> (p_le, p_gt)
        return [_host_probe(g.mechanism, directions, y) or _probe(g.mechanism, directions, y) for g in groups]

    probe_y = PROBE_LOSSES
    probes = probe_all(probe_y)
    # Mass beyond the probe at the truncation level: probe again, further out.
    if any(np.any(((np.asarray(le)[..., 0] > tau_single) | (np.asarray(gt)[..., -1] > tau_single)) & (cnt > 0))
           for pr, cnt in zip(probes, counts) for le, gt in pr):
        probe_y = PROBE_LOSSES_EXTENDED
        probes = probe_all(probe_y)
    return probe_y, probes


def _direction_needs(probes, masses, di, counts, total, z, tau_single, tau_wrap, probe_y, probe_mid, *, eps_hint,
                     target_delta, options):
    """What direction ``di`` asks of the grid: ``(stats, sigma_c, dx, width, mean, lambdas)``:
    per-group probe statistics, the composed loss's std and mean, the spacing of the
    discretization target, the window width (support, Cornish-Fisher spread, Chernoff
    quantiles at the retry threshold) and the Chernoff parameters."""
    stats = [_probe_stats(*probes[gi][di], masses[gi], tau_single, probe_y) for gi in range(len(counts))]
    V = sum(float((c * s[3]).sum()) for c, s in zip(counts, stats))
    K3 = sum(float((c * s[4]).sum()) for c, s in zip(counts, stats))
    M = sum(float((c * s[2]).sum()) for c, s in zip(counts, stats))
    support = max(float(np.max(np.where(c > 0, s[1] - s[0], 0.0))) for c, s in zip(counts, stats))
    sigma_c = math.sqrt(max(V, 1e-30))
    hint = eps_hint
    if hint is None:
        hint = M + sigma_c * math.sqrt(2.0 * math.log(1.0 / target_delta))
    eps_scale = max(hint, sigma_c, 1e-6)
    target = _discretization_target(options, eps_scale, total)
    dx_acc = math.sqrt(target * sigma_c / (0.3 * max(total, 1)))
    # Cornish-Fisher: skewness gamma moves both Chernoff quantiles by ~gamma (z^2 - 1) / 6;
    # the window must hold [M - z_lo sigma_c, M + z_hi sigma_c].
    gamma = K3 / sigma_c**3
    spread = (2.0 * z + abs(gamma) * (z * z - 1.0) / 3.0) * sigma_c
    width = min(1.05 * max(support, 1.1 * spread), MAX_WINDOW_WIDTH)
    lams, chernoff = _chernoff_search(masses, counts, z / sigma_c, math.log(tau_wrap), probe_mid)
    if math.isfinite(chernoff):
        width = max(width, min(chernoff, MAX_WINDOW_WIDTH))
    return stats, sigma_c, dx_acc, width, M, lams


def _common_grid(per_dir, options: GridOptions, min_width: float) -> tuple[int, float]:
    """``(n, dx)`` of the one grid of every direction: the finest spacing any direction asks
    for, the widest window (wider at the same ``dx`` for a retry's ``min_width``; at a coarser
    ``dx`` where ``n_max`` caps the length)."""
    dx_acc = min(p[2] for p in per_dir)
    width = max(p[3] for p in per_dir)
    n = _fft_size(width / dx_acc + 2)
    n = min(max(n, options.n_min), options.n_max)
    dx = width / (n - 2)
    # Degenerate probes (all mass beyond +-650: zero width) must still give integer offsets.
    y_abs = max(float(np.max(np.abs(np.r_[s[0], s[1]]))) for p in per_dir for s in p[0])
    dx = max(dx, y_abs / 2.0**40, 1e-12)
    if min_width > width:  # retry: same dx, wider window
        cap = max(options.n_max, n)
        fit = _fft_size(min_width / dx + 2)
        if fit <= cap:
            n = fit
        else:  # n_max holds n: the wider window at a coarser dx (looser, sound), as for accuracy
            n, dx = cap, max(dx, min_width / (cap - 2))
    return n, dx


def _placed_groups(groups, counts, stats, n: int, dx: float):
    """One direction's groups on the grid: offsets from each step's lowest loss, and per group
    the support length (a power of two >= 64, at most ``n``)."""
    new_groups, ms = [], []
    for g, c, (y_lo, y_hi, *_) in zip(groups, counts, stats):
        off = np.floor(y_lo / dx).astype(np.int64)
        top = np.ceil(y_hi / dx).astype(np.int64)
        need = int(np.max(np.where(c > 0, top - off + 1, 2)))
        ms.append(min(max(_fft_size(need), 64), n))
        new_groups.append(Group(mechanism=g.mechanism, counts=c, offsets=off))
    return tuple(new_groups), tuple(ms)


def regrid(plan: GridPlan, dx: float, n: int) -> GridPlan:
    """``plan`` on the coarser spacing ``dx`` (``>= plan.dx``) with ``n`` points: every group's
    support covers at least its support on ``plan`` (new offset ``floor(o plan.dx / dx)``, top
    ``ceil((o + m - 1) plan.dx / dx)``).  For the tilted tail pass, whose window may need to be
    wider than ``plan``'s largest FFT holds (see :func:`tilt_parameters`).  Soundness never
    depends on the grid (each support's truncation is bounded in the program); a coarser one
    only widens the bracket by its discretization."""
    groups, ms = [], []
    for gd, md in zip(plan.groups, plan.ms):
        gs, mm = [], []
        for g, m in zip(gd, md):
            off = np.asarray(g.offsets, np.int64)
            lo = np.floor(off * plan.dx / dx).astype(np.int64)
            top = np.ceil((off + m - 1) * plan.dx / dx).astype(np.int64)
            c = np.asarray(g.counts)
            need = int(np.max(np.where(c > 0, top - lo + 1, 2)))
            gs.append(Group(mechanism=g.mechanism, counts=g.counts, offsets=lo))
            mm.append(min(max(_fft_size(need), 64), n))
        groups.append(tuple(gs))
        ms.append(tuple(mm))
    return dataclasses.replace(plan, dx=float(dx), n=int(n), groups=tuple(groups), ms=tuple(ms), n_freq=None)


#: Probe of :func:`tilt_parameters`: the planner's probe 8 times denser (ratio 1.006 between
#: neighbours) from a loss of 0.01 on.  The window top is ``(K(theta) - log tau - lam y_v) / (theta - lam)`` with
#: ``theta`` close to ``lam``, so an error of ``K`` is divided by ``theta - lam``; with the
#: planner's probe (ratio 1.05: bins 0.15 wide at a loss of 3) ``K(32)`` was off by a factor
#: ``e^{32 * 0.07}`` and no tilt above ~8 seemed to fit, where ``lam = 32`` fits and is what a
#: heavy-tailed loss needs (DP-SGD with sigma 0.63, q 1.4e-8, T = 353 at delta 4.8e-13: certified
#: [1.13e-4, 1.78e-4] with it, 0.21..1.61 with the tilts that seemed to fit).
#: (Only from |loss| = 0.01 on: below, the planner's bins are narrower than 1e-3 / lam for every
#: tilt searched, and half as many bins halve the cost.)
_G_TILT = np.r_[_G[_G < -2.0], np.linspace(-2.0, math.log10(MAX_WINDOW_WIDTH / 2), 1780)]
_TILT_PROBE = np.concatenate([-(10.0 ** _G_TILT[::-1]), [0.0], 10.0 ** _G_TILT])
#: Largest ``(L, G, B)`` temporary of :func:`tilt_parameters` (floats).
_TILT_CHUNK = 2**23

#: The tilted pass keeps the mass wrapping onto its window from below (damped by ``e^{-lam W}``,
#: ``W = n dx``) under this fraction of the smallest target delta (see :func:`tilt_parameters`).
TILT_WRAP_FRACTION = 1e-4
#: The top of the tilted window may use this fraction of its width above ``y_v`` (the rest is a
#: margin for the probe-based log-MGF: the program places the window from the grid's own); the
#: thinner margin only where no width up to ``max_width`` serves a direction with the first.
_TILT_TOP_FITS = (0.7, 0.95)


#: Tilts searched by :func:`tilt_parameters`.
TILT_GRID = np.geomspace(1e-3, 1e3, 481)


def tilt_log_mgf(groups: Sequence[Group], directions: tuple[str, ...], support_tops=None) -> list:
    """Per direction ``(K, K')`` on :data:`TILT_GRID`: the composed log-MGF of the loss and its
    derivative (the tilted mean), from :data:`_TILT_PROBE` masses, each step's cut at
    ``support_tops[d][g]`` when given (see :func:`tilt_parameters`)."""
    counts = [np.asarray(g.counts, np.float64) for g in groups]
    y = _TILT_PROBE
    mid = 0.5 * (y[1:] + y[:-1])
    probes = [_host_probe(g.mechanism, directions, y) or _probe(g.mechanism, directions, y) for g in groups]
    grid = TILT_GRID
    out = []
    for di in range(len(directions)):
        K = np.zeros_like(grid)
        dK = np.zeros_like(grid)
        for gi, c in enumerate(counts):
            mass = _probe_masses(*probes[gi][di])
            if support_tops is not None:
                # The grid's single-step support ends at its top: the mass beyond goes to the
                # +inf atom (P(loss = inf), added to delta) and is no part of the composed MGF.
                top = np.broadcast_to(np.asarray(support_tops[di][gi], np.float64), (mass.shape[0],))
                mass = np.where(y[None, 1:] <= top[:, None], mass, 0.0)
            keep = c > 0
            if not keep.any():
                continue
            mass, c = mass[keep], c[keep]
            nz = np.any(mass > 0, axis=0)
            mass, mid_nz = mass[:, nz], mid[nz]
            step = max(1, _TILT_CHUNK // (len(grid) * max(1, mass.shape[1])))
            with np.errstate(divide="ignore"):
                log_mass = np.log(mass)                                        # -inf on empty bins
            for j0 in range(0, len(c), step):   # bounded memory: (L, step, B) at a time
                ck = c[j0:j0 + step]
                with np.errstate(over="ignore", invalid="ignore"):
                    a = log_mass[None, j0:j0 + step] + grid[:, None, None] * mid_nz    # (L, G', B)
                    amax = np.max(a, axis=2, keepdims=True)
                    w = np.exp(a - amax)
                    sw = np.sum(w, axis=2)
                    K += (np.log(sw) + amax[..., 0]) @ ck
                    dK += ((w @ mid_nz) / sw) @ ck
        out.append((K, dK))
    return out


def tilt_parameters(groups: Sequence[Group], directions: tuple[str, ...], eps_targets, y_from, width: float,
                    log_tau: float, *, level: float | None = None, max_width: float | None = None,
                    support_tops=None, mgf=None) -> tuple[np.ndarray, float, np.ndarray]:
    """Exponential tilts ``lam > 0`` (one per direction) for
    the PLD program's tilted mode (:mod:`dpjax.pld.grid.program`), the window width ``W`` (loss
    units: ``width`` or ``width`` times a power of two up to ``max_width``) they were chosen for,
    and per direction whether any tilt's window top fits at all (False: the smallest tilt of the
    search is returned, a window far above ``y_v`` that serves no answer).

    The tilted window ``[h - W, h]`` must do two things (Koskela and Honkela, "Computing
    differential privacy guarantees for heterogeneous compositions using FFT", 2021, bound the
    same two wrap-arounds for the untilted PMF):

    * reach down to ``y_v = y_from[d]``: its top ``h``, where the untilted bound on the mass
      wrapping from above, ``exp(K(theta) - theta h + lam (h - y_v))`` (the best ``theta > lam``),
      meets ``tau``, must lie within ``0.7 W`` of ``y_v`` (``0.95 W`` where nothing else fits;
      heavy right tails make ``K`` grow fast beyond ``lam`` and ask for smaller tilts);
    * damp what wraps from below: every bin below the window lands ``k n`` bins higher and is
      untilted there by ``e^{-lam k W}`` relative to its own mass, so up to ``e^{-lam W}`` (the
      whole bulk of the loss, when it lies below the window) is added to the upper curve.  Unless
      ``lam W >= log(1 / (TILT_WRAP_FRACTION * level))`` that mass, not the tail, decides
      epsilon at ``level``: DP-SGD with sigma 1, q 0.01 and T = 2 at delta 1e-14 put ``1.5e-13``
      at the window top and answered 3.88 where the truth is 2.795.

    Preferred: the largest ``lam`` up to the one putting the composed loss's tilted mean at
    ``eps_targets[d]`` (``K'(lam) = eps``, the tilted bulk where delta is read), else the
    smallest above it; when no ``lam`` meets both conditions at ``width``, the window is doubled
    (same spacing, more points).  A direction that no width up to ``max_width`` serves keeps the
    largest ``lam <= lam*`` whose top fits ``W`` (the program then reports what it can).

    ``K`` is the composed log-MGF of the probe masses (a loss histogram), each step's cut at
    ``support_tops[d][g]`` (its grid support's top: the grid sends what lies beyond to the ``+inf`` atom,
    so it is no part of the composed MGF; an uncut Gaussian loss tail, e.g. DP-SGD's, has
    ``K(lam) ~ T lam^2 / (2 sigma^2)`` and let no tilt above ~8 fit), so this is approximate;
    only tightness depends on it (any ``lam > 0`` gives certified bounds,
    the jitted program places and bounds the window itself).  ``mgf``: :func:`tilt_log_mgf` of
    the same arguments, when the caller has it (it does not depend on the targets).
    """
    grid = TILT_GRID
    if mgf is None:
        mgf = tilt_log_mgf(groups, directions, support_tops)
    max_width = width if max_width is None else max(float(max_width), width)
    widths = [width]
    while widths[-1] * 2.0 <= max_width * (1 + 1e-12):
        widths.append(widths[-1] * 2.0)
    log_wrap = math.log(1.0 / (TILT_WRAP_FRACTION * level)) if level is not None and level > 0 else 0.0
    choices = []
    for di in range(len(directions)):
        K, dK = mgf[di]
        eps, yv = float(eps_targets[di]), float(y_from[di])
        K = np.where(np.isfinite(K), K, np.inf)
        i_star = min(int(np.searchsorted(dK, eps)), len(grid) - 1) if math.isfinite(eps) else 0
        # Window top for every grid lam, over the grid's larger values as theta.
        later = grid[None, :] > grid[:, None]                                  # (L, L): theta > lam
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            h = np.min(np.where(later, (K[None, :] - log_tau - grid[:, None] * yv)
                                / np.where(later, grid[None, :] - grid[:, None], 1.0), np.inf), axis=1)
        tops = np.where(np.isfinite(h), h - yv, np.inf)                         # (L,)
        choices.append((i_star, tops))

    def pick(i_star, tops, W, fit):
        ok = (tops <= fit * W) & (grid * W >= log_wrap)
        below = np.flatnonzero(ok[:i_star + 1])
        if below.size:
            return int(below[-1])
        above = np.flatnonzero(ok[i_star + 1:])
        return int(above[0]) + i_star + 1 if above.size else None

    # Per direction the narrowest width served with the usual margin, else with the thin one;
    # then the widest of those serves every direction some width can serve.
    needed = [next(((Wk, fit) for fit in _TILT_TOP_FITS for Wk in widths if pick(i_star, tops, Wk, fit) is not None),
                   None) for i_star, tops in choices]
    W = max([w[0] for w in needed if w is not None], default=width)
    out, fits = [], []
    for (i_star, tops), w in zip(choices, needed):
        i = None
        for fit in (_TILT_TOP_FITS if w is not None else ()):
            i = pick(i_star, tops, W, fit)
            if i is not None:
                break
        if i is None:   # no width serves this direction: the top fit alone (lam <= lam*)
            ok = np.flatnonzero(tops[:i_star + 1] <= _TILT_TOP_FITS[0] * W)
            i = int(ok[-1]) if ok.size else None
        fits.append(i is not None)
        out.append(grid[0 if i is None else i])
    return np.asarray(out, np.float64), float(W), np.asarray(fits)
