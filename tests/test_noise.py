"""dpjax.noise: streaming C^{-1} z equals the dense solve."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from dpjax.matrices import BLT, Toeplitz
from dpjax.noise import blt_noise, streaming_noise, toeplitz_noise, tree_normal

N = 2048


def _stream(noise, z):
    """Run the state machine over z of shape (n, ...) with lax.scan (one jit)."""
    def body(state, zt):
        y, state = noise.update(zt, state)
        return state, y

    state = noise.init(z[0])
    state, ys = jax.jit(lambda s, z: jax.lax.scan(body, s, z))(state, z)
    return ys, state


def _dense_solve(column, z):
    c = scipy.linalg.toeplitz(column, np.zeros_like(column))
    return scipy.linalg.solve_triangular(c, z, lower=True)


@pytest.mark.parametrize("theta,omega", [([0.99, 0.9, 0.5], [0.05, 0.1, 0.2]), ([0.999], [0.3])])
def test_blt_stream_equals_dense_n2048(theta, omega):
    with jax.enable_x64(True):
        c = BLT(jnp.array(theta), jnp.array(omega))
        z = np.random.default_rng(0).standard_normal((N, 3))
        ys, state = _stream(blt_noise(c), jnp.asarray(z))
        ref = _dense_solve(np.asarray(c.column(N)), z)
        err = np.max(np.abs(np.asarray(ys) - ref))
        assert err < 1e-10 * max(1.0, np.max(np.abs(ref))), err
        assert int(state.step) == N and state.buffers.shape == (len(theta), 3)
        # Also equal to the structured inverse column applied as a Toeplitz product.
        inv = np.asarray(c.inverse_column(N))
        np.testing.assert_allclose(np.asarray(ys)[:, 0], np.convolve(inv, z[:, 0])[:N], atol=1e-10)


def test_toeplitz_stream_equals_dense_n2048_full_and_banded():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        z = rng.standard_normal((N,))
        full = 1.0 / np.sqrt(np.arange(1, N + 1))  # slowly decaying, not banded
        for column in (full, np.array([1.0, 0.6, 0.3, 0.1]), np.array([2.0])):
            ys, _ = _stream(toeplitz_noise(Toeplitz(jnp.asarray(column))), jnp.asarray(z))
            ref = _dense_solve(np.pad(column, (0, N - column.size)), z)
            err = np.max(np.abs(np.asarray(ys) - ref))
            assert err < 1e-10 * max(1.0, np.max(np.abs(ref))), err


def test_pytree_and_float32():
    c = BLT(jnp.array([0.9, 0.5]), jnp.array([0.3, 0.2]))
    params = {"w": jnp.zeros((3, 4), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}
    noise = streaming_noise(c)
    state = noise.init(params)
    assert state.buffers["w"].shape == (2, 3, 4) and state.buffers["w"].dtype == jnp.float32
    key = jax.random.PRNGKey(0)
    ys = []
    upd = jax.jit(noise.update)
    zs = [tree_normal(jax.random.fold_in(key, t), params) for t in range(20)]
    for z in zs:
        y, state = upd(z, state)
        ys.append(y)
    # Leaf by leaf equal to the dense solve (float32 round-off).
    col = np.asarray(c.column(20))
    zb = np.stack([np.asarray(z["b"], np.float64) for z in zs])
    ref = _dense_solve(col, zb)
    np.testing.assert_allclose(np.stack([np.asarray(y["b"]) for y in ys]), ref, rtol=1e-5, atol=1e-5)
    assert ys[0]["w"].dtype == jnp.float32


def test_bad_input():
    with pytest.raises(ValueError, match="first coefficient"):
        toeplitz_noise(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        toeplitz_noise(np.ones((2, 2)))


def test_aggregate_clips_sums_adds_the_correlated_noise_and_normalises():
    """correlated_noise_aggregate over 12 steps equals the computation written out: each example
    scaled to norm <= clip over all leaves, padding zeroed, summed, plus row t of C^{-1} z with
    z_t = tree_normal(fold_in(key, t), sigma * clip), divided by the fixed batch size."""
    import optax

    from dpjax.noise import correlated_noise_aggregate

    with jax.enable_x64(True):
        c = BLT(jnp.array([0.9, 0.5]), jnp.array([0.3, 0.2]))
        sigma, clip, bsize, steps = 1.7, 0.5, 5, 12
        key = jax.random.key(3)
        params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        tx = correlated_noise_aggregate(blt_noise(c), sigma, clip, bsize, key)
        assert isinstance(tx, optax.GradientTransformationExtraArgs)
        state = tx.init(params)
        update = jax.jit(tx.update)
        rng = np.random.default_rng(1)
        grads = [{"w": rng.standard_normal((bsize, 3, 2)) * rng.uniform(0.01, 3.0, (bsize, 1, 1)),
                  "b": rng.standard_normal((bsize, 2))} for _ in range(steps)]
        masks = [rng.uniform(size=bsize) < 0.7 for _ in range(steps)]
        got = []
        for g, m in zip(grads, masks):
            out, state = update(jax.tree_util.tree_map(jnp.asarray, g), state, mask=jnp.asarray(m))
            got.append(np.concatenate([np.ravel(out["b"]), np.ravel(out["w"])]))
        assert int(state.count) == steps
        # Written out: the flattened leaves in tree order ("b" before "w").
        z = np.stack([np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(
            tree_normal(jax.random.fold_in(key, t), params, stddev=sigma * clip))]) for t in range(steps)])
        correlated = _dense_solve(np.asarray(c.column(steps)), z)
        for t, (g, m) in enumerate(zip(grads, masks)):
            flat = np.concatenate([g["b"].reshape(bsize, -1), g["w"].reshape(bsize, -1)], axis=1)
            norms = np.linalg.norm(flat, axis=1)
            clipped = flat * (np.minimum(1.0, clip / norms) * m)[:, None]
            assert np.all(np.linalg.norm(clipped, axis=1) <= clip * (1 + 1e-12))
            want = (clipped.sum(axis=0) + correlated[t]) / bsize
            np.testing.assert_allclose(got[t], want, rtol=1e-10, atol=1e-12)


def test_aggregate_bad_input_names_the_argument():
    from dpjax.noise import correlated_noise_aggregate

    noise = toeplitz_noise(jnp.array([1.0]))
    for kwargs, name in [(dict(noise_multiplier=0.0), "noise_multiplier"), (dict(clip_norm=-1.0), "clip_norm"),
                         (dict(batch_size=0), "batch_size")]:
        args = dict(noise=noise, noise_multiplier=1.0, clip_norm=1.0, batch_size=4, key=0) | kwargs
        with pytest.raises(ValueError, match=name):
            correlated_noise_aggregate(**args)
    tx = correlated_noise_aggregate(noise, 1.0, 1.0, 4, 0)
    state = tx.init({"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="leading axis of length batch_size = 4"):
        tx.update({"w": jnp.ones((3, 3))}, state)
