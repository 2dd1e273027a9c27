"""FFT composition of grid PMFs (Koskela & Honkela 2021, §4; docs/design.md §2), with certified wrap-around bounds.

Layout.  Mechanism ``k`` sits on indices ``i = 0..m_k-1`` of a length-``n`` array with loss
``(i + o_k) dx`` (``o_k`` an integer offset).  A circular convolution adds indices mod ``n``, so
the composition of ``c_k`` copies of every ``k`` is known mod ``n dx``: circular index ``j``
carries the mass of true indices ``J = j + O (mod n)`` with ``O = sum_k c_k o_k``.  We read it in
a window ``J in [w, w + n)`` placed over the bulk of the composed loss (chosen inside the jitted
program from the log-MGF, see below), i.e. ``window[t] = circ[(w + t - O) mod n]``.

Composition in Fourier space is ``F = prod_k rfft(pmf_k)^{c_k}``; the power is taken as
``exp(c_k (log|F_k| + i arg F_k))``, exact for integer ``c_k`` on the principal branch, with
modulus and phase accumulated as real arrays (no complex ``0 * inf``).

Wrap-around (Koskela & Honkela 2021, Thm 1, Chernoff form).  Mass of the composed (discretized) loss ``S``
outside the window is aliased into it.  With the log-MGF of the sub-probability PMF
``K_k(lam) = log sum_i pmf_k[i] e^{lam y_i}`` and ``K = sum_k c_k K_k``:

    P(S >= (w+n) dx)  <= exp(K(lam) - lam (w+n) dx),   lam > 0
    P(S <= (w-1) dx)  <= exp(K(lam) - lam (w-1) dx),   lam < 0

minimized over a few ``lam`` (any ``lam`` gives a valid bound; the planner picks them near the
Gaussian optimum).  Mass from above lands lower in the window (it may have been lost from
delta: ``tail_above`` is added to the upper bound); mass from below lands higher (it can only
inflate delta: ``tail_below`` is subtracted from the lower bound).

FFT round-off (not bounded rigorously by any FFT accountant; this is an allowance).  Errors of
the transforms show up as a noise floor, visible where the true mass is ~0 (negative bins);
errors of ``log F`` multiplied by ``c`` act like a relative perturbation ``~c u`` of the
characteristic function, i.e. of the PMF's shape.  The pessimistic PMF therefore gets
``nu = max(neg)`` added to every bin (every bin may carry the largest negative excursion seen;
applied per bin, so only the bins above epsilon enter delta -- the earlier ``n * max(neg)`` on
delta was ~2.7e-12 and made deltas below it uncertifiable), and the hockey-stick sums are inflated by ``roundoff_rel = 8 u (log2 n + sum c_k)``
(u = 2^-52).  The optimistic PMF gets ``max(nu, (2/n) roundoff_rel sum_k |F_k|)`` subtracted
from every bin: errors of the low-frequency coefficients (``|F_k| ~ 1``) spread over all bins
as an offset, and a *positive* offset shows no negative bin at all (it inflated delta_lower 300x
at delta 1e-17 before).  The a-priori normwise bound ``~u c sqrt(n) ||pmf||_2`` was tried first
for the upper bound: it is ~1e-10 at T = 1e5, far above the observed noise (~1e-20 per bin).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from dpjax.pld.discretize import materialize_once, grid_cdfs, grid_pmf
from dpjax.pld.mechanisms import Direction
from dpjax import _xla

UNIT_ROUNDOFF = 2.0**-52


class Group(NamedTuple):
    """Mechanisms of one kind, stacked along a leading axis of length ``G``.

    Attributes:
      mechanism: a mechanism pytree whose numeric leaves have shape ``(G,)``.
      counts: (G,) int64, how many times each is composed (0 for padding).
      offsets: (G,) int64, grid offset ``o_k`` of each (first point ``o_k * dx``).
    """

    mechanism: object
    counts: jax.Array
    offsets: jax.Array


class ComposedPLD(NamedTuple):
    """The composed PLD restricted to a window of ``n`` grid points.

    Attributes:
      pmf: (n,) P-masses at losses ``(w_lo + t) * dx``, ``t = 0..n-1`` (non-negative).
      w_lo: () int64 index of the first window point.
      dx: () grid spacing.
      p_inf: () P-mass at loss ``+inf`` (``1 - prod_k (1 - p_inf_k)^{c_k}``).
      tail_above: () bound on the mass at losses ``>= (w_lo + n) dx`` (wrapped into the window).
      tail_below: () bound on the mass at losses ``<= (w_lo - 1) dx`` (wrapped into the window).
      roundoff: () absolute FFT round-off allowance (see module docstring), frequency truncation
        bound included.
      roundoff_rel: () relative FFT round-off allowance on the hockey-stick sums.
      log_mgf: (L,) ``K(lam)`` of the composed sub-probability PMF at the candidate ``lam``.
      needed_width: () ``h - l`` of the Chernoff quantiles at the planner's tail level (a
        window narrower than this cannot meet the wrap-around budget).
      truncation: () the part of ``roundoff`` covering dropped frequencies (see ``compose``'s
        ``n_freq``; 0 when all are kept).
      noise_floor: () per-bin round-off allowance already applied to ``pmf`` (added to every
        bin of the pessimistic PMF, subtracted from every bin of the optimistic one; for a tilted
        composition, in the tilted domain).
      valid_from: () the upper delta curve is valid for ``eps >= valid_from`` only (``-inf``
        for an ordinary composition; the window bottom, or higher, for a tilted one, whose
        window does not hold the bulk of the loss; see :func:`compose_directions`).
    """

    pmf: jax.Array
    w_lo: jax.Array
    dx: jax.Array
    p_inf: jax.Array
    tail_above: jax.Array
    tail_below: jax.Array
    roundoff: jax.Array
    roundoff_rel: jax.Array
    log_mgf: jax.Array
    needed_width: jax.Array
    truncation: jax.Array = 0.0
    noise_floor: jax.Array = 0.0
    valid_from: jax.Array = -jnp.inf

    @property
    def losses(self) -> jax.Array:
        """(n,) the loss value of each window bin."""
        return (self.w_lo + jnp.arange(self.pmf.shape[-1])) * self.dx


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Composition:
    """What :func:`compose` / :func:`compose_directions` return: one :class:`ComposedPLD` per
    requested discretization (``None`` where not requested).

    Attributes:
      up: the pessimistic (connect-the-dots, dominating) composition; its
        :func:`~dpjax.pld.convert.table` with ``Bound.UPPER`` gives certified upper bounds.
      down: the optimistic (round-down) composition, for ``Bound.LOWER``.
    """

    up: ComposedPLD | None = None
    down: ComposedPLD | None = None


#: The discretizations :func:`compose` can run: "up" (pessimistic), "down" (optimistic).
KINDS = ("up", "down")


def lattice_length(m: int) -> int:
    """Lattice points of a shared two-direction CDF evaluation for supports of ``m`` points."""
    return m + max(m // 8, 64)


def lattice_groups(groups_by_direction, directions, dx, ms) -> tuple[bool, ...] | None:
    """``compose_directions``'s static ``lattice`` for a concrete plan: per group, whether one
    lattice serves both directions (None when no group qualifies or the plan is traced)."""
    if tuple(str(d) for d in directions) != ("remove", "add"):
        return None
    try:
        dx = float(dx)
        flags = []
        for gi, m in enumerate(ms):
            mech = groups_by_direction[0][gi].mechanism
            fits = getattr(mech, "lattice_fits", None)
            flags.append(bool(fits is not None and fits(groups_by_direction[0][gi].offsets,
                                                        groups_by_direction[1][gi].offsets, dx, m,
                                                        lattice_length(m))))
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None
    return tuple(flags) if any(flags) else None


def _check_kinds(kinds) -> tuple[str, ...]:
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must be a non-empty tuple of distinct values from {KINDS}, got {kinds!r}")
    return kinds


# Block length of the log-MGF evaluation (see ``pmf_log_mgf``; the largest of these dividing m).
_MGF_BLOCKS = (64, 32, 16)


def pmf_log_mgf(pmf, y, lambdas):
    """``K(lam) = log sum_i pmf_i e^{lam y_i}`` for every ``lam`` in one pass (``y`` a grid).

    The sum is split by blocks of ``b = 64`` (or 32, 16) consecutive grid points, ``y_i = y_b + j dx``:
    ``sum_b e^{lam (y_b - ref)} S_b(lam)`` with ``S_b(lam) = sum_j pmf_{b,j} e^{lam j dx}`` (a
    matrix product with ``b`` shared exponentials), so only ``m / b`` exponentials per ``lam`` are
    taken instead of ``m`` (the elementwise exponentials were the costliest part of it).  ``ref``
    is the PMF's mean (keeps exponents in range).  Overflow gives ``K = inf`` (a trivial, sound
    bound), and so does a ``lam`` whose shared exponentials ``e^{lam j dx}`` would leave
    ``[e^-700, e^700]`` (``|lam| dx > 11`` for ``b = 64``, far outside the planner's range); terms that
    underflow are covered by adding 1e-300 to the sum, so ``K`` never drops below the exact
    value beyond float64 rounding.
    """
    m = pmf.shape[-1]
    b = next((c for c in _MGF_BLOCKS if m % c == 0), 1)
    dx = y[1] - y[0] if m > 1 else jnp.zeros(())
    ref = jnp.sum(pmf * y) / jnp.maximum(jnp.sum(pmf), 1e-300)
    inner_exp = lambdas[:, None] * (jnp.arange(b) * dx)[None, :]             # (L, b)
    inner_ok = jnp.all(jnp.abs(inner_exp) < 700.0, axis=1)                  # else K = inf
    E = jnp.exp(jnp.minimum(inner_exp, 700.0))
    # A (L, b) x (b, m/b) matrix product (XLA:CPU runs it ~5x faster than the same sums written
    # as a broadcast multiply and a reduction).
    S = jnp.dot(E, pmf.reshape(-1, b).T, precision=jax.lax.Precision.HIGHEST)  # (L, m/b)
    outer = jnp.exp(lambdas[:, None] * (y[::b] - ref)[None, :])              # (L, m/b)
    # An empty block times an overflowed exponential is 0 * inf: it contributes nothing.
    terms = jnp.where(S > 0, S * outer, 0.0)
    s = jnp.sum(terms, axis=1) + 1e-300
    return jnp.where(inner_ok, lambdas * ref + jnp.log(s), jnp.inf)


def chernoff_quantiles(log_mgf, lambdas, log_tau):
    """``(l, h)``: the Chernoff bounds put mass <= exp(log_tau) below ``l`` and above ``h``."""
    pos = lambdas > 0
    h = jnp.min(jnp.where(pos, (log_mgf - log_tau) / jnp.where(pos, lambdas, 1.0), jnp.inf))
    l = jnp.max(jnp.where(~pos, (log_mgf - log_tau) / jnp.where(pos, 1.0, lambdas), -jnp.inf))
    return l, h


def window_start(l, h, dx, n):
    """Centre the window between the Chernoff quantiles."""
    centre = 0.5 * (h + l)
    centre = jnp.where(jnp.isfinite(centre), centre, 0.0)
    return jnp.floor(centre / dx).astype(jnp.int64) - n // 2


def _largest_negative_excursion(r):
    """``max_t max(-r_t, 0)``, written as ``max(-min_t r_t, 0)`` (the same value, NaN included):
    one plain reduction over ``r`` (XLA:CPU ran the elementwise form against a materialized
    array of zeros)."""
    return jnp.maximum(-jnp.min(r), 0.0)


def wrap_tails(log_mgf, lambdas, w_lo, dx, n):
    pos = lambdas > 0
    hi = (w_lo + n) * dx
    lo = (w_lo - 1) * dx
    above = jnp.min(jnp.where(pos, log_mgf - lambdas * hi, jnp.inf))
    below = jnp.min(jnp.where(pos, jnp.inf, log_mgf - lambdas * lo))
    # Any NaN (it should not happen) is treated as "no bound": mass 1.
    above = jnp.where(jnp.isnan(above), 1.0, jnp.minimum(jnp.exp(above), 1.0))
    below = jnp.where(jnp.isnan(below), 1.0, jnp.minimum(jnp.exp(below), 1.0))
    return above, below


@functools.partial(_xla.jit, static_argnames=("direction", "ms", "n", "kinds", "n_freq"))
def compose(
    groups: Sequence[Group],
    dx,
    lambdas,
    log_tau,
    *,
    direction: str,
    ms: tuple[int, ...],
    n: int,
    kinds: tuple[str, ...] = ("up",),
    n_freq: int | None = None,
) -> Composition:
    """Compose every mechanism of every group (``counts`` times each) on one grid.

    Args:
      groups: tuple of :class:`Group` (one per mechanism kind / static meta data).
      dx: grid spacing (traced).
      lambdas: (L,) Chernoff parameters, both signs present (traced).
      log_tau: log of the tail level used to centre the window (traced).
      direction: a :class:`~dpjax.pld.mechanisms.Direction` (or its string, "remove"/"add").
      ms: per group, the number of grid points of each single mechanism (static, <= n).
      n: FFT length (static).
      kinds: which discretizations to compose: "up" (pessimistic), "down" (optimistic).
      n_freq: keep only the lowest ``n_freq`` frequencies of the composed transform (static;
        None keeps all).  A long composition's characteristic function ``prod F_k^{c_k}`` is
        (numerically) zero except at low frequencies, so the phase bookkeeping (arctan2, cos,
        sin: the costliest elementwise work) is done only there.  Sound for any ``n_freq``: the
        dropped coefficients move every window bin by at most ``(2/n) sum_{k >= n_freq} |F^c|_k``
        (inverse real FFT), so a bound on ``2 sum_{k >= n_freq} |F^c|_k`` is added to
        ``roundoff`` (it bounds the change of any hockey-stick sum); ``truncation`` reports it.
        The bound is ``2 (n/2 + 1 - n_freq) prod_k (max_{f >= n_freq} |F_k(f)|)^{c_k}``: one
        max-reduction per mechanism instead of a log and an exp per dropped frequency.
    Returns:
      :class:`Composition` (``.up`` / ``.down``, the kinds requested).
    """
    direction = Direction.parse(direction)
    out = compose_directions((tuple(groups),), dx, jnp.asarray(lambdas, jnp.float64)[None], log_tau,
                             directions=(direction,), ms=ms, n=n, kinds=kinds, n_freq=n_freq)
    return jax.tree_util.tree_map(lambda a: a[0], out)


@functools.partial(_xla.jit, static_argnames=("directions", "ms", "n", "kinds", "n_freq", "tilted", "lattice"))
def compose_directions(
    groups_by_direction: Sequence[Sequence[Group]],
    dx,
    lambdas,
    log_tau,
    *,
    directions: tuple[str, ...],
    ms: tuple[int, ...],
    n: int,
    kinds: tuple[str, ...] = ("up",),
    n_freq: int | None = None,
    tilted: bool = False,
    tilt=None,
    tilt_from=None,
    lattice: tuple[bool, ...] | None = None,
) -> Composition:
    """:func:`compose` for several directions at once, batched along a leading axis.

    Only the loss CDFs are computed per direction (they are mechanism code with a static
    direction); the discretization, the transforms, the powers, the window and the bounds run
    on ``(directions, ...)`` arrays: one copy of that code in the compiled program and batched
    FFTs, instead of one copy per direction.

    Args:
      groups_by_direction: per direction, the tuple of :class:`Group` of :func:`compose`; the
        mechanisms and counts must be the same in every direction (only offsets differ).
      lambdas: (D, L) Chernoff parameters per direction.
      directions: the D directions (static).
      ms: per group, the number of grid points (static, common to all directions).
      dx, log_tau, n, kinds, n_freq: as in :func:`compose`.
      tilted: compose the exponentially tilted PMFs (static; see below).  ``n_freq`` is ignored.
      tilt: (D,) tilt parameters ``lam > 0`` per direction (traced; only with ``tilted``).
      tilt_from: (D,) the smallest epsilon ``y_v`` the tilted composition must serve (traced).
      lattice: per group, evaluate both directions' loss CDFs on one lattice of
        ``lattice_length(m)`` points (static; only for ``directions == ("remove", "add")`` and a
        mechanism with ``loss_cdfs_lattice`` whose ``lattice_fits`` holds for the offsets:
        :func:`lattice_groups` decides).  The same values with about half the CDF work.

    Exponential tilting (small deltas).  The FFT round-off floor is relative to the largest
    bins (``~ steps * 2^-52`` of the peak, spread over every bin), so deep in the tail, where
    delta ~ 1e-12 is read, it swamps the mass.  With ``tilted``, each grid PMF is replaced by
    ``p~(y) = p(y) e^{lam y - K_k(lam)}`` (a probability PMF with its bulk moved up the loss axis)
    before the transform.  Tilting commutes with convolution: ``(p e^{lam y}) * (q e^{lam y}) =
    (p * q) e^{lam y}``, so the composed tilted PMF, multiplied back by ``e^{K(lam) - lam y}``
    (``K = sum_k c_k K_k``), is the composed PMF, and its round-off floor is multiplied by the
    same factor: small where ``lam`` put the tilted bulk (the tail of interest).  The window is
    placed over the tilted distribution's upper part (it need not hold the bulk of the loss:
    only bins above epsilon enter delta):

    * only bins at losses ``>= y_v`` (``tilt_from``) are kept: the curves serve ``eps >= y_v``
      (``valid_from``: ``y_v``, the window bottom, or where the untilt factor would pass
      ``e^600``, whichever is highest); an epsilon at or below it is no answer;
    * wrap-around from above: true index ``J >= w + n`` lands at ``t = J - k n``; if
      ``y_t >= y_v`` it is untilted with ``e^{lam (y_J - y_t)} <= e^{lam (y_J - y_v)}``; for
      ``theta >= lam``, ``1{S >= h} e^{lam (S - y_v)} <= e^{theta (S - h)} e^{lam (h - y_v)}``
      (``h = (w + n) dx``), so the untilted aliased mass on kept bins is at most
      ``exp(K(theta) - theta h + lam (h - y_v))`` (``tail_above``; ``lambdas`` here are the
      candidate ``theta``, all ``> lam``; the window top ``h`` is placed where this meets the tail
      budget).  Amplified by the untilt, it may exceed its true share, so the lower curve
      subtracts it too (added to ``tail_below``);
    * wrap-around from below lands at least ``n`` bins higher, untilted by at most
      ``e^{-lam n dx}`` (``tail_below``);
    * floating point: the tilt and untilt factors ``exp(x)`` carry relative errors
      ``~ u (|x| + 1)``; per composed step they compound, so ``roundoff_rel`` grows by
      ``2 u sum_k c_k (lam max|y_k| + |K_k| + 2) + 2 u (|K| + lam max|y| + 2)`` (a relative
      perturbation of every bin of every single PMF by ``eta`` moves every composed bin by at
      most a factor ``(1 +- eta)^c``).
    Returns:
      :class:`Composition` whose :class:`ComposedPLD` fields have a leading axis of length D.
    """
    directions = tuple(Direction.parse(d, "directions") for d in directions)
    kinds = _check_kinds(kinds)
    dx = jnp.asarray(dx, jnp.float64)
    lambdas = jnp.asarray(lambdas, jnp.float64)
    D = len(directions)
    half = n // 2 + 1
    nf = half if n_freq is None else max(1, min(int(n_freq), half))
    L = lambdas.shape[-1]

    if tilted:
        nf = half
        tilt = jnp.asarray(tilt, jnp.float64).reshape(D)
        tilt_from = jnp.asarray(tilt_from, jnp.float64).reshape(D)

    carry = dict(acc={k: _zero_acc(D, nf, L) for k in kinds}, offset=jnp.zeros(D, jnp.int64), total=jnp.zeros(()))
    for gi, m in enumerate(ms):
        group = groups_by_direction[0][gi]
        body = functools.partial(_compose_step, m=m, lattice=lattice is not None and lattice[gi], dx=dx,
                                 directions=directions, kinds=kinds, lambdas=lambdas, tilted=tilted, tilt=tilt,
                                 n=n, nf=nf)
        offsets = jnp.stack([jnp.asarray(gd[gi].offsets, jnp.int64) for gd in groups_by_direction], axis=-1)
        xs = (group.mechanism, jnp.asarray(group.counts, jnp.int64), offsets)
        if xs[1].shape[0] == 1:  # one mechanism: no loop (lets XLA fuse across the body)
            carry, _ = body(carry, jax.tree_util.tree_map(lambda a: a[0], xs))
        else:
            carry, _ = jax.lax.scan(body, carry, xs)

    num_terms = sum(int(jnp.shape(g.counts)[0]) if jnp.ndim(g.counts) else 1 for g in groups_by_direction[0])
    out = {kind: _composed(carry["acc"][kind], kind, carry, dx=dx, lambdas=lambdas, log_tau=log_tau, n=n, nf=nf,
                           tilted=tilted, tilt=tilt, tilt_from=tilt_from, num_terms=num_terms)
           for kind in kinds}
    return Composition(**out)


def _zero_acc(D: int, nf: int, L: int) -> dict:
    """The empty accumulator of one kind (``"up"`` / ``"down"``) of :func:`compose_directions`.

    logabs/angle: log-modulus and phase of the kept frequencies ``(D, nf)``; log_hi: log of the
    bound ``prod_k max_{f >= nf} |F_k(f)|^{c_k}`` on every dropped frequency (see compose);
    K: the composed log-MGF at the Chernoff parameters ``(D, L)``; log_fin: log of the finite
    mass; Kt: ``sum_k c_k K_k(tilt)``; rel_t: ``sum_k c_k (tilt max|y_k| + |K_k(tilt)| + 2)``;
    absK: ``sum_k c_k |K_k(tilt)|`` (tilted only); bad: an overflowed tilted log-MGF."""
    return dict(logabs=jnp.zeros((D, nf)), angle=jnp.zeros((D, nf)), K=jnp.zeros((D, L)),
                log_fin=jnp.zeros(D), log_hi=jnp.zeros(D), Kt=jnp.zeros(D), rel_t=jnp.zeros(D),
                absK=jnp.zeros(D), bad=jnp.zeros(D, bool))


def _compose_step(carry, xs, *, m, lattice, dx, directions, kinds, lambdas, tilted, tilt, n, nf):
    """One step of :func:`compose_directions`: discretize one mechanism ``xs = (mechanism,
    count, (D,) offsets)`` on its ``m`` grid points in every direction, and multiply its
    transform, raised to its count, into each kind's accumulator (a ``lax.scan`` body)."""
    D = len(directions)
    half = n // 2 + 1
    mech, c_int, o = xs                                   # o: (D,) offsets
    c = c_int.astype(jnp.float64)
    y = (o[:, None] + jnp.arange(m)[None, :]) * dx        # (D, m)
    if lattice:
        # Both directions from one lattice evaluation (see the mechanism's method).
        cdfs = materialize_once(lambda: mech.loss_cdfs_lattice(o, dx, m, lattice_length(m)), dx > 0)
    elif hasattr(mech, "loss_cdfs_directions"):
        # One evaluation for every direction (optional mechanism method): less code.
        cdfs = materialize_once(lambda: mech.loss_cdfs_directions(directions, y), dx > 0)
    else:
        cdfs = [grid_cdfs(mech, d, o[di], dx, m) for di, d in enumerate(directions)]
        cdfs = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *cdfs)
    g = jax.vmap(grid_pmf, in_axes=(0, 0, None))(cdfs, y, dx)
    acc = dict(carry["acc"])
    for kind in kinds:
        pmf = g.pmf_up if kind == "up" else g.pmf_down    # (D, m)
        a = acc[kind]
        Kt, rel_t = a["Kt"], a["rel_t"]
        K_acc = a["K"] + jnp.where(c > 0, c * jax.vmap(pmf_log_mgf)(pmf, y, lambdas), 0.0)
        if tilted:
            # p~ = p e^{tilt y - K_k(tilt)} in log space (no overflow; empty bins stay 0).
            Kk = jax.vmap(pmf_log_mgf)(pmf, y, tilt[:, None])[:, 0]           # (D,)
            # An overflowed K_k (not expected for tilts <= 1e3) voids the tilted result.
            bad = a["bad"] | ((c > 0) & ~jnp.isfinite(Kk))
            Kk = jnp.where(jnp.isfinite(Kk), Kk, 0.0)
            logp = jnp.log(jnp.where(pmf > 0, pmf, 1.0))
            x = logp + tilt[:, None] * y - Kk[:, None]                      # <= 0 up to rounding
            bad = bad | ((c > 0) & jnp.any(x > 700.0, axis=-1))
            pmf = jnp.where(pmf > 0, jnp.exp(jnp.minimum(x, 700.0)), 0.0)
            Kt = Kt + jnp.where(c > 0, c * Kk, 0.0)
            # exp(x) with x carrying an absolute error ~u (|log p| + lam |y| + |K_k|):
            # a relative error of every tilted bin (|log p| <= 745 for float64).
            rel_t = rel_t + jnp.where(
                c > 0, c * (tilt * jnp.max(jnp.abs(y), axis=-1) + jnp.abs(Kk) + 750.0), 0.0)
            absK = a["absK"] + jnp.where(c > 0, c * jnp.abs(Kk), 0.0)
        else:
            bad, absK = a["bad"], a["absK"]
        F = jnp.fft.rfft(pmf, n, axis=-1)
        sq = jnp.real(F) ** 2 + jnp.imag(F) ** 2
        log_fin = a["log_fin"]
        if kind == "up":
            log_fin = log_fin + jnp.where(c > 0, c * jnp.log1p(-g.p_inf_up), 0.0)
        # Dropped frequencies only need a bound on |F^c|: the largest |F_k| among them,
        # raised to c (one max-reduction instead of a log and an exp per frequency).
        log_hi = (0.5 * jnp.log(jnp.maximum(jnp.max(sq[:, nf:], axis=-1), 1e-300)) if nf < half
                  else jnp.zeros(D))
        F = F[:, :nf]
        acc[kind] = dict(
            logabs=a["logabs"] + c * 0.5 * jnp.log(jnp.maximum(sq[:, :nf], 1e-300)),
            angle=a["angle"] + c * jnp.arctan2(jnp.imag(F), jnp.real(F)),
            K=K_acc,
            log_fin=log_fin,
            log_hi=a["log_hi"] + jnp.where(c > 0, c * log_hi, 0.0),
            Kt=Kt, rel_t=rel_t, absK=absK, bad=bad,
        )
    # Only O mod n matters (circular index); reduce first so huge counts cannot overflow.
    off = jnp.mod(carry["offset"] + jnp.mod(c_int, n) * jnp.mod(o, n), n)
    return dict(acc=acc, offset=off, total=carry["total"] + c), None


