"""Variance-reduced Monte Carlo for balls-in-bins: importance sampling in the Gram space.

The plain estimator (:mod:`dpjax.montecarlo.core`) averages hockey-stick terms that are zero
except on a rare event (probability ~ delta), so its relative standard error is about
``1 / sqrt(m delta)``.  Here the draws come from a *proposal* ``R`` that makes the event common, and
each term is reweighted by the likelihood ratio; the estimate stays unbiased (docs/design.md §4).

**P || Q (remove).**  ``delta = E_P[h(Y)]`` with ``h(y) = (1 - e^{eps - y})_+`` and
``Y = log P/Q (X)``.  The proposal is a mixture over components ``k`` (weights ``pi_k``)::

    R_k = (1/b) sum_J N((1 + theta_k) m_J + t_k vbar, sigma^2 I_n),    vbar = (1/b) sum_i m_i,

a shift of every mode along itself (``theta``: the tail of one mode) and along the mean mode
(``t``: many modes a little above their mean at once, the tail that matters when the modes are
nearly orthogonal and ``b`` is large); ``theta = t = 0`` is ``P`` itself (the defensive
component).  The summand is ``(p/r)(X) h(Y(X))`` with ``X ~ R``.

**Tilted components (P || Q, certificates).**  ``T_k = Q (P/Q)^k / Z_k``, ``Z_k = E_Q[(P/Q)^k]``,
for ``k`` in ``TILT_ORDERS = (2, 3, 4)``, at the evaluated ``sigma``.  Expanding ``(P/Q)^k`` makes
``T_k`` the mixture over ordered tuples ``(i_1..i_k)`` of ``N(m_{i_1} + .. + m_{i_k}, sigma^2 I_n)``
with weights ``prod_{a<c} exp(<m_{i_a}, m_{i_c}> / sigma^2)``, so ``Z_k`` is a finite sum over the
Gram matrix and ``T_k`` can be sampled exactly (the tuple mode by mode from its conditional
weights).  Its likelihood ratio depends on ``X`` only through the loss: ``T_k / P = e^{(k-1) Y} /
Z_k``, so the summand of a proposal with weight ``pi_k`` on it is at most ``Z_k h(Y) e^{-(k-1) Y} /
pi_k`` on *every* draw -- a Renyi-moment (Chernoff) bound of the amplified mechanism, where
the per-mode shifts only give the unamplified one.  The tuple uses ``TILT_WORDS`` uniforms per
sample from their own stream (:func:`tilt_key`), so the other draws are those of the untilted
estimator.  The tuple law moves with ``sigma``: for fixed draws the estimate is piecewise smooth
in ``sigma`` (no common-random-numbers gradient through the tuples); the in-loop estimators use
untilted proposals.

**Q || P (add).**  ``delta = E_Q[h(Y')]`` with ``Y' = log Q/P (X)``; proposal
``sum_k pi'_k N(-s_k vbar, sigma^2 I_n)`` (``s = 0``: ``Q``).  The loss is large where every mode's
likelihood is small at once, i.e. ``X`` far along ``-vbar``.

**Gram space.**  Every density ratio depends on ``X`` only through the projections
``<X, m_i>``; with ``X = c + sigma Z`` they are ``<c, m_i> + sigma W_i``, ``W = L U ~ N(0, G)``, and
``<m_J, m_i> = G[J, i]``, ``<vbar, m_i> = g_i = (G 1/b)_i``, ``|vbar|^2 = v = 1^T G 1 / b^2``.  So a
sample costs the same ``O(b^2)`` as the plain one plus one ``logsumexp`` over ``b`` per component.

**Draws.**  Sample ``s`` uses ``(I_s, U_s, u_s)``: the mode index, ``b`` normals and one uniform that
picks the component (of each direction, by its cumulative weights).  They come from PRNG block
``s // BLOCK_SIZE`` (``fold_in(key, block)``) and depend only on ``(key, b, s)`` (a tilted
component's tuple also on ``TILT_WORDS`` uniforms of block ``s // BLOCK_SIZE`` of :func:`tilt_key`);
the parameters of the shifted components are numbers in ``x``-units fixed by the caller, so for
fixed draws and an untilted proposal the estimate is a smooth function of ``(sigma, G, eps)``:
``jax.grad`` gives the common-random-numbers gradient, as for the plain estimator.

**Range of the summands** (:func:`summand_range`).  A certificate needs an upper bound ``R`` of the
summands that holds for *every* draw (docs/design.md §4): for P||Q from the tilted components
(exact) and the components with ``t = 0`` (power-mean inequality), for Q||P from every component
(Jensen), each a closed-form function of ``Y``, maximised over ``Y > eps`` on a grid with monotone
brackets.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base.x64 import float64
from dpjax.montecarlo._normal import normal_from_bits, uniform_open
from dpjax.montecarlo.core import (BLOCK_SIZE, block_words_fn, logsumexp_rows, chunk_plan, gram_sqrt,
                                   rbg_key)

__all__ = ["Proposal", "ImportanceSums", "importance_draws", "importance_summands",
           "importance_sums", "sharded_importance_sums", "importance_delta_estimate",
           "importance_delta_from_projections", "summand_range", "default_proposal",
           "tilt_log_normalizers", "tilt_draw_block", "tilt_key", "NUM_COMPONENTS", "TILT_ORDERS",
           "NUM_TILTS", "as_proposal"]

#: Components per direction (fixed, so that compiled programs do not depend on the proposal).
NUM_COMPONENTS = 3
#: Orders ``k`` of the tilted components ``Q (P/Q)^k / Z_k`` of P||Q (``Proposal.fwd_tilt``).
TILT_ORDERS = (2, 3, 4)
NUM_TILTS = len(TILT_ORDERS)
#: Uniforms per sample that choose a tilted component's tuple of modes (one per mode).
TILT_WORDS = 4


class Proposal(NamedTuple):
    """Parameters of the proposal of both directions (a pytree of ``(NUM_COMPONENTS,)`` arrays).

    ``fwd_weight`` / ``rev_weight``: mixture weights (``fwd_weight`` and ``fwd_tilt`` together sum
    to 1, ``rev_weight`` sums to 1; zeros allowed).
    ``fwd_theta`` (``>= 0``), ``fwd_shift`` (``t >= 0``): component ``k`` of P||Q is
    ``(1/b) sum_J N((1 + theta_k) m_J + t_k vbar, sigma^2 I)``.  ``rev_shift`` (``s >= 0``):
    component ``k`` of Q||P is ``N(-s_k vbar, sigma^2 I)``.  Component 0 should be the defensive
    one (``theta = t = s = 0``: the plain law).  ``fwd_tilt`` (``(NUM_TILTS,)``, default 0): weights
    of the tilted components of P||Q of orders ``TILT_ORDERS = (2, 3, 4)``, the laws
    ``Q (P/Q)^k / Z_k`` at the evaluated noise multiplier (see the module docstring); only the
    chunked sums (:func:`importance_sums`) draw them.
    """

    fwd_weight: jax.Array
    fwd_theta: jax.Array
    fwd_shift: jax.Array
    rev_weight: jax.Array
    rev_shift: jax.Array
    fwd_tilt: jax.Array = (0.0, 0.0, 0.0)


class ImportanceSums(NamedTuple):
    """Per-direction sums over samples; index 0 = P||Q (remove), 1 = Q||P (add).

    ``total``, ``total_sq``, ``maximum``: ``(2, K)`` (sum, sum of squares and largest summand
    per epsilon); ``log_wealth``: ``(2, K, J)``, ``sum_s log(1 + bet_j (level_k - X_s))`` for the
    bets given to the call (J = 0 when none).
    """

    total: jax.Array
    total_sq: jax.Array
    maximum: jax.Array
    log_wealth: jax.Array


def as_proposal(proposal) -> Proposal:
    """``proposal`` (any 4-sequence of arrays) as a float64 :class:`Proposal` pytree, ready to trace."""
    return Proposal(*(jnp.asarray(x, jnp.float64) for x in proposal))


def _check_untilted(proposal):
    """The materialised-draws path has no tilt uniforms: refuse a concrete non-zero ``fwd_tilt``."""
    tilt = proposal.fwd_tilt
    if not isinstance(tilt, jax.core.Tracer) and np.any(np.asarray(tilt) != 0):
        raise ValueError("proposal.fwd_tilt must be 0 with materialised draws (importance_summands, "
                         "importance_delta_from_projections); tilted components need importance_sums")


# --------------------------------------------------------------------------- draws


def draw_block(key, block_index, b: int):
    """Draws of one block: mode indices ``(BLOCK_SIZE,)``, ``U`` ``(BLOCK_SIZE, b)`` and the
    component uniforms ``(BLOCK_SIZE,)`` in ``(0, 1)``: ``2 ceil(b/2) + 2`` uint64 words per
    sample from ``fold_in(key, block_index)`` (vmap-safe, see :func:`dpjax.montecarlo.core.draw_block`)."""
    half = -(-b // 2)
    words = block_words_fn(2 * half + 2, BLOCK_SIZE)(jax.random.key_data(key), block_index)
    u = normal_from_bits(words[:, : 2 * half], b)
    mode_index = jnp.minimum(jnp.floor(uniform_open(words[:, 2 * half]) * b), b - 1).astype(jnp.int32)
    return mode_index, u, uniform_open(words[:, 2 * half + 1])


def tilt_draw_block(tilt_key, block_index):
    """The tilt uniforms of one block: ``(BLOCK_SIZE, TILT_WORDS)`` in ``(0, 1)`` from
    ``fold_in(tilt_key, block_index)`` (``tilt_key``: :func:`tilt_key` of the sampler's key).
    Drawn from their own stream, so the other draws of a sample do not depend on them."""
    words = block_words_fn(TILT_WORDS, BLOCK_SIZE)(jax.random.key_data(tilt_key), block_index)
    return uniform_open(words)


def tilt_key(key):
    """The key of the tilt uniforms' stream: the second half of ``split(key)`` (the other draws
    use ``fold_in(key, block)``)."""
    return jax.random.split(key)[1]


@float64
def importance_draws(key, batches_per_epoch: int, num_samples: int):
    """The first ``num_samples`` draws ``(mode_index (m,), U (m, b), component_uniform (m,))``."""
    key = rbg_key(key)
    b = batches_per_epoch
    num_blocks = -(-num_samples // BLOCK_SIZE)
    i, u, c = jax.vmap(lambda j: draw_block(key, j, b))(jnp.arange(num_blocks))
    return (i.reshape(-1)[:num_samples], u.reshape(-1, b)[:num_samples], c.reshape(-1)[:num_samples])


# --------------------------------------------------------------------------- summands


def _component(uniform, weight):
    """Index of the component picked by ``uniform`` from cumulative ``weight``."""
    cum = jnp.cumsum(weight)
    cum = cum / cum[-1]
    return jnp.minimum(jnp.sum(uniform[:, None] > cum[None, :-1], axis=1), weight.shape[0] - 1)


def _log(x):
    return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), -jnp.inf)


def _hockey(y, eps):
    # (1 - e^{eps - y})_+ for losses (S,) and epsilons (K,) -> (S, K); NaN loss -> +inf.
    y = jnp.where(jnp.isnan(y), jnp.inf, y)
    return -jnp.expm1(jnp.minimum(eps[None, :] - y[:, None], 0.0))


def _categorical_rows(u, weights):
    """Index ``j`` of each row of non-negative ``weights`` ``(S, b)`` picked by ``u`` ``(S,)``:
    ``cum_{j-1} < u cum_{b-1} <= cum_j`` (inverse distribution function)."""
    cum = jnp.cumsum(weights, axis=1)
    idx = jnp.sum(cum < u[:, None] * cum[:, -1:], axis=1)
    return jnp.minimum(idx, weights.shape[1] - 1)


#: Largest ``b`` for which the order-4 tilt's tables (``O(b^4)`` flops, ``O(b^3)`` memory) are built.
TILT4_MAX_B = 256


def _tilt_tables(gram, sigma, tilt):
    """Tables of the tilted components at ``(G, sigma)``: ``A = exp(G / sigma^2 - a)`` (``a`` the
    largest entry of ``G / sigma^2``, a diagonal one), ``log Z_k`` ``(NUM_TILTS,)``, the first
    mode's weights ``(NUM_TILTS, b)`` and the pair weights ``(NUM_TILTS, b, b)``.

    The order-``k`` law ``Q (P/Q)^k / Z_k`` is the mixture over ordered tuples ``(i_1..i_k)`` of
    ``N(m_{i_1} + .. + m_{i_k}, sigma^2 I)`` with weights ``prod_{a<c} exp(G[i_a, i_c] / sigma^2)``
    (expand ``(P/Q)^k`` and complete the squares), so ``Z_k = b^-k sum_tuples prod exp(G/sigma^2)``.
    Sequential sampling: the pair ``(i_1, i_2)`` has weight ``A_12 S_12`` with ``S = 1`` (k = 2),
    ``sum_l A_1l A_2l`` (k = 3), ``sum_{l,m} A_1l A_2l A_1m A_2m A_lm`` (k = 4); then ``i_3``
    given the pair ``A_13 A_23 (sum_m A_1m A_2m A_3m)`` (k = 4) or ``A_13 A_23`` (k = 3), and
    ``i_4`` given three ``A_14 A_24 A_34``.
    """
    b = gram.shape[0]
    inv_s2 = 1.0 / (sigma * sigma)   # products, not divisions by a broadcast scalar (see _summands)
    a_max = jnp.max(gram) * inv_s2
    a = jnp.exp(gram * inv_s2 - a_max)
    s3 = a @ a

    def order4(_):
        v = (a[:, None, :] * a[None, :, :]).reshape(b * b, b)
        return jnp.sum((v @ a) * v, axis=1).reshape(b, b)

    if b <= TILT4_MAX_B:
        s4 = jax.lax.cond(tilt[2] > 0, order4, lambda _: jnp.ones((b, b)), None)
    else:
        s4 = jnp.full((b, b), jnp.nan)   # order 4 unavailable: a non-zero weight gives +inf summands
    pair = jnp.stack([a, a * s3, a * s4])
    first = jnp.sum(pair, axis=2)
    pairs = jnp.array([1.0, 3.0, 6.0])
    orders = jnp.array(TILT_ORDERS, jnp.float64)
    log_z = jnp.log(jnp.sum(first, axis=1)) + pairs * a_max - orders * math.log(b)
    return a, log_z, first, pair, tilt[2] > 0


def _tilt_centres(gram, tables, order_index, u):
    """``<m_{i_1} + .. + m_{i_k}, m_i>`` ``(S, b)`` of each sample's tuple, ``k = TILT_ORDERS[order_index]``."""
    a, _, first, pair, use4 = tables
    i1 = _categorical_rows(u[:, 0], first[order_index])
    i2 = _categorical_rows(u[:, 1], pair[order_index, i1])
    v = a[i1] * a[i2]
    va = jax.lax.cond(use4, lambda x: x @ a, jnp.ones_like, v)   # (S, b) products only for order 4
    w3 = jnp.where((order_index == 2)[:, None], v * va, v)
    i3 = _categorical_rows(u[:, 2], w3)
    i4 = _categorical_rows(u[:, 3], v * a[i3])
    centre = gram[i1] + gram[i2]
    centre = centre + jnp.where((order_index >= 1)[:, None], gram[i3], 0.0)
    return centre + jnp.where((order_index >= 2)[:, None], gram[i4], 0.0)


