"""The hockey-stick tables of dpjax.pld.grid.convert against the delta curve computed directly from
a composed PLD: the upper curve adds the +inf atom, the wrapped mass from above the window and the
round-off allowance; the lower curve subtracts the wrapped mass from below and the allowance."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax._base.x64 import float64
from dpjax.pld.grid import convert
from dpjax.pld.grid.compose import ComposedPLD

# Constants large enough that leaving any one of them out moves delta far beyond round-off.
_P_INF, _ABOVE, _BELOW, _ROUNDOFF = 2e-3, 5e-4, 3e-4, 1e-4


def _pld(seed: int) -> ComposedPLD:
    """A composed PLD of NumPy float64 fields (JAX arrays are made inside the float64 scope)."""
    rng = np.random.default_rng(seed)
    n = 128
    r = rng.dirichlet(np.ones(n)) * 0.95
    f = np.float64
    return ComposedPLD(pmf=r, w_lo=np.int64(-50), dx=f(0.04), p_inf=f(_P_INF), tail_above=f(_ABOVE),
                       tail_below=f(_BELOW), roundoff=f(_ROUNDOFF), roundoff_rel=f(0.0),
                       log_mgf=np.zeros(2), needed_width=f(1.0))


def _direct(p: ComposedPLD, eps: np.ndarray, bound: str) -> np.ndarray:
    r = np.asarray(p.pmf)
    y = (int(p.w_lo) + np.arange(r.size)) * float(p.dx)
    above = eps[:, None] < y[None, :]
    hits = np.where(above, r[None, :], 0.0).sum(-1)
    weighted = np.where(above, r[None, :] * np.exp(eps[:, None] - y[None, :]), 0.0).sum(-1)
    if bound == "upper":
        d = hits - weighted + _P_INF + _ABOVE + _ROUNDOFF
    else:
        d = hits - weighted + _P_INF - _BELOW - _ROUNDOFF
    return np.clip(d, 0.0, 1.0)


def _table_delta(p, eps, bound):
    fields = p._asdict()
    return _table_delta_of_fields(fields, eps, bound)


@float64
def _table_delta_of_fields(fields, eps, bound):
    return _jitted_table_delta({k: jnp.asarray(v) for k, v in fields.items()}, jnp.asarray(eps), bound=bound)


# One compiled program per bound and shape (the eager path runs the table's ops one by one).
@functools.partial(jax.jit, static_argnames=("bound",))
def _jitted_table_delta(fields, eps, bound):
    return convert.delta_at(convert.table(ComposedPLD(**fields), bound), eps)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bound", ["upper", "lower"])
def test_table_delta_is_the_direct_hockey_stick(seed, bound):
    p = _pld(seed)
    # Inside the window, on grid points and between them, and beyond both ends.
    eps = np.r_[np.linspace(-2.5, 3.0, 57), -10.0, 10.0]
    got = np.asarray(_table_delta(p, eps, bound))
    np.testing.assert_allclose(got, _direct(p, eps, bound), rtol=1e-10, atol=1e-15)


def test_beyond_the_window_only_the_constants_remain():
    p = _pld(0)
    got = np.asarray(_table_delta(p, np.array([5.0, 100.0]), "upper"))
    np.testing.assert_allclose(got, np.full(2, _P_INF + _ABOVE + _ROUNDOFF), rtol=1e-12)
    got = np.asarray(_table_delta(p, np.array([5.0, 100.0]), "lower"))
    np.testing.assert_allclose(got, np.full(2, _P_INF - _BELOW - _ROUNDOFF), rtol=1e-12)