def _window(circ, K, lam, offset, truncation, floor_prior, is_up, *, log_tau, dx, n):
    """Place one direction's window and bound what lies outside it."""
    l, h = chernoff_quantiles(K, lam, log_tau)
    w_lo = window_start(l, h, dx, n)
    idx = jnp.mod(jnp.arange(n, dtype=jnp.int64) + w_lo - offset, n)
    r = circ[idx]
    above, below = wrap_tails(K, lam, w_lo, dx, n)
    # Per-bin noise floor (see the module docstring): every bin may carry the largest
    # negative excursion seen, and, for the lower bound, the a-priori positive bias
    # ``floor_prior`` (errors of the low frequencies spread over every bin as an offset
    # of either sign; a positive offset is invisible in the negative bins).  Applied per
    # bin rather than as ``n`` times the floor on delta: only bins above epsilon then
    # count (a tail-aware allowance, what makes deltas of 1e-12 certifiable).
    nu = _largest_negative_excursion(r)
    r = jnp.where(is_up, jnp.maximum(r, 0.0) + nu, jnp.maximum(r - jnp.maximum(nu, floor_prior), 0.0))
    # (Negative bins need no extra term: the clipped bin plus nu is >= the computed value.)
    roundoff = truncation
    return r, w_lo, above, below, roundoff, h - l, jnp.where(is_up, nu, jnp.maximum(nu, floor_prior))


