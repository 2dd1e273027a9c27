"""Baseline rows of the amplified-MF table (dpjax.optimization.baselines): one normalization."""

import math

import jax
import numpy as np
import pytest

from dpjax.calibration import dpsgd_noise_multiplier, gaussian_noise_multiplier
from dpjax.optimization import baselines as bl
from dpjax.optimization import make_parameterization, unamplified_loss

B, E = 4, 2
N = B * E


@pytest.mark.slow  # 20-30 s of jax_privacy/PLD calibration on 2 cores
def test_dpsgd_rows_and_normalization():
    r = bl.dpsgd_unamplified(2.0, 1e-5, B, E)
    assert r.noise_multiplier == pytest.approx(math.sqrt(E) * float(gaussian_noise_multiplier(2.0, 1e-5)), rel=1e-9)
    assert r.error == pytest.approx(math.sqrt((N + 1) / 2), rel=1e-15)
    assert r.rmse == pytest.approx(r.noise_multiplier * r.error, rel=1e-15)
    assert r.rmse_jax_privacy == pytest.approx(r.rmse / E, rel=1e-15)
    p = bl.dpsgd_poisson(2.0, 1e-5, B, E)
    assert p.noise_multiplier == pytest.approx(float(dpsgd_noise_multiplier(1 / B, N, 2.0, 1e-5)), rel=1e-12)
    assert p.rmse < r.rmse  # amplification by sampling helps DP-SGD
    assert set(r.to_dict()) >= {"rmse", "rmse_jax_privacy", "noise_multiplier", "accounting"}


def test_unamplified_optimum_rows_match_the_unamplified_loss():
    par = make_parameterization("blt", N, num_buffers=2)
    params = par.init()
    rows = bl.unamplified_optimum(par, [1.0, 4.0], 1e-5, B, E, params=params)
    with jax.enable_x64(True):
        per_unit = math.sqrt(float(unamplified_loss(par, params, B, E)))
    for row in rows:
        s = float(gaussian_noise_multiplier(row.epsilon, 1e-5))
        assert row.rmse == pytest.approx(s * per_unit, rel=1e-9)
    assert rows[1].rmse < rows[0].rmse


@pytest.mark.slow  # 20-30 s of jax_privacy/PLD calibration on 2 cores
def test_banded_rows_are_scale_invariant_and_one_band_is_dpsgd_poisson():
    pytest.importorskip("jax_privacy")
    coef2 = np.array([0.8, 0.6])  # unit norm, c_0 != 1 (jax_privacy's convention)
    rows = bl.banded_cyclic_poisson([2.0], 1e-5, B, E, batch_size=8, bands_list=[1, 2],
                                    coefficients={1: np.array([1.0]), 2: coef2})
    per = {d["bands"]: d for d in rows[0].extra["per_bands"]}
    # One band, PLD: exactly DP-SGD with Poisson q = 1/b for n steps.
    assert per[1]["noise_multiplier_pld"] == pytest.approx(
        float(dpsgd_noise_multiplier(1 / B, N, 2.0, 1e-5)), rel=1e-12)
    # Scaling the coefficients changes sigma (c_0 = 1 normalization) but not the rmse.
    rows_scaled = bl.banded_cyclic_poisson([2.0], 1e-5, B, E, batch_size=8, bands_list=[2],
                                           coefficients={2: 3.0 * coef2})
    assert rows_scaled[0].rmse == pytest.approx(per[2]["rmse_rdp"], rel=1e-12)
    names = [r.name for r in rows]
    assert names == ["banded_cyclic_poisson_rdp", "banded_cyclic_poisson_pld"]
    assert rows[0].rmse == pytest.approx(min(d["rmse_rdp"] for d in per.values()), rel=1e-12)
    # PLD is tighter than RDP for the same mechanism.
    assert all(d["rmse_pld"] <= d["rmse_rdp"] * (1 + 1e-9) for d in per.values())


@pytest.mark.slow
def test_balls_in_bins_certified_identity():
    import jax.numpy as jnp
    from dpjax.matrices import Toeplitz
    from dpjax.optimization import CertifySettings

    r = bl.balls_in_bins_certified(Toeplitz(jnp.ones(1)), 2.0, 1e-5, B, E,
                                   settings=CertifySettings(num_samples=1 << 22))
    cert = r.certificate
    assert cert.verified and cert.delta <= 1e-5
    # Amplified sigma is below the unamplified one and at least the estimate.
    assert r.noise_multiplier < bl.dpsgd_unamplified(2.0, 1e-5, B, E).noise_multiplier
    assert r.noise_multiplier >= r.extra["noise_multiplier_estimate"]


def test_dpsgd_balls_in_bins_is_the_accountant_and_amplifies():
    import dpjax

    r = bl.dpsgd_balls_in_bins(2.0, 1e-5, B, E)
    assert r.name == "dpsgd_balls_in_bins"
    assert r.noise_multiplier == dpjax.dpsgd_noise_multiplier(sampling=dpjax.BallsInBins(B), epochs=E,
                                                              target_epsilon=2.0, target_delta=1e-5)
    # Balls-in-bins amplifies: below the unamplified (fixed-batch) Gaussian's noise.
    assert r.noise_multiplier < bl.dpsgd_unamplified(2.0, 1e-5, B, E).noise_multiplier
    assert r.rmse == pytest.approx(r.noise_multiplier * math.sqrt((B * E + 1) / 2), rel=1e-12)


@pytest.mark.parametrize("call,match", [
    (lambda: bl.dpsgd_balls_in_bins(1.0, 0.0, B, E), "delta"),
    (lambda: bl.dpsgd_poisson(0.0, 1e-5, B, E), "epsilon"),
    (lambda: bl.dpsgd_unamplified(1.0, 1.5, B, E), "delta"),
    (lambda: bl.banded_cyclic_poisson([1.0], 1e-5, B, E, dataset_size=10, batch_size=8), "dataset_size"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