def _fwd_means(gram, g, mode_index, kc, proposal):
    """P || Q's sample means ``(1 + theta_k) m_I + t_k vbar`` ``(S, b)`` of components ``kc``."""
    th, tt = proposal.fwd_theta[kc], proposal.fwd_shift[kc]
    return (1.0 + th)[:, None] * jnp.take(gram, mode_index, axis=0) + tt[:, None] * g[None, :]


def _centres(gram, mode_index, comp_uniform, proposal, g=None):
    """The sigma-free parts of the untilted samples: P || Q's means ``(S, b)`` and Q || P's shifts
    ``s_k`` ``(S,)`` (mean ``-s_k vbar``).  ``g``: the row means of ``gram``, where the caller has
    them (a gradient then reaches ``gram`` through one mean, in the order it always did)."""
    kc = jnp.minimum(_component(comp_uniform, proposal.fwd_weight), NUM_COMPONENTS - 1)
    g = jnp.mean(gram, axis=1) if g is None else g
    return (_fwd_means(gram, g, mode_index, kc, proposal),
            proposal.rev_shift[_component(comp_uniform, proposal.rev_weight)])


def _summands(gram, projections, mode_index, comp_uniform, sigma, eps, proposal, tilt_uniforms=None,
              tilt_tables=None, centres=None):
    """Both directions' summands ``(S, K)`` from ``W = U L^T`` ``(S, b)`` (``W ~ N(0, G)``).

    ``tilt_uniforms`` ``(S, TILT_WORDS)`` and ``tilt_tables`` (:func:`_tilt_tables`): the tilted
    components of P||Q are drawn and counted only when given (else ``fwd_tilt`` is ignored: it
    must be 0).  ``centres``: :func:`_centres` of the same draws, computed beforehand (untilted
    only); the same numbers as computing them here."""
    b = gram.shape[0]
    d = jnp.diagonal(gram)
    g = jnp.mean(gram, axis=1)          # <vbar, m_i>
    v = jnp.mean(g)                     # |vbar|^2
    s2 = sigma * sigma
    # 1 / sigma^2 once, then products (see dpjax.montecarlo.core.scaled_privacy_losses: a
    # division by a broadcast scalar is compiled differently on one device and on several).
    inv_s2 = 1.0 / s2
    log_b = math.log(b)
    sw = sigma * projections
    tilted = tilt_uniforms is not None

    # ---- P || Q: X = (1 + theta_k) m_I + t_k vbar + sigma Z, or a tilted component's tuple
    if tilted:
        kf = _component(comp_uniform, jnp.concatenate([proposal.fwd_weight, proposal.fwd_tilt]))
        order_index = jnp.clip(kf - NUM_COMPONENTS, 0, NUM_TILTS - 1)
        centre = jnp.where((kf >= NUM_COMPONENTS)[:, None],
                           _tilt_centres(gram, tilt_tables, order_index, tilt_uniforms),
                           _fwd_means(gram, g, mode_index, jnp.minimum(kf, NUM_COMPONENTS - 1), proposal))
        ss = proposal.rev_shift[_component(comp_uniform, proposal.rev_weight)]
    else:
        centre, ss = _centres(gram, mode_index, comp_uniform, proposal, g) if centres is None else centres
    proj = centre + sw
    ell = (proj - 0.5 * d[None, :]) * inv_s2
    log_p = logsumexp_rows(ell) - log_b                      # log P/Q (X) = Y
    xbar = jnp.mean(proj, axis=1)                              # <X, vbar>
    terms = []
    for k in range(proposal.fwd_weight.shape[0]):
        a, t = 1.0 + proposal.fwd_theta[k], proposal.fwd_shift[k]
        norm = 0.5 * (a * a * d + 2.0 * a * t * g + t * t * v)
        logits = (a * proj + t * xbar[:, None] - norm[None, :]) * inv_s2
        terms.append(_log(proposal.fwd_weight[k]) + logsumexp_rows(logits) - log_b)
    if tilted:   # log (Q (P/Q)^k / Z_k) / Q = k Y - log Z_k
        log_z = tilt_tables[1]
        for j, order in enumerate(TILT_ORDERS):
            terms.append(jnp.where(proposal.fwd_tilt[j] > 0,
                                   _log(proposal.fwd_tilt[j]) + order * log_p - log_z[j], -jnp.inf))
    log_r = logsumexp_rows(jnp.stack(terms, axis=-1))        # log R/Q (X)
    w_f = jnp.exp(log_p - log_r)
    x_f = w_f[:, None] * _hockey(log_p, eps)

    # ---- Q || P: X = -s_k vbar + sigma Z
    proj_r = -ss[:, None] * g[None, :] + sw
    ell_r = (proj_r - 0.5 * d[None, :]) * inv_s2
    y_r = -(logsumexp_rows(ell_r) - log_b)                   # log Q/P (X)
    xbar_r = jnp.mean(proj_r, axis=1)
    s = proposal.rev_shift
    log_rr = logsumexp_rows(_log(proposal.rev_weight)[None, :]
                             + (-s[None, :] * xbar_r[:, None] - 0.5 * s[None, :] ** 2 * v) * inv_s2)
    x_r = jnp.exp(-log_rr)[:, None] * _hockey(y_r, eps)
    # A summand that cannot be evaluated counts as the worst case (+inf): never as 0.
    x_f = jnp.where(jnp.isnan(x_f), jnp.inf, x_f)
    x_r = jnp.where(jnp.isnan(x_r), jnp.inf, x_r)
    return x_f, x_r


