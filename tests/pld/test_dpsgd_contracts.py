"""Contracts of the DP-SGD entry points on edge inputs: hopeless noise answered without a grid,
arrays of targets equal to their own calls, and the same keywords for epsilon and delta."""

from __future__ import annotations

import math

import numpy as np

import dpjax
from dpjax import pld


def test_noise_no_window_can_hold_is_answered_inf_without_a_grid():
    # One step at sigma 1e-300 has delta ~ q = 0.01 > 1e-5 at every float64 epsilon: the true
    # epsilon is beyond float64.  The grid used to plan, compile and run five tilted passes.
    res = pld.dpsgd_accounting(1e-300, 0.01, 10, 1e-5)
    assert math.isinf(res.epsilon) and math.isinf(res.epsilon_lower)
    assert all(r.n == 0 for r in res.directions)          # no grid was run
    assert "beyond float64" in res.reason
    # Small but representable noise is still accounted (finite: the dominating Gaussian at worst).
    assert math.isfinite(pld.dpsgd_accounting(1e-3, 0.01, 10, 1e-5).epsilon)


def test_array_of_targets_equals_each_single_call():
    deltas = np.array([1e-5, 1e-7])
    many = dpjax.dpsgd_epsilon(1.0, 0.01, 1000, deltas)
    single = [dpjax.dpsgd_epsilon(1.0, 0.01, 1000, float(d)) for d in deltas]
    np.testing.assert_array_equal(many, single)
    eps = np.array([1.0, 2.0])
    np.testing.assert_array_equal(dpjax.dpsgd_delta(1.0, 0.01, 1000, eps),
                                  [dpjax.dpsgd_delta(1.0, 0.01, 1000, float(e)) for e in eps])


def test_dpsgd_delta_takes_the_group_keywords_of_dpsgd_epsilon():
    eps = dpjax.dpsgd_epsilon(2.0, 0.01, 200, 1e-5, group_size=4)
    d = dpjax.dpsgd_delta(2.0, 0.01, 200, eps, group_size=4)
    assert d == dpjax.group_delta(2.0, 0.01, 200, eps, group_size=4)
    # The delta at the certified epsilon is about the target: the delta query plans its own grid
    # (an absolute tail budget instead of one relative to the target), so the two upper bounds
    # agree within the grids' accuracy (relative_accuracy 1e-3), not bit for bit.
    assert 1e-5 * 0.999 <= d <= 1e-5 * 1.001
    assert dpjax.dpsgd_delta(1.0, 0.01, 200, 1.0) == pld.dpsgd_delta(1.0, 0.01, 200, 1.0)
