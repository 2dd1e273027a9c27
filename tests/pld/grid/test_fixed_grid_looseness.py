"""No silent looseness on a fixed grid: ``dpsgd_epsilon_fn`` flags answers far from its planning point.

A fixed grid gives a sound epsilon for any parameters, but a tight one only near where it was
planned.  ``dpsgd_epsilon_fn(..., with_report=True)`` returns the bound's terms and ``loose``; a loose
answer also warns (``LooseBoundWarning``).  The claim checked here: an answer that is not
flagged is at most 1% above the accountant's own bound at the same parameters
(``dpjax.dpsgd_epsilon``, a grid planned there).
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpjax
from dpjax import calibration as cal
from dpjax.pld.grid.fixed_grid import LOOSE_FRACTION, LooseBoundWarning

Q, T, DELTA = 0.01, 1000, 1e-5


@pytest.fixture(scope="module")
def grid():
    return cal.dpsgd_grid(1.0, Q, T, target_delta=DELTA)


@pytest.mark.slow
def test_read_below_the_planned_sigma_is_flagged(grid):
    """Planned at sigma 1.0, read at 0.8: twice the accountant's epsilon -- flagged and warned."""
    fresh = dpjax.dpsgd_epsilon(0.8, Q, T, DELTA)
    with pytest.warns(LooseBoundWarning, match="re-plan"):
        rep = cal.dpsgd_epsilon_fn(0.8, Q, T, DELTA, grid=grid, with_report=True)
    eps = float(rep.epsilon)
    assert eps > fresh  # sound (an upper bound), but ...
    assert abs(eps / fresh - 1) > 1e-3 and bool(rep.loose)  # ... not within 0.1%: flagged
    assert float(rep.excess) > LOOSE_FRACTION
    # the report says why: mass below the window wrapped onto higher losses
    assert float(rep.tail_below) > DELTA
    assert float(rep.epsilon_lower_estimate) <= fresh


@pytest.mark.slow
def test_at_the_planning_point_nothing_is_flagged(grid):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LooseBoundWarning)
        rep = cal.dpsgd_epsilon_fn(1.0, Q, T, DELTA, grid=grid, with_report=True)
        assert not bool(rep.loose)
        assert float(rep.epsilon) == pytest.approx(dpjax.dpsgd_epsilon(1.0, Q, T, DELTA), rel=1e-9)
        assert 0 <= float(rep.excess) < 1e-4
        # the bare value (no report) is the same number, and stays differentiable
        assert float(cal.dpsgd_epsilon_fn(1.0, Q, T, DELTA, grid=grid)) == float(rep.epsilon)
        assert float(jax.grad(lambda s: cal.dpsgd_epsilon_fn(s, Q, T, DELTA, grid=grid))(1.0)) < 0


def test_flag_works_under_vmap_and_jit(grid):
    with jax.enable_x64(True):
        rep = jax.jit(jax.vmap(lambda s: cal.dpsgd_epsilon_fn(s, Q, T, DELTA, grid=grid, with_report=True,
                                                        warn=False)))(jnp.asarray([0.8, 1.0, 1.5]))
    np.testing.assert_array_equal(np.asarray(rep.loose), [True, False, False])


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_q=st.floats(math.log(2e-3), math.log(5e-2)), log_t=st.floats(math.log(50), math.log(5000)),
       log10_delta=st.floats(-8, -4), log_sp=st.floats(math.log(0.5), math.log(4.0)),
       ratio=st.floats(-0.5, 0.7))
def test_no_unflagged_answer_is_more_than_1pct_looser(log_q, log_t, log10_delta, log_sp, ratio):
    q, steps, delta = math.exp(log_q), int(math.exp(log_t)), 10.0 ** log10_delta
    sp = math.exp(log_sp)
    se = sp * math.exp(ratio)
    grid = cal.dpsgd_grid(sp, q, steps, target_delta=delta)
    rep = cal.dpsgd_epsilon_fn(se, q, steps, delta, grid=grid, with_report=True, warn=False)
    fresh = dpjax.dpsgd_epsilon(se, q, steps, delta)
    eps = float(rep.epsilon)
    if not bool(rep.loose):
        assert eps <= fresh * 1.01
