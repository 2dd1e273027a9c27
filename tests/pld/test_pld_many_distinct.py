"""Heterogeneous schedules with more than 256 distinct noise multipliers.

They used to be blocked into 256 groups, each at its least private member (sound, but loose:
``geomspace(0.7, 3.0, 1000)`` at q = 0.01, delta 1e-5 gave 2.1931 against 2.1786 member by
member, +0.67%).  Up to ``GridOptions.max_distinct`` (now 4096) distinct values are composed
member by member: one transform each, multiplied into the running product inside a
``lax.scan`` (memory O(n) whatever the count).
"""

from __future__ import annotations

import numpy as np
import pytest

from dpjax import pld


@pytest.mark.slow
def test_300_distinct_sigmas_member_by_member_tight():
    sched = np.geomspace(0.7, 3.0, 300)
    res = pld.dpsgd_accounting(None, 0.01, 300, target_delta=1e-5, noise_schedule=sched)
    assert not res.blocked
    # Certified bracket (both ends are bounds on the truth): within 0.1%.
    assert res.epsilon_lower <= res.epsilon <= res.epsilon_lower * (1 + 1e-3)
    # The old blocking (256 blocks, each at its smallest sigma) is sound but looser.
    old = pld.dpsgd_accounting(None, 0.01, 300, target_delta=1e-5, noise_schedule=sched, with_lower=False,
                               options=pld.GridOptions(max_distinct=256))
    assert old.blocked
    assert old.epsilon >= res.epsilon_lower


def test_many_distinct_padding_and_blocking_threshold():
    """Groups of > 256 mechanisms pad to a multiple of 256 (not the next power of two), and a
    schedule is blocked only beyond max_distinct."""
    from dpjax.pld.grid.engine import prepare
    sched = np.linspace(2.0, 1.5, 300)
    comps = [(pld.PoissonSubsampledGaussian(sched, np.full(300, 0.01)), 1)]
    up, lo, _, blocked = prepare(comps, 4096)
    assert not blocked and len(up[0].counts) == 512 and int(np.sum(up[0].counts)) == 300
    up, lo, _, blocked = prepare(comps, 256)
    assert blocked and int(np.sum(up[0].counts)) == 300
