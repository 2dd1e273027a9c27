"""dpjax: differential-privacy accounting in JAX.

Layers (one sub-package each):

* :mod:`dpjax.pld` -- FFT privacy-loss-distribution accounting (mechanism -> grid PMF ->
  composition -> (eps, delta) conversion), certified upper bounds.
* :mod:`dpjax.baselines` -- RDP (moments accountant) and the group-privacy lemma.
* :mod:`dpjax.montecarlo` -- Monte Carlo accounting of matrix mechanisms under balls-in-bins
  batching, with Estimate-Verify-Release.
* :mod:`dpjax.calibration` -- noise calibration by bisection with implicit-differentiation
  gradients.
* :mod:`dpjax.optimization` -- optimising correlation matrices through the calibrated noise.
* :mod:`dpjax.sampling` -- balls-in-bins and Poisson batch schedules for training loops.
* :mod:`dpjax.noise` -- streaming correlated noise ``C^{-1} z`` (BLT buffers, Toeplitz history).
* :mod:`dpjax.report` -- privacy reports: epsilon at several deltas, the trade-off curve of both
  directions and a Gaussian-DP estimate from the certified hockey-stick curves.
* :mod:`dpjax.interop` -- dp_accounting ``DpEvent``s / ``PrivacyAccountant``, jax_privacy config,
  Opacus-style names and a running accountant.
* :mod:`dpjax.cli` -- the ``dpjax`` command.

Folders are layers and imports run one way: ``_base`` (private foundation) -> ``numerics``
(root finder, exact Gaussian curve, RDP, program cache), ``matrices`` -> ``pld`` -> ``group``,
``baselines``, ``report`` -> ``montecarlo`` -> ``calibration`` -> ``optimization`` ->
``interop``, ``cli``, inside function bodies too, with no cycle (docs/design.md §9); any
sub-package can be imported first.

All numerics run in float64 whatever the global ``jax_enable_x64`` flag (see
:mod:`dpjax._base.x64`).
"""

__version__ = "0.1.0"

# Lazy exports (PEP 562): ``import dpjax`` only imports what a name needs, on first access
# (the Monte Carlo, calibration and optimization layers pull in scipy.optimize / optax; importing
# them eagerly cost ~1 s of every cold start).  ``dpjax.X`` and ``from dpjax import X`` work as
# before.
_SUBMODULES = ("pld", "matrices", "montecarlo", "calibration", "optimization", "baselines", "group",
               "sampling", "noise", "interop", "report")
# name -> module that defines it ("module:attribute" where the defining name differs).  Group privacy: dpjax.dpsgd_epsilon gains group_size /
# sampling=FixedBatch(...) keywords; with the defaults it delegates to dpjax.pld.dpsgd_epsilon
# unchanged (see dpjax.group.group_dpsgd_epsilon).  sampling=RandomAllocation(...) / BallsInBins(...)
# with epochs= work in dpsgd_epsilon, dpsgd_delta, dpsgd_noise_multiplier, sweep_grid and
# epsilon_curve (dpjax.pld.allocation.dpsgd).
_ATTRS = {
    "dpsgd_delta": "dpjax.group:group_dpsgd_delta",
    "dpsgd_noise_multiplier": "dpjax.calibration",
    "dpsgd_epsilon": "dpjax.group:group_dpsgd_epsilon",
    "group_accounting": "dpjax.group",
    "group_delta": "dpjax.group",
    "group_epsilon": "dpjax.group",
    **dict.fromkeys(("sweep", "sweep_grid", "SweepExecution"), "dpjax.pld.sweeps.driver"),
    "epsilon_curve": "dpjax.pld.curve",
    "dpsgd_privacy_report": "dpjax.report",
    **dict.fromkeys(("TrainingScenario", "Poisson", "FixedBatch", "RandomAllocation", "BallsInBins",
                     "BMinSepSampling"),
                    "dpjax.pld.scenario"),
}

__all__ = sorted(set(_ATTRS) | set(_SUBMODULES))


from dpjax._base import lazy_exports as _lazy_exports  # noqa: E402

__getattr__, __dir__ = _lazy_exports("dpjax", _ATTRS, _SUBMODULES)
