"""Optimising a banded correlation matrix under b-min-sep sampling (Dong & Ganesh, "Privacy
Amplification for BandMF via b-Min-Sep Subsampling"): ``CorrelationProblem(sampling=
dpjax.BMinSepSampling(...))`` in ``optimize_correlation``; the scheme's own checks (the checks
every chain scheme goes through, on the problem of ``_chain_cases.py``, are in
``test_chain_optimize.py``).

Runs with x64 OFF (the suite's default); the loop's compiled functions are called under
``jax.enable_x64(True)``, as the loop calls them.

Tolerances:

* The p = 1 reduction (b-min-sep with ``p = 1`` from the stationary start is balls-in-bins with
  ``min_sep`` batches per epoch): the two calibrated sigmas, each on its own 2^13-sample
  estimate, agree within 4 combined standard errors of ``delta_hat`` divided by the slope
  ``|d delta_hat / d sigma|`` (a first-order propagation of the delta error to sigma).
"""

from __future__ import annotations

import logging
import math
import pathlib
import sys

import jax
import numpy as np
import pytest

import dpjax
from dpjax.montecarlo import BallsInBins, BMinSep
from dpjax.optimization import (CorrelationProblem, OptimizerSettings, optimize_correlation)
from dpjax.optimization import loop

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _chain_cases as cases  # noqa: E402
from _chain_cases import DELTA, EPS, M, OPT, START  # noqa: E402

CASE = cases.CASES["b_min_sep"]
N, B, P = cases.N_B, cases.MIN_SEP, cases.P
SCHEME, PROBLEM, PARAM = CASE.problem.sampling, CASE.problem, CASE.param


@pytest.fixture(scope="module")
def run():
    return cases.run("b_min_sep")


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