@float64
def importance_summands(gram, projections, mode_index, comp_uniform, noise_multiplier, epsilon, proposal):
    """Summands of both directions, each ``(S, K)``: their means estimate delta (unbiased).

    ``projections``: ``W = U L^T`` ``(S, b)`` (:func:`importance_draws`, :func:`dpjax.montecarlo.gram_sqrt`);
    ``mode_index`` ``(S,)``; ``comp_uniform`` ``(S,)``; ``epsilon`` ``(K,)``; ``proposal``: :class:`Proposal`.
    Differentiable in ``gram``, ``projections``, ``noise_multiplier`` and ``epsilon``.
    """
    eps = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    proposal = as_proposal(proposal)
    _check_untilted(proposal)
    return _summands(jnp.asarray(gram, jnp.float64), jnp.asarray(projections, jnp.float64), mode_index,
                     jnp.asarray(comp_uniform, jnp.float64), jnp.asarray(noise_multiplier, jnp.float64),
                     eps, proposal)


@float64
def importance_delta_from_projections(gram, projections, mode_index, comp_uniform, noise_multiplier,
                                      epsilon, proposal):
    """Variance-reduced delta (max over both directions) on materialised draws; ``epsilon``'s shape.

    The in-loop estimator: smooth in ``(gram, projections, noise_multiplier, epsilon)`` for fixed
    draws and proposal.
    """
    eps = jnp.asarray(epsilon, jnp.float64)
    x_f, x_r = importance_summands(gram, projections, mode_index, comp_uniform, noise_multiplier,
                                   eps.reshape(-1), proposal)
    return jnp.maximum(jnp.mean(x_f, axis=0), jnp.mean(x_r, axis=0)).reshape(eps.shape)


