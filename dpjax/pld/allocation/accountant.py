"""Certified accounting of DP-SGD under random allocation and balls-in-bins batching
(docs/design.md §12).

* **Random allocation** (Feldman & Shenfeld, "Privacy amplification by random allocation"): each
  epoch has ``batches_per_epoch = t`` steps and every example is used in ``selections_per_epoch =
  k`` of them, drawn uniformly and afresh each epoch; ``epochs = E`` epochs.
* **Balls-in-bins** (Choquette-Choo et al. 2024, Def. 3.1) with ``C = I``: each example gets one
  of ``b`` bins for the whole run and is used in every epoch at its bin's position.  Its ``E``
  observations of one bin are one Gaussian with noise multiplier ``sigma / sqrt(E)`` (their sum
  is sufficient), so the run is 1-of-``b`` random allocation with that noise, one epoch.

The reported ``epsilon`` is a certified upper bound and ``epsilon_lower`` a certified lower end
(add/remove adjacency: the max over both directions), as for Poisson DP-SGD
(:func:`dpjax.pld.dpsgd_accounting`).

Example::

    >>> from dpjax.pld import allocation_accountant as ra
    >>> ra.allocation_epsilon(1.0, 100, 1, 1e-5)                    # doctest: +SKIP
    0.6215...
    >>> ra.balls_in_bins_epsilon(1.0, 128, 4, 1e-5)                 # doctest: +SKIP

One-shot calls run the numerics on the host (NumPy: no compilation); :func:`allocation_epsilon_fn` /
:func:`delta_fn` run the same code in JAX on a fixed :class:`AllocationPlan` (jittable,
``vmap`` over noise multipliers, ``grad``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import Query
from dpjax._base.x64 import float64, host_only, ieee_arithmetic
from dpjax.pld.allocation import lattice as A
from dpjax.pld.grid.engine import exact_delta_result, exact_epsilon, exact_epsilon_result, scalar
from dpjax.pld.records import DeltaResult, DirectionReport, EpsilonResult
from dpjax.numerics.root import HostBisection, SolverStatus

__all__ = [
    "AllocationOptions", "AllocationPlan", "allocation_blocks", "plan_allocation", "allocation_accounting",
    "allocation_epsilon", "allocation_delta", "balls_in_bins_accounting", "balls_in_bins_epsilon",
    "balls_in_bins_delta", "allocation_epsilon_fn", "delta_fn", "epsilon_partials", "allocation_noise_multiplier",
    "CALIBRATION_TOLERANCE", "allocation_epsilon_curve", "allocation_sweep", "SWEEP_ROW_FIELDS", "SWEEP_GRID_KEYS",
    "account_blocks", "plan_partials",
]

DIRECTIONS = ("remove", "add")


@dataclasses.dataclass(frozen=True)
class AllocationOptions:
    """Accuracy and size knobs of the random-allocation accountant.

    Attributes:
      tail_fraction: budget for every truncation and wrap-around term, relative to the target
        delta (epsilon queries).
      delta_tail_mass: the same budget, absolute, for delta queries.
      lattice_factor: lattice window length per ``sqrt(steps per block)`` (the resolution of the
        likelihood-ratio lattices; the bracket narrows about like its inverse square).
      min_lattice, max_lattice: bounds on the lattice window (powers of two).
      grid_resolution: loss-grid spacing as a fraction of one epoch's loss standard deviation.
      max_grid: largest loss grid / composition FFT (power of two).
      coarse_fraction: epsilon queries run first on a lattice this fraction of the size
        (``lattice_factor`` and ``min_lattice`` scaled by it; 1 turns the coarse run off) and keep
        its bracket where it is already narrow: the lattice work grows with the window, while
        the bracket (large epsilon, few steps) is often far narrower than needed.
      coarse_width: the coarse run's bracket is kept when ``upper - lower <= coarse_width
        max(upper, 0.02)`` at every target delta; otherwise the run is repeated on the full
        lattice.
      coarse_min_size: the coarse run is tried only where the full lattice has at least this many
        points over all levels (``levels x lattice length``): below it the loss grid and the
        composition, which do not shrink with the lattice, cost about as much as the lattice,
        and a coarse run that is not kept would add half a run.
    """

    tail_fraction: float = 1e-3
    delta_tail_mass: float = 1e-13
    lattice_factor: float = 400.0
    min_lattice: int = 1024
    max_lattice: int = 2**15
    grid_resolution: float = 0.05
    max_grid: int = 2**20
    coarse_fraction: float = 0.25
    coarse_width: float = 2e-3
    coarse_min_size: int = 2**15

    def __post_init__(self):
        if not (isinstance(self.coarse_fraction, (int, float)) and 0 < self.coarse_fraction <= 1):
            raise ValueError(f"coarse_fraction must be in (0, 1], got {self.coarse_fraction!r}")
        for name in ("tail_fraction", "delta_tail_mass", "grid_resolution", "coarse_width"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < 1):
                raise ValueError(f"{name} must be in (0, 1), got {v!r}")
        if not (isinstance(self.lattice_factor, (int, float)) and self.lattice_factor > 0):
            raise ValueError(f"lattice_factor must be > 0, got {self.lattice_factor!r}")
        if not (isinstance(self.coarse_min_size, int) and self.coarse_min_size >= 0):
            raise ValueError(f"coarse_min_size must be an integer >= 0, got {self.coarse_min_size!r}")
        for name in ("min_lattice", "max_lattice", "max_grid"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 64 and v & (v - 1) == 0):
                raise ValueError(f"{name} must be a power of two >= 64, got {v!r}")
        if self.min_lattice > self.max_lattice:
            raise ValueError(f"min_lattice must be <= max_lattice, got {self.min_lattice} > {self.max_lattice}")


@dataclasses.dataclass(frozen=True)
class AllocationPlan:
    """Everything fixed before the numerics run (hashable: a static argument of jitted code).

    Attributes:
      shape: static sizes (:class:`dpjax.pld.allocation.lattice.Shape`).
      block_steps: steps of each block (1-of-``t_b`` allocation per block).
      counts: how many times each block is composed (``epochs`` times its multiplicity).
      tau: per-epoch truncation level of the lattice laws.
      dx: loss-grid spacing.
      log_tau: log of the tail level placing the composition window.
      room: heavy-tail room of the lattice windows (see :func:`dpjax.pld.allocation.lattice.band_geometry`).
      noise_multiplier: the noise multiplier the plan was made for (any other is sound; the grid
        is tight near this one and above).
      block_sigmas: each block's noise multiplier at that point (equal unless a schedule of noise
        multipliers was planned); :func:`allocation_epsilon_fn` scales them all by ``sigma / noise_multiplier``.
      tilt, tilt_from: per row (remove upper, add upper, remove lower, add lower), the tilt and
        the start of the tilted composition that runs beside the ordinary one where the
        ordinary one's round-off floor matters (small deltas; :func:`dpjax.pld.allocation.lattice.choose_tilt`);
        empty: none.
    """

    shape: A.Shape
    block_steps: tuple
    counts: tuple
    tau: float
    dx: float
    log_tau: float
    room: float
    noise_multiplier: float
    block_sigmas: tuple = ()
    tilt: tuple = ()
    tilt_from: tuple = ()

    def sigmas(self, noise_multiplier=None) -> list:
        """Per-block noise multipliers at ``noise_multiplier`` (default: the planned one)."""
        base = self.block_sigmas or (self.noise_multiplier,) * len(self.block_steps)
        if noise_multiplier is None:
            return [float(b) for b in base]
        return [b * (noise_multiplier / self.noise_multiplier) for b in base]


def allocation_blocks(batches_per_epoch: int, selections_per_epoch: int, epochs: int) -> list[tuple[int, int]]:
    """The 1-of-``t_b`` allocations whose composition dominates ``k``-of-``t`` allocation:
    ``[(t_b, count_b)]`` with ``t_b in {floor(t/k), ceil(t/k)}`` and counts summing to ``k E``
    (docs/design.md §12.4)."""
    t, k, E = batches_per_epoch, selections_per_epoch, epochs
    lo = t // k
    r = t - k * lo
    blocks = [(lo, (k - r) * E)]
    if r:
        blocks.append((lo + 1, r * E))
    return blocks


def _pow2(x: float, minimum: int = 64) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(x, 1.0)))))


def _fft_size(x: float) -> int:
    """Smallest ``2^k`` or ``3 2^k`` (>= 64) at least ``x``."""
    p = _pow2(x)
    return 3 * p // 4 if p >= 256 and 3 * p // 4 >= x else p


def _lattice_window(options: AllocationOptions, t_max: float) -> int:
    """The lattice window ``n`` of :func:`plan_allocation` (``t_max``: the most steps of a block)."""
    return _fft_size(min(options.max_lattice, max(options.min_lattice, options.lattice_factor * math.sqrt(t_max))))


# Most bands of one epoch.  The bands are about a factor 2 wide in the ratio (band_geometry);
# their number grows like 1/sigma^2 (the ratio spans about exp(s^2 + 2 s z) for s = 1/sigma), and
# the cost with it.  Beyond this the lattice is not run (see lattice_fits).
_MAX_LEVELS = 256
# Most lattice points over all bands of one run (64 bands of the largest window, 40960 points).
_MAX_POINTS = 64 * 40960
# Largest loss range (nats) one run may span: one epoch's atoms plus the composed spread.  The
# conversion (dpjax.pld.allocation.lattice._curves) weighs every bin by exp(y_ref - y) about the window's
# middle, which must stay inside float64's exponent range (|y - y_ref| < 709): the planned window
# (at most twice the span, a power of two) stays within _MAX_WINDOW, and so do the retries.
_MAX_SPAN = 640.0
_MAX_WINDOW = 1300.0


def _epoch_log_range(sigma: float, t: float, tau: float) -> float:
    """Nats spanned by one epoch's bands: ``s (w_max - w_lo)`` (docs/design.md §12.2)."""
    s = 1.0 / sigma
    w_lo, w_top = A.host_constants(float(t), tau)
    import scipy.special as sp

    w_max = max(s - float(sp.ndtri(0.5 * tau)), w_top)
    return s * max(w_max - w_lo, 1e-3)


