"""Mechanisms as privacy-loss distributions (the first layer of :mod:`dpjax.pld`).

A *mechanism* here is an immutable pytree dataclass that knows the distribution of its privacy
loss ``Y = log(dP/dQ)(X)`` for a dominating pair ``(P, Q)`` (docs/design.md §1).  The discretizer
(:mod:`dpjax.pld.grid.discretize`) needs nothing else than four vectorized functions of a loss value
``y`` (right-continuous, so atoms sit in bins ``(y_i, y_{i+1}]``)::

    P(Y <= y),  P(Y > y),  Q(Y <= y),  Q(Y > y)

where ``Y`` under ``Q`` means the same loss function evaluated at ``X ~ Q``.  Both the CDF and
the survival function are returned because bin masses are differences of whichever of the two
is small: ``1 - cdf`` in the upper tail loses every digit below 1e-16 (a delta of 1e-10 would
vanish).

The mechanism interface (what :mod:`dpjax.pld.mog` and any new mechanism must provide)
-------------------------------------------------------------------------------------
In code: the protocol :class:`Mechanism` (its required members; the accountant takes exactly
the dataclasses that satisfy it).  In full:

* a frozen dataclass registered with :func:`jax.tree_util.register_dataclass`; numeric parameters
  are data fields (float64 scalars, or arrays with a leading axis when a group of mechanisms of
  one kind is stacked for a heterogeneous composition), non-numeric ones are ``static`` meta
  fields;
* ``symmetric: bool`` (class attribute): True when the "remove" and "add" pairs have the same
  privacy-loss distribution (Gaussian, Laplace, randomized response with replace adjacency); the
  accountant then computes one direction only;
* ``loss_cdfs(self, direction, y) -> LossCDFs`` with ``direction`` in ``("remove", "add")`` (a
  Python string, static) and ``y`` a float64 array of any shape; pure ``jnp`` code, so that it
  can be jitted, vmapped over stacked parameters and differentiated in the parameters;
* ``validate(self) -> self`` (optional but expected): boundary checks with clear ``ValueError``;
* ``host_loss_cdfs(self, direction, y)`` (optional): the same four functions in NumPy for
  concrete parameters (shape ``(G,)`` stacked, ``y`` of shape ``(L,)``, result ``(G, L)``).  The
  grid planner uses it for its probe of the loss distribution instead of compiling an XLA
  program (~1 s of a cold start).  Only the grid choice (tightness) depends on the probe, never
  soundness; without it the planner jits ``loss_cdfs``;
* ``loss_cdfs_directions(self, directions, y)`` (optional): :meth:`loss_cdfs` for a tuple of
  directions at once, ``y`` of shape ``(D, ...)`` (row ``d`` in ``directions[d]``), identical
  values; the batched composition uses it to compile one copy of the mechanism's code;
* ``max_loss(self, direction)`` (optional): host-side upper bound on the privacy loss in that
  direction (NumPy, shape of the parameters; ``inf`` when unbounded).  Where the grid cannot
  certify a direction, the accountant falls back on the pure-DP composition of these bounds
  among others (:mod:`dpjax.pld.fallback`);
* ``privacy_parameter: str`` (optional class attribute): the name of a field such that, all other
  fields equal, a larger value is more private (the pair with the smaller value dominates by
  post-processing).  Long heterogeneous schedules varying only in that field are then bracketed
  by blocks instead of composed one by one (see :class:`dpjax.pld.GridOptions`).

Convention: "remove" is ``P = M(D)``, ``Q = M(D')`` with ``D' = D`` minus one record (for
DP-SGD: ``P`` is the mixture, ``Q = N(0, sigma^2)``); "add" swaps the pair.  A guarantee for
add/remove adjacency is the max over both directions.

Example::

    >>> mech = PoissonSubsampledGaussian(noise_multiplier=1.0, sampling_prob=0.01)
    >>> cdfs = mech.loss_cdfs("remove", jnp.linspace(-0.1, 1.0, 5))   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from dpjax._base import lazy_module as _lazy_module, register_pytree_dataclass as _register_pytree_dataclass
from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.ops import is_jax, jax_ops

jax = _lazy_module("jax")
jnp = _lazy_module("jax.numpy")


class Direction(StrEnum):
    """Which dominating pair of add/remove adjacency: ``REMOVE`` is ``P = M(D)``, ``Q = M(D')``
    with ``D'`` = ``D`` minus one record; ``ADD`` swaps the pair (``Direction.ADD == "add"``)."""

    REMOVE = "remove"
    ADD = "add"


DIRECTIONS = (Direction.REMOVE, Direction.ADD)
_SQRT1_2 = 0.7071067811865476


class LossCDFs(NamedTuple):
    """``P(Y <= y), P(Y > y), Q(Y <= y), Q(Y > y)`` at the query points (same shape as ``y``)."""

    p_le: jax.Array
    p_gt: jax.Array
    q_le: jax.Array
    q_gt: jax.Array


@runtime_checkable
class Mechanism(Protocol):
    """What every mechanism provides (the interface of the module docstring, in code).

    The required members: ``symmetric`` (True when the "remove" and "add" pairs have the same
    privacy-loss distribution, so one direction is accounted), ``loss_cdfs(direction, y, ops)``
    (the four distribution functions of the loss at ``y``, pure array code in the namespace
    ``ops``: JAX by default, jit- / vmap- / grad-able), and ``validate()`` (the parameters
    checked, a ``ValueError`` naming a bad one; returns the mechanism).  The optional
    capabilities (``host_loss_cdfs``, ``loss_cdfs_directions``, ``max_loss``,
    ``privacy_parameter``) are looked up where they are used.  Mechanisms are frozen pytree
    dataclasses (:func:`dpjax._base.register_pytree_dataclass`); the accountant
    (:func:`dpjax.pld.grid.engine.as_components`) accepts exactly the dataclasses that satisfy
    this protocol."""

    symmetric: bool

    def loss_cdfs(self, direction: str, y, ops=None) -> "LossCDFs":
        ...

    def validate(self) -> "Mechanism":
        ...


def _ops(ops):
    """The array namespace of a mechanism call (:mod:`dpjax._base.ops`; None: JAX)."""
    return jax_ops() if ops is None else ops


def normal_small_tail(z, ops=None):
    """``Phi(-|z|) = min(Phi(z), 1 - Phi(z))`` (same shape as ``z``): the standard normal tail on
    the side below 1/2, ``erfc(|z|/sqrt 2)/2`` via XLA's ``erfc`` primitive (or SciPy's on the
    NumPy backend): relative error ~1e-15 down to 1e-300 (checked against scipy) and ~15x faster
    on CPU than ``jax.scipy.special.ndtr``.
    """
    ops = _ops(ops)
    # Materialized: every consumer reads the one expansion instead of XLA fusing (duplicating)
    # it into each (the erfc expansion is the largest code of a discretization).
    return ops.materialize(lambda: 0.5 * ops.erfc(ops.xp.abs(z) * _SQRT1_2))


def normal_cdf_sf(z, ops=None):
    """``(Phi(z), Phi(-z))`` with the small one always computed directly (no ``1 - Phi``), from
    :func:`normal_small_tail`."""
    ops = _ops(ops)
    small = normal_small_tail(z, ops)
    big = 1.0 - small
    neg = z < 0
    return ops.xp.where(neg, small, big), ops.xp.where(neg, big, small)


# Chebyshev-fitted erfc (Numerical Recipes' ``erfcc``): fractional error < 1.2e-7 for every
# x >= 0, down to underflow.  Used only by the grid planner's probe (host_loss_cdfs), where it
# decides tightness knobs (support, moments, Chernoff parameters), never a reported bound.
_ERFCC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
          1.48851587, -0.82215223, 0.17087277)