def _window_tilted(circ, K, theta, offset, floor_prior, is_up, lam, Kt, y_v, absK, bad, *, log_tau, dx, n,
                   num_terms):
    """Place one direction's window over the tilted distribution's upper part, untilt, and
    bound the wrap-around (see :func:`compose_directions`: ``theta`` are candidates ``> lam``;
    the result serves ``eps >= y_v`` only)."""
    ok = (theta > lam) & jnp.isfinite(K)
    # Top h: smallest with exp(K(theta) - theta h + lam (h - y_v)) <= tau for some candidate.
    h = jnp.min(jnp.where(ok, (K - log_tau - lam * y_v) / jnp.where(ok, theta - lam, 1.0), jnp.inf))
    # (Capped so the index stays in int64; a capped top only makes tail_above larger.)
    h = jnp.clip(jnp.where(jnp.isfinite(h), h, y_v + n * dx), y_v, y_v + 1e4)
    w_lo = jnp.ceil(h / dx).astype(jnp.int64) - n
    idx = jnp.mod(jnp.arange(n, dtype=jnp.int64) + w_lo - offset, n)
    r = circ[idx]
    y = (w_lo + jnp.arange(n)) * dx
    hi = (w_lo + n) * dx
    above = jnp.min(jnp.where(ok, K - theta * hi + lam * (hi - jnp.minimum(y_v, hi)), jnp.inf))
    above = jnp.where(jnp.isnan(above), 1.0, jnp.minimum(jnp.exp(above), 1.0))
    below = jnp.minimum(jnp.exp(-lam * n * dx), 1.0)
    # Untilt factor e^{Kt - lam y}: bins where it would exceed e^600 are dropped; the curves
    # serve eps >= valid_from only (the bins below it are set to 0).
    log_s = Kt - lam * y
    valid_from = jnp.maximum(jnp.maximum(w_lo * dx, (Kt - 600.0) / lam), y_v)
    valid_from = jnp.where(bad, jnp.inf, valid_from)
    s = jnp.where((log_s <= 600.0) & (y >= valid_from), jnp.exp(jnp.minimum(log_s, 600.0)), 0.0)
    # Per-bin noise floor, as in ``_window``, in the tilted domain (relative to the tilted
    # PMF's largest bins), then untilted with the bin: tiny in the tail.
    nu = _largest_negative_excursion(r)
    r = jnp.where(is_up, jnp.maximum(r, 0.0) + nu, jnp.maximum(r - jnp.maximum(nu, floor_prior), 0.0)) * s
    # exp(Kt - lam y): Kt = fl(sum_k c_k K_k) carries an absolute error <= num_terms u sum |c_k K_k|.
    rel_untilt = 2.0 * UNIT_ROUNDOFF * ((num_terms + 1) * absK + lam * jnp.max(jnp.abs(y)) + 2.0)
    # Aliased mass from above is amplified by the untilt, so for the lower curve it is
    # subtracted too (reported in tail_below).
    below = jnp.where(is_up, below, jnp.minimum(below + above, 1.0))
    return (r, w_lo, above, below, jnp.zeros(()), hi - w_lo * dx,
            jnp.where(is_up, nu, jnp.maximum(nu, floor_prior)), valid_from, rel_untilt)


