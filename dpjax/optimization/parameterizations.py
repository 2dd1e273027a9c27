"""Parameterizations of correlation matrices ``C`` for optimisation (docs/design.md §6.1).

A parameterization is an immutable, hashable object holding only the *static* configuration of
a family of correlation matrices (``n``, the number of bands or buffers); the optimisable
*parameters* are a separate pytree (a dict of float64 arrays) of unconstrained reals.  Every
parameter value maps to a valid matrix of the family: lower triangular, non-negative, unit
diagonal (``c_0 = 1``; scaling ``C`` is absorbed by the noise multiplier, docs/design.md §6).

=================================  ================================================================
``ToeplitzParameterization(n)``     ``c_k = softplus(p_k)``, ``k = 1..n-1``           (``n - 1`` params)
``BandedToeplitzParameterization``  ``c_1..c_{bands-1}`` free (softplus), ``c_k = 0`` for
``(n, bands)``                      ``k >= bands``                                  (``bands - 1``)
``BLTParameterization(n, d)``       ``c_k = sum_j omega_j theta_j^(k-1)``; ``theta`` strictly
                                    decreasing in ``(0, 1)`` (bounded logits, softmax-split
                                    gaps >= a minimum), ``omega = softplus(.) > 0``   (``2 d + 1``)
``DenseParameterization(n)``        strictly-lower entries ``softplus(p)``, diagonal 1, small ``n``
                                                                                     (``n(n-1)/2``)
=================================  ================================================================

The Toeplitz families never form an ``n x n`` matrix: :meth:`correlation` returns a
:class:`dpjax.matrices.Toeplitz` or :class:`dpjax.matrices.BLT` (first column in O(n) or
O(n d)), which the objectives (:mod:`dpjax.optimization.objectives`, O(n log n)) and the Monte
Carlo calibration (Gram matrix in O(b n)) consume directly.  :meth:`correlation` and
:meth:`first_column` are pure, differentiable, and safe under ``jit``/``vmap`` (no validation of
traced values); call them with x64 enabled or through the dpjax entry points, which run in
float64.

Initialisation (:meth:`init`, deterministic).  Without a participation pattern it is a closed
form: the square root of the prefix-sum matrix, ``c_k = prod_{j<=k} (2j - 1)/(2j)``
(Fichtenberger, Henzinger & Upadhyay 2023; optimal for single-participation max error,
Dvijotham, McMahan, Pillutla, Steinke & Thakurta 2024), truncated for the banded family and
least-squares fitted (fixed geometric decays, non-negative scales) for BLT.  With
``batches_per_epoch=b, epochs=E`` it refines that start to the *unamplified* optimum of the
family for ``E`` participations ``b`` rounds apart (the worst case of balls-in-bins batching
without amplification: sensitivity ``max_i |m_i|_2``, docs/design.md §4), minimising
``sensitivity(C)^2 * prefix_sum_error(C)^2`` with L-BFGS; this is the unamplified baseline of
Choquette-Choo et al. 2024 (§5.1) and a good start for the amplified objective.

Usage::

    from dpjax.optimization import make_parameterization, prefix_sum_error
    par = make_parameterization("blt", 2048, num_buffers=4)
    params = par.init(batches_per_epoch=128, epochs=16)
    C = par.correlation(params)            # a dpjax.matrices.BLT
    prefix_sum_error(C, par.n)             # |A C^-1|_F / sqrt(n)
"""

from __future__ import annotations

import abc

import dataclasses
import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.x64 import float64
from dpjax.matrices import BLT, Toeplitz

__all__ = [
    "Parameterization",
    "ToeplitzParameterization",
    "BandedToeplitzParameterization",
    "BLTParameterization",
    "DenseParameterization",
    "make_parameterization",
    "params_to_list",
    "params_from_list",
    "sqrt_prefix_sum_coefficients",
    "unamplified_sensitivity",
    "unamplified_loss",
    "FAMILIES",
    "Family",
    "DENSE_MAX_N",
    "DECAY_LOGIT_MIN",
    "DECAY_LOGIT_MIN_GAP",
]

#: Largest ``n`` the dense family accepts (``n (n - 1) / 2`` parameters and O(n^3) solves).
DENSE_MAX_N = 512
class Family(StrEnum):
    """The correlation-matrix families that :func:`make_parameterization` builds."""

    TOEPLITZ = "toeplitz"
    BANDED = "banded"
    BLT = "blt"
    DENSE = "dense"


