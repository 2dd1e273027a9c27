"""Host numerics keep subnormal doubles where the calling thread flushes them, and float64 answers
handed to float32 code are rounded to their safe side.

XLA:CPU runs a ``jax.pure_callback`` on a thread with flush-to-zero and denormals-are-zero set;
threads started there inherit both.  Every check below fails where the arithmetic flushes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax._base import x64 as _x64

SMALLEST = float(np.nextafter(0.0, 1.0))

pytestmark = pytest.mark.skipif(not _x64.can_switch(), reason="no fegetenv/fesetenv on this platform")


def _in_callback(fn):
    """``fn()`` run inside a ``jax.pure_callback`` (on XLA's thread); its float64 result back."""
    out = []

    def host(x):
        out.append(fn())
        return x

    jax.block_until_ready(jax.jit(lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), x))(1.0))
    return out[0]


def test_the_scope_keeps_subnormals_in_a_flushing_thread_and_restores_it():
    def probe():
        before = _x64.flushes_subnormals()
        with _x64.ieee_arithmetic():
            inside = _x64.flushes_subnormals()
        return before, inside, _x64.flushes_subnormals()

    # The callback's thread flushes (the premise), the scope does not, and the caller's mode is back.
    assert _in_callback(probe) == (True, False, True)
    assert probe() == (False, False, False)


def test_a_tiny_certified_delta_survives_a_callers_callback():
    # A user's own host callback calling dpjax eagerly: one step at mu = 1, eps = 50 has delta
    # ~1e-543, reported as the smallest positive double, never 0.
    assert _in_callback(lambda: dpjax.dpsgd_delta(1.0, 1.0, 1, 50.0)) == SMALLEST
    assert _in_callback(lambda: list(dpjax.dpsgd_delta(np.array([1.0, 2.0]), 0.5, 4, np.array([100.0, 300.0])))) \
        == [SMALLEST, SMALLEST]


def test_worker_threads_started_from_a_callback_do_not_flush():
    # A fresh batch pool whose threads start inside the callback of a traced call (they inherit
    # its floating-point environment), then an eager batch on those threads.
    _fresh_pools()
    traced = jax.vmap(lambda s: dpjax.dpsgd_delta(s, 0.5, 4, 100.0))(jnp.array([1.0, 2.0]))
    assert np.all(np.asarray(traced) > 0)  # float32 answers: the smallest positive float32
    np.testing.assert_array_equal(dpjax.dpsgd_delta(np.array([1.0, 2.0]), 0.5, 4, np.array([100.0, 300.0])),
                                  [SMALLEST, SMALLEST])


def _fresh_pools():
    """Shut dpjax's worker pools down so that the next use starts new threads."""
    from dpjax.pld.grid import batched, program

    batched._workers().shutdown(wait=True)
    batched._workers.cache_clear()
    for pool in program._DIRECTION_POOL:
        pool.shutdown(wait=True)
    program._DIRECTION_POOL.clear()


# --------------------------------------------------------------------------- float32 hand-off


def test_directed_rounding_to_float32_is_on_its_side_within_one_ulp_with_the_float64_derivative():
    rng = np.random.default_rng(0)
    positive = np.concatenate([10.0 ** rng.uniform(-44, 38, 2000), [SMALLEST, 1e-300, 3.5e38, np.inf]])
    values = np.concatenate([[0.0], -positive, positive])
    with jax.enable_x64(True):
        x = jnp.asarray(values)
        near = np.asarray(x.astype(jnp.float32), np.float64)
        up = np.asarray(_x64._to_float32(x, "up"), np.float64)
        down = np.asarray(_x64._to_float32(x, "down"), np.float64)
        grad = jax.grad(lambda v: _x64._to_float32(v * v, "up"))(jnp.float64(1.5))
    assert np.all(up >= values) and np.all(down <= values)
    assert (down < near).sum() + (up > near).sum() > 1000  # the nearest float32 is often on the wrong side
    f32 = lambda a: np.asarray(a, np.float32)
    # One float32 step from the nearest, except below float32's smallest normal, where XLA
    # flushes: up gives that normal, down gives 0.
    tiny = float(np.finfo(np.float32).tiny)
    low = (np.abs(values) < tiny) & (values != 0)
    assert low.sum() > 100
    assert np.all(up[low] == np.where(values[low] > 0, tiny, 0.0))
    assert np.all(down[low] == np.where(values[low] > 0, 0.0, -tiny))
    assert np.all(((up == near) | (f32(up) == np.nextafter(f32(near), np.float32(np.inf))))[~low])
    assert np.all(((down == near) | (f32(down) == np.nextafter(f32(near), np.float32(-np.inf))))[~low])
    assert np.isinf(up[-2]) and down[-2] == np.finfo(np.float32).max  # 3.5e38 > float32 max
    assert up[0] == down[0] == 0.0
    assert float(grad) == 3.0


