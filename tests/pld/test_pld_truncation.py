"""Frequency truncation of the composed characteristic function (compose's ``n_freq``).

Dropping high frequencies is sound for any ``n_freq`` because the program adds a bound on
``2 sum_{k >= n_freq} |F^c|_k`` (the total change of the window, inverse real FFT), namely
``2 (n/2 + 1 - n_freq) max_{k >= n_freq} |F_k|^c``, to the round-off allowance.  These tests check (1) on long near-Gaussian compositions the planner's
``n_freq`` changes nothing visible (the dropped magnitudes underflow to 0, so the certified value
is the same to round-off), (2) a deliberately bad ``n_freq`` on an atomic PLD (randomized response,
whose characteristic function does not decay) is still an upper bound, because the allowance
grows, and (3) the accountant falls back to all frequencies there.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax import pld
from dpjax.pld.grid.engine import prepare, program, unpack


def _plan(components, target_delta=1e-5):
    up, _, symmetric, _ = prepare(components, 256)
    directions = ("remove",) if symmetric else ("remove", "add")
    plan = pld.plan_grid(up, directions, tail_mass=1e-6 * target_delta, eps_hint=None,
                         target_delta=target_delta, options=pld.GridOptions())
    return plan


def _eps(plan, n_freq, target_delta=1e-5):
    res = unpack(program(dataclasses.replace(plan, n_freq=n_freq), jnp.asarray([target_delta]), jnp.zeros(()),
                         kinds=("up",), want="eps"), plan.directions, ("up",), (1,))
    return max(float(r["up"]["value"][0]) for r in res), max(float(r["up"]["truncation"]) for r in res)


def test_planner_truncation_is_invisible_on_dpsgd():
    with jax.enable_x64(True):
        plan = _plan([(pld.PoissonSubsampledGaussian(1.0, 0.01), 1000)])
        assert plan.n_freq is not None and plan.n_freq < plan.n // 8
        eps_t, trunc = _eps(plan, plan.n_freq)
        eps_full, trunc_full = _eps(plan, None)
    assert trunc_full == 0.0
    # The dropped magnitudes |phi|^1000 underflow (exp(-700) and below): nothing is added, and
    # the kept coefficients are the same numbers, so the two agree to FFT round-off (the irfft
    # of the zero-padded vector may round differently): 1e-12 relative.
    assert trunc < 1e-300
    assert eps_t == pytest.approx(eps_full, rel=1e-12)


def test_bad_truncation_stays_an_upper_bound():
    # Randomized response composed 100 times: atoms on a lattice, |phi| = 1 at many frequencies.
    comps = [(pld.RandomizedResponse(0.5, 2), 100)]
    with jax.enable_x64(True):
        plan = _plan(comps)
        eps_full, _ = _eps(plan, None)
        eps_t, trunc = _eps(plan, 64)
    assert trunc > 1e-3          # the allowance sees the dropped mass
    assert eps_t >= eps_full     # ... and the value only gets more pessimistic (it is inf-or-larger)


def test_accountant_falls_back_to_all_frequencies():
    comps = [(pld.RandomizedResponse(0.5, 2), 100)]
    res = pld.epsilon(comps, 1e-5)
    with jax.enable_x64(True):
        eps_full, _ = _eps(_plan(comps), None)
    assert np.isfinite(res.epsilon)
    assert res.epsilon == pytest.approx(eps_full, rel=1e-12)


def _delta(plan, n_freq, eps):
    res = unpack(program(dataclasses.replace(plan, n_freq=n_freq), jnp.asarray([1e-5]), jnp.asarray(eps),
                         kinds=("up",), want="delta"), plan.directions, ("up",), (len(eps),))
    return np.max([r["up"]["value"] for r in res], axis=0), max(float(r["up"]["truncation"]) for r in res)


@pytest.mark.parametrize("components,n_freq", [
    ([(pld.Gaussian(1.0), 4)], 16),
    ([(pld.PoissonSubsampledGaussian(0.8, 0.1), 30)], 256),
    ([(pld.PoissonSubsampledGaussian(0.8, 0.1), 30)], 128),
])
def test_the_allowance_covers_what_truncation_changes(components, n_freq):
    # delta(eps) with n_freq kept frequencies = delta of the truncated window + the allowance t;
    # the truncated window differs from the full one by at most t (that is the bound), so the
    # difference to the full-frequency delta lies in [0, 2 t] at every eps.  The cases keep t
    # between 1e-12 and 1e-3, where a smaller allowance (say |F|^2 per coefficient instead of
    # |F|) no longer covers the change.
    eps = np.linspace(0.0, 6.0, 13)
    with jax.enable_x64(True):
        plan = _plan(components)
        full, trunc_full = _delta(plan, None, eps)
        cut, trunc = _delta(plan, n_freq, eps)
    assert trunc_full == 0.0 and 1e-12 < trunc < 1e-3
    change = cut - full
    assert np.all(np.abs(change - trunc) <= trunc * (1 + 1e-9) + 1e-13), (change, trunc)
