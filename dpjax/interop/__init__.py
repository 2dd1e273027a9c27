"""Doors to the libraries users already use (dp_accounting, jax_privacy, Opacus-style names).

* :mod:`dpjax.interop.dp_accounting` -- dp_accounting ``DpEvent`` -> dpjax PLD components
  (:func:`events_to_components`), and :class:`PLDAccountant`, a
  ``dp_accounting.PrivacyAccountant`` backed by dpjax's certified FFT accountant, usable by
  ``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` and jax_privacy unchanged.
  :class:`PLDAccountantConfig` plugs it into jax_privacy's training accountants.
  dp_accounting is an optional extra (``pip install dpjax[dp_accounting]``), imported only
  when one of these names is first used.
* :mod:`dpjax.interop.opacus` -- ``get_noise_multiplier(*, target_epsilon, target_delta,
  sample_rate, steps=None, epochs=None)``, a running :class:`RDPStyleAccountant`-like
  :class:`RunningAccountant` (``step`` / ``get_epsilon`` / ``state_dict``), and calibration of
  the number of steps or the batch size (no third-party import); each also takes a Poisson
  :class:`dpjax.TrainingScenario` in place of the run's keywords.
* :mod:`dpjax.interop.allocation` -- random allocation / balls-in-bins: the
  :class:`RandomAllocationDpEvent` (and dp_accounting's own, where installed), its
  :class:`AllocationAccountant`, and :class:`RunningAllocationAccountant` for training loops.
"""

from dpjax._base import lazy_exports as _lazy_exports

_ATTRS = {
    "PLDAccountant": "dpjax.interop.dp_accounting",
    "PLDAccountantConfig": "dpjax.interop.dp_accounting",
    "events_to_components": "dpjax.interop.dp_accounting",
    "UnsupportedDpEventError": "dpjax.interop.dp_accounting",
    "RunningAccountant": "dpjax.interop.opacus",
    "get_noise_multiplier": "dpjax.interop.opacus",
    "calibrate_steps": "dpjax.interop.opacus",
    "calibrate_batch_size": "dpjax.interop.opacus",
    "RandomAllocationDpEvent": "dpjax.interop.allocation",
    "AllocationAccountant": "dpjax.interop.allocation",
    "RunningAllocationAccountant": "dpjax.interop.allocation",
}

__all__ = sorted(_ATTRS)


__getattr__, __dir__ = _lazy_exports("dpjax.interop", _ATTRS)
