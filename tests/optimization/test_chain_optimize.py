"""Optimising a banded correlation matrix under the chain schemes (b-min-sep sampling, random
allocation; the problems of ``_chain_cases.py``): the checks every scheme goes through, run on
one table of schemes.  The schemes' own checks (reductions to exact accountants, resume, the
training sampler, bad input) are in ``test_bminsep_optimize.py`` and
``test_allocation_optimize.py``.

Runs with x64 OFF (the suite's default); the loop's compiled functions are called under
``jax.enable_x64(True)``, as the loop calls them.

Tolerances:

* Loss reduction: the start ``c_1 = 1`` is far above the optimum of a 2-band ``C`` at this
  target.  b-min-sep: ``c_1 ~ 0.4`` (a sweep of ``c_1`` on one 2^13-sample estimate gives
  ``log RMSE`` 0.85 there against 1.16 at ``c_1 = 1``; 10 steps of SGD(0.5) measured 0.86).
  Random allocation: 1.57 at ``c_1 = 1``, 1.34 at 0.7 and 1.24-1.28 for ``c_1`` in [0.2, 0.5].
  So 8 steps must lower the loss, measured on one common sample for both matrices (no Monte
  Carlo noise in the difference beyond the smooth dependence of the estimate on ``C``), by more
  than 0.1.
* Gradient: the step with ``optax.sgd(lr)`` moves the parameters by ``-lr`` times the gradient;
  it must match central differences (``h = 1e-5``) of the step's own loss on the same draws to
  1e-5 relative.  The bisection root is exact to ~1e-14 relative, so the difference quotient's
  round-off is ~1e-9; ``delta_hat`` is piecewise smooth with kinks where a sample's loss crosses
  epsilon, and a step of 1e-5 crosses one with probability ~m * 1e-5 = 0.5%, each changing the
  slope by O(1/m).  A wrong gradient (a dropped ``d sigma*/d C`` term, the objective's gradient
  only, a sign) is off by O(1).
* Certificate: the ladder starts at the estimate and climbs 2% per rung, so the certified sigma
  is within a factor 0.8-1.25 of the estimate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

from dpjax.calibration import Bisection
from dpjax.optimization import (CertifySettings, OptimizationResult, OptimizerSettings, certify_result,
                                make_parameterization, optimize_correlation, prefix_sum_error)
from dpjax.optimization import loop

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import _chain_cases as cases  # noqa: E402


@pytest.mark.parametrize("name", cases.NAMES)
def test_optimisation_lowers_the_loss(name):
    case, run = cases.CASES[name], cases.run(name)
    assert run.status == "completed" and len(run.history) == 8
    start = cases.log_rmse_on_common_draws(case, [1.0, 1.0])
    end = cases.log_rmse_on_common_draws(case, run.first_column)
    assert end < start - 0.1, (start, end, run.first_column[:2])
    assert run.first_column[1] < 1.0 and all(c == 0.0 for c in run.first_column[2:])


@pytest.mark.parametrize("name", cases.NAMES)
def test_result_records_the_scheme_and_its_certificate(name, tmp_path):
    case, run = cases.CASES[name], cases.run(name)
    assert run.sampling == case.sampling
    assert (run.batches_per_epoch, run.epochs, run.estimator) == case.periods + ("plain",)
    assert run.dataset_size is None and run.truncation_delta == 0.0
    cert = run.certificate
    assert cert.verified and cert.method == "bernoulli_kl" and cert.num_samples == 1 << 14
    assert cert.epsilon == cases.EPS and cert.delta <= cases.DELTA and 0 < cert.failure_probability < cases.DELTA
    assert run.noise_multiplier == cert.noise_multiplier and math.isfinite(run.noise_multiplier)
    assert run.rmse == pytest.approx(run.noise_multiplier * run.error, rel=1e-14)
    assert 0.8 < run.noise_multiplier / run.noise_multiplier_estimate < 1.25
    # float32 callers (x64 off) get float64 answers.
    assert isinstance(run.noise_multiplier, float) and isinstance(run.first_column[1], float)
    path = tmp_path / "r.json"
    run.to_json(path)
    assert json.loads(path.read_text())["sampling"]["scheme"] == name
    back = OptimizationResult.load(path)
    assert back.sampling == run.sampling and back.noise_multiplier == run.noise_multiplier
    # The certify step on the uncertified result gives the same certificate (same default key).
    again = certify_result(dataclasses.replace(back, certificate=None, noise_multiplier=math.nan), cases.CERTIFY)
    assert again.noise_multiplier == run.noise_multiplier


@pytest.mark.parametrize("name", cases.NAMES)
def test_step_gradient_matches_finite_differences_on_common_draws(name):
    """The scheme's step with SGD(lr) moves the parameters by -lr times the gradient of its loss."""
    case, lr = cases.CASES[name], cases.LR
    step, evaluate, _, _ = loop._compiled_chain(case.param, loop._Chain.of_problem(case.problem), cases.M,
                                                cases.OPT, prefix_sum_error)
    with jax.enable_x64(True):
        key = jax.random.key(3)
        params = {"coeffs": jnp.asarray(cases.START["coeffs"])}
        new, _, loss, aux, finite = step(params, cases.OPT.init(params), cases.EPS, cases.DELTA, key, 7, math.nan,
                                         None)
        grad = float(params["coeffs"][0] - new["coeffs"][0]) / lr

        def value(x):
            return float(evaluate({"coeffs": jnp.asarray([x])}, cases.EPS, cases.DELTA, key, 7, math.nan, None)[0])

        x0, h = float(cases.START["coeffs"][0]), 1e-5
        fd = (value(x0 + h) - value(x0 - h)) / (2 * h)
        assert float(loss) == pytest.approx(value(x0), rel=1e-12)
    assert bool(finite) and int(aux[3]) == 0
    assert grad == pytest.approx(fd, rel=1e-5), (grad, fd)
    assert grad > 0  # c_1 = 1 is above the optimum: the loss falls as c_1 falls


