"""Shared machinery of the participation-chain Monte Carlo accountants (:class:`BMinSep`,
:class:`RandomAllocation`).

Both account ``C x + sigma Z`` for a banded, non-negative, lower-triangular ``C`` against the pair
``P = E_x N(C x, sigma^2 I)``, ``Q = N(0, sigma^2 I)`` (``x`` the sensitive example's participation
pattern), and both evaluate ``log P/Q`` exactly by a forward algorithm over the participation
chain; they differ only in the chain.  What does not depend on the chain lives here:

* band tables: ``bands[j, t] = C[j + t, j]`` (:func:`band_columns`), the inner products of a
  vector with every column (:func:`band_dots`), ``C x`` (:func:`band_mean`) and the log emission
  factors ``log f_j(y) = (<c_j, y> - |c_j|^2 / 2) / sigma^2`` of both directions
  (:func:`paired_log_emissions`);
* the random stream: block ``j`` of ``BLOCK_SIZE`` samples draws ``n + 2 ceil(n / 2) + extra``
  uint64 words per sample from ``fold_in(rbg_key(key), j)`` (``n`` uniforms for the chain, ``n``
  Box-Muller normals, ``extra`` more uniforms), rounds first (:func:`block_draws`);
* the chunked sums of the hockey-stick terms (:func:`chunked_sums`) and the calibration on
  common random numbers (:func:`solve_on_samples`);
* the host methods (:class:`ChainAccountant`): estimate, delta, privacy losses, calibrate,
  Estimate-Verify-Release certificates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.matrices import correlation_array
from dpjax.montecarlo import core
from dpjax.montecarlo._accountant import _confidence, _validate_samples, delta_estimate_from_sums
from dpjax.montecarlo._normal import normal_pairs_from_bits, uniform_open
from dpjax.montecarlo.calibrate import BRACKET_RELATIVE, DEFAULT_NUM_ITERATIONS
from dpjax.numerics.root import solve_monotone_root


# --------------------------------------------------------------------------- bands


def band_columns(correlation, num_rounds: int) -> np.ndarray:
    """The ``(n, k)`` band table of ``C``, ``k`` its band count (index of the last non-zero
    sub-diagonal plus one; at least 1): ``bands[j, t] = C[j + t, j]``, 0 past row ``n``.

    ``correlation`` as :func:`dpjax.matrices.correlation_array` takes it (1-D Toeplitz first
    column, dense ``(n, n)`` lower-triangular, or a :class:`dpjax.matrices.Toeplitz`); it validates
    shape, finiteness and signs.  ``ValueError`` when the column norms overflow.
    """
    n = num_rounds
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
    if not np.isfinite(np.sum(bands * bands)):
        raise ValueError("correlation produces non-finite column norms (entries too large)")
    return bands


def check_bands(bands, max_bands: int, limit_name: str):
    """Shape check of a traced band table: 2-D with ``1 .. max_bands`` columns."""
    if bands.ndim != 2:
        raise ValueError(f"bands must be 2-D (num_rounds, num_bands), got shape {bands.shape}")
    if not 1 <= bands.shape[1] <= max_bands:
        raise ValueError(f"bands must have between 1 and {limit_name} = {max_bands} columns (bands), "
                         f"got shape {bands.shape}")


def check_observations(bands, y):
    if y.ndim not in (1, 2) or y.shape[0] != bands.shape[0]:
        raise ValueError(f"observations must have shape (n,) or (n, S) with n = {bands.shape[0]} (the rows of "
                         f"bands), got shape {y.shape}")


def band_dots(bands, v):
    """``<c_j, v>`` for every column ``j``: ``(n, ...)`` for ``v (n, ...)``; ``c_j`` is truncated at
    round ``n`` by ``bands`` itself (``bands[j, t] = 0`` for ``j + t >= n``)."""
    n, k = bands.shape
    pad = [(0, k - 1)] + [(0, 0)] * (v.ndim - 1)
    vp = jnp.pad(v, pad)
    expand = (slice(None),) + (None,) * (v.ndim - 1)
    dots = bands[:, 0][expand] * v
    for t in range(1, k):
        dots = dots + bands[:, t][expand] * vp[t: t + n]
    return dots


def log_emissions(bands, y, sigma):
    """``log f_j(y) = (<c_j, y> - |c_j|^2 / 2) / sigma^2`` for every round: ``(n, ...)``."""
    expand = (slice(None),) + (None,) * (y.ndim - 1)
    half_norms = 0.5 * jnp.sum(bands * bands, axis=1)
    inv_var = 1.0 / (sigma * sigma)
    return (band_dots(bands, y) - half_norms[expand]) * inv_var


def band_mean(bands, x):
    """``C x`` for participation patterns ``x (n, S)``: ``(C x)_i = sum_t bands[i - t, t] x_{i - t}``."""
    n, k = bands.shape
    out = bands[:, 0][:, None] * x
    for t in range(1, k):
        # Row i receives column i - t's t-th band entry; rows < t receive nothing.
        shifted = jnp.pad((bands[:, t][:, None] * x)[: n - t], [(t, 0), (0, 0)]) if t < n else jnp.zeros_like(x)
        out = out + shifted
    return out


def paired_log_emissions(bands, x, z, sigma):
    """``(n, 2, S)`` log emission factors at ``X_P = C x + sigma Z`` (row 0) and ``X_Q = sigma Z``
    (row 1), the same normals ``Z (n, S)`` for both: ``log f_j(X_P) = log f_j(X_Q) + <c_j, C x> /
    sigma^2``."""
    log_f_q = log_emissions(bands, sigma * z, sigma)
    inv_var = 1.0 / (sigma * sigma)
    cross = band_dots(bands, band_mean(bands, x))
    return jnp.stack([log_f_q + cross * inv_var, log_f_q], axis=1)


def directions(log_ratio):
    """``(remove, add)`` losses from ``log P/Q`` at ``(X_P, X_Q)`` (``(2, S)``): ``log P/Q (X_P)`` and
    ``log Q/P (X_Q)``; a NaN counts as ``+inf`` (the worst case, :func:`core._nan_to_plus_inf`)."""
    return core._nan_to_plus_inf(log_ratio[0]), core._nan_to_plus_inf(-log_ratio[1])


# --------------------------------------------------------------------------- random stream


def block_draws(key, first_block, num_blocks: int, n: int, extra: int):
    """``(u (n, S), z (n, S), v (extra, S))`` of ``num_blocks`` blocks, ``S = num_blocks * BLOCK_SIZE``.

    Each block's words are drawn rounds-first, ``(n + 2 ceil(n / 2) + extra, BLOCK_SIZE)``, the
    layout the scans consume (no transpose of ``(S, n)`` arrays): ``u`` the chain's uniforms,
    ``z`` the normals, ``v`` the ``extra`` uniforms.
    """
    half = -(-n // 2)
    width = n + 2 * half + extra
    # core.block_words_fn(a, c) draws uint64[c, a] per block, vmap-safe (the block's words never
    # depend on the batch it is drawn in); here a = BLOCK_SIZE samples, c = width rows.
    fn = core.block_words_fn(core.BLOCK_SIZE, width)
    words = jax.vmap(lambda j: fn(jax.random.key_data(key), j))(first_block + jnp.arange(num_blocks))
    words = jnp.moveaxis(words, 0, 1).reshape(width, num_blocks * core.BLOCK_SIZE)
    u = uniform_open(words[:n])
    z1, z2 = normal_pairs_from_bits(words[n: n + half], words[n + half: n + 2 * half])
    z = jnp.concatenate([z1, z2], axis=0)[:n]
    return u, z, uniform_open(words[n + 2 * half:])


def default_chunk_blocks(num_samples: int, floats_per_sample: int, chunk_blocks: int | None) -> int:
    """Blocks per chunk: about 2^18 floats per ``(floats_per_sample, S)`` array unless given, at
    most the sample."""
    num_blocks = -(-num_samples // core.BLOCK_SIZE)
    if chunk_blocks is None:
        chunk_blocks = max(1, (core.DEFAULT_CHUNK_NORMALS // floats_per_sample) // core.BLOCK_SIZE)
    return min(chunk_blocks, num_blocks)


def chunked_sums(losses_of_chunk, num_samples: int, chunk_blocks: int, eps, squares: bool = True):
    """``(total (2, K), total_sq (2, K))`` of the hockey-stick terms of both directions.

    ``losses_of_chunk(first_block)`` gives the ``(remove, add)`` losses of the ``chunk_blocks``
    blocks from ``first_block`` on; the chunks run in a ``lax.scan`` and samples past
    ``num_samples`` are masked, so the sums do not depend on the chunking.  ``squares=False``
    skips the squares (``total_sq`` is then zeros).
    """
    num_chunks = -(-(-(-num_samples // core.BLOCK_SIZE)) // chunk_blocks)

    def chunk(carry, c):
        first = c * chunk_blocks
        remove, add = losses_of_chunk(first)
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


def solve_on_samples(total_of, bands, target_epsilon, target_delta, consts, num_samples: int, adjoint):
    """``sigma*`` with ``delta_hat(sigma*) = target_delta``: the repository's monotone root finder
    (:func:`dpjax.numerics.root.solve_monotone_root`, :data:`DEFAULT_NUM_ITERATIONS` halvings of
    ``log sigma`` over ``BRACKET_RELATIVE`` times the largest column norm; the feasible, upper end
    of the final bracket is returned).

    ``delta_hat(sigma)`` is the larger direction's mean hockey-stick term at ``target_epsilon``,
    ``max(total_of(sigma, bands, eps (1,), consts)[:, 0]) / num_samples``, ``total_of`` the sums of
    :func:`chunked_sums` on draws that ``consts`` fix (they do not depend on ``sigma``: common
    random numbers).  ``bands`` and the targets are differentiable through ``adjoint`` (the
    implicit function theorem at the root); ``consts`` get no gradient.
    """
    bands = jnp.asarray(bands, jnp.float64)
    eps = jnp.asarray(target_epsilon, jnp.float64)
    target = jnp.asarray(target_delta, jnp.float64)
    sensitivity = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.sum(bands * bands, axis=1))))
    bracket = (BRACKET_RELATIVE[0] * sensitivity, BRACKET_RELATIVE[1] * sensitivity)

    def value(sigma, theta, c):
        b, e = theta
        return jnp.max(total_of(sigma, b, jnp.reshape(e, (1,)), c)[:, 0]) / num_samples

    # The constants ride in theta (key data get float0 cotangents), so nothing traced is closed over.
    return solve_monotone_root(lambda s, th: value(s, th[0], th[1]), ((bands, eps), consts), target, bracket,
                               decreasing=True, num_iterations=DEFAULT_NUM_ITERATIONS, log_scale=True,
                               adjoint=adjoint)


# --------------------------------------------------------------------------- host methods


class ChainAccountant:
    """Host methods of a chain accountant.  A subclass sets ``self.bands`` (the ``(n, k)`` band
    table) and implements three hooks on validated arguments: ``_sums(sigma, eps (K,), m, key,
    chunk_blocks) -> MonteCarloSums``, ``_losses(sigma, m, key) -> (remove, add)`` and
    ``_root(eps, delta, m, key) -> Solution`` (the calibration on common random numbers)."""

    bands: np.ndarray

    @float64
    def privacy_losses(self, noise_multiplier, num_samples, key):
        """``(remove, add)`` privacy-loss samples, NumPy float64 ``(num_samples,)`` each: ``log P/Q
        (X)`` with ``X ~ P`` and ``log Q/P (X)`` with ``X ~ Q``, from the stream of ``key`` (JAX key or
        int seed).

        Example::

            acc = RandomAllocation(np.array([1.0, 0.5]), batches_per_epoch=8, epochs=4)
            remove, add = acc.privacy_losses(1.0, num_samples=4096, key=0)
        """
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        m = _validate_samples(num_samples)
        remove, add = self._losses(sigma, m, core.as_prng_key(key))
        return np.asarray(remove), np.asarray(add)

    @property
    def sensitivity(self) -> float:
        """``max_j |c_j|_2``: the largest column norm of ``C`` (the l2 sensitivity of one participation)."""
        return float(np.sqrt(np.max(np.sum(self.bands * self.bands, axis=1))))

    @float64
    def estimate(self, noise_multiplier, epsilon, num_samples, key, *, confidence=0.95, chunk_size=None,
                 devices=None):
        """Both directions at every ``epsilon`` from one set of ``num_samples`` draws: a
        :class:`~dpjax.montecarlo.DeltaEstimate`.

        ``delta`` is the mean of ``max(0, 1 - exp(eps - L))`` over the loss samples ``L`` of the
        larger direction, ``standard_error`` its ``sqrt(var / m)``; ``delta_low`` / ``delta_high``
        a ``confidence`` interval on the max-direction delta (Chernoff-KL bounds, the terms lie in
        ``[0, 1]``), as :meth:`dpjax.montecarlo.BallsInBins.estimate`.  ``chunk_size``: samples per
        chunk (rounded up to whole blocks; the draws, hence the numbers, do not depend on it).
        ``devices``: ``None`` only (one device; the argument exists so that Estimate-Verify-Release
        can call every accountant alike).

        Example::

            acc = BMinSep(np.array([1.0, 0.5]), sampling_prob=0.2, min_sep=4, num_rounds=32)
            est = acc.estimate(1.0, [1.0, 2.0], num_samples=1 << 16, key=0)
            est.delta, est.standard_error, est.delta_low, est.delta_high, est.num_samples
        """
        confidence = _confidence(confidence)
        chunk_blocks = self._chunk_blocks(chunk_size, devices)
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        flat = np.atleast_1d(_validate.nonnegative("epsilon", epsilon)).reshape(-1)
        m = _validate_samples(num_samples)
        sums = self._sums(sigma, jnp.asarray(flat), m, core.as_prng_key(key), chunk_blocks)
        return delta_estimate_from_sums(sums, m, flat, confidence)

    def delta(self, noise_multiplier, epsilon, num_samples, key):
        """``(estimate, standard_error)`` of delta at ``epsilon`` (scalar or array; same shape),
        the max over the two directions.

        Example::

            RandomAllocation(np.array([1.0]), 8, 4).delta(1.0, 1.0, num_samples=1 << 16, key=0)
        """
        est = self.estimate(noise_multiplier, epsilon, num_samples, key)
        shape = np.shape(epsilon)
        return est.delta.reshape(shape), est.standard_error.reshape(shape)

    def _chunk_blocks(self, chunk_size, devices):
        if devices is not None:
            raise ValueError(f"devices must be None for {type(self).__name__} (it runs on one device), "
                             f"got {devices!r}")
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
        bisection in ``log sigma`` to ~1e-14 relative; the feasible end of the final bracket is
        returned, so ``self.delta(sigma, target_epsilon, num_samples, key)`` at the returned
        ``sigma`` is ``<= target_delta`` up to round-off of the summation.  A float, an *estimate*
        from ``num_samples`` draws (its error is that of ``delta_hat``, about ``standard_error / |d
        delta_hat / d sigma|``), not a certificate: certify with :meth:`certify` on other draws, or
        pass ``certify=True`` to get the :class:`~dpjax.montecarlo.Certificate` of
        :meth:`certify_noise` instead (``num_samples`` its verification samples, ``None`` for the
        method's default).

        Raises:
          ValueError: bad input (naming the argument); a target not reached by any noise
            multiplier up to 1e4 x the sensitivity, or met already at 1e-3 x it.

        Example::

            acc = RandomAllocation(np.array([1.0, 0.5]), batches_per_epoch=8, epochs=4)
            sigma = acc.calibrate(2.0, 1e-3, num_samples=1 << 16, key=0)
            acc.delta(sigma, 2.0, 1 << 16, 0)   # (<= 1e-3, its standard error)
        """
        if certify:
            return self.certify_noise(target_epsilon, target_delta, key, num_samples=num_samples, method=method)
        m = _validate_samples(num_samples)
        target = _validate.PrivacyTarget(target_epsilon, target_delta)
        return self._calibrate(float(target.epsilon), float(target.delta), m, core.as_prng_key(key))

    @float64
    def _calibrate(self, eps, delta, m, key):
        from dpjax.montecarlo.calibrate import raise_on_status

        res = self._root(eps, delta, m, key)
        raise_on_status(res, eps, delta)
        return float(res.root)

    def _ladder_calibration(self, epsilon, base_delta, key, num_samples, initial_noise):
        """The calibration step of :func:`dpjax.montecarlo.evr.certify_noise`'s ladder: ``sigma_0``
        solving ``delta_hat = base_delta`` on ``num_samples`` draws from ``key``."""
        return self._calibrate(float(epsilon), float(base_delta), int(num_samples), key)

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

            acc = RandomAllocation(np.array([1.0]), batches_per_epoch=8, epochs=2)
            cert = acc.certify(1.0, 2.0, 0.05, num_samples=1 << 15, key=1)
            cert.verified, cert.delta, cert.failure_probability
        """
        from dpjax.montecarlo import evr

        self._bernoulli_only(method)
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

        self._bernoulli_only(method)
        if num_samples is not None:
            num_samples = _validate_samples(num_samples)
        ladder = evr.Ladder(rungs=evr.DEFAULT_LADDER_RUNGS if rungs is None else rungs, growth=growth,
                            calibration_samples=calibration_samples)
        return evr.certify_noise(self, target_epsilon=target_epsilon, target_delta=target_delta,
                                 num_samples=num_samples, key=core.as_prng_key(key), initial_noise=initial_noise,
                                 method="bernoulli_kl", ladder=ladder)

    def _bernoulli_only(self, method):
        if method != "bernoulli_kl":
            raise ValueError(f"method must be 'bernoulli_kl' for {type(self).__name__} (the 'importance_betting' "
                             f"test needs the balls-in-bins importance sampler), got {method!r}")
