"""Public, pure, jittable core of the balls-in-bins Monte Carlo accountant.

Draws, privacy losses and estimators (Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near
Exact Privacy Amplification for Matrix Mechanisms", 2024): the layer that
:class:`dpjax.montecarlo.BallsInBins`, :mod:`dpjax.montecarlo.calibrate` and
:mod:`dpjax.optimization` build on.  Everything here is a pure function of arrays; only
:func:`gram_matrix` validates (through :func:`dpjax.matrices.correlation_array`), the other
functions trust their inputs (the user-facing wrappers validate).  The exported functions follow
the float64 contract of :mod:`dpjax._base.x64` (the sampler consumes uint64 random words): they run
in float64 for eager, ``grad`` and ``vmap`` callers with x64 off, and inside a ``jax.jit``
traced with x64 off they raise a ``ValueError`` naming the fix.

The dominating pair (Choquette-Choo et al. 2024, Lemma 3.2), ``n = b * E`` rounds::

    P = (1/b) sum_i N(m_i, sigma^2 I_n),   m_i = sum_{j<E} |C|[:, b*j + i],   Q = N(0, sigma^2 I_n)

Gram reduction: with ``G = M M^T`` (``M`` the ``(b, n)`` matrix of modes) and ``W ~ N(0, G)``,
the privacy loss of ``X = m_I + sigma Z ~ P`` is::

    Y_PQ = logsumexp_i((G[I, i] + sigma W_i - G[i, i]/2) / sigma^2) - log b

and of ``X = sigma Z ~ Q`` (the reverse pair, loss ``log Q/P``)::

    Y_QP = -(logsumexp_i((sigma W_i - G[i, i]/2) / sigma^2) - log b)

``delta(eps) = E[max(0, 1 - exp(eps - Y))]`` for each direction; add/remove adjacency needs the
max of the two.

Random stream (common random numbers).  The key is mapped to an ``rbg`` key (see
:func:`rbg_key`).  Sample ``s`` lives in block ``s // BLOCK_SIZE``; block ``j`` draws ``2 ceil(b/2) + 1`` uint64 words per sample from ``jax.random.fold_in(key, j)``:
``b`` words give ``U ~ N(0, I_b)`` (Box-Muller pairs) and one gives the mode index ``I``.  So the draws ``(I, U)``
depend only on ``(key, b, sample index)`` -- never on ``sigma``, ``C``, ``epsilon``, the chunk
size or the number of devices -- and ``W = L U`` with ``L L^T = G``.  For a fixed key the
estimate is therefore a deterministic, piecewise-smooth function of ``(G, sigma, epsilon)``
(and of ``C`` through ``G``): ``jax.grad`` through it gives the gradient of the common-random-
numbers estimate (Choquette-Choo et al. 2024, section 4).  The same ``U`` serves both directions and every epsilon.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.matrices import correlation_array
from dpjax.montecarlo._normal import normal_from_bits, uniform_open

#: Samples per PRNG block.  Fixed, so the stream never depends on the chunk size.
BLOCK_SIZE = 2048

#: Default chunk (per device, per scan step) holds about this many normals: ``2^18 / b``
#: samples, rounded up to whole blocks -- a few MiB of float64 working set, which keeps the
#: fused sampling loop in cache (larger chunks measured slower on CPU) and bounds memory.
DEFAULT_CHUNK_NORMALS = 1 << 18


# --------------------------------------------------------------------------- modes and Gram


@float64
def modes_from_dense(correlation_matrix, batches_per_epoch: int):
    """Modes ``M`` of shape ``(b, n)``: ``M[i] = sum_{j<E} |C|[:, b*j + i]``.

    ``correlation_matrix``: ``(n, n)`` lower-triangular, ``n = b * E``.
    """
    c = jnp.abs(jnp.asarray(correlation_matrix, jnp.float64))
    n = c.shape[0]
    b = batches_per_epoch
    epochs = n // b
    # Column b*j + i -> (j, i) after reshape: sum over the epoch index j.
    return c.reshape(n, epochs, b).sum(axis=1).T


@float64
def modes_from_column(first_column, batches_per_epoch: int, epochs: int):
    """Modes of a lower-triangular Toeplitz ``C`` from its first column, without forming ``C``.

    ``first_column``: ``(k,)``, ``C[t, s] = c[t - s]`` (zero beyond ``k``); ``k <= n`` is
    zero-padded, ``k > n`` truncated.  Returns ``(b, n)``.

    Why it works: ``m_0 = C x_0`` with ``x_0`` the indicator of rounds ``0, b, 2b, ...``, so
    ``m_0[e*b + r] = sum_{j <= e} c[(e-j)*b + r]`` -- a cumulative sum over epochs of ``c``
    reshaped to ``(E, b)``; and Toeplitz ``C`` commutes with the shift, so
    ``m_i[t] = m_0[t - i]`` for ``t >= i`` and 0 before.  Cost O(b n).
    """
    b, epochs = batches_per_epoch, epochs
    n = b * epochs
    c = jnp.abs(jnp.asarray(first_column, jnp.float64))
    k = c.shape[0]
    c = jnp.pad(c, (0, n - k)) if k < n else c[:n]
    m0 = jnp.cumsum(c.reshape(epochs, b), axis=0).reshape(n)
    t = jnp.arange(n)[None, :]
    i = jnp.arange(b)[:, None]
    shifted = jnp.take(m0, jnp.clip(t - i, 0, n - 1))
    return jnp.where(t >= i, shifted, 0.0)


@float64
def gram_from_modes(modes):
    """``G = M M^T``, shape ``(b, b)``."""
    modes = jnp.asarray(modes, jnp.float64)
    return modes @ modes.T


@float64
def gram_from_columns(first_column, batches_per_epoch: int, epochs: int):
    """Gram matrix ``(b, b)`` of a Toeplitz ``C`` given by its first column (differentiable)."""
    return gram_from_modes(modes_from_column(first_column, batches_per_epoch, epochs))


@float64
def gram_from_dense(correlation_matrix, batches_per_epoch: int):
    """Gram matrix ``(b, b)`` of a dense lower-triangular ``C`` (differentiable)."""
    return gram_from_modes(modes_from_dense(correlation_matrix, batches_per_epoch))


@float64
def gram_matrix(correlation, batches_per_epoch: int, epochs: int):
    """Gram matrix ``G = M M^T`` ``(b, b)`` of the modes of any correlation-matrix input.

    ``correlation``: what :func:`dpjax.matrices.correlation_array` accepts (Toeplitz / BLT,
    a 1-D Toeplitz first column, or a dense ``(n, n)`` lower-triangular non-negative array,
    ``n = b * E``), validated there.  O(b n) for Toeplitz input.  Differentiable in ``C``.
    """
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    epochs = _validate.positive_int("epochs", epochs)
    return _gram_of_array(correlation_array(correlation, b * epochs), b, epochs)


def _gram_of_array(arr, batches_per_epoch: int, epochs: int):
    """Gram matrix of a validated :func:`correlation_array` result (1-D: Toeplitz column)."""
    if arr.ndim == 1:
        return gram_from_columns(arr, batches_per_epoch, epochs)
    return gram_from_dense(arr, batches_per_epoch)


_gram_of_array_jit = jax.jit(_gram_of_array, static_argnames=("batches_per_epoch", "epochs"))


@float64
def host_gram_matrix(correlation, batches_per_epoch: int, epochs: int) -> np.ndarray:
    """:func:`gram_matrix` for concrete input, as a NumPy array: validation on the host, then one
    small jitted program (op by op, the Gram construction compiled ~15 tiny programs, ~1 s of a
    first :class:`~dpjax.montecarlo.BallsInBins` call on 2 cores).  Not differentiable: use
    :func:`gram_matrix` under ``grad``."""
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    epochs = _validate.positive_int("epochs", epochs)
    arr = np.asarray(correlation_array(correlation, b * epochs), np.float64)
    return np.asarray(_gram_of_array_jit(arr, b, epochs))


@float64
def gram_sqrt(gram):
    """A square root ``L`` with ``L L^T = G`` (``(b, b)``), robust to singular ``G``.

    Cholesky when ``G`` is numerically positive definite (the usual case: ``C`` with a
    non-zero diagonal makes the modes linearly independent).  If Cholesky fails (``G``
    singular or indefinite by round-off) it falls back to the eigendecomposition
    ``G = V diag(lam) V^T`` and ``L = V diag(sqrt(max(lam, 0)))``: exact for a PSD ``G``, and
    clipping the round-off negative eigenvalues (``|lam| ~ 1e-16 |G|``) changes ``L L^T`` by
    that much only.  No jitter is added, so the distribution of ``W = L U`` is ``N(0, G)``.
    Any square root gives the same distribution of ``W``; the choice only matters for which
    ``W`` a given ``U`` maps to (common random numbers switch when the branch switches).
    Gradients: exact through the Cholesky branch; through the eigen branch they are undefined
    where eigenvalues repeat (a singular ``G`` is a boundary case for optimisation anyway).
    """
    gram = jnp.asarray(gram, jnp.float64)
    gram = 0.5 * (gram + gram.T)
    # The branch test runs on a stop-gradient copy so that a failed Cholesky (NaN) can never
    # leak NaN cotangents into the gradient of the branch actually taken.
    ok = jnp.all(jnp.isfinite(cholesky_xla(jax.lax.stop_gradient(gram))))

    def _eig(g):
        lam, vec = jnp.linalg.eigh(g)
        return vec * jnp.sqrt(jnp.clip(lam, 0.0, None))[None, :]

    return jax.lax.cond(ok, cholesky_xla, _eig, gram)


def cholesky_xla(gram):
    """Lower Cholesky factor of ``gram`` ``(b, b)`` in plain XLA ops; NaN/inf where not PD.

    Why not ``jnp.linalg.cholesky``: on CPU it calls LAPACK ``dpotrf`` from the bundled
    multi-threaded OpenBLAS, whose worker threads keep spinning after the call and compete with
    the sampling loop that follows (on a 2-core machine under load, measured 30-380 ms extra
    per call at ``b = 128``: more than the sampling of 2048 samples itself).  The unblocked
    column algorithm below costs ``b`` matrix-vector products (~``b^3`` flops, ~1 ms at
    ``b = 128``), runs on XLA's own thread and is differentiable by ordinary autodiff through
    the loop.  Column ``j``: ``v = G[:, j] - L L[j, :]^T`` (columns ``>= j`` of ``L`` are
    still zero), ``L[j, j] = sqrt(v[j])``, ``L[i, j] = v[i] / L[j, j]`` for ``i > j``.  A
    non-positive pivot gives NaN (``sqrt`` of a negative) or inf/NaN (division by zero), which
    :func:`gram_sqrt` detects to fall back to the eigendecomposition.
    """
    gram = jnp.asarray(gram, jnp.float64)
    b = gram.shape[-1]
    rows = jnp.arange(b)

    def column(j, factor):
        v = jax.lax.dynamic_index_in_dim(gram, j, axis=1, keepdims=False) - factor @ factor[j]
        root = jnp.sqrt(v[j])
        # One reciprocal, then products: XLA rewrites a division by a square root into a
        # product with rsqrt only in some programs (when the root has one use after common
        # subexpressions are merged, which differs between one device and several), and the
        # two round differently; the factor must be the same bits on every layout.
        inverse = 1.0 / root
        col = jnp.where(rows > j, v * inverse, jnp.where(rows == j, root, 0.0))
        return jax.lax.dynamic_update_index_in_dim(factor, col, j, axis=1)

    return jax.lax.fori_loop(0, b, column, jnp.zeros_like(gram))


# --------------------------------------------------------------------------- sampling


@functools.lru_cache(maxsize=None)
def block_words_fn(words_per_sample: int, block_size: int):
    """``(key_data uint32[4], block_index) -> uint64[block_size, words_per_sample]``, vmap-safe.

    XLA's ``RngBitGenerator`` batching rule draws a batch from the *first* key only, so a plain
    ``vmap`` over blocks would make the stream depend on how blocks are grouped (chunk size,
    devices).  This ``custom_vmap`` rule instead loops (``lax.map``) over the batch, calling the
    unbatched generator once per block, so block ``j`` always gets the same words.
    """

    @jax.custom_batching.custom_vmap
    def block_words(key_data, block_index):
        block_key = jax.random.fold_in(jax.random.wrap_key_data(key_data, impl="rbg"), block_index)
        return jax.random.bits(block_key, (block_size, words_per_sample), jnp.uint64)

    @block_words.def_vmap
    def _rule(axis_size, in_batched, key_data, block_index):
        key_batched, index_batched = in_batched
        if not key_batched:
            key_data = jnp.broadcast_to(key_data, (axis_size,) + key_data.shape)
        if not index_batched:
            block_index = jnp.broadcast_to(block_index, (axis_size,) + jnp.shape(block_index))
        out = jax.lax.map(lambda args: block_words(*args), (key_data, block_index))
        return out, True

    return block_words


def draw_block(key, block_index, b: int):
    """Draws of one block: mode indices ``(BLOCK_SIZE,)`` int32 and ``U`` ``(BLOCK_SIZE, b)``.

    ``key``: the sampler's rbg key (:func:`rbg_key`).  ``2 * ceil(b / 2) + 1`` uint64 words per
    sample from ``fold_in(key, block_index)``: pairs of words give Box-Muller normals
    (:mod:`dpjax.montecarlo._normal`), the last word the mode index ``floor(u * b)`` with ``u``
    uniform on ``(0, 1)`` (52-bit resolution: the mode probabilities are ``1/b`` up to
    ``2^-52``).  Safe under ``jax.vmap`` over ``block_index`` (and over keys): the result for
    block ``j`` never depends on the batch it is computed in.
    """
    half = -(-b // 2)
    words = block_words_fn(2 * half + 1, BLOCK_SIZE)(jax.random.key_data(key), block_index)
    u = normal_from_bits(words[:, : 2 * half], b)
    mode_index = jnp.minimum(jnp.floor(uniform_open(words[:, 2 * half]) * b), b - 1).astype(jnp.int32)
    return mode_index, u


def logsumexp_rows(x):
    # Plain max-shifted logsumexp over the last axis: jax.nn.logsumexp adds inf/NaN handling
    # passes that cost ~15% of a sample here, and our logits are always finite.
    m = jax.lax.stop_gradient(jnp.max(x, axis=-1))
    return m + jnp.log(jnp.sum(jnp.exp(x - m[..., None]), axis=-1))


def as_wide(x):
    """``x`` as an array of the widest float enabled (float64 inside dpjax's float64 scope): a
    float32 noise multiplier from float32 code must not make ``1 / sigma`` a float32 reciprocal,
    whose rounding (~3e-8 relative) would reach every loss."""
    return jnp.asarray(x, jnp.result_type(float))


def scaled_privacy_losses(gram, scaled_projections, noise_multiplier, mode_index):
    """Both directions' losses from ``W / sigma`` ``(S, b)`` (``W ~ N(0, G)``); the one formula."""
    b = gram.shape[0]
    sigma = as_wide(noise_multiplier)
    # Products with the reciprocal, not divisions by a broadcast scalar: XLA turns the latter
    # into the former in some programs and not in others (it depends on what surrounds the
    # expression: one device or several), and the two round differently.  Written out, every
    # layout computes the same bits (dpjax.montecarlo._spread).
    inv_var = 1.0 / (sigma * sigma)
    half_norms = (0.5 * inv_var) * jnp.diagonal(gram)
    logits_q = scaled_projections - half_norms[None, :]
    logits_p = logits_q + jnp.take(gram, mode_index, axis=0) * inv_var
    log_b = math.log(b)
    y_pq = logsumexp_rows(logits_p) - log_b
    y_qp = -(logsumexp_rows(logits_q) - log_b)
    return _nan_to_plus_inf(y_pq), _nan_to_plus_inf(y_qp)


def _nan_to_plus_inf(losses):
    # Soundness: a loss that cannot be evaluated (NaN: e.g. sigma**2 underflows to 0 for
    # sigma <~ 1e-154, giving inf - inf in the logits) must count as the worst case, +inf (a
    # hockey-stick term of 1), never as 0.  Counting NaN as 0 certified delta = 0.01 at
    # sigma = 1e-160, where the truth is 1.
    return jnp.where(jnp.isnan(losses), jnp.inf, losses)


@float64
def privacy_losses(gram, sqrt_gram, noise_multiplier, mode_index, u):
    """Privacy losses of both directions for a batch of draws.

    ``mode_index`` ``(S,)``, ``u`` ``(S, b)``, ``sqrt_gram`` ``L`` with ``L L^T = G``
    (:func:`gram_sqrt`).  Returns ``(y_pq, y_qp)``, each ``(S,)``: ``y_pq = log P/Q (X)`` with
    ``X ~ P`` and ``y_qp = log Q/P (X)`` with ``X ~ Q`` (formulas in the module docstring).
    """
    # w / sigma with w = L U ~ N(0, G): fold 1/sigma into the (b, b) factor, not the (S, b) array.
    scale = 1.0 / as_wide(noise_multiplier)
    return scaled_privacy_losses(gram, u @ (sqrt_gram.T * scale), noise_multiplier, mode_index)


@float64
def privacy_losses_from_projections(gram, projections, noise_multiplier, mode_index):
    """:func:`privacy_losses` from precomputed projections ``W = U L^T`` ``(S, b)``.

    ``W`` does not depend on ``sigma``: a calibration over ``sigma`` computes it once.
    """
    return scaled_privacy_losses(gram, projections * (1.0 / as_wide(noise_multiplier)), noise_multiplier,
                                 mode_index)


def hockey_stick_terms(losses, epsilon):
    """``max(0, 1 - exp(eps - Y))`` for losses ``(S,)`` and epsilons ``(K,)`` -> ``(S, K)``.

    A NaN loss counts as ``+inf`` (term 1): the conservative reading of a loss that could not be
    evaluated."""
    losses = _nan_to_plus_inf(losses)
    return -jnp.expm1(jnp.minimum(epsilon[None, :] - losses[:, None], 0.0))


@float64
def draws(key, batches_per_epoch: int, num_samples: int):
    """The first ``num_samples`` draws ``(mode_index (m,), U (m, b))`` of the sampler's stream.

    Exactly the draws that :func:`delta_estimate` / :func:`monte_carlo_sums` use for the same
    ``key`` (block ``j`` from ``fold_in(rbg_key(key), j)``, see the module docstring).
    Materialises ``(m, b)`` floats: for calibration with moderate ``m * b``.
    """
    key = rbg_key(key)
    b = batches_per_epoch
    num_blocks = -(-num_samples // BLOCK_SIZE)
    mode_index, u = jax.vmap(lambda j: draw_block(key, j, b))(jnp.arange(num_blocks))
    return mode_index.reshape(-1)[:num_samples], u.reshape(-1, b)[:num_samples]


@float64
def delta_from_projections(gram, projections, mode_index, noise_multiplier, epsilon):
    """Monte Carlo delta (max over both directions) from precomputed projections ``W = U L^T``.

    The estimator of :func:`delta_estimate` on materialised draws (:func:`draws`): the mean of
    ``max(0, 1 - exp(eps - Y))`` per direction, the larger direction returned.  ``gram (b, b)``,
    ``projections (m, b)``, ``mode_index (m,)``, scalar ``noise_multiplier``; ``epsilon`` any
    shape (result of the same shape).  Differentiable in ``gram``, ``projections``,
    ``noise_multiplier`` and ``epsilon``.
    """
    eps = jnp.asarray(epsilon, jnp.float64)
    y_pq, y_qp = privacy_losses_from_projections(gram, projections, noise_multiplier, mode_index)
    flat = eps.reshape(-1)
    mean_pq = jnp.mean(hockey_stick_terms(y_pq, flat), axis=0)
    mean_qp = jnp.mean(hockey_stick_terms(y_qp, flat), axis=0)
    return jnp.maximum(mean_pq, mean_qp).reshape(eps.shape)


class MonteCarloSums(NamedTuple):
    """Per-direction sums over samples; index 0 = P||Q (remove), 1 = Q||P (add).

    ``total``: ``(2, K)`` sum of the hockey-stick terms; ``total_sq``: ``(2, K)`` sum of
    their squares.  The sample count is not stored: pass the ``num_samples`` the sums were
    computed with to :func:`estimate_from_sums`.
    """

    total: jax.Array
    total_sq: jax.Array


def _chunk_sums(gram, sqrt_gram, sigma, epsilon, key, first_block, *, num_samples, chunk_blocks):
    b = gram.shape[0]
    block_ids = first_block + jnp.arange(chunk_blocks)
    mode_index, u = jax.vmap(lambda j: draw_block(key, j, b))(block_ids)
    mode_index = mode_index.reshape(-1)
    u = u.reshape(-1, b)
    sample_ids = (block_ids[:, None] * BLOCK_SIZE + jnp.arange(BLOCK_SIZE)[None, :]).reshape(-1)
    valid = (sample_ids < num_samples).astype(jnp.float64)[:, None]
    y_pq, y_qp = privacy_losses(gram, sqrt_gram, sigma, mode_index, u)
    t_pq = hockey_stick_terms(y_pq, epsilon) * valid
    t_qp = hockey_stick_terms(y_qp, epsilon) * valid
    total = jnp.stack([t_pq.sum(0), t_qp.sum(0)])
    total_sq = jnp.stack([(t_pq * t_pq).sum(0), (t_qp * t_qp).sum(0)])
    return total, total_sq


def _tick(_):
    # Host side of the compiled loop's per-chunk callback: advance the bar that the enclosing
    # :class:`progress_bar` made active (dpjax._base.progress keeps the process's one progress state).
    from dpjax._base import progress as _progress

    _progress.tick(1)


class progress_bar:
    """Context manager: a bar over ``num_chunks`` chunks for :func:`monte_carlo_sums` calls made
    with ``progress=True`` inside it (one tick per chunk, from a ``jax.debug.callback``)."""

    def __init__(self, num_chunks: int, desc: str = "monte carlo", enabled=None):
        from dpjax._base import progress as _progress

        self.bar = _progress.progress(num_chunks, desc, enabled=enabled, unit="chunks",
                                      delay=_progress.long_call_delay())
        self._asked = enabled

    @property
    def enabled(self) -> bool:
        """Whether to compile the per-chunk callbacks: for a bar drawn where someone watches it
        (a terminal, a notebook), or one asked for with ``progress=True`` (the callbacks make
        another program than the plain call's, which the serialized-program cache serves)."""
        return self.bar.enabled and (self.bar.live or self._asked is True)

    def __enter__(self):
        from dpjax._base import progress as _progress

        _progress.set_active(self.bar)
        return self

    def __exit__(self, *exc):
        from dpjax._base import progress as _progress

        _progress.set_active(None)
        self.bar.close()


def _sums_over_chunks(devices, gram, sqrt_gram, sigma, epsilon, key, *, num_samples, chunk_blocks, num_chunks,
                      progress: bool = False):
    """Sums over the chunks of ``chunk_blocks`` blocks, laid out over ``devices`` (one device: a
    loop) and added in chunk order (:mod:`dpjax.montecarlo._spread`): the same bits on any number
    of devices.

    The chunk body is rematerialised under reverse-mode AD (``jax.checkpoint``), so ``jax.grad``
    also runs in memory bounded by one chunk.  ``progress`` (static) adds a host callback per
    chunk for the progress bar; it does not touch the arithmetic.
    """
    from dpjax.montecarlo import _spread

    body_fn = jax.checkpoint(functools.partial(_chunk_sums, num_samples=num_samples, chunk_blocks=chunk_blocks))

    def per_chunk(c, rep, _):
        out = body_fn(*rep, c * chunk_blocks)
        if progress:
            jax.debug.callback(_tick, c, ordered=False)
        return out

    layout = _spread.Layout(devices, num_chunks)
    return _spread.run(layout, per_chunk, (gram, sqrt_gram, sigma, epsilon, key), (), _spread.ADD)


def chunk_plan(num_samples: int, chunk_size: int | None, num_devices: int = 1, b: int = 32):
    """``(chunk_blocks, chunks_per_device)`` covering ``num_samples`` (Python ints)."""
    num_blocks = -(-num_samples // BLOCK_SIZE)
    if chunk_size is None:
        chunk_size = max(BLOCK_SIZE, DEFAULT_CHUNK_NORMALS // b)
    chunk_blocks = max(1, min(-(-int(chunk_size) // BLOCK_SIZE), -(-num_blocks // num_devices)))
    num_chunks = -(-num_blocks // chunk_blocks)
    chunks_per_device = -(-num_chunks // num_devices)
    return chunk_blocks, chunks_per_device


def as_prng_key(key):
    """A user's ``key`` argument as a JAX PRNG key: an int seed becomes ``jax.random.key(seed)``.

    Keys (typed, or raw ``uint32`` data) pass through unchanged; ``None`` (and ``bool``) raise a
    ``ValueError``.
    """
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return jax.random.key(_validate.prng_seed("key", key))
    if isinstance(key, jax.Array) and (jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
                                       or key.dtype == jnp.uint32):
        return key
    if isinstance(key, np.ndarray) and key.dtype == np.uint32:
        return key
    # Strings, floats, None, bools, ...: refused here, not deep inside the sampler.
    return _validate.prng_seed("key", key)  # raises


def rbg_key(key):
    """The sampler's key: an ``rbg`` key (XLA ``RngBitGenerator``) derived from ``key``.

    Why rbg: on XLA:CPU its bits cost ~2.6 ns per uint64 against ~6 ns for threefry, and a
    sampler using it compiles in ~0.4 s instead of 2-6 s (threefry's unrolled rounds).  The
    mapping is fixed: a threefry key (typed, or raw ``uint32[2]``) with data ``d`` becomes the
    rbg key with data ``[d, d]`` -- exactly ``jax.random.key(seed, impl="rbg")`` for
    ``jax.random.key(seed)`` -- and rbg / unsafe_rbg keys (data ``uint32[4]``) are used as rbg.
    Blocks then use ``fold_in(key, block)``.  (RngBitGenerator streams are reproducible on one
    backend and JAX version, not promised across them.)
    """
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(key))
        if impl == "rbg":
            return key
        data = jax.random.key_data(key)
    else:
        data = jnp.asarray(key, jnp.uint32)
    if data.shape == (2,):
        data = jnp.concatenate([data, data])
    elif data.shape != (4,):
        raise ValueError(f"key must be a threefry/rbg PRNG key or raw uint32[2] / uint32[4] data, got shape {data.shape}")
    return jax.random.wrap_key_data(data, impl="rbg")


@float64
@functools.partial(jax.jit, static_argnames=("num_samples", "chunk_size", "progress"))
def monte_carlo_sums(gram, noise_multiplier, epsilon, key, num_samples: int, chunk_size: int | None = None,
                     progress: bool = False):
    """Sums of the hockey-stick terms on one device.  Shapes: ``gram (b, b)``, ``epsilon (K,)``.

    Returns :class:`MonteCarloSums` with ``(2, K)`` arrays.  Jittable and differentiable in
    ``gram``, ``noise_multiplier`` and ``epsilon``; see the module docstring for the random
    stream.  Use :func:`dpjax.montecarlo.sharded_monte_carlo_sums` for several devices.
    ``progress`` (static): report each chunk to the bar of an enclosing :class:`progress_bar`.
    """
    key = rbg_key(key)
    gram = jnp.asarray(gram, jnp.float64)
    epsilon = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    sqrt_gram = gram_sqrt(gram)
    chunk_blocks, num_chunks = chunk_plan(num_samples, chunk_size, 1, gram.shape[0])
    total, total_sq = _sums_over_chunks(
        (None,), gram, sqrt_gram, sigma, epsilon, key,
        num_samples=num_samples, chunk_blocks=chunk_blocks, num_chunks=num_chunks, progress=progress,
    )
    return MonteCarloSums(total, total_sq)


@float64
@functools.partial(jax.jit, static_argnames=("num_samples",))
def estimate_from_sums(sums: MonteCarloSums, num_samples: int):
    """Per-direction mean and standard error, each ``(2, K)``.

    ``SE = sqrt(var / m)`` with the unbiased sample variance ``var``.  (Jitted: one small
    program instead of five op-by-op compiles on a first call.)
    """
    m = num_samples
    mean = sums.total / m
    second = sums.total_sq / m
    var = jnp.maximum(second - mean * mean, 0.0) * (m / max(m - 1, 1))
    return mean, jnp.sqrt(var / m)


@float64
def delta_estimate(gram, noise_multiplier, epsilon, key, num_samples: int, chunk_size: int | None = None):
    """Monte Carlo delta of balls-in-bins matrix mechanisms: pure, jittable, differentiable.

    Args:
      gram: ``(b, b)`` Gram matrix ``G = M M^T`` of the modes (:func:`gram_from_columns`,
        :func:`gram_from_dense`); float64.
      noise_multiplier: scalar ``sigma > 0`` (noise std / clip norm).
      epsilon: scalar or ``(K,)``.
      key: a JAX PRNG key (typed or raw ``uint32[2]``).
      num_samples: static Python int ``m``.
      chunk_size: static; samples per scan step (memory bound), does not change the draws.

    Returns:
      ``(delta, standard_error)``, each of ``epsilon``'s shape: the max over the two
      directions (P||Q and Q||P) of the estimate, and the standard error of that direction.

    Common random numbers: the draws ``(I, U)`` depend only on ``(key, b, m)`` -- not on
    ``sigma``, ``G`` or ``epsilon`` -- so for a fixed key the result is a deterministic,
    piecewise-smooth function of ``(G, sigma, epsilon)`` and ``jax.grad`` w.r.t. any of them
    (or the coefficients that produced ``G``) is the gradient of the CRN estimate.

    float64 contract: see the module docstring (under a ``jax.jit`` traced with x64 off it
    raises a ``ValueError``; eager, ``grad`` and ``vmap`` work from float32 code).

    Example::

        with jax.enable_x64(True):
            g = gram_from_columns(jnp.array([1.0, 0.5, 0.25]), 32, 8)
            d, se = delta_estimate(g, 1.0, jnp.array([1.0, 2.0]), jax.random.key(0), 1 << 16)
            dd_dsigma = jax.grad(lambda s: delta_estimate(g, s, 2.0, jax.random.key(0), 1 << 14)[0])(1.0)
    """
    eps = jnp.asarray(epsilon, jnp.float64)
    sums = monte_carlo_sums(gram, noise_multiplier, eps.reshape(-1), key, num_samples, chunk_size)
    mean, se = estimate_from_sums(sums, num_samples)
    pick = jnp.argmax(mean, axis=0)
    delta = jnp.max(mean, axis=0)
    stderr = jnp.take_along_axis(se, pick[None, :], axis=0)[0]
    return delta.reshape(eps.shape), stderr.reshape(eps.shape)


# --------------------------------------------------------------------------- sharded


@float64
def sharded_monte_carlo_sums(gram, noise_multiplier, epsilon, key, num_samples: int,
                             chunk_size: int | None = None, devices=None, progress: bool = False):
    """:func:`monte_carlo_sums` spread over ``devices`` (default ``jax.devices()``: every device of
    every process, after ``jax.distributed.initialize()``).

    The chunks are the single-device call's (:func:`chunk_plan` with one device); device ``d``
    of ``D`` computes chunks ``d c .. (d + 1) c - 1`` (``c = ceil(chunks / D)``) of the same
    global stream, and every device adds the gathered chunk sums in chunk order
    (:mod:`dpjax.montecarlo._spread`).  So the result is the single-device call's, bit for bit,
    on any number of devices and processes.
    """
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) == 1:
        args = (gram, noise_multiplier, epsilon, key)
        static = dict(num_samples=num_samples, chunk_size=chunk_size, progress=progress)
        if progress or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
            return monte_carlo_sums(*args, **static)
        # Host call: through dpjax's program store (a later process loads the executable instead
        # of tracing and compiling it; dpjax.numerics.cache).
        from dpjax.numerics.cache import call

        return MonteCarloSums(*call("monte_carlo_sums", _monte_carlo_sums_tuple, args, static))
    gram = jnp.asarray(gram, jnp.float64)
    return _sharded_fn(tuple(devices), num_samples, chunk_size, gram.shape[0])(
        gram, jnp.asarray(noise_multiplier, jnp.float64),
        jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64)), rbg_key(key))


@functools.partial(jax.jit, static_argnames=("num_samples", "chunk_size", "progress"))
def _monte_carlo_sums_tuple(gram, noise_multiplier, epsilon, key, *, num_samples, chunk_size, progress):
    """:func:`monte_carlo_sums` returning a plain tuple (a serializable output tree)."""
    return tuple(monte_carlo_sums(gram, noise_multiplier, epsilon, key, num_samples, chunk_size, progress=progress))


@functools.lru_cache(maxsize=64)
def _sharded_fn(devices, num_samples, chunk_size, b):
    # The single device's chunks (not a device-dependent split): each chunk is then the same
    # computation wherever it runs, and the chunk sums are added in the single device's order.
    chunk_blocks, num_chunks = chunk_plan(num_samples, chunk_size, 1, b)

    @jax.jit
    def run(gram, sigma, epsilon, key):
        total, total_sq = _sums_over_chunks(devices, gram, gram_sqrt(gram), sigma, epsilon, key,
                                            num_samples=num_samples, chunk_blocks=chunk_blocks,
                                            num_chunks=num_chunks)
        return MonteCarloSums(total, total_sq)

    return run


# --------------------------------------------------------------------------- direct reference


@float64
@functools.partial(jax.jit, static_argnames=("num_samples",))
def direct_monte_carlo_sums(modes, noise_multiplier, epsilon, key, num_samples: int):
    """Test reference: the same estimator sampling ``X`` in ``R^n`` directly (no Gram reduction).

    ``X = m_I + sigma Z`` (P) and ``X = sigma Z`` (Q), ``Z ~ N(0, I_n)`` from
    ``jax.random.normal``; losses from the definition
    ``logsumexp_i((<X, m_i> - |m_i|^2/2)/sigma^2) - log b``.  O(n b) per sample; an
    independent random stream from the Gram sampler.  ``modes``: ``(b, n)``.
    """
    key = rbg_key(key)
    modes = jnp.asarray(modes, jnp.float64)
    epsilon = jnp.atleast_1d(jnp.asarray(epsilon, jnp.float64))
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    b, n = modes.shape
    k_idx, k_p, k_q = jax.random.split(key, 3)
    mode_index = jax.random.randint(k_idx, (num_samples,), 0, b)
    x_p = modes[mode_index] + sigma * jax.random.normal(k_p, (num_samples, n), jnp.float64)
    x_q = sigma * jax.random.normal(k_q, (num_samples, n), jnp.float64)
    half_norms = 0.5 * jnp.sum(modes * modes, axis=1)

    def loss(x):
        return jax.nn.logsumexp((x @ modes.T - half_norms[None, :]) / sigma**2, axis=1) - math.log(b)

    t_pq = hockey_stick_terms(loss(x_p), epsilon)
    t_qp = hockey_stick_terms(-loss(x_q), epsilon)
    total = jnp.stack([t_pq.sum(0), t_qp.sum(0)])
    total_sq = jnp.stack([(t_pq**2).sum(0), (t_qp**2).sum(0)])
    return MonteCarloSums(total, total_sq)
