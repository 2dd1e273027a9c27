"""The accountant's coarse static shapes (``dpjax.pld.plan.coarse_shape``).

Rounding the plan's shape up must only ever widen what the program covers (window, supports,
kept frequencies), keep the spacing and offsets, and make nearby noise multipliers share one
shape: that is what lets a calibration compile one program.  Soundness of the bound on the
rounded plan is the accountant's general soundness (tested against exact oracles elsewhere);
here: the rounded plan's epsilon against the unrounded one on the same grid spacing.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dpjax import pld
from dpjax.pld import engine
from dpjax.pld.plan import GridOptions, coarse_shape, plan_grid


def _plan(sigma, q, steps, delta):
    groups, _, symmetric, _ = engine.prepare(engine.dpsgd_components(sigma, q, steps), GridOptions().max_distinct)
    directions = ("remove",) if symmetric else ("remove", "add")
    return plan_grid(groups, directions, tail_mass=GridOptions().tail_fraction * delta, eps_hint=None,
                     target_delta=delta, options=GridOptions()), directions


CASES = [(1.0, 0.01, 1000, 1e-5), (0.8, 0.004, 20000, 1e-6), (2.0, 0.1, 500, 1e-5), (0.6, 0.05, 40, 1e-8)]


@pytest.mark.parametrize("sigma, q, steps, delta", CASES)
def test_coarse_shape_only_widens(sigma, q, steps, delta):
    plan, _ = _plan(sigma, q, steps, delta)
    c = coarse_shape(plan, GridOptions())
    assert c.n >= plan.n and c.n & (c.n - 1) == 0  # a power of two, never smaller
    assert c.dx == plan.dx and c.groups == plan.groups  # same spacing, same offsets
    for ms_c, ms_p in zip(c.ms, plan.ms):
        for mc, mp in zip(ms_c, ms_p):
            assert mp <= mc <= c.n
            assert mc == mp or mc in (c.n // 2, c.n)
    if c.n_freq is not None:
        assert plan.n_freq is not None and c.n_freq >= max(plan.n_freq, 768)
        assert c.n_freq == 768 or c.n_freq & (c.n_freq - 1) == 0  # 768, or a power of two above it


def test_nearby_noise_multipliers_share_one_shape():
    # The calibration's probes near the root of (eps 2, delta 1e-5, q 0.01, T 1000), sigma ~ 0.959:
    # the unrounded plans change shape within this +-3% window, the rounded ones do not.
    shapes, raw = set(), set()
    for sigma in np.linspace(0.93, 0.99, 13):
        plan, _ = _plan(float(sigma), 0.01, 1000, 1e-5)
        c = coarse_shape(plan, GridOptions())
        raw.add((plan.n, plan.ms, plan.n_freq))
        shapes.add((c.n, c.ms, c.n_freq))
    assert len(shapes) == 1
    assert len(raw) > 1


@pytest.mark.parametrize("sigma, q, steps, delta", CASES[:2])
def test_rounded_plan_is_at_least_as_tight(sigma, q, steps, delta):
    # The same groups, spacing and Chernoff parameters, composed on the planned and on the rounded
    # shape: the wider window and longer supports only move mass from the +inf atom and the
    # wrap-around bound onto the grid; what can grow is the certified FFT round-off term, which
    # scales with n (measured +2e-10 relative at q = 0.01, T = 1000).  1e-8: that term's order.
    plan, directions = _plan(sigma, q, steps, delta)
    values = []
    for p in (plan, coarse_shape(plan, GridOptions())):
        with jax.enable_x64(True):  # the private program, called directly: the public API does this
            flat = engine.program(p.groups, p.dx, p.lambdas, p.log_tau, np.asarray([delta]), np.zeros(()),
                                directions=directions, ms=p.ms, n=p.n, kinds=("up",), want="eps",
                                n_freq=p.n_freq)
            res = engine.unpack(flat, directions, ("up",), (1,))
        values.append(max(float(np.asarray(r["up"]["value"]).reshape(-1)[0]) for r in res))
    assert values[1] <= values[0] * (1 + 1e-8)
    assert values[1] >= values[0] * (1 - 1e-3)  # and the same bound, to the grid's accuracy
    assert values[1] == pytest.approx(pld.dpsgd_epsilon(sigma, q, steps, delta), rel=1e-12)