# --------------------------------------------------------------------------- chunked sums


def _chunk_sums(gram, sqrt_gram, sigma, epsilon, key, first_block, proposal, bets, levels, tables, *,
                num_samples, chunk_blocks):
    b = gram.shape[0]
    block_ids = first_block + jnp.arange(chunk_blocks)
    mode_index, u, cu = jax.vmap(lambda j: draw_block(key, j, b))(block_ids)
    mode_index, u, cu = mode_index.reshape(-1), u.reshape(-1, b), cu.reshape(-1)
    tu = jax.vmap(lambda j: tilt_draw_block(tilt_key(key), j))(block_ids).reshape(-1, TILT_WORDS)
    sample_ids = (block_ids[:, None] * BLOCK_SIZE + jnp.arange(BLOCK_SIZE)[None, :]).reshape(-1)
    valid = (sample_ids < num_samples)[:, None]
    x_f, x_r = _summands(gram, u @ sqrt_gram.T, mode_index, cu, sigma, epsilon, proposal, tu, tables)
    x = jnp.stack([jnp.where(valid, x_f, 0.0), jnp.where(valid, x_r, 0.0)])   # (2, S, K)
    total = x.sum(axis=1)
    total_sq = (x * x).sum(axis=1)
    maximum = x.max(axis=1)
    # log(1 + bet (level - X)) summed; 0 for padding samples.  bets (2, K, J), levels (K,).
    factor = 1.0 + bets[:, None, :, :] * (levels[None, None, :, None] - x[..., None])
    log_f = jnp.where(factor > 0, jnp.log(jnp.where(factor > 0, factor, 1.0)), -jnp.inf)
    log_wealth = jnp.where(valid[None, :, :, None], log_f, 0.0).sum(axis=1)
    return total, total_sq, maximum, log_wealth


