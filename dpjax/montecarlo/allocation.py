"""Monte Carlo accounting of banded matrix mechanisms under random allocation.

The sampler (Feldman & Shenfeld, "Privacy amplification by random allocation").  ``n = t E``
rounds: ``E`` epochs of ``t`` rounds (``batches_per_epoch``).  In every epoch each example takes
part in exactly ``k`` of the ``t`` rounds (``selections_per_epoch``), a uniformly random
``k``-subset, drawn afresh and independently each epoch and independently of the other examples.
``k = 1`` with the same round every epoch would be balls-in-bins; here the round is re-drawn.

The mechanism releases ``C x + sigma Z`` (``Z ~ N(0, I_n)``; ``C`` non-negative lower-triangular;
``x in {0, 1}^n`` the sensitive example's participation pattern; add/remove adjacency).
``sigma`` is the noise multiplier per unit of clip norm (no division by the norm of ``C``).

The dominating pair::

    P = E_x[ N(C x, sigma^2 I_n) ],   Q = N(0, sigma^2 I_n),

``x`` drawn from the random-allocation law.  Choquette-Choo, Ganesh, Haque, Steinke & Thakurta,
"Near Exact Privacy Amplification for Matrix Mechanisms", Lemma 3.2, state it for balls-in-bins
only; their proof uses of the sampler only that the sensitive example's pattern is drawn
independently of the other examples (so their contributions may be taken as 0) and that, given
its pattern, row ``r`` of the example's contribution has norm at most ``sum_j |C|[r, j] x_j``;
the mixture over the patterns is then dominated by the mixture of Gaussians with those means and
the patterns' probabilities (the mixture-of-Gaussians lemma they cite).  Random allocation has
both properties, and with ``C >= 0`` the mean is ``C x``.  docs/design.md §4.4 has the argument.
Directions as in :class:`dpjax.montecarlo.DeltaEstimate`: *remove* is ``P || Q`` (``X ~ P``,
loss ``log P/Q (X)``), *add* is ``Q || P`` (``X ~ Q``, loss ``log Q/P (X)``).

Likelihood ratio (exact; a forward algorithm).  For ``C`` with ``w`` bands (``C[i, j] = 0``
unless ``0 <= i - j < w``), ``G = C^T C`` has ``G[i, j] = <c_i, c_j> = 0`` for ``|i - j| >= w``, so::

    log N(C x, s^2 I)(y) / N(0, s^2 I)(y) = sum_j x_j log f_j(y) - sum_j sum_{d=1}^{w-1} x_j x_{j-d} G[j-d, j] / s^2,
    log f_j(y) = (<c_j, y> - |c_j|^2 / 2) / s^2.

A uniform ``k``-subset of ``t`` positions is the sequential rule "take position ``i`` with
probability ``r / (t - i)``", ``r`` the selections still to make; so ``x`` is a Markov chain on
``(last w - 1 participation bits, selections made this epoch)`` and ``P/Q (y)`` is the forward
algorithm of that chain, each participation at round ``j`` weighted by ``f_j(y)`` times
``exp(-sum_d x_{j-d} G[j-d, j] / s^2)`` (the bits in the state say which ``x_{j-d}`` are 1).
``2^(w-1) (k+1)`` states, log space, one ``lax.scan`` step per round, vectorised over samples and
both directions.  At ``C = I`` it is ``prod_epochs e_k(f_1 .. f_t) / binom(t, k)``, ``e_k`` the
elementary symmetric polynomial.  Supported: ``w <= MAX_BANDS`` and ``k <= MAX_SELECTIONS``
(the state count, hence the cost, is ``2^(w-1) (k+1)`` per round and sample).  A non-banded ``C``
(``w = n``) would need every earlier participation in the state: the ratio is then a sum over
``binom(t, k)^E`` patterns of a quadratic form in ``x``, with no exact evaluation this module
offers; such a ``C`` is refused.

Random stream: sample ``s`` lives in block ``s // BLOCK_SIZE``; block ``j`` draws ``n + 2
ceil(n / 2)`` uint64 words per sample from ``fold_in(rbg_key(key), j)`` (``n`` uniforms, the
``k`` smallest of each epoch's ``t`` marking its selections; ``n`` Box-Muller normals), so the
draws depend only on ``(key, n, sample index)``, never on ``sigma``, ``C`` or the chunking.  Both
directions use the same normals ``Z``: ``X_P = C x + sigma Z`` and ``X_Q = sigma Z``.

Public: :class:`RandomAllocation` (validated, host-facing: ``estimate`` / ``delta`` /
``privacy_losses`` / ``calibrate`` / ``certify`` / ``certify_noise``, as :class:`BMinSep`), the pure
jitted functions :func:`log_likelihood_ratio`, :func:`privacy_losses`, :func:`monte_carlo_sums`
(shapes static, ``sigma`` data) with :func:`band_table` to build their ``bands`` argument, and the
jittable, differentiable :func:`calibrate_on_samples`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.montecarlo import _chain, core
from dpjax.numerics.root import ImplicitAdjoint, Solution, StopGradientAdjoint

__all__ = ["RandomAllocation", "MAX_BANDS", "MAX_SELECTIONS", "band_table", "log_likelihood_ratio",
           "privacy_losses", "monte_carlo_sums", "calibrate_on_samples"]

#: Most bands of ``C``: the chain carries the last ``bands - 1`` participation bits.
MAX_BANDS = 6
#: Most selections per epoch ``k``: the chain carries the count ``0 .. k``.
MAX_SELECTIONS = 32

# The log of zero mass in the forward algorithm, and the floor every log-mass is clamped to after
# each round.  Not -inf: where two unreachable states merge, logaddexp(-inf, -inf) has the
# derivative exp(-inf - (-inf)) = NaN, and 0 * NaN would poison the implicit gradient of the
# calibration.  exp(-1e300) is exactly 0 in float64, so no value changes; the clamp keeps
# unreachable states from summing sentinels to -inf over many rounds, and keeps them far below
# every reachable state, whose log-mass is of the order of |c|^2 / sigma^2 (the two meet only
# for sigma below ~1e-147 times the column norms; below ~1e-154 sigma^2 underflows and every
# loss is NaN, counted as +inf).
_LOG_ZERO = -1e300


# --------------------------------------------------------------------------- validation


def _scheme(batches_per_epoch, selections_per_epoch) -> tuple[int, int]:
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    k = _validate.positive_int("selections_per_epoch", selections_per_epoch, maximum=min(t, MAX_SELECTIONS))
    return t, k


def band_table(correlation, batches_per_epoch: int, epochs: int) -> np.ndarray:
    """The ``(n, w)`` band table of a banded ``C``, ``n = batches_per_epoch * epochs``:
    ``bands[j, d] = C[j + d, j]`` (0 past row ``n``), ``w`` the band count.

    Args:
      correlation: ``C`` as :func:`dpjax.matrices.correlation_array` takes it: a 1-D Toeplitz
        first column, a dense ``(n, n)`` lower-triangular matrix (banded, not necessarily
        Toeplitz), or a :class:`dpjax.matrices.Toeplitz`.  Non-negative entries.
      batches_per_epoch: ``t``.  epochs: ``E``.

    Raises:
      ValueError: invalid ``C`` (NaN/inf, negative, upper-triangular entries, wrong shape), or more
        than :data:`MAX_BANDS` bands (a non-banded ``C`` among them).

    Example::

        band_table(np.array([1.0, 0.5]), batches_per_epoch=2, epochs=2)
        # [[1, .5], [1, .5], [1, .5], [1, 0]]
    """
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    e = _validate.positive_int("epochs", epochs)
    bands = _chain.band_columns(correlation, t * e)
    if bands.shape[1] > MAX_BANDS:
        raise ValueError(
            f"correlation has {bands.shape[1]} bands; random-allocation Monte Carlo supports 1 to {MAX_BANDS} "
            f"(C[i, j] = 0 unless 0 <= i - j < {MAX_BANDS}): its exact likelihood ratio carries the last bands - 1 "
            f"participations in the state of a forward algorithm (2^(bands - 1) (k + 1) states), and a non-banded "
            f"C has no such evaluation (docs/design.md §4.4)")
    return bands


def _check(bands, batches_per_epoch, selections_per_epoch):
    _chain.check_bands(bands, MAX_BANDS, "MAX_BANDS")
    t, k = _scheme(batches_per_epoch, selections_per_epoch)
    if bands.shape[0] % t:
        raise ValueError(f"bands must have a multiple of batches_per_epoch = {t} rows (epochs * batches_per_epoch), "
                         f"got shape {bands.shape}")
    return t, k


# --------------------------------------------------------------------------- the chain


def _selection_log_probs(t: int, k: int):
    """``(log p1, log p0)``, each ``(t, k + 1)``: at in-epoch position ``i`` with ``c`` selections
    made, take the position with probability ``(k - c) / (t - i)`` (a uniform ``k``-subset drawn
    one position at a time).  States with ``k - c > t - i`` are unreachable; their probability is
    clipped to 1 so that no logarithm of a negative number arises; log 0 is ``_LOG_ZERO``."""
    left = (k - np.arange(k + 1))[None, :].astype(np.float64)
    positions = (t - np.arange(t))[:, None].astype(np.float64)
    p1 = np.minimum(left / positions, 1.0)
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(p1), _LOG_ZERO), np.maximum(np.log1p(-p1), _LOG_ZERO)


def _pair_terms(bands):
    """``(n, w - 1)``: column ``d - 1`` holds ``G[j - d, j] = <c_{j-d}, c_j>`` (0 for ``j < d``),
    the inner products of a column with the ``w - 1`` columns before it (``G = C^T C`` vanishes
    farther out)."""
    n, w = bands.shape
    cols = []
    for d in range(1, w):
        # Row j of `earlier` is column j - d's band entries: C[j - d + s', j - d] = earlier[j, s'];
        # C[j + s, j - d] = earlier[j, d + s] meets C[j + s, j] = bands[j, s].
        earlier = jnp.pad(bands[: n - d], [(d, 0), (0, 0)])
        cols.append(jnp.sum(earlier[:, d:] * bands[:, : w - d], axis=1))
    return jnp.stack(cols, axis=1) if cols else jnp.zeros((n, 0), bands.dtype)


def _state_penalties(bands, sigma):
    """``(n, 2^(w-1))``: ``-sum_d x_{j-d} G[j-d, j] / sigma^2`` for every bit state, bit ``d - 1`` of
    the state being ``x_{j-d}`` (Choquette-Choo et al.'s pair expanded: ``|C x|^2 = sum_j x_j
    |c_j|^2 + 2 sum_{j' < j} x_j' x_j G[j', j]``, half of it per participation)."""
    w = bands.shape[1]
    states = np.arange(2 ** (w - 1))
    bits = ((states[:, None] >> np.arange(w - 1)[None, :]) & 1).astype(np.float64)  # (B, w - 1)
    return -(_pair_terms(bands) @ bits.T) * (1.0 / (sigma * sigma))


def _forward(log_f, penalties, t: int, k: int):
    """``log P/Q`` from log emission factors ``log_f (n, ...)`` and the state penalties
    ``(n, B)``: the forward algorithm over ``(bits, count)``, ``B = 2^(w-1)`` bit states.

    ``alpha[o, c]`` is the log of the ratio-weighted mass of the histories so far whose last
    ``w - 1`` participation bits are ``o`` (bit ``d - 1``: ``d`` rounds back) and that made ``c``
    selections this epoch.  A round either skips (probability ``1 - (k - c)/(t - i)``) or takes
    (``(k - c)/(t - i)``, times ``f_j`` and the penalty of ``o``); then the oldest bit drops out and
    the new one enters, ``o' = 2 (o mod B/2) + x_j``.  Every path ends an epoch at ``c = k``, where
    the count restarts.
    """
    n = log_f.shape[0]
    e = n // t
    batch = log_f.shape[1:]
    num_states = penalties.shape[1]
    log_p1, log_p0 = (jnp.asarray(a, log_f.dtype) for a in _selection_log_probs(t, k))
    lanes = (None,) * len(batch)
    neg = jnp.full((num_states, 1) + batch, _LOG_ZERO, log_f.dtype)
    alpha = jnp.full((num_states, k + 1) + batch, _LOG_ZERO, log_f.dtype).at[0, 0].set(0.0)

    def round_step(alpha, inputs):
        row, penalty, l1, l0 = inputs
        skip = alpha + l0[(None, slice(None)) + lanes]
        take = alpha + (l1[None, :] + penalty[:, None])[(slice(None), slice(None)) + lanes] + row[None, None]
        take = jnp.concatenate([neg, take[:, :-1]], axis=1)  # a selection moves c to c + 1
        if num_states == 1:
            return jnp.maximum(jnp.logaddexp(skip, take), _LOG_ZERO), None
        half = num_states // 2
        skip = jnp.logaddexp(skip[:half], skip[half:])  # the oldest bit leaves the state
        take = jnp.logaddexp(take[:half], take[half:])
        return jnp.maximum(jnp.stack([skip, take], axis=1).reshape(alpha.shape), _LOG_ZERO), None

    def epoch_step(alpha, inputs):
        rows, pens = inputs
        alpha, _ = jax.lax.scan(round_step, alpha, (rows, pens, log_p1, log_p0))
        # All mass is at c = k (a path that skipped too often had probability 0): restart at c = 0.
        return jnp.concatenate([alpha[:, k:], jnp.broadcast_to(neg, (num_states, k) + batch)], axis=1), None

    alpha, _ = jax.lax.scan(epoch_step, alpha, (log_f.reshape((e, t) + batch), penalties.reshape(e, t, num_states)))
    return jax.nn.logsumexp(alpha[:, 0], axis=0)


def _participation(u, t: int, k: int):
    """Participation patterns ``x (n, S)`` (float 0/1): in each epoch the ``k`` positions with the
    smallest uniforms ``u (n, S)``, a uniformly random ``k``-subset (the ranks of i.i.d. uniforms are
    a uniform permutation).  Positions tied with the ``k``-th smallest value (two equal 52-bit
    uniforms, probability ~t^2 2^-53 per epoch) are taken in order only as far as ``k``, so every
    epoch has exactly ``k`` selections."""
    n, s = u.shape
    per_epoch = u.reshape(n // t, t, s)
    kth = jnp.sort(per_epoch, axis=1)[:, k - 1: k]
    below = per_epoch < kth
    tied = per_epoch == kth
    room = k - jnp.sum(below, axis=1, keepdims=True)
    x = below | (tied & (jnp.cumsum(tied, axis=1) <= room))
    return x.reshape(n, s).astype(u.dtype)


def _losses_from_draws(bands, sigma, u, z, t, k):
    x = _participation(u, t, k)
    log_f = _chain.paired_log_emissions(bands, x, z, sigma)  # (n, 2, S): X_P and X_Q share Z
    return _chain.directions(_forward(log_f, _state_penalties(bands, sigma), t, k))


# --------------------------------------------------------------------------- pure functions


@float64
@functools.partial(jax.jit, static_argnames=("batches_per_epoch", "selections_per_epoch"))
def log_likelihood_ratio(bands, observations, noise_multiplier, *, batches_per_epoch: int,
                         selections_per_epoch: int = 1):
    """``log P/Q (y)`` at given outputs, exactly: the forward algorithm of the allocation chain.

    Args:
      bands: ``(n, w)`` band table of ``C`` (:func:`band_table`), ``w <= MAX_BANDS``, ``n`` a
        multiple of ``batches_per_epoch``.
      observations: ``(n,)`` or ``(n, S)`` outputs ``y`` (rounds first).
      noise_multiplier: ``sigma`` (scalar; data, not static).
      batches_per_epoch: ``t`` (static).  selections_per_epoch: ``k`` in ``[1, min(t, MAX_SELECTIONS)]``
        (static).

    Returns:
      ``(S,)`` (or scalar) float64 ``log P(y) / Q(y)``.  For ``y ~ P`` it is the remove-direction
      loss; for ``y ~ Q`` its negative is the add-direction loss.

    Example::

        y = np.random.default_rng(0).normal(size=(64, 10))
        log_likelihood_ratio(band_table(np.array([1.0, 0.5]), 16, 4), y, 1.0, batches_per_epoch=16)
    """
    bands = jnp.asarray(bands, jnp.float64)
    y = jnp.asarray(observations, jnp.float64)
    t, k = _check(bands, batches_per_epoch, selections_per_epoch)
    _chain.check_observations(bands, y)
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    return _forward(_chain.log_emissions(bands, y, sigma), _state_penalties(bands, sigma), t, k)


@float64
@functools.partial(jax.jit, static_argnames=("batches_per_epoch", "num_samples", "selections_per_epoch"))
def privacy_losses(bands, noise_multiplier, key, *, batches_per_epoch: int, num_samples: int,
                   selections_per_epoch: int = 1):
    """Privacy-loss samples of both directions, ``(remove (S,), add (S,))``, ``S = num_samples``.

    ``remove``: ``log P/Q (X)``, ``X ~ P``; ``add``: ``log Q/P (X)``, ``X ~ Q``.  ``bands`` ``(n, w)``
    from :func:`band_table`; ``key`` a JAX key (the stream is in the module docstring).
    Materialises ``(n, S)`` arrays: for large ``S`` use :func:`monte_carlo_sums`.

    Example::

        remove, add = privacy_losses(band_table(np.array([1.0, 0.5]), 16, 4), 1.0, jax.random.key(0),
                                     batches_per_epoch=16, num_samples=4096)
    """
    bands = jnp.asarray(bands, jnp.float64)
    t, k = _check(bands, batches_per_epoch, selections_per_epoch)
    num_blocks = -(-num_samples // core.BLOCK_SIZE)
    u, z, _ = _chain.block_draws(core.rbg_key(key), 0, num_blocks, bands.shape[0], 0)
    remove, add = _losses_from_draws(bands, jnp.asarray(noise_multiplier, jnp.float64), u, z, t, k)
    return remove[:num_samples], add[:num_samples]


def _sums(bands, sigma, eps, key, *, t, k, num_samples, chunk_blocks, squares=True):
    """``(total (2, K), total_sq (2, K))`` of :func:`monte_carlo_sums` (traced arguments, rbg ``key``);
    differentiable in ``bands``, ``sigma`` and ``eps`` (the draws do not depend on them)."""
    n, w = bands.shape
    # The forward algorithm holds 2 directions x 2^(w-1) x (k+1) floats per sample.
    chunk_blocks = _chain.default_chunk_blocks(num_samples, max(2 * n, 2 ** w * (k + 1)), chunk_blocks)

    def losses(first):
        u, z, _ = _chain.block_draws(key, first, chunk_blocks, n, 0)
        return _losses_from_draws(bands, sigma, u, z, t, k)

    return _chain.chunked_sums(losses, num_samples, chunk_blocks, eps, squares)


@float64
@functools.partial(jax.jit, static_argnames=("batches_per_epoch", "num_samples", "selections_per_epoch",
                                             "chunk_blocks"))
def monte_carlo_sums(bands, noise_multiplier, epsilon, key, *, batches_per_epoch: int, num_samples: int,
                     selections_per_epoch: int = 1, chunk_blocks: int | None = None):
    """Sums of the hockey-stick terms ``max(0, 1 - exp(eps - L))`` and their squares, per direction.

    Returns :class:`dpjax.montecarlo.MonteCarloSums` with ``(2, K)`` arrays (row 0 remove, row 1
    add) for ``epsilon (K,)``; pass them with ``num_samples`` to
    :func:`dpjax.montecarlo.estimate_from_sums`.  Chunks of ``chunk_blocks`` blocks run in a
    ``lax.scan``; the draws are those of :func:`privacy_losses` whatever the chunking.

    Example::

        sums = monte_carlo_sums(band_table(np.ones(1), 8, 2), 1.0, np.array([1.0]), jax.random.key(0),
                                batches_per_epoch=8, num_samples=1 << 14)
        dpjax.montecarlo.estimate_from_sums(sums, 1 << 14)   # (means (2, 1), standard errors (2, 1))
    """
    bands = jnp.asarray(bands, jnp.float64)
    t, k = _check(bands, batches_per_epoch, selections_per_epoch)
    eps = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    total, total_sq = _sums(bands, jnp.asarray(noise_multiplier, jnp.float64), eps, core.rbg_key(key), t=t, k=k,
                            num_samples=num_samples, chunk_blocks=chunk_blocks)
    return core.MonteCarloSums(total, total_sq)


# --------------------------------------------------------------------------- calibration


def _calibration_total(sigma, bands, eps, consts, *, t, k, num_samples, chunk_blocks):
    """Hockey-stick sums at ``(bands, eps)`` on the draws of ``consts = (key_data,)``."""
    key = jax.random.wrap_key_data(consts[0], impl="rbg")
    return _sums(bands, sigma, eps, key, t=t, k=k, num_samples=num_samples, chunk_blocks=chunk_blocks,
                 squares=False)[0]


@float64
def calibrate_on_samples(bands, target_epsilon, target_delta, key, *, batches_per_epoch: int, num_samples: int,
                         selections_per_epoch: int = 1, adjoint=ImplicitAdjoint(),
                         chunk_blocks: int | None = None) -> Solution:
    """Jittable calibration: ``sigma*`` with ``delta_hat(sigma*) = target_delta`` on common random numbers.

    ``delta_hat(sigma)`` is :meth:`RandomAllocation.estimate`'s delta at ``target_epsilon`` (the max
    over the two directions) on the ``num_samples`` draws of ``key``, which do not depend on
    ``sigma``: a deterministic, continuous, non-increasing function of ``sigma``, solved by the
    monotone root finder as :func:`dpjax.montecarlo.bminsep.calibrate_on_samples` (bisection in
    ``log sigma`` over ``[1e-3, 1e4]`` times the largest column norm, the feasible end returned).
    Gradient (``adjoint=ImplicitAdjoint()``): the implicit function theorem at the root,
    ``d sigma*/d theta = -(d delta_hat/d theta) / (d delta_hat/d sigma)`` for ``theta`` the band table
    and ``target_epsilon``, ``1 / (d delta_hat/d sigma)`` for ``target_delta`` (Choquette-Choo,
    Ganesh, Haque, Steinke & Thakurta, "Near Exact Privacy Amplification for Matrix Mechanisms").

    Args:
      bands: ``(n, w)`` band table (:func:`band_table`); differentiable.
      target_epsilon, target_delta: scalars; differentiable.
      key: JAX PRNG key of the draws.
      batches_per_epoch, num_samples, selections_per_epoch, chunk_blocks: static.
      adjoint: :class:`~dpjax.calibration.ImplicitAdjoint` or :class:`~dpjax.calibration.StopGradientAdjoint`.

    Returns:
      :class:`~dpjax.calibration.Solution`: ``root`` the noise multiplier (float64; ``NaN`` with
      ``status = UNREACHABLE``).  An estimate from ``num_samples`` draws, not a certificate
      (:meth:`RandomAllocation.certify_noise`).

    Example::

        bands = band_table(np.array([1.0, 0.5]), 8, 4)
        with jax.enable_x64(True):  # under jit the float64 core needs x64 (docs/design.md §8)
            sol = jax.jit(functools.partial(calibrate_on_samples, batches_per_epoch=8, num_samples=1 << 14))(
                bands, 2.0, 1e-3, jax.random.key(0))
        sol.root
    """
    bands = jnp.asarray(bands, jnp.float64)
    t, k = _check(bands, batches_per_epoch, selections_per_epoch)
    key_data = jax.random.key_data(core.rbg_key(key))
    total_of = functools.partial(_calibration_total, t=t, k=k, num_samples=num_samples, chunk_blocks=chunk_blocks)
    return _chain.solve_on_samples(total_of, bands, target_epsilon, target_delta, (key_data,), num_samples, adjoint)


@functools.partial(jax.jit, static_argnames=("batches_per_epoch", "num_samples", "selections_per_epoch"))
def _calibrate_jit(bands, target_epsilon, target_delta, key, *, batches_per_epoch, num_samples,
                   selections_per_epoch):
    return calibrate_on_samples(bands, target_epsilon, target_delta, key, batches_per_epoch=batches_per_epoch,
                                num_samples=num_samples, selections_per_epoch=selections_per_epoch,
                                adjoint=StopGradientAdjoint())


# --------------------------------------------------------------------------- accountant


class RandomAllocation(_chain.ChainAccountant):
    """Monte Carlo accountant for ``C x + sigma Z`` under random allocation (``k`` of ``t`` rounds per epoch).

    Args:
      correlation: ``C``, non-negative lower-triangular with at most :data:`MAX_BANDS` bands: a 1-D
        Toeplitz first column (``[1.0]`` is DP-SGD), a dense ``(n, n)`` banded matrix, or a
        :class:`dpjax.matrices.Toeplitz` (see :func:`band_table`).
      batches_per_epoch: ``t >= 1`` rounds per epoch.
      epochs: ``E >= 1``; ``n = t E`` rounds.
      selections_per_epoch: ``k`` in ``[1, min(t, MAX_SELECTIONS)]``: rounds each example takes part
        in per epoch (as :class:`dpjax.RandomAllocation`).

    ``noise_multiplier`` is ``sigma`` per unit of clip norm.  The methods (``estimate``,
    ``delta``, ``privacy_losses``, ``calibrate``, ``certify``, ``certify_noise`` with
    ``method="bernoulli_kl"``, ``sensitivity``) are those of :class:`BMinSep`; every Monte Carlo
    figure comes with its sample count and a confidence interval or standard error, and only the
    certificates are guarantees.

    Example::

        acc = RandomAllocation(np.array([1.0, 0.5, 0.25]), batches_per_epoch=16, epochs=4)
        est = acc.estimate(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 16, key=0)
        est.delta, est.standard_error, est.delta_low, est.delta_high, est.num_samples
        sigma = acc.calibrate(2.0, 1e-3, num_samples=1 << 16, key=0)        # an estimate
        cert = acc.certify_noise(2.0, 0.05, key=1, num_samples=1 << 15)      # a certificate
    """

    def __init__(self, correlation, batches_per_epoch, epochs, *, selections_per_epoch=1):
        self.batches_per_epoch, self.selections_per_epoch = _scheme(batches_per_epoch, selections_per_epoch)
        self.epochs = _validate.positive_int("epochs", epochs)
        self.num_rounds = self.batches_per_epoch * self.epochs
        self.bands = band_table(correlation, self.batches_per_epoch, self.epochs)

    def __repr__(self) -> str:
        return (f"RandomAllocation(batches_per_epoch={self.batches_per_epoch}, epochs={self.epochs}, "
                f"selections_per_epoch={self.selections_per_epoch}, bands={self.bands.shape[1]})")

    def _scheme_args(self):
        return dict(batches_per_epoch=self.batches_per_epoch, selections_per_epoch=self.selections_per_epoch)

    def _losses(self, sigma, m, key):
        return privacy_losses(jnp.asarray(self.bands), sigma, key, num_samples=m, **self._scheme_args())

    def _sums(self, sigma, eps, m, key, chunk_blocks):
        return monte_carlo_sums(jnp.asarray(self.bands), sigma, eps, key, num_samples=m, chunk_blocks=chunk_blocks,
                                **self._scheme_args())

    def _root(self, eps, delta, m, key):
        return _calibrate_jit(jnp.asarray(self.bands), eps, delta, key, num_samples=m, **self._scheme_args())