@pytest.mark.parametrize("name", cases.NAMES)
@pytest.mark.parametrize("field, value", [("resample_every", 1), ("num_candidates", 64), ("precompute", False),
                                          ("solver", Bisection())])
def test_settings_the_chain_path_does_not_use_are_refused(name, field, value):
    """Each step calibrates by bisection on fresh draws: a screen, materialised projections or a
    solver choice would be ignored, so setting one is refused before any step, naming it."""
    case = cases.CASES[name]
    settings = OptimizerSettings(num_steps=1, num_samples=cases.M, **{field: value})
    with pytest.raises(ValueError, match=f"^{field}: not used under"):
        optimize_correlation(case.param, case.problem, settings, certify=False, progress=False)


# (scheme, the parameterization of n rounds, certify=, what the error must say)
BAD_INPUT = [
    ("b_min_sep", lambda n: make_parameterization("blt", n, num_buffers=2), True,
     "BLT correlation matrix is not banded"),
    ("b_min_sep", lambda n: make_parameterization("banded", n, bands=cases.MIN_SEP + 1), True,
     "5 bands but min_sep = 4"),
    ("b_min_sep", lambda n: make_parameterization("toeplitz", n), True, "16 bands but min_sep = 4"),
    ("b_min_sep", lambda n: make_parameterization("banded", 2 * n, bands=2), True, "num_rounds = 16"),
    ("b_min_sep", None, CertifySettings(num_samples=1 << 14), "method must be 'bernoulli_kl'"),
    ("b_min_sep", None, CertifySettings(num_samples=64, method="bernoulli_kl"), "certify_samples >="),
    ("random_allocation", lambda n: make_parameterization("blt", n, num_buffers=2), True,
     "BLT correlation matrix is not banded"),
    ("random_allocation", lambda n: make_parameterization("banded", n, bands=7), True,
     "7 bands but dpjax.montecarlo.allocation.MAX_BANDS = 6"),
    ("random_allocation", lambda n: make_parameterization("toeplitz", n), True, "8 bands but"),
    ("random_allocation", lambda n: make_parameterization("banded", 2 * n, bands=2), True,
     r"batches_per_epoch \* epochs .* = 8"),
    ("random_allocation", None, CertifySettings(num_samples=1 << 14),
     "method must be 'bernoulli_kl' for random allocation"),
    ("random_allocation", None, CertifySettings(num_samples=64, method="bernoulli_kl"), "certify_samples >="),
]


@pytest.mark.parametrize("name, make, certify, match", BAD_INPUT)
def test_bad_input_is_refused_before_any_step(name, make, certify, match):
    """A family the scheme's accountant cannot take, a C of the wrong size, a certificate method
    or sample count it cannot release: refused before any step (``make`` None: the case's own
    2-band family)."""
    case = cases.CASES[name]
    param = case.param if make is None else make(case.n)
    with pytest.raises(ValueError, match=match):
        optimize_correlation(param, case.problem, OptimizerSettings(num_steps=1, num_samples=cases.M),
                             certify=certify, progress=False)
