"""The host bisection of the solver framework (:class:`dpjax.numerics.root.HostBisection`).

Checked on predicates with known boundaries: the returned root is a point the predicate holds
at (the safe side), for increasing and decreasing problems on linear and log scales; it lies
within the stopping rule's width of the true boundary; the end checks give the framework's
statuses; a bad bracket or solver setting raises ValueError naming it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpjax.numerics.root import HostBisection, Solution, SolverStatus


def _problem(c, increasing):
    """A predicate whose boundary is the cube root of ``c``, feasible below it for an
    increasing ``x^3 <= c`` (safe side "lower") or above it for ``c / x^3 <= 1`` (safe side
    "upper")."""
    if increasing:
        return (lambda x: x ** 3 <= c), "lower"
    return (lambda x: c / x ** 3 <= 1.0), "upper"


# ---------------------------------------------------------------------------------------------
# Safe side and accuracy
# ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(c=st.floats(1e-3, 1e3), increasing=st.booleans(), scale=st.sampled_from(["linear", "log"]))
def test_root_is_feasible_and_within_the_relative_width(c, increasing, scale):
    feasible, safe = _problem(c, increasing)
    sol = HostBisection(safe=safe, scale=scale, rtol=1e-10).solve(feasible, 0.05, 20.0)
    root, true = sol.root, c ** (1.0 / 3.0)
    assert isinstance(sol, Solution) and sol.status == SolverStatus.CONVERGED
    assert feasible(root)
    assert root == (sol.lower if safe == "lower" else sol.upper)
    # The final bracket meets the stopping rule and holds the boundary (up to the rounding of
    # the cube, a few ulps).
    if scale == "log":
        assert sol.upper <= sol.lower * (1 + 1e-10)
    else:
        assert sol.upper - sol.lower <= 1e-10 * sol.upper
    assert sol.lower * (1 - 1e-15) <= true <= sol.upper * (1 + 1e-15)
    assert abs(root - true) <= 1e-10 * true


@pytest.mark.parametrize("increasing", [True, False])
def test_absolute_width_and_fixed_halvings(increasing):
    c = 7.0
    feasible, safe = _problem(c, increasing)
    true = c ** (1.0 / 3.0)
    sol = HostBisection(safe=safe, atol=1e-6).solve(feasible, 0.0 if increasing else 0.5, 4.0)
    assert feasible(sol.root) and sol.upper - sol.lower <= 1e-6
    assert abs(sol.root - true) <= 1e-6
    fixed = HostBisection(safe=safe, max_halvings=10).solve(feasible, 1.0, 3.0)
    # Ten halvings of a width-2 bracket, plus the two end checks.
    assert fixed.num_passes == 12 and fixed.upper - fixed.lower == 2.0 / 2 ** 10
    assert feasible(fixed.root) and fixed.lower <= true <= fixed.upper


def test_the_safe_end_is_the_one_tested_feasible_even_at_adjacent_floats():
    # A boundary between two adjacent floats: the bracket closes onto them and the search stops
    # at the fixed point (the midpoint rounds to an end), well before the halving limit.
    b = 1.0 + 2.0 ** -52
    lower = HostBisection(safe="lower", max_halvings=1000).solve(lambda x: x < b, 0.0, 2.0)
    assert lower.root == 1.0 and lower.upper == b and lower.num_passes < 100
    upper = HostBisection(safe="upper", max_halvings=1000).solve(lambda x: x >= b, 0.0, 2.0)
    assert upper.root == b and upper.lower == 1.0 and upper.num_passes < 100


def test_nan_evaluations_count_as_infeasible():
    # A predicate comparing a NaN answers False: the bracket moves away from the safe end.
    sol = HostBisection(safe="upper", rtol=1e-12).solve(
        lambda x: (math.nan if x < 3.0 else 1.0 / x) <= 0.5, 1.0, 10.0)
    assert sol.root >= 3.0 and sol.root <= 3.0 * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# Statuses
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("safe", ["lower", "upper"])
def test_statuses_at_the_bracket_ends(safe):
    solver = HostBisection(safe=safe, rtol=1e-9)
    never = solver.solve(lambda x: False, 1.0, 2.0)
    assert never.status == SolverStatus.UNREACHABLE and math.isnan(never.root)
    assert never.num_passes == 2
    always = solver.solve(lambda x: True, 1.0, 2.0)
    assert always.status == SolverStatus.MET_AT_BRACKET_END
    # The least favourable end of a fully feasible bracket: the far end from the safe side.
    assert always.root == (2.0 if safe == "lower" else 1.0)


def test_ends_vouched_for_by_the_caller_are_not_evaluated():
    calls = []

    def feasible(x):
        calls.append(x)
        return x <= 0.3

    solver = HostBisection(safe="lower", max_halvings=5)
    sol = solver.solve(feasible, 0.0, 1.0, check_ends=False)
    assert 0.0 not in calls and 1.0 not in calls and len(calls) == 5 == sol.num_passes
    assert sol.status == SolverStatus.CONVERGED and sol.root == 0.28125
    # The float-only form: the same halvings, the same root.
    calls.clear()
    assert solver.root(feasible, 0.0, 1.0) == 0.28125 and len(calls) == 5


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("increasing", [True, False])
def test_arrays_match_the_scalar_solve_elementwise(scale, increasing):
    c = np.array([1e-2, 0.5, 3.0, 900.0])
    lo, hi = np.full(4, 0.1), np.full(4, 12.0)
    if increasing:
        feasible, safe = (lambda x: x ** 3 <= c), "lower"
    else:
        feasible, safe = (lambda x: c / x ** 3 <= 1.0), "upper"
    solver = HostBisection(safe=safe, scale=scale, max_halvings=60)
    sol = solver.solve_array(feasible, lo, hi)
    status = np.asarray(sol.status)
    # c = 1e-2 (cube root 0.215) and 900 (9.65) lie inside [0.1, 12] too.
    assert np.all(status == SolverStatus.CONVERGED)
    assert np.all(feasible(sol.root))
    for i in range(4):
        one = solver.solve(lambda x: bool(feasible(np.full(4, x))[i]), lo[i], hi[i])
        assert one.root == sol.root[i]
    np.testing.assert_allclose(sol.root, np.cbrt(c), rtol=1e-12)


def test_arrays_statuses_and_inactive_elements():
    target = np.array([0.5, -1.0, 5.0, 0.25])
    lo = np.array([0.0, 0.0, 0.0, np.nan])
    hi = np.array([1.0, 1.0, 1.0, np.inf])
    active = np.array([True, True, True, False])
    sol = HostBisection(safe="lower", rtol=1e-9).solve_array(lambda x: x <= target, lo, hi, active=active)
    status = np.asarray(sol.status)
    assert status[0] == SolverStatus.CONVERGED and sol.root[0] <= 0.5 <= sol.upper[0]
    assert status[1] == SolverStatus.UNREACHABLE and np.isnan(sol.root[1])
    assert status[2] == SolverStatus.MET_AT_BRACKET_END and sol.root[2] == 1.0
    # The inactive element keeps its (non-finite) bracket untouched.
    assert np.isnan(sol.lower[3]) and sol.upper[3] == np.inf


def test_arrays_go_on_halving_until_every_element_meets_the_width():
    # One element starts narrow, the other wide: both are halved until the wide one meets the
    # rule, so the narrow one ends far narrower than the rule asks.
    sol = HostBisection(safe="lower", rtol=1e-6).solve_array(
        lambda x: x <= np.array([0.5, 0.5]), np.array([0.49, 0.0]), np.array([0.51, 1e6]),
        check_ends=False)
    width = sol.upper - sol.lower
    assert np.all(width <= 1e-6 * sol.upper) and width[0] < 1e-12


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bracket", [(2.0, 1.0), (math.nan, 1.0), (0.0, math.inf)])
def test_bad_brackets_raise(bracket):
    solver = HostBisection(safe="lower", rtol=1e-9)
    with pytest.raises(ValueError, match="bracket"):
        solver.solve(lambda x: True, *bracket)
    with pytest.raises(ValueError, match="bracket"):
        solver.solve_array(lambda x: np.ones(np.shape(x), bool), [bracket[0]], [bracket[1]])


def test_log_scale_needs_a_positive_bracket():
    with pytest.raises(ValueError, match="bracket"):
        HostBisection(scale="log", rtol=1e-9).solve(lambda x: True, 0.0, 1.0)


@pytest.mark.parametrize("kwargs, name", [
    (dict(safe="left", rtol=1e-9), "safe"),
    (dict(scale="sqrt", rtol=1e-9), "scale"),
    (dict(), "max_halvings"),
    (dict(atol=1e-9, rtol=1e-9), "atol"),
    (dict(rtol=-1.0), "rtol"),
    (dict(atol=math.nan), "atol"),
    (dict(scale="log", atol=1e-3), "atol"),
    (dict(max_halvings=-1), "max_halvings"),
    (dict(max_halvings=2.5), "max_halvings"),
])
def test_bad_settings_raise_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HostBisection(**kwargs)
