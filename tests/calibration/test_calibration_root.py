"""Generic calibration machinery: fixed-length monotone bisection and the implicit adjoint.

Tested against problems with known answers: closed-form roots and the exact T-fold Gaussian
mechanism (docs/design.md §1), whose calibrated sigma scipy's brentq finds independently and whose
partials d delta/d sigma, d delta/d eps are closed form.
"""

from __future__ import annotations

import math

import jax
import mpmath
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import optimize, stats

from dpjax.calibration import (ImplicitAdjoint, SolverStatus, StopGradientAdjoint, bisect_monotone,
                               composed_gaussian_delta, gaussian_noise_multiplier,
                               gaussian_noise_multiplier_core, solve_monotone_root)


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _mp_log_gaussian_delta(eps, s):
    """log delta(eps; s) of one Gaussian mechanism in 40-digit arithmetic (no cancellation)."""
    eps, s = mpmath.mpf(eps), mpmath.mpf(s)
    with mpmath.workdps(40):
        delta = mpmath.ncdf(-eps * s + 0.5 / s) - mpmath.exp(eps) * mpmath.ncdf(-eps * s - 0.5 / s)
        return float(mpmath.log(delta))


# ---------------------------------------------------------------------------------------------
# bisect_monotone
# ---------------------------------------------------------------------------------------------

@given(c=st.floats(0.01, 100.0), decreasing=st.booleans(), log_scale=st.booleans())
def test_bisection_root_is_on_the_safe_side(c, decreasing, log_scale):
    # f(x) = x (increasing) or 1/x (decreasing); boundary of {f <= target} at x* = c.
    if decreasing:
        fn, target = (lambda x: 1.0 / x), 1.0 / c
    else:
        fn, target = (lambda x: x), c
    res = bisect_monotone(fn, target, (1e-3, 1e3), decreasing=decreasing, log_scale=log_scale)
    root = float(res.root)
    assert int(res.status) == SolverStatus.CONVERGED
    # Safe side: f(root) <= target exactly (the returned point is the one evaluated feasible).
    assert float(fn(res.root)) <= target
    # 64 halvings of [1e-3, 1e3] (linear width 1e3, log width 13.8) are below float64
    # resolution at c >= 0.01, so only a few ulps separate root from c.  (1/(1/c) != c in
    # floats, so containment of c in the bracket holds to an ulp, not exactly.)
    assert abs(root - c) <= 1e-13 * c
    assert float(res.lower) <= c * (1 + 1e-15) and c * (1 - 1e-15) <= float(res.upper)


def test_bisection_status_unreachable_and_met():
    # f = 1/x decreasing on [1, 10]: f in [0.1, 1].
    unreachable = bisect_monotone(lambda x: 1.0 / x, 0.01, (1.0, 10.0))
    assert int(unreachable.status) == SolverStatus.UNREACHABLE
    assert math.isnan(float(unreachable.root))  # never a clipped value
    met = bisect_monotone(lambda x: 1.0 / x, 2.0, (1.0, 10.0))
    assert int(met.status) == SolverStatus.MET_AT_BRACKET_END
    assert float(met.root) == 1.0  # the least favourable end, which is feasible


def test_bisection_nan_counts_as_infeasible():
    # f is NaN below 2: the boundary of the feasible set {f <= 0.5} is then x = 2.
    fn = lambda x: jnp.where(x < 2.0, jnp.nan, 0.0)
    res = bisect_monotone(fn, 0.5, (0.0, 4.0))
    assert int(res.status) == SolverStatus.CONVERGED
    assert 2.0 <= float(res.root) <= 2.0 + 1e-12


def test_fixed_iteration_count_compiles_once():
    traces = []

    @jax.jit
    def calibrate(eps, delta, steps):
        traces.append(1)
        return jax.vmap(lambda e, d, t: gaussian_noise_multiplier_core(e, d, t).root)(eps, delta, steps)

    for k in range(3):
        eps = jnp.linspace(0.5 + k, 4.0 + k, 8)
        calibrate(eps, jnp.full(8, 10.0 ** (-5 - k)), jnp.full(8, 10.0 * (k + 1)))
    assert len(traces) == 1


# ---------------------------------------------------------------------------------------------
# Gaussian oracle calibration
# ---------------------------------------------------------------------------------------------

