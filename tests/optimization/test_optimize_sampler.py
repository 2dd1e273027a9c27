"""``optimize`` certifies for the training sampler: with its dataset size N and batch shape B the
certificate is for ``delta - truncation_delta``, so the released sigma holds for
``BallsInBinsSampler(N, b, E, B)``; without them the output says what was assumed.

The truncation argument (docs/design.md §7): the truncating mechanism equals the untruncated one
except where some bin of ``N + 1`` examples overflows ``B``, which adds ``(1 + e^eps) p`` to
delta.  An independent re-check (fresh key, one fixed-sigma betting test,
``BallsInBins.certify``) of the released sigma at ``delta - truncation_delta`` must pass.
"""

from __future__ import annotations

import json
import math

import pytest

from dpjax.cli.main import main
from dpjax.optimization.certify import sampler_terms
from dpjax.sampling import BallsInBinsSampler, balls_in_bins_truncation_delta


@pytest.mark.parametrize("n,b,bs,eps", [(16000, 16, 1260, 4.0), (16000, 16, 1200, 4.0), (1437, 16, 150, 2.0),
                                        (100, 3, 100, 1.0)])
def test_the_truncation_term_is_the_samplers(n, b, bs, eps):
    """The schedule-free term equals the sampler's own (same union bound, same binomial tail)."""
    want = BallsInBinsSampler(n, b, 2, bs).truncation_delta(eps)
    assert balls_in_bins_truncation_delta(n, b, bs, eps) == want
    terms = sampler_terms(n, bs, b, eps, 0.5)
    assert terms.truncation_delta == want and terms.certify_delta == 0.5 - want


def test_without_the_sampler_nothing_is_subtracted():
    t = sampler_terms(None, None, 16, 4.0, 1e-6)
    assert (t.dataset_size, t.batch_size, t.truncation_delta, t.certify_delta) == (None, None, 0.0, 1e-6)


def test_bad_sampler_arguments_name_themselves():
    with pytest.raises(ValueError, match="dataset_size and batch_size go together.*only dataset_size"):
        sampler_terms(16000, None, 16, 4.0, 1e-6)
    with pytest.raises(ValueError, match="batch_size must be"):
        sampler_terms(16000, 0, 16, 4.0, 1e-6)
    with pytest.raises(ValueError, match=r"batch_size = 1100 truncates too often.*batch_size must be >= (\d+)") as e:
        sampler_terms(16000, 1100, 16, 4.0, 1e-6)
    # The smallest batch shape the message names is the boundary: it passes, one less does not.
    smallest = int(e.value.args[0].split("batch_size must be >= ")[1].split()[0])
    assert balls_in_bins_truncation_delta(16000, 16, smallest, 4.0) <= 0.5e-6
    assert balls_in_bins_truncation_delta(16000, 16, smallest - 1, 4.0) > 0.5e-6


@pytest.mark.parametrize("extra,match", [
    (["--dataset-size", "16000"], "--dataset-size and --batch-size go together"),
    (["--dataset-size", "16000", "--batch-size", "1100"], "--batch-size = 1100 truncates too often"),
    (["--dataset-size", "16000", "--batch-size", "1260", "--amplification", "auto"], "--amplification auto"),
])
def test_cli_refuses_a_bad_sampler_before_any_work(tmp_path, capsys, extra, match):
    out = tmp_path / "r.json"
    argv = ["optimize", "--batches-per-epoch", "16", "--epochs", "16", "--epsilon", "4", "--delta", "1e-6",
            "--quiet", "--out", str(out)]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1
    assert not out.exists()


def _recheck(res, trunc, eps, delta):
    """The independent check: fresh draws (a key the optimisation never used), one betting test
    at the released sigma against ``delta - trunc``.  2^18 draws resolve the margin between the
    certified level and the estimate (about 10% of delta at the released rung)."""
    from dpjax.montecarlo import BallsInBins

    recheck = BallsInBins(res.correlation(), res.batches_per_epoch, res.epochs).certify(
        res.noise_multiplier, eps, delta - trunc, 1 << 18, key=20261206, method="importance_betting")
    assert recheck.verified, recheck.reason
    assert recheck.delta <= delta - trunc