def _np_erfc_nonneg(x):
    t = 1.0 / (1.0 + 0.5 * x)
    poly = np.full_like(t, _ERFCC[-1])
    for c in _ERFCC[-2::-1]:
        poly = poly * t + c
    with np.errstate(under="ignore"):
        return t * np.exp(-x * x + poly)


def _npnormal_cdf_sf(z):
    """NumPy twin of :func:`normal_cdf_sf` for the planner: vectorized, no XLA compile, no
    scipy import; relative error < 1.2e-7 (the jitted CDFs that build the grid PMFs are the
    accurate ones)."""
    z = np.asarray(z, np.float64)
    small = 0.5 * _np_erfc_nonneg(np.abs(z) * _SQRT1_2)
    big = 1.0 - small
    neg = z < 0
    return np.where(neg, small, big), np.where(neg, big, small)


def check_direction(direction: str) -> None:
    """Raise ``ValueError`` unless ``direction`` is ``"remove"`` or ``"add"``."""
    Direction.parse(direction)


def _f64(x):
    return jnp.asarray(x, jnp.float64)


# --------------------------------------------------------------------------------------------
@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class Gaussian:
    """Gaussian mechanism with noise std ``noise_multiplier`` and L2 sensitivity ``sensitivity``.

    Neighbouring outputs differ by ``sensitivity``, i.e. ``P = N(sensitivity, sigma^2)`` and
    ``Q = N(0, sigma^2)`` with ``sigma = noise_multiplier``.  The privacy loss under ``P`` is
    ``N(mu, 2 mu)`` with ``mu = sensitivity^2 / (2 sigma^2)``; under ``Q`` it is ``N(-mu, 2 mu)``.
    The pair is symmetric (add = remove = replace with that shift).
    """

    noise_multiplier: jax.Array
    sensitivity: jax.Array = 1.0

    symmetric = True
    privacy_parameter = "noise_multiplier"

    def validate(self) -> "Gaussian":
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.positive("sensitivity", self.sensitivity)
        return self

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        check_direction(direction)
        ops = _ops(ops)
        xp = ops.xp
        y = xp.asarray(y, np.float64)
        r = xp.asarray(self.sensitivity, np.float64) / xp.asarray(self.noise_multiplier, np.float64)  # loss std
        mu = 0.5 * r * r
        p_le, p_gt = normal_cdf_sf((y - mu) / r, ops)
        q_le, q_gt = normal_cdf_sf((y + mu) / r, ops)
        return LossCDFs(p_le, p_gt, q_le, q_gt)

    def host_loss_cdfs(self, direction: str, y) -> LossCDFs:
        check_direction(direction)
        r = (np.asarray(self.sensitivity, np.float64) / np.asarray(self.noise_multiplier, np.float64))[..., None]
        mu = 0.5 * r * r
        y = np.asarray(y, np.float64)
        return LossCDFs(*_npnormal_cdf_sf((y - mu) / r), *_npnormal_cdf_sf((y + mu) / r))