def _levels_needed(sigma: float, t: float, tau: float) -> int:
    k = math.ceil(_epoch_log_range(sigma, t, tau) / math.log(2.0))
    return int(max(8, 4 * math.ceil(k / 4)))


def _max_levels(n: int) -> int:
    """Most bands with a lattice window of ``n`` points (lattice length ``1.25 n``): _MAX_LEVELS,
    and at most _MAX_POINTS lattice points over all bands (the laws hold 6 numbers per point)."""
    return int(min(_MAX_LEVELS, _MAX_POINTS // (n + n // 4)))


def _levels(sigma: float, t: float, tau: float, n: int = 0) -> int:
    cap = _max_levels(n) if n else _MAX_LEVELS
    return int(min(cap, _levels_needed(sigma, t, tau)))


def _epoch_loss_sd(sigmas, steps) -> float:
    """One epoch's log-likelihood-ratio spread (log-normal mean of ``t_b`` terms), at most
    ``1/sigma``: the largest over the blocks."""
    sd1 = 1e-6
    for sb, t in zip(sigmas, steps):
        s = 1.0 / sb
        sd1 = max(sd1, min(math.sqrt(math.expm1(min(s * s, 700.0)) / t), s))
    return sd1


def _budget(target_delta, options: AllocationOptions) -> float:
    if target_delta is not None:
        return options.tail_fraction * float(np.min(target_delta))
    return options.delta_tail_mass


def lattice_fits(noise_multiplier, blocks, *, target_delta=None, options: AllocationOptions | None = None) -> bool:
    """Whether the lattice accountant can run on ``blocks`` (from :func:`allocation_blocks`) at
    ``noise_multiplier`` (scalar or one per block): bands of ratio 2 per epoch, at most
    :func:`_max_levels` of them, and one epoch's log-ratio range plus the composed spread within
    ``_MAX_SPAN`` nats.
    Outside (very small noise, or a composition whose epsilon is in the hundreds) the privacy
    loss is far from where the lattice helps: :func:`allocation_accounting` answers there with
    the closed-form bracket of :func:`closed_form_bracket`, whose upper end (no amplification)
    is then within the amplification's small gain of the truth."""
    options = options or AllocationOptions()
    sig = [float(x) for x in np.broadcast_to(np.asarray(noise_multiplier, np.float64), (len(blocks),))]
    steps = [float(b[0]) for b in blocks]
    C = sum(int(b[1]) for b in blocks)
    budget = _budget(target_delta, options)
    tau = budget / (16.0 * C)
    # (Wider bands, as a cap on their number would make, leave heavy tails' windows over budget:
    # the run would end at the cap after every retry.)
    cap = _max_levels(_lattice_window(options, max(steps)))
    if any(_levels_needed(sb, t, tau) > cap for sb, t in zip(sig, steps) if t > 1):
        return False
    z = math.sqrt(2.0 * math.log(4.0 / budget))
    width = max(_epoch_log_range(sb, t, tau) for sb, t in zip(sig, steps))
    spread = 2.0 * (z + 2.0) * math.sqrt(C) * _epoch_loss_sd(sig, steps) if C > 1 else 0.0
    return width + spread <= _MAX_SPAN


def plan_allocation(noise_multiplier, blocks, *, target_delta=None, target_epsilon=None,
                    options: AllocationOptions | None = None, room: float = 1.0, comp_scale: int = 1) -> AllocationPlan:
    """Host-side plan for ``blocks`` (from :func:`allocation_blocks`) at ``noise_multiplier`` (a
    scalar, or one per block), the smallest that will be evaluated on it.  Only tightness depends
    on the plan."""
    options = options or AllocationOptions()
    sig = np.broadcast_to(np.asarray(noise_multiplier, np.float64), (len(blocks),))
    sigmas = [float(x) for x in sig]
    sigma = min(sigmas)
    steps = [float(b[0]) for b in blocks]
    counts = [int(b[1]) for b in blocks]
    C = sum(counts)
    budget = _budget(target_delta, options)
    tau = budget / (16.0 * C)
    t_max = max(steps)
    n = _lattice_window(options, t_max)
    levels = max(_levels(sb, t, tau, n) for sb, t in zip(sigmas, steps))
    # Lattice points per band: a quarter more than the window (a coarser lattice where a band is
    # narrow next to its window: sound, tight enough there) ...
    m = n + n // 4
    # ... or more where the lattice, which starts at 0 and must reach b_k, would otherwise be
    # coarser than the window's spacing: large noise puts the whole epoch's ratio within a
    # fraction s / sqrt(t) of 1, so at m = 1.25 n the lattice could only resolve it in tens of
    # steps (sigma 1000, two steps: brackets 6% wide).  Up to _MAX_POINTS over all levels.
    # (Light tails only, sigma >= 2: with heavy tails the others' sum is sized by its tail
    # bounds, which a window just wide enough for the bulk would leave over budget.)
    reach = 0.0
    for sb, t in zip(sigmas, steps):
        if sb < 2.0:
            continue
        free = A.band_geometry(A.NUMPY, sb, t, tau, levels=levels, n=n, m=2**40, room=room)
        reach = max(reach, float(np.max(np.asarray(free["bh"]) / np.asarray(free["g"]))))
    m_cap = max(m, _pow2(_MAX_POINTS // levels) // 2)
    if reach + A._BLOCK + 18 > m:
        m = int(min(m_cap, _pow2(reach + A._BLOCK + 18)))
    sd1 = _epoch_loss_sd(sigmas, steps)
    dx = min(2e-3, options.grid_resolution * sd1)
    lo_v, hi_v = math.inf, 0.0
    for sb, t in zip(sigmas, steps):
        geo = A.band_geometry(A.NUMPY, sb, t, tau, levels=levels, n=n, m=m, room=room)
        w0, g = np.asarray(geo["w0"]), np.asarray(geo["g"])
        lo_v = min(lo_v, float(np.min(np.maximum(w0, 1.0) * g)))
        hi_v = max(hi_v, float(np.max((w0 + n) * g)))
    width = math.log(hi_v) - math.log(lo_v) + 4 * dx
    z = math.sqrt(2.0 * math.log(4.0 / budget))
    spread = 0.0 if C == 1 else 2.0 * (z + 2.0) * math.sqrt(C) * sd1
    # A finer grid than the range allows at max_grid is not possible: widen dx (looser, sound).
    # The composition's window must hold the epoch's grid and the composed spread (many epochs:
    # at 2e-3 a spread of 2000 nats would need 1e6 points and, capped at max_grid, wrap around).
    dx = max(dx, (width + spread) / (options.max_grid - 96))
    N = _pow2(width / dx + 32)
    n_comp = N if C == 1 else _pow2(N + spread / dx)
    n_comp = int(min(options.max_grid, n_comp * comp_scale))
    shape = A.Shape(levels=levels, n=n, m=m, N=N, n_comp=n_comp)
    return AllocationPlan(shape=shape, block_steps=tuple(steps), counts=tuple(counts), tau=tau, dx=dx,
                          log_tau=math.log(budget / 4.0), room=float(room), noise_multiplier=sigma,
                          block_sigmas=tuple(sigmas))


def _run_numpy(plan: AllocationPlan, sigma=None) -> A.Composed:
    return A.run(A.NUMPY, plan.sigmas(sigma), list(plan.block_steps), np.asarray(plan.counts, np.float64), plan.tau, plan.dx,
                 plan.log_tau, plan.shape, room=plan.room, tilt=plan.tilt, tilt_from=plan.tilt_from)


def _with_tilt(plan: AllocationPlan, comp, target_delta, target_epsilon, lower_hint=0.0, options=None):
    """``(plan, comp)`` with the tilted composition beside the ordinary one where its round-off
    floor matters (:func:`dpjax.pld.allocation.lattice.choose_tilt`), on the same epoch PMFs.  The tilt
    is aimed at the best certified lower end known (the ordinary one, ``lower_hint``), then once
    or twice more at the tilted pass's own lower end while that moves by more than 1% (where the
    floor also weakens the ordinary lower end, as at delta 1e-300, the first aim is low)."""
    options = options or AllocationOptions()
    stack = A.last_stack(plan.sigmas(), list(plan.block_steps), plan.tau, plan.dx, plan.shape, plan.room)
    A._LAST_STACK.clear()       # (held only until here: it can be large)
    counts = np.asarray(plan.counts, np.float64)
    best, aim = comp, None
    for _ in range(3):
        choice = A.choose_tilt(stack, counts, plan.dx, best, target_delta=target_delta,
                               target_epsilon=target_epsilon, lower_hint=lower_hint)
        if choice is None or (aim is not None and choice[1][0] <= aim * 1.01):
            break
        aim = choice[1][0]
        trial = dataclasses.replace(plan, tilt=choice[0], tilt_from=choice[1])
        with np.errstate(all="ignore"):
            tilted = A.compose_tilted(A.NUMPY, stack, counts, plan.dx, plan.log_tau, n_comp=plan.shape.n_comp,
                                      tilt=trial.tilt, tilt_from=trial.tilt_from)
            # The tilted window must reach down to its aim (a heavy right tail puts its top far
            # up): otherwise twice the points, for both compositions (one plan), while the limits
            # allow.
            while (np.any(np.asarray(tilted.valid_from)[:2] > aim + 2 * plan.dx)
                   and 2 * trial.shape.n_comp <= options.max_grid
                   and 2 * trial.shape.n_comp * plan.dx <= _MAX_WINDOW):
                trial = dataclasses.replace(trial, shape=trial.shape._replace(n_comp=2 * trial.shape.n_comp))
                comp = A.compose_epochs(A.NUMPY, stack, counts, plan.dx, plan.log_tau, n_comp=trial.shape.n_comp)
                tilted = A.compose_tilted(A.NUMPY, stack, counts, plan.dx, plan.log_tau,
                                          n_comp=trial.shape.n_comp, tilt=trial.tilt, tilt_from=trial.tilt_from)
        plan, best = trial, A.Pair(comp, tilted)
        if target_delta is None:
            break
    return plan, best


def account_blocks(sigma, blocks, *, target_delta=None, target_epsilon=None, options=None, coarse=True,
                   lower_hint=0.0):
    """Plan, run on the host, and re-plan while a truncation / wrap-around term is over budget.

    ``sigma``: one noise multiplier, or one per block; ``blocks``: ``[(batches t_b, epochs c_b)]``
    (:func:`allocation_blocks`).  Returns ``(plan, composed)``: the final :class:`AllocationPlan`
    and the composition on it (:class:`dpjax.pld.allocation.lattice.Composed`, rows ``[upper remove,
    upper add, lower remove, lower add]``), from which :func:`dpjax.pld.allocation.lattice.eps_of` /
    ``delta_of`` read the bracket (what :func:`allocation_accounting` reports).

    Epsilon queries (``target_delta``) with ``coarse`` run first on the coarse lattice of
    :class:`AllocationOptions` and keep it where its bracket is at most ``coarse_width``
    (relative) wide at every target; otherwise the full lattice runs (from the coarse run's
    window room).  ``lower_hint``: a certified lower end of epsilon known otherwise (the
    tilted pass for small deltas aims at the larger of it and the run's own)."""
    options = options or AllocationOptions()
    room = None
    if coarse and target_delta is not None and options.coarse_fraction < 1 and _lattice_size(
            sigma, blocks, target_delta, options) >= options.coarse_min_size:
        f = options.coarse_fraction
        small = dataclasses.replace(options, lattice_factor=options.lattice_factor * f,
                                    min_lattice=max(64, _pow2(options.min_lattice * f)), coarse_fraction=1.0)
        plan, comp = _account(sigma, blocks, target_delta, target_epsilon, small, None, lower_hint)
        if _narrow(comp, target_delta, options.coarse_width):
            return plan, comp
        room = plan.room
    return _account(sigma, blocks, target_delta, target_epsilon, options, room, lower_hint)


def _lattice_size(sigma, blocks, target_delta, options) -> int:
    """Lattice points over all levels (``levels x m``) of the full plan at room 1."""
    shape = plan_allocation(sigma, blocks, target_delta=target_delta, options=options).shape
    return shape.levels * shape.m


def _narrow(comp: A.Composed, target_delta, width: float) -> bool:
    """Whether the bracket of ``comp`` at every ``target_delta`` is finite and at most ``width
    max(upper, 0.02)`` wide."""
    with np.errstate(all="ignore"):
        vals = np.asarray(A.eps_of(A.NUMPY, comp, np.asarray(target_delta, np.float64)))
    up = np.where(np.isnan(vals[:2]), np.inf, vals[:2]).max(0)
    lo = np.where(np.isnan(vals[2:]), 0.0, vals[2:]).max(0)
    return bool(np.all(np.isfinite(up)) and np.all(up - lo <= width * np.maximum(up, 0.02)))


def _account(sigma, blocks, target_delta, target_epsilon, options, room, lower_hint=0.0):
    budget = (options.tail_fraction * float(np.min(target_delta)) if target_delta is not None
              else options.delta_tail_mass)
    if room is None:
        room = _probe_room(sigma, blocks, target_delta, target_epsilon, options, budget)
    comp_scale = 1
    for _ in range(6):
        plan = plan_allocation(sigma, blocks, target_delta=target_delta, target_epsilon=target_epsilon,
                               options=options, room=room, comp_scale=comp_scale)
        comp = _run_numpy(plan)
        p_inf = np.asarray(comp.p_inf)
        over_lattice = bool(np.any(p_inf[:2] > 0.5 * budget)) or bool(np.any(np.asarray(comp.tail_below)[2:] > budget))
        over_window = bool(np.any(np.asarray(comp.tail_above)[:2] > 0.25 * budget)) or bool(
            np.any(np.asarray(comp.tail_below)[2:] > 0.5 * budget))
        if over_lattice and room < A._WHOLE_ROOM:
            room = _next_room(room)
            continue
        if over_window and plan.shape.n_comp < options.max_grid and 2 * plan.shape.n_comp * plan.dx <= _MAX_WINDOW:
            comp_scale *= 2
            continue
        break
    return _with_tilt(plan, comp, target_delta, target_epsilon, lower_hint, options)


def _next_room(room: float) -> float:
    return room * 8.0 if room < 64 else 1e9


def _probe_room(sigma, blocks, target_delta, target_epsilon, options, budget) -> float:
    """The first run's ``room``: 1 where the dominating laws at room 1 put at most a quarter of
    ``budget`` outside their windows, composed over the epochs
    (:func:`dpjax.pld.allocation.lattice.upper_window_mass`), else 8 (heavy tails: few steps, small
    noise).  Only a choice: :func:`account_blocks` checks the run and raises it further."""
    plan = plan_allocation(sigma, blocks, target_delta=target_delta, target_epsilon=target_epsilon,
                           options=options, room=1.0)
    sh = plan.shape
    mass = sum(c * A.upper_window_mass(sb, tb, plan.tau, levels=sh.levels, n=sh.n, m=sh.m, room=1.0)
               for sb, tb, c in zip(plan.sigmas(), plan.block_steps, plan.counts))
    return 1.0 if mass <= 0.25 * budget else _next_room(1.0)


def _gaussian_result(mu, target_delta=None, target_epsilon=None):
    from dpjax.numerics.exact import host_gaussian_delta_and_upper

    if target_delta is not None:
        deltas = np.asarray(target_delta, np.float64)
        upper, lower = exact_epsilon(deltas, mu)
        return exact_epsilon_result(deltas, upper, lower)
    eps = np.asarray(target_epsilon, np.float64)
    d, upper = host_gaussian_delta_and_upper(eps, mu)
    return exact_delta_result(eps, upper, d * (1 - 1e-9))


# ------------------------------------------------------------------------------------------
# Bounds without the lattice: no amplification above, one selected step per epoch below


def unamplified_mu(noise_multiplier, blocks) -> float:
    """``mu`` of the Gaussian mechanism that dominates the scheme without amplification.

    Whatever the allocation, an example takes part in ``sum_b c_b`` steps (``k E``; balls-in-bins:
    ``E`` observations of its bin, accounted as one step at ``sigma / sqrt(E)``), each a Gaussian
    of sensitivity 1; given the allocation the run is their (adaptive) composition, dominated by
    one Gaussian with ``mu^2 = sum_b c_b / sigma_b^2``, and by joint convexity of the hockey
    stick so is the mixture over allocations.  ``noise_multiplier``: scalar or one per block."""
    sig = [float(x) for x in np.broadcast_to(np.asarray(noise_multiplier, np.float64), (len(blocks),))]
    if all(sb == sig[0] for sb in sig):
        # (The spelling of the closed form elsewhere: sqrt(k E) / sigma, the same float.)
        return math.sqrt(sum(int(c) for _, c in blocks)) / sig[0]
    return float(math.sqrt(sum(int(c) / sb ** 2 for sb, (_, c) in zip(sig, blocks))))


def _closed_lower_log_delta(eps, noise_multiplier, blocks) -> np.ndarray:
    """Log of a certified lower bound on the remove direction's delta at ``eps`` (array).

    Write ``Z_{e,i} = exp(s_e W_{e,i} - s_e^2 / 2)`` for the steps' Gaussian ratios (``W`` iid
    N(0, 1) under ``Q``), so that an epoch's ratio is ``V_e = (1/t_e) sum_i Z_{e,i}`` (§12.1) and
    ``G = prod_e Z_{e,1}`` is the ratio of the Gaussian with ``mu`` (:func:`unamplified_mu`); let
    ``L = sum_e log t_e``, ``Delta(x)`` the Gaussian's ``E_Q[(G - e^x)_+]`` and ``a = e^eps``.

    * ``V_e >= Z_{e,1} / t_e``: ``E_Q[(prod_e V_e - a)_+] >= e^{-L} Delta(eps + L)``.
    * On the disjoint events "in every epoch exactly one step ``i_e`` has ``W > w``", ``prod V_e
      >= e^{-L} prod_e Z_{e,i_e}``; summing over the ``e^L`` choices, removing the part of
      ``Delta`` where some ``W_{e,i_e} <= w`` (at most its P-mass, ``sum_e Phi(w - s_e)``) and
      multiplying by the other steps' ``P(W <= w)``:
      ``>= [Delta(eps + L) - sum_e Phi(w - s_e)]_+ Phi(w)^{sum_e (t_e - 1)}``, for every ``w``.
    * One epoch (``sum c_b = 1``): with ``e^{s w - s^2/2} = a t`` the first factor needs no
      correction (``(Z / t - a)_+ > 0`` implies ``Z > a t``): ``Delta(eps + log t) Phi(w)^{t - 1}``.

    Tight where the noise is small (one step's ratio then dominates each epoch); 0 (log ``-inf``)
    where none of them helps."""
    import scipy.special as sp

    from dpjax.numerics.exact import np_gaussian_log_delta

    eps = np.asarray(eps, np.float64)
    sig = [float(x) for x in np.broadcast_to(np.asarray(noise_multiplier, np.float64), (len(blocks),))]
    L = sum(int(c) * math.log(int(tb)) for tb, c in blocks)
    D = sum(int(c) * (int(tb) - 1) for tb, c in blocks)
    mu = unamplified_mu(sig, blocks)
    e = eps.reshape(-1)
    with np.errstate(all="ignore"):
        log_gauss = np.asarray(np_gaussian_log_delta(e + L, mu), np.float64)
        best = log_gauss - L
        s_max = max(1.0 / sb for sb in sig)
        w = np.linspace(-8.0, s_max + 40.0, 481)[:, None]
        miss = sum(int(c) * sp.ndtr(w - 1.0 / sb) for sb, (_, c) in zip(sig, blocks))
        gap = np.exp(log_gauss)[None, :] - miss
        cand = np.where(gap > 0, np.log(np.where(gap > 0, gap, 1.0)) + D * sp.log_ndtr(w), -np.inf)
        best = np.maximum(best, np.max(cand, axis=0))
        if sum(int(c) for _, c in blocks) == 1:
            s1, t1 = 1.0 / sig[0], int(blocks[0][0])
            w1 = (e + math.log(t1) + 0.5 * s1 * s1) / s1
            best = np.maximum(best, log_gauss + (t1 - 1) * sp.log_ndtr(w1))
    best = np.where(np.isnan(best), -np.inf, best)
    return best.reshape(eps.shape)


def summed_mu(noise_multiplier, blocks) -> float:
    """``mu`` of the Gaussian that every epoch's output, summed over its steps, releases: a
    1-of-``t_b`` epoch adds its example's unit contribution to exactly one step, so the sum of
    its ``t_b`` outputs is ``N(1, t_b sigma_b^2)`` with the example and ``N(0, t_b sigma_b^2)``
    without, wherever it was placed.  That sum is a post-processing of the epoch, so the
    composition of these Gaussians, ``mu^2 = sum_b c_b / (t_b sigma_b^2)``, is a lower bound on
    the scheme (close to the truth for large noise, where allocation behaves like sampling with
    rate ``1/t``)."""
    sig = [float(x) for x in np.broadcast_to(np.asarray(noise_multiplier, np.float64), (len(blocks),))]
    return float(math.sqrt(sum(int(c) / (int(tb) * sb * sb) for sb, (tb, c) in zip(sig, blocks))))


def closed_form_bracket(noise_multiplier, blocks, target_delta=None, target_epsilon=None, mu=None):
    """``(upper, lower)`` without the lattice: epsilon at ``target_delta`` or delta at
    ``target_epsilon`` (arrays).  Upper: the Gaussian of :func:`unamplified_mu` (closed form,
    :func:`dpjax.pld.grid.engine.exact_epsilon`); lower: the larger of the Gaussian of
    :func:`summed_mu` (its certified lower end) and :func:`_closed_lower_log_delta` (its delta,
    or the largest epsilon found where it is still above ``target_delta``).  ``mu``: the
    unamplified Gaussian's, where the caller spells it (balls-in-bins: ``sqrt(E) / sigma``)."""
    from dpjax.numerics.exact import gaussian_delta, host_gaussian_delta_and_upper

    mu = unamplified_mu(noise_multiplier, blocks) if mu is None else float(mu)
    mu_sum = summed_mu(noise_multiplier, blocks)
    # The lower bounds are closed forms evaluated in floating point: a relative margin of 1e-9 on
    # delta (as the Gaussian's own bracket, _gaussian_result) keeps them below the exact values.
    margin = math.log1p(-1e-9)
    if target_delta is None:
        eps = np.asarray(target_epsilon, np.float64)
        # The upper end widens its margin where the closed form's rounding error is larger
        # (small mu, deep tails: up to ~1e-8 relative), as the Gaussian's own bracket does.
        _, upper = host_gaussian_delta_and_upper(eps, mu)
        d_sum = np.asarray(gaussian_delta(eps, mu_sum), np.float64) * (1 - 1e-9)
        lower = np.minimum(np.maximum(np.exp(_closed_lower_log_delta(eps, noise_multiplier, blocks) + margin),
                                      d_sum), upper)
        return upper, lower
    deltas = np.asarray(target_delta, np.float64)
    upper, _ = exact_epsilon(deltas, mu)
    upper = np.asarray(upper, np.float64)
    _, lower_sum = exact_epsilon(deltas, mu_sum)
    lower_sum = np.minimum(np.asarray(lower_sum, np.float64), upper)
    log_t = np.log(deltas)

    def above(x):
        return _closed_lower_log_delta(x, noise_multiplier, blocks) + margin > log_t

    # Largest epsilon found (bisection on [0, upper]) where the lower curve is above the target:
    # the true epsilon lies above it (delta is non-increasing in epsilon).
    lo = np.zeros_like(upper)
    ok0 = above(lo)
    if not np.any(ok0):
        return upper, lower_sum
    hi = np.where(np.isfinite(upper), upper, 1e4)
    lo = _CLOSED_LOWER_BISECTION.solve_array(above, lo, hi, check_ends=False).root
    lower = np.where(ok0, np.minimum(lo, upper), 0.0)
    return upper, np.maximum(lower, lower_sum)


#: 60 halvings of ``[0, upper]``; the lower end (the lower curve still above the target) is kept.
_CLOSED_LOWER_BISECTION = HostBisection(safe="lower", max_halvings=60)


def _reports(plan: AllocationPlan, comp: A.Composed, up, lo) -> tuple:
    comp = A.ordinary(comp)
    out = []
    for i, d in enumerate(DIRECTIONS):
        u = np.where(np.isnan(up[i]), np.inf, up[i])
        l = np.where(np.isnan(lo[i]), 0.0, lo[i])
        out.append(DirectionReport(
            direction=d, upper=scalar(u), lower=scalar(l), n=int(plan.shape.n_comp), dx=float(plan.dx),
            p_inf=float(comp.p_inf[i]), tail_above=float(comp.tail_above[i]), tail_below=float(comp.tail_below[2 + i]),
            roundoff=0.0, truncation_budget=float(plan.tau * sum(plan.counts)), noise_floor=float(comp.noise_floor[i])))
    return tuple(out)


def _validate_allocation(noise_multiplier, batches_per_epoch, epochs, selections_per_epoch):
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    if sigma.ndim != 0:
        raise ValueError(f"noise_multiplier must be a scalar > 0 for random allocation, got shape {sigma.shape}")
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    k = _validate.positive_int("selections_per_epoch", selections_per_epoch, maximum=t)
    E = _validate.positive_int("epochs", epochs)
    if not SIGMA_RANGE[0] <= float(sigma) <= SIGMA_RANGE[1]:
        raise ValueError(f"noise_multiplier must be in [{SIGMA_RANGE[0]:g}, {SIGMA_RANGE[1]:g}] for random allocation "
                         f"accounting, got {float(sigma)!r}")
    return float(sigma), t, k, E


@host_only("dpjax.pld.allocation.accountant.allocation_epsilon_fn / delta_fn on a plan from plan_allocation")
@float64
def allocation_accounting(noise_multiplier, batches_per_epoch, epochs, target_delta=None, target_epsilon=None, *,
                          selections_per_epoch: int = 1, options: AllocationOptions | None = None):
    """DP-SGD under random allocation: :class:`~dpjax.pld.EpsilonResult` or
    :class:`~dpjax.pld.DeltaResult` (certified upper end and certified lower end, add/remove).

    Args:
      noise_multiplier: sigma > 0 (noise standard deviation / clip norm), a scalar.
      batches_per_epoch: steps per epoch ``t >= 1``.
      epochs: ``E >= 1``.
      target_delta / target_epsilon: exactly one (scalar or 1-D array).
      selections_per_epoch: ``k`` in ``[1, t]``: steps each example takes part in per epoch.
      options: :class:`AllocationOptions`.
    """
    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    sigma, t, k, E = _validate_allocation(noise_multiplier, batches_per_epoch, epochs, selections_per_epoch)
    target_delta, target_epsilon = _validated_query(options, target_delta, target_epsilon)
    return _allocation_result(sigma, t, k, E, target_delta, target_epsilon, options)


def _validated_query(options, target_delta, target_epsilon):
    """``(target_delta, target_epsilon)`` validated (the one given), and ``options`` checked."""
    if options is not None and not isinstance(options, AllocationOptions):
        raise ValueError(f"options must be a dpjax.pld.allocation.accountant.AllocationOptions, got {options!r}")
    if target_delta is not None:
        return _validate.probability_open("target_delta", target_delta), None
    return None, _validate.nonnegative("target_epsilon", target_epsilon)


def _allocation_result(sigma, t, k, E, target_delta, target_epsilon, options, mu=None):
    blocks = allocation_blocks(t, k, E)
    if all(tb == 1 for tb, _ in blocks):
        # Every step selected: the run is E t Gaussian steps, exactly one Gaussian mechanism.
        return _gaussian_result(math.sqrt(E * t) / sigma, target_delta, target_epsilon)
    return _account_result(sigma, blocks, target_delta, target_epsilon, options, mu)


def _account_result(sigma, blocks, target_delta, target_epsilon, options, mu=None):
    """The result of :func:`allocation_accounting` for ``blocks`` (docs/design.md §12.7): the
    lattice bracket, its upper end capped by the unamplified Gaussian (``mu``, by default
    :func:`unamplified_mu`) and its lower end raised to the closed-form one; where the lattice
    cannot run (:func:`lattice_fits`), the closed-form bracket alone."""
    cap_up, cap_lo = closed_form_bracket(sigma, blocks, target_delta, target_epsilon, mu=mu)
    if not lattice_fits(sigma, blocks, target_delta=target_delta, options=options):
        if target_delta is not None:
            return exact_epsilon_result(np.asarray(target_delta, np.float64), cap_up, cap_lo)
        return exact_delta_result(np.asarray(target_epsilon, np.float64), cap_up, cap_lo)
    plan, comp = account_blocks(sigma, blocks, target_delta=target_delta, target_epsilon=target_epsilon, options=options,
                                lower_hint=cap_lo if target_delta is not None else 0.0)
    query = A.eps_of if target_delta is not None else A.delta_of
    worst = np.inf if target_delta is not None else 1.0
    with np.errstate(all="ignore"):
        vals = np.asarray(query(A.NUMPY, comp, np.asarray(target_delta if target_delta is not None
                                                             else target_epsilon, np.float64)))
    up = np.minimum(np.where(np.isnan(vals[:2]), worst, vals[:2]), cap_up)
    lo = np.where(np.isnan(vals[2:]), 0.0, vals[2:])
    # The closed-form lower end bounds the remove direction.
    lo = np.stack([np.maximum(lo[0], cap_lo), lo[1]])
    upper = up.max(0)
    lower = np.minimum(lo.max(0), upper)
    if target_delta is not None:
        return EpsilonResult(epsilon=scalar(upper), epsilon_lower=scalar(lower), epsilon_upper=scalar(upper),
                             target_delta=scalar(target_delta), directions=_reports(plan, comp, up, lo))
    return DeltaResult(delta=scalar(upper), delta_lower=scalar(lower), delta_upper=scalar(upper),
                       target_epsilon=scalar(target_epsilon), directions=_reports(plan, comp, up, lo))


def allocation_epsilon(noise_multiplier, batches_per_epoch, epochs, target_delta, *, selections_per_epoch: int = 1,
                       options: AllocationOptions | None = None):
    """Certified epsilon of DP-SGD under random allocation (see :func:`allocation_accounting`)."""
    return allocation_accounting(noise_multiplier, batches_per_epoch, epochs, target_delta=target_delta,
                                 selections_per_epoch=selections_per_epoch, options=options).epsilon


def allocation_delta(noise_multiplier, batches_per_epoch, epochs, target_epsilon, *, selections_per_epoch: int = 1,
                     options: AllocationOptions | None = None):
    """Certified delta of DP-SGD under random allocation at ``target_epsilon`` (>= 0)."""
    return allocation_accounting(noise_multiplier, batches_per_epoch, epochs, target_epsilon=target_epsilon,
                                 selections_per_epoch=selections_per_epoch, options=options).delta


@host_only("dpjax.pld.allocation.accountant.allocation_epsilon_fn / delta_fn on a plan from plan_allocation")
@float64
def balls_in_bins_accounting(noise_multiplier, batches_per_epoch, epochs, target_delta=None, target_epsilon=None, *,
                             options: AllocationOptions | None = None):
    """DP-SGD (correlation matrix ``C = I``) under balls-in-bins batching: 1-of-``b`` random
    allocation of a Gaussian with noise multiplier ``sigma / sqrt(epochs)``, one epoch."""
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    E = _validate.positive_int("epochs", epochs)
    if sigma.ndim != 0:
        raise ValueError(f"noise_multiplier must be a scalar > 0 for balls-in-bins, got shape {sigma.shape}")
    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    if not SIGMA_RANGE[0] <= float(sigma) / math.sqrt(E) <= SIGMA_RANGE[1]:
        raise ValueError(f"noise_multiplier / sqrt(epochs) must be in [{SIGMA_RANGE[0]:g}, {SIGMA_RANGE[1]:g}] for "
                         f"balls-in-bins accounting, got {float(sigma)!r} / sqrt({E})")
    s_eff, b, _, _ = _validate_allocation(float(sigma) / math.sqrt(E), batches_per_epoch, 1, 1)
    target_delta, target_epsilon = _validated_query(options, target_delta, target_epsilon)
    # The unamplified Gaussian: E observations of one bin, mu = sqrt(E) / sigma.
    return _allocation_result(s_eff, b, 1, 1, target_delta, target_epsilon, options, mu=math.sqrt(E) / float(sigma))


def balls_in_bins_epsilon(noise_multiplier, batches_per_epoch, epochs, target_delta, *, options=None):
    """Certified epsilon of DP-SGD (``C = I``) under balls-in-bins batching."""
    return balls_in_bins_accounting(noise_multiplier, batches_per_epoch, epochs, target_delta=target_delta,
                                    options=options).epsilon


def balls_in_bins_delta(noise_multiplier, batches_per_epoch, epochs, target_epsilon, *, options=None):
    """Certified delta of DP-SGD (``C = I``) under balls-in-bins batching at ``target_epsilon``."""
    return balls_in_bins_accounting(noise_multiplier, batches_per_epoch, epochs, target_epsilon=target_epsilon,
                                    options=options).delta


# ------------------------------------------------------------------------------------------
# Jittable evaluation on a fixed plan


def _frozen(plan: AllocationPlan, sigma: float) -> list:
    """The plan's discretization (bands, lattice windows, grid offsets) at ``sigma``, per block."""
    frozen = []
    for sb, tb in zip(plan.sigmas(sigma), plan.block_steps):
        geo = A.band_geometry(A.NUMPY, sb, tb, plan.tau, levels=plan.shape.levels, n=plan.shape.n,
                              m=plan.shape.m, room=plan.room)
        with np.errstate(all="ignore"):
            pm = A.epoch_pmfs(A.NUMPY, sb, tb, plan.tau, plan.dx, levels=plan.shape.levels, n=plan.shape.n,
                              m=plan.shape.m, N=plan.shape.N, room=plan.room, geometry=geo)
        frozen.append((geo, int(pm.offsets[0])))
    return frozen


def plan_partials(plan: AllocationPlan, noise_multiplier, target, *, query: Query | str = Query.EPSILON,
                  bound: str = "upper", rel_step: float = 1e-5):
    """``(d value / d sigma, d value / d target)`` of ``eps(target = delta)`` (``query="epsilon"``)
    or ``delta(target = eps)`` on ``plan`` (host; ``target`` any shape; see :func:`epsilon_partials`)."""
    query = Query.parse(query, "query")
    sigma = float(noise_multiplier)
    target = np.asarray(target, np.float64)
    frozen = _frozen(plan, sigma)
    rows = slice(0, 2) if bound == "upper" else slice(2, 4)
    conv = A.eps_of if query == Query.EPSILON else A.delta_of

    def comp_at(s_):
        return A.run(A.NUMPY, plan.sigmas(s_), list(plan.block_steps), np.asarray(plan.counts, np.float64), plan.tau,
                     plan.dx, plan.log_tau, plan.shape, room=plan.room, frozen=frozen, tilt=plan.tilt,
                     tilt_from=plan.tilt_from)

    def value(comp, x):
        with np.errstate(all="ignore"):
            return np.max(np.asarray(conv(A.NUMPY, comp, x))[rows], axis=0)

    h = rel_step * sigma
    d_sigma = (value(comp_at(sigma + h), target) - value(comp_at(sigma - h), target)) / (2.0 * h)
    comp = comp_at(sigma)
    ht = rel_step * np.maximum(np.abs(target), 1e-12)
    d_target = (value(comp, target + ht) - value(comp, np.maximum(target - ht, 0.0))) / (
        target + ht - np.maximum(target - ht, 0.0))
    return d_sigma, d_target


def epsilon_partials(plan: AllocationPlan, noise_multiplier: float, target_delta, *, bound: str = "upper",
                     rel_step: float = 1e-5):
    """``(d eps / d sigma, d eps / d delta)`` of the certified epsilon on ``plan`` (host).

    The bound is a smooth function of ``sigma`` once its discretization (bands, lattice windows,
    grid offsets) is held fixed at ``noise_multiplier``: central differences of that function
    (relative step ``rel_step``; its error is ``O(rel_step^2)`` and the round-off of the values,
    ~1e-12 / rel_step).  The ``delta`` partial is the difference quotient of the closed-form
    per-segment conversion on the same composition."""
    return plan_partials(plan, noise_multiplier, target_delta, query=Query.EPSILON, bound=bound, rel_step=rel_step)


def _rows(plan: AllocationPlan, noise_multiplier):
    import jax.numpy as jnp

    ops = A.jax_ops()
    scale = noise_multiplier / plan.noise_multiplier
    sig = [b * scale for b in plan.sigmas()]
    return A.run(ops, sig, list(plan.block_steps), jnp.asarray(plan.counts, jnp.float64), plan.tau,
                 plan.dx, plan.log_tau, plan.shape, room=plan.room, tilt=plan.tilt, tilt_from=plan.tilt_from)


def _with_host_derivative(query: Query):
    """The JAX value of ``query`` on a plan, with its derivatives from :func:`plan_partials` (a host
    callback): the discretized bound is differentiated at a fixed discretization without
    differentiating (and compiling the transpose of) the whole lattice program."""
    import functools

    import jax
    import jax.numpy as jnp

    def value(plan, bound, target, sigma):
        comp = _rows(plan, sigma)
        conv = A.eps_of if query == Query.EPSILON else A.delta_of
        vals = conv(A.jax_ops(), comp, target)
        return jnp.max(vals[:2] if bound == "upper" else vals[2:], axis=0)

    @functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
    def f(plan, bound, target, sigma):
        return value(plan, bound, target, sigma)

    @f.defjvp
    def f_jvp(plan, bound, primals, tangents):
        target, sigma = primals
        dt, ds = tangents
        out = f(plan, bound, target, sigma)

        def host(tg, sg):
            with ieee_arithmetic():  # XLA's callback thread flushes subnormals
                a, b = plan_partials(plan, float(sg), np.asarray(tg), query=query, bound=bound)
            return np.asarray(a, np.float64).reshape(np.shape(tg)), np.asarray(b, np.float64).reshape(np.shape(tg))

        spec = jax.ShapeDtypeStruct(jnp.shape(target), jnp.float64)
        p_sigma, p_target = jax.pure_callback(host, (spec, spec), target, sigma, vmap_method="sequential")
        return out, p_sigma * ds + p_target * dt

    return f


_EPS_FN = None
_DELTA_FN = None


def _bound_side(*, bound: str, **_) -> str:
    """The safe rounding side of the call's ``bound`` for a float32 caller's value: up for the
    certified upper bound, down for the lower one."""
    return "up" if bound == "upper" else "down"


@float64(rounding=_bound_side)
def allocation_epsilon_fn(plan: AllocationPlan, target_delta, noise_multiplier, bound: str = "upper"):
    """Epsilon at ``target_delta`` on a fixed plan, as a JAX function of ``noise_multiplier`` (and
    ``target_delta``): ``jit`` and ``vmap`` run the lattice program in JAX; any noise multiplier
    gives a sound bound, tight near ``plan.noise_multiplier`` and above.  ``grad`` gives the
    derivative of the bound at its discretization (:func:`epsilon_partials`, on the host through
    ``jax.pure_callback``).  ``bound``: ``"upper"`` (certified) or ``"lower"``."""
    import jax.numpy as jnp

    global _EPS_FN
    if _EPS_FN is None:
        _EPS_FN = _with_host_derivative(Query.EPSILON)
    return _EPS_FN(plan, bound, jnp.asarray(target_delta, jnp.float64), jnp.asarray(noise_multiplier, jnp.float64))


@float64(rounding=_bound_side)
def delta_fn(plan: AllocationPlan, target_epsilon, noise_multiplier, bound: str = "upper"):
    """Delta at ``target_epsilon`` on a fixed plan, as a JAX function of ``noise_multiplier`` (as
    :func:`allocation_epsilon_fn`)."""
    import jax.numpy as jnp

    global _DELTA_FN
    if _DELTA_FN is None:
        _DELTA_FN = _with_host_derivative(Query.DELTA)
    return _DELTA_FN(plan, bound, jnp.asarray(target_epsilon, jnp.float64), jnp.asarray(noise_multiplier, jnp.float64))


# ------------------------------------------------------------------------------------------
# Calibration


#: Relative width of the final bracket of the noise-multiplier search (the returned sigma is the
#: bracket's feasible end: at most this far above the smallest sigma meeting the target).
CALIBRATION_TOLERANCE = 1e-4


#: The noise multipliers the accountant accepts (see :func:`allocation_accounting`).
SIGMA_RANGE = (1e-3, 1e4)


def _gaussian_sigma(scale: float, target_epsilon: float, target_delta: float) -> float:
    """Smallest ``sigma`` whose Gaussian with ``mu = scale / sigma`` has delta at most
    ``target_delta`` at ``target_epsilon`` (host bisection in ``log sigma``: delta increases
    with ``mu``)."""
    from dpjax.numerics.exact import np_gaussian_log_delta

    log_t = math.log(target_delta)

    def ok(sig):
        return float(np_gaussian_log_delta(target_epsilon, scale / sig)) <= log_t

    sol = _GAUSSIAN_SIGMA_BISECTION.solve(ok, 1e-6, 1e8)
    if sol.status == SolverStatus.UNREACHABLE:
        return math.inf
    return sol.root  # MET_AT_BRACKET_END: the bottom, 1e-6, meets the target already


#: ``log sigma`` halved until ``hi <= lo (1 + 1e-12)`` (45 halvings of ``[1e-6, 1e8]``); the upper
#: end (delta at most the target there) is kept.
_GAUSSIAN_SIGMA_BISECTION = HostBisection(safe="upper", scale="log", rtol=1e-12, max_halvings=200)


def _search_sigma(f, target: float, guess: float, hi: float, tol: float = CALIBRATION_TOLERANCE,
                  sigma_range=SIGMA_RANGE):
    """Smallest sigma with ``f(sigma) <= target`` for a (nearly) decreasing ``f`` (host, certified
    ends), given a feasible ``hi`` (``f(hi) <= target``): returns ``(sigma_hi, sigma_lo,
    f(sigma_hi))`` with ``f(sigma_hi) <= target`` and either ``f(sigma_lo) > target`` with
    ``sigma_hi <= sigma_lo (1 + tol)``, or ``sigma_hi`` the bottom of ``sigma_range``
    (``sigma_lo`` 0: everything in the range meets the target).  Secant steps in ``(log sigma,
    log f)`` (nearly linear), bisection when a step does not shrink the bracket enough."""
    f_hi = f(hi)
    lo, f_lo = None, None
    s = min(max(guess, sigma_range[0]), hi)
    # From the guess: up by doubling while the target is missed (the top is feasible), or down
    # by halving until it is missed (or the range ends).
    v = f(s)
    if v > target:
        lo, f_lo = s, v
        while 2.0 * lo < hi:
            v = f(2.0 * lo)
            if v <= target:
                hi, f_hi = 2.0 * lo, v
                break
            lo, f_lo = 2.0 * lo, v
    else:
        hi, f_hi = s, v
        s = s / 2.0
    while lo is None and sigma_range[0] <= s < hi:
        v = f(s)
        if v > target:
            lo, f_lo = s, v
            break
        hi, f_hi = s, v
        s = s / 2.0
    while lo is None:
        if hi <= sigma_range[0]:
            return hi, 0.0, f_hi
        s = max(hi / 2.0, sigma_range[0])
        v = f(s)
        if v > target:
            lo, f_lo = s, v
        else:
            hi, f_hi = s, v
    for _ in range(80):
        if hi <= lo * (1.0 + tol):
            break
        ll, lh = math.log(lo), math.log(hi)
        if math.isfinite(f_lo) and f_lo > 0 and f_hi > 0 and f_lo != f_hi:
            a, b = math.log(f_lo), math.log(f_hi)
            x = ll + (math.log(target) - a) * (lh - ll) / (b - a)
        else:
            x = 0.5 * (ll + lh)
        # keep the probe well inside the bracket (and bisect when the bracket is already small)
        x = min(max(x, ll + 0.02 * (lh - ll)), lh - 0.02 * (lh - ll))
        s = math.exp(x)
        v = f(s)
        if v <= target:
            shrink = (math.log(hi) - x) / (lh - ll)
            hi, f_hi = s, v
        else:
            shrink = (x - math.log(lo)) / (lh - ll)
            lo, f_lo = s, v
        if shrink < 0.5 and hi > lo * (1.0 + tol):
            s = math.sqrt(lo * hi)
            v = f(s)
            if v <= target:
                hi, f_hi = s, v
            else:
                lo, f_lo = s, v
    return hi, lo, f_hi


@host_only("dpjax.pld.allocation.accountant.allocation_epsilon_fn on a plan from plan_allocation")
def allocation_noise_multiplier(target_epsilon, target_delta, batches_per_epoch, epochs, *,
                                selections_per_epoch: int = 1, balls_in_bins: bool = False,
                                options: AllocationOptions | None = None) -> float:
    """Smallest noise multiplier whose certified epsilon (random allocation, or balls-in-bins with
    ``balls_in_bins=True``) is at most ``target_epsilon`` at ``target_delta``.

    The search runs on the certified upper bound itself (one accountant call per probe); the
    returned sigma meets the target on it and lies within :data:`CALIBRATION_TOLERANCE` (relative)
    of a sigma that does not.  Its top is the sigma at which the unamplified Gaussian (``mu =
    sqrt(k E) / sigma``; balls-in-bins ``sqrt(E) / sigma``) meets the target, which the accountant's
    epsilon never exceeds, so a sigma is found whenever one in :data:`SIGMA_RANGE` (balls-in-bins:
    ``sqrt(E)`` times it, as ``sigma / sqrt(E)`` is accounted) meets it (the bottom of the range
    where every sigma in it does).  For gradients:
    :func:`dpjax.dpsgd_noise_multiplier` with ``sampling="random_allocation"`` under ``jax.grad``
    (the implicit derivative, :func:`dpjax.pld.allocation.dpsgd.noise_multiplier`).
    """
    eps_t = float(_validate.positive("target_epsilon", target_epsilon))
    delta = float(_validate.probability_open("target_delta", target_delta))
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    k = _validate.positive_int("selections_per_epoch", selections_per_epoch, maximum=t)
    E = _validate.positive_int("epochs", epochs)

    cache = {}

    def g(sigma):
        if sigma not in cache:
            cache[sigma] = float(balls_in_bins_epsilon(sigma, t, E, delta, options=options) if balls_in_bins else
                                 allocation_epsilon(sigma, t, E, delta, selections_per_epoch=k, options=options))
        return cache[sigma]

    scale = math.sqrt(E) if balls_in_bins else math.sqrt(E * k)
    # Balls-in-bins accounts sigma / sqrt(E): its accepted range is the accountant's times sqrt(E).
    rng = tuple(r * math.sqrt(E) for r in SIGMA_RANGE) if balls_in_bins else SIGMA_RANGE
    # The unamplified Gaussian's sigma certifies (the accountant's upper end is capped by it);
    # nudged up past the closed form's own rounding margin where needed.
    hi = _gaussian_sigma(scale, eps_t, delta)
    if hi > rng[1]:
        hi = rng[1]
        if g(hi) > eps_t:
            raise ValueError(f"target_epsilon {eps_t!r} at target_delta {delta!r} needs a noise multiplier above "
                             f"{rng[1]:g}, the largest the accountant accepts here")
    hi = max(hi, rng[0])
    for _ in range(8):
        if g(hi) <= eps_t:
            break
        hi *= 1.0 + 1e-9
    # Start at the mu-GDP scale of E k steps of Gaussian noise thinned by k / t.
    guess = max(rng[0], min(hi, math.sqrt(E * k) / max(eps_t, 1e-3) * math.sqrt(k / t) + 0.5))
    found, _, _ = _search_sigma(g, eps_t, guess, hi, sigma_range=rng)
    return found


# ------------------------------------------------------------------------------------------
# Epsilon after every epoch, and sweeps


@host_only("dpjax.pld.allocation.accountant.allocation_epsilon_fn on a plan from plan_allocation")
def allocation_epsilon_curve(noise_multiplier, batches_per_epoch, epochs, target_delta, *,
                             selections_per_epoch: int = 1, balls_in_bins: bool = False,
                             options: AllocationOptions | None = None):
    """Certified epsilon after each number of epochs in ``epochs`` (an integer ``E``: every epoch
    ``1..E``; or a 1-D sequence), from one set of epoch PMFs: the plan is made for the largest
    number of epochs and every entry is composed from the same per-epoch PMFs (each a certified
    bracket; docs/design.md §12.3).  Balls-in-bins (``C = I``) has no per-epoch structure to
    reuse (its one allocation has noise ``sigma / sqrt(E)``): each entry is its own call.

    Returns :class:`dpjax.pld.EpsilonCurve` with ``steps`` = steps after each entry
    (``E batches_per_epoch``).
    """
    from dpjax.pld.records import EpsilonCurve

    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    k = _validate.positive_int("selections_per_epoch", selections_per_epoch, maximum=t)
    delta = float(_validate.probability_open("target_delta", target_delta))
    e_arr = np.atleast_1d(np.asarray(epochs, dtype=object))
    if e_arr.ndim != 1 or e_arr.size == 0:
        raise ValueError(f"epochs must be an integer >= 1 or a non-empty 1-D sequence of them, got {epochs!r}")
    if e_arr.size == 1 and np.ndim(epochs) == 0:
        e_list = np.arange(1, _validate.positive_int("epochs", epochs) + 1)
    else:
        e_list = np.asarray([_validate.positive_int("epochs", e) for e in e_arr], np.int64)
    up, lo = np.empty(len(e_list)), np.empty(len(e_list))
    if balls_in_bins or all(tb == 1 for tb, _ in allocation_blocks(t, k, 1)):
        for i, e in enumerate(e_list):
            r = (balls_in_bins_accounting(sigma, t, int(e), target_delta=delta, options=options) if balls_in_bins
                 else allocation_accounting(sigma, t, int(e), target_delta=delta, selections_per_epoch=k,
                                            options=options))
            up[i], lo[i] = float(r.epsilon), float(r.epsilon_lower)
        return EpsilonCurve(steps=e_list * t, epsilon=up, epsilon_lower=lo, epsilon_upper=up.copy(),
                            target_delta=delta, n=0, dx=0.0, recomputed=np.ones(len(e_list), bool))
    e_max = int(e_list.max())
    options = options or AllocationOptions()
    for coarse in (True, False):
        # The plan of the last entry is the call's; where it is the coarse lattice and an earlier
        # entry's bracket is wider than the coarse run keeps, the curve runs on the full one.
        plan, _ = account_blocks(sigma, allocation_blocks(t, k, e_max), target_delta=delta, options=options,
                                 coarse=coarse)
        with np.errstate(all="ignore"):
            stack = A.epoch_stack(A.NUMPY, plan.sigmas(), list(plan.block_steps), plan.tau, plan.dx, plan.shape,
                                  plan.room)
            per_epoch = np.asarray([b[1] for b in allocation_blocks(t, k, 1)], np.float64)
            for i, e in enumerate(e_list):
                comp = A.compose_epochs(A.NUMPY, stack, per_epoch * int(e), plan.dx, plan.log_tau,
                                        n_comp=plan.shape.n_comp)
                choice = A.choose_tilt(stack, per_epoch * int(e), plan.dx, comp, target_delta=delta)
                if choice is not None:
                    comp = A.Pair(comp, A.compose_tilted(A.NUMPY, stack, per_epoch * int(e), plan.dx, plan.log_tau,
                                                         n_comp=plan.shape.n_comp, tilt=choice[0],
                                                         tilt_from=choice[1]))
                v = np.asarray(A.eps_of(A.NUMPY, comp, np.asarray(delta)))
                up[i] = float(np.max(np.where(np.isnan(v[:2]), np.inf, v[:2])))
                lo[i] = min(float(np.max(np.where(np.isnan(v[2:]), 0.0, v[2:]))), up[i])
        full = plan.shape.n >= _lattice_window(options, max(plan.block_steps))
        if full or np.all(np.isfinite(up) & (up - lo <= options.coarse_width * np.maximum(up, 0.02))):
            break
    return EpsilonCurve(steps=e_list * t, epsilon=up, epsilon_lower=lo, epsilon_upper=up.copy(), target_delta=delta,
                        n=int(plan.shape.n_comp), dx=float(plan.dx), recomputed=np.zeros(len(e_list), bool))


#: Columns of a random-allocation / balls-in-bins sweep row (CSV header).
SWEEP_ROW_FIELDS = ("index", "sampling", "noise_multiplier", "batches_per_epoch", "selections_per_epoch", "epochs",
                    "target_delta", "target_epsilon", "query", "epsilon", "delta", "lower", "upper", "grid", "n", "dx",
                    "path")


#: The keys of :func:`allocation_sweep`'s ``grid`` (each a value or a sequence of values).
SWEEP_GRID_KEYS = ("sampling", "noise_multiplier", "batches_per_epoch", "selections_per_epoch", "epochs", "delta",
                   "epsilon")


def _sweep_configs(configs, grid) -> list[dict]:
    import itertools

    grid = {} if grid is None else dict(grid)
    extra = set(grid) - set(SWEEP_GRID_KEYS)
    if extra:
        raise ValueError(f"unknown grid key(s) {sorted(extra)}; allowed: {list(SWEEP_GRID_KEYS)}")
    sampling = grid.pop("sampling", "random_allocation")
    grid = dict(dict.fromkeys(SWEEP_GRID_KEYS[1:]), selections_per_epoch=1) | grid

    def as_list(name, v):
        if v is None:
            return [None]
        a = np.atleast_1d(np.asarray(v, dtype=object))
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"{name} must be a number or a non-empty 1-D sequence, got {v!r}")
        return list(a)

    if configs is None:
        if grid["noise_multiplier"] is None or grid["batches_per_epoch"] is None or grid["epochs"] is None:
            raise ValueError(f"sampling={sampling!r} needs noise_multiplier, batches_per_epoch and epochs (or configs)")
        if (grid["delta"] is None) == (grid["epsilon"] is None):
            raise ValueError("give exactly one of delta and epsilon")
        keys = ("noise_multiplier", "batches_per_epoch", "selections_per_epoch", "epochs", "delta", "epsilon")
        configs = [dict(zip(keys, vals)) for vals in itertools.product(*(as_list(k, grid[k]) for k in keys))]
    out = []
    for c in configs:
        if not isinstance(c, dict):
            raise ValueError(f"a configuration must be a mapping, got {c!r}")
        allowed = {"noise_multiplier", "batches_per_epoch", "selections_per_epoch", "epochs", "delta", "epsilon",
                   "target_delta", "target_epsilon", "sampling"}
        extra = set(c) - allowed
        if extra:
            raise ValueError(f"unknown configuration field(s) {sorted(extra)}; allowed: {sorted(allowed)}")
        samp = c.get("sampling", sampling)
        if samp not in ("random_allocation", "balls_in_bins"):
            raise ValueError(f"sampling must be 'random_allocation' or 'balls_in_bins' here, got {samp!r}")
        d, e = c.get("delta", c.get("target_delta")), c.get("epsilon", c.get("target_epsilon"))
        if (d is None) == (e is None):
            raise ValueError(f"each configuration needs exactly one of delta and epsilon, got {c!r}")
        t = _validate.positive_int("batches_per_epoch", c.get("batches_per_epoch"))
        out.append(dict(sampling=samp, noise_multiplier=float(_validate.positive("noise_multiplier",
                                                                                 c.get("noise_multiplier"))),
                        batches_per_epoch=t,
                        selections_per_epoch=_validate.positive_int("selections_per_epoch",
                                                                    c.get("selections_per_epoch") or 1, maximum=t),
                        epochs=_validate.positive_int("epochs", c.get("epochs")),
                        delta=None if d is None else float(_validate.probability_open("delta", d)),
                        epsilon=None if e is None else float(_validate.nonnegative("epsilon", e))))
    if not out:
        raise ValueError("configs must not be empty")
    return out


def allocation_sweep(configs=None, *, grid=None, out=None, resume: bool = False, with_lower: bool = True,
                     progress=None):
    """Certified epsilon (or delta) of every random-allocation / balls-in-bins configuration, one
    row each (:data:`SWEEP_ROW_FIELDS`), each exactly the single call's value (the row's ``grid``
    field ``"accountant"``; ``"closed_form"`` where every step is selected: the exact Gaussian).

    Args:
      configs: mappings with the configuration fields (``sampling``, ``noise_multiplier``,
        ``batches_per_epoch``, ``selections_per_epoch``, ``epochs``) and ``target_delta`` /
        ``target_epsilon`` (``delta`` / ``epsilon`` read too).
      grid: without ``configs``, the configurations are the Cartesian product of this mapping of
        :data:`SWEEP_GRID_KEYS` to a value or a sequence of values (``noise_multiplier``,
        ``batches_per_epoch``, ``epochs`` and one of ``delta`` / ``epsilon`` needed;
        ``selections_per_epoch`` default 1).  Its ``sampling`` (default ``"random_allocation"``,
        or ``"balls_in_bins"``; one value) is also the scheme of a configuration that names none.
      out, resume: rows are journaled to ``out`` as computed and ``resume`` skips recorded ones
        (as :func:`dpjax.sweep`).
      with_lower: also the certified lower end of each bracket.
      progress: as :func:`dpjax.sweep`.

    Returns:
      :class:`dpjax.pld.SweepTable`.
    """
    import time

    from dpjax._base.progress import progress as progress_meter
    from dpjax.pld.records import SweepTable

    t0 = time.perf_counter()
    cfgs = _sweep_configs(configs, grid)
    if resume and out is None:
        raise ValueError("resume=True needs out (the file a previous run wrote)")
    store, rows = None, {}
    if out is not None:
        from dpjax.pld.sweeps.store import SweepStore

        store = SweepStore(out, SWEEP_ROW_FIELDS, resume=resume)
        for i, row in store.rows.items():
            c = cfgs[i] if i < len(cfgs) else None
            given = None if c is None else ("delta" if c["delta"] is not None else "epsilon")
            if c is None or row.get("sampling") != c["sampling"] or any(
                    _differs(row.get(f), c[f]) for f in ("noise_multiplier", "batches_per_epoch",
                                                         "selections_per_epoch", "epochs")) or _differs(
                    row.get("target_" + given, row.get(given)), c[given]):
                raise ValueError(f"{out} holds a row {i} that is not configuration {i} of this sweep")
            rows[i] = dict(row, path="resumed")
    with progress_meter(total=len(cfgs), desc="sweep", enabled=progress, initial=len(rows), unit="cfg") as bar:
        for i, c in enumerate(cfgs):
            if i in rows:
                continue
            target = dict(target_delta=c["delta"]) if c["delta"] is not None else dict(target_epsilon=c["epsilon"])
            if c["sampling"] == "balls_in_bins":
                res = balls_in_bins_accounting(c["noise_multiplier"], c["batches_per_epoch"], c["epochs"], **target)
            else:
                res = allocation_accounting(c["noise_multiplier"], c["batches_per_epoch"], c["epochs"],
                                            selections_per_epoch=c["selections_per_epoch"], **target)
            query = Query.EPSILON if c["delta"] is not None else Query.DELTA
            val = float(getattr(res, query))
            closed = int(res.directions[0].n) == 0      # every step selected: the exact Gaussian, no grid
            row = dict(index=i, sampling=c["sampling"], noise_multiplier=c["noise_multiplier"],
                       batches_per_epoch=c["batches_per_epoch"], selections_per_epoch=c["selections_per_epoch"],
                       epochs=c["epochs"], target_delta=c["delta"], target_epsilon=c["epsilon"], query=query,
                       epsilon=None, delta=None, lower=float(getattr(res, query + "_lower")) if with_lower else None,
                       upper=val, grid="closed_form" if closed else "accountant",
                       n=0 if closed else int(res.directions[0].n), dx=0.0 if closed else float(res.directions[0].dx),
                       path="single")
            row[query] = val
            rows[i] = row
            if store is not None:
                store.append([row])
            bar.update(1)
    table = SweepTable(rows=tuple(rows[i] for i in range(len(cfgs))), programs=0,
                       seconds=time.perf_counter() - t0, devices=1)
    if store is not None:
        store.finalize(table.rows)
    return table


def _differs(a, b) -> bool:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return not ((a is None or (isinstance(a, float) and math.isnan(a))) and b is None)
    if isinstance(b, str):
        return str(a) != b
    return float(a) != float(b)