@given(eps=st.floats(0.05, 20.0), log10_delta=st.floats(-12.0, -2.0), steps=st.integers(1, 10_000))
def test_gaussian_calibration_matches_brentq_and_meets_target(eps, log10_delta, steps):
    delta = 10.0 ** log10_delta
    sigma = gaussian_noise_multiplier(eps, delta, steps)
    # Independent root in s = sigma/sqrt(T): scipy brentq on mpmath values (xtol far below
    # the 1e-9 checked).
    s_ref = optimize.brentq(lambda s: _mp_log_gaussian_delta(eps, s) - math.log(delta),
                            1e-2, 1e3, xtol=1e-15, rtol=1e-15)
    sigma_ref = s_ref * math.sqrt(steps)
    # 1e-9 relative: jax's float64 log-delta differs from the 40-digit one by ~1e-14 relative
    # (log_ndtr rounding), which moves the root by <~1e-11 relative since
    # |d log delta / d log sigma| >~ 1e-3 on this range.
    assert sigma == pytest.approx(sigma_ref, rel=1e-9)
    # Meets the target: the bisection proves log delta(root) <= log target in its own (jitted)
    # evaluation; re-evaluating delta outside jit may round differently.  The float64 formula
    # loses ~|log Phi(a)| ulps in eps + log Phi(b) - log Phi(a) (~1e-12 relative at delta=1e-12,
    # small eps), hence the 1e-10 slack.
    assert float(composed_gaussian_delta(eps, sigma, steps)) <= delta * (1 + 1e-10)


def test_gaussian_calibration_reproduces_pinned_family_a(reference_cases):
    # Family A gives eps(sigma, T, delta) exactly (mpmath); calibrating at that eps must give
    # back sigma.  Tolerance 1e-9 relative: the pinned eps is exact to float64, and
    # |d log sigma / d log eps| is O(1) for these cases.
    for cid in ("A1", "A2", "A3", "A4", "A5", "A6", "A7"):
        case = reference_cases[cid]
        p = case["params"]
        sigma = gaussian_noise_multiplier(case["value"], p["delta"], p["steps"])
        assert sigma == pytest.approx(p["noise_multiplier"], rel=1e-9), cid


def test_gaussian_calibration_vectorized_and_bad_input():
    eps = np.array([[0.5, 1.0], [2.0, 4.0]])
    out = gaussian_noise_multiplier(eps, 1e-5, 100)
    assert out.shape == (2, 2)
    for e, s in zip(eps.ravel(), out.ravel()):
        assert s == pytest.approx(gaussian_noise_multiplier(float(e), 1e-5, 100), rel=1e-14)
    with pytest.raises(ValueError, match="target_delta"):
        gaussian_noise_multiplier(1.0, 1.5, 10)
    with pytest.raises(ValueError, match="target_epsilon"):
        gaussian_noise_multiplier(float("nan"), 1e-5, 10)
    with pytest.raises(ValueError, match="steps"):
        gaussian_noise_multiplier(1.0, 1e-5, 2.5)
    with pytest.raises(ValueError, match="search range"):
        gaussian_noise_multiplier(1e-9, 1e-12, 10)


# ---------------------------------------------------------------------------------------------
# Implicit adjoint
# ---------------------------------------------------------------------------------------------

def _closed_form_dsigma_deps(eps, sigma, steps):
    """d sigma*/d eps = -(d delta/d eps)/(d delta/d sigma), both partials closed form."""
    s = sigma / math.sqrt(steps)
    a, b = -eps * s + 0.5 / s, -eps * s - 0.5 / s
    d_delta_d_eps = -math.exp(eps) * stats.norm.cdf(b)
    d_delta_d_sigma = -stats.norm.pdf(a) / (s * s * math.sqrt(steps))
    return -d_delta_d_eps / d_delta_d_sigma, 1.0 / d_delta_d_sigma