# The means of the two Gaussians of a Poisson-subsampled Gaussian (sensitivity 1).
_MEANS = np.array([0.0, 1.0])


# --------------------------------------------------------------------------------------------
@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class PoissonSubsampledGaussian:
    """One DP-SGD step: Poisson sampling with probability ``sampling_prob``, Gaussian noise.

    Sensitivity 1 (clip norm folded into ``noise_multiplier = sigma``), add/remove adjacency.
    Remove: ``P = (1-q) N(0, s^2) + q N(1, s^2)``, ``Q = N(0, s^2)``; add: the pair swapped
    (docs/design.md §1).  The loss ``l(x) = log(1 - q + q exp((2x - 1) / (2 s^2)))`` is increasing in
    ``x`` and bounded below by ``log(1-q)``; its inverse is
    ``x(y) = s^2 log((e^y - (1 - q)) / q) + 1/2`` for ``y > log(1 - q)``.  Under "add" the loss is
    ``-l(X)`` with ``X ~ N(0, s^2)``, bounded above by ``-log(1-q)``.
    """

    noise_multiplier: jax.Array
    sampling_prob: jax.Array

    symmetric = False
    privacy_parameter = "noise_multiplier"

    def validate(self) -> "PoissonSubsampledGaussian":
        _validate.positive("noise_multiplier", self.noise_multiplier)
        _validate.probability_open_closed("sampling_prob", self.sampling_prob)
        return self

    def _x_of_loss(self, y, ops=None):
        """Inverse of the remove-direction loss; ``-1e30`` (as good as ``-inf``) where
        ``y <= log(1-q)``.

        A finite sentinel rather than ``-inf``: the CDF values are the same (``Phi(-1e30/s) = 0``)
        but reverse-mode AD would form ``0 * inf = NaN`` in ``d(x/s)/ds``.
        """
        xp = _ops(ops).xp
        s = xp.asarray(self.noise_multiplier, np.float64)
        q = xp.asarray(self.sampling_prob, np.float64)
        # log(e^y - (1 - q)) = y + log(1 - (1-q) e^{-y}) = y + log(-expm1(log1p(-q) - y)):
        # accurate for every y above the bound log1p(-q), including q = 1 (bound -inf) and
        # y << 0 (where expm1(y) + q would cancel to 0).
        with np.errstate(divide="ignore"):
            bound = xp.log1p(-q)
        ok = y > bound
        r = xp.where(ok, bound - y, -1.0)
        log_arg = y + xp.log(-xp.expm1(r))
        x = s * s * (log_arg - xp.log(q)) + 0.5
        return xp.where(ok, x, -1e30), s, q

    def loss_cdfs_directions(self, directions: tuple[str, ...], y, ops=None) -> LossCDFs:
        """:meth:`loss_cdfs` for several directions at once: ``y`` has shape ``(D, ...)``, row
        ``d`` in ``directions[d]``.  One inverse-loss and one erfc evaluation for all rows (less
        code for XLA to compile: the erfc expansion is the largest part of the discretizer)."""
        for d in directions:
            check_direction(d)
        ops = _ops(ops)
        xp = ops.xp
        y = xp.asarray(y, np.float64)
        shape = (len(directions),) + (1,) * (y.ndim - 1)
        remove = np.array([d == "remove" for d in directions]).reshape(shape)
        # remove: {Y <= y} = {X <= x(y)};  add: Y = -l(X), {Y <= y} = {l(X) >= -y} = {X >= x(-y)}.
        x, s, q = self._x_of_loss(xp.where(remove, y, -y), ops)
        # a: N(0, s^2), b: N(1, s^2); both normal CDFs in one erfc call.  ``x`` broadcast against
        # the two means rather than stacked: XLA fuses a stack's operands into the concatenation,
        # which evaluated the inverse loss (a log and an expm1 per point) once for each mean.
        (a_le, b_le), (a_gt, b_gt) = normal_cdf_sf((x[None] - _MEANS.reshape((2,) + (1,) * x.ndim)) / s, ops)
        mix_le = (1.0 - q) * a_le + q * b_le
        mix_gt = (1.0 - q) * a_gt + q * b_gt
        # remove: P is the mixture, Q = N(0, s^2).  add: the pair swapped, and the event is
        # {X >= x}, of probability Phi(-x/s) = a_gt under N(0, s^2) (continuous X).
        return LossCDFs(xp.where(remove, mix_le, a_gt), xp.where(remove, mix_gt, a_le),
                        xp.where(remove, a_le, mix_gt), xp.where(remove, a_gt, mix_le))

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        check_direction(direction)
        xp = _ops(ops).xp
        return LossCDFs(*(v[0] for v in self.loss_cdfs_directions((direction,), xp.asarray(y, np.float64)[None],
                                                                  ops)))

    # ----------------------------------------------------------------------------------------
    # Both directions on one lattice.  The add pair is the remove pair swapped, so both
    # directions' CDFs at grid losses are the two normal CDFs of ``x(u)`` on the same lattice
    # ``u = k dx`` (remove at ``k = o_r + j``, add at ``k = -(o_a + j)``).  Below the loss bound
    # ``log(1 - q)`` they are constants (``x = -inf``), and the add direction's non-constant
    # points mirror into the remove direction's range: one evaluation on a lattice slightly
    # longer than ``m`` serves both (about half the erfc and log work of two evaluations), with
    # the same arithmetic on the same arguments, hence the same values.

    def _lattice_start(self, offset_remove, dx, ops=None):
        """First lattice index: the remove grid's first point or, if lower, two points below
        the last lattice point at or under the loss bound (every index below is constant)."""
        xp = _ops(ops).xp
        with np.errstate(divide="ignore"):
            k_bound = xp.floor(xp.log1p(-xp.asarray(self.sampling_prob, np.float64)) / dx)
        k_bound = xp.maximum(k_bound, -2.0**62).astype(np.int64)
        return xp.minimum(offset_remove, k_bound - 1)

    def lattice_fits(self, offsets_remove, offsets_add, dx: float, m: int, length: int) -> bool:
        """Host check (concrete plan) that a lattice of ``length`` points from
        :meth:`_lattice_start` holds both directions' non-constant points for every stacked
        mechanism, with two points to spare (host and compiled floor may differ by one)."""
        q = np.asarray(self.sampling_prob, np.float64)
        if not np.all((q > 0) & (q < 1)) or not dx > 0:
            return False
        o_r, o_a = np.asarray(offsets_remove, np.int64), np.asarray(offsets_add, np.int64)
        with np.errstate(divide="ignore"):
            k_bound = np.floor(np.log1p(-q) / dx)
        start = np.minimum(o_r, k_bound - 1)
        return bool(np.all(o_r - start + m <= length - 2) and np.all(-o_a - start <= length - 3))

    def lattice_length(self, offsets_remove, offsets_add, dx: float, m: int) -> int | None:
        """The shortest lattice length that :meth:`lattice_fits` accepts for these concrete
        offsets (one scalar mechanism), or None when the lattice does not apply (``q = 1``)."""
        q = float(np.asarray(self.sampling_prob, np.float64))
        if not (0.0 < q < 1.0) or not dx > 0:
            return None
        k_bound = math.floor(math.log1p(-q) / dx)
        start = min(int(offsets_remove), k_bound - 1)
        return max(int(offsets_remove) - start + m + 2, -int(offsets_add) - start + 3)

    def _lattice_values(self, start, dx, lo: int, hi: int, ops=None):
        """``(mix_le, mix_gt, a_le, a_gt)`` at the lattice indices ``[lo, hi)`` (pointwise: any
        split of the lattice gives the same values)."""
        xp = _ops(ops).xp
        u = (start + xp.arange(lo, hi)) * dx
        x, s, q = self._x_of_loss(u, ops)
        (a_le, b_le), (a_gt, b_gt) = normal_cdf_sf((x[None] - _MEANS.reshape(2, 1)) / s, ops)
        return (1.0 - q) * a_le + q * b_le, (1.0 - q) * a_gt + q * b_gt, a_le, a_gt

    def loss_cdfs_lattice(self, offsets, dx, m: int, length: int, ops=None, split=None) -> LossCDFs:
        """:meth:`loss_cdfs_directions` for directions ``("remove", "add")`` at the grid losses
        ``(offsets[d] + j) dx``, ``j < m``, from one evaluation on ``length`` lattice points
        (see above; :meth:`lattice_fits` says when ``length`` suffices: an uncovered point would
        be NaN, which the accountant reports as no bound).  ``split`` (host only): a function
        running ``fn(*args)`` in the background and returning its result's getter, to evaluate
        the upper half of the lattice there (the same values)."""
        ops = _ops(ops)
        xp = ops.xp
        start = self._lattice_start(offsets[0], dx, ops)
        if split is not None and not is_jax(ops) and length >= 8192:
            half = length // 2
            upper = split(self._lattice_values, start, dx, half, length, ops)
            lower = self._lattice_values(start, dx, 0, half, ops)
            mix_le, mix_gt, a_le, a_gt = (np.concatenate(v) for v in zip(lower, upper()))
        else:
            mix_le, mix_gt, a_le, a_gt = self._lattice_values(start, dx, 0, length, ops)
        s = xp.asarray(self.noise_multiplier, np.float64)
        q = xp.asarray(self.sampling_prob, np.float64)
        # The constants below the loss bound: the same formulas at x = -1e30 (the sentinel).
        (c_ale, c_ble), (c_agt, c_bgt) = normal_cdf_sf((xp.full((1,), -1e30) - _MEANS.reshape(2, 1)) / s, ops)
        c_mle = (1.0 - q) * c_ale + q * c_ble
        c_mgt = (1.0 - q) * c_agt + q * c_bgt
        if not is_jax(ops):
            return self._lattice_rows_host(offsets, start, m, length, (mix_le, mix_gt, a_le, a_gt),
                                           (c_mle, c_mgt, c_ale, c_agt))
        j = xp.arange(m)
        i_r = offsets[0] - start + j
        i_a = -(offsets[1] + j) - start
        below = i_a < 0
        nan = xp.where(i_a >= length, np.nan, 0.0)
        i_a = xp.clip(i_a, 0, length - 1)

        def add(v, const):
            return xp.where(below, const[0], v[i_a]) + nan

        # remove: P the mixture, Q = N(0, s^2); add: the pair swapped, event {X >= x}.
        return LossCDFs(xp.stack([mix_le[i_r], add(a_gt, c_agt)]), xp.stack([mix_gt[i_r], add(a_le, c_ale)]),
                        xp.stack([a_le[i_r], add(mix_gt, c_mgt)]), xp.stack([a_gt[i_r], add(mix_le, c_mle)]))

    @staticmethod
    def _lattice_rows_host(offsets, start, m: int, length: int, values, constants) -> LossCDFs:
        """The rows of :meth:`loss_cdfs_lattice` in NumPy by slicing: the remove grid is the
        lattice from ``offsets[0] - start`` on, the add grid the lattice read backwards from
        ``-offsets[1] - start``, the constant below index 0 and NaN above the lattice (the same
        entries as the gathers, without them)."""
        mix_le, mix_gt, a_le, a_gt = values
        c_mle, c_mgt, c_ale, c_agt = constants
        r0 = int(offsets[0]) - int(start)
        a0 = -int(offsets[1]) - int(start)           # add's lattice index at j = 0, decreasing in j
        # j in [lo, hi) reads the lattice at a0 - j in [0, length); j < lo is above it, j >= hi below.
        lo, hi = max(0, a0 - length + 1), min(m, a0 + 1)

        def rows(remove, add_v, const):
            out = np.empty((2, m))
            out[0] = remove[r0:r0 + m]
            out[1, :lo] = np.nan
            if hi > lo:
                out[1, lo:hi] = add_v[a0 - lo::-1][:hi - lo] if a0 - lo >= 0 else add_v[:0]
            out[1, max(hi, lo):] = const[0]
            return out

        # remove: P the mixture, Q = N(0, s^2); add: the pair swapped, event {X >= x}.
        return LossCDFs(rows(mix_le, a_gt, c_agt), rows(mix_gt, a_le, c_ale), rows(a_le, mix_gt, c_mgt),
                        rows(a_gt, mix_le, c_mle))

    def max_loss(self, direction: str) -> np.ndarray:
        """Upper bound of the loss: ``-log(1 - q)`` under "add" (``inf`` at ``q = 1``), ``inf`` under "remove"."""
        check_direction(direction)
        q = np.asarray(self.sampling_prob, np.float64)
        if direction == "remove":
            return np.full(q.shape, np.inf)
        with np.errstate(divide="ignore"):
            return -np.log1p(-q)

    def host_loss_cdfs(self, direction: str, y) -> LossCDFs:
        """NumPy :meth:`loss_cdfs` for concrete parameters ``(G,)`` and losses ``(L,)`` -> ``(G, L)``."""
        check_direction(direction)
        s = np.asarray(self.noise_multiplier, np.float64)[..., None]
        q = np.asarray(self.sampling_prob, np.float64)[..., None]
        y = np.asarray(y, np.float64)
        if direction == "add":
            y = -y
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            bound = np.log1p(-q)
            ok = y > bound
            r = np.where(ok, bound - y, -1.0)
            x = s * s * (y + np.log(-np.expm1(r)) - np.log(q)) + 0.5
        x = np.where(ok, x, -1e30)
        a_le, a_gt = _npnormal_cdf_sf(x / s)
        b_le, b_gt = _npnormal_cdf_sf((x - 1.0) / s)
        mix_le = (1.0 - q) * a_le + q * b_le
        mix_gt = (1.0 - q) * a_gt + q * b_gt
        if direction == "remove":
            return LossCDFs(mix_le, mix_gt, a_le, a_gt)
        return LossCDFs(a_gt, a_le, mix_gt, mix_le)


