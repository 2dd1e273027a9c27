"""The screened in-loop calibration (dpjax.calibration.screened) is the full estimate's root and
implicit gradient, not an approximation: same sample, same numbers (to float64 summation order),
on the screened path, after a re-screen, and in the full fallback; and its gradient matches
central finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.calibration import DrawPlan, NewtonIllinois, calibrate_on_draws
from dpjax.calibration.screened import (calibrate_screened, default_num_candidates,
                                        screened_draws)
from dpjax.montecarlo import gram_matrix
from dpjax.optimization import make_parameterization, prefix_sum_error

B, E = 8, 2
N = B * E
EPS, DELTA = 2.0, 1e-3
M = 1 << 12
SOLVER = NewtonIllinois(xtol=1e-12)


def _setup():
    par = make_parameterization("blt", N, num_buffers=2)
    p0 = par.init()
    rng = np.random.default_rng(1)
    params = {k: jnp.asarray(v + 0.2 * rng.standard_normal(np.shape(v)), jnp.float64)
              for k, v in p0.items()}
    return par, params, screened_draws(jax.random.key(11), B, M)


def _full(par, draws_, start):
    @jax.jit
    def f(p):
        g = gram_matrix(par.correlation(p), B, E)
        return calibrate_on_draws(g, EPS, DELTA, DrawPlan(draws=(draws_.mode_index, draws_.u)),
                                  solver=SOLVER, initial_noise=start).root
    return f


def _screened(par, draws_, start, k):
    def f(p, s0):
        g = gram_matrix(par.correlation(p), B, E)
        r = calibrate_screened(g, EPS, DELTA, draws_, solver=SOLVER, initial_noise=s0,
                               num_candidates=k)
        return r.root, r
    return lambda p: f(p, start)


def _screened_value_and_grad(par, draws_, k):
    @jax.jit
    def vg(p, s0):
        return jax.value_and_grad(_screened(par, draws_, s0, k), has_aux=True)(p)
    return vg


@pytest.mark.slow
def test_screened_root_and_gradient_equal_the_full_estimate():
    cases = [
        (1.01, 128, True),    # the loop's case: warm start within a step of the root
        (1.5, 128, True),     # far start: the first screen fails, the re-screen at the root holds
        (1.01, 2, False),     # too few candidates: the bound fails, the full float64 solve runs
    ]
    with jax.enable_x64(True):
        par, params, d = _setup()
        root, grad = jax.jit(jax.value_and_grad(_full(par, d, 1.0)))(params)
        fns = {k: _screened_value_and_grad(par, d, k) for _, k, _ in cases}
        for start_factor, k, expect_screened in cases:
            start = float(root) * start_factor
            (s, res), g = fns[k](params, start)
            assert bool(res.screened) == expect_screened, (start_factor, k)
            assert int(res.status) == 0 and int(res.num_passes) >= 1
            # Same root to the solver tolerance (both converge to ~1e-12 in log sigma).
            assert float(s) == pytest.approx(float(root), rel=1e-11)
            for name in grad:
                ref = np.asarray(grad[name])
                np.testing.assert_allclose(np.asarray(g[name]), ref, rtol=0,
                                           atol=1e-9 * np.max(np.abs(ref)))


@pytest.mark.slow  # ~20 compiled evaluations: ~1 min idle, several under load
def test_screened_gradient_matches_central_finite_differences():
    """For the loop's calibration: d log RMSE / d params against central
    differences with the same sample (h = 1e-5; see tests/optimization/test_rmse_gradients.py for the
    error budget), relative error <= 1e-4 of the largest component."""
    with jax.enable_x64(True):
        par, params, d = _setup()
        sigma0 = float(_full(par, d, 1.0)(params))

        def log_rmse(p):
            s, _ = _screened(par, d, sigma0, 128)(p)
            return jnp.log(s * prefix_sum_error(par.correlation(p), N))

        f = jax.jit(log_rmse)
        g = jax.grad(log_rmse)(params)
        keys = sorted(params)
        flat_g = np.concatenate([np.ravel(np.asarray(g[k])) for k in keys])
        fd = []
        for k in keys:
            base = np.asarray(params[k], np.float64)
            for i in range(base.size):
                e = np.zeros(base.size)
                e[i] = 1e-5
                up = {**params, k: jnp.asarray((base.ravel() + e).reshape(base.shape))}
                dn = {**params, k: jnp.asarray((base.ravel() - e).reshape(base.shape))}
                fd.append((float(f(up)) - float(f(dn))) / 2e-5)
    fd = np.asarray(fd)
    rel = np.max(np.abs(flat_g - fd)) / np.max(np.abs(fd))
    assert rel <= 1e-4, (rel, flat_g, fd)


def test_default_num_candidates_and_bad_input():
    assert default_num_candidates(1 << 17) == 4096
    assert default_num_candidates(100) == 100
    with jax.enable_x64(True):
        par, params, d = _setup()
        g = gram_matrix(par.correlation(params), B, E)
        with pytest.raises(ValueError, match="num_candidates"):
            calibrate_screened(g, EPS, DELTA, d, num_candidates=0)


@pytest.mark.slow
def test_reused_screen_gives_the_full_estimates_root_and_gradient():
    """calibrate_screened_reusing: a screen taken at (C_0, sigma_0) is reused at a nearby C when
    the drift bound proves no excluded sample can reach eps, and the root and gradient are
    still those of the full float64 estimate; a far C is screened afresh, with the same
    guarantee.  A state of the wrong shape is refused."""
    from dpjax.calibration.screened import calibrate_screened_reusing, empty_screen_state

    with jax.enable_x64(True):
        par, params, d = _setup()
        state0 = empty_screen_state(M, B, 128)

        @jax.jit
        def reusing(p, s0, state):
            def f(p):
                g = gram_matrix(par.correlation(p), B, E)
                out = calibrate_screened_reusing(g, EPS, DELTA, d, state, solver=SOLVER,
                                                 initial_noise=s0, num_candidates=128)
                return out.result.root, out
            return jax.value_and_grad(f, has_aux=True)(p)

        root0 = float(_full(par, d, 1.0)(params))
        (_, first), _ = reusing(params, root0 * 1.01, state0)
        assert not bool(first.reused) and bool(first.state.valid) and bool(first.result.screened)
        for scale, expect_reused in ((1e-3, True), (0.3, False)):
            rng = np.random.default_rng(7)
            moved = {k: v + scale * jnp.asarray(rng.standard_normal(np.shape(v))) for k, v in params.items()}
            root, grad = jax.jit(jax.value_and_grad(_full(par, d, 1.0)))(moved)
            (s, out), g = reusing(moved, root0, first.state)
            assert bool(out.reused) == expect_reused, scale
            assert bool(out.result.screened) and int(out.result.status) == 0
            assert float(s) == pytest.approx(float(root), rel=1e-11)
            for name in grad:
                ref = np.asarray(grad[name])
                np.testing.assert_allclose(np.asarray(g[name]), ref, rtol=0,
                                           atol=1e-9 * np.max(np.abs(ref)))
            # A reused call hands its (unchanged) screen on; a fresh screen replaces it.
            assert bool(jnp.all(out.state.y_pq == first.state.y_pq)) == expect_reused
        g0 = gram_matrix(par.correlation(params), B, E)
        with pytest.raises(ValueError, match="state"):
            calibrate_screened_reusing(g0, EPS, DELTA, d, empty_screen_state(M, B, 64),
                                       num_candidates=128)
        for args, name in (((0, B), "num_samples"), ((M, 0), "batches_per_epoch"),
                           ((M, B, 0), "num_candidates")):
            with pytest.raises(ValueError, match=name):
                empty_screen_state(*args)
