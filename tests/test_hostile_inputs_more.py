"""Reproductions of wrong answers and crashes on the newer surfaces (interop, sampling, noise,
sweep, curves), each pinned to the right number or to a clear ValueError; the CLI half is in
tests/cli/test_optimize_cli_paths.py, the fallback bounds in tests/pld/test_pld_fallback.py."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.special
import scipy.stats

import dpjax
from dpjax import pld
from dpjax.interop import RunningAccountant, calibrate_steps, get_noise_multiplier
from dpjax.interop.opacus import steps_from_epochs
from dpjax.noise import toeplitz_noise
from dpjax.sampling import BallsInBinsSampler, PoissonSampler, _log_binomial_sf


# --------------------------------------------------------------------------- steps from epochs

@pytest.mark.parametrize("epochs,q,steps", [(7, 0.07, 100), (3, 0.1, 30), (1, 0.01, 100), (10, 0.03, 334),
                                            (1, 0.3, 4), (2.5, 0.05, 50)])
def test_steps_from_epochs_is_exact(epochs, q, steps):
    # 7 / 0.07 = 99.99999999999999 in floats: int() gave 99 steps for a 100-step training.
    assert steps_from_epochs(epochs, q) == steps


def test_get_noise_multiplier_covers_every_step_of_seven_epochs():
    sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.07, epochs=7)
    # Was 2.8411, certified for 99 steps; at the 100 steps of 7 epochs its epsilon is 1.00515.
    assert dpjax.dpsgd_epsilon(sigma, 0.07, 100, 1e-5) <= 1.0
    assert sigma == get_noise_multiplier(target_epsilon=1.0, target_delta=1e-5, sample_rate=0.07, steps=100)


# --------------------------------------------------------------------------- truncation delta

def test_binomial_tail_bound_in_log_space_matches_the_exact_tail():
    # Exact log tail by log-sum-exp of the pmf, where it is representable and where sf underflows.
    n, p = 60001, 0.01
    for k in (700, 1000, 1500, 1800, 2500):
        j = np.arange(k + 1, n + 1)
        exact = float(scipy.special.logsumexp(scipy.stats.binom.logpmf(j, n, p)))
        bound = _log_binomial_sf(k, n, p)
        assert bound >= exact - 1e-9   # scipy sf and the pmf sum agree to ~1e-12
        assert bound <= exact + 0.05  # the geometric series is tight far in the tail


def test_truncation_delta_does_not_underflow_at_large_epsilon():
    s = BallsInBinsSampler(60000, 100, 1, 1800)
    assert s.overflow_probability() == 0.0            # the float itself underflows ...
    log_p = math.log(100) + _log_binomial_sf(1800, 60001, 0.01)
    assert log_p < -700
    # ... but (1 + e^900) p >= 1 (it was 0.0: the guarantee was understated).
    assert s.truncation_delta(900) == 1.0
    assert s.truncation_delta(700) == pytest.approx(math.exp(log_p + 700), rel=1e-9)
    assert s.truncation_delta(-log_p - 5) == pytest.approx(math.exp(-5) * (1 + math.exp(log_p + 5)), rel=1e-9)
    p = PoissonSampler(60000, 0.01, 100, 1800)
    assert p.truncation_delta(900) == 1.0
    # Ordinary values unchanged: (1 + e^eps) b sf.
    s2 = BallsInBinsSampler(60000, 100, 1, 700)
    assert s2.truncation_delta(1.0) == pytest.approx(
        (1 + math.e) * 100 * scipy.stats.binom.sf(700, 60001, 0.01), rel=1e-12)


# --------------------------------------------------------------------------- randomized response p = 1

def test_replace_one_randomized_response_with_p_one_has_epsilon_zero():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dpjax.interop.dp_accounting import PLDAccountant

    acc = PLDAccountant("REPLACE_ONE").compose(dp_accounting.RandomizedResponseDpEvent(1.0, 2))
    assert acc.get_epsilon(1e-5) == 0.0     # was inf
    assert acc.get_epsilon(1e-10) == 0.0    # was 7506.9
    assert acc.get_delta(0.0) == 0.0        # was 1.0
    # A lossless component changes nothing in a composition.
    both = [(pld.RandomizedResponse(1.0, 2), 3), (pld.RandomizedResponse(0.5, 2), 2)]
    assert pld.epsilon(both, 1e-5).epsilon == pld.epsilon([(pld.RandomizedResponse(0.5, 2), 2)], 1e-5).epsilon


# --------------------------------------------------------------------------- sweep group_size

@pytest.mark.parametrize("bad", [0, False, -1, 1.5])
def test_sweep_mapping_group_size_zero_or_false_is_an_error(bad):
    from dpjax.pld.sweeps.driver import SweepConfig

    with pytest.raises(ValueError, match=r"group_size must be an integer >= 1"):
        SweepConfig.from_mapping(dict(noise_multiplier=1.0, sampling_prob=0.01, steps=10, delta=1e-5,
                                      group_size=bad))
    assert SweepConfig.from_mapping(dict(noise_multiplier=1.0, sampling_prob=0.01, steps=10, delta=1e-5,
                                         group_size=None)).group_size == 1


# --------------------------------------------------------------------------- running accountant state

@pytest.mark.parametrize("state", [
    {"version": 1, "history": 5},
    {"version": 1, "history": [{"a": 1, "b": 2, "c": 3}]},
    {"version": 1, "history": "abc"},
    {"version": 1, "history": [[1.0, 0.01]]},
    {"version": 1, "history": [[1.0, 2.0, 10]]},
])
def test_running_accountant_load_state_dict_validates(state):
    with pytest.raises(ValueError, match=r"history|sample_rate"):
        RunningAccountant().load_state_dict(state)


# --------------------------------------------------------------------------- noise

@pytest.mark.parametrize("coeffs,match", [([1.0, np.nan], "finite"), ([1.0, -5.0], "non-negative"),
                                          ([1.0, np.inf], "finite")])
def test_toeplitz_noise_rejects_what_toeplitz_rejects(coeffs, match):
    from dpjax.matrices import Toeplitz

    with pytest.raises(ValueError, match=match):
        Toeplitz(np.asarray(coeffs))
    with pytest.raises(ValueError, match=r"correlation must be .*" + match):
        toeplitz_noise(np.asarray(coeffs))


def test_noise_multiplier_at_q_one_leaks_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sigma = dpjax.dpsgd_noise_multiplier(1.0, 1, 2.0, 1e-5)
    # q = 1, T = 1: the Gaussian mechanism; its exact epsilon at sigma meets the target.
    from dpjax.numerics.exact import gaussian_epsilon

    assert float(gaussian_epsilon(1e-5, 1.0 / sigma)) <= 2.0


def test_blt_inverse_can_grow_as_the_noise_docstring_says():
    from dpjax.matrices import BLT
    from dpjax.noise import blt_noise

    # float32, as in training: exact here (the entries are dyadic), NaN after ~100 steps.
    noise = blt_noise(BLT(np.array([0.5]), np.array([3.0])))
    state = noise.init({"w": np.zeros((), np.float32)})
    ys = []
    for t in range(6):
        y, state = noise.update({"w": np.float32(1.0 if t == 0 else 0.0)}, state)
        ys.append(float(y["w"]))
    assert ys == pytest.approx([(-2.5) ** 0, -3.0, 7.5, -18.75, 46.875, -117.1875])


# --------------------------------------------------------------------------- calibrate_steps target

def test_calibrate_steps_meets_its_target_and_is_largest():
    t = calibrate_steps(noise_multiplier=1.0, sample_rate=0.01, target_epsilon=1.0, target_delta=1e-5)
    assert dpjax.dpsgd_epsilon(1.0, 0.01, t, 1e-5) <= 1.0 < dpjax.dpsgd_epsilon(1.0, 0.01, t + 1, 1e-5)
