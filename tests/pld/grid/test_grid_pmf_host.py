"""The host program's in-place pessimistic PMF (``program._grid_pmf_up_host``) against the
generic ``program._grid_pmf`` it stands in for: the same values bit for bit.

NumPy runs ``_grid_pmf`` with ``kinds=("up",)`` through the in-place twin and with ``("up",
"down")`` through the generic code, whose first rows are the same pessimistic PMFs.  The loss
CDFs are the Gaussian mechanism's (loss ``N(mu, 2 mu)`` under P and ``N(-mu, 2 mu)`` under Q,
``mu = 1 / (2 sigma^2)``) on grids wide enough that their far tails fall below the flush
threshold, so the flush, the split and the exponent cap are all exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpjax._base.ops import NUMPY
from dpjax.pld.grid import program
from dpjax.pld.mechanisms import LossCDFs


def _gaussian_cdfs(sigmas, y):
    mu = 1.0 / (2.0 * np.asarray(sigmas)[:, None] ** 2)
    sd = np.sqrt(2.0 * mu)
    p, q = stats.norm(mu, sd), stats.norm(-mu, sd)
    return LossCDFs(p.cdf(y), p.sf(y), q.cdf(y), q.sf(y))


@pytest.mark.parametrize("sigmas, lo, dx, m", [
    ([0.5, 1.0, 3.0], -40.0, 0.05, 1601),
    ([0.2, 0.7], -900.0, 0.9, 2001),     # far tails below the flush threshold; exponents past the cap
    ([5.0], -2.0, 1e-3, 4001),
])
def test_host_pessimistic_pmf_is_the_generic_one_bit_for_bit(sigmas, lo, dx, m):
    y = np.broadcast_to(lo + dx * np.arange(m), (len(sigmas), m)).copy()
    c = _gaussian_cdfs(sigmas, y)
    assert np.any(np.concatenate([v.ravel() for v in c]) < program.FLUSH) or lo > -100
    host, host_inf = program._grid_pmf(NUMPY, c, y, dx, ("up",))
    both, both_inf = program._grid_pmf(NUMPY, c, y, dx, ("up", "down"))
    generic = both[: len(sigmas)]
    assert host.shape == generic.shape == (len(sigmas), m)
    assert np.array_equal(host, generic) and np.array_equal(host_inf, both_inf)
    # Not vacuous: the PMFs carry the mechanism's mass.
    assert np.all(np.abs(host.sum(axis=-1) + host_inf - 1.0) < 1e-6)
