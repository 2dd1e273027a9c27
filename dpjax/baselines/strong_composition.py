"""Strong (advanced) composition baseline for DP-SGD: the curve that Abadi et al., "Deep Learning
with Differential Privacy" (CCS 2016, Fig. 2) compare the moments accountant with.

Recipe (every step is a valid (eps, delta) bound, so the result is an upper bound):

1. One un-subsampled Gaussian step with noise multiplier ``sigma`` is ``(eps0, delta0)``-DP with
   the exact analytic-Gaussian trade-off (Balle & Wang 2018, Thm. 8):
   ``delta0(eps0) = Phi(1/(2 sigma) - eps0 sigma) - e^eps0 Phi(-1/(2 sigma) - eps0 sigma)``
   (:func:`dpjax.pld.gaussian_epsilon` with ``mu = 1/sigma``).
2. Poisson subsampling with probability ``q`` amplifies it to
   ``eps' = log(1 + q (e^eps0 - 1))``, ``delta' = q delta0`` (Balle, Barthe & Gaboardi 2018, add/remove).
3. Advanced composition over ``T`` steps (Dwork, Rothblum & Vadhan 2010; Dwork & Roth Thm. 3.20):
   for any ``delta'' > 0``: ``eps = sqrt(2 T log(1/delta'')) eps' + T eps' (e^eps' - 1)``,
   ``delta = T delta' + delta''``.  (The basic composition ``T eps'`` with ``delta = T delta'``
   is also valid; the smaller of the two is taken.)

The target ``delta`` is split as ``delta'' = f delta`` and ``T q delta0 = (1 - f) delta`` over a
fixed grid of fractions ``f``; every split is a valid bound, the smallest epsilon is returned.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dpjax._base import validate as _validate
from dpjax._base.x64 import float64
from dpjax.numerics.exact import gaussian_epsilon

_SPLITS = 199  # fractions f = 0.005, 0.010, ..., 0.995


@jax.jit
def strong_composition_epsilon_core(noise_multiplier, sampling_prob, steps, target_delta):
    """Advanced-composition epsilon of T Poisson-subsampled Gaussian steps (pure, jitted).

    All arguments scalars; ``steps`` may be a float array (vmappable over steps).
    Returns the scalar epsilon (upper bound).
    """
    sigma = jnp.asarray(noise_multiplier, jnp.float64)
    q = jnp.asarray(sampling_prob, jnp.float64)
    t = jnp.asarray(steps, jnp.float64)
    delta = jnp.asarray(target_delta, jnp.float64)
    f = jnp.arange(1, _SPLITS + 1, dtype=jnp.float64) / (_SPLITS + 1)
    # Step 1: the exact Gaussian curve at mu = 1/sigma (one step, sensitivity 1).
    mu = 1.0 / sigma
    eps0 = gaussian_epsilon((1.0 - f) * delta / (t * q), mu)
    eps1 = jnp.log1p(q * jnp.expm1(eps0))
    advanced = jnp.sqrt(2.0 * t * jnp.log(1.0 / (f * delta))) * eps1 + t * eps1 * jnp.expm1(eps1)
    # Basic composition with the whole delta spent on the steps.
    eps0_basic = gaussian_epsilon(delta / (t * q), mu)
    basic = t * jnp.log1p(q * jnp.expm1(eps0_basic))
    return jnp.minimum(jnp.min(advanced), basic)


@float64(rounding="up")
def strong_composition_epsilon(noise_multiplier: float, sampling_prob: float, steps: int, target_delta: float) -> float:
    """DP-SGD epsilon by amplification by subsampling + advanced composition (the baseline of Abadi et al. 2016).

    Args:
      noise_multiplier: noise std / clip norm, > 0.
      sampling_prob: Poisson sampling probability in (0, 1].
      steps: number of steps, integer >= 1.
      target_delta: in (0, 1).
    Returns:
      epsilon (float), an upper bound -- much looser than RDP or PLD accounting.

    Example::

        >>> strong_composition_epsilon(4.0, 0.01, 10_000, 1e-5)   # ~ 8, vs ~ 1.3 by PLD
    """
    sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
    q = float(_validate.probability_open_closed("sampling_prob", sampling_prob))
    t = _validate.positive_int("steps", steps)
    delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
    return float(strong_composition_epsilon_core(sigma, q, float(t), delta))
