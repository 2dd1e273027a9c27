"""Random allocation / balls-in-bins through every public door: dpjax.dpsgd_* (eager, batched and
traced), calibration, sweep, epsilon_curve, CLI, interop events and running accountants give the
Python call's numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import dpjax
from dpjax.pld.scenario import scheme_from_keywords
from dpjax.pld.allocation import accountant as R

SIGMA, T, E, DELTA = 1.3, 48, 3, 1e-5


@pytest.fixture(scope="module")
def reference():
    return R.allocation_accounting(SIGMA, T, E, target_delta=DELTA)


def test_dpsgd_entry_points(reference):
    eps = dpjax.dpsgd_epsilon(SIGMA, target_delta=DELTA, sampling=dpjax.RandomAllocation(T), epochs=E)
    assert eps == reference.epsilon
    res = dpjax.pld.dpsgd_accounting(SIGMA, target_delta=DELTA, sampling=dpjax.RandomAllocation(T), epochs=E)
    assert res.epsilon_lower == reference.epsilon_lower and res.adjacency == "add_or_remove"
    d = dpjax.dpsgd_delta(SIGMA, target_epsilon=eps, sampling=dpjax.RandomAllocation(T), epochs=E)
    assert d == R.allocation_delta(SIGMA, T, E, eps)
    bib = dpjax.dpsgd_epsilon(SIGMA, target_delta=DELTA, sampling=dpjax.BallsInBins(T), epochs=E)
    assert bib == R.balls_in_bins_epsilon(SIGMA, T, E, DELTA)
    assert dpjax.pld.dpsgd_epsilon(SIGMA, target_delta=DELTA, sampling=dpjax.RandomAllocation(T), epochs=E) == eps
    # steps, where given, is t * E.
    assert dpjax.dpsgd_epsilon(SIGMA, steps=T * E, target_delta=DELTA, sampling=dpjax.RandomAllocation(T), epochs=E) == eps
    # Poisson keeps its positional spelling and value.
    assert dpjax.dpsgd_epsilon(1.0, 0.01, 100, 1e-5) == dpjax.pld.dpsgd_epsilon(1.0, 0.01, 100, 1e-5)


def test_batches_and_traced_calls_give_the_call(reference):
    """An array of noise multipliers is one call per element; jax.vmap / jax.jit (float32 code) give
    the call's value rounded to float32; jax.grad is the derivative of the certified bound on the
    call's plan (discretization held fixed), close to a finite difference of the call itself."""
    import jax
    import jax.numpy as jnp

    kw = dict(sampling=dpjax.RandomAllocation(T), epochs=E)
    sigmas = np.array([SIGMA, 2.0])
    many = dpjax.dpsgd_epsilon(sigmas, target_delta=DELTA, **kw)
    assert many.shape == (2,) and many[0] == reference.epsilon
    assert many[1] == R.allocation_epsilon(2.0, T, E, DELTA)
    assert not jax.config.jax_enable_x64
    v = jax.vmap(lambda s: dpjax.dpsgd_epsilon(s, target_delta=DELTA, **kw))(jnp.asarray(sigmas, jnp.float32))
    assert v.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(v), many, rtol=1e-6)
    j = jax.jit(lambda s: dpjax.dpsgd_delta(s, target_epsilon=1.0, **kw))(jnp.float32(SIGMA))
    # (a float32 argument: the call at float32(SIGMA))
    assert float(j) == pytest.approx(R.allocation_delta(float(np.float32(SIGMA)), T, E, 1.0), rel=1e-6)
    g = float(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, target_delta=DELTA, **kw))(SIGMA))
    h = 2e-3
    fd = (R.allocation_epsilon(SIGMA + h, T, E, DELTA) - R.allocation_epsilon(SIGMA - h, T, E, DELTA)) / (2 * h)
    assert g < 0 and g == pytest.approx(fd, rel=2e-2)
    gb = float(jax.grad(lambda s: dpjax.dpsgd_epsilon(s, target_delta=DELTA, sampling=dpjax.BallsInBins(T), epochs=E))(SIGMA))
    fdb = (R.balls_in_bins_epsilon(SIGMA + h, T, E, DELTA) - R.balls_in_bins_epsilon(SIGMA - h, T, E, DELTA)) / (2 * h)
    assert gb == pytest.approx(fdb, rel=2e-2)


