"""Mixture-of-Gaussians (MoG) mechanism: closed-form privacy-loss distribution.

A scalar MoG mechanism (Choquette-Choo, Ganesh, Steinke & Thakurta 2023; Ganesh 2024, Def. 2.8)
has sensitivities ``s_j >= 0`` with probabilities ``p_j`` and noise standard deviation
``sigma``.  Its dominating pair (Ganesh 2024, Lemma 2.9; docs/design.md §1) is

    remove:  P = sum_j p_j N(s_j, sigma^2)   vs   Q = N(0, sigma^2)
    add:     the pair swapped.

Work in units of sigma (``z = x / sigma``, ``c_j = s_j / sigma``).  The privacy loss of the
remove pair at output z is

    L(z) = log P(z)/Q(z) = log( p_0 + sum_{c_j > 0} p_j exp(c_j z - c_j^2 / 2) ),

(``p_0`` = total probability of zero sensitivity) which is increasing and convex in z, with
range ``(log p_0, inf)``.  So every event ``{L <= y}`` is a half-line ``{z <= z(y)}`` and the
privacy-loss CDFs are closed-form sums of normal CDFs (Ganesh 2024, §2.3):

    P[L(Z) <= y], Z ~ P  = sum_j p_j Phi(z(y) - c_j)
    P[L(Z) <= y], Z ~ Q  = Phi(z(y)).

The add pair's loss is ``-L(Z)`` with ``Z ~ Q``, so its CDF is ``P_Q[L(Z) >= -y]``.

The only numerical step is the inverse ``z(y)``.  We solve ``h(z) = u`` with
``h(z) = logsumexp_{c_j > 0}(log p_j + c_j z - c_j^2/2)`` and ``u = log(e^y - p_0)``: ``h`` is
convex with slope in ``[min c_j, max c_j]`` (well conditioned even where L is flat near
``log p_0``), and every single term lower-bounds it, so
``z_0 = min_j (u - log p_j + c_j^2/2) / c_j`` lies right of the root; Newton's method from the
right of the root of a convex increasing function decreases monotonically to it, quadratically
once close.  All functions below are pure, fixed-shape and vmappable (pad unused components
with probability 0, i.e. ``log_probs = -inf``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpjax._base import lazy_module as _lazy_module, register_pytree_dataclass as _register_pytree_dataclass
from dpjax._base import validate as _validate
from dpjax._base.ops import is_jax as _is_jax
from dpjax.pld.group_spec import SAMPLINGS, Sampling, validate_group_spec
from dpjax.pld.mechanisms import LossCDFs, _ops, check_direction, normal_cdf_sf

jax = _lazy_module("jax")
_jax_special = _lazy_module("jax.scipy.special")

# Newton steps for z(y).  The start is within log(K) / min c_j of the root and convergence is
# quadratic from there: on the family-C mixtures 4-6 steps reach float64 round-off; 8 leaves a
# margin (checked in tests/test_group_mog.py against a 60-step bisection on random mixtures).
_NEWTON_STEPS = 8
# Interpolation nodes and polishing steps of the fast path (see mog_inverse_privacy_loss).
_INTERP_NODES = 2048
_POLISH_STEPS = 3


def _logsumexp(xp, a, axis=None, keepdims=False):
    """``log sum exp(a)`` on either backend (``-inf`` for an empty or all ``-inf`` sum)."""
    top = xp.max(a, axis=axis, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = xp.log(xp.sum(xp.exp(a - top), axis=axis, keepdims=True)) + top
    return out if keepdims else (xp.squeeze(out, axis=axis) if axis is not None else out.reshape(()))


def _split_zero(scaled_sensitivities, log_probs, ops=None):
    xp = _ops(ops).xp
    positive = scaled_sensitivities > 0
    log_p0 = _logsumexp(xp, xp.where(positive, -np.inf, log_probs))
    log_pos = xp.where(positive, log_probs, -np.inf)
    # Dummy slope for zero / padded components so divisions stay finite; their weight is 0.
    c_safe = xp.where(positive, scaled_sensitivities, 1.0)
    return log_p0, log_pos, c_safe


def mog_privacy_loss(z: jax.Array, scaled_sensitivities: jax.Array, log_probs: jax.Array) -> jax.Array:
    """Remove-direction privacy loss ``L(z) = log P(z)/Q(z)`` at outputs ``z`` (units of sigma).

    Args:
      z: any shape, outputs divided by sigma.
      scaled_sensitivities: shape ``(K,)``, ``s_j / sigma >= 0``.
      log_probs: shape ``(K,)``, ``log p_j`` (``-inf`` for padding).
    Returns:
      same shape as ``z``.
    """
    c = scaled_sensitivities
    a = log_probs + c * z[..., None] - 0.5 * c * c
    return _jax_special.logsumexp(a, axis=-1)


def _newton_h(u, z, log_pos, c, steps: int, ops=None):
    """``steps`` Newton iterations for ``h(z) = u`` (see module docstring), vectorized over u, z."""
    ops = _ops(ops)
    if not _is_jax(ops):
        return _newton_h_host(u, z, log_pos, c, steps)
    xp = ops.xp

    def body(_, z):
        a = log_pos + c * z[:, None] - 0.5 * c * c
        top = xp.max(a, axis=-1, keepdims=True)
        e = xp.exp(a - top)
        total = xp.sum(e, axis=-1)
        h = top[:, 0] + xp.log(total)
        slope = xp.sum(e * c, axis=-1) / total
        return z - (h - u) / slope

    return ops.fori_loop(0, steps, body, z)


def _newton_h_host(u, z, log_pos, c, steps: int):
    """:func:`_newton_h` in NumPy, components first.

    The same iteration in a layout NumPy runs fast: the ``(K, n)`` terms are reduced over the
    leading axis (``K - 1`` elementwise passes over contiguous rows, where a reduction over a short
    trailing axis runs element by element), and the components of weight 0 (padding, zero
    sensitivity) are dropped, which removes only exact zeros from the sums.  The result differs
    from the compiled iteration's in the last bits only (summation order).
    """
    keep = np.isfinite(log_pos)
    if not keep.any():
        return z + np.nan                    # as the compiled iteration: no positive component
    c_pos = c[keep]
    offset = (log_pos[keep] - 0.5 * c_pos * c_pos)[:, None]
    c_col = c_pos[:, None]
    for _ in range(steps):
        a = c_col * z
        a += offset
        top = a.max(axis=0)
        a -= top
        np.exp(a, out=a)
        total = a.sum(axis=0)
        a *= c_col
        slope = a.sum(axis=0) / total
        z = z - (top + np.log(total) - u) / slope
    return z


def _u_of_y(y, log_p0, ops=None):
    """``u = log(e^y - p_0)`` (no cancellation) and the mask ``y > log p_0``."""
    xp = _ops(ops).xp
    above = y > log_p0
    y_safe = xp.where(above, y, log_p0 + 1.0)
    return y_safe + xp.log(-xp.expm1(log_p0 - y_safe)), above


def _z_upper_start(u, log_pos, c, ops=None):
    """``min_j (u - log p_j + c_j^2/2) / c_j``: right of the root (each term lower-bounds h)."""
    xp = _ops(ops).xp
    with np.errstate(invalid="ignore"):
        starts = (u[:, None] - log_pos + 0.5 * c * c) / c
    return xp.min(xp.where(xp.isfinite(log_pos), starts, np.inf), axis=-1)


def mog_inverse_privacy_loss(y: jax.Array, scaled_sensitivities: jax.Array, log_probs: jax.Array, *, exact: bool = False,
                             ops=None) -> jax.Array:
    """``z(y)`` with ``L(z(y)) = y`` (remove direction), ``-inf`` where ``y <= log p_0``.

    Two stages (``exact=False``, the default used on PLD grids): the root is solved with full
    Newton (``_NEWTON_STEPS``) at ``_INTERP_NODES`` nodes equally spaced in ``u`` between the
    extreme queries, linearly interpolated (``z(u)`` is concave with slope in
    ``[1/max c, 1/min c]``, so the start is within ~(du)^2 of the root) and polished with
    ``_POLISH_STEPS`` Newton steps (quadratic convergence: 1e-5 -> 1e-10 -> 1e-20).  Cost per
    query: ``_POLISH_STEPS`` log-sum-exps instead of ``_NEWTON_STEPS``.  ``exact=True`` runs the
    full Newton iteration at every query (reference path for tests).

    Args:
      y: shape ``(n,)`` privacy-loss values (nats).
      scaled_sensitivities, log_probs: shape ``(K,)`` (see :func:`mog_privacy_loss`).
    Returns:
      shape ``(n,)``, in units of sigma.
    """
    ops = _ops(ops)
    xp = ops.xp
    y = xp.asarray(y, np.float64)
    log_p0, log_pos, c = _split_zero(scaled_sensitivities, log_probs, ops)
    u, above = _u_of_y(y, log_p0, ops)
    if exact:
        z = _newton_h(u, _z_upper_start(u, log_pos, c, ops), log_pos, c, _NEWTON_STEPS, ops)
        return xp.where(above, z, -np.inf)
    u_lo = xp.min(xp.where(above, u, np.inf))
    u_hi = xp.max(xp.where(above, u, -np.inf))
    finite = xp.isfinite(u_lo) & xp.isfinite(u_hi)
    u_lo = xp.where(finite, u_lo, 0.0)
    u_hi = xp.where(finite, xp.maximum(u_hi, u_lo + 1e-9), 1.0)
    nodes = xp.linspace(u_lo, u_hi, _INTERP_NODES)
    z_nodes = _newton_h(nodes, _z_upper_start(nodes, log_pos, c, ops), log_pos, c, _NEWTON_STEPS, ops)
    # Uniform nodes: the bracketing interval is found by arithmetic (no searchsorted).
    step = (u_hi - u_lo) / (_INTERP_NODES - 1)
    t = xp.clip((u - u_lo) / step, 0.0, _INTERP_NODES - 1.0)
    i = xp.minimum(xp.floor(t).astype(np.int32), _INTERP_NODES - 2)
    frac = t - i
    z = z_nodes[i] + frac * (z_nodes[i + 1] - z_nodes[i])
    z = _newton_h(u, z, log_pos, c, _POLISH_STEPS, ops)
    return xp.where(above, z, -np.inf)


def _mixture_cdf_sf(z: jax.Array, c: jax.Array, probs: jax.Array, ops=None):
    """``(sum_j p_j Phi(z - c_j), sum_j p_j Phi(c_j - z))``, each term's small side computed directly.

    Shapes: ``z`` ``(n,)``, ``c``/``probs`` ``(K,)`` -> two ``(n,)`` arrays.  Summing accurate
    non-negative terms keeps the relative accuracy of both tails (no ``1 - cdf``).  A mixture
    tail: each term is :func:`dpjax.pld.mechanisms.normal_cdf_sf`, the one normal tail.
    """
    le, gt = normal_cdf_sf(z[:, None] - c, ops)
    return le @ probs, gt @ probs


def mog_loss_cdfs(direction: str, y: jax.Array, scaled_sensitivities: jax.Array, probabilities: jax.Array,
                  ops=None) -> LossCDFs:
    """Privacy-loss CDFs of a MoG pair in ``direction`` at losses ``y`` (pure; the mechanism core).

    Args:
      direction: ``"remove"`` (P = mixture, Q = N(0,1)) or ``"add"`` (swapped); static.
      y: any shape, loss values (nats).
      scaled_sensitivities: ``(K,)`` sensitivities / standard deviation (>= 0).
      probabilities: ``(K,)`` mixture weights (0 for padding).
    Returns:
      :class:`~dpjax.pld.mechanisms.LossCDFs` ``P(Y<=y), P(Y>y), Q(Y<=y), Q(Y>y)``, shape of ``y``.
      Vmappable over padded ``(scaled_sensitivities, probabilities)``.
    """
    check_direction(direction)
    ops = _ops(ops)
    xp = ops.xp
    c = xp.asarray(scaled_sensitivities, np.float64)
    probs = xp.asarray(probabilities, np.float64)
    # log 0 = -inf for padding, without the 0/0 its derivative would be (same values; finite
    # gradients in the mechanism's parameters, dpjax.pld.grid.batched).
    positive = probs > 0
    log_probs = xp.where(positive, xp.log(xp.where(positive, probs, 1.0)), -np.inf)
    y = xp.asarray(y, np.float64)
    flat = y.reshape(-1)
    if direction == "remove":
        # {Y <= y} = {Z <= z(y)}; Z ~ mixture under P, N(0, 1) under Q.
        z = mog_inverse_privacy_loss(flat, c, log_probs, ops=ops)
        p_le, p_gt = _mixture_cdf_sf(z, c, probs, ops)
        q_le, q_gt = normal_cdf_sf(z, ops)
    else:
        # Y' = -L(Z); {Y' <= y} = {Z >= z(-y)}; Z ~ N(0, 1) under P', mixture under Q'.
        z = mog_inverse_privacy_loss(-flat, c, log_probs, ops=ops)
        p_gt, p_le = normal_cdf_sf(z, ops)                 # Phi(z), Phi(-z)
        m_le, m_gt = _mixture_cdf_sf(z, c, probs, ops)     # P_mix(Z <= z), P_mix(Z > z)
        q_le, q_gt = m_gt, m_le
    shape = y.shape
    return LossCDFs(p_le.reshape(shape), p_gt.reshape(shape), q_le.reshape(shape), q_gt.reshape(shape))


def mog_loss_cdfs_directions(directions: tuple[str, ...], y: jax.Array, scaled_sensitivities: jax.Array,
                             probabilities: jax.Array, ops=None) -> LossCDFs:
    """:func:`mog_loss_cdfs` of several directions at once: ``y`` ``(D, ...)``, row ``d`` in
    ``directions[d]``.  One inverse loss, one mixture CDF and one normal CDF for every row (the
    add pair is the remove pair swapped, evaluated at ``z(-y)``): half the work of two calls on
    the host, and half the code for XLA to compile.  The two halves are
    :func:`mog_points_directions` and :func:`mog_cdfs_at_points`."""
    z = mog_points_directions(directions, y, scaled_sensitivities, probabilities, ops)
    return mog_cdfs_at_points(directions, z, scaled_sensitivities, probabilities, ops)


def _log_probs(xp, probs):
    positive = probs > 0
    return xp.where(positive, xp.log(xp.where(positive, probs, 1.0)), -np.inf)


def mog_points_directions(directions: tuple[str, ...], y: jax.Array, scaled_sensitivities: jax.Array,
                          probabilities: jax.Array, ops=None) -> jax.Array:
    """The outputs ``z`` (units of sigma, shape of ``y``) whose events give the loss CDFs at
    ``y``: ``z(y)`` for the remove direction, ``z(-y)`` for the add direction
    (:func:`mog_inverse_privacy_loss`; ``-inf`` where no output has that loss)."""
    for d in directions:
        check_direction(d)
    ops = _ops(ops)
    xp = ops.xp
    c = xp.asarray(scaled_sensitivities, np.float64)
    log_probs = _log_probs(xp, xp.asarray(probabilities, np.float64))
    y = xp.asarray(y, np.float64)
    shape = (len(directions),) + (1,) * (y.ndim - 1)
    remove = np.array([d == "remove" for d in directions]).reshape(shape)
    z = mog_inverse_privacy_loss(xp.where(remove, y, -y).reshape(-1), c, log_probs, ops=ops)
    return z.reshape(y.shape)


def mog_cdfs_at_points(directions: tuple[str, ...], z: jax.Array, scaled_sensitivities: jax.Array,
                       probabilities: jax.Array, ops=None) -> LossCDFs:
    """The loss CDFs from :func:`mog_points_directions`'s outputs ``z``: remove, ``P`` the
    mixture and ``Q = N(0, 1)`` at ``{Z <= z}``; add, the pair swapped at ``{Z >= z}``."""
    ops = _ops(ops)
    xp = ops.xp
    c = xp.asarray(scaled_sensitivities, np.float64)
    probs = xp.asarray(probabilities, np.float64)
    if not _is_jax(ops):
        # Components of weight 0 (padding) add exact zeros to the mixture: the host skips their
        # normal CDFs, half of the evaluation for a padded group.
        c, probs = c[probs > 0], probs[probs > 0]
    shape = (len(directions),) + (1,) * (z.ndim - 1)
    remove = np.array([d == "remove" for d in directions]).reshape(shape)
    flat = z.reshape(-1)
    # The mixture's components and N(0, 1) in one normal-CDF evaluation (a component at 0).
    le, gt = normal_cdf_sf(flat[:, None] - xp.concatenate([c, xp.zeros(1)]), ops)
    m_le, m_gt = (le[:, :-1] @ probs).reshape(z.shape), (gt[:, :-1] @ probs).reshape(z.shape)
    n_le, n_gt = le[:, -1].reshape(z.shape), gt[:, -1].reshape(z.shape)
    return LossCDFs(xp.where(remove, m_le, n_gt), xp.where(remove, m_gt, n_le),
                    xp.where(remove, n_le, m_gt), xp.where(remove, n_gt, m_le))


def _tuple_of_floats(name, values) -> tuple[float, ...]:
    arr = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d sequence of numbers, got {values!r}")
    return tuple(float(v) for v in arr)


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class MixtureOfGaussians:
    """Scalar mixture-of-Gaussians mechanism (Ganesh 2024, Def. 2.8), add/remove dominating pairs.

    Remove: ``P = sum_j probabilities[j] N(sensitivities[j], standard_deviation^2)``,
    ``Q = N(0, standard_deviation^2)``; add: the pair swapped (interface of
    :mod:`dpjax.pld.mechanisms`).  The mixture is a static (hashable) part of the mechanism, the
    noise ``standard_deviation`` a data field (so noise schedules stack); for a mixture that
    varies inside a jitted/vmapped program use :class:`GroupSubsampledGaussian` or the pure
    :func:`mog_loss_cdfs` with padded vectors.

    Attributes:
      standard_deviation: () noise standard deviation, > 0.
      sensitivities: static tuple of ``K`` non-negative sensitivities (same units as the noise).
      probabilities: static tuple of ``K`` non-negative weights summing to 1.

    Example::

        >>> from dpjax import pld
        >>> mog = MixtureOfGaussians(1.0, sensitivities=(0.0, 1.0, 2.0), probabilities=(0.9801, 0.0198, 0.0001))
        >>> pld.epsilon([(mog, 2000)], 1e-5).epsilon       # doctest: +SKIP
        5.70...
    """

    standard_deviation: jax.Array
    sensitivities: tuple = dataclasses.field(default=(0.0, 1.0), metadata=dict(static=True))
    probabilities: tuple = dataclasses.field(default=(0.0, 1.0), metadata=dict(static=True))

    symmetric = False

    def __post_init__(self):
        # Static fields must be hashable: normalise any sequence / array to a tuple of floats.
        object.__setattr__(self, "sensitivities", _tuple_of_floats("sensitivities", self.sensitivities))
        object.__setattr__(self, "probabilities", _tuple_of_floats("probabilities", self.probabilities))

    def validate(self) -> "MixtureOfGaussians":
        _validate.positive("standard_deviation", self.standard_deviation)
        s = _validate.nonnegative("sensitivities", self.sensitivities)
        p = _validate.nonnegative("probabilities", self.probabilities)
        if s.shape != p.shape:
            raise ValueError(
                f"sensitivities and probabilities must have the same length, got {len(s)} and {len(p)}"
            )
        # 1e-9: weights computed in float64 from a pmf sum to 1 within ~1e-14.
        if abs(p.sum() - 1.0) > 1e-9:
            raise ValueError(f"probabilities must sum to 1, got sum {p.sum()!r}")
        return self

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        xp = _ops(ops).xp
        sd = xp.asarray(self.standard_deviation, np.float64)
        c = xp.asarray(self.sensitivities, np.float64) / sd
        return mog_loss_cdfs(direction, y, c, xp.asarray(self.probabilities, np.float64), ops)

    def max_loss(self, direction: str) -> np.ndarray:
        """Upper bound of the loss: ``inf`` under "remove"; under "add" (``N(0)`` against the
        mixture) ``-log p_0``, ``p_0`` the weight of the sensitivity-0 components (the mixture's
        density is at least ``p_0`` times ``N(0)``'s), ``inf`` without any."""
        check_direction(direction)
        sd = np.asarray(self.standard_deviation, np.float64)
        if direction == "remove":
            return np.full(sd.shape, np.inf)
        p0 = sum(pi for si, pi in zip(self.sensitivities, self.probabilities) if si == 0.0)
        with np.errstate(divide="ignore"):
            return np.full(sd.shape, -math.log(p0) if p0 > 0 else np.inf)

    def _mixture_arrays(self, ops=None):
        xp = _ops(ops).xp
        sd = xp.asarray(self.standard_deviation, np.float64)
        return xp.asarray(self.sensitivities, np.float64) / sd, xp.asarray(self.probabilities, np.float64)

    def loss_cdfs_directions(self, directions: tuple[str, ...], y, ops=None) -> LossCDFs:
        """:meth:`loss_cdfs` of several directions at once (``y`` ``(D, ...)``; see
        :func:`mog_loss_cdfs_directions`)."""
        return mog_loss_cdfs_directions(directions, y, *self._mixture_arrays(ops), ops)

    def loss_points_directions(self, directions: tuple[str, ...], y, ops=None):
        """First half of :meth:`loss_cdfs_directions`: :func:`mog_points_directions`."""
        return mog_points_directions(directions, y, *self._mixture_arrays(ops), ops)

    def cdfs_at_points(self, directions: tuple[str, ...], z, ops=None) -> LossCDFs:
        """Second half of :meth:`loss_cdfs_directions`: :func:`mog_cdfs_at_points`."""
        return mog_cdfs_at_points(directions, z, *self._mixture_arrays(ops), ops)


# --------------------------------------------------------------------------------------------
# Group privacy for DP-SGD (Ganesh 2024, Thm 3.1 and 3.3; docs/design.md §3).


def binomial_log_pmf(group_size, sampling_prob, num_components: int, ops=None) -> jax.Array:
    """``log Binomial(group_size, q)(j)`` for ``j = 0..num_components-1`` (``-inf`` for ``j > k``).

    Pure and jittable; ``group_size`` may be traced (so it can be vmapped with a fixed padding
    ``num_components >= max k + 1``).  ``q = 1`` puts all mass on ``j = k``.
    """
    ops = _ops(ops)
    xp, gammaln = ops.xp, ops.gammaln
    k = xp.asarray(group_size, np.float64)
    q = xp.asarray(sampling_prob, np.float64)
    j = xp.arange(num_components, dtype=np.float64)
    inside = j <= k
    safe_kj = xp.where(inside, k - j, 0.0)
    # One log-gamma evaluation for the three terms (one expansion in a compiled program).
    lg = gammaln(xp.concatenate([xp.reshape(k + 1.0, (1,)), j + 1.0, safe_kj + 1.0]))
    log_binom = lg[0] - lg[1:num_components + 1] - lg[num_components + 1:]
    q_safe = xp.where(q >= 1.0, 0.5, q)
    log_pmf = log_binom + j * xp.log(q_safe) + safe_kj * xp.log1p(-q_safe)
    log_pmf = xp.where(q >= 1.0, xp.where(j == k, 0.0, -np.inf), log_pmf)
    return xp.where(inside, log_pmf, -np.inf)


def hypergeometric_log_pmf(group_size, dataset_size, batch_size, num_components: int, ops=None) -> jax.Array:
    """``log Hypergeometric(N, k, B)(j)``: j of the k group members in a uniformly random batch
    of B out of N (the group-privacy note), ``j = 0..num_components-1``; ``-inf`` outside the support.

    When ``N - k >= B`` (support starts at j = 0, the DP-SGD case) we use the exact product
    ``pmf(0) = prod_{i<k} (1 - B/(N - i))`` and the ratio recursion
    ``pmf(j+1)/pmf(j) = (k-j)(B-j) / ((j+1)(N-k-B+j+1))``: every factor is accurate to round-off,
    so the weights carry ~k ulps of error (``gammaln`` of N = 5e4 would carry ~1e-10).  Otherwise
    (tiny datasets) the ``gammaln`` form is used.  Pure, jittable, traced sizes allowed.
    """
    ops = _ops(ops)
    xp, gammaln = ops.xp, ops.gammaln
    k = xp.asarray(group_size, np.float64)
    n = xp.asarray(dataset_size, np.float64)
    b = xp.asarray(batch_size, np.float64)
    j = xp.arange(num_components, dtype=np.float64)
    inside = (j <= k) & (j <= b) & (b - j <= n - k)

    # Recursion (valid where N - k >= B).
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p0 = xp.sum(xp.where(j < k, xp.log1p(-b / (n - j)), 0.0))
        num = (k - j) * (b - j)
        den = (j + 1.0) * (n - k - b + j + 1.0)
        log_ratio = xp.where((num > 0) & (den > 0),
                             xp.log(xp.where(num > 0, num, 1.0)) - xp.log(xp.where(den > 0, den, 1.0)), -np.inf)
    log_rec = log_p0 + xp.concatenate([xp.zeros(1), xp.cumsum(log_ratio)[:-1]])

    def log_choose(a, r):
        r = xp.where(inside, r, 0.0)
        return gammaln(a + 1.0) - gammaln(r + 1.0) - gammaln(xp.maximum(a - r, 0.0) + 1.0)

    log_gam = log_choose(k, j) + log_choose(n - k, b - j) - log_choose(n, b)
    log_pmf = xp.where(n - k >= b, log_rec, log_gam)
    return xp.where(inside, log_pmf, -np.inf)


def group_mixture_params(noise_multiplier, group_size, sampling_prob=None, dataset_size=None, batch_size=None, *, sampling: str = "poisson", num_components: int | None = None, ops=None):
    """``(sensitivities, probabilities, standard_deviation)`` of the group-privacy MoG (pure).

    * ``sampling="poisson"`` (add/remove adjacency; Ganesh (2024), Thm 3.1): sensitivities
      ``j = 0..k``, probabilities ``Binomial(k, q)(j)``, standard deviation ``sigma``.
    * ``sampling="fixed_batch"`` (replace-one adjacency, replace-k for the group; Ganesh (2024),
      Thm 3.3, with the hypergeometric weights of the note "Group Privacy for Deep Learning with
      Differential Privacy"): sensitivities ``2j`` (replacing one example moves the clipped sum
      by up to 2), probabilities ``Hypergeometric(N, k, B)(j)``, standard deviation ``sigma``,
      the run's own noise multiplier (jax_privacy's FIXED_BATCH_SIZE user-level accountant uses
      the same mixture).

    ``num_components`` (static) pads to a fixed length (default ``group_size + 1``, which then
    must be concrete).  Shapes: ``(num_components,)``, ``(num_components,)``, ``()``.
    """
    sampling = Sampling.parse(sampling)
    xp = _ops(ops).xp
    if num_components is None:
        num_components = int(group_size) + 1
    j = xp.arange(num_components, dtype=np.float64)
    sigma = xp.asarray(noise_multiplier, np.float64)
    if sampling is Sampling.POISSON:
        log_p = binomial_log_pmf(group_size, sampling_prob, num_components, ops)
    else:
        log_p = hypergeometric_log_pmf(group_size, dataset_size, batch_size, num_components, ops)
    return sampling.sensitivity * j, xp.exp(log_p), sigma


@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class GroupSubsampledGaussian:
    """One DP-SGD step as seen by a group of ``group_size`` examples: a MoG with scalar parameters.

    * ``sampling="poisson"`` (add/remove-k adjacency; Ganesh (2024), Thm 3.1): sensitivities
      ``j = 0..k``, weights ``Binomial(k, sampling_prob)``, noise ``noise_multiplier``.
    * ``sampling="fixed_batch"`` (replace-k adjacency; Ganesh (2024), Thm 3.3): sensitivities
      ``2j``, weights ``Hypergeometric(dataset_size, k, batch_size)``, noise
      ``noise_multiplier`` -- the run's own noise, not doubled (``sampling_prob`` unused).

    ``sampling`` also accepts :class:`dpjax.pld.group_spec.Sampling`.  All numeric parameters
    are scalar data fields (the mechanism interface of :mod:`dpjax.pld.mechanisms`), so noise
    schedules stack and the mechanism is jittable and vmappable in ``noise_multiplier``,
    ``group_size``, ``sampling_prob``, ``dataset_size`` and ``batch_size``; the weights are
    computed inside :meth:`loss_cdfs`, padded to the static ``num_components``
    (>= group_size + 1) so that every group size shares one compiled program.

    Example::

        >>> from dpjax import pld
        >>> step = GroupSubsampledGaussian(1.0, 4, sampling_prob=0.01, num_components=8)
        >>> pld.epsilon([(step, 2000)], 1e-5).epsilon        # doctest: +SKIP
        13.10...
    """

    noise_multiplier: jax.Array
    group_size: jax.Array
    sampling_prob: jax.Array = 0.0
    dataset_size: jax.Array = 0.0
    batch_size: jax.Array = 0.0
    sampling: str = dataclasses.field(default="poisson", metadata=dict(static=True))
    num_components: int = dataclasses.field(default=0, metadata=dict(static=True))

    symmetric = False

    def __post_init__(self):
        if self.num_components == 0:
            try:
                k = int(np.max(np.asarray(self.group_size)))
            except Exception as exc:  # traced group_size: padding must be given explicitly
                raise ValueError("num_components must be given when group_size is traced") from exc
            object.__setattr__(self, "num_components", _padded_components(self._components_needed(k)))
        if self.sampling in SAMPLINGS:  # normalise to the enum; bad values fail in validate()
            object.__setattr__(self, "sampling", Sampling(self.sampling))

    def validate(self) -> "GroupSubsampledGaussian":
        """Concrete-value checks: the group arguments through the one validator
        (:func:`dpjax.pld.group_spec.validate_group_spec`, elementwise for stacked fields), then
        the noise and the padding."""
        _validate.positive("noise_multiplier", self.noise_multiplier)
        fixed = Sampling.parse(self.sampling) is Sampling.FIXED_BATCH
        spec = validate_group_spec(
            None if fixed else self.sampling_prob, group_size=self.group_size, sampling=self.sampling,
            dataset_size=self.dataset_size if fixed else None, batch_size=self.batch_size if fixed else None,
            allow_arrays=True,
        )
        k_max = int(np.max(spec.group_size))
        need = self._components_needed(k_max)
        if self.num_components < need + 1:
            raise ValueError(f"num_components must be >= {need + 1} (group_size + 1, less the components of "
                             f"total weight below {_PRUNE_TAIL:g}), got {self.num_components}")
        return self

    def _components_needed(self, k_max: int) -> int:
        """Largest sensitivity index ``J <= k_max`` worth keeping: the weights of ``j > J`` sum
        to at most ``_PRUNE_TAIL`` (1e-295).

        Sound without any bookkeeping: the kept mixture is a sub-measure of the full one (so the
        optimistic grid of it still gives lower bounds), and the dropped P-mass, below the
        1e-290 flush threshold of :func:`dpjax.pld.grid.discretize.grid_pmf`, is inside the
        ``2 m 1e-290`` it already puts on the ``+inf`` atom of the pessimistic grid.  For
        ``group_size=1000``, ``sampling_prob=0.01`` this keeps 512 padded components instead of
        1024.  Concrete parameters only (traced ones keep every component).
        """
        try:
            fixed = Sampling.parse(self.sampling) is Sampling.FIXED_BATCH
            ks = np.atleast_1d(np.asarray(self.group_size, np.float64))
            if fixed:
                from scipy.stats import hypergeom
                n_ds = np.atleast_1d(np.asarray(self.dataset_size, np.float64))
                b = np.atleast_1d(np.asarray(self.batch_size, np.float64))
                ks, n_ds, b = np.broadcast_arrays(ks, n_ds, b)
                tails = [hypergeom.logsf(np.arange(int(k) + 1), int(nd), int(k), int(bb))
                         for k, nd, bb in zip(ks, n_ds, b)]
            else:
                from scipy.stats import binom
                q = np.atleast_1d(np.asarray(self.sampling_prob, np.float64))
                ks, q = np.broadcast_arrays(ks, q)
                tails = [binom.logsf(np.arange(int(k) + 1), int(k), float(qq)) for k, qq in zip(ks, q)]
        except Exception:  # traced or invalid parameters: keep everything (validate() reports)
            return int(k_max)
        need = 0
        for t in tails:
            ok = np.flatnonzero(~(t > math.log(_PRUNE_TAIL)))   # logsf(j) = log P(X > j)
            need = max(need, int(ok[0]) if ok.size else len(t) - 1)
        return min(int(k_max), need)

    def max_loss(self, direction: str) -> np.ndarray:
        """Upper bound of the loss: ``inf`` under "remove"; under "add" (``N(0)`` against the
        mixture) ``-log p_0`` with ``p_0`` the probability that no group member is in the batch:
        ``(1 - q)^k`` (Poisson) or ``prod_{i < k} (1 - B / (N - i))`` (fixed batch), ``inf`` where
        it is 0.  Per stacked entry (host, concrete parameters)."""
        check_direction(direction)
        sigma = np.atleast_1d(np.asarray(self.noise_multiplier, np.float64))
        k = np.broadcast_to(np.asarray(self.group_size, np.float64), sigma.shape)
        if direction == "remove":
            return np.full(sigma.shape, np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            if Sampling.parse(self.sampling) is Sampling.POISSON:
                q = np.broadcast_to(np.asarray(self.sampling_prob, np.float64), sigma.shape)
                out = np.where(q < 1.0, -k * np.log1p(-np.minimum(q, 1.0)), np.inf)
            else:
                n = np.broadcast_to(np.asarray(self.dataset_size, np.float64), sigma.shape)
                b = np.broadcast_to(np.asarray(self.batch_size, np.float64), sigma.shape)
                out = np.empty(sigma.shape)
                for i in range(sigma.size):
                    ki, ni, bi = int(k[i]), float(n[i]), float(b[i])
                    if ni - ki < bi:
                        out[i] = np.inf
                    else:
                        out[i] = -math.fsum(math.log1p(-bi / (ni - j)) for j in range(ki))
        return out.reshape(np.shape(np.asarray(self.noise_multiplier))) if np.ndim(self.noise_multiplier) == 0 \
            else out

    def mixture(self, ops=None):
        """``(scaled_sensitivities, probabilities)``, each ``(num_components,)`` (pure)."""
        s, p, sd = group_mixture_params(
            self.noise_multiplier, self.group_size, self.sampling_prob, self.dataset_size, self.batch_size,
            sampling=self.sampling, num_components=self.num_components, ops=ops,
        )
        return s / sd, p

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        c, p = self.mixture(ops)
        return mog_loss_cdfs(direction, y, c, p, ops)

    def loss_cdfs_directions(self, directions: tuple[str, ...], y, ops=None) -> LossCDFs:
        """:meth:`loss_cdfs` of several directions at once (``y`` ``(D, ...)``; see
        :func:`mog_loss_cdfs_directions`)."""
        return mog_loss_cdfs_directions(directions, y, *self.mixture(ops), ops)

    def loss_points_directions(self, directions: tuple[str, ...], y, ops=None):
        """First half of :meth:`loss_cdfs_directions`: :func:`mog_points_directions`."""
        return mog_points_directions(directions, y, *self.mixture(ops), ops)

    def cdfs_at_points(self, directions: tuple[str, ...], z, ops=None) -> LossCDFs:
        """Second half of :meth:`loss_cdfs_directions`: :func:`mog_cdfs_at_points`."""
        return mog_cdfs_at_points(directions, z, *self.mixture(ops), ops)


#: Total mixture weight that may be pruned (see ``GroupSubsampledGaussian._components_needed``).
_PRUNE_TAIL = 1e-295


def _padded_components(group_size: int) -> int:
    """Pad ``k + 1`` components to a power of two (>= 2): few distinct compiled shapes."""
    return max(2, 1 << int(np.ceil(np.log2(group_size + 1))))
