"""dpjax.calibration.gaussian_noise_multiplier against a 50-digit oracle of the Gaussian curve.

The search runs on an upper bound of log delta (the closed form's rounding margin of
dpjax.numerics.exact): the returned sigma has delta <= target in exact arithmetic, where the
plain closed form let delta exceed the target by up to ~2.7e-9 relative (small mu, deep tails).
Tight: 1e-6 less noise misses the target (the margins are widest where a small mu makes delta
a small difference of two close terms in a deep tail: up to ~1e-7 relative in sigma there).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np

from dpjax import calibration

mp.mp.dps = 50


def _delta(eps, mu):
    eps, mu = mp.mpf(float(eps)), mp.mpf(float(mu))
    return mp.ncdf(-eps / mu + mu / 2) - mp.e ** eps * mp.ncdf(-eps / mu - mu / 2)


def test_calibrated_noise_meets_the_target_exactly_and_tightly():
    rng = np.random.default_rng(11)
    n = 200
    eps = 10.0 ** rng.uniform(-2, 2.5, n)
    delta = 10.0 ** rng.uniform(-200, -1, n)
    steps = np.floor(10.0 ** rng.uniform(0, 5, n))
    sigma = calibration.gaussian_noise_multiplier(eps, delta, steps)   # one batched program
    for e, d, t, s in zip(eps, delta, steps, sigma):
        assert _delta(e, math.sqrt(t) / s) <= d, (e, d, t, s)
        assert _delta(e, math.sqrt(t) / (s * (1 - 1e-6))) > d, (e, d, t, s)
