"""FFT composition of grid PMFs (Koskela & Honkela 2021, §4; docs/design.md §2), with certified wrap-around bounds.

The records of a composition (:class:`Group`, :class:`ComposedPLD`, :class:`Composition`) and
:func:`compose`, the composition of one direction as a jittable, differentiable function; the
numerics are those of the PLD program (:mod:`dpjax.pld.grid.program`), which every accounting path
runs.  What they compute:

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

from dpjax._base import lazy_module as _lazy_module, register_pytree_dataclass as _register_pytree_dataclass
from dpjax._base import xla as _xla
from dpjax.pld.mechanisms import Direction

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")


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
        window does not hold the bulk of the loss; see :mod:`dpjax.pld.grid.program`).
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
    valid_from: jax.Array = -float("inf")

    @property
    def losses(self) -> jax.Array:
        """(n,) the loss value of each window bin."""
        return (self.w_lo + jnp.arange(self.pmf.shape[-1])) * self.dx


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class Composition:
    """What :func:`compose` returns: one :class:`ComposedPLD` per
    requested discretization (``None`` where not requested).

    Attributes:
      up: the pessimistic (connect-the-dots, dominating) composition; its
        :func:`~dpjax.pld.grid.convert.table` with ``Bound.UPPER`` gives certified upper bounds.
      down: the optimistic (round-down) composition, for ``Bound.LOWER``.
    """

    up: ComposedPLD | None = None
    down: ComposedPLD | None = None


#: The discretizations :func:`compose` can run: "up" (pessimistic), "down" (optimistic).
KINDS = ("up", "down")


def _check_kinds(kinds) -> tuple[str, ...]:
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must be a non-empty tuple of distinct values from {KINDS}, got {kinds!r}")
    return kinds


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
    """Compose every mechanism of every group (``counts`` times each) on one grid: the PLD
    program of :mod:`dpjax.pld.grid.program` (in JAX: jittable, differentiable in the mechanism
    parameters) up to its conversion.

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
        (numerically) zero except at low frequencies, so the phase bookkeeping is done only
        there.  Sound for any ``n_freq``: a bound on what the dropped coefficients can move is
        added to ``roundoff`` (``truncation`` reports it).
    Returns:
      :class:`Composition` (``.up`` / ``.down``, the kinds requested).
    """
    from dpjax._base.ops import jax_ops
    from dpjax.pld.grid import program as prog

    direction = Direction.parse(direction)
    kinds = _check_kinds(kinds)
    layout = prog.GridLayout(groups=(tuple(groups),), dx=dx, lambdas=jnp.asarray(lambdas, jnp.float64)[None],
                             log_tau=log_tau, directions=(direction,), ms=(tuple(ms),), n=n, n_freq=n_freq)
    inp, spec = prog.inputs(layout, jnp.zeros(1), kinds=kinds, want="delta", traced=True)
    rows = prog.composed_rows(jax_ops(), inp, spec)
    out = {}
    for i, kind in enumerate(kinds):
        out[kind] = ComposedPLD(pmf=rows["pmf"][i], w_lo=rows["w_lo"][i], dx=jnp.asarray(dx, jnp.float64),
                                p_inf=rows["p_inf"][i], tail_above=rows["tail_above"][i],
                                tail_below=rows["tail_below"][i], roundoff=rows["roundoff"][i],
                                roundoff_rel=rows["roundoff_rel"][i], log_mgf=rows["log_mgf"][i],
                                needed_width=rows["needed_width"][i], truncation=rows["truncation"][i],
                                noise_floor=rows["noise_floor"][i], valid_from=rows["valid_from"][i])
    return Composition(**out)