def test_traced_upper_bounds_in_float32_are_at_least_the_float64_answer():
    # Under vmap from float32 code the answer comes back in float32: never below the eager
    # float64 answer at the same (float32) inputs.  DP-SGD's epsilon (host callback), its noise
    # multiplier, and the Gaussian closed form's epsilon (a JAX function).
    from dpjax.numerics import exact

    sigmas = jnp.linspace(0.8, 3.0, 24, dtype=jnp.float32)
    s64 = np.asarray(sigmas, np.float64)
    traced = np.asarray(jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))(sigmas), np.float64)
    assert np.all(traced >= dpjax.dpsgd_epsilon(s64, 0.01, 1000, 1e-5))
    eps = jnp.asarray([0.5, 1.0, 2.0, 4.0], jnp.float32)
    traced = np.asarray(jax.vmap(lambda e: dpjax.dpsgd_noise_multiplier(0.01, 1000, e, 1e-5))(eps), np.float64)
    assert np.all(traced >= dpjax.dpsgd_noise_multiplier(0.01, 1000, np.asarray(eps, np.float64), 1e-5))
    mus = jnp.linspace(0.5, 3.0, 64, dtype=jnp.float32)
    traced = np.asarray(jax.vmap(lambda m: exact.gaussian_epsilon(1e-5, m))(mus), np.float64)
    assert np.all(traced >= np.asarray(exact.gaussian_epsilon(1e-5, np.asarray(mus, np.float64))))


def test_dpjax_worker_pools_started_from_a_flushing_thread_do_not_flush():
    # The pools' initializer: their threads may be started from any thread, a callback's included.
    from dpjax.pld.grid import batched, program

    def start_pools():
        _fresh_pools()
        return (_x64.flushes_subnormals(), batched._workers().submit(_x64.flushes_subnormals).result(),
                program._direction_pool().submit(_x64.flushes_subnormals).result())

    assert _in_callback(start_pools) == (True, False, False)


def test_traced_records_round_each_field_to_its_side():
    # A calibration's Solution (the root and the bracket's upper end up, the lower end down),
    # under vmap from float32 code, against the same call with x64 on at the same inputs.
    from dpjax.calibration import gaussian as cg

    eps = jnp.linspace(0.5, 4.0, 16, dtype=jnp.float32)
    solve = jax.vmap(lambda e: cg.gaussian_noise_multiplier_core(e, 1e-5, 100))
    sol = solve(eps)
    with jax.enable_x64(True):
        sol64 = solve(jnp.asarray(np.asarray(eps), jnp.float64))
    f64 = lambda a: np.asarray(a, np.float64)
    assert sol.root.dtype == jnp.float32
    assert np.all(f64(sol.root) >= f64(sol64.root)) and np.all(f64(sol.upper) >= f64(sol64.upper))
    assert np.all(f64(sol.lower) <= f64(sol64.lower))
    assert np.any(f64(sol.root) > f64(sol64.root)) and np.any(f64(sol.lower) < f64(sol64.lower))


def test_an_epsilon_reports_fields_round_to_their_sides():
    # The fixed grid's epsilon rounding on a real EpsilonReport (its field names), built from a
    # cheap function: the epsilon up, its lower estimate down, the rest to nearest.
    from dpjax.pld.grid.fixed_grid import EpsilonReport, epsilon_rounding

    @_x64.float64(rounding=epsilon_rounding)
    def report(x, *, with_report=False):
        v = jnp.asarray(x, jnp.float64) / 3.0
        return EpsilonReport(*([v] * len(EpsilonReport._fields)))

    x = jnp.linspace(1.0, 2.0, 64, dtype=jnp.float32)
    rep = jax.vmap(lambda v: report(v, with_report=True))(x)
    exact = np.asarray(x, np.float64) / 3.0
    f64 = lambda a: np.asarray(a, np.float64)
    assert np.all(f64(rep.epsilon) >= exact) and np.all(f64(rep.epsilon_lower_estimate) <= exact)
    assert np.any(f64(rep.epsilon) != f64(rep.excess))  # the other fields: nearest
    np.testing.assert_array_equal(f64(rep.excess), exact.astype(np.float32))
