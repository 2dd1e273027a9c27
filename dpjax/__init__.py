"""dpjax: differential-privacy accounting in JAX.

Layers (one sub-package each):

* :mod:`dpjax.pld` -- FFT privacy-loss-distribution accounting (mechanism -> grid PMF ->
  composition -> (eps, delta) conversion), certified upper bounds.
* :mod:`dpjax.baselines` -- RDP (moments accountant) and the group-privacy lemma.
* :mod:`dpjax.montecarlo` -- Monte Carlo accounting of matrix mechanisms under balls-in-bins
  batching, with Estimate-Verify-Release.
* :mod:`dpjax.calibration` -- noise calibration by bisection with implicit-differentiation
  gradients.
* :mod:`dpjax.cli` -- the ``dpjax`` command.

All numerics run in float64 whatever the global ``jax_enable_x64`` flag (see
:mod:`dpjax._x64`).
"""

__version__ = "0.1.0"

from dpjax import pld  # noqa: E402
from dpjax.pld import dpsgd_delta, dpsgd_epsilon  # noqa: E402
from dpjax import matrices, montecarlo  # noqa: E402
from dpjax import calibration  # noqa: E402
from dpjax.calibration import dpsgd_noise_multiplier  # noqa: E402
from dpjax import baselines, group  # noqa: E402
# Group privacy: dpjax.dpsgd_epsilon gains group_size / sampling="fixed_batch" keywords; with the
# defaults it delegates to dpjax.pld.dpsgd_epsilon unchanged (see dpjax.group.dpsgd_epsilon).
from dpjax.group import dpsgd_epsilon, group_accounting, group_delta, group_epsilon  # noqa: E402