def _sums_over_chunks(devices, gram, sqrt_gram, sigma, epsilon, key, proposal, bets, levels, *,
                      num_samples, chunk_blocks, num_chunks):
    """Sums over the chunks of ``chunk_blocks`` blocks, laid out over ``devices`` (one device: a
    loop) and combined in chunk order (:mod:`dpjax.montecarlo._spread`): the same bits on any
    number of devices.  The chunk body is rematerialised under reverse-mode AD."""
    from dpjax.montecarlo import _spread

    body_fn = jax.checkpoint(functools.partial(_chunk_sums, num_samples=num_samples, chunk_blocks=chunk_blocks))
    tables = _tilt_tables(gram, sigma, proposal.fwd_tilt)

    def per_chunk(c, rep, _):
        g, sg, s, e, k, p, bt, lv, tb = rep
        return body_fn(g, sg, s, e, k, c * chunk_blocks, p, bt, lv, tb)

    layout = _spread.Layout(devices, num_chunks)
    return _spread.run(layout, per_chunk, (gram, sqrt_gram, sigma, epsilon, key, proposal, bets, levels, tables),
                       (), (_spread.ADD, _spread.ADD, _spread.MAX, _spread.ADD))


def _prepare(gram, noise_multiplier, epsilon, key, proposal, bets, levels):
    gram = jnp.asarray(gram, jnp.float64)
    eps = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    k = eps.shape[0]
    if bets is None:
        bets = jnp.zeros((2, k, 0))
        levels = jnp.zeros((k,))
    return (gram, jnp.asarray(noise_multiplier, jnp.float64), eps, rbg_key(key), as_proposal(proposal),
            jnp.asarray(bets, jnp.float64), jnp.broadcast_to(jnp.asarray(levels, jnp.float64), (k,)))


@float64
@functools.partial(jax.jit, static_argnames=("num_samples", "chunk_size"))
def importance_sums(gram, noise_multiplier, epsilon, key, num_samples: int, proposal, bets=None,
                    levels=None, chunk_size: int | None = None) -> ImportanceSums:
    """Sums of both directions' summands on one device (jittable, differentiable).

    ``gram (b, b)``, ``epsilon (K,)``, ``proposal``: :class:`Proposal`.  ``bets`` ``(2, K, J)`` and
    ``levels`` ``(K,)`` (optional): also return ``sum_s log(1 + bet (level - X_s))`` for each
    direction, epsilon and bet (the log-wealth of the betting test of :mod:`dpjax.montecarlo.evr`).
    """
    gram, sigma, eps, key, proposal, bets, levels = _prepare(gram, noise_multiplier, epsilon, key,
                                                             proposal, bets, levels)
    chunk_blocks, num_chunks = chunk_plan(num_samples, chunk_size, 1, gram.shape[0])
    out = _sums_over_chunks((None,), gram, gram_sqrt(gram), sigma, eps, key, proposal, bets, levels,
                            num_samples=num_samples, chunk_blocks=chunk_blocks, num_chunks=num_chunks)
    return ImportanceSums(*out)


@float64
def sharded_importance_sums(gram, noise_multiplier, epsilon, key, num_samples: int, proposal, bets=None,
                            levels=None, chunk_size: int | None = None, devices=None) -> ImportanceSums:
    """:func:`importance_sums` spread over ``devices`` (default ``jax.devices()``: every device of
    every process, after ``jax.distributed.initialize()``).

    The chunks are the single-device call's; device ``d`` of ``D`` computes chunks
    ``d c .. (d + 1) c - 1`` (``c = ceil(chunks / D)``) of the same stream, and every device
    combines the gathered chunk results in chunk order (sums added, maxima taken;
    :mod:`dpjax.montecarlo._spread`): the single-device call's result, bit for bit.
    """
    devices = list(jax.devices() if devices is None else devices)
    # Arrays of fixed dtypes before the compiled program: a NumPy scalar and a Python float (a
    # strong and a weak type to jit) would otherwise compile two programs for the same sums.
    args = _prepare(gram, noise_multiplier, epsilon, key, proposal, bets, levels)
    if len(devices) == 1:
        return importance_sums(*args[:4], num_samples, *args[4:], chunk_size=chunk_size)
    fn = _sharded_fn(tuple(devices), num_samples, chunk_size, args[0].shape[0])
    return ImportanceSums(*fn(*args))