@pytest.mark.slow
def test_released_sigma_reverifies_for_the_sampler(tmp_path, capsys):
    """b = 16, E = 16, eps 4, delta 1e-6, ``--dataset-size 16000 --batch-size 1260``: the released
    sigma re-verifies at delta minus the sampler's truncation term.  B = 1260 is 8.5 standard
    deviations of a bin above its mean N / b = 1000 (term ~1e-13); B = 1200 (Python API, same
    problem) is 6.5 (term 8.8e-8, 9% of delta), where subtracting it matters.  Slow tier: two
    optimisations, two certificates and two re-checks, 30-45 s on 2 cores."""
    from dpjax.cli.optimize import _render
    import dpjax
    from dpjax.optimization import (CorrelationProblem, OptimizationResult, OptimizerSettings, make_parameterization,
                                    optimize_correlation)

    n, b, epochs, eps, delta = 16000, 16, 16, 4.0, 1e-6
    out = tmp_path / "result.json"
    assert main(["optimize", "--batches-per-epoch", "16", "--epochs", "16", "--epsilon", "4", "--delta", "1e-6",
                 "--dataset-size", "16000", "--batch-size", "1260", "--buffers", "2", "--optimizer-steps", "5",
                 "--quiet", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    res = OptimizationResult.load(out)
    for batch_size in (1260, 1200):
        if batch_size == 1200:
            problem = CorrelationProblem(sampling=dpjax.BallsInBins(b), epochs=epochs, target_epsilon=eps,
                                         target_delta=delta, dataset_size=n, batch_size=batch_size)
            res = optimize_correlation(make_parameterization("blt", b * epochs, num_buffers=2), problem,
                                       OptimizerSettings(num_steps=5), progress=False)
        trunc = BallsInBinsSampler(n, b, epochs, batch_size).truncation_delta(eps)
        assert res.truncation_delta == trunc and (res.dataset_size, res.batch_size) == (n, batch_size)
        cert = res.certificate
        assert cert.verified and cert.target_delta == delta - trunc and math.isfinite(res.noise_multiplier)
        # The sampler's run: the certificate's delta (failure probability included) plus truncation.
        assert cert.delta + trunc <= delta
        _recheck(res, trunc, eps, delta)
    assert 8.8e-8 < trunc < 8.9e-8  # B = 1200: the term is material
    # What the command printed and saved: the sampler, and for which run the certificate holds.
    assert (printed["dataset_size"], printed["batch_size"]) == (n, 1260)
    text = " ".join(_render(printed).split())
    assert ("Sampler: dpjax.sampling.BallsInBinsSampler with N = 16,000 examples, b = 16 bins, batches of shape "
            "B = 1,260 (mean N / b = 1000)") in text and "so the run on this sampler is (4, 1e-06)-DP" in text
    # Without the sampler the text says what the certificate assumed.
    printed.update(dataset_size=None, batch_size=None, truncation_delta=0.0)
    text = " ".join(_render(printed).split())
    assert "Sampler assumed: balls-in-bins batches" in text and "give --dataset-size and --batch-size" in text


@pytest.fixture(scope="module")
def small_result():
    """A small certified result (b = 4, E = 2) for a sampler of N = 400, B = 140."""
    import dpjax
    from dpjax.optimization import (CertifySettings, CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)

    problem = CorrelationProblem(sampling=dpjax.BallsInBins(4), epochs=2, target_epsilon=2.0, target_delta=1e-3,
                                 dataset_size=400, batch_size=140)
    return optimize_correlation(make_parameterization("blt", 8, num_buffers=2), problem,
                                OptimizerSettings(num_steps=2, num_samples=256),
                                certify=CertifySettings(num_samples=65536), progress=False)


@pytest.mark.slow
def test_the_certificate_is_for_delta_less_truncation(small_result):
    """The wiring on a small problem (the slow test above runs the full one): the certificate's
    target is ``delta - truncation_delta`` and the sampler's run stays within delta."""
    res = small_result
    trunc = balls_in_bins_truncation_delta(400, 4, 140, 2.0)
    assert 1e-4 < trunc < 2e-4 and res.truncation_delta == trunc  # 13% of delta: it matters
    assert res.certificate.verified and res.certificate.target_delta == 1e-3 - trunc
    assert res.certificate.delta + trunc <= 1e-3


def test_training_setup_from_the_result_and_its_file(small_result, tmp_path):
    """training_setup: the sampler the result was certified for, the streaming noise of its C,
    the update at its sigma, and the run's guarantee within the result's target."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpjax.matrices import BLT
    from dpjax.optimization import OptimizationResult, training_setup

    res = small_result
    path = tmp_path / "result.json"
    res.to_json(path)
    for source in (res, str(path)):
        setup = training_setup(source, clip_norm=0.5, seed=7)
        s = setup.sampler
        assert (s.num_examples, s.batches_per_epoch, s.epochs, s.batch_size, s.seed) == (400, 4, 2, 140, 7)
        assert isinstance(setup.correlation, BLT) and setup.certified_for_sampler
        np.testing.assert_array_equal(np.asarray(setup.correlation.column(8)), res.first_column)
        assert setup.noise_multiplier == res.noise_multiplier and setup.clip_norm == 0.5
        assert setup.truncation_delta == res.truncation_delta
        assert setup.epsilon == 2.0 and setup.delta == res.certificate.delta + res.truncation_delta <= 1e-3
    # The update is the aggregate at the certified sigma: with zero gradients its output is the
    # first row of C^-1 z, z ~ N(0, (sigma clip)^2): c_0 = 1, so exactly sigma * clip * N(0, 1) / B.
    params = {"w": jnp.zeros(4000)}
    state = setup.transform.init(params)
    # One compiled update, as a training step runs it (eagerly each of its operations compiles on its own).
    out, state = jax.jit(setup.transform.update)({"w": jnp.zeros((140, 4000))}, state, params,
                                                 mask=jnp.ones(140, bool))
    std = float(np.std(np.asarray(out["w"]))) * 140 / (res.noise_multiplier * 0.5)
    assert abs(std - 1.0) < 5 * (1 / np.sqrt(2 * 4000))  # 5 standard errors of a sample std
    # Sizes other than the certified ones are refused, naming the argument.
    with pytest.raises(ValueError, match="batch_size = 150 differs from the 140"):
        training_setup(res, batch_size=150)
    # A result certified without a sampler needs N and B, and then adds the truncation term.
    bare = OptimizationResult.from_dict(dict(json.loads(res.to_json()), dataset_size=None, batch_size=None,
                                             truncation_delta=0.0))
    with pytest.raises(ValueError, match="dataset_size is needed"):
        training_setup(bare)
    setup = training_setup(bare, dataset_size=400, batch_size=140)
    assert not setup.certified_for_sampler
    assert setup.delta == res.certificate.delta + balls_in_bins_truncation_delta(400, 4, 140, 2.0)
    with pytest.raises(ValueError, match="certified"):
        training_setup(OptimizationResult.from_dict(dict(json.loads(res.to_json()), certificate=None)))
