"""The headline functions under ``jax.grad``, ``jax.vmap`` and ``jax.jit``, from float32 code.

``dpjax.dpsgd_epsilon``, ``dpjax.dpsgd_delta``, ``dpjax.dpsgd_noise_multiplier`` and the group
accountant plan their grid on the host; traced, they run through a host callback with
derivatives on the accountant's grid (``dpjax._base.traced``, ``dpjax.pld.grid.batched``).  The suite runs
with x64 off, as users do.

Tolerances:

* gradients against central finite differences of the eager (float64) calls: 1e-4 relative.
  The gradient is computed in float64 and rounded once to float32 (1.2e-7); the difference
  that remains is the derivative of the accountant's plan, which moves with its arguments
  (``dpjax.pld.grid.batched``: ~1e-5 relative at these configurations), and the finite
  difference's own truncation (step 1e-3 relative: ~1e-6 of the curvature terms);
* a vmapped batch against the single eager calls: 1e-9 relative in float64 (the batch program
  is the accountant's program inside a loop; bit-identical in our runs), and the float32
  rounding of those values (one float32 ulp, 1.2e-7) from float32 code;
* jit: the float32 rounding of the eager value.

The default tier runs the example-level cases; the 64-sigma batch and the group variants
(several more XLA programs each) run in the slow tier (``-m slow``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dpjax
from dpjax import group

Q, T, DELTA = 0.01, 1000, 1e-5
F32 = 2.0 ** -23


def _fd(f, x, rel=1e-3):
    h = rel * x
    return (f(x + h) - f(x - h)) / (2 * h)


def test_suite_runs_in_float32():
    assert not jax.config.jax_enable_x64


def test_grad_epsilon_in_sigma_matches_finite_differences():
    f = lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA)
    g = jax.grad(f)(1.0)
    assert g.dtype == jnp.float32
    assert float(g) == pytest.approx(_fd(f, 1.0), rel=1e-4)


def test_grad_epsilon_in_sampling_prob_and_delta():
    g_q = jax.grad(lambda q: dpjax.dpsgd_epsilon(1.0, q, T, DELTA))(Q)
    assert float(g_q) == pytest.approx(_fd(lambda q: dpjax.dpsgd_epsilon(1.0, q, T, DELTA), Q), rel=1e-4)
    g_d = jax.grad(lambda d: dpjax.dpsgd_epsilon(1.0, Q, T, d))(DELTA)
    assert float(g_d) == pytest.approx(_fd(lambda d: dpjax.dpsgd_epsilon(1.0, Q, T, d), DELTA), rel=1e-4)


def test_grad_delta_matches_finite_differences():
    # delta falls steeply (and curves) in sigma and epsilon: a step of 1e-4 relative keeps the
    # finite difference's truncation (h^2 f3 / 6 f1) below 2e-6; at 1e-3 it is ~1.5e-4.
    f_s = lambda s: dpjax.dpsgd_delta(s, Q, T, 2.0)
    assert float(jax.grad(f_s)(1.0)) == pytest.approx(_fd(f_s, 1.0, rel=1e-4), rel=1e-4)
    f_e = lambda e: dpjax.dpsgd_delta(1.0, Q, T, e)
    assert float(jax.grad(f_e)(2.0)) == pytest.approx(_fd(f_e, 2.0, rel=1e-4), rel=1e-4)


def test_grad_noise_multiplier_in_epsilon_and_delta_matches_finite_differences():
    f_e = lambda e: dpjax.dpsgd_noise_multiplier(Q, T, e, DELTA)
    g_e = jax.grad(f_e)(2.0)
    assert g_e.dtype == jnp.float32
    assert float(g_e) == pytest.approx(_fd(f_e, 2.0), rel=1e-4)
    f_d = lambda d: dpjax.dpsgd_noise_multiplier(Q, T, 2.0, d)
    assert float(jax.grad(f_d)(DELTA)) == pytest.approx(_fd(f_d, DELTA), rel=1e-4)


def test_calibrated_sigma_is_the_crossing_to_1e8():
    """The polished calibration: the returned sigma meets the target and 1e-8 less does not."""
    s = dpjax.dpsgd_noise_multiplier(Q, T, 2.0, DELTA)
    assert dpjax.dpsgd_epsilon(s, Q, T, DELTA) <= 2.0 < dpjax.dpsgd_epsilon(s * (1 - 1e-8), Q, T, DELTA)


SIGMAS = np.linspace(0.9, 1.2, 64)


@pytest.fixture(scope="module")
def eager_64():
    return np.array([dpjax.dpsgd_epsilon(float(s), Q, T, DELTA) for s in SIGMAS])


@pytest.mark.slow
def test_vmap_64_sigmas_equals_64_eager_calls(eager_64):
    with jax.enable_x64(True):
        v = jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA))(jnp.asarray(SIGMAS))
    assert v.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(v), eager_64, rtol=1e-9, atol=0)
    # The eager batch (an array of noise multipliers) is the same computation.
    np.testing.assert_allclose(dpjax.dpsgd_epsilon(SIGMAS, Q, T, DELTA), eager_64, rtol=1e-9, atol=0)


def test_vmap_from_float32_code(eager_64):
    s32 = np.float32(SIGMAS[:8])
    v = jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA))(jnp.asarray(s32))
    assert v.dtype == jnp.float32
    ref = np.array([dpjax.dpsgd_epsilon(float(s), Q, T, DELTA) for s in s32])
    np.testing.assert_allclose(np.asarray(v, np.float64), ref, rtol=F32, atol=0)


def test_jit_from_float32_code():
    f = jax.jit(lambda s, d: dpjax.dpsgd_epsilon(s, Q, T, d))
    v = f(1.0, DELTA)
    assert v.dtype == jnp.float32
    ref = dpjax.dpsgd_epsilon(1.0, Q, T, float(np.float32(DELTA)))
    assert float(v) == pytest.approx(ref, rel=F32)
    # jit of a gradient, and vmap of a gradient
    g = jax.jit(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA)))(1.0)
    assert float(g) == pytest.approx(float(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA))(1.0)), rel=F32)
    gs = jax.vmap(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, Q, T, DELTA)))(jnp.asarray([1.0, 1.1]))
    assert float(gs[0]) == pytest.approx(float(g), rel=F32)


@pytest.mark.slow
def test_noise_multiplier_under_jit_and_vmap():
    f = lambda e: dpjax.dpsgd_noise_multiplier(Q, T, e, DELTA)
    ref = [dpjax.dpsgd_noise_multiplier(Q, T, e, DELTA) for e in (2.0, 4.0)]
    assert float(jax.jit(f)(2.0)) == pytest.approx(ref[0], rel=F32)
    v = jax.vmap(f)(jnp.asarray([2.0, 4.0]))
    np.testing.assert_allclose(np.asarray(v, np.float64), ref, rtol=F32)
    # the eager array call is the same lockstep search on the same curve
    np.testing.assert_allclose(dpjax.dpsgd_noise_multiplier(Q, T, np.array([2.0, 4.0]), DELTA), ref, rtol=1e-12)


# Group variants (mixture-of-Gaussians accountant): a short run keeps the compiles small.
GK = dict(group_size=2)
GT = 200


@pytest.mark.slow
def test_group_epsilon_grad_vmap_jit():
    f = lambda s: dpjax.group_epsilon(s, Q, GT, DELTA, **GK)
    g = jax.grad(f)(1.0)
    assert float(g) == pytest.approx(_fd(f, 1.0), rel=1e-4)
    sig = np.array([0.9, 1.0, 1.1])
    eager = np.array([f(float(s)) for s in sig])
    with jax.enable_x64(True):
        v = jax.vmap(f)(jnp.asarray(sig))
    np.testing.assert_allclose(np.asarray(v), eager, rtol=1e-9, atol=0)
    assert float(jax.jit(f)(1.0)) == pytest.approx(eager[1], rel=F32)
    # dpjax.dpsgd_epsilon with group arguments is the same function
    assert float(jax.jit(lambda s: dpjax.dpsgd_epsilon(s, Q, GT, DELTA, **GK))(1.0)) == pytest.approx(eager[1],
                                                                                                       rel=F32)


@pytest.mark.slow
def test_group_delta_and_noise_multiplier_grad():
    # A delta query's grid is planned from epsilon and re-planned with sigma; on this short
    # mixture composition the plan's motion moves the eager finite difference by ~6e-4 (the
    # gradient itself is the fixed grid's: see dpjax.pld.grid.batched), hence 2e-3 here.
    f = lambda s: group.group_delta(s, Q, GT, 2.0, **GK)
    assert float(jax.grad(f)(1.0)) == pytest.approx(_fd(f, 1.0, rel=1e-4), rel=2e-3)
    c = lambda e: dpjax.dpsgd_noise_multiplier(Q, GT, e, DELTA, **GK)
    assert float(jax.grad(c)(2.0)) == pytest.approx(_fd(c, 2.0), rel=1e-4)


# ------------------------------------------------------------------ batches, schedules, names
def test_array_of_sigmas_is_a_batch_and_a_schedule_needs_its_keyword():
    sig = np.array([0.8, 1.0, 1.2])
    out = dpjax.dpsgd_epsilon(sig, Q, 3, DELTA)
    assert out.shape == (3,)
    np.testing.assert_allclose(out, [dpjax.dpsgd_epsilon(float(s), Q, 3, DELTA) for s in sig], rtol=1e-9)
    sched = dpjax.dpsgd_epsilon(noise_schedule=sig, sampling_prob=Q, target_delta=DELTA)
    assert sched == dpjax.pld.dpsgd_accounting(None, Q, 3, target_delta=DELTA, noise_schedule=sig,
                                               with_lower=False).epsilon
    assert out[0] > sched > out[2]  # the schedule mixes the three
    with pytest.raises(ValueError, match="noise_schedule"):
        dpjax.pld.dpsgd_accounting(sig, Q, 3, target_delta=DELTA)
    with pytest.raises(ValueError, match="not both"):
        dpjax.dpsgd_epsilon(1.0, Q, 3, DELTA, noise_schedule=sig)


def test_opacus_aliases_give_the_same_numbers():
    base = dpjax.dpsgd_epsilon(1.0, Q, T, DELTA)
    assert dpjax.dpsgd_epsilon(1.0, sample_rate=Q, steps=T, target_delta=DELTA) == base
    assert dpjax.dpsgd_epsilon(1.0, sample_rate=Q, epochs=10, target_delta=DELTA) == base   # T = int(10 / 0.01)
    assert dpjax.dpsgd_delta(1.0, sample_rate=Q, steps=T, target_epsilon=2.0) == dpjax.dpsgd_delta(1.0, Q, T, 2.0)
    with pytest.raises(ValueError, match="not both"):
        dpjax.dpsgd_epsilon(1.0, Q, T, DELTA, sample_rate=Q)
    with pytest.raises(ValueError, match="steps or epochs"):
        dpjax.dpsgd_epsilon(1.0, Q, T, DELTA, epochs=10)


def test_noise_multiplier_old_argument_order_is_refused_saying_why():
    with pytest.raises(ValueError, match=r"\(sampling_prob, steps, target_epsilon, target_delta\)"):
        dpjax.dpsgd_noise_multiplier(2.0, 1e-5, 0.01, 1000)
