"""The planner's Chernoff search (dpjax.pld.grid.plan._chernoff_search) evaluates the probe's log-MGF
at part of its grid only; it must find what evaluating every grid point finds."""

import math

import jax
import numpy as np
import pytest

from dpjax import pld
from dpjax.pld.grid import engine
from dpjax.pld.grid import plan


def _full_grid_search(masses_d, counts, lam_gauss, log_tau, mid, factors=plan._LAMBDA_GRID):
    """Reference: the log-MGF at every grid point of both signs, then the same choices."""
    terms = plan._probe_log_mgf_terms(masses_d, counts, mid)
    grid = lam_gauss * factors
    out, width = [], 0.0
    for sign in (1.0, -1.0):
        lam = sign * grid
        K = plan._probe_log_mgf(terms, lam)
        with np.errstate(invalid="ignore"):
            q = sign * (K - log_tau) / lam
            q10 = sign * (K - log_tau - math.log(10.0)) / lam
        q = np.where(np.isfinite(q), q, np.inf)
        q10 = np.where(np.isfinite(q10), q10, np.inf)
        if not np.isfinite(q).any():
            out.append(sign * lam_gauss * plan._LAMBDA_FALLBACK)
            width = math.inf
            continue
        i = int(np.argmin(q))
        if i == 0 and factors is plan._LAMBDA_GRID:
            return _full_grid_search(masses_d, counts, lam_gauss, log_tau, mid, factors=plan._LAMBDA_GRID_LOW)
        width += float(np.min(q10))
        out.append(sign * grid[i] * plan._LAMBDA_SPREAD)
    return np.concatenate(out), width


def _compositions():
    rng = np.random.default_rng(7)
    out = []
    for _ in range(40):   # DP-SGD over the ranges users meet, small q T included (heavy tails)
        s = float(np.exp(rng.uniform(np.log(0.4), np.log(15.0))))
        q = float(np.exp(rng.uniform(np.log(1e-7), 0.0)))
        T = int(np.exp(rng.uniform(0.0, np.log(1e6))))
        out.append(([(pld.PoissonSubsampledGaussian(s, q), T)], float(np.exp(rng.uniform(np.log(1e-12), np.log(1e-3))))))
    out += [
        ([(pld.Laplace(0.7), 300), (pld.Gaussian(4.0), 20)], 1e-6),
        ([(pld.RandomizedResponse(0.3, 4), 1000)], 1e-8),
        ([(pld.PoissonSubsampledGaussian(np.linspace(0.7, 2.5, 17), 0.02), 30)], 1e-5),
        ([(pld.PoissonSubsampledGaussian(1.1, 1e-6), 50), (pld.Laplace(20.0), 3)], 1e-10),
        # q T far below delta: a point mass at 0 with rare large losses (the low grid's case)
        ([(pld.PoissonSubsampledGaussian(1.0, 1e-9), 10)], 1e-3),
        ([(pld.PoissonSubsampledGaussian(1.5, 1e-8), 100)], 1e-4),
    ]
    return out


def test_chernoff_search_finds_the_full_grid_minimum(monkeypatch):
    calls = []
    search = plan._chernoff_search

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return search(*args, **kwargs)

    monkeypatch.setattr(plan, "_chernoff_search", spy)
    with jax.enable_x64(True):
        for comps, delta in _compositions():
            up, _, symmetric, _ = engine.prepare(engine.as_components(comps), 64, None)
            directions = ("remove",) if symmetric else ("remove", "add")
            plan.plan_grid(up, directions, tail_mass=1e-3 * delta, eps_hint=None, target_delta=delta,
                           options=plan.GridOptions())
    assert len(calls) >= 60
    low = 0
    for args, kwargs in calls:
        lams, width = search(*args, **kwargs)
        ref_lams, ref_width = _full_grid_search(*args, **kwargs)
        np.testing.assert_array_equal(lams, ref_lams)
        assert width == pytest.approx(ref_width, rel=1e-13, abs=0) or width == ref_width
        low += abs(lams[0]) < 1e-5 * args[2]
    # Some searches must have gone down to the extended low grid (the heavy-tailed compositions).
    assert low >= 1


def test_host_probe_is_reused_for_the_same_mechanism_and_plans_alike(monkeypatch):
    # A loop accounting one mechanism at more step counts (a running accountant) probes it once;
    # the plan is the one a fresh probe gives.
    calls = []
    real = pld.PoissonSubsampledGaussian.host_loss_cdfs

    def counted(self, direction, y):
        calls.append(direction)
        return real(self, direction, y)

    monkeypatch.setattr(pld.PoissonSubsampledGaussian, "host_loss_cdfs", counted)
    monkeypatch.setattr(plan, "_HOST_PROBE_CACHE", type(plan._HOST_PROBE_CACHE)())

    def plan_of(sigma, steps):
        with jax.enable_x64(True):
            up, _, symmetric, _ = engine.prepare(
                engine.as_components([(pld.PoissonSubsampledGaussian(sigma, 0.01), steps)]), 64, None)
            directions = ("remove",) if symmetric else ("remove", "add")
            return plan.plan_grid(up, directions, tail_mass=1e-8, eps_hint=None, target_delta=1e-5,
                                  options=plan.GridOptions())

    first = [plan_of(1.3, steps) for steps in (100, 1000, 10000)]
    assert len(calls) == 2                       # one probe per direction, for all three plans
    plan_of(1.4, 100)
    assert len(calls) == 4                       # another noise multiplier: probed again
    plan._HOST_PROBE_CACHE.clear()
    fresh = [plan_of(1.3, steps) for steps in (100, 1000, 10000)]
    for a, b in zip(first, fresh):
        assert (a.n, a.dx, a.ms, a.n_freq) == (b.n, b.dx, b.ms, b.n_freq)
        np.testing.assert_array_equal(a.lambdas, b.lambdas)
    cached = next(iter(plan._HOST_PROBE_CACHE.values()))
    with pytest.raises(ValueError):
        cached[0][0][...] = 0.0                  # shared arrays cannot be changed by a caller
