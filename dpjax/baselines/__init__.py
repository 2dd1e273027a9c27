"""Baselines users compare the tight PLD accountant with.

* :mod:`dpjax.numerics.rdp` -- the moments accountant (RDP of the Poisson-subsampled Gaussian,
  Mironov, Talwar & Zhang 2019), with the standard and improved RDP-to-DP conversions.
* :mod:`dpjax.baselines.strong_composition` -- amplification by subsampling + advanced
  composition (the "strong composition" curve of Abadi et al. 2016, Fig. 2).
* :mod:`dpjax.baselines.group_privacy` -- the group-privacy lemma applied to the tight k = 1
  guarantee, and the group-privacy note's RDP over-approximation of group privacy.

All are upper bounds on epsilon (sound), looser than :func:`dpjax.dpsgd_epsilon`.
"""

from dpjax.numerics.rdp import (
    DEFAULT_RDP_ORDERS,
    rdp_epsilon,
    rdp_poisson_subsampled_gaussian,
    rdp_to_epsilon,
)
from dpjax.baselines.group_privacy import GroupLemmaResult, group_lemma_epsilon, group_rdp_epsilon
from dpjax.baselines.strong_composition import strong_composition_epsilon

__all__ = [
    "DEFAULT_RDP_ORDERS",
    "GroupLemmaResult",
    "group_lemma_epsilon",
    "group_rdp_epsilon",
    "rdp_epsilon",
    "rdp_poisson_subsampled_gaussian",
    "rdp_to_epsilon",
    "strong_composition_epsilon",
]