FAMILIES = tuple(f.value for f in Family)


# --------------------------------------------------------------------------- helpers


def _softplus_inverse(y):
    """``x`` with ``softplus(x) = y`` for ``y > 0`` (NumPy; stable for small and large ``y``)."""
    y = np.asarray(y, dtype=np.float64)
    return np.where(y > 30.0, y, np.log(np.expm1(np.minimum(y, 30.0))))


def _logit(p):
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def sqrt_prefix_sum_coefficients(n: int) -> np.ndarray:
    """First column ``(n,)`` of the lower-triangular Toeplitz square root of the prefix-sum matrix.

    ``c_k = prod_{j=1..k} (2j - 1) / (2j)`` (the power series of ``(1 - x)^{-1/2}``), so that
    ``C C = A``.  ``c_0 = 1``, positive, decreasing, ``c_k ~ 1 / sqrt(pi k)``.
    """
    n = _validate.positive_int("n", n)
    k = np.arange(1, n, dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2.0 * k - 1.0) / (2.0 * k))])


def unamplified_sensitivity(first_column, batches_per_epoch: int, epochs: int):
    """L2 sensitivity of a non-negative Toeplitz ``C`` under ``E`` participations ``b`` apart.

    ``max_i |m_i|_2`` with modes ``m_i = sum_{j<E} C[:, b j + i]`` (docs/design.md §4).  For
    Toeplitz ``C`` the mode ``m_i`` is ``m_0`` shifted down by ``i`` rows and truncated, so with
    non-negative entries the maximum is ``|m_0|_2``, and ``m_0`` is the cumulative sum over
    epochs of the column reshaped to ``(E, b)``: O(n), differentiable.  ``first_column`` is
    zero-padded to ``n = b E``.  Pure (jit/vmap safe); no validation.
    """
    b, epochs = int(batches_per_epoch), int(epochs)
    n = b * epochs
    c = jnp.asarray(first_column)
    c = jnp.pad(c, (0, n - c.shape[0])) if c.shape[0] < n else c[:n]
    m0 = jnp.cumsum(c.reshape(epochs, b), axis=0)
    return jnp.sqrt(jnp.sum(m0 * m0))


