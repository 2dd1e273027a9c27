"""The delta curves of a composed random-allocation PLD (dpjax.pld.allocation.lattice) against the
hockey-stick sum computed directly: the upper rows add the +inf atom and the wrapped mass above
the window, the lower rows subtract the mass below it."""

from __future__ import annotations

import numpy as np
import pytest

from dpjax.pld.allocation import lattice


def _composed(seed: int) -> lattice.Composed:
    rng = np.random.default_rng(seed)
    n = 96
    pmf = rng.dirichlet(np.ones(n), size=4) * 0.97
    return lattice.Composed(pmf=pmf, w_lo=np.array([-40, -35, -40, -35]), dx=0.05,
                            p_inf=np.array([0.01, 0.02, 0.01, 0.02]), tail_above=np.array([1e-3, 2e-3, 0.0, 0.0]),
                            tail_below=np.array([0.0, 0.0, 4e-3, 3e-3]), roundoff_rel=np.zeros(4),
                            noise_floor=np.zeros(4))


def _hockey_stick(comp: lattice.Composed, eps: np.ndarray) -> np.ndarray:
    """``sum_i p_i (1 - e^{eps - y_i})^+ + const`` per row, with the rows' constants."""
    n = comp.pmf.shape[-1]
    y = (comp.w_lo[:, None] + np.arange(n)[None, :]) * comp.dx
    const = np.concatenate([comp.p_inf[:2] + comp.tail_above[:2], comp.p_inf[2:] - comp.tail_below[2:]])
    gain = np.clip(1.0 - np.exp(eps[None, None, :] - y[:, :, None]), 0.0, None)      # (4, n, T)
    return np.clip(np.einsum("rn,rnt->rt", comp.pmf, gain) + const[:, None], 0.0, 1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delta_rows_are_the_hockey_stick_with_their_constants(seed):
    comp = _composed(seed)
    eps = np.linspace(-2.5, 3.0, 41)
    got = np.asarray(lattice.delta_of(lattice.NUMPY, comp, eps))
    np.testing.assert_allclose(got, _hockey_stick(comp, eps), rtol=1e-11, atol=1e-15)


def test_the_inf_atom_is_in_the_upper_curve_at_every_epsilon():
    # Above the window's largest loss only the constants remain: the +inf atom and the wrapped
    # mass (upper), the +inf atom less the mass below the window (lower).
    comp = _composed(0)
    far = np.array([5.0, 50.0])
    got = np.asarray(lattice.delta_of(lattice.NUMPY, comp, far))
    np.testing.assert_allclose(got[:2], np.repeat((comp.p_inf[:2] + comp.tail_above[:2])[:, None], 2, 1), rtol=1e-13)
    np.testing.assert_allclose(got[2:], np.repeat((comp.p_inf[2:] - comp.tail_below[2:])[:, None], 2, 1), rtol=1e-13)
    # More mass at +inf raises every upper delta by exactly that mass.
    more = comp._replace(p_inf=comp.p_inf + 0.05)
    eps = np.linspace(-2.0, 2.0, 9)
    np.testing.assert_allclose(np.asarray(lattice.delta_of(lattice.NUMPY, more, eps))[:2]
                               - np.asarray(lattice.delta_of(lattice.NUMPY, comp, eps))[:2], np.full((2, 9), 0.05),
                               rtol=1e-9)
