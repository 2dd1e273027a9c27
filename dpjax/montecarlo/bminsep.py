"""Monte Carlo accounting of banded matrix mechanisms under b-min-sep sampling.

Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep Subsampling" (arXiv 2602.09338).

The sampler (the paper's b-min-sep sampling; jax_privacy's ``BMinSepSampling``).  In each of
``n`` rounds an example that did not participate in the previous ``b - 1`` rounds (it is
*eligible*) participates with probability ``p``; an example that participated in round ``i``
sits out rounds ``i + 1 .. i + b - 1``.  With the *warm start* the process starts in its
stationary state: the example is eligible at round 0 with probability ``1 / (1 + (b - 1) p)``,
and otherwise it participated at one of the (unobserved) rounds ``-b + 1 .. -1``, each with
probability ``p / (1 + (b - 1) p)``; rounds before 0 only set the eligibility, they add nothing
to the output.  Without the warm start the example is eligible at round 0.

Special cases: ``b = 1`` is Poisson sampling with probability ``p``; ``p = 1`` with the warm
start is balls-in-bins with ``b`` batches per epoch (the example participates every ``b``
rounds from a uniform offset in ``0 .. b - 1``; the paper's reduction, also stated in
jax_privacy's ``BMinSepSampling``).

The dominating pair (Dong & Ganesh, the BandMF pair of Choquette-Choo et al. with the b-min-sep
participation law): for a non-negative lower-triangular ``C`` with at most ``b`` bands
(``C[i, j] = 0`` unless ``0 <= i - j < b``)::

    P = E_x[ N(C x, sigma^2 I_n) ],   Q = N(0, sigma^2 I_n),

``x in {0, 1}^n`` the participation pattern of the sensitive example.  ``sigma`` is the noise
multiplier (standard deviation per unit of clip norm; no division by the norm of ``C``), as in
jax_privacy's ``sample_generation``.  Directions, as in :class:`dpjax.montecarlo.DeltaEstimate`:
*remove* is ``P || Q`` (``X ~ P``, loss ``log P/Q (X)``; jax_privacy's ``positive_sample=True``),
*add* is ``Q || P`` (``X ~ Q``, loss ``log Q/P (X)``; jax_privacy's ``positive_sample=False``).

Likelihood ratio (Dong & Ganesh's dynamic program over the participation chain, run here forwards).  Because
participations are at least ``b`` rounds apart and column ``j`` of ``C`` lives on rows
``j .. j + b - 1``, the columns of two participations never overlap, so
``|C x|^2 = sum_{j: x_j = 1} |c_j|^2`` and::

    N(C x, s^2 I)(y) / N(0, s^2 I)(y) = prod_{j: x_j = 1} f_j(y),
    log f_j(y) = (<c_j, y> - |c_j|^2 / 2) / s^2,

``c_j`` the part of column ``j`` inside the ``n`` observed rounds.  The ratio ``P/Q`` is the
forward algorithm of the participation chain with these emission factors.  Let ``E_i`` be the
(weighted) mass of histories in which the example is eligible at round ``i`` and
``A_i = p f_i E_i`` that of histories with a participation at round ``i``; then::

    E_{i+1} = (1 - p) E_i + A_{i + 1 - b},     P/Q (y) = E_n + sum_{j = n - b + 1}^{n - 1} A_j,

(the final sum: eligible after the last round, or sitting out after a recent participation),
started from the stationary law (warm start: ``E_0 = 1 / (1 + (b - 1) p)``,
``A_j = p / (1 + (b - 1) p)`` for ``j = -b + 1 .. -1``) or from ``E_0 = 1`` (cold start).  It is
evaluated in log space with a ring of the last ``b`` values of ``A``, one ``lax.scan`` step per
round, vectorised over samples.  More bands than ``b`` are not supported: two participations'
columns would then overlap, ``|C x|^2`` gains cross terms, and the ratio no longer factorises
over participations (the chain's state would have to carry the recent participations).

Random stream: sample ``s`` lives in block ``s // BLOCK_SIZE``; block ``j`` draws
``n + 2 ceil(n / 2) + 1`` uint64 words per sample from ``fold_in(rbg_key(key), j)`` (``n``
participation uniforms, ``n`` Box-Muller normals, one warm-start uniform), so the draws depend
only on ``(key, n, sample index)``, never on ``sigma``, ``p``, ``C`` or the chunking.  Both
directions use the same normals ``Z``: ``X_P = C x + sigma Z`` and ``X_Q = sigma Z``.

Public: :class:`BMinSep` (validated, host-facing; :class:`DeltaEstimate` records; ``calibrate``
on common random numbers; Estimate-Verify-Release certificates ``certify`` / ``certify_noise``
through :mod:`dpjax.montecarlo.evr`), the pure jitted functions :func:`privacy_losses`,
:func:`log_likelihood_ratio`, :func:`monte_carlo_sums` (shapes static, ``sigma`` and ``p`` data:
a new noise multiplier or sampling probability never recompiles) with :func:`band_table` to
build their ``bands`` argument, and the jittable, differentiable :func:`calibrate_on_samples`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.matrices import correlation_array
from dpjax.montecarlo import core
from dpjax.montecarlo._accountant import (DeltaEstimate, _confidence, _validate_samples, delta_estimate_from_sums)
from dpjax.montecarlo._normal import normal_pairs_from_bits, uniform_open
from dpjax.montecarlo.calibrate import BRACKET_RELATIVE, DEFAULT_NUM_ITERATIONS
from dpjax.numerics.root import ImplicitAdjoint, Solution, StopGradientAdjoint, solve_monotone_root

__all__ = ["BMinSep", "band_table", "log_likelihood_ratio", "privacy_losses", "monte_carlo_sums",
           "calibrate_on_samples"]


# --------------------------------------------------------------------------- bands


def band_table(correlation, num_rounds: int, min_sep: int) -> np.ndarray:
    """The ``(n, k)`` band table of a banded ``C``: ``bands[j, t] = C[j + t, j]`` (0 past row ``n``).

    Args:
      correlation: ``C`` as :func:`dpjax.matrices.correlation_array` takes it: a 1-D Toeplitz
        first column (zero-padded or truncated to ``n``), a dense ``(n, n)`` lower-triangular
        matrix (general banded, not necessarily Toeplitz), or a :class:`dpjax.matrices.Toeplitz`.
        Non-negative entries.
      num_rounds: ``n``.
      min_sep: ``b``; ``C`` may have at most ``b`` bands.

    Returns:
      float64 ``(n, k)``, ``k`` the band count (index of the last non-zero sub-diagonal plus one;
      at least 1).

    Raises:
      ValueError: invalid ``C`` (NaN/inf, negative, upper-triangular entries, wrong shape), or
        ``k > min_sep`` (not supported: see the module docstring).

    Example::

        band_table(np.array([1.0, 0.5]), num_rounds=4, min_sep=2)
        # [[1, .5], [1, .5], [1, .5], [1, 0]]
    """
    n = _validate.positive_int("num_rounds", num_rounds)
    b = _validate.positive_int("min_sep", min_sep)
    arr = np.asarray(correlation_array(correlation, n), np.float64)
    if arr.ndim == 1:
        nonzero = np.nonzero(arr)[0]
        k = int(nonzero[-1]) + 1 if nonzero.size else 1
        rows = np.arange(n)[:, None] + np.arange(k)[None, :]
        bands = np.where(rows < n, arr[np.minimum(np.arange(k), n - 1)][None, :], 0.0)
    else:
        i, j = np.nonzero(arr)
        k = int(np.max(i - j)) + 1 if i.size else 1
        rows = np.arange(n)[:, None] + np.arange(k)[None, :]
        cols = np.broadcast_to(np.arange(n)[:, None], rows.shape)
        bands = np.where(rows < n, arr[np.minimum(rows, n - 1), cols], 0.0)
    if k > b:
        raise ValueError(
            f"correlation has {k} bands but min_sep = {b}: b-min-sep accounting supports at most "
            f"min_sep bands (C[i, j] = 0 unless 0 <= i - j < min_sep). With more bands two "
            f"participations' columns of C overlap and the likelihood ratio no longer factorises over "
            f"participations (Dong & Ganesh, arXiv 2602.09338); use a C with <= {b} bands or a larger min_sep")
    if not np.isfinite(np.sum(bands * bands)):
        raise ValueError("correlation produces non-finite column norms (entries too large)")
    return bands


# --------------------------------------------------------------------------- pure numerics


def _check_bands(bands, min_sep: int):
    if bands.ndim != 2:
        raise ValueError(f"bands must be 2-D (num_rounds, num_bands), got shape {bands.shape}")
    if not 1 <= bands.shape[1] <= min_sep:
        raise ValueError(f"bands must have between 1 and min_sep = {min_sep} columns (bands), "
                         f"got shape {bands.shape}")


def _log_emissions(bands, y, sigma):
    """``log f_j(y) = (<c_j, y> - |c_j|^2 / 2) / sigma^2`` for every round: ``(n, ...)``.

    ``bands (n, k)``, ``y (n, ...)``; ``c_j`` is truncated at round ``n`` by ``bands`` itself.
    """
    n, k = bands.shape
    pad = [(0, k - 1)] + [(0, 0)] * (y.ndim - 1)
    yp = jnp.pad(y, pad)
    expand = (slice(None),) + (None,) * (y.ndim - 1)
    dots = bands[:, 0][expand] * y
    for t in range(1, k):
        dots = dots + bands[:, t][expand] * yp[t: t + n]
    half_norms = 0.5 * jnp.sum(bands * bands, axis=1)
    inv_var = 1.0 / (sigma * sigma)
    return (dots - half_norms[expand]) * inv_var


def _mean(bands, x):
    """``C x`` for participation patterns ``x (n, S)``: ``(C x)_i = sum_t bands[i - t, t] x_{i - t}``."""
    n, k = bands.shape
    out = bands[:, 0][:, None] * x
    for t in range(1, k):
        # Row i receives column i - t's t-th band entry; rows < t receive nothing.
        shifted = jnp.pad((bands[:, t][:, None] * x)[: n - t], [(t, 0), (0, 0)]) if t < n else jnp.zeros_like(x)
        out = out + shifted
    return out


def _forward(log_f, sampling_prob, min_sep: int, warm_start: bool):
    """``log P/Q`` from log emission factors ``log_f (n, ...)`` by the forward recursion.

    Log-space form of Dong & Ganesh's dynamic program (arXiv 2602.09338), run from round
    0 upwards; see the module docstring for ``E`` and ``A``.  One scan step per round; the ring
    ``(b, ...)`` holds ``A_j`` at slot ``j mod b`` (updated in place by XLA: unrolling the ring
    into ``b`` static slots measured 1.5x slower on CPU).
    """
    n = log_f.shape[0]
    b = min_sep
    batch = log_f.shape[1:]
    dtype = log_f.dtype
    p = sampling_prob
    log_p = jnp.log(p)
    log_q = jnp.log1p(-p)  # -inf at p = 1: logaddexp(-inf, a) = a, as it should
    ring = jnp.full((b,) + batch, -jnp.inf, dtype)
    if warm_start:
        # Stationary law of the chain: eligible w.p. 1 / (1 + (b - 1) p), participated at round
        # -d (d = 1 .. b - 1) w.p. p / (1 + (b - 1) p) each (slot b - d).
        log_norm = jnp.log1p((b - 1) * p)
        log_e = jnp.broadcast_to(-log_norm, batch).astype(dtype)
        if b > 1:
            ring = ring.at[1:].set(jnp.broadcast_to(log_p - log_norm, (b - 1,) + batch).astype(dtype))
    else:
        log_e = jnp.zeros(batch, dtype)

    def step(carry, inputs):
        log_e, ring = carry
        i, row = inputs
        # A_i = p f_i E_i goes to slot i mod b (over A_{i-b}, which is already inside E_i) ...
        ring = jax.lax.dynamic_update_index_in_dim(ring, log_p + row + log_e, i % b, 0)
        # ... and E_{i+1} = (1 - p) E_i + A_{i+1-b}.
        back = jax.lax.dynamic_index_in_dim(ring, (i + 1) % b, 0, keepdims=False)
        return (jnp.logaddexp(log_q + log_e, back), ring), None

    (log_e, ring), _ = jax.lax.scan(step, (log_e, ring), (jnp.arange(n), log_f))
    # Slot n mod b holds A_{n-b}, already inside E_n; the other slots are A_{n-b+1} .. A_{n-1}.
    keep = np.arange(b) != (n % b)
    return jax.nn.logsumexp(jnp.concatenate([log_e[None], ring[keep]], axis=0), axis=0)


def _participation(u, u0, sampling_prob, min_sep: int, warm_start: bool):
    """Participation patterns ``x (n, S)`` (float 0/1) of the b-min-sep chain.

    ``u (n, S)`` uniforms decide each eligible round (participate iff ``u < p``); ``u0 (S,)``
    draws the warm-start state.  The state is the number of rounds the example still sits out.
    """
    b = min_sep
    p = sampling_prob
    if warm_start and b > 1:
        pi0 = 1.0 / (1.0 + (b - 1) * p)
        # Sits out d rounds (d = 1 .. b - 1), each with probability p pi0: it participated at -b + d.
        d = 1.0 + jnp.floor((u0 - pi0) / (p * pi0))
        s0 = jnp.where(u0 < pi0, 0, jnp.clip(d, 1, b - 1)).astype(jnp.int32)
    else:
        s0 = jnp.zeros(u0.shape, jnp.int32)

    def step(s, u_i):
        part = (s == 0) & (u_i < p)
        return jnp.where(part, b - 1, jnp.maximum(s - 1, 0)), part

    _, x = jax.lax.scan(step, s0, u)
    return x.astype(u.dtype)


def _block_draws(key, first_block, num_blocks: int, n: int):
    """``(u (n, S), z (n, S), u0 (S,))`` of ``num_blocks`` blocks, ``S = num_blocks * BLOCK_SIZE``.

    Each block's words are drawn rounds-first, ``(n + 2 ceil(n / 2) + 1, BLOCK_SIZE)``, the layout
    the scans consume (no transpose of ``(S, n)`` arrays).
    """
    half = -(-n // 2)
    width = n + 2 * half + 1
    # core.block_words_fn(a, c) draws uint64[c, a] per block, vmap-safe (the block's words never
    # depend on the batch it is drawn in); here a = BLOCK_SIZE samples, c = width rows.
    fn = core.block_words_fn(core.BLOCK_SIZE, width)
    words = jax.vmap(lambda j: fn(jax.random.key_data(key), j))(first_block + jnp.arange(num_blocks))
    words = jnp.moveaxis(words, 0, 1).reshape(width, num_blocks * core.BLOCK_SIZE)
    u = uniform_open(words[:n])
    z1, z2 = normal_pairs_from_bits(words[n: n + half], words[n + half: n + 2 * half])
    z = jnp.concatenate([z1, z2], axis=0)[:n]
    u0 = uniform_open(words[-1])
    return u, z, u0


def _losses_from_draws(bands, sigma, sampling_prob, u, z, u0, min_sep, warm_start):
    x = _participation(u, u0, sampling_prob, min_sep, warm_start)
    # X_P = C x + sigma Z and X_Q = sigma Z share Z: log f(X_P) = log f(X_Q) + <c_j, C x> / sigma^2.
    log_f_q = _log_emissions(bands, sigma * z, sigma)
    inv_var = 1.0 / (sigma * sigma)
    mean = _mean(bands, x)
    n, k = bands.shape
    mp = jnp.pad(mean, [(0, k - 1), (0, 0)])
    cross = bands[:, 0][:, None] * mean
    for t in range(1, k):
        cross = cross + bands[:, t][:, None] * mp[t: t + n]
    log_f = jnp.stack([log_f_q + cross * inv_var, log_f_q], axis=1)  # (n, 2, S)
    ratio = _forward(log_f, sampling_prob, min_sep, warm_start)
    remove = core._nan_to_plus_inf(ratio[0])
    add = core._nan_to_plus_inf(-ratio[1])
    return remove, add


@float64
@functools.partial(jax.jit, static_argnames=("min_sep", "warm_start"))
def log_likelihood_ratio(bands, observations, noise_multiplier, sampling_prob, *, min_sep: int,
                         warm_start: bool = True):
    """``log P/Q`` at given outputs: the forward algorithm of the b-min-sep chain.

    Args:
      bands: ``(n, k)`` band table of ``C`` (:func:`band_table`), ``k <= min_sep``.
      observations: ``(n,)`` or ``(n, S)`` outputs ``y`` (rounds first, as jax_privacy's samples).
      noise_multiplier: ``sigma`` (scalar; data, not static).
      sampling_prob: ``p`` in ``(0, 1]`` (scalar; data, not static).
      min_sep: ``b`` (static).  warm_start: stationary start (static).

    Returns:
      ``(S,)`` (or scalar) ``log P(y) / Q(y)``, float64.  For ``y ~ P`` it is the remove-direction
      loss; for ``y ~ Q`` its negative is the add-direction loss.

    Example::

        y = np.random.default_rng(0).normal(size=(64, 10))
        log_likelihood_ratio(band_table(np.ones(1), 64, 4), y, 1.0, 0.2, min_sep=4)
    """
    bands = jnp.asarray(bands, jnp.float64)
    y = jnp.asarray(observations, jnp.float64)
    _check_bands(bands, min_sep)
    if y.ndim not in (1, 2) or y.shape[0] != bands.shape[0]:
        raise ValueError(f"observations must have shape (n,) or (n, S) with n = {bands.shape[0]} (the rows of "
                         f"bands), got shape {y.shape}")
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    p = jnp.asarray(sampling_prob, jnp.float64)
    return _forward(_log_emissions(bands, y, sigma), p, min_sep, warm_start)


@float64
@functools.partial(jax.jit, static_argnames=("min_sep", "num_samples", "warm_start"))
def privacy_losses(bands, noise_multiplier, sampling_prob, key, *, min_sep: int, num_samples: int,
                   warm_start: bool = True):
    """Privacy-loss samples of both directions, ``(remove (S,), add (S,))``, ``S = num_samples``.

    ``remove``: ``log P/Q (X)``, ``X ~ P`` (jax_privacy's ``positive_sample=True`` losses);
    ``add``: ``log Q/P (X)``, ``X ~ Q`` (its ``positive_sample=False`` losses).  ``bands``
    ``(n, k)`` from :func:`band_table`; ``noise_multiplier``, ``sampling_prob`` scalars (data);
    ``key`` a JAX key (the stream is in the module docstring).  Materialises ``(n, S)`` arrays:
    for large ``S`` use :func:`monte_carlo_sums`.

    Example::

        remove, add = privacy_losses(band_table(np.array([1.0, 0.5]), 64, 4), 1.0, 0.2,
                                     jax.random.key(0), min_sep=4, num_samples=4096)
    """
    bands = jnp.asarray(bands, jnp.float64)
    _check_bands(bands, min_sep)
    n = bands.shape[0]
    key = core.rbg_key(key)
    num_blocks = -(-num_samples // core.BLOCK_SIZE)
    u, z, u0 = _block_draws(key, 0, num_blocks, n)
    remove, add = _losses_from_draws(bands, jnp.asarray(noise_multiplier, jnp.float64),
                                     jnp.asarray(sampling_prob, jnp.float64), u, z, u0, min_sep, warm_start)
    return remove[:num_samples], add[:num_samples]


@float64
@functools.partial(jax.jit, static_argnames=("min_sep", "num_samples", "warm_start", "chunk_blocks"))
def monte_carlo_sums(bands, noise_multiplier, sampling_prob, epsilon, key, *, min_sep: int, num_samples: int,
                     warm_start: bool = True, chunk_blocks: int | None = None):
    """Sums of the hockey-stick terms ``max(0, 1 - exp(eps - L))`` and their squares, per direction.

    Returns :class:`dpjax.montecarlo.MonteCarloSums` with ``(2, K)`` arrays (row 0 remove, row 1
    add) for ``epsilon (K,)``; pass them with ``num_samples`` to
    :func:`dpjax.montecarlo.estimate_from_sums`.  Chunks of ``chunk_blocks`` blocks (default:
    about 2^18 floats per ``(n, S)`` array) run in a ``lax.scan``; the draws are those of
    :func:`privacy_losses` for the same key whatever the chunking.
    """
    bands = jnp.asarray(bands, jnp.float64)
    _check_bands(bands, min_sep)
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    p = jnp.asarray(sampling_prob, jnp.float64)
    eps = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    total, total_sq = _sums(bands, sigma, p, eps, core.rbg_key(key), min_sep=min_sep, num_samples=num_samples,
                            warm_start=warm_start, chunk_blocks=chunk_blocks)
    return core.MonteCarloSums(total, total_sq)


def _default_chunk_blocks(num_samples: int, n: int, chunk_blocks: int | None) -> int:
    """Blocks per chunk: about 2^18 floats per ``(n, S)`` array unless given, at most the sample."""
    num_blocks = -(-num_samples // core.BLOCK_SIZE)
    if chunk_blocks is None:
        chunk_blocks = max(1, (core.DEFAULT_CHUNK_NORMALS // n) // core.BLOCK_SIZE)
    return min(chunk_blocks, num_blocks)


def _sums(bands, sigma, p, eps, key, *, min_sep, num_samples, warm_start, chunk_blocks, squares=True):
    """``(total (2, K), total_sq (2, K))`` of :func:`monte_carlo_sums` (traced arguments, rbg ``key``).

    Differentiable in ``bands``, ``sigma`` and ``eps`` (the draws do not depend on them); the
    calibration solves on these sums, so its estimate is the one :meth:`BMinSep.estimate` reports.
    ``squares=False`` skips the squares (``total_sq`` is then zeros).
    """
    n = bands.shape[0]
    chunk_blocks = _default_chunk_blocks(num_samples, n, chunk_blocks)
    num_chunks = -(-(-(-num_samples // core.BLOCK_SIZE)) // chunk_blocks)

    def chunk(carry, c):
        first = c * chunk_blocks
        u, z, u0 = _block_draws(key, first, chunk_blocks, n)
        remove, add = _losses_from_draws(bands, sigma, p, u, z, u0, min_sep, warm_start)
        ids = first * core.BLOCK_SIZE + jnp.arange(chunk_blocks * core.BLOCK_SIZE)
        valid = (ids < num_samples).astype(jnp.float64)[:, None]
        t_rem = core.hockey_stick_terms(remove, eps) * valid
        t_add = core.hockey_stick_terms(add, eps) * valid
        total = jnp.stack([t_rem.sum(0), t_add.sum(0)])
        if not squares:
            return (carry[0] + total, carry[1]), None
        total_sq = jnp.stack([(t_rem * t_rem).sum(0), (t_add * t_add).sum(0)])
        return (carry[0] + total, carry[1] + total_sq), None

    zeros = jnp.zeros((2, eps.shape[0]), jnp.float64)
    (total, total_sq), _ = jax.lax.scan(chunk, (zeros, zeros), jnp.arange(num_chunks))
    return total, total_sq


# --------------------------------------------------------------------------- calibration


def _calibration_value(sigma, theta, consts, *, min_sep, num_samples, warm_start, chunk_blocks):
    """``delta_hat(sigma)``: the max over the two directions of the mean hockey-stick term at
    ``theta = (bands, epsilon)`` on the draws of ``consts = (sampling_prob, key_data)``."""
    bands, eps = theta
    p, key_data = consts
    key = jax.random.wrap_key_data(key_data, impl="rbg")
    total, _ = _sums(bands, sigma, p, jnp.reshape(eps, (1,)), key, min_sep=min_sep, num_samples=num_samples,
                     warm_start=warm_start, chunk_blocks=chunk_blocks, squares=False)
    return jnp.max(total[:, 0]) / num_samples


@float64
def calibrate_on_samples(bands, target_epsilon, target_delta, sampling_prob, key, *, min_sep: int,
                         num_samples: int, warm_start: bool = True, adjoint=ImplicitAdjoint(),
                         chunk_blocks: int | None = None) -> Solution:
    """Jittable calibration: ``sigma*`` with ``delta_hat(sigma*) = target_delta`` on common random numbers.

    ``delta_hat(sigma)`` is :meth:`BMinSep.estimate`'s delta at ``target_epsilon`` (the max over the
    remove and add directions of the mean of ``max(0, 1 - exp(eps - L))``) on the ``num_samples``
    draws of ``key`` (the stream of the module docstring, which does not depend on ``sigma``), so
    it is a deterministic, continuous, non-increasing function of ``sigma``.  Solved by the
    repository's monotone root finder (:func:`dpjax.numerics.root.solve_monotone_root`, bisection
    in ``log sigma`` over ``[1e-3, 1e4]`` times the sensitivity ``max_j |c_j|_2``; the feasible,
    upper end of the final bracket is returned), as
    :func:`dpjax.montecarlo.calibrate.calibrated_noise_core` does for balls-in-bins.

    Gradient (``adjoint=ImplicitAdjoint()``): by the implicit function theorem at the root,
    ``d sigma*/d theta = -(d delta_hat/d theta) / (d delta_hat/d sigma)`` for ``theta`` the band
    table, ``target_epsilon``; ``d sigma*/d target_delta = 1 / (d delta_hat/d sigma)`` (one
    reverse pass over the sample at the root, whatever the number of bisection steps; Choquette-Choo,
    Ganesh, Haque, Steinke & Thakurta, "Near Exact Privacy Amplification for Matrix Mechanisms").
    ``sampling_prob`` and ``key`` get no gradient (the participation pattern is a step function of
    ``p``).  ``delta_hat`` has a kink where a sample's loss crosses ``epsilon``; with
    ``num_samples >~ 100`` the kinks are dense and small, and the derivative is that of the
    sample's piecewise-smooth estimate.

    Args:
      bands: ``(n, k)`` band table (:func:`band_table`), ``k <= min_sep``; differentiable.
      target_epsilon, target_delta: scalars; differentiable.
      sampling_prob: ``p`` in ``(0, 1]``, scalar (data: a new ``p`` does not recompile).
      key: JAX PRNG key of the draws (any impl; its data seed the rbg stream as in
        :func:`monte_carlo_sums`).
      min_sep, num_samples, warm_start, chunk_blocks: static.  (The bisection takes
        :data:`DEFAULT_NUM_ITERATIONS` halvings.)
      adjoint: :class:`~dpjax.calibration.ImplicitAdjoint` or
        :class:`~dpjax.calibration.StopGradientAdjoint`.

    Returns:
      :class:`~dpjax.calibration.Solution`: ``root`` the noise multiplier (float64; ``NaN`` with
      ``status = UNREACHABLE``), ``lower``/``upper`` the final bracket, ``status``.  An estimate
      from ``num_samples`` draws, not a certificate (:meth:`BMinSep.certify_noise`).

    Example::

        bands = band_table(np.array([1.0, 0.5]), 32, 4)
        sol = jax.jit(functools.partial(calibrate_on_samples, min_sep=4, num_samples=1 << 14))(
            bands, 2.0, 1e-3, 0.2, jax.random.key(0))
        sol.root
    """
    bands = jnp.asarray(bands, jnp.float64)
    _check_bands(bands, min_sep)
    eps = jnp.asarray(target_epsilon, jnp.float64)
    target = jnp.asarray(target_delta, jnp.float64)
    p = jax.lax.stop_gradient(jnp.asarray(sampling_prob, jnp.float64))
    key_data = jax.random.key_data(core.rbg_key(key))
    sensitivity = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.sum(bands * bands, axis=1))))
    bracket = (BRACKET_RELATIVE[0] * sensitivity, BRACKET_RELATIVE[1] * sensitivity)
    value = functools.partial(_calibration_value, min_sep=min_sep, num_samples=num_samples, warm_start=warm_start,
                              chunk_blocks=chunk_blocks)
    # The constants ride in theta (p and the key data get zero or float0 cotangents), so nothing
    # traced is closed over.
    return solve_monotone_root(lambda s, th: value(s, th[0], th[1]), ((bands, eps), (p, key_data)), target, bracket,
                               decreasing=True, num_iterations=DEFAULT_NUM_ITERATIONS, log_scale=True,
                               adjoint=adjoint)


@functools.partial(jax.jit, static_argnames=("min_sep", "num_samples", "warm_start"))
def _calibrate_jit(bands, target_epsilon, target_delta, sampling_prob, key, *, min_sep, num_samples, warm_start):
    return calibrate_on_samples(bands, target_epsilon, target_delta, sampling_prob, key, min_sep=min_sep,
                                num_samples=num_samples, warm_start=warm_start, adjoint=StopGradientAdjoint())


# --------------------------------------------------------------------------- accountant


class BMinSep:
    """Monte Carlo accountant for ``C x + z`` under b-min-sep sampling (Dong & Ganesh, arXiv 2602.09338).

    Args:
      correlation: ``C``, non-negative lower-triangular with at most ``min_sep`` bands: a 1-D
        Toeplitz first column (BandMF; ``[1.0]`` is DP-SGD), a dense ``(n, n)`` banded matrix,
        or a :class:`dpjax.matrices.Toeplitz` (see :func:`band_table`).
      sampling_prob: ``p`` in ``(0, 1]``, the probability that an *eligible* example participates
        (the expected participation rate is ``1 / (b - 1 + 1 / p)``, not ``p``).
      min_sep: ``b >= 1``: an example sits out the ``b - 1`` rounds after it participates.
      num_rounds: ``n``.
      warm_start: start from the stationary state (jax_privacy's default), else eligible at round 0.

    ``noise_multiplier`` is ``sigma`` per unit of clip norm (not divided by the norm of ``C``).

    Example::

        acc = BMinSep(np.array([1.0, 0.5, 0.25]), sampling_prob=0.1, min_sep=4, num_rounds=128)
        est = acc.estimate(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 18, key=0)
        est.delta, est.standard_error, est.delta_low, est.delta_high, est.num_samples
    """

    def __init__(self, correlation, sampling_prob, min_sep, num_rounds, *, warm_start=True):
        self.sampling_prob = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
        self.min_sep = _validate.positive_int("min_sep", min_sep)
        self.num_rounds = _validate.positive_int("num_rounds", num_rounds)
        if not isinstance(warm_start, (bool, np.bool_)):
            raise ValueError(f"warm_start must be True or False, got {warm_start!r}")
        self.warm_start = bool(warm_start)
        self.bands = band_table(correlation, self.num_rounds, self.min_sep)

    def __repr__(self) -> str:
        return (f"BMinSep(sampling_prob={self.sampling_prob!r}, min_sep={self.min_sep}, "
                f"num_rounds={self.num_rounds}, bands={self.bands.shape[1]}, warm_start={self.warm_start})")

    @float64
    def privacy_losses(self, noise_multiplier, num_samples, key):
        """``(remove, add)`` privacy-loss samples, NumPy float64 ``(num_samples,)`` each (see
        :func:`privacy_losses`)."""
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        m = _validate_samples(num_samples)
        remove, add = privacy_losses(jnp.asarray(self.bands), sigma, self.sampling_prob, core.as_prng_key(key),
                                     min_sep=self.min_sep, num_samples=m, warm_start=self.warm_start)
        return np.asarray(remove), np.asarray(add)

    @property
    def sensitivity(self) -> float:
        """``max_j |c_j|_2``: the largest column norm of ``C`` (the l2 sensitivity of one participation)."""
        return float(np.sqrt(np.max(np.sum(self.bands * self.bands, axis=1))))

    @float64
    def estimate(self, noise_multiplier, epsilon, num_samples, key, *, confidence=0.95, chunk_size=None,
                 devices=None) -> DeltaEstimate:
        """Both directions at every ``epsilon`` from one set of ``num_samples`` draws.

        ``delta`` is the mean of ``max(0, 1 - exp(eps - L))`` over the loss samples ``L`` of the
        larger direction, ``standard_error`` its ``sqrt(var / m)``; ``delta_low`` / ``delta_high``
        a ``confidence`` interval on the max-direction delta (Chernoff-KL bounds, the terms lie in
        ``[0, 1]``), as :meth:`dpjax.montecarlo.BallsInBins.estimate`.  ``chunk_size``: samples per
        chunk (rounded up to whole blocks; the draws, hence the numbers, do not depend on it).
        ``devices``: ``None`` only (one device; the argument exists so that Estimate-Verify-Release
        can call every accountant alike).
        """
        confidence = _confidence(confidence)
        chunk_blocks = self._chunk_blocks(chunk_size, devices)
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        flat = np.atleast_1d(_validate.nonnegative("epsilon", epsilon)).reshape(-1)
        m = _validate_samples(num_samples)
        sums = monte_carlo_sums(jnp.asarray(self.bands), sigma, self.sampling_prob, jnp.asarray(flat),
                                core.as_prng_key(key), min_sep=self.min_sep, num_samples=m,
                                warm_start=self.warm_start, chunk_blocks=chunk_blocks)
        return delta_estimate_from_sums(sums, m, flat, confidence)

    def delta(self, noise_multiplier, epsilon, num_samples, key):
        """``(estimate, standard_error)`` of delta at ``epsilon`` (scalar or array; same shape),
        the max over the two directions."""
        est = self.estimate(noise_multiplier, epsilon, num_samples, key)
        shape = np.shape(epsilon)
        return est.delta.reshape(shape), est.standard_error.reshape(shape)

    @staticmethod
    def _chunk_blocks(chunk_size, devices):
        if devices is not None:
            raise ValueError(f"devices must be None for BMinSep (it runs on one device), got {devices!r}")
        if chunk_size is None:
            return None
        size = _validate.positive_int("chunk_size", chunk_size)
        return -(-size // core.BLOCK_SIZE)

    def calibrate(self, target_epsilon, target_delta, num_samples, key=0, *, certify=False,
                  method="bernoulli_kl"):
        """Noise multiplier with ``delta_hat(sigma) = target_delta`` at ``target_epsilon`` (an estimate).

        ``delta_hat`` is :meth:`estimate`'s delta (max over the two directions) on ``num_samples``
        common random numbers from ``key`` (JAX key or int seed): the draws do not depend on
        ``sigma``, so ``delta_hat`` is a deterministic non-increasing function of ``sigma``, solved by
        bisection in ``log sigma`` to ~1e-14 relative (:func:`calibrate_on_samples`); the feasible
        end of the final bracket is returned, so ``self.delta(sigma, target_epsilon, num_samples,
        key)`` at the returned ``sigma`` is ``<= target_delta`` up to round-off of the summation.
        As :meth:`dpjax.montecarlo.BallsInBins.calibrate`: a float, an *estimate* from
        ``num_samples`` draws (its error is that of ``delta_hat``, about ``standard_error / |d
        delta_hat / d sigma|``), not a certificate: certify with :meth:`certify` on other draws,
        or pass ``certify=True`` to get the :class:`~dpjax.montecarlo.Certificate` of
        :meth:`certify_noise` instead (``num_samples`` its verification samples, ``None`` for the
        method's default).  A new ``sampling_prob`` or target does not recompile.

        Raises:
          ValueError: bad input (naming the argument); a target not reached by any noise
            multiplier up to 1e4 x the sensitivity, or met already at 1e-3 x it.

        Example::

            acc = BMinSep(np.array([1.0, 0.5]), sampling_prob=0.2, min_sep=4, num_rounds=32)
            sigma = acc.calibrate(2.0, 1e-3, num_samples=1 << 16, key=0)
            acc.delta(sigma, 2.0, 1 << 16, 0)   # (<= 1e-3, its standard error)
        """
        if certify:
            return self.certify_noise(target_epsilon, target_delta, key, num_samples=num_samples, method=method)
        from dpjax.montecarlo.calibrate import raise_on_status

        m = _validate_samples(num_samples)
        target = _validate.PrivacyTarget(target_epsilon, target_delta)
        return self._calibrate(float(target.epsilon), float(target.delta), m, core.as_prng_key(key),
                               raise_on_status)

    @float64
    def _calibrate(self, eps, delta, m, key, raise_on_status):
        res = _calibrate_jit(jnp.asarray(self.bands), eps, delta, self.sampling_prob, key, min_sep=self.min_sep,
                             num_samples=m, warm_start=self.warm_start)
        raise_on_status(res, eps, delta)
        return float(res.root)

    def _ladder_calibration(self, epsilon, base_delta, key, num_samples, initial_noise):
        """The calibration step of :func:`dpjax.montecarlo.evr.certify_noise`'s ladder: ``sigma_0``
        solving ``delta_hat = base_delta`` on ``num_samples`` draws from ``key``."""
        from dpjax.montecarlo.calibrate import raise_on_status

        return self._calibrate(float(epsilon), float(base_delta), int(num_samples), key, raise_on_status)

    def certify(self, noise_multiplier, epsilon, target_delta, num_samples, key, *, chunk_size=None,
                method="bernoulli_kl"):
        """Estimate-Verify-Release for one noise multiplier (:func:`dpjax.montecarlo.evr.certify_fixed`).

        The largest ``base_delta`` whose EVR bound stays within ``target_delta`` (Wang, Mahloujifar,
        Wu, Jia & Mittal, "A randomized approach to tight privacy accounting"; the Bernoulli-KL
        bound of one test), then ``delta_hat <= base_delta`` (both directions) on ``num_samples``
        draws from ``key``, which must be independent of whatever chose ``noise_multiplier``.
        Returns a :class:`~dpjax.montecarlo.Certificate` (``method``, ``num_samples``,
        ``failure_probability``: the chance that a noise multiplier whose true delta exceeds
        ``tau * base_delta`` passes).  Only ``method="bernoulli_kl"``: the variance-reduced
        ``"importance_betting"`` test needs a proven range of importance-weighted summands, which
        exists for balls-in-bins only.

        Example::

            acc = BMinSep(np.array([1.0]), sampling_prob=0.1, min_sep=1, num_rounds=16)
            cert = acc.certify(1.0, 2.0, 0.05, num_samples=1 << 15, key=1)
            cert.verified, cert.delta, cert.failure_probability
        """
        from dpjax.montecarlo import evr

        _bernoulli_only(method)
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        eps = float(_validate.nonnegative("epsilon", epsilon))
        target = float(_validate.PrivacyTarget(delta=target_delta).delta)
        m = _validate_samples(num_samples)
        self._chunk_blocks(chunk_size, None)
        return evr.certify_fixed(self, sigma, eps, target, m, key, chunk_size=chunk_size, method="bernoulli_kl")

    def certify_noise(self, target_epsilon, target_delta, key, *, num_samples=None, method="bernoulli_kl",
                      initial_noise=None, rungs=None, growth=None, calibration_samples=None):
        """A certified noise multiplier at ``(target_epsilon, target_delta)`` in one call.

        :func:`dpjax.montecarlo.evr.certify_noise` with ``method="bernoulli_kl"``, exactly as for
        balls-in-bins: ``sigma_0`` calibrated at ``base_delta`` on ``calibration_samples`` draws
        (default ``num_samples // 4``) from ``fold_in(key, 0)`` (:meth:`calibrate`), then the
        pre-committed ladder ``sigma_0 growth^j`` (``rungs`` tests, default 8 and 1.02) verified on
        ``num_samples`` independent draws from ``fold_in(key, 1)``; the first passing rung is
        released, ``(eps, tau base_delta + rungs beta)`` by the union bound.
        ``cert.failure_probability`` is the chance that the procedure releases a noise multiplier
        whose true delta exceeds ``tau * base_delta``.  ``num_samples=None``: the smallest power of
        two whose ``base_delta >= 0.4 target_delta`` (:func:`dpjax.montecarlo.evr.default_samples`).

        Example::

            acc = BMinSep(np.array([1.0, 0.5]), sampling_prob=0.2, min_sep=4, num_rounds=32)
            cert = acc.certify_noise(2.0, 0.05, key=0, num_samples=1 << 15)
            cert.noise_multiplier, cert.method, cert.num_samples, cert.failure_probability
        """
        from dpjax.montecarlo import evr

        _bernoulli_only(method)
        if num_samples is not None:
            num_samples = _validate_samples(num_samples)
        ladder = evr.Ladder(rungs=evr.DEFAULT_LADDER_RUNGS if rungs is None else rungs, growth=growth,
                            calibration_samples=calibration_samples)
        return evr.certify_noise(self, target_epsilon=target_epsilon, target_delta=target_delta,
                                 num_samples=num_samples, key=core.as_prng_key(key), initial_noise=initial_noise,
                                 method="bernoulli_kl", ladder=ladder)


def _bernoulli_only(method):
    if method != "bernoulli_kl":
        raise ValueError(f"method must be 'bernoulli_kl' for b-min-sep sampling (the 'importance_betting' test needs "
                         f"the balls-in-bins importance sampler), got {method!r}")