# --------------------------------------------------------------------------------------------
@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class Laplace:
    """Laplace mechanism with scale ``scale`` (b) and L1 sensitivity ``sensitivity`` (Delta).

    ``P = Lap(0, b)``, ``Q = Lap(Delta, b)``; with ``a = Delta / b`` the loss
    ``(|x - Delta| - |x|) / b`` has atoms ``+a`` (P-mass 1/2) and ``-a`` (P-mass e^{-a}/2) and
    is linear in between (Koskela & Honkela 2021, §6.1).  Symmetric: add, remove and replace coincide.
    """

    scale: jax.Array
    sensitivity: jax.Array = 1.0

    symmetric = True
    privacy_parameter = "scale"

    def validate(self) -> "Laplace":
        _validate.positive("scale", self.scale)
        _validate.positive("sensitivity", self.sensitivity)
        return self

    def max_loss(self, direction: str) -> np.ndarray:
        """Upper bound of the loss, ``Delta / b`` (either direction)."""
        check_direction(direction)
        return np.asarray(self.sensitivity, np.float64) / np.asarray(self.scale, np.float64)

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        check_direction(direction)
        xp = _ops(ops).xp
        y = xp.asarray(y, np.float64)
        a = xp.asarray(self.sensitivity, np.float64) / xp.asarray(self.scale, np.float64)
        below = y < -a
        above = y >= a
        yc = xp.clip(y, -a, a)
        # Inside [-a, a): P(Y <= y) = P(X >= (Delta - b y)/2) = exp(-(a - y)/2) / 2.
        p_in = 0.5 * xp.exp(-0.5 * (a - yc))
        q_gt_in = 0.5 * xp.exp(-0.5 * (a + yc))
        p_le = xp.where(below, 0.0, xp.where(above, 1.0, p_in))
        p_gt = xp.where(below, 1.0, xp.where(above, 0.0, 1.0 - p_in))
        q_le = xp.where(below, 0.0, xp.where(above, 1.0, 1.0 - q_gt_in))
        q_gt = xp.where(below, 1.0, xp.where(above, 0.0, q_gt_in))
        return LossCDFs(p_le, p_gt, q_le, q_gt)