def _dense_unamplified_sensitivity(matrix, batches_per_epoch: int):
    n = matrix.shape[0]
    b = int(batches_per_epoch)
    modes = matrix.reshape(n, n // b, b).sum(axis=1)  # (n, b): column i is mode m_i
    return jnp.sqrt(jnp.max(jnp.sum(modes * modes, axis=0)))


def unamplified_loss(parameterization, params, batches_per_epoch: int, epochs: int):
    """``sensitivity(C)^2 * prefix_sum_error(C)^2``: the squared RMSE per unit Gaussian noise
    multiplier of the unamplified mechanism (``E`` participations ``b`` rounds apart).

    Pure and differentiable; minimised by :meth:`Parameterization.init` when a participation
    pattern is given.  The unamplified RMSE at ``(eps, delta)`` is
    ``gaussian_noise_multiplier(eps, delta) * sqrt(unamplified_loss)``.
    """
    from dpjax.optimization.objectives import prefix_sum_error_pure

    corr = parameterization._correlation(params)
    if isinstance(corr, (Toeplitz, BLT)):
        sens = unamplified_sensitivity(corr.column(parameterization.n), batches_per_epoch, epochs)
    else:
        sens = _dense_unamplified_sensitivity(corr, batches_per_epoch)
    err = prefix_sum_error_pure(corr, parameterization.n)
    return (sens * err) ** 2


def params_to_list(params) -> dict:
    """JSON-ready copy of a parameter pytree (dict of arrays -> dict of lists of floats)."""
    return {k: np.asarray(v, dtype=np.float64).tolist() for k, v in params.items()}


def params_from_list(d) -> dict:
    """Inverse of :func:`params_to_list`: dict of lists -> dict of float64 ``jnp`` arrays."""
    return _to_jnp({k: np.asarray(v, dtype=np.float64) for k, v in d.items()})


def _to_jnp(d: dict) -> dict:
    with jax.enable_x64(True):
        return {k: jnp.asarray(np.asarray(v, dtype=np.float64), jnp.float64) for k, v in d.items()}


def _as_params(params) -> dict:
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict of arrays (the pytree from .init), got {type(params).__name__}")
    return params


# --------------------------------------------------------------------------- base class


class Parameterization(abc.ABC):
    """Shared behaviour; subclasses are frozen dataclasses of static configuration and must
    implement ``_correlation`` and ``_closed_form_init`` (abstract: the base is never built)."""

    name: ClassVar[str]

    def _check_n(self):
        _validate.positive_int("n", self.n)

    # -- to implement
    @abc.abstractmethod
    def _correlation(self, params):
        """``C`` for ``params`` (the family's structured matrix or a dense array)."""

    @float64
    def correlation(self, params):
        """``C`` for ``params``: a :class:`~dpjax.matrices.Toeplitz` / :class:`~dpjax.matrices.BLT`
        (Toeplitz families) or an ``(n, n)`` array (dense).  Pure, differentiable; float64."""
        return self._correlation(params)

    @abc.abstractmethod
    def _closed_form_init(self) -> dict:
        """Deterministic starting parameters (a closed form; no optimisation)."""

    # -- common
    def param_shapes(self) -> dict:
        return {k: np.shape(v) for k, v in self._closed_form_init().items()}

    def num_params(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.param_shapes().values()))

    @float64
    def first_column(self, params):
        """First column of ``C``, ``(n,)`` (differentiable, jit/vmap safe)."""
        corr = self._correlation(params)
        if isinstance(corr, (Toeplitz, BLT)):
            return corr.column(self.n)
        return corr[:, 0]

    def check_params(self, params) -> dict:
        """Validate a concrete parameter pytree (keys, shapes, finite); ValueError naming the key."""
        params = _as_params(params)
        expected = self.param_shapes()
        if set(params) != set(expected):
            raise ValueError(f"params must have keys {sorted(expected)} for {self!r}, got {sorted(params)}")
        for key, shape in expected.items():
            arr = np.asarray(params[key], dtype=np.float64)
            if arr.shape != tuple(shape):
                raise ValueError(f"params[{key!r}] must have shape {tuple(shape)}, got {arr.shape}")
            if not np.isfinite(arr).all():
                raise ValueError(f"params[{key!r}] must be finite (no NaN/inf)")
        return params

    @float64
    def init(self, *, batches_per_epoch: int | None = None, epochs: int | None = None,
             max_iterations: int = 200) -> dict:
        """Deterministic starting parameters (a dict of float64 arrays).

        Without a participation pattern: the closed form of the module docstring (square root
        of the prefix-sum matrix, truncated or BLT-fitted).  With ``batches_per_epoch`` and
        ``epochs`` (both or neither; ``b * E`` must equal ``n``): that start refined by L-BFGS
        (``max_iterations``) to the unamplified optimum of the family under ``E``
        participations ``b`` rounds apart (:func:`unamplified_loss`).
        """
        params = _to_jnp(self._closed_form_init())
        if batches_per_epoch is None and epochs is None:
            return params
        b, epochs = self._check_pattern(batches_per_epoch, epochs)
        if self.num_params() == 0:
            return params
        return _minimize_unamplified(self, params, b, epochs, max_iterations)

    def _check_pattern(self, batches_per_epoch, epochs):
        if batches_per_epoch is None or epochs is None:
            raise ValueError("batches_per_epoch and epochs must be given together (or neither), got "
                             f"batches_per_epoch={batches_per_epoch!r}, epochs={epochs!r}")
        b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
        epochs = _validate.positive_int("epochs", epochs)
        if b * epochs != self.n:
            raise ValueError(f"n must equal batches_per_epoch * epochs = {b} * {epochs} = {b * epochs}, "
                             f"got n={self.n}")
        return b, epochs

    def to_dict(self) -> dict:
        d = {"family": self.name, "n": int(self.n)}
        d.update({f.name: int(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "n"})
        return d

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        family = d.pop("family", None)
        if family is not None and cls is not Parameterization and family != cls.name:
            raise ValueError(f"family must be {cls.name!r} for {cls.__name__}, got {family!r}")
        if cls is Parameterization:
            return make_parameterization(family, **d)
        return cls(**d)

    params_to_list = staticmethod(params_to_list)
    params_from_list = staticmethod(params_from_list)


def _frozen(cls):
    return dataclasses.dataclass(frozen=True)(cls)


# --------------------------------------------------------------------------- Toeplitz families


def _toeplitz_from_raw(raw):
    raw = jnp.asarray(raw, jnp.float64)
    return Toeplitz(jnp.concatenate([jnp.ones((1,), raw.dtype), jax.nn.softplus(raw)]))


@_frozen
class ToeplitzParameterization(Parameterization):
    """Full lower-triangular Toeplitz ``C``: ``c_0 = 1``, ``c_k = softplus(params["coeffs"][k-1])``.

    Attributes:
      n: number of rounds.
    Params: ``{"coeffs": (n - 1,)}`` unconstrained.
    """

    n: int
    name: ClassVar[str] = "toeplitz"

    def __post_init__(self):
        self._check_n()

    def _correlation(self, params) -> Toeplitz:
        return _toeplitz_from_raw(params["coeffs"])

    def _closed_form_init(self) -> dict:
        c = sqrt_prefix_sum_coefficients(self.n)[1:]
        return {"coeffs": _softplus_inverse(c)}


@_frozen
class BandedToeplitzParameterization(Parameterization):
    """``bands``-banded Toeplitz ``C``: ``c_0 = 1``, ``c_1..c_{bands-1} = softplus(params)``, zero beyond.

    ``bands = 1`` is ``C = I`` (no parameters); ``bands = n`` is the full Toeplitz family.
    Attributes:
      n: number of rounds.
      bands: ``1 <= bands <= n``.
    Params: ``{"coeffs": (bands - 1,)}``.
    """

    n: int
    bands: int
    name: ClassVar[str] = "banded"

    def __post_init__(self):
        self._check_n()
        bands = _validate.positive_int("bands", self.bands)
        if bands > self.n:
            raise ValueError(f"bands must be in [1, n] = [1, {self.n}], got {self.bands!r}")

    def _correlation(self, params) -> Toeplitz:
        return _toeplitz_from_raw(params["coeffs"])

    def _closed_form_init(self) -> dict:
        c = sqrt_prefix_sum_coefficients(self.bands)[1:]
        return {"coeffs": _softplus_inverse(c)}


# --------------------------------------------------------------------------- BLT


#: Decay logits live in ``[DECAY_LOGIT_MIN, log(1e4 n)]``: ``theta`` from ~8e-7 (a buffer that
#: only touches ``c_1``) to ``1 - 1/(1e4 n)`` (constant over the ``n`` rounds); beyond these the
#: float64 ``theta`` would round to 0 or 1 and two decays could round to the same value.
DECAY_LOGIT_MIN = -14.0
#: Smallest gap between consecutive decay logits (and to the bounds): buffers stay distinct in
#: float64 (``theta_j - theta_{j+1} >= theta (1 - theta) 1e-3 >> 1e-16`` inside the bounds).
DECAY_LOGIT_MIN_GAP = 1e-3


def _decay_logit_bounds(n: int):
    return DECAY_LOGIT_MIN, math.log(1e4 * max(int(n), 1))


def _blt_from_raw(params, n: int):
    # theta_1 > ... > theta_d in (0, 1), distinct (two equal decays are one buffer, and the BLT
    # inverse is ill-conditioned near equal decays, Dvijotham et al. 2024 §5): the logits split
    # the interval [lo, hi] into d + 1 pieces of length min_gap + (free span) * softmax(raw), so
    # every gap is >= min_gap and every logit is strictly inside the bounds, for any raw values.
    lo, hi = _decay_logit_bounds(n)
    raw = jnp.asarray(params["decay_gaps"], jnp.float64)
    d = raw.shape[0] - 1
    free = (hi - lo) - (d + 1) * DECAY_LOGIT_MIN_GAP
    pieces = DECAY_LOGIT_MIN_GAP + free * jax.nn.softmax(raw)
    logits = hi - jnp.cumsum(pieces)[:d]
    theta = jax.nn.sigmoid(logits)
    omega = jax.nn.softplus(jnp.asarray(params["scales"], jnp.float64))
    return BLT(buffer_decays=theta, output_scales=omega)


def _blt_params_from(theta, omega, n: int) -> dict:
    """Unconstrained parameters of the BLT with decays ``theta`` and scales ``omega > 0``."""
    theta = np.asarray(theta, dtype=np.float64)
    omega = np.asarray(omega, dtype=np.float64)
    if theta.ndim != 1 or theta.shape != omega.shape:
        raise ValueError(f"buffer_decays and output_scales must be 1-D of equal length, got "
                         f"{theta.shape} and {omega.shape}")
    if not ((theta > 0) & (theta < 1)).all():
        raise ValueError(f"buffer_decays must be in (0, 1), got {theta.tolist()}")
    if not (np.isfinite(omega).all() and (omega > 0).all()):
        raise ValueError(f"output_scales must be finite and > 0, got {omega.tolist()}")
    order = np.argsort(-theta)
    theta, omega = theta[order], omega[order]
    lo, hi = _decay_logit_bounds(n)
    logits = _logit(theta)
    pieces = -np.diff(np.concatenate([[hi], logits, [lo]]))
    # (1 - 1e-6): a BLT produced by this parameterization (gaps at the minimum up to round-off)
    # maps back (logit round-off near theta = 1 is ~1e-11); its excess over the minimum is floored at a tiny positive value.
    if (pieces < DECAY_LOGIT_MIN_GAP * (1 - 1e-6)).any():
        raise ValueError(
            f"buffer_decays must be distinct (logit gaps > {DECAY_LOGIT_MIN_GAP}) and have logits in "
            f"({lo:g}, {hi:.4g}) (theta in ({1 / (1 + math.exp(-lo)):.3g}, 1 - 1/(1e4 n))), got "
            f"{theta.tolist()}")
    d = theta.size
    free = (hi - lo) - (d + 1) * DECAY_LOGIT_MIN_GAP
    excess = np.maximum(pieces - DECAY_LOGIT_MIN_GAP, 1e-300)
    return {"decay_gaps": np.log(excess / free),
            "scales": _softplus_inverse(omega)}


def _fit_blt_to_column(target, num_buffers: int):
    """Non-negative least-squares BLT fit (fixed geometric decays) of a Toeplitz column ``target``.

    Decays ``theta_j = 1 - 1/tau_j`` with time scales ``tau_j`` geometric between 1.5 and
    ``n``; scales ``omega >= 0`` by NNLS on relative residuals of ``c_1..c_{n-1}``; zeros are
    lifted to a small positive value (the family needs ``omega > 0``).
    """
    from scipy.optimize import nnls

    n = target.shape[0]
    d = num_buffers
    if n <= 1:
        taus = np.geomspace(1.5, 3.0, d)
    else:
        taus = np.geomspace(1.5, max(2.0 * n, 3.0), d) if d > 1 else np.array([max(n / 4.0, 1.5)])
    theta = 1.0 - 1.0 / taus
    tail = target[1:]
    if tail.size == 0:
        return theta, np.full(d, 1e-3)
    k = np.arange(tail.size, dtype=np.float64)[:, None]
    basis = theta[None, :] ** k
    weight = 1.0 / np.maximum(tail, 1e-12)
    omega, _ = nnls(basis * weight[:, None], tail * weight)
    omega = np.maximum(omega, 1e-6 * max(omega.max(), 1e-3))
    return theta, omega


@_frozen
class BLTParameterization(Parameterization):
    """Buffered linear Toeplitz ``C`` with ``num_buffers = d`` buffers.

    ``c_0 = 1``, ``c_k = sum_j omega_j theta_j^(k-1)`` (Dvijotham et al. 2024; the convention of
    :class:`dpjax.matrices.BLT` and of jax_privacy's ``BufferedToeplitz``).
    Params (all unconstrained): ``decay_gaps`` ``(d + 1,)`` and ``scales`` ``(d,)``
    (``omega = softplus(scales)``).  The decay logits split ``[DECAY_LOGIT_MIN, log(1e4 n)]``
    into ``d + 1`` pieces ``DECAY_LOGIT_MIN_GAP + free * softmax(decay_gaps)``: decays strictly
    decreasing (distinct in float64), in ``(0, 1)``, for every parameter value.

    Attributes:
      n: number of rounds.
      num_buffers: ``d >= 1`` (at most ``n``).
    """

    n: int
    num_buffers: int
    name: ClassVar[str] = "blt"

    def __post_init__(self):
        self._check_n()
        d = _validate.positive_int("num_buffers", self.num_buffers)
        if d > max(self.n, 1):
            raise ValueError(f"num_buffers must be in [1, n] = [1, {self.n}], got {self.num_buffers!r}")

    def _correlation(self, params) -> BLT:
        return _blt_from_raw(params, self.n)

    def params_from_blt(self, blt) -> dict:
        """Parameters reproducing a given :class:`~dpjax.matrices.BLT` (``d`` distinct decays)."""
        theta = np.asarray(blt.buffer_decays, dtype=np.float64)
        if theta.shape != (self.num_buffers,):
            raise ValueError(f"blt must have num_buffers={self.num_buffers} buffers, got {theta.shape}")
        return _to_jnp(_blt_params_from(theta, blt.output_scales, self.n))

    def _closed_form_init(self) -> dict:
        theta, omega = _fit_blt_to_column(sqrt_prefix_sum_coefficients(self.n), self.num_buffers)
        return _blt_params_from(theta, omega, self.n)


# --------------------------------------------------------------------------- dense


@_frozen
class DenseParameterization(Parameterization):
    """Dense lower-triangular ``C`` (small ``n`` only): diagonal 1, strictly-lower entries softplus.

    Params: ``{"lower": (n (n - 1) / 2,)}`` in ``np.tril_indices(n, -1)`` order.
    Attributes:
      n: ``1 <= n <= DENSE_MAX_N``.
    """

    n: int
    name: ClassVar[str] = "dense"

    def __post_init__(self):
        self._check_n()
        if self.n > DENSE_MAX_N:
            raise ValueError(f"n must be <= {DENSE_MAX_N} for the dense family (n (n-1)/2 parameters, "
                             f"O(n^3) solves); use 'toeplitz' or 'blt', got n={self.n}")

    def _correlation(self, params):
        raw = jnp.asarray(params["lower"], jnp.float64)
        rows, cols = np.tril_indices(self.n, -1)
        c = jnp.eye(self.n, dtype=raw.dtype)
        return c.at[rows, cols].set(jax.nn.softplus(raw))

    def _closed_form_init(self) -> dict:
        c = sqrt_prefix_sum_coefficients(self.n)
        rows, cols = np.tril_indices(self.n, -1)
        return {"lower": _softplus_inverse(c[rows - cols])}


# --------------------------------------------------------------------------- factory & init


def make_parameterization(family: str, n: int, *, bands: int | None = None,
                          num_buffers: int | None = None):
    """The parameterization of ``family`` in ``FAMILIES`` for ``n`` rounds.

    ``bands`` is required for (and only for) ``"banded"``; ``num_buffers`` for ``"blt"``.
    Raises ValueError naming the argument otherwise.
    """
    family = Family.parse(family, "family").value
    n = _validate.positive_int("n", n)
    if family != "banded" and bands is not None:
        raise ValueError(f"bands is only used by family 'banded', got bands={bands!r} for {family!r}")
    if family != "blt" and num_buffers is not None:
        raise ValueError(f"num_buffers is only used by family 'blt', got num_buffers={num_buffers!r} for {family!r}")
    if family == "toeplitz":
        return ToeplitzParameterization(n)
    if family == "banded":
        if bands is None:
            raise ValueError("bands must be given for family 'banded' (an integer in [1, n])")
        return BandedToeplitzParameterization(n, _validate.positive_int("bands", bands))
    if family == "blt":
        if num_buffers is None:
            raise ValueError("num_buffers must be given for family 'blt' (an integer >= 1)")
        return BLTParameterization(n, _validate.positive_int("num_buffers", num_buffers))
    return DenseParameterization(n)


@functools.lru_cache(maxsize=64)
def _unamplified_value_and_grad(parameterization, b: int, epochs: int):
    def loss(params):
        # log: scale-free and well conditioned for L-BFGS.
        return jnp.log(unamplified_loss(parameterization, params, b, epochs))

    return jax.jit(jax.value_and_grad(loss))


def _minimize_unamplified(parameterization, params, b: int, epochs: int, max_iterations: int):
    """L-BFGS (SciPy) on ``log unamplified_loss``; deterministic; returns the best point seen."""
    from scipy.optimize import minimize

    keys = sorted(params)
    shapes = [np.shape(params[k]) for k in keys]
    sizes = [int(np.prod(s)) for s in shapes]
    fn = _unamplified_value_and_grad(parameterization, b, epochs)

    def unflatten(x):
        out, i = {}, 0
        for k, s, m in zip(keys, shapes, sizes):
            out[k] = jnp.asarray(x[i:i + m].reshape(s), jnp.float64)
            i += m
        return out

    def flatten(p):
        return np.concatenate([np.asarray(p[k], np.float64).ravel() for k in keys])

    best = {"f": math.inf, "x": flatten(params)}

    def fun(x):
        value, grad = fn(unflatten(x))
        value = float(value)
        g = flatten(grad)
        if not math.isfinite(value) or not np.isfinite(g).all():
            return math.inf, np.zeros_like(x)
        if value < best["f"]:
            best["f"], best["x"] = value, x.copy()
        return value, g

    minimize(fun, best["x"].copy(), jac=True, method="L-BFGS-B",
             options={"maxiter": int(max_iterations), "gtol": 1e-10, "ftol": 1e-14})
    return unflatten(best["x"])
