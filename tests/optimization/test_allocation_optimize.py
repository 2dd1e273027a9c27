"""Optimising a banded correlation matrix under random allocation (Feldman & Shenfeld, "Privacy
amplification by random allocation": each epoch, each example takes part in a fresh uniform
``k``-subset of the ``t`` rounds): ``CorrelationProblem(sampling=dpjax.RandomAllocation(t, k),
epochs=E)`` in ``optimize_correlation``; the scheme's own checks (the checks every chain scheme
goes through, on the problem of ``_chain_cases.py``, are in ``test_chain_optimize.py``).

Runs with x64 OFF (the suite's default); the loop's compiled functions are called under
``jax.enable_x64(True)``, as the loop calls them.

Tolerances:

* The exact reduction at ``C = I``, ``k = 1`` (the 1-band family, no parameters): the pair is
  Feldman & Shenfeld's random-allocation pair, which dpjax's PLD accountant brackets to ~1e-3
  relative.  The loop's calibrated sigma solves ``delta_hat = target`` on its 2^13 draws, so the
  PLD delta at that sigma must be the target within 4 standard errors of ``delta_hat`` (the
  standard error measured at that sigma on 2^13 independent draws) plus 1% of the target for the
  bracket.  The certified sigma's PLD delta must be at most the certificate's delta (which fails
  with probability ``failure_probability`` < 1e-3).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys

import numpy as np
import pytest

import dpjax
from dpjax.montecarlo import RandomAllocation
from dpjax.optimization import (CorrelationProblem, OptimizerSettings, certify_result,
                                make_parameterization, optimize_correlation)
from dpjax.pld.allocation.accountant import allocation_accounting

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _chain_cases as cases  # noqa: E402
from _chain_cases import CERTIFY, DELTA, E, EPS, T  # noqa: E402

CASE = cases.CASES["random_allocation"]
N, SCHEME, PROBLEM, PARAM = CASE.n, CASE.problem.sampling, CASE.problem, CASE.param


@pytest.fixture(scope="module")
def run():
    return cases.run("random_allocation")


def test_certify_without_settings_uses_the_chain_accountants_method(run):
    """Without settings: the one method of the chain accountants."""
    default = certify_result(run, progress=False)
    assert default.certificate.method == "bernoulli_kl" and default.certificate.verified


def test_training_setup_refuses_a_random_allocation_result(run):
    from dpjax.optimization import training_setup

    with pytest.raises(ValueError, match="no batch sampler for it"):
        training_setup(run, dataset_size=2000, batch_size=600)


def test_identity_calibration_and_certificate_match_the_exact_accountant():
    """C = I, k = 1: the loop's calibrated sigma is the exact (PLD) random-allocation sigma within
    Monte Carlo error, and the certified sigma's exact delta is at most the certificate's."""
    m = 1 << 13
    problem = CorrelationProblem(sampling=dpjax.RandomAllocation(T), epochs=E, target_epsilon=EPS,
                                 target_delta=DELTA)
    res = optimize_correlation(make_parameterization("banded", N, bands=1), problem,
                               OptimizerSettings(num_steps=0, num_samples=m, key=2), certify=CERTIFY, progress=False)
    ours = res.noise_multiplier_estimate
    se = float(RandomAllocation(np.ones(1), T, E).estimate(ours, EPS, m, key=6).standard_error[0])
    exact = float(allocation_accounting(ours, T, E, target_epsilon=EPS).delta_upper)
    assert abs(exact - DELTA) <= 4 * se + 0.01 * DELTA, (ours, exact, se)
    assert res.first_column == [1.0] + [0.0] * (N - 1) and res.error == pytest.approx(
        math.sqrt((N + 1) / 2), rel=1e-12)  # |A|_F / sqrt(n) of the prefix-sum matrix
    cert = res.certificate
    assert cert.verified and cert.failure_probability < 1e-3
    certified_exact = float(allocation_accounting(res.noise_multiplier, T, E, target_epsilon=EPS).delta_upper)
    assert certified_exact <= cert.delta <= DELTA, (res.noise_multiplier, certified_exact, cert.delta)


@pytest.mark.parametrize("make, match", [
    (lambda: dpjax.RandomAllocation(4, selections_per_epoch=5), r"selections_per_epoch must be an integer >= 1"),
    (lambda: CorrelationProblem(sampling=dpjax.RandomAllocation(64, selections_per_epoch=33), epochs=1,
                                target_epsilon=EPS, target_delta=DELTA), r"selections_per_epoch .*<= 32"),
    (lambda: CorrelationProblem(sampling=SCHEME, target_epsilon=EPS, target_delta=DELTA), "epochs"),
    (lambda: CorrelationProblem(sampling=SCHEME, epochs=0, target_epsilon=EPS, target_delta=DELTA), "epochs"),
    (lambda: CorrelationProblem(sampling=SCHEME, epochs=E, target_epsilon=EPS, target_delta=DELTA,
                                dataset_size=100, batch_size=10), "dataset_size"),
])
def test_bad_records_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_certify_refuses_a_record_of_another_scheme(run):
    """The certify step reads the scheme from the record: a record of another scheme is refused."""
    bad = dataclasses.replace(run, sampling={"scheme": "poisson"})
    with pytest.raises(ValueError, match="result.sampling must be"):
        certify_result(bad, CERTIFY)