RA10 = dpjax.RandomAllocation(10)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling=RA10), "epochs"),
    (dict(sampling=RA10, epochs=2, sampling_prob=0.1), "sampling_prob"),
    (dict(sampling=RA10, epochs=2, steps=7), "steps"),
    (dict(sampling=RA10, epochs=2, group_size=2), "group_size"),
    (dict(sampling="shuffle", epochs=2), "sampling"),
    (dict(sampling="random_allocation", epochs=2), r"RandomAllocation\(batches_per_epoch, selections_per_epoch\)"),
    (dict(sampling=RA10, epochs=2, noise_schedule=[1.0] * 20), "noise_schedule"),
    (dict(sampling=RA10, epochs=2.5), "epochs"),
])
def test_dpsgd_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, **kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda: dpjax.BallsInBins(0), "batches_per_epoch"),
    (lambda: dpjax.RandomAllocation(0), "batches_per_epoch"),
    (lambda: dpjax.RandomAllocation(10, 11), "selections_per_epoch"),
    (lambda: scheme_from_keywords("balls_in_bins", batches_per_epoch=10, selections_per_epoch=2),
     "selections_per_epoch"),
    (lambda: scheme_from_keywords("poisson", batches_per_epoch=10), "batches_per_epoch"),
])
def test_scheme_records_refuse_bad_sizes(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sweep_and_curve_give_the_call(reference):
    table = dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[SIGMA], delta=DELTA, epochs=[1, E], sampling=[dpjax.RandomAllocation(T)]))
    assert table.rows[1]["epsilon"] == reference.epsilon and table.rows[1]["lower"] == reference.epsilon_lower
    curve = dpjax.epsilon_curve(SIGMA, target_delta=DELTA, sampling=dpjax.RandomAllocation(T), epochs=E)
    assert list(curve.steps) == [T, 2 * T, 3 * T]
    # The last entry is planned exactly as the call; earlier ones on the same plan (their brackets
    # overlap the single calls').
    assert curve.epsilon[-1] == reference.epsilon
    first = R.allocation_accounting(SIGMA, T, 1, target_delta=DELTA)
    assert curve.epsilon_lower[0] <= first.epsilon and first.epsilon_lower <= curve.epsilon[0]
    assert np.all(np.diff(curve.epsilon) > 0)


def test_sweep_journal_and_resume(tmp_path, reference):
    out = tmp_path / "ra.csv"
    t1 = dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[SIGMA, 2.0], delta=DELTA, epochs=E, sampling=[dpjax.RandomAllocation(T)]), out=str(out))
    t2 = dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[SIGMA, 2.0], delta=DELTA, epochs=E, sampling=[dpjax.RandomAllocation(T)]), out=str(out), resume=True)
    assert [r["path"] for r in t2.rows] == ["resumed", "resumed"]
    assert t2.rows[0]["epsilon"] == t1.rows[0]["epsilon"] == reference.epsilon


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "dpjax", *args, "--json"], capture_output=True, text=True,
                          timeout=900)
    return proc.returncode, proc.stdout, proc.stderr


def _cli_in_process(capsys, *args):
    """``dpjax.cli.main.main`` here (``python -m dpjax`` is ``sys.exit(main())``): the host-side
    accountants give the same numbers in this process, without a new interpreter's start."""
    from dpjax.cli.main import main

    capsys.readouterr()
    rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_epsilon_delta_noise_sweep(reference, capsys):
    # epsilon and delta in this process; the sweep and the usage error as separate processes.
    rc, out, err = _cli_in_process(capsys, "epsilon", "--sampling", "random_allocation", "--batches-per-epoch", str(T),
                                   "--epochs", str(E), "--noise-multiplier", str(SIGMA), "--delta", str(DELTA))
    assert rc == 0, err
    r = json.loads(out)
    assert r["epsilon"] == reference.epsilon and r["epsilon_lower"] == reference.epsilon_lower
    assert r["adjacency"] == "add_or_remove"
    rc, out, err = _cli_in_process(capsys, "delta", "--sampling", "balls_in_bins", "--batches-per-epoch", str(T),
                                   "--epochs", str(E), "--noise-multiplier", str(SIGMA), "--epsilon", "1")
    assert rc == 0, err
    assert json.loads(out)["delta"] == R.balls_in_bins_delta(SIGMA, T, E, 1.0)
    rc, out, err = _cli("sweep", "--sampling", "random_allocation", "--batches-per-epoch", str(T), "--epochs", str(E),
                        "--noise-multiplier", str(SIGMA), "--delta", str(DELTA))
    assert rc == 0, err
    assert json.loads(out)["table"][0]["epsilon"] == reference.epsilon
    rc, out, err = _cli("epsilon", "--sampling", "random_allocation", "--batches-per-epoch", "0", "--epochs", "1",
                        "--noise-multiplier", "1", "--delta", "1e-5")
    assert rc == 2 and "batches-per-epoch" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_noise_is_the_python_calibration():
    sigma = R.allocation_noise_multiplier(1.0, 1e-5, 32, 2)
    rc, out, err = _cli("noise", "--sampling", "random_allocation", "--batches-per-epoch", "32", "--epochs", "2",
                        "--epsilon", "1", "--delta", "1e-5")
    assert rc == 0, err
    assert json.loads(out)["noise_multiplier"] == sigma


