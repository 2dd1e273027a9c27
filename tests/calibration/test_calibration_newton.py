"""The in-loop calibration solver (NewtonIllinois) against the bisection of Algorithm 2.

Choquette-Choo et al., "Near exact privacy amplification for matrix mechanisms", §4, Alg. 2:
the calibrated sigma* solves delta_hat(sigma) = target_delta on a fixed sample (common random
numbers).  Newton in log sigma must find the same root (the function is the same; only the
iteration differs), in few passes from a warm start, with the same implicit gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.calibration import (Bisection, DrawPlan, NewtonIllinois, SolverStatus, StopGradientAdjoint,
                               calibrate_on_draws, calibrated_noise)
from dpjax.montecarlo import draws, gram_from_columns

B, E = 8, 4
KEY = jax.random.key(3)


def _solve(coeffs, solver, *, init=None, m=1 << 13, delta=1e-3, eps=2.0, adjoint=None, **plan):
    """The calibration of C = Toeplitz(1, coeffs); ``plan``: more fields of its DrawPlan."""
    gram = gram_from_columns(jnp.concatenate([jnp.ones(1), coeffs]), B, E)
    kw = {} if adjoint is None else {"adjoint": adjoint}
    return calibrate_on_draws(gram, eps, delta, DrawPlan(key=KEY, num_samples=m, **plan), solver=solver,
                              initial_noise=init, **kw)


# The targets are arguments of the programs, not constants baked into them: every case (and the
# warm-start test's reference root) runs the same two compiled programs.
_BISECTION = jax.jit(lambda c, eps, delta: _solve(c, Bisection(), eps=eps, delta=delta))
_NEWTON = jax.jit(lambda c, eps, delta: _solve(c, NewtonIllinois(), eps=eps, delta=delta))


@pytest.mark.parametrize("coeffs,eps,delta", [([0.5, 0.2], 2.0, 1e-3), ([0.9, 0.7], 1.0, 1e-2),
                                               ([0.1, 0.0], 4.0, 1e-4)])
def test_newton_matches_bisection(coeffs, eps, delta):
    with jax.enable_x64(True):
        c = jnp.array(coeffs, jnp.float64)
        bis = _BISECTION(c, eps, delta)
        new = _NEWTON(c, eps, delta)
    assert int(bis.status) == int(new.status) == SolverStatus.CONVERGED
    # Bisection resolves the root to ~1.4e-14 relative; Newton stops at a log-step <= 1e-12.
    assert float(new.root) == pytest.approx(float(bis.root), rel=1e-11)
    assert int(new.num_passes) <= 12


def test_warm_start_converges_in_few_passes():
    with jax.enable_x64(True):
        c = jnp.array([0.5, 0.2], jnp.float64)
        root = float(_BISECTION(c, 2.0, 1e-3).root)
        warm = jax.jit(lambda c, s0: _solve(c, NewtonIllinois(xtol=1e-9), init=s0))
        for rel in (0.97, 1.0, 1.05):
            r = warm(c, rel * root)
            assert float(r.root) == pytest.approx(root, rel=1e-10)
            # From within 5%: quadratic convergence needs 3-4 Newton passes for 1e-9 in log sigma.
            assert int(r.num_passes) <= 4, (rel, int(r.num_passes))


@pytest.mark.slow
def test_newton_implicit_gradient_matches_bisection_and_fd():
    with jax.enable_x64(True):
        c = jnp.array([0.5, 0.2], jnp.float64)
        new = jax.jit(jax.grad(lambda c, d: _solve(c, NewtonIllinois(), delta=d).root, argnums=(0, 1)))
        bis = jax.jit(jax.grad(lambda c, d: _solve(c, Bisection(), delta=d).root, argnums=(0, 1)))
        root = jax.jit(lambda c, d: _solve(c, Bisection(), delta=d).root)
        g_new, gd_new = new(c, 1e-3)
        g_bis, gd_bis = bis(c, 1e-3)
        h = 1e-6
        fd = np.array([(root(c.at[i].add(h), 1e-3) - root(c.at[i].add(-h), 1e-3)) / (2 * h)
                       for i in range(2)])
        fd_delta = (root(c, 1e-3 + 1e-9) - root(c, 1e-3 - 1e-9)) / 2e-9
    np.testing.assert_allclose(np.asarray(g_new), np.asarray(g_bis), rtol=1e-8)
    assert float(gd_new) == pytest.approx(float(gd_bis), rel=1e-8)
    # FD straddles CRN kinks (see test_calibration_montecarlo): 1e-3 relative.
    np.testing.assert_allclose(np.asarray(g_new), fd, rtol=1e-3)
    assert float(gd_new) == pytest.approx(float(fd_delta), rel=1e-3)


@pytest.mark.slow
def test_precomputed_draws_and_chunked_path_agree():
    m = 3000  # not a multiple of the block size
    with jax.enable_x64(True):
        c = jnp.array([0.5, 0.2], jnp.float64)
        a = jax.jit(lambda c: _solve(c, NewtonIllinois(), m=m).root)(c)
        b = jax.jit(lambda c: _solve(c, NewtonIllinois(), m=m, precompute=False).root)(c)
        gram = gram_from_columns(jnp.array([1.0, 0.5, 0.2]), B, E)
        d = jax.jit(lambda g: calibrate_on_draws(g, 2.0, 1e-3, DrawPlan(draws=draws(KEY, B, m))).root)(gram)
        s = jax.jit(lambda c: _solve(c, NewtonIllinois(), m=m, adjoint=StopGradientAdjoint()).root)(c)
    assert float(b) == pytest.approx(float(a), rel=1e-11)
    assert float(d) == pytest.approx(float(a), rel=1e-12)
    assert float(s) == pytest.approx(float(a), rel=1e-12)


@pytest.mark.slow
def test_estimate_mode_accepts_any_sample_count():
    # m << 1/delta = 1e5: still a finite calibrated estimate (continuous hockey-stick terms).
    col = jnp.array([1.0, 0.5])
    for m in (1, 64):
        s_bis = calibrated_noise(col, B, E, target_epsilon=2.0, target_delta=1e-5, num_samples=m,
                                 key=KEY)
        with jax.enable_x64(True):
            new = jax.jit(lambda c: _solve(c, NewtonIllinois(), m=m, delta=1e-5))(
                jnp.array([0.5], jnp.float64))
        assert np.isfinite(float(s_bis)) and float(s_bis) > 0
        assert int(new.status) == SolverStatus.CONVERGED
        assert float(new.root) == pytest.approx(float(s_bis), rel=1e-9)
    s_new = calibrated_noise(col, B, E, target_epsilon=2.0, target_delta=1e-5, num_samples=64,
                             key=KEY, solver=NewtonIllinois())
    assert float(s_new) == pytest.approx(float(s_bis), rel=1e-9)


def test_unreachable_and_vacuous_status():
    # C = Toeplitz(1, 0.5) written with a zero third coefficient, at 2^13 samples: the compiled
    # program of test_newton_matches_bisection.
    with jax.enable_x64(True):
        vac = _NEWTON(jnp.array([0.5, 0.0], jnp.float64), 1e7, 1e-3)
        unr = _NEWTON(jnp.array([0.5, 0.0], jnp.float64), 1e-3, 1e-300)
    assert int(vac.status) == SolverStatus.MET_AT_BRACKET_END
    assert int(unr.status) in (SolverStatus.UNREACHABLE, SolverStatus.CONVERGED)
    if int(unr.status) == SolverStatus.UNREACHABLE:
        assert np.isnan(float(unr.root))


@pytest.mark.slow
def test_importance_calibration_in_chunks_matches_the_whole_sample(monkeypatch):
    # The variance-reduced estimate on materialised draws is summed chunk by chunk (the chunks
    # bound the temporaries and are what the devices share); the root and its implicit gradient
    # are those of the whole-sample sum up to summation order.  m = 5000 with chunks of 256
    # samples (b = 8) also exercises a partial last chunk.
    from dpjax.montecarlo import calibrate as cm
    from dpjax.montecarlo.importance import default_proposal

    m = 5000
    with jax.enable_x64(True):
        c = jnp.array([0.5, 0.2], jnp.float64)
        gram0 = gram_from_columns(jnp.concatenate([jnp.ones(1), c]), B, E)
        prop = default_proposal(gram0, 1.0, 2.0, range_weight=0.3)

        def solved(c):
            # A new function per call: the chunk size is read when it is traced.
            def run(c):
                return _solve(c, NewtonIllinois(), m=m, proposal=prop).root

            return float(jax.jit(run)(c)), np.asarray(jax.jit(jax.grad(run))(c))

        monkeypatch.setattr(cm, "_SUMMAND_SLICE_ENTRIES", 8192 * B)
        assert cm._chunk_rows(m, B) >= m   # one chunk: the whole sample
        whole = solved(c)
        monkeypatch.setattr(cm, "_SUMMAND_SLICE_ENTRIES", 256 * B)
        assert cm._chunk_rows(m, B) == 256
        sliced = solved(c)
    assert sliced[0] == pytest.approx(whole[0], rel=1e-12)
    np.testing.assert_allclose(sliced[1], whole[1], rtol=1e-9)


def test_start_at_root_takes_one_pass():
    """Started at the root, ``g`` is round-off and the Newton point ``t - g / slope`` can round to
    ``t`` itself, a bracket end; the solver must accept that step (below ``xtol``) rather than
    leave the bracket by ``max_log_step`` and bisect back (~10 extra passes)."""
    from dpjax.montecarlo.calibrate import newton_illinois

    log_target = float(np.log(1e-5))
    t0 = 1.5479897260665894
    ulp = float(np.spacing(t0))

    def value_and_slope(sigma):
        # log delta = log_target + g0 - c (t - t0): g(t0) = g0 > 0 (just infeasible), and the
        # Newton step g0 / c is below half an ulp of t0, so t - g / slope rounds to t0.
        c, g0 = 20.0, 4.0 * ulp
        t = jnp.log(sigma)
        d = jnp.exp(log_target + g0 - c * (t - t0))
        return d, -c * d / sigma

    with jax.enable_x64(True):
        # The premise: the Newton point rounds back onto t0 (else the test does not test it).
        g = float(jnp.log(value_and_slope(jnp.exp(jnp.float64(t0)))[0]) - log_target)
        assert g > 0 and t0 - g / -20.0 == t0
        t, lo, hi, status, passes = jax.jit(lambda t: newton_illinois(
            value_and_slope, log_target, t, jnp.float64(-10.0), jnp.float64(10.0),
            NewtonIllinois(xtol=1e-9)))(jnp.float64(t0))
    assert int(status) == SolverStatus.CONVERGED
    assert abs(float(t) - t0) <= 1e-9
    assert int(passes) <= 2