@pytest.mark.slow
@pytest.mark.parametrize("eps,delta,steps", [(0.5, 1e-5, 16), (2.0, 1e-8, 1000), (8.0, 1e-3, 1)])
def test_implicit_gradient_matches_closed_form_and_finite_differences(eps, delta, steps):
    f = lambda e, d, t: gaussian_noise_multiplier_core(e, d, t).root
    sigma = float(f(eps, delta, float(steps)))
    g_eps, g_delta, g_steps = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(eps, delta, float(steps))
    want_eps, want_delta = _closed_form_dsigma_deps(eps, sigma, steps)
    # Closed form vs implicit autodiff: both exact up to float64 rounding of a ratio of
    # O(1)-conditioned terms -> 1e-8 relative is generous.
    assert float(g_eps) == pytest.approx(want_eps, rel=1e-8)
    assert float(g_delta) == pytest.approx(want_delta, rel=1e-8)
    # sigma* is exactly proportional to sqrt(T): d sigma/dT = sigma / (2T).
    assert float(g_steps) == pytest.approx(sigma / (2 * steps), rel=1e-8)
    # Central finite differences (h = 1e-5 relative; truncation error O(h^2) ~ 1e-10, and the
    # root itself is resolved to ~1e-15, so FD is good to ~1e-8): 1e-6 relative.
    h = 1e-5 * eps
    fd = (float(f(eps + h, delta, float(steps))) - float(f(eps - h, delta, float(steps)))) / (2 * h)
    assert float(g_eps) == pytest.approx(fd, rel=1e-6)


def test_implicit_gradient_under_vmap_and_jit():
    f = lambda e: gaussian_noise_multiplier_core(e, 1e-6, 100.0).root
    eps = jnp.array([0.3, 1.0, 3.0, 9.0])
    batched = jax.jit(jax.vmap(jax.grad(f)))(eps)
    one_by_one = [float(jax.grad(f)(e)) for e in eps]
    np.testing.assert_allclose(np.asarray(batched), one_by_one, rtol=1e-12)
    # and a grad of a sum over a vmapped calibration (the optimisation-loop shape)
    total = jax.grad(lambda e: jnp.sum(jax.vmap(f)(e)))(eps)
    np.testing.assert_allclose(np.asarray(total), one_by_one, rtol=1e-12)


def test_implicit_gradient_of_closed_over_tracer():
    # Root of theta*x^2 + c = 4 (increasing in x): x* = sqrt((4 - c)/theta).
    def root(theta, c):
        fn = lambda x, th: th * x ** 2 + c   # c is closed over (a tracer under grad)
        return solve_monotone_root(fn, theta, 4.0, (0.1, 10.0), decreasing=False).root

    theta, c = 2.0, 1.0
    x = math.sqrt((4 - c) / theta)
    g_theta, g_c = jax.jit(jax.grad(root, argnums=(0, 1)))(theta, c)
    assert float(root(theta, c)) == pytest.approx(x, rel=1e-14)
    assert float(g_theta) == pytest.approx(-x / (2 * theta), rel=1e-10)
    assert float(g_c) == pytest.approx(-1.0 / (2 * theta * x), rel=1e-10)


def test_pytree_theta_and_target_gradient():
    # f(x; (a, b)) = a * x + b, increasing; x* = (target - b) / a.
    fn = lambda x, th: th["a"] * x + th["b"]
    root = lambda th, target: solve_monotone_root(fn, th, target, (-100.0, 100.0),
                                                   decreasing=False).root
    th = {"a": jnp.asarray(2.0), "b": jnp.asarray(1.0)}
    g_th, g_target = jax.grad(root, argnums=(0, 1))(th, 5.0)
    assert float(g_th["a"]) == pytest.approx(-(5.0 - 1.0) / 4.0, rel=1e-10)
    assert float(g_th["b"]) == pytest.approx(-0.5, rel=1e-10)
    assert float(g_target) == pytest.approx(0.5, rel=1e-10)


def test_stop_gradient_adjoint_gives_same_value_and_zero_gradient():
    f_imp = lambda e: gaussian_noise_multiplier_core(e, 1e-5, 10.0, adjoint=ImplicitAdjoint()).root
    f_stop = lambda e: gaussian_noise_multiplier_core(e, 1e-5, 10.0, adjoint=StopGradientAdjoint()).root
    assert float(f_imp(1.0)) == float(f_stop(1.0))
    assert float(jax.grad(f_stop)(1.0)) == 0.0
    assert float(jax.grad(f_imp)(1.0)) < 0.0
