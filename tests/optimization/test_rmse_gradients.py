"""Gradients of the amplified RMSE against central finite differences.

``RMSE(p) = sigma*(C(p)) * prefix_sum_error(C(p))``, ``sigma*`` calibrated on the balls-in-bins
Monte Carlo estimate with common random numbers (:func:`dpjax.calibration.calibrated_noise`,
one fixed key), for the Toeplitz, banded and BLT parameterizations.  ``jax.grad`` (implicit
adjoint through the calibration, Choquette-Choo et al. 2024, §4.2) must match central finite
differences with the same key to relative error <= 1e-4.

Tolerance.  With the key fixed, ``delta_hat(sigma; C)`` is a deterministic, piecewise-smooth
function; the bisection solves ``delta_hat = target`` to a relative bracket of ~1.4e-14, so a
central difference with step ``h = 1e-5`` has round-off error ~1e-14 / 1e-5 = 1e-9 relative and
truncation error ~h^2 |f'''| ~ 1e-10: both far below 1e-4.  The only way to miss is a kink of
``(1 - e^{eps - Y_s})_+`` (a sample crossing ``Y = eps``) inside ``[p - h, p + h]``; its jump in
slope is O(1/m) of the total and hitting one has probability ~m * density * h ~ 1e-3.  The bound
is per component, relative to the largest gradient component (components near zero have no
relative precision to speak of).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax.calibration import calibrated_noise
from dpjax.optimization import make_parameterization, prefix_sum_error

B, E = 4, 3
N = B * E
EPS, DELTA = 2.0, 1e-3
SAMPLES = 1 << 12
KEY = 7
H = 1e-5


def _rmse(par, params):
    corr = par.correlation(params)
    sigma = calibrated_noise(corr, B, E, target_epsilon=EPS, target_delta=DELTA,
                             num_samples=SAMPLES, key=jax.random.key(KEY))
    return sigma * prefix_sum_error(corr, N)


def _flat(params):
    keys = sorted(params)
    return keys, np.concatenate([np.ravel(np.asarray(params[k], np.float64)) for k in keys])


def _unflat(keys, template, x):
    out, i = {}, 0
    for k in keys:
        size = int(np.size(template[k]))
        out[k] = jnp.asarray(x[i:i + size].reshape(np.shape(template[k])), jnp.float64)
        i += size
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,kw", [("toeplitz", {}), ("banded", {"bands": 4}),
                                       ("blt", {"num_buffers": 2})])
def test_rmse_gradient_matches_central_finite_differences(family, kw):
    par = make_parameterization(family, N, **kw)
    with jax.enable_x64(True):
        # A start away from the closed form so that no component is special.
        p0 = par.init()
        rng = np.random.default_rng(0)
        params = {k: v + 0.3 * rng.standard_normal(np.shape(v)) for k, v in p0.items()}
        keys, x0 = _flat(params)
        value, grad = jax.value_and_grad(lambda p: _rmse(par, p))(_unflat(keys, params, x0))
        _, g = _flat(grad)
        fd = np.empty_like(x0)
        for i in range(x0.size):
            e = np.zeros_like(x0)
            e[i] = H
            up = float(_rmse(par, _unflat(keys, params, x0 + e)))
            down = float(_rmse(par, _unflat(keys, params, x0 - e)))
            fd[i] = (up - down) / (2 * H)
    assert np.isfinite(float(value)) and float(value) > 0
    scale = np.max(np.abs(fd))
    assert scale > 0
    rel = np.abs(g - fd) / scale
    print(family, "max relative error", rel.max())
    assert rel.max() <= 1e-4, (family, rel.max(), g, fd)
