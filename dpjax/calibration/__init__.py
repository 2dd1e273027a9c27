"""Noise calibration by bisection, with implicit-differentiation gradients (DESIGN.md §5).

* :mod:`dpjax.calibration.root` -- the generic machinery: :func:`bisect_monotone` (fixed
  iteration count, result on the safe side), :func:`solve_monotone_root` with a named adjoint
  (:class:`ImplicitAdjoint`, :class:`StopGradientAdjoint`).
* :mod:`dpjax.calibration.gaussian` -- the exact T-fold Gaussian mechanism (analytic oracle).
"""

from dpjax.calibration.gaussian import (gaussian_delta, gaussian_noise_multiplier,
                                        gaussian_noise_multiplier_core)
from dpjax.calibration.root import (STATUS_CONVERGED, STATUS_MET_AT_BRACKET_END,
                                    STATUS_UNREACHABLE, ImplicitAdjoint, RootResult,
                                    StopGradientAdjoint, bisect_monotone, solve_monotone_root)

__all__ = [
    "STATUS_CONVERGED", "STATUS_MET_AT_BRACKET_END", "STATUS_UNREACHABLE",
    "ImplicitAdjoint", "RootResult", "StopGradientAdjoint", "bisect_monotone",
    "solve_monotone_root",
    "gaussian_delta", "gaussian_noise_multiplier", "gaussian_noise_multiplier_core",
]
