"""Streaming correlated noise ``C^{-1} z`` for matrix-factorization training (DP-FTRL / DP-MF).

A matrix mechanism with lower-triangular ``C`` releases ``C x + z``; a training loop realises it
by adding, at step ``t``, the ``t``-th row of ``C^{-1} z`` to the sum of clipped gradients
(``z_t`` i.i.d. ``N(0, sigma^2 clip^2 I)`` of the model's shape).  This module generates that
row by row, as a pure optax-style state machine over pytrees of model shape::

    noise = blt_noise(C)                      # C: dpjax.matrices.BLT (the C you accounted)
    state = noise.init(params)                # zeros, leaves of shape (d,) + leaf.shape
    for t, (idx, mask) in enumerate(sampler):
        z = tree_normal(jax.random.fold_in(key, t), params, stddev=sigma * clip)
        y, state = noise.update(z, state)     # y_t = (C^{-1} z)_t, shape of params
        grad_sum = clipped_sum(params, idx, mask) + y
        params = params - lr * grad_sum / batch_size

``init`` / ``update`` are pure and jit-able (``update`` may sit inside the user's ``jit`` or
``lax.scan``); the state is a NamedTuple pytree.  Arithmetic runs in the dtype of ``z`` (use
float64 for the checks below; float32 in training is the user's choice, like the rest of their
model).  Each buffer decays for ``theta in (0, 1)``, but that does not make ``C^{-1}`` bounded:
its transfer function ``1 / c(x)`` (below) has a pole inside the unit disk when the output
scales are large, and then the noise grows exponentially with alternating sign and overflows,
in float32 first.  E.g. ``BLT(theta=[0.5], omega=[3.0])``: ``c(x) = 0`` at ``x = -0.4``, so
``(C^{-1})_{t,0} = (-2.5)^t`` (1, -3, 7.5, -18.75, ...) and float32 gives NaN after ~100
steps.  Before training with a BLT, check that the first column of ``C^{-1}`` (this
recurrence fed ``z = (1, 0, 0, ...)``) decays over the horizon.

BLT (buffered linear Toeplitz; Dvijotham, McMahan, Pillutla, Steinke & Thakurta, "Efficient and
near-optimal noise generation for streaming differential privacy", 2024; McMahan, Xu & Zhang, "A
hassle-free algorithm for private learning in practice: don't use tree aggregation, use BLTs", 2024):
``c_0 = 1``, ``c_k = sum_j omega_j theta_j^(k-1)`` for ``k >= 1`` (:class:`dpjax.matrices.BLT`).
Solving ``C y = z`` row by row,

    z_t = y_t + sum_{s<t} c_{t-s} y_s = y_t + sum_j omega_j S_j(t),
    S_j(t) = sum_{s<t} theta_j^(t-1-s) y_s,

so with ``d`` buffers ``S_j`` (each of model shape)

    y_t      = z_t - sum_j omega_j S_j(t),
    S_j(t+1) = theta_j S_j(t) + y_t,        S_j(0) = 0.

This is the inverse of the BLT as a ``d``-buffer recurrence: memory ``O(d x model size)``, work
``O(d x model size)`` per step, no dependence on ``n``.  (Its transfer function ``1 / c(x)`` with
``c(x) = 1 + x sum_j omega_j / (1 - theta_j x)`` is again rational of degree ``d``, i.e. ``C^{-1}``
is itself a BLT-like Toeplitz matrix; the recurrence evaluates it without factorising the
numerator.)

General lower-triangular Toeplitz (:class:`dpjax.matrices.Toeplitz`, ``k`` coefficients, banded
if ``k < n``): ``y_t = (z_t - sum_{s=1}^{k-1} c_s y_{t-s}) / c_0`` with a history of the last
``k - 1`` outputs: ``O(k x model size)`` memory and work per step.

Both match the dense ``solve_triangular(C, z)`` to ~1e-13 in float64 for ``n = 2048``
(tests/test_noise.py).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.matrices._structured import check_1d_nonnegative

__all__ = ["StreamingNoise", "BLTNoiseState", "ToeplitzNoiseState", "blt_noise", "toeplitz_noise",
           "streaming_noise", "tree_normal", "AggregateState", "correlated_noise_aggregate"]


class StreamingNoise(NamedTuple):
    """A pure noise generator: ``init(params) -> state``, ``update(z, state) -> (y, state)``."""

    init: Callable[[Any], Any]
    update: Callable[[Any, Any], tuple[Any, Any]]


class BLTNoiseState(NamedTuple):
    """``buffers``: pytree like the params, each leaf ``(d,) + leaf.shape``; ``step``: int32 scalar."""

    buffers: Any
    step: jax.Array


class ToeplitzNoiseState(NamedTuple):
    """``history``: leaves ``(k - 1,) + leaf.shape``, most recent output first; ``step``: int32 scalar."""

    history: Any
    step: jax.Array


def tree_normal(key, like, stddev=1.0):
    """I.i.d. ``N(0, stddev^2)`` pytree with the structure, shapes and dtypes of ``like``."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    keys = jax.random.split(key, len(leaves))
    out = [stddev * jax.random.normal(k, jnp.shape(x), jnp.result_type(x)) for k, x in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def blt_noise(blt) -> StreamingNoise:
    """Streaming ``C^{-1} z`` for a :class:`dpjax.matrices.BLT` ``C`` (``d`` buffers; module docstring).

    Args:
      blt: the BLT that was accounted (``buffer_decays`` theta ``(d,)``, ``output_scales`` omega ``(d,)``).

    Returns:
      :class:`StreamingNoise`; state :class:`BLTNoiseState`.

    Example::

        noise = blt_noise(BLT(jnp.array([0.9, 0.5]), jnp.array([0.3, 0.2])))
        state = noise.init({"w": jnp.zeros((3, 4))})
        y, state = noise.update({"w": z_t}, state)   # y["w"].shape == (3, 4)
    """
    theta = jnp.asarray(blt.buffer_decays)
    omega = jnp.asarray(blt.output_scales)
    if theta.ndim != 1 or theta.shape != omega.shape:
        raise ValueError(f"buffer_decays and output_scales must be 1-D of equal length, got {theta.shape}, {omega.shape}")
    d = theta.shape[0]

    def leaf(zl, s):
        th = theta.astype(s.dtype).reshape((d,) + (1,) * (s.ndim - 1))
        y = zl - jnp.tensordot(omega.astype(s.dtype), s, axes=1)
        return y, th * s + y[None]

    return _leafwise_noise(d, leaf, BLTNoiseState)


def toeplitz_noise(correlation) -> StreamingNoise:
    """Streaming ``C^{-1} z`` for lower-triangular Toeplitz ``C`` with first column ``coeffs`` (``(k,)``).

    Args:
      correlation: a :class:`dpjax.matrices.Toeplitz` or a 1-D array of the first column
        (``coeffs[0] > 0``; ``k`` coefficients: banded beyond ``k - 1``).

    Memory ``O((k - 1) x model size)`` (history of outputs); state :class:`ToeplitzNoiseState`.
    """
    coeffs = jnp.asarray(getattr(correlation, "coeffs", correlation))
    if coeffs.ndim != 1 or coeffs.shape[0] == 0:
        raise ValueError(f"correlation must be a Toeplitz or a non-empty 1-D first column, got shape {coeffs.shape}")
    if not isinstance(coeffs, jax.core.Tracer):
        # The checks dpjax.matrices.Toeplitz (hence the accountants) apply to the same C.
        check_1d_nonnegative("correlation", np.asarray(coeffs))
    if not isinstance(coeffs, jax.core.Tracer) and not float(np.asarray(coeffs)[0]) > 0:
        raise ValueError(f"the first coefficient (diagonal of C) must be > 0, got {float(np.asarray(coeffs)[0])!r}")
    k = coeffs.shape[0]

    def leaf(zl, h):
        c = coeffs.astype(h.dtype)
        y = (zl - jnp.tensordot(c[1:], h, axes=1)) / c[0]
        # Newest first; keep k - 1 rows (none for a diagonal C).
        return y, jnp.concatenate([y[None], h], axis=0)[: k - 1]

    return _leafwise_noise(k - 1, leaf, ToeplitzNoiseState)


def _leafwise_noise(rows: int, leaf, state_type) -> StreamingNoise:
    """The generator both streaming noises are: the state (``state_type``, a ``(buffer, step)``
    pair) keeps ``rows`` arrays of each parameter leaf's shape and dtype, and each update maps
    ``leaf(z_leaf, buffer_leaf) -> (y_leaf, new buffer_leaf)`` over the pytree."""

    def init(params):
        return state_type(
            jax.tree_util.tree_map(lambda p: jnp.zeros((rows,) + jnp.shape(p), jnp.result_type(p)), params),
            jnp.zeros((), jnp.int32))

    def update(z, state):
        pairs = jax.tree_util.tree_map(leaf, z, state[0])
        y = jax.tree_util.tree_map(lambda _, p: p[0], z, pairs)
        buffers = jax.tree_util.tree_map(lambda _, p: p[1], z, pairs)
        return y, state_type(buffers, state.step + 1)

    return StreamingNoise(init, update)


def streaming_noise(correlation) -> StreamingNoise:
    """Dispatch: :func:`blt_noise` for a BLT, :func:`toeplitz_noise` for a Toeplitz or a 1-D column."""
    if hasattr(correlation, "buffer_decays"):
        return blt_noise(correlation)
    return toeplitz_noise(correlation)


class AggregateState(NamedTuple):
    """State of :func:`correlated_noise_aggregate`: the noise generator's state, the PRNG key of
    the Gaussian draws and the step count (the row of ``C^{-1} z`` the next update adds)."""

    noise_state: Any
    key: jax.Array
    count: jax.Array


def _clipped_sum(per_example, clip_norm, mask):
    """Sum over the leading (example) axis of the per-example gradients, each scaled to L2 norm at
    most ``clip_norm`` over all leaves together; masked examples (padding) count as zero."""
    leaves = jax.tree_util.tree_leaves(per_example)
    sq = sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1) for g in leaves)
    norms = jnp.sqrt(sq)
    # Below this norm the gradient is not scaled (min(1, .) is 1): the floor only avoids 0 / 0.
    scale = jnp.minimum(1.0, clip_norm / jnp.maximum(norms, jnp.finfo(norms.dtype).tiny))
    if mask is not None:
        scale = jnp.where(mask, scale, 0.0)
    return jax.tree_util.tree_map(lambda g: jnp.tensordot(scale.astype(g.dtype), g, axes=1), per_example)


