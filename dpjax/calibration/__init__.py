"""Noise calibration by bisection, with implicit-differentiation gradients.

Layering: :mod:`dpjax.pld`, :mod:`dpjax.matrices` -> :mod:`dpjax.montecarlo` -> this package ->
:mod:`dpjax.optimization`.

* :mod:`dpjax.calibration.root` -- the generic machinery: :func:`bisect_monotone` (fixed
  iteration count, result on the safe side), :func:`solve_monotone_root` with a named adjoint
  (:class:`ImplicitAdjoint`, :class:`StopGradientAdjoint`).
* :mod:`dpjax.calibration.gaussian` -- the exact T-fold Gaussian mechanism (analytic oracle;
  the curve itself is :func:`dpjax.pld.gaussian_delta`).
* :mod:`dpjax.calibration.pld` -- DP-SGD: :func:`dpsgd_noise_multiplier` (batched, certified
  on the PLD accountant's grid), the differentiable :func:`epsilon_fn` and the jittable
  :func:`dpsgd_noise_multiplier_core`.
* :mod:`dpjax.calibration.montecarlo` -- matrix mechanisms under balls-in-bins batching:
  :func:`calibrated_noise` (differentiable in ``C``; its home, not re-exported by
  :mod:`dpjax.montecarlo`), :func:`calibrate_accountant` (``BallsInBins.calibrate``),
  :func:`estimate_minimum_samples`; the in-loop solver objects :class:`NewtonIllinois`,
  :class:`Bisection` and :func:`calibrate_on_draws`.
* :mod:`dpjax.calibration.screened` -- the optimisation loop's calibration
  :func:`calibrate_screened`: the full estimate's root and implicit gradient from one float32
  screen of the sample plus float64 work on the few samples that can contribute.
"""

from dpjax.calibration.gaussian import (gaussian_delta, gaussian_noise_multiplier,
                                        gaussian_noise_multiplier_core)
from dpjax.calibration.montecarlo import (Bisection, CalibrationResult, NewtonIllinois,
                                          calibrate_accountant, calibrate_on_draws,
                                          calibrated_noise, estimate_minimum_samples)
from dpjax.calibration.pld import (DPSGDGrid, dpsgd_delta_fn, dpsgd_grid, dpsgd_noise_multiplier,
                                   dpsgd_noise_multiplier_core, epsilon_fn)
from dpjax.calibration.screened import (ScreenedDraws, ScreenedResult, calibrate_screened,
                                        screened_draws)
from dpjax.calibration.root import (ImplicitAdjoint, RootResult, SolverStatus,
                                    StopGradientAdjoint, bisect_monotone, solve_monotone_root)

__all__ = [
    "SolverStatus", "ImplicitAdjoint", "RootResult", "StopGradientAdjoint", "bisect_monotone",
    "solve_monotone_root",
    "gaussian_delta", "gaussian_noise_multiplier", "gaussian_noise_multiplier_core",
    "DPSGDGrid", "dpsgd_delta_fn", "dpsgd_grid", "dpsgd_noise_multiplier",
    "dpsgd_noise_multiplier_core", "epsilon_fn",
    "calibrate_accountant", "calibrated_noise", "estimate_minimum_samples",
    "Bisection", "NewtonIllinois", "CalibrationResult", "calibrate_on_draws",
    "calibrate_screened", "screened_draws", "ScreenedDraws", "ScreenedResult",
]
