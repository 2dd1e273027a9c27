"""Noise calibration by bisection, with implicit-differentiation gradients.

Layering: :mod:`dpjax.pld`, :mod:`dpjax.matrices` -> :mod:`dpjax.montecarlo` -> this package ->
:mod:`dpjax.optimization`.

* :mod:`dpjax.calibration.root` -- the generic machinery: :func:`bisect_monotone` (fixed
  iteration count, result on the safe side), :func:`solve_monotone_root` with a named adjoint
  (:class:`ImplicitAdjoint`, :class:`StopGradientAdjoint`).  Its code lives in the foundation
  module ``dpjax.numerics.root``, because the Monte Carlo layer below this package solves with it too.
* :mod:`dpjax.calibration.gaussian` -- the exact T-fold Gaussian mechanism (analytic oracle;
  the curve itself is :func:`dpjax.pld.gaussian_delta`).
* :mod:`dpjax.calibration.pld` -- DP-SGD: :func:`dpsgd_noise_multiplier` (batched, certified
  on the PLD accountant's grid), the differentiable :func:`dpsgd_epsilon_fn` and the jittable
  :func:`dpsgd_noise_multiplier_core`.
* :mod:`dpjax.calibration.montecarlo` -- matrix mechanisms under balls-in-bins batching:
  :func:`calibrated_noise` (differentiable in ``C``; its home, not re-exported by
  :mod:`dpjax.montecarlo`), :func:`calibrate_accountant` (``BallsInBins.calibrate``),
  :func:`estimate_minimum_samples`; the in-loop solver objects :class:`NewtonIllinois`,
  :class:`Bisection` and :func:`calibrate_on_draws` (its sample and estimate: :class:`DrawPlan`).
  All but :func:`calibrated_noise` live in :mod:`dpjax.montecarlo.calibrate`
  (``BallsInBins.calibrate`` and Estimate-Verify-Release use
  them) and are re-exported here.
* :mod:`dpjax.calibration.screened` -- the optimisation loop's calibration
  :func:`calibrate_screened`: the full estimate's root and implicit gradient from one float32
  screen of the sample plus float64 work on the few samples that can contribute;
  :func:`calibrate_screened_reusing` carries the screen from one optimisation step to the next.
"""

# Lazy exports (PEP 562), as in :mod:`dpjax`: ``dpsgd_noise_multiplier`` needs only the PLD
# layer, while the Monte Carlo modules pull in :mod:`dpjax.montecarlo` and scipy.optimize
# (~0.7 s of a cold start on 2 cores, measured with ``python -X importtime``).
from dpjax._base import lazy_exports as _lazy_exports

_ATTRS = {
    **dict.fromkeys(("composed_gaussian_delta", "gaussian_noise_multiplier", "gaussian_noise_multiplier_core"),
                    "dpjax.calibration.gaussian"),
    **dict.fromkeys(("Bisection", "DrawPlan", "NewtonIllinois", "calibrate_accountant",
                     "calibrate_on_draws", "calibrated_noise", "estimate_minimum_samples"),
                    "dpjax.calibration.montecarlo"),
    **dict.fromkeys(("DPSGDGrid", "dpsgd_delta_fn", "dpsgd_grid", "dpsgd_noise_multiplier",
                     "dpsgd_noise_multiplier_core", "dpsgd_epsilon_fn"), "dpjax.calibration.pld"),
    **dict.fromkeys(("ScreenedDraws", "calibrate_screened", "screened_draws",
                     "ScreenState", "ScreenedStep", "calibrate_screened_reusing",
                     "empty_screen_state"),
                    "dpjax.calibration.screened"),
    **dict.fromkeys(("ImplicitAdjoint", "Solution", "SolverStats", "SolverStatus", "StopGradientAdjoint", "bisect_monotone",
                     "solve_monotone_root"), "dpjax.calibration.root"),
}

__all__ = [
    "SolverStatus", "ImplicitAdjoint", "Solution", "SolverStats", "StopGradientAdjoint", "bisect_monotone",
    "solve_monotone_root",
    "composed_gaussian_delta", "gaussian_noise_multiplier", "gaussian_noise_multiplier_core",
    "DPSGDGrid", "dpsgd_delta_fn", "dpsgd_grid", "dpsgd_noise_multiplier",
    "dpsgd_noise_multiplier_core", "dpsgd_epsilon_fn",
    "calibrate_accountant", "calibrated_noise", "estimate_minimum_samples",
    "Bisection", "NewtonIllinois", "calibrate_on_draws", "DrawPlan",
    "calibrate_screened", "screened_draws", "ScreenedDraws",
    "calibrate_screened_reusing", "empty_screen_state", "ScreenState", "ScreenedStep",
]


_SUBMODULES = ("gaussian", "montecarlo", "pld", "root", "screened")


__getattr__, __dir__ = _lazy_exports("dpjax.calibration", _ATTRS, _SUBMODULES)