def correlated_noise_aggregate(noise: StreamingNoise, noise_multiplier, clip_norm, batch_size, key):
    """An optax transformation: clip each example's gradient, sum, add correlated noise, normalise.

    The matrix mechanism ``C x + z`` run in a training loop (Choquette-Choo, Ganesh, Haque,
    Steinke & Thakurta, "Near exact privacy amplification for matrix mechanisms"; Denisov,
    McMahan, Rush, Smith & Thakurta, "Improved differential privacy for SGD via optimal private
    linear operators on adaptive streams"): at step ``t`` the update is

        (sum_i clip(g_i) + (C^{-1} z)_t) / batch_size,    z_t ~ N(0, (noise_multiplier clip_norm)^2 I),

    with ``clip(g) = g min(1, clip_norm / |g|_2)`` (one norm over all leaves of an example), the
    rows of ``C^{-1} z`` from ``noise`` (:func:`streaming_noise` of the accounted ``C``) and
    ``z_t`` drawn from ``fold_in(key, t)``.  ``C = I`` (``toeplitz_noise([1.0])``) is DP-SGD.
    Dividing by the fixed ``batch_size``, not the number of real examples, keeps the
    normalisation data-independent (:mod:`dpjax.sampling`); like the optimiser steps after it,
    it is post-processing of the noisy sum the accountant analyses.

    ``update(per_example_grads, state, params=None, *, mask=None)``: ``per_example_grads`` has
    the model's structure with a leading axis of length ``batch_size`` (e.g. ``jax.vmap`` of
    ``jax.grad``); ``mask`` (``(batch_size,)`` bool, the sampler's) zeroes padded slots.  It is
    an ``optax.GradientTransformationExtraArgs``, so ``optax.chain(aggregate, optax.sgd(lr))``
    passes ``mask=`` through.  Arithmetic runs in the gradients' dtype.

    Args:
      noise: the streaming generator of ``C^{-1} z`` (:func:`blt_noise`, :func:`toeplitz_noise`).
      noise_multiplier: sigma, > 0 (the certified one for this ``C`` and sampler).
      clip_norm: > 0.
      batch_size: the sampler's fixed batch shape ``B``, an integer >= 1.
      key: a JAX PRNG key or an integer seed for the Gaussian draws.
    """
    import optax

    from dpjax._base import validate as _validate

    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    clip = float(_validate.positive("clip_norm", clip_norm))
    size = _validate.positive_int("batch_size", batch_size)
    if not (hasattr(noise, "init") and hasattr(noise, "update")):
        raise ValueError(f"noise must be a StreamingNoise (dpjax.noise.streaming_noise(C)), got {noise!r}")
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        key = jax.random.key(_validate.prng_seed("key", key))

    def init(params):
        return AggregateState(noise_state=noise.init(params), key=key, count=jnp.zeros((), jnp.int32))

    def update(updates, state, params=None, *, mask=None, **extra):
        del params, extra
        for leaf in jax.tree_util.tree_leaves(updates):
            if jnp.ndim(leaf) == 0 or leaf.shape[0] != size:
                raise ValueError(f"per-example gradients must have a leading axis of length batch_size = {size}, "
                                 f"got a leaf of shape {jnp.shape(leaf)}")
        summed = _clipped_sum(updates, clip, mask)
        z = tree_normal(jax.random.fold_in(state.key, state.count), summed, stddev=sigma * clip)
        correlated, noise_state = noise.update(z, state.noise_state)
        out = jax.tree_util.tree_map(lambda s, c: (s + c) / size, summed, correlated)
        return out, AggregateState(noise_state=noise_state, key=state.key, count=state.count + 1)

    return optax.GradientTransformationExtraArgs(init, update)
