"""Regression: short / low-rate DP-SGD (small q*T), where the remove-direction privacy loss is
heavy-tailed.  The Chernoff parameters used to sit around the Gaussian optimum z/sigma_c, orders
of magnitude too large there, every wrap-around bound saturated at 1 and the accountant returned
inf (or delta = 1).  Both answers were sound but useless; the planner now picks lambda from the
probe's own log-MGF (dpjax.pld.grid.plan._chernoff_search)."""

import math

import pytest
from hypothesis import given, settings, strategies as st

import dpjax
from dpjax import pld
from dpjax.baselines import rdp_epsilon

# dp_accounting 0.6.0 PLDAccountant(value_discretization_interval=1e-5), pessimistic, delta=1e-5:
# an upper bound within ~1e-6 relative of the truth for these short compositions.
DP_ACCOUNTING_1E5 = {
    (1.0, 0.005, 100): 0.3459539397315932,
    (0.8, 0.001, 10): 0.06144364781553007,
    (0.85, 0.005, 1000): 1.3157490916006387,
}


@pytest.mark.parametrize("args", sorted(DP_ACCOUNTING_1E5))
def test_small_qt_matches_dp_accounting(args):
    ref = DP_ACCOUNTING_1E5[args]
    res = pld.dpsgd_accounting(*args, target_delta=1e-5)
    # Tight: within 0.3% of the anchor.  Sound side: not more than 1e-5
    # relative below the anchor's own upper bound (its discretization error at 1e-5 is smaller).
    assert ref * (1 - 1e-5) <= res.epsilon <= ref * 1.003
    assert res.epsilon_lower <= res.epsilon
    for d in res.directions:
        assert d.tail_above < 1e-10


def test_small_qt_delta_is_not_one():
    # The case reported by the calibration work: delta came back as 1.0.
    d = dpjax.dpsgd_delta(0.85, 0.005, 1000, 1.3459)
    assert 0 < d < 1e-5


@settings(max_examples=5, deadline=None, derandomize=True)
@given(
    sigma=st.floats(0.6, 4.0),
    log10_q=st.floats(-3.0, -1.0),
    steps=st.integers(1, 300),
)
def test_finite_and_below_rdp(sigma, log10_q, steps):
    q = 10.0**log10_q
    eps = dpjax.dpsgd_epsilon(sigma, q, steps, 1e-5)
    assert math.isfinite(eps)
    # RDP (moments accountant) is a valid but looser upper bound: the tight PLD bound (true
    # value + a ~1e-5 relative discretization error) must not exceed it.
    eps_rdp, _ = rdp_epsilon(sigma, q, steps, 1e-5)
    assert eps <= eps_rdp * (1 + 1e-4)


# Bracket tightness of the optimistic (dominated, neighbour-matched) discretization.  Pinned
# relative widths (upper - lower) / upper measured with the default grid; the bounds leave
# ~3x headroom for grid changes but fail if the lower end falls back to plain rounding down
# (widths 3.5e-2 on B1, 1.0 on B6, 3.3e-1 on D_linear_T10000).
@pytest.mark.parametrize("case,max_width", [("B1", 1e-4), ("B6", 0.1)])
def test_bracket_is_tight(reference_cases, case, max_width):
    p = reference_cases[case]["params"]
    ref = reference_cases[case]["value"]  # dp_accounting at 1e-5: an upper bound, >= the truth
    res = pld.dpsgd_accounting(p["noise_multiplier"], p["sampling_probability"], p["steps"],
                               target_delta=p["delta"])
    assert res.epsilon_lower <= ref
    assert (res.epsilon_upper - res.epsilon_lower) / res.epsilon_upper < max_width
