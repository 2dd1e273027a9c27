"""FFT composition of grid PMFs (seed 003 §4; DESIGN.md §2), with certified wrap-around bounds.

Layout.  Mechanism ``k`` sits on indices ``i = 0..m_k-1`` of a length-``n`` array with loss
``(i + o_k) dx`` (``o_k`` an integer offset).  A circular convolution adds indices mod ``n``, so
the composition of ``c_k`` copies of every ``k`` is known mod ``n dx``: circular index ``j``
carries the mass of true indices ``J = j + O (mod n)`` with ``O = sum_k c_k o_k``.  We read it in
a window ``J in [w, w + n)`` placed over the bulk of the composed loss (chosen inside the jitted
program from the log-MGF, see below), i.e. ``window[t] = circ[(w + t - O) mod n]``.

Composition in Fourier space is ``F = prod_k rfft(pmf_k)^{c_k}``; the power is taken as
``exp(c_k (log|F_k| + i arg F_k))``, exact for integer ``c_k`` on the principal branch, with
modulus and phase accumulated as real arrays (no complex ``0 * inf``).

Wrap-around (seed 003 Thm 1, Chernoff form).  Mass of the composed (discretized) loss ``S``
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
characteristic function, i.e. of the PMF's shape.  The upper bound therefore adds
``roundoff = sum(neg) + n * max(neg)`` (every bin may carry the largest negative excursion
seen) and inflates the hockey-stick sums by ``roundoff_rel = 8 u (log2 n + sum c_k)``
(u = 2^-52).  The a-priori normwise bound ``~u c sqrt(n) ||pmf||_2`` was tried first: it is
~1e-10 at T = 1e5, far above the observed noise (~1e-20 per bin), and would dominate
deltas of 1e-9.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from dpjax.pld.discretize import discretize

_U = 2.0**-52


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

    @property
    def losses(self) -> jax.Array:
        """(n,) the loss value of each window bin."""
        return (self.w_lo + jnp.arange(self.pmf.shape[-1])) * self.dx


def _log_mgf(pmf, y, lambdas):
    """``K(lam) = log sum_i pmf_i e^{lam y_i}`` for every ``lam`` in one fused pass.

    Exponents are taken relative to the PMF's mean (no max-reduction pass, ~1.5x faster than
    ``logsumexp`` here).  Overflow gives ``K = inf`` (a trivial, sound bound); terms that
    underflow are covered by adding 1e-300 to the sum, so ``K`` never drops below the exact value.
    """
    ref = jnp.sum(pmf * y) / jnp.maximum(jnp.sum(pmf), 1e-300)
    terms = pmf[None, :] * jnp.exp(lambdas[:, None] * (y - ref)[None, :])
    # An empty bin times an overflowed exponential is 0 * inf: it contributes nothing.
    terms = jnp.where(pmf[None, :] > 0, terms, 0.0)
    s = jnp.sum(terms, axis=1) + 1e-300
    return lambdas * ref + jnp.log(s)


def _chernoff_quantiles(log_mgf, lambdas, log_tau):
    """``(l, h)``: the Chernoff bounds put mass <= exp(log_tau) below ``l`` and above ``h``."""
    pos = lambdas > 0
    h = jnp.min(jnp.where(pos, (log_mgf - log_tau) / jnp.where(pos, lambdas, 1.0), jnp.inf))
    l = jnp.max(jnp.where(~pos, (log_mgf - log_tau) / jnp.where(pos, 1.0, lambdas), -jnp.inf))
    return l, h


def _window_start(l, h, dx, n):
    """Centre the window between the Chernoff quantiles."""
    centre = 0.5 * (h + l)
    centre = jnp.where(jnp.isfinite(centre), centre, 0.0)
    return jnp.floor(centre / dx).astype(jnp.int64) - n // 2


def _tails(log_mgf, lambdas, w_lo, dx, n):
    pos = lambdas > 0
    hi = (w_lo + n) * dx
    lo = (w_lo - 1) * dx
    above = jnp.min(jnp.where(pos, log_mgf - lambdas * hi, jnp.inf))
    below = jnp.min(jnp.where(pos, jnp.inf, log_mgf - lambdas * lo))
    # Any NaN (it should not happen) is treated as "no bound": mass 1.
    above = jnp.where(jnp.isnan(above), 1.0, jnp.minimum(jnp.exp(above), 1.0))
    below = jnp.where(jnp.isnan(below), 1.0, jnp.minimum(jnp.exp(below), 1.0))
    return above, below


@functools.partial(jax.jit, static_argnames=("direction", "ms", "n", "kinds", "n_freq"))
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
) -> dict:
    """Compose every mechanism of every group (``counts`` times each) on one grid.

    Args:
      groups: tuple of :class:`Group` (one per mechanism kind / static meta data).
      dx: grid spacing (traced).
      lambdas: (L,) Chernoff parameters, both signs present (traced).
      log_tau: log of the tail level used to centre the window (traced).
      direction: "remove" or "add".
      ms: per group, the number of grid points of each single mechanism (static, <= n).
      n: FFT length (static).
      kinds: which discretizations to compose: "up" (pessimistic), "down" (optimistic).
      n_freq: keep only the lowest ``n_freq`` frequencies of the composed transform (static;
        None keeps all).  A long composition's characteristic function ``prod F_k^{c_k}`` is
        (numerically) zero except at low frequencies, so the phase bookkeeping (arctan2, cos,
        sin: the costliest elementwise work) is done only there.  Sound for any ``n_freq``: the
        dropped coefficients move every window bin by at most ``(2/n) sum_{k >= n_freq} |F^c|_k``
        (inverse real FFT), so ``2 sum_{k >= n_freq} |F^c|_k`` is added to ``roundoff`` (it
        bounds the change of any hockey-stick sum); ``truncation`` reports it.
    Returns:
      dict kind -> :class:`ComposedPLD`.
    """
    dx = jnp.asarray(dx, jnp.float64)
    lambdas = jnp.asarray(lambdas, jnp.float64)
    half = n // 2 + 1
    nf = half if n_freq is None else max(1, min(int(n_freq), half))
    L = lambdas.shape[0]

    def zero_acc():
        return dict(logabs=jnp.zeros(half), angle=jnp.zeros(nf), K=jnp.zeros(L), log_fin=jnp.zeros(()))

    carry = dict(acc={k: zero_acc() for k in kinds}, offset=jnp.zeros((), jnp.int64), total=jnp.zeros(()))
    for group, m in zip(groups, ms):

        def body(carry, xs, m=m):
            mech, c_int, o = xs
            c = c_int.astype(jnp.float64)
            g = discretize(mech, direction, o, dx, m)
            y = (o + jnp.arange(m)) * dx
            acc = dict(carry["acc"])
            for kind in kinds:
                pmf = g.pmf_up if kind == "up" else g.pmf_down
                F = jnp.fft.rfft(pmf, n)
                sq = jnp.real(F) ** 2 + jnp.imag(F) ** 2
                F = F[:nf]
                a = acc[kind]
                log_fin = a["log_fin"]
                if kind == "up":
                    log_fin = log_fin + jnp.where(c > 0, c * jnp.log1p(-g.p_inf_up), 0.0)
                acc[kind] = dict(
                    logabs=a["logabs"] + c * 0.5 * jnp.log(jnp.maximum(sq, 1e-300)),
                    angle=a["angle"] + c * jnp.arctan2(jnp.imag(F), jnp.real(F)),
                    K=a["K"] + jnp.where(c > 0, c * _log_mgf(pmf, y, lambdas), 0.0),
                    log_fin=log_fin,
                )
            # Only O mod n matters (circular index); reduce first so huge counts cannot overflow.
            off = jnp.mod(carry["offset"] + jnp.mod(c_int, n) * jnp.mod(o, n), n)
            return dict(acc=acc, offset=off, total=carry["total"] + c), None

        xs = (group.mechanism, jnp.asarray(group.counts, jnp.int64), jnp.asarray(group.offsets, jnp.int64))
        if xs[1].shape[0] == 1:  # one mechanism: no loop (lets XLA fuse across the body)
            carry, _ = body(carry, jax.tree_util.tree_map(lambda a: a[0], xs))
        else:
            carry, _ = jax.lax.scan(body, carry, xs)

    out = {}
    for kind in kinds:
        a = carry["acc"][kind]
        mag = jnp.exp(a["logabs"])
        F = mag[:nf] * (jnp.cos(a["angle"]) + 1j * jnp.sin(a["angle"]))
        if nf < half:
            F = jnp.concatenate([F, jnp.zeros((half - nf,), F.dtype)])
            truncation = 2.0 * jnp.sum(mag[nf:])
        else:
            truncation = jnp.zeros(())
        circ = jnp.fft.irfft(F, n)
        l, h = _chernoff_quantiles(a["K"], lambdas, log_tau)
        w_lo = _window_start(l, h, dx, n)
        idx = jnp.mod(jnp.arange(n, dtype=jnp.int64) + w_lo - carry["offset"], n)
        r = circ[idx]
        neg_part = jnp.maximum(-r, 0.0)
        r = jnp.maximum(r, 0.0)
        above, below = _tails(a["K"], lambdas, w_lo, dx, n)
        # Observed noise floor: every bin may carry the largest negative excursion seen.
        roundoff = jnp.sum(neg_part) + n * jnp.max(neg_part) + truncation
        roundoff_rel = 8.0 * _U * (jnp.log2(n) + carry["total"])
        p_inf = -jnp.expm1(a["log_fin"]) if kind == "up" else jnp.zeros(())
        out[kind] = ComposedPLD(
            pmf=r, w_lo=w_lo, dx=dx, p_inf=p_inf, tail_above=above, tail_below=below,
            roundoff=roundoff, roundoff_rel=roundoff_rel, log_mgf=a["K"], needed_width=h - l,
            truncation=truncation,
        )
    return out