# --------------------------------------------------------------------------------------------
@_register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class RandomizedResponse:
    """k-ary randomized response, replace adjacency (the true value changes).

    With probability ``noise_parameter`` (p) the output is a uniformly random bucket out of
    ``num_buckets`` (k), otherwise the true value (dp_accounting's convention; e.g. p = 0.96,
    k = 2 answers correctly with probability 0.52).  Losses: ``+l`` with P-mass ``1 - p + p/k``,
    ``-l`` with P-mass ``p/k`` and ``0`` with P-mass ``(k-2) p/k``, ``l = log(1 + k(1-p)/p)``.
    Symmetric.  Use :meth:`from_probability_correct` for the binary "answer truthfully with
    probability pi" parametrisation.
    """

    noise_parameter: jax.Array
    num_buckets: int = dataclasses.field(default=2, metadata=dict(static=True))

    symmetric = True

    @classmethod
    def from_probability_correct(cls, probability_correct) -> "RandomizedResponse":
        """Binary RR answering truthfully with probability ``probability_correct`` in [1/2, 1)."""
        pc = float(probability_correct)
        if not (0.5 <= pc < 1.0):
            raise ValueError(f"probability_correct must be in [0.5, 1), got {probability_correct!r}")
        return cls(noise_parameter=2.0 * (1.0 - pc), num_buckets=2)

    def validate(self) -> "RandomizedResponse":
        _validate.probability_open_closed("noise_parameter", self.noise_parameter)
        _validate.positive_int("num_buckets", self.num_buckets, minimum=2)
        return self

    def max_loss(self, direction: str) -> np.ndarray:
        """Upper bound of the loss, ``log(1 + k (1 - p) / p)`` (0 at ``p = 1``: the answer is uniform)."""
        check_direction(direction)
        p = np.asarray(self.noise_parameter, np.float64)
        return np.log1p(self.num_buckets * (1.0 - p) / p)

    def loss_cdfs(self, direction: str, y, ops=None) -> LossCDFs:
        check_direction(direction)
        xp = _ops(ops).xp
        y = xp.asarray(y, np.float64)
        p = xp.asarray(self.noise_parameter, np.float64)
        k = float(self.num_buckets)
        hi_mass = 1.0 - p + p / k
        lo_mass = p / k
        mid_mass = (k - 2.0) * p / k
        ell = xp.log1p(k * (1.0 - p) / p)
        ge_lo = y >= -ell
        ge_mid = y >= 0.0
        ge_hi = y >= ell
        zero = xp.zeros_like(y)
        p_le = xp.where(ge_lo, lo_mass, zero) + xp.where(ge_mid, mid_mass, zero) + xp.where(ge_hi, hi_mass, zero)
        p_gt = xp.where(ge_lo, zero, lo_mass) + xp.where(ge_mid, zero, mid_mass) + xp.where(ge_hi, zero, hi_mass)
        # Under Q the atoms swap masses: loss +l has Q-mass p/k, loss -l has Q-mass 1-p+p/k.
        q_le = xp.where(ge_lo, hi_mass, zero) + xp.where(ge_mid, mid_mass, zero) + xp.where(ge_hi, lo_mass, zero)
        q_gt = xp.where(ge_lo, zero, hi_mass) + xp.where(ge_mid, zero, mid_mass) + xp.where(ge_hi, zero, lo_mass)
        return LossCDFs(p_le, p_gt, q_le, q_gt)