def test_interop_event_and_running_accountant(reference):
    dp_accounting = pytest.importorskip("dp_accounting")
    from dpjax.interop import AllocationAccountant, RandomAllocationDpEvent, RunningAllocationAccountant

    event = dp_accounting.SelfComposedDpEvent(RandomAllocationDpEvent(dp_accounting.GaussianDpEvent(SIGMA), T), E)
    acc = AllocationAccountant()
    assert acc.supports(event) and not acc.supports(dp_accounting.GaussianDpEvent(1.0))
    assert acc.compose(event).get_epsilon(DELTA) == reference.epsilon
    run = RunningAllocationAccountant(batches_per_epoch=T)
    assert run.get_epsilon(DELTA) == 0.0
    run.epoch(noise_multiplier=SIGMA, num_epochs=E - 1).epoch(noise_multiplier=SIGMA)
    assert run.get_epsilon(DELTA) == reference.epsilon
    copy = RunningAllocationAccountant(batches_per_epoch=1).load_state_dict(json.loads(json.dumps(run.state_dict())))
    assert copy.get_epsilon(DELTA) == reference.epsilon
    bib = RunningAllocationAccountant(batches_per_epoch=T, sampling="balls_in_bins").epoch(noise_multiplier=SIGMA,
                                                                                           num_epochs=E)
    assert bib.get_epsilon(DELTA) == R.balls_in_bins_epsilon(SIGMA, T, E, DELTA)
    # Two noise multipliers: a composition of both phases, between the two uniform runs.
    two = RunningAllocationAccountant(batches_per_epoch=T).epoch(noise_multiplier=SIGMA, num_epochs=2).epoch(
        noise_multiplier=2.0)
    lo = R.allocation_epsilon(2.0, T, E, DELTA)
    assert lo < two.get_epsilon(DELTA) < reference.epsilon


@pytest.mark.slow
def test_calibration_meets_target_and_gradient_matches_finite_differences():
    import jax

    target, delta, t, epochs = 1.0, 1e-5, 32, 2
    kw = dict(sampling=dpjax.RandomAllocation(t), epochs=epochs)
    sigma = dpjax.dpsgd_noise_multiplier(target_epsilon=target, target_delta=delta, **kw)
    eps = R.allocation_epsilon(sigma, t, epochs, delta)
    assert target - 1e-4 <= eps <= target
    assert R.allocation_epsilon(sigma * (1 - 1e-3), t, epochs, delta) > target      # smallest to 0.1%
    g_eps, g_delta = jax.grad(lambda e, d: dpjax.dpsgd_noise_multiplier(target_epsilon=e, target_delta=d, **kw),
                              argnums=(0, 1))(target, delta)
    h = 2e-3
    fd = (R.allocation_noise_multiplier(target + h, delta, t, epochs)
          - R.allocation_noise_multiplier(target - h, delta, t, epochs)) / (2 * h)
    assert float(g_eps) == pytest.approx(fd, rel=2e-2)
    hd = 2e-7
    fdd = (R.allocation_noise_multiplier(target, delta + hd, t, epochs)
           - R.allocation_noise_multiplier(target, delta - hd, t, epochs)) / (2 * hd)
    assert float(g_delta) == pytest.approx(fdd, rel=3e-2)