def _composed(a, kind, carry, *, dx, lambdas, log_tau, n, nf, tilted, tilt, tilt_from, num_terms) -> ComposedPLD:
    """One kind's composed PLD from its accumulator ``a``: back from the frequency domain,
    windowed (:func:`_window`, or :func:`_window_tilted` untilting), with its error terms."""
    D = a["K"].shape[0]
    half = n // 2 + 1
    mag = jnp.exp(a["logabs"])
    F = mag * (jnp.cos(a["angle"]) + 1j * jnp.sin(a["angle"]))
    if nf < half:
        F = jnp.concatenate([F, jnp.zeros((D, half - nf), F.dtype)], axis=-1)
        # sum over the dropped k of prod_g |F_g(k)|^{c_g} <= (half - nf) prod_g max_k |F_g(k)|^{c_g}
        truncation = 2.0 * (half - nf) * jnp.exp(a["log_hi"])
    else:
        truncation = jnp.zeros(D)
    circ = jnp.fft.irfft(F, n, axis=-1)
    roundoff_rel = jnp.full(D, 8.0 * UNIT_ROUNDOFF) * (jnp.log2(n) + carry["total"])
    # A-priori per-bin error of the composed PMF from relative errors ``roundoff_rel`` of
    # every kept coefficient of ``F``: ``(2/n) sum_k roundoff_rel |F_k|`` (inverse real FFT).
    # Only the lower bound needs it (see ``_window``): on q = 1, T = 1022, sigma = 2.17 a
    # positive offset of ~1e-18 per bin, with no negative bin at all, put delta_lower at
    # 5.2e-15 where the truth is 1.8e-17.
    floor_prior = roundoff_rel * (2.0 / n) * jnp.sum(mag, axis=-1)
    is_up = jnp.full(D, kind == "up")
    valid_from = jnp.full(D, -jnp.inf)
    if tilted:
        window = functools.partial(_window_tilted, log_tau=log_tau, dx=dx, n=n, num_terms=num_terms)
        r, w_lo, above, below, roundoff, width, floor, valid_from, rel_untilt = jax.vmap(window)(
            circ, a["K"], lambdas, carry["offset"], floor_prior, is_up, tilt, a["Kt"], tilt_from, a["absK"], a["bad"])
        roundoff_rel = roundoff_rel + 2.0 * UNIT_ROUNDOFF * a["rel_t"] + rel_untilt
    else:
        window = functools.partial(_window, log_tau=log_tau, dx=dx, n=n)
        r, w_lo, above, below, roundoff, width, floor = jax.vmap(window)(
            circ, a["K"], lambdas, carry["offset"], truncation, floor_prior, is_up)
    p_inf = -jnp.expm1(a["log_fin"]) if kind == "up" else jnp.zeros(D)
    return ComposedPLD(
        pmf=r, w_lo=w_lo, dx=jnp.full(D, dx), p_inf=p_inf, tail_above=above, tail_below=below,
        roundoff=roundoff, roundoff_rel=roundoff_rel, log_mgf=a["K"], needed_width=width,
        truncation=truncation, noise_floor=floor, valid_from=valid_from,
    )
