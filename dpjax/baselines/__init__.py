"""Baselines users compare the tight PLD accountant with.

* :mod:`dpjax.baselines.rdp` -- the moments accountant (RDP of the Poisson-subsampled Gaussian,
  Mironov, Talwar & Zhang 2019), with the standard and improved RDP-to-DP conversions.
* :mod:`dpjax.baselines.strong_composition` -- amplification by subsampling + advanced
  composition (the "strong composition" curve of Abadi et al. 2016, Fig. 2).

All are upper bounds on epsilon (sound), looser than :func:`dpjax.dpsgd_epsilon`.
"""

from dpjax.baselines.rdp import (
    DEFAULT_RDP_ORDERS,
    rdp_epsilon,
    rdp_poisson_subsampled_gaussian,
    rdp_to_epsilon,
)
from dpjax.baselines.strong_composition import strong_composition_epsilon

__all__ = [
    "DEFAULT_RDP_ORDERS",
    "rdp_epsilon",
    "rdp_poisson_subsampled_gaussian",
    "rdp_to_epsilon",
    "strong_composition_epsilon",
]
