"""The records of an optimisation (CorrelationProblem, OptimizerSettings, Checkpoint,
CertifySettings): each bad field is refused with a ValueError naming it, and the certify step
composes with an uncertified run to exactly the certified run."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

import dpjax
from dpjax.matrices import Toeplitz
from dpjax.optimization import (CertifySettings, Checkpoint, CorrelationProblem, OptimizationResult,
                                OptimizerSettings, certify_noise, certify_result, make_parameterization,
                                optimize_correlation)
from dpjax.optimization.certify import sampler_terms

B, E = 4, 2
PROBLEM = CorrelationProblem(sampling=dpjax.BallsInBins(B), epochs=E, target_epsilon=2.0, target_delta=1e-3)
SETTINGS = OptimizerSettings(num_steps=2, num_samples=256, key=5)


def _param():
    return make_parameterization("blt", B * E, num_buffers=2)


def _problem(**kw):
    return CorrelationProblem(**{"sampling": dpjax.BallsInBins(B), "epochs": E, "target_epsilon": 2.0,
                                 "target_delta": 1e-3, **kw})


@pytest.mark.parametrize("make,name", [
    (lambda: _problem(sampling=4), "sampling"),
    (lambda: _problem(sampling=dpjax.Poisson(0.1)), "sampling"),
    (lambda: _problem(epochs=0), "epochs"),
    (lambda: _problem(epochs=1.5), "epochs"),
    (lambda: _problem(target_epsilon=0.0), "target_epsilon"),
    (lambda: _problem(target_delta=1.0), "target_delta"),
    (lambda: _problem(objective="prefix"), "objective"),
    (lambda: _problem(dataset_size=400), "dataset_size"),
    (lambda: _problem(dataset_size=400, batch_size=0), "batch_size"),
    (lambda: _problem(dataset_size=400, batch_size=101), "batch_size"),  # truncates too often
    (lambda: OptimizerSettings(num_steps=-1), "num_steps"),
    (lambda: OptimizerSettings(optimizer="adam"), "optimizer"),
    (lambda: OptimizerSettings(num_samples=0), "num_samples"),
    (lambda: OptimizerSettings(estimator="exact"), "estimator"),
    (lambda: OptimizerSettings(resample_every=0), "resample_every"),
    (lambda: OptimizerSettings(num_candidates=0), "num_candidates"),
    (lambda: OptimizerSettings(precompute="yes"), "precompute"),
    (lambda: OptimizerSettings(solver="newton"), "solver"),
    (lambda: OptimizerSettings(key=-1), "key"),
    (lambda: OptimizerSettings(key="seed"), "key"),
    (lambda: Checkpoint(None), "path"),
    (lambda: Checkpoint(""), "path"),
    (lambda: Checkpoint("ck.json", every=0), "every"),
    (lambda: Checkpoint("ck.json", resume="yes"), "resume"),
    (lambda: CertifySettings(num_samples=0), "num_samples"),
    (lambda: CertifySettings(key=1.5), "key"),
    (lambda: CertifySettings(max_attempts=0), "max_attempts"),
    (lambda: CertifySettings(growth=1.0), "growth"),
    (lambda: CertifySettings(method="hoeffding"), "method"),
    (lambda: CertifySettings(calibration_samples=0), "calibration_samples"),
])
def test_a_bad_field_is_refused_naming_it(make, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        make()


def test_records_normalise_and_default():
    problem = _problem(target_epsilon=2, dataset_size=400.0, batch_size=140)
    assert problem.target_epsilon == 2.0 and isinstance(problem.target_epsilon, float)
    assert (problem.dataset_size, problem.batch_size) == (400, 140) and problem.n == B * E
    assert problem.sampler == sampler_terms(400, 140, B, 2.0, 1e-3)
    assert OptimizerSettings().samples_per_step == 1 << 11
    assert OptimizerSettings(estimator="plain").samples_per_step == 1 << 13
    assert OptimizerSettings(num_samples=512.0).num_samples == 512
    assert CertifySettings().method == "importance_betting" and CertifySettings(growth=2).growth == 2.0
    assert Checkpoint("ck.json").every == 25 and not Checkpoint("ck.json").resume


def test_optimize_correlation_refuses_arguments_of_the_wrong_kind(tmp_path):
    p = _param()
    for kw, name in ((dict(problem={"epochs": E}), "problem"), (dict(settings={"num_steps": 2}), "settings"),
                     (dict(checkpoint=str(tmp_path / "ck.json")), "checkpoint"), (dict(certify="yes"), "certify")):
        call = {"problem": PROBLEM, "settings": SETTINGS, "certify": False, **kw}
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            optimize_correlation(p, call.pop("problem"), call.pop("settings"), progress=False, **call)
    assert not (tmp_path / "ck.json").exists()
    with pytest.raises(ValueError, match="n must equal"):
        optimize_correlation(make_parameterization("blt", 12, num_buffers=2), PROBLEM, SETTINGS, certify=False)
    with pytest.raises(ValueError, match="params must have keys"):
        optimize_correlation(p, PROBLEM, dataclasses.replace(SETTINGS, init_params={"x": [1.0]}), certify=False)
    with pytest.raises(ValueError, match="^result must be"):
        certify_result(PROBLEM)
    with pytest.raises(ValueError, match="^settings must be"):
        certify_noise(Toeplitz(jnp.array([1.0, 0.4])), B, E, target_epsilon=2.0, target_delta=1e-2, settings=None)
    with pytest.raises(ValueError, match="^key: certify_noise needs"):
        certify_noise(Toeplitz(jnp.array([1.0, 0.4])), B, E, target_epsilon=2.0, target_delta=1e-2,
                      settings=CertifySettings(num_samples=1 << 16))


def _values(res: OptimizationResult) -> dict:
    d = res.to_dict()
    d.pop("timings")
    return d


@pytest.mark.slow
def test_the_certified_run_is_the_certify_step_on_the_uncertified_run():
    """``optimize_correlation(..., certify=s)`` equals ``certify_result(optimize_correlation(...,
    certify=False), s)`` value for value (both certificate methods, a training sampler, the
    default key derived from the seed); a run from a JAX key needs the certificate's key."""
    p = _param()
    problem = _problem(dataset_size=400, batch_size=140)
    plain = optimize_correlation(p, problem, SETTINGS, certify=False, progress=False)
    assert math.isnan(plain.noise_multiplier) and plain.certificate is None
    for settings in (CertifySettings(num_samples=1 << 16),
                     CertifySettings(num_samples=1 << 18, method="bernoulli_kl", max_attempts=4)):
        direct = optimize_correlation(p, problem, SETTINGS, certify=settings, progress=False)
        stepped = certify_result(plain, settings, progress=False)
        assert direct.certificate.verified and direct.certificate.target_delta == problem.sampler.certify_delta
        assert _values(stepped) == _values(direct)
        assert stepped.rmse == stepped.noise_multiplier * stepped.error
        # Everything but the certificate's fields is the uncertified run's.
        changed = {k for k, v in _values(stepped).items() if _values(plain)[k] != v}
        assert changed <= {"noise_multiplier", "rmse", "certificate", "gap_to_estimate"}
    key = jax.random.key(11)
    from_key = optimize_correlation(p, PROBLEM, dataclasses.replace(SETTINGS, key=key),
                                    certify=False, progress=False)
    assert from_key.seed == -1
    with pytest.raises(ValueError, match="^key: "):
        certify_result(from_key)
    settings = CertifySettings(num_samples=1 << 16, key=3)
    direct = optimize_correlation(p, PROBLEM, dataclasses.replace(SETTINGS, key=key),
                                  certify=settings, progress=False)
    assert _values(certify_result(from_key, settings, progress=False)) == _values(direct)
