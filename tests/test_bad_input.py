"""Hostile inputs to the Python API: each is refused with one ``ValueError``
line naming the argument (never an OverflowError / TypeError / IndexError / NumPy message, a
silent coercion, or a wrong number), or -- where a correct finite answer exists -- answered.

The CLI rows of the same table (exit 2, one line) live with the CLI tests.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import dpjax
from dpjax import pld
from dpjax.matrices import Toeplitz, prefix_sum_rmse
from dpjax.montecarlo import BallsInBins

_ACC = BallsInBins(Toeplitz(np.array([1.0, 0.5])), 2, 1)

# (id, call, the argument the message must name)
CASES = [
    ("steps=2**63", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, 2**63, 1e-5), "steps"),
    ("steps=1e300", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, 1e300, 1e-5), "steps"),
    ("steps=inf", lambda: pld.dpsgd_accounting(1.0, 0.01, float("inf"), target_delta=1e-5), "steps"),
    ("steps=True epsilon", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, True, 1e-5), "steps"),
    ("steps=True delta", lambda: dpjax.dpsgd_delta(1.0, 0.01, True, 1.0), "steps"),
    ("steps=True group", lambda: dpjax.group_epsilon(1.0, 0.01, True, 1e-5, group_size=2), "steps"),
    ("steps=True calibration", lambda: dpjax.dpsgd_noise_multiplier(0.01, True, 1.0, 1e-5), "steps"),
    ("steps='100'", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, "100", 1e-5), "steps"),
    ("target_delta=[]", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, 100, []), "target_delta"),
    ("target_delta=[] accounting", lambda: pld.dpsgd_accounting(1.0, 0.01, 100, target_delta=[]), "target_delta"),
    ("target_epsilon=[] calibration", lambda: dpjax.dpsgd_noise_multiplier(0.01, 100, [], 1e-5), "target_epsilon"),
    ("noise_multiplier='1'", lambda: dpjax.dpsgd_epsilon("1", 0.01, 100, 1e-5), "noise_multiplier"),
    ("noise_multiplier=b'1'", lambda: dpjax.dpsgd_epsilon(b"1", 0.01, 100, 1e-5), "noise_multiplier"),
    ("noise_multiplier=True", lambda: dpjax.dpsgd_epsilon(True, 0.01, 100, 1e-5), "noise_multiplier"),
    ("noise_multiplier=1+0j", lambda: dpjax.dpsgd_epsilon(1 + 1j, 0.01, 100, 1e-5), "noise_multiplier"),
    ("sampling_prob='0.1'", lambda: dpjax.dpsgd_epsilon(1.0, "0.1", 100, 1e-5), "sampling_prob"),
    ("target_delta=nan", lambda: dpjax.dpsgd_epsilon(1.0, 0.01, 100, float("nan")), "target_delta"),
    ("key='a'", lambda: _ACC.delta(1.0, 1.0, 16, "a"), "key"),
    ("key=2**70", lambda: _ACC.delta(1.0, 1.0, 16, 2**70), "key"),
    ("key=-1", lambda: _ACC.delta(1.0, 1.0, 16, -1), "key"),
    ("key=1.5", lambda: _ACC.delta(1.0, 1.0, 16, 1.5), "key"),
    ("key=None", lambda: _ACC.delta(1.0, 1.0, 16, None), "key"),
    ("complex correlation (BallsInBins)",
     lambda: BallsInBins(np.array([[1.0, 0.0], [0.5j, 1.0]]), 2, 1), "correlation"),
    ("complex correlation (prefix_sum_rmse)",
     lambda: prefix_sum_rmse(np.array([[1.0, 0.0], [0.5 + 1j, 1.0]]), 1.0), "correlation"),
    ("prefix_sum_rmse sigma=-1", lambda: prefix_sum_rmse(Toeplitz(np.array([1.0, 0.5])), -1.0, 8),
     "noise_multiplier"),
    ("prefix_sum_rmse sigma=0", lambda: prefix_sum_rmse(Toeplitz(np.array([1.0, 0.5])), 0.0, 8),
     "noise_multiplier"),
    # Traced calls validate their concrete arguments at trace time, before anything runs.
    ("dpsgd_epsilon under jit, target_delta=2", lambda: jax.jit(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 100, 2.0))(1.0),
     "target_delta"),
    ("dpsgd_noise_multiplier under grad, q=1.5",
     lambda: jax.grad(lambda e: dpjax.dpsgd_noise_multiplier(1.5, 100, e, 1e-5))(1.0), "sampling_prob"),
]


@pytest.mark.parametrize("call,name", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_with_one_line_naming_the_argument(call, name):
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert name in msg, msg
    assert "\n" not in msg, msg


@pytest.mark.parametrize("sigma", [1e150, 1e300])
def test_huge_noise_is_answered_not_crashed(sigma):
    # The dominating Gaussian (q taken as 1) has mu = sqrt(100) / sigma <= 1e-149, whose
    # epsilon at delta 1e-5 is exactly 0 (delta(0) = 2 Phi(mu / 2) - 1 < 1e-149): so is DP-SGD's.
    # It used to fail with "cannot convert float NaN to integer" (a NaN FFT size).
    assert dpjax.dpsgd_epsilon(sigma, 0.01, 100, 1e-5) == 0.0
    res = pld.dpsgd_accounting(sigma, 0.01, 100, target_delta=1e-5)
    assert res.epsilon_lower == 0.0 and res.reason is None
    d = pld.dpsgd_accounting(sigma, 0.01, 100, target_epsilon=0.5)
    assert 0.0 <= d.delta_lower <= d.delta <= 1e-140


@pytest.mark.slow
def test_largest_steps_is_accepted_and_sound():
    # 2**53 is the documented maximum: answered (finite via the dominating Gaussian, or inf with a
    # reason) rather than an OverflowError.  mu = sqrt(2**53) / 1e9 ~ 0.095 here.
    res = pld.dpsgd_accounting(1e9, 0.5, 2**53, target_delta=1e-5)
    assert np.isfinite(res.epsilon) and res.epsilon > 0
    exact_dominating = float(pld.gaussian_epsilon(1e-5, 2**26.5 / 1e9))
    assert res.epsilon <= exact_dominating * (1 + 1e-12)


def test_valid_inputs_still_pass():
    # Integral floats and NumPy integers are fine for counts; NumPy scalars for reals.
    a = dpjax.dpsgd_epsilon(np.float64(1.0), 0.01, np.int64(100), 1e-5)
    b = dpjax.dpsgd_epsilon(1.0, 0.01, 100.0, 1e-5)
    assert a == b and np.isfinite(a)
    d2, _ = _ACC.delta(1.0, 1.0, 16, 3)
    d3, _ = _ACC.delta(1.0, 1.0, 16, jax.random.key(3))
    np.testing.assert_array_equal(d2, d3)
