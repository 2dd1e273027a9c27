"""Agreement with dp_accounting / exact references on DP-SGD, heterogeneous,
Laplace and randomized-response compositions (tests/data/reference.json families B, D, E).

Tolerances: agreement within 0.3% with dp_accounting's PLDAccountant at
value_discretization_interval=1e-4; the pinned values are at 1e-5 (closer to the truth), and we
check both.  Soundness: the certified value may never fall below a rigorous lower bracket of
the truth (PRV lower bound, exact oracle, or the reference's rigorous bracket), and our own
lower bracket may never exceed the pinned upper bound.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpjax import pld

REL = 3e-3  # 0.3%


@pytest.mark.parametrize("case_id", ["B1", "B2", "B3", "B6"])
def test_dpsgd_against_pinned(reference_cases, case_id):
    case = reference_cases[case_id]
    p = case["params"]
    res = pld.dpsgd_accounting(p["noise_multiplier"], p["sampling_probability"], p["steps"],
                               target_delta=p["delta"])
    ref = case["value"]
    dpa_1e4 = case["extra"]["pld_pessimistic_1e-4_PLDAccountant"]
    prv_lower = case["extra"]["prv_accountant"]["lower"]
    assert abs(res.epsilon - ref) <= REL * ref
    assert abs(res.epsilon - dpa_1e4) <= REL * dpa_1e4
    assert res.epsilon >= prv_lower                  # sound against a rigorous lower bracket
    assert res.epsilon_lower <= ref                  # our lower bracket is below an upper bound
    # The remove direction dominates for these cases (reference stores both directions).
    by_dir = {d.direction: float(d.upper) for d in res.directions}
    assert by_dir["add"] <= by_dir["remove"]
    add_ref = case["extra"]["pld_pessimistic_1e-5_remove_direction"]
    assert abs(by_dir["remove"] - add_ref) <= REL * add_ref


def test_dpsgd_delta_roundtrip(reference_cases):
    """delta(eps(delta0)) ~ delta0 on the same accountant (B1): the two conversions agree."""
    p = reference_cases["B1"]["params"]
    eps = pld.dpsgd_epsilon(p["noise_multiplier"], p["sampling_probability"], p["steps"], 1e-5)
    d = pld.dpsgd_delta(p["noise_multiplier"], p["sampling_probability"], p["steps"], eps)
    # Different grids (delta queries use an absolute tail budget): agree to 1% in delta.
    assert d == pytest.approx(1e-5, rel=1e-2)


@pytest.mark.slow
def test_heterogeneous_linear_schedule_T10000(reference_cases):
    case = reference_cases["D_linear_T10000"]
    p = case["params"]
    sigmas = np.linspace(3.0, 2.5, p["steps"])
    res = pld.dpsgd_accounting(None, p["sampling_probability"], p["steps"], target_delta=p["delta"],
                               with_lower=False, noise_schedule=sigmas)
    ref = case["value"]
    assert res.blocked  # 10000 distinct sigmas > max_distinct: bracketed by blocks (smallest sigma)
    assert abs(res.epsilon - ref) <= REL * ref
    # Rigorous lower end of the reference's block bracket (modulo its 1e-4 discretization):
    # an upper bound of the truth can not be below it.
    assert res.epsilon >= case["extra"]["bracket_lower_blocks10_sigma_max_1e-4_modulo_discretization"]


def test_heterogeneous_exact_equals_grouped():
    """A schedule with few distinct values is composed exactly: same answer as explicit counts."""
    sched = np.r_[np.full(300, 1.5), np.full(200, 1.0), np.full(500, 2.0)]
    a = pld.dpsgd_accounting(None, 0.01, 1000, target_delta=1e-5, with_lower=False, noise_schedule=sched)
    comps = [(pld.PoissonSubsampledGaussian(1.5, 0.01), 300), (pld.PoissonSubsampledGaussian(1.0, 0.01), 200),
             (pld.PoissonSubsampledGaussian(2.0, 0.01), 500)]
    b = pld.epsilon(comps, 1e-5, with_lower=False)
    assert not a.blocked
    assert a.epsilon == pytest.approx(b.epsilon, rel=1e-12)
    # Monotone in the schedule: replacing every sigma by the smallest can only increase epsilon.
    c = pld.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)
    assert c >= a.epsilon


def test_laplace(reference_cases):
    case = reference_cases["E_laplace"]
    p = case["params"]
    res = pld.epsilon([(pld.Laplace(p["laplace_scale_b"], p["sensitivity_l1"]), p["steps"])], p["delta"])
    ref = case["value"]
    assert abs(res.epsilon - ref) <= REL * ref
    assert res.epsilon >= 4.6926413  # rigorous lower bracket stated in the reference's note
    assert res.epsilon_lower <= ref


def test_mixed_gaussian_and_randomized_response(reference_cases):
    """Replace adjacency, RR noise parameter 0.96 (P(correct) = 0.52), 100 + 100 mechanisms.

    The reference value is exact (binomial sum of Gaussian hockey sticks), so the certified
    value must be >= it (float64 slack 1e-10) and within 0.3% above it.
    """
    case = reference_cases["D_mixed_gauss_rr"]
    p = case["params"]
    rr = pld.RandomizedResponse(p["dp_accounting_rr_noise_parameter"], p["rr_domain_size"])
    assert float(np.log(0.52 / 0.48)) == pytest.approx(p["rr_epsilon_each"], rel=1e-12)
    comps = [(pld.Gaussian(p["gaussian_sigma"], p["gaussian_sensitivity"]), p["gaussian_count"]),
             (rr, p["rr_count"])]
    res = pld.epsilon(comps, p["delta"])
    exact = case["value"]
    assert res.epsilon >= exact * (1 - 1e-10)
    assert res.epsilon <= exact * (1 + REL)
    assert res.epsilon_lower <= exact * (1 + 1e-10)
    # The dp_accounting pitfall (SelfComposed RR counted once) gives 4.39: we must not.
    assert res.epsilon > 5.8


def test_randomized_response_alone_is_exact():
    """100 binary RR with P(correct)=0.52: the loss is a scaled binomial, delta is a finite sum."""
    from scipy import stats

    ell = np.log(0.52 / 0.48)
    k = np.arange(101)
    pk = stats.binom.pmf(k, 100, 0.52)
    y = (2 * k - 100) * ell

    def exact_delta(eps):
        return float(np.sum(pk * np.maximum(0.0, 1 - np.exp(eps - y))))

    res = pld.delta([(pld.RandomizedResponse.from_probability_correct(0.52), 100)], [0.5, 1.0, 2.0])
    exact = np.array([exact_delta(e) for e in (0.5, 1.0, 2.0)])
    assert np.all(res.delta_upper >= exact * (1 - 1e-10))
    assert np.all(res.delta_upper <= exact * (1 + REL) + 1e-12)
    assert np.all(res.delta_lower <= exact * (1 + 1e-10))


def test_live_dp_accounting_B3():
    """Live oracle (cheap case): dp_accounting's PLDAccountant at 1e-4 on (2.0, 0.1, 100)."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(2.0)), 100))
    ref = acc.get_epsilon(1e-5)
    ours = pld.dpsgd_epsilon(2.0, 0.1, 100, 1e-5)
    assert abs(ours - ref) <= REL * ref