@functools.lru_cache(maxsize=64)
def _sharded_fn(devices, num_samples, chunk_size, b):
    # The single device's chunks, combined in its order (see sharded_importance_sums).
    chunk_blocks, num_chunks = chunk_plan(num_samples, chunk_size, 1, b)

    @jax.jit
    def run(gram, sigma, eps, key, proposal, bets, levels):
        return _sums_over_chunks(devices, gram, gram_sqrt(gram), sigma, eps, key, proposal, bets, levels,
                                 num_samples=num_samples, chunk_blocks=chunk_blocks, num_chunks=num_chunks)

    return run


@float64
def importance_delta_estimate(gram, noise_multiplier, epsilon, key, num_samples: int, proposal=None,
                              chunk_size: int | None = None):
    """Variance-reduced delta: ``(delta, standard_error)`` of ``epsilon``'s shape (max direction).

    ``proposal`` defaults to :func:`default_proposal` at ``(gram, noise_multiplier, epsilon)``
    (the largest epsilon; host-side, so pass one explicitly under ``jit`` / ``grad``).

    Example::

        with jax.enable_x64(True):
            g = gram_from_columns(jnp.array([1.0, 0.5, 0.25]), 32, 8)
            d, se = importance_delta_estimate(g, 1.0, 2.0, jax.random.key(0), 1 << 14)
    """
    eps = jnp.asarray(epsilon, jnp.float64)
    if proposal is None:
        proposal = default_proposal(np.asarray(gram), float(noise_multiplier), float(np.max(eps)))
    sums = importance_sums(gram, noise_multiplier, eps.reshape(-1), key, num_samples, proposal,
                           chunk_size=chunk_size)
    m = num_samples
    mean = sums.total / m
    var = jnp.maximum(sums.total_sq / m - mean * mean, 0.0) * (m / max(m - 1, 1))
    se = jnp.sqrt(var / m)
    pick = jnp.argmax(mean, axis=0)
    delta = jnp.max(mean, axis=0)
    stderr = jnp.take_along_axis(se, pick[None, :], axis=0)[0]
    return delta.reshape(eps.shape), stderr.reshape(eps.shape)


# --------------------------------------------------------------------------- proposal choice


def _ld_forward(gram, sigma, eps):
    """Cheapest shift ``(theta, t)`` (Gaussian cost ``|shift|^2 / (2 sigma^2)``) that brings the
    annealed loss ``log (1/b) sum_i E[e^{l_i}]`` of the largest mode to ``eps`` (a grid)."""
    d = jnp.diagonal(gram)
    g = jnp.mean(gram, axis=1)
    v = jnp.mean(g)
    b = gram.shape[0]
    j = jnp.argmax(d)
    s2 = sigma * sigma
    grid = jnp.concatenate([jnp.zeros(1), jnp.geomspace(1e-2, 64.0, 47)])
    theta = grid[:, None] * s2 / d[j]
    t = grid[None, :] * s2 / jnp.maximum(jnp.mean(g), 1e-300)
    logits = ((1.0 + theta)[..., None] * gram[j][None, None, :] + t[..., None] * g[None, None, :]) / s2
    m = jnp.max(logits, axis=-1)
    y = m + jnp.log(jnp.sum(jnp.exp(logits - m[..., None]), axis=-1)) - math.log(b)
    cost = (theta ** 2 * d[j] + 2 * theta * t * g[j] + t ** 2 * v) / (2 * s2)
    cost = jnp.where(y >= eps, cost, jnp.inf)
    flat = jnp.argmin(cost.reshape(-1))
    ti, tj = flat // grid.shape[0], flat % grid.shape[0]
    ok = jnp.isfinite(cost.reshape(-1)[flat])
    return jnp.where(ok, theta[ti, 0], theta[-1, 0]), jnp.where(ok, t[0, tj], 0.0)


def _ld_reverse(gram, sigma, eps):
    """Shift ``s`` with ``-log (1/b) sum_i exp(-s g_i / sigma^2) = eps`` (bisection in ``log s``)."""
    g = jnp.mean(gram, axis=1)
    s2 = sigma * sigma
    scale = s2 / jnp.maximum(jnp.mean(g), 1e-300)

    def y(log_s):
        z = -jnp.exp(log_s) * g / s2
        m = jnp.max(z)
        return -(m + jnp.log(jnp.mean(jnp.exp(z - m))))

    lo, hi = jnp.log(scale * 1e-6), jnp.log(scale * 1e6)

    def body(_, br):
        lo, hi = br
        mid = 0.5 * (lo + hi)
        up = y(mid) >= eps
        return jnp.where(up, lo, mid), jnp.where(up, mid, hi)

    lo, hi = jax.lax.fori_loop(0, 80, body, (lo, hi))
    return jnp.exp(hi)


def _range_theta(gram, sigma, eps):
    """``theta`` minimising the closed-form range bound of one per-mode component (see
    :func:`summand_range`): ``theta LSE_J((1 + theta) G_JJ / (2 sigma^2)) - theta log b - theta eps
    + theta log theta - (1 + theta) log(1 + theta)``."""
    d = jnp.diagonal(gram)
    b = gram.shape[0]
    th = jnp.geomspace(1e-2, 200.0, 400)
    a = (1.0 + th)[:, None] * d[None, :] / (2 * sigma * sigma)
    m = jnp.max(a, axis=1)
    lse = m + jnp.log(jnp.sum(jnp.exp(a - m[:, None]), axis=1))
    val = th * lse - th * math.log(b) - th * eps + th * jnp.log(th) - (1 + th) * jnp.log1p(th)
    return th[jnp.argmin(val)]


