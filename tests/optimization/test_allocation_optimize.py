"""Optimising a banded correlation matrix under random allocation (Feldman & Shenfeld, "Privacy
amplification by random allocation": each epoch, each example takes part in a fresh uniform
``k``-subset of the ``t`` rounds): ``CorrelationProblem(sampling=dpjax.RandomAllocation(t, k),
epochs=E)`` in ``optimize_correlation``, its certificate, and bad input.

Runs with x64 OFF (the suite's default); the loop's compiled functions are called under
``jax.enable_x64(True)``, as the loop calls them.

Tolerances:

* Loss reduction (t = 4, k = 2, E = 2, 2 bands): the start ``c_1 = 1`` is far above the optimum
  at this target (a sweep of ``c_1`` on one 2^13-sample estimate gives ``log RMSE`` 1.57 at
  ``c_1 = 1``, 1.34 at 0.7 and 1.24-1.28 for ``c_1`` in [0.2, 0.5]), so 8 SGD steps must lower
  the loss, measured on one common sample for both matrices (no Monte Carlo noise in the
  difference beyond the smooth dependence of the estimate on ``C``), by more than 0.1.
* Gradient: the step with ``optax.sgd(lr)`` moves the parameters by ``-lr`` times the gradient;
  it must match central differences (``h = 1e-5``) of the step's own loss on the same draws to
  1e-5 relative.  The bisection root is exact to ~1e-14 relative, so the difference quotient's
  round-off is ~1e-9; ``delta_hat`` is piecewise smooth with kinks where a sample's loss crosses
  epsilon, and a step of 1e-5 crosses one with probability ~m * 1e-5 = 0.5%, each changing the
  slope by O(1/m).  A wrong gradient (a dropped ``d sigma*/d C`` term, the objective's gradient
  only, a sign) is off by O(1).
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
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import RandomAllocation
from dpjax.optimization import (CertifySettings, CorrelationProblem, OptimizationResult, OptimizerSettings,
                                certify_result, make_parameterization, optimize_correlation, prefix_sum_error)
from dpjax.optimization import loop
from dpjax.pld.allocation.accountant import allocation_accounting

T, K, E, EPS, DELTA, M = 4, 2, 2, 2.0, 1e-2, 512
N = T * E
SCHEME = dpjax.RandomAllocation(T, selections_per_epoch=K)
PROBLEM = CorrelationProblem(sampling=SCHEME, epochs=E, target_epsilon=EPS, target_delta=DELTA)
PARAM = make_parameterization("banded", N, bands=2)
START = {"coeffs": np.array([math.log(math.expm1(1.0))])}  # c_1 = 1 (softplus)
CERTIFY = CertifySettings(num_samples=1 << 14, method="bernoulli_kl")
# One optimizer object: the run and the gradient test share one compiled step.
LR = 0.5
OPT = optax.sgd(LR)


@pytest.fixture(scope="module")
def run():
    settings = OptimizerSettings(num_steps=8, num_samples=M, optimizer=OPT, init_params=START, key=4)
    return optimize_correlation(PARAM, PROBLEM, settings, certify=CERTIFY, progress=False)


def _log_rmse_on_common_draws(column):
    column = np.asarray(column, np.float64)[:2]
    sigma = RandomAllocation(column, T, E, selections_per_epoch=K).calibrate(EPS, DELTA, 1 << 13, key=9)
    with jax.enable_x64(True):
        err = float(prefix_sum_error(Toeplitz(jnp.asarray(column)), N))
    return math.log(sigma * err)


def test_optimisation_lowers_the_loss(run):
    assert run.status == "completed" and len(run.history) == 8
    start = _log_rmse_on_common_draws([1.0, 1.0])
    end = _log_rmse_on_common_draws(run.first_column)
    assert end < start - 0.1, (start, end, run.first_column[:2])
    assert run.first_column[1] < 1.0 and all(c == 0.0 for c in run.first_column[2:])


def test_result_records_the_scheme_and_its_certificate(run, tmp_path):
    assert run.sampling == {"scheme": "random_allocation", "batches_per_epoch": T, "selections_per_epoch": K,
                            "epochs": E}
    assert (run.batches_per_epoch, run.epochs, run.estimator) == (T, E, "plain")
    assert run.dataset_size is None and run.truncation_delta == 0.0
    cert = run.certificate
    assert cert.verified and cert.method == "bernoulli_kl" and cert.num_samples == 1 << 14
    assert cert.epsilon == EPS and cert.delta <= DELTA and 0 < cert.failure_probability < DELTA
    assert run.noise_multiplier == cert.noise_multiplier and math.isfinite(run.noise_multiplier)
    assert run.rmse == pytest.approx(run.noise_multiplier * run.error, rel=1e-14)
    # The ladder starts at the estimate and climbs 2% per rung: the certified sigma is near it.
    assert 0.8 < run.noise_multiplier / run.noise_multiplier_estimate < 1.25
    # float32 callers (x64 off) get float64 answers.
    assert isinstance(run.noise_multiplier, float) and isinstance(run.first_column[1], float)
    path = tmp_path / "r.json"
    run.to_json(path)
    assert json.loads(path.read_text())["sampling"]["scheme"] == "random_allocation"
    back = OptimizationResult.load(path)
    assert back.sampling == run.sampling and back.noise_multiplier == run.noise_multiplier
    # The certify step on the uncertified result gives the same certificate (same default key).
    again = certify_result(dataclasses.replace(back, certificate=None, noise_multiplier=math.nan), CERTIFY)
    assert again.noise_multiplier == run.noise_multiplier
    # Without settings: the one method of the chain accountants.
    default = certify_result(back, progress=False)
    assert default.certificate.method == "bernoulli_kl" and default.certificate.verified


def test_training_setup_refuses_a_random_allocation_result(run):
    from dpjax.optimization import training_setup

    with pytest.raises(ValueError, match="no batch sampler for it"):
        training_setup(run, dataset_size=2000, batch_size=600)


def test_step_gradient_matches_finite_differences_on_common_draws():
    """The random-allocation step with SGD(lr) moves the parameters by -lr times the gradient of its loss."""
    step, evaluate, _, _ = loop._compiled_chain(PARAM, loop._Chain(SCHEME, E), M, OPT, prefix_sum_error)
    with jax.enable_x64(True):
        key = jax.random.key(3)
        params = {"coeffs": jnp.asarray(START["coeffs"])}
        new, _, loss, aux, finite = step(params, OPT.init(params), EPS, DELTA, key, 7, math.nan, None)
        grad = float(params["coeffs"][0] - new["coeffs"][0]) / LR

        def value(x):
            return float(evaluate({"coeffs": jnp.asarray([x])}, EPS, DELTA, key, 7, math.nan, None)[0])

        x0, h = float(START["coeffs"][0]), 1e-5
        fd = (value(x0 + h) - value(x0 - h)) / (2 * h)
        assert float(loss) == pytest.approx(value(x0), rel=1e-12)
    assert bool(finite) and int(aux[3]) == 0
    assert grad == pytest.approx(fd, rel=1e-5), (grad, fd)
    assert grad > 0  # c_1 = 1 is above the optimum: the loss falls as c_1 falls


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


@pytest.mark.parametrize("param, certify, match", [
    (make_parameterization("blt", N, num_buffers=2), True, "BLT correlation matrix is not banded"),
    (make_parameterization("banded", N, bands=7), True, "7 bands but dpjax.montecarlo.allocation.MAX_BANDS = 6"),
    (make_parameterization("toeplitz", N), True, "8 bands but"),
    (make_parameterization("banded", 2 * N, bands=2), True, r"batches_per_epoch \* epochs .* = 8"),
    (PARAM, CertifySettings(num_samples=1 << 14), "method must be 'bernoulli_kl' for random allocation"),
    (PARAM, CertifySettings(num_samples=64, method="bernoulli_kl"), "certify_samples >="),
])
def test_bad_input_is_refused_before_any_step(param, certify, match):
    with pytest.raises(ValueError, match=match):
        optimize_correlation(param, PROBLEM, OptimizerSettings(num_steps=1, num_samples=M), certify=certify,
                             progress=False)


def test_certify_refuses_a_record_of_another_scheme(run):
    """The certify step reads the scheme from the record: a record of another scheme is refused."""
    bad = dataclasses.replace(run, sampling={"scheme": "poisson"})
    with pytest.raises(ValueError, match="result.sampling must be"):
        certify_result(bad, CERTIFY)
