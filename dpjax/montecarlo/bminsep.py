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
from dpjax.montecarlo import _chain, core
from dpjax.montecarlo._accountant import DeltaEstimate  # noqa: F401  (the record the estimates are)
from dpjax.montecarlo.calibrate import DEFAULT_NUM_ITERATIONS  # noqa: F401  (named in docstrings)
from dpjax.numerics.root import ImplicitAdjoint, Solution, StopGradientAdjoint

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
    bands = _chain.band_columns(correlation, n)
    k = bands.shape[1]
    if k > b:
        raise ValueError(
            f"correlation has {k} bands but min_sep = {b}: b-min-sep accounting supports at most "
            f"min_sep bands (C[i, j] = 0 unless 0 <= i - j < min_sep). With more bands two "
            f"participations' columns of C overlap and the likelihood ratio no longer factorises over "
            f"participations (Dong & Ganesh, arXiv 2602.09338); use a C with <= {b} bands or a larger min_sep")
    return bands


# --------------------------------------------------------------------------- pure numerics


def _check_bands(bands, min_sep: int):
    _chain.check_bands(bands, min_sep, "min_sep")


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
    """``(u (n, S), z (n, S), u0 (S,))``: the stream of :func:`dpjax.montecarlo._chain.block_draws`
    with one extra uniform per sample, the warm-start state."""
    u, z, v = _chain.block_draws(key, first_block, num_blocks, n, 1)
    return u, z, v[0]


def _losses_from_draws(bands, sigma, sampling_prob, u, z, u0, min_sep, warm_start):
    x = _participation(u, u0, sampling_prob, min_sep, warm_start)
    log_f = _chain.paired_log_emissions(bands, x, z, sigma)  # (n, 2, S): X_P and X_Q share Z
    return _chain.directions(_forward(log_f, sampling_prob, min_sep, warm_start))


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
    _chain.check_observations(bands, y)
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    p = jnp.asarray(sampling_prob, jnp.float64)
    return _forward(_chain.log_emissions(bands, y, sigma), p, min_sep, warm_start)


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


def _sums(bands, sigma, p, eps, key, *, min_sep, num_samples, warm_start, chunk_blocks, squares=True):
    """``(total (2, K), total_sq (2, K))`` of :func:`monte_carlo_sums` (traced arguments, rbg ``key``).

    Differentiable in ``bands``, ``sigma`` and ``eps`` (the draws do not depend on them); the
    calibration solves on these sums, so its estimate is the one :meth:`BMinSep.estimate` reports.
    ``squares=False`` skips the squares (``total_sq`` is then zeros).
    """
    n = bands.shape[0]
    chunk_blocks = _chain.default_chunk_blocks(num_samples, n, chunk_blocks)

    def losses(first):
        u, z, u0 = _block_draws(key, first, chunk_blocks, n)
        return _losses_from_draws(bands, sigma, p, u, z, u0, min_sep, warm_start)

    return _chain.chunked_sums(losses, num_samples, chunk_blocks, eps, squares)


# --------------------------------------------------------------------------- calibration


def _calibration_total(sigma, bands, eps, consts, *, min_sep, num_samples, warm_start, chunk_blocks):
    """Hockey-stick sums at ``(bands, eps)`` on the draws of ``consts = (sampling_prob, key_data)``."""
    p, key_data = consts
    key = jax.random.wrap_key_data(key_data, impl="rbg")
    return _sums(bands, sigma, p, eps, key, min_sep=min_sep, num_samples=num_samples, warm_start=warm_start,
                 chunk_blocks=chunk_blocks, squares=False)[0]


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
        with jax.enable_x64(True):  # under jit the float64 core needs x64 (docs/design.md §8)
            sol = jax.jit(functools.partial(calibrate_on_samples, min_sep=4, num_samples=1 << 14))(
                bands, 2.0, 1e-3, 0.2, jax.random.key(0))
        sol.root
    """
    bands = jnp.asarray(bands, jnp.float64)
    _check_bands(bands, min_sep)
    p = jax.lax.stop_gradient(jnp.asarray(sampling_prob, jnp.float64))
    key_data = jax.random.key_data(core.rbg_key(key))
    total_of = functools.partial(_calibration_total, min_sep=min_sep, num_samples=num_samples, warm_start=warm_start,
                                 chunk_blocks=chunk_blocks)
    return _chain.solve_on_samples(total_of, bands, target_epsilon, target_delta, (p, key_data), num_samples,
                                   adjoint)


@functools.partial(jax.jit, static_argnames=("min_sep", "num_samples", "warm_start"))
def _calibrate_jit(bands, target_epsilon, target_delta, sampling_prob, key, *, min_sep, num_samples, warm_start):
    return calibrate_on_samples(bands, target_epsilon, target_delta, sampling_prob, key, min_sep=min_sep,
                                num_samples=num_samples, warm_start=warm_start, adjoint=StopGradientAdjoint())


# --------------------------------------------------------------------------- accountant


class BMinSep(_chain.ChainAccountant):
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
    The methods (``estimate``, ``delta``, ``privacy_losses``, ``calibrate``, ``certify``,
    ``certify_noise``, ``sensitivity``) are those of every chain accountant
    (:class:`dpjax.montecarlo._chain.ChainAccountant`); ``calibrate`` runs
    :func:`calibrate_on_samples`, and a new ``sampling_prob`` or target does not recompile.

    Example::

        acc = BMinSep(np.array([1.0, 0.5, 0.25]), sampling_prob=0.1, min_sep=4, num_rounds=128)
        est = acc.estimate(noise_multiplier=1.0, epsilon=[1.0, 2.0], num_samples=1 << 18, key=0)
        est.delta, est.standard_error, est.delta_low, est.delta_high, est.num_samples
        sigma = acc.calibrate(2.0, 1e-3, num_samples=1 << 16, key=0)        # an estimate
        cert = acc.certify_noise(2.0, 0.05, key=1, num_samples=1 << 15)      # a certificate
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

    def _losses(self, sigma, m, key):
        return privacy_losses(jnp.asarray(self.bands), sigma, self.sampling_prob, key, min_sep=self.min_sep,
                              num_samples=m, warm_start=self.warm_start)

    def _sums(self, sigma, eps, m, key, chunk_blocks):
        return monte_carlo_sums(jnp.asarray(self.bands), sigma, self.sampling_prob, eps, key, min_sep=self.min_sep,
                                num_samples=m, warm_start=self.warm_start, chunk_blocks=chunk_blocks)

    def _root(self, eps, delta, m, key):
        return _calibrate_jit(jnp.asarray(self.bands), eps, delta, self.sampling_prob, key, min_sep=self.min_sep,
                              num_samples=m, warm_start=self.warm_start)