def _range_shift(gram, sigma, eps):
    """``s`` minimising the reverse range bound of one component:
    ``-s eps + s dbar/(2 sigma^2) + s^2 v/(2 sigma^2) + s log s - (1 + s) log(1 + s)``."""
    d = jnp.diagonal(gram)
    v = jnp.mean(gram)
    s2 = sigma * sigma
    s = jnp.geomspace(1e-3, 1e4, 600)
    val = -s * eps + s * jnp.mean(d) / (2 * s2) + s * s * v / (2 * s2) + s * jnp.log(s) - (1 + s) * jnp.log1p(s)
    return s[jnp.argmin(val)]


@float64
def default_proposal(gram, noise_multiplier, epsilon, *, range_weight: float = 0.0,
                     defensive_weight: float = 0.05, tilt_weights=(0.0, 0.0, 0.0)) -> Proposal:
    """A proposal for ``(G, sigma, eps)`` (jittable; pure function of its inputs).

    Component 0: the plain law (``defensive_weight``).  Component 2: the large-deviations shift,
    the cheapest ``(theta, t)`` / ``s`` that brings the typical loss to ``eps`` (low variance;
    P||Q: weight ``1 - defensive - range - sum(tilt_weights)``).  Component 1
    (``range_weight``): the shift that minimises the closed-form bound of the summands
    (:func:`summand_range`): a certificate's range; 0 for estimates.  ``tilt_weights``: P||Q's
    tilted components of orders ``TILT_ORDERS`` (certificates, with :func:`importance_sums`).
    """
    gram = jnp.asarray(gram, jnp.float64)
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    eps = jnp.asarray(epsilon, jnp.float64)
    th_v, t_v = _ld_forward(gram, sigma, eps)
    s_v = _ld_reverse(gram, sigma, eps)
    th_u, s_u = _range_theta(gram, sigma, eps), _range_shift(gram, sigma, eps)
    a0, a1 = defensive_weight, range_weight
    tilt = jnp.asarray(tilt_weights, jnp.float64)
    w = jnp.array([a0, a1, 1.0 - a0 - a1])
    w_fwd = jnp.array([a0, a1, jnp.maximum(1.0 - a0 - a1 - jnp.sum(tilt), 0.0)])
    zero = jnp.zeros(())
    return Proposal(fwd_weight=w_fwd, fwd_theta=jnp.stack([zero, th_u, th_v]),
                    fwd_shift=jnp.stack([zero, zero, t_v]), rev_weight=w,
                    rev_shift=jnp.stack([zero, s_u, s_v]), fwd_tilt=tilt)


# --------------------------------------------------------------------------- range


def _sup_ratio(eps: float, const: float, coef: np.ndarray, rate: np.ndarray) -> float:
    """Rigorous ``sup_{y > eps} (1 - e^{eps - y}) / D(y)``, ``D(y) = const + sum_k coef_k e^{rate_k y}``
    (``coef, rate >= 0``).

    ``h`` and ``D`` both increase in ``y``, so on ``[y_i, y_{i+1}]`` the ratio is at most
    ``h(y_{i+1}) / D(y_i)``; past the last grid point it is at most ``1 / D(y_N)``.  Computed in
    log space (``log D`` by a stable logsumexp).
    """
    coef = np.asarray(coef, np.float64)
    rate = np.asarray(rate, np.float64)
    keep = (coef > 0) & (rate > 0)
    const = const + float(np.sum(coef[(coef > 0) & (rate == 0)]))
    coef, rate = coef[keep], rate[keep]
    if not rate.size:
        return 1.0 / const if const > 0 else math.inf
    top = float(np.max(rate))
    # Past y_end some term of D exceeds e^60, so the tail contributes at most e^-60.
    y_end = eps + max(1e-6, float(np.min((60.0 - np.log(coef)) / rate - eps)))
    step = max(1e-3 / top, (y_end - eps) / 2e6)   # bracket overestimate <= e^{top step}
    y = eps + np.arange(int(math.ceil((y_end - eps) / step)) + 2) * step
    logs = [np.full_like(y, math.log(const))] if const > 0 else []
    logs += [math.log(c) + r * y for c, r in zip(coef, rate)]
    stack = np.stack(logs)
    mx = np.max(stack, axis=0)
    log_d = mx + np.log(np.sum(np.exp(stack - mx), axis=0))
    h_next = -np.expm1(eps - y[1:])
    # At an epsilon so large that eps + step rounds to eps, the grid's points coincide: those
    # intervals are empty (h = 0, log -inf) and the tail term below bounds every y > eps.
    with np.errstate(divide="ignore"):
        inner = np.max(np.log(h_next) - log_d[:-1])
    tail = -log_d[-1]
    return float(math.exp(max(inner, tail)))


