"""Optimising a banded correlation matrix under b-min-sep sampling (Dong & Ganesh, "Privacy
Amplification for BandMF via b-Min-Sep Subsampling"): ``CorrelationProblem(sampling=
dpjax.BMinSepSampling(...))`` in ``optimize_correlation``, its certificate, and bad input.

Runs with x64 OFF (the suite's default); the loop's compiled functions are called under
``jax.enable_x64(True)``, as the loop calls them.

Tolerances:

* Loss reduction: the start ``c_1 = 1`` is far above the optimum of a 2-band ``C`` at this
  target (``c_1 ~ 0.4``: a sweep of ``c_1`` on one 2^13-sample estimate gives ``log RMSE``
  0.85 there against 1.16 at ``c_1 = 1``; 10 steps of SGD(0.5) measured 0.86), so 8 steps
  must lower the loss, measured on one common sample for both matrices (no Monte Carlo noise
  in the difference beyond the smooth dependence of the estimate on ``C``), by more than 0.1.
* Gradient: the step with ``optax.sgd(lr)`` moves the parameters by ``-lr`` times the gradient; it must
  match central differences (``h = 1e-5``) of the step's own loss on the same draws to 1e-5
  relative.  The bisection root is exact to ~1e-14 relative, so the difference quotient's
  round-off is ~1e-9; ``delta_hat`` is piecewise smooth with kinks where a sample's loss
  crosses epsilon, and a step of 1e-5 crosses one with probability ~m * 1e-5 = 0.5%, each
  changing the slope by O(1/m).  A wrong gradient (a dropped ``d sigma*/d C`` term, the
  objective's gradient only, a sign) is off by O(1).
* The p = 1 reduction (b-min-sep with ``p = 1`` from the stationary start is balls-in-bins with
  ``min_sep`` batches per epoch): the two calibrated sigmas, each on its own 2^13-sample
  estimate, agree within 4 combined standard errors of ``delta_hat`` divided by the slope
  ``|d delta_hat / d sigma|`` (a first-order propagation of the delta error to sigma).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dpjax
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BallsInBins, BMinSep
from dpjax.optimization import (CertifySettings, CorrelationProblem, OptimizationResult, OptimizerSettings,
                                certify_result, make_parameterization, optimize_correlation, prefix_sum_error)
from dpjax.optimization import loop

N, B, P, EPS, DELTA, M = 16, 4, 0.25, 2.0, 1e-2, 512
SCHEME = dpjax.BMinSepSampling(min_sep=B, sampling_prob=P, num_rounds=N)
PROBLEM = CorrelationProblem(sampling=SCHEME, target_epsilon=EPS, target_delta=DELTA)
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
    sigma = BMinSep(column, P, B, N).calibrate(EPS, DELTA, 1 << 13, key=9)
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
    assert run.sampling == {"scheme": "b_min_sep", "min_sep": B, "sampling_prob": P, "num_rounds": N,
                            "warm_start": True}
    assert run.batches_per_epoch is None and run.epochs is None and run.estimator == "plain"
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
    back = OptimizationResult.load(path)
    assert back.sampling == run.sampling and back.noise_multiplier == run.noise_multiplier
    # The certify step on the uncertified result gives the same certificate (same default key).
    again = certify_result(dataclasses.replace(back, certificate=None, noise_multiplier=math.nan), CERTIFY)
    assert again.noise_multiplier == run.noise_multiplier


def test_step_gradient_matches_finite_differences_on_common_draws():
    """The b-min-sep step with SGD(lr) moves the parameters by -lr times the gradient of its loss."""
    step, evaluate, _, _ = loop._compiled_b_min_sep(PARAM, SCHEME, M, OPT, prefix_sum_error)
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


def test_a_new_sampling_prob_is_not_a_new_program(caplog):
    """A new query must not mean a new program: two optimisations that differ only in
    ``sampling_prob`` share the compiled step and evaluate programs (``p`` is an argument of the
    programs, not a constant baked into them).

    Counted during the second run only, after the first has compiled (or loaded) everything:
    the programs JAX lowers and compiles -- the ``"Compiling jit(...)"`` records of
    ``jax.log_compiles``, one per jit-cache miss, whether XLA then compiles the program or loads
    it from the session's persistent compilation cache -- and the XLA backend compiles (the
    ``/jax/core/compile/backend_compile_duration`` events).  Both must be zero; before the fix
    the second run compiled ``jit(_chain_step)`` and ``jit(evaluate)`` again."""
    events, active = [], [False]

    def listener(name, secs, **kwargs):
        if active[0] and name == "/jax/core/compile/backend_compile_duration":
            events.append(secs)

    def optimise(p):
        problem = CorrelationProblem(sampling=dpjax.BMinSepSampling(B, p, N), target_epsilon=EPS,
                                     target_delta=DELTA)
        settings = OptimizerSettings(num_steps=2, num_samples=M, optimizer=OPT, init_params=START, key=5)
        return optimize_correlation(PARAM, problem, settings, certify=False, progress=False)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        first = optimise(0.3)
        with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
            caplog.clear()
            active[0] = True
            second = optimise(0.35)
            active[0] = False
    finally:
        active[0] = False
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(listener)
    compiled = [r.getMessage().split(" with ")[0] for r in caplog.records if r.getMessage().startswith("Compiling ")]
    assert compiled == [] and events == [], (compiled, len(events))
    assert first.status == second.status == "completed"
    # The program reads the p it is given: more participation, more noise.
    assert second.noise_multiplier_estimate > first.noise_multiplier_estimate


@pytest.mark.slow
def test_p_one_calibration_is_balls_in_bins():
    """At sampling_prob = 1 and min_sep = b the loop's calibrated sigma is balls-in-bins' with b
    batches per epoch (Dong & Ganesh's reduction), within Monte Carlo error."""
    m, column = 1 << 13, np.array([1.0, 0.5])
    scheme = dpjax.BMinSepSampling(min_sep=B, sampling_prob=1.0, num_rounds=N)
    problem = CorrelationProblem(sampling=scheme, target_epsilon=EPS, target_delta=DELTA)
    res = optimize_correlation(PARAM, problem, OptimizerSettings(num_steps=0, num_samples=m, key=2,
                                                                 init_params={"coeffs": [math.log(math.expm1(0.5))]}),
                               certify=False, progress=False)
    ours = res.noise_multiplier_estimate
    bib = BallsInBins(column, B, N // B)
    theirs = bib.calibrate(EPS, DELTA, m, key=5)
    acc = BMinSep(column, 1.0, B, N)
    se_ours = float(acc.estimate(ours, EPS, m, key=6).standard_error[0])
    se_theirs = float(bib.estimate(theirs, EPS, m, key=7).standard_error[0])
    d_lo, d_hi = (float(acc.estimate(s, EPS, 1 << 15, key=8).delta[0]) for s in (0.98 * ours, 1.02 * ours))
    slope = abs(d_hi - d_lo) / (0.04 * ours)
    assert math.isnan(res.noise_multiplier) and res.certificate is None
    assert abs(ours - theirs) <= 4 * math.hypot(se_ours, se_theirs) / slope, (ours, theirs)


@pytest.mark.parametrize("make, match", [
    (lambda: dpjax.BMinSepSampling(min_sep=0, sampling_prob=0.5, num_rounds=8), r"min_sep must be an integer >= 1"),
    (lambda: dpjax.BMinSepSampling(min_sep=2.5, sampling_prob=0.5, num_rounds=8), "min_sep"),
    (lambda: dpjax.BMinSepSampling(min_sep=2, sampling_prob=0.0, num_rounds=8), r"sampling_prob must be in \(0, 1\]"),
    (lambda: dpjax.BMinSepSampling(min_sep=2, sampling_prob=1.5, num_rounds=8), "sampling_prob"),
    (lambda: dpjax.BMinSepSampling(min_sep=2, sampling_prob=0.5, num_rounds=0), "num_rounds"),
    (lambda: CorrelationProblem(sampling=SCHEME, epochs=4, target_epsilon=EPS, target_delta=DELTA), "epochs"),
    (lambda: CorrelationProblem(sampling=SCHEME, target_epsilon=EPS, target_delta=DELTA, dataset_size=100,
                                batch_size=10), "dataset_size"),
    (lambda: CorrelationProblem(sampling=SCHEME, target_delta=DELTA), "target_epsilon"),
    (lambda: CorrelationProblem(sampling=dpjax.BallsInBins(4), target_epsilon=EPS, target_delta=DELTA), "epochs"),
    (lambda: CorrelationProblem(sampling=dpjax.Poisson(0.1), epochs=1, target_epsilon=EPS, target_delta=DELTA),
     "sampling must be"),
])
def test_bad_records_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("param, certify, match", [
    (make_parameterization("blt", N, num_buffers=2), True, "BLT correlation matrix is not banded"),
    (make_parameterization("banded", N, bands=B + 1), True, "5 bands but min_sep = 4"),
    (make_parameterization("toeplitz", N), True, "16 bands but min_sep = 4"),
    (make_parameterization("banded", 2 * N, bands=2), True, "num_rounds = 16"),
    (PARAM, CertifySettings(num_samples=1 << 14), "method must be 'bernoulli_kl'"),
    (PARAM, CertifySettings(num_samples=64, method="bernoulli_kl"), "certify_samples >="),
])
def test_bad_input_is_refused_before_any_step(param, certify, match):
    with pytest.raises(ValueError, match=match):
        optimize_correlation(param, PROBLEM, OptimizerSettings(num_steps=1, num_samples=M), certify=certify,
                             progress=False)


def test_killed_run_resumes_to_the_identical_result(tmp_path):
    """Checkpoints and resume come through the loop the balls-in-bins path uses: two steps, a
    checkpoint, then a resumed run to four steps equals an uninterrupted four-step run."""
    def settings(steps):
        return OptimizerSettings(num_steps=steps, num_samples=M, optimizer=OPT, init_params=START, key=11)

    whole = optimize_correlation(PARAM, PROBLEM, settings(4), certify=False, progress=False)
    path = tmp_path / "ck.json"
    optimize_correlation(PARAM, PROBLEM, settings(2), certify=False, progress=False,
                         checkpoint=loop.Checkpoint(path, every=2))
    resumed = optimize_correlation(PARAM, PROBLEM, settings(4), certify=False, progress=False,
                                   checkpoint=loop.Checkpoint(path, every=2, resume=True))
    assert resumed.params == whole.params and resumed.history == whole.history
    other = CorrelationProblem(sampling=dpjax.BMinSepSampling(B, 0.5, N), target_epsilon=EPS, target_delta=DELTA)
    with pytest.raises(ValueError, match="different configuration"):
        optimize_correlation(PARAM, other, settings(4), certify=False, progress=False,
                             checkpoint=loop.Checkpoint(path, every=2, resume=True))


def test_training_setup_draws_b_min_sep_batches(run):
    """The training loop of a b-min-sep result samples b-min-sep batches (the scheme certified)
    and pays the truncation term of its fixed batch shape on top of the certificate's delta."""
    from dpjax.optimization import training_setup
    from dpjax.sampling import BMinSepSampler

    setup = training_setup(run, dataset_size=2000, batch_size=400, seed=1)
    assert isinstance(setup.sampler, BMinSepSampler)
    assert (setup.sampler.sampling_prob, setup.sampler.min_sep, setup.sampler.steps) == (P, B, N)
    assert setup.noise_multiplier == run.noise_multiplier
    assert setup.truncation_delta == setup.sampler.truncation_delta(EPS) > 0
    assert setup.delta == run.certificate.delta + setup.truncation_delta