def tilt_log_normalizers(gram, noise_multiplier: float, orders=TILT_ORDERS) -> dict:
    """``{k: log Z_k}``, ``Z_k = E_Q[(P/Q)^k] = b^-k sum_{i_1..i_k} exp(sum_{a<c} G[i_a, i_c] / sigma^2)``
    (host-side, NumPy float64; the same sums as the sampler's tables).

    Where ``G / sigma^2`` overflows float64 (sigma below about 1e-154 times the scale of ``G``),
    every ``log Z_k`` is +inf: ``Z_k >= b^-k exp(k (k - 1) / 2 max_i G_ii / sigma^2)`` (all indices
    at the largest diagonal entry, the largest entry of a Gram matrix), whose logarithm exceeds
    the largest float."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        g = np.asarray(gram, np.float64) / float(noise_multiplier) ** 2
    b = g.shape[0]
    a_max = float(np.max(g))
    if not math.isfinite(a_max) or np.isnan(g).any():
        return {k: math.inf for k in orders}
    a = np.exp(g - a_max)
    out = {}
    for k in orders:
        if k == 2:
            total = np.sum(a)
        elif k == 3:
            total = np.sum(a * (a @ a))
        elif k == 4:
            v = (a[:, None, :] * a[None, :, :]).reshape(b * b, b)
            total = np.sum(a.reshape(-1) * np.sum((v @ a) * v, axis=1))
        else:
            raise ValueError(f"tilt orders are {TILT_ORDERS}, got {k}")
        out[k] = math.log(total) + k * (k - 1) / 2 * a_max - k * math.log(b)
    return out


def summand_range(gram, noise_multiplier: float, epsilon: float, proposal) -> tuple[float, float]:
    """Upper bounds ``(R_remove, R_add)`` on every summand of :func:`importance_summands` at
    ``(G, sigma, eps)`` (host-side, NumPy; a ``1 + 1e-9`` factor covers round-off).

    P||Q: with ``a_J = e^{l_J}``, ``l_J = (<X, m_J> - G_JJ/2)/sigma^2`` and ``e^Y = (1/b) sum_J a_J``,
    a component with ``t = 0`` has ``R_k/Q = (1/b) sum_J c_J a_J^{1+theta}``,
    ``c_J = exp(-theta (1+theta) G_JJ / (2 sigma^2))``, which by Hoelder (minimising over ``a`` with
    ``sum_J a_J`` fixed) is at least ``(1/b) (b e^Y)^{1+theta} K^{-theta}``,
    ``K = sum_J exp((1+theta) G_JJ / (2 sigma^2))``; components with ``t > 0`` count as 0.  So the
    summand ``e^Y h(Y) / (R/Q)`` is at most ``h(Y) / (pi_0 + sum_k pi_k b^theta K^{-theta}
    e^{theta Y})``.  Q||P: by Jensen ``mean_i l_i <= log (1/b) sum_i e^{l_i} = -Y'``, so
    ``<X, vbar> <= -sigma^2 Y' + mean(G_ii)/2`` and component ``k``'s ratio ``N(-s vbar)/Q`` is at
    least ``exp(s Y' - s mean(G_ii)/(2 sigma^2) - s^2 v/(2 sigma^2))``.  Both maxima over the loss
    ``> eps`` by :func:`_sup_ratio`.  A tilted component of order ``k`` has ``R_k/P = e^{(k-1) Y} / Z_k``
    exactly (:func:`tilt_log_normalizers`): the term ``pi_k e^{(k-1) Y} / Z_k`` of the denominator.
    """
    g = np.asarray(gram, np.float64)
    sigma, eps = float(noise_multiplier), float(epsilon)
    p = Proposal(*(np.asarray(x, np.float64) for x in proposal))
    d = np.diagonal(g)
    b = g.shape[0]
    s2 = sigma * sigma
    if not 0.0 < s2 < math.inf:
        # The bounds divide by sigma^2; where it underflows (sigma below ~1e-154) or overflows none
        # is proven, so no summand range is finite and no betting test can pass.
        return math.inf, math.inf
    # P || Q
    const = float(p.fwd_weight[(p.fwd_theta == 0) & (p.fwd_shift == 0)].sum())
    coef, rate = [], []
    for k in range(p.fwd_weight.shape[0]):
        th = float(p.fwd_theta[k])
        if p.fwd_weight[k] > 0 and p.fwd_shift[k] == 0 and th > 0:
            with np.errstate(over="ignore"):
                a = (1 + th) * d / (2 * s2)
            if not np.all(np.isfinite(a)):
                # K overflows, so this term of the denominator is below the smallest float;
                # leaving it out only raises the bound (the terms are nonnegative).
                continue
            log_k = a.max() + math.log(np.sum(np.exp(a - a.max())))
            coef.append(math.exp(min(math.log(p.fwd_weight[k]) + th * math.log(b) - th * log_k, 700.0)))
            rate.append(th)
    tilt = np.asarray(p.fwd_tilt, np.float64)
    used = [k for j, k in enumerate(TILT_ORDERS) if tilt[j] > 0]
    if used:
        if 4 in used and b > TILT4_MAX_B:
            return math.inf, math.inf
        log_z = tilt_log_normalizers(g, sigma, used)
        for j, k in enumerate(TILT_ORDERS):
            if tilt[j] > 0:   # R_k / P = e^{(k-1) Y} / Z_k exactly
                coef.append(math.exp(min(math.log(tilt[j]) - log_z[k], 700.0)))
                rate.append(float(k - 1))
    r_f = _sup_ratio(eps, const, np.array(coef), np.array(rate))
    # Q || P
    v = float(np.mean(g))
    const = float(p.rev_weight[p.rev_shift == 0].sum())
    coef, rate = [], []
    for k in range(p.rev_weight.shape[0]):
        s = float(p.rev_shift[k])
        if p.rev_weight[k] > 0 and s > 0:
            # In Python floats: an exponent that overflows (-inf, or NaN from inf - inf) gives the
            # coefficient 0, and leaving a nonnegative term out of the denominator only raises
            # the bound.
            log_c = math.log(p.rev_weight[k]) - s * float(np.mean(d)) / (2 * s2) - s * s * v / (2 * s2)
            coef.append(0.0 if math.isnan(log_c) else math.exp(min(log_c, 700.0)))
            rate.append(s)
    r_r = _sup_ratio(eps, const, np.array(coef), np.array(rate))
    return r_f * (1 + 1e-9), r_r * (1 + 1e-9)
