"""DP-SGD epsilon and delta: one call, a batch of configurations, or a traced call.

:func:`dpsgd_epsilon` and :func:`dpsgd_delta` answer

* **one configuration** (scalar arguments): the accountant's call (:func:`dpsgd_accounting`,
  the upper end of its bracket), unchanged;
* **a batch**: array arguments (noise multipliers, sampling probabilities, steps, targets,
  broadcast together) give one answer per element, each equal to the call with that element's
  scalars (:func:`dpjax.pld.grid.batched.epsilon_many`: every element on its own grid, the elements
  of one grid shape in one compiled program), an array of targets included (for one
  composition read at several targets on one transform, see :func:`dpsgd_accounting`);
* **a per-step noise schedule**: ``noise_schedule=`` (a 1-D array of length ``steps``), never
  an array ``noise_multiplier``;
* **traced arguments** (``jax.grad``, ``jax.vmap``, a user's ``jax.jit``, from float32 code too):
  :func:`dpjax._base.traced.host_call` -- the batch path on the host through ``jax.pure_callback``,
  with derivatives on the accountant's grid (:func:`dpjax.pld.grid.batched.grid_partials`):
  ``d eps / d sigma``, ``d eps / d q``, ``d eps / d target_delta`` (and for delta
  ``d delta / d target_epsilon``).  ``steps`` may be traced (an integer; no derivative).

Argument order and aliases: :mod:`dpjax._base.names` (``sample_rate=``, ``delta=``/``epsilon=``,
``epochs=``).  The group accountants (:mod:`dpjax.group`) use the same dispatch with their own
per-step mechanism.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from dpjax._base import deferred_x64 as _deferred_x64, lazy_module as _lazy_module
from dpjax._base import names as _names
from dpjax._base import traced as _traced
from dpjax._base import validate as _validate
from dpjax._base.x64 import host_only
from dpjax.pld.scenario import (BallsInBins, Poisson, RandomAllocation, SchemeKeywords, accepts_scenario,
                                scheme_keywords)

jax = _lazy_module("jax")

if TYPE_CHECKING:
    from dpjax.pld.grid.plan import GridOptions

__all__ = ["dpsgd_epsilon", "dpsgd_delta", "dpsgd_accounting", "dispatch"]


def _ndim(x) -> int:
    return int(np.ndim(x)) if not _traced.is_traced(x) else len(x.shape)


def _validate_batch(query, sigma, q, steps, target):
    """Concrete arrays validated elementwise and broadcast: (sigma, q, steps, target) flat, shape."""
    s = _validate.positive("noise_multiplier", sigma)
    qq = (_validate.probability_open_closed("sampling_prob", q) if q is not None
          else np.full((), np.nan))
    t_raw = np.asarray(steps)
    t = np.vectorize(lambda v: _validate.positive_int("steps", v), otypes=[np.int64])(t_raw) \
        if t_raw.ndim else np.int64(_validate.positive_int("steps", steps))
    if query == "epsilon":
        tg = _validate.PrivacyTarget(delta=target).delta
    else:
        tg = _validate.PrivacyTarget(epsilon=target, allow_zero_epsilon=True).epsilon
    try:
        arrays = np.broadcast_arrays(s, qq, t, tg)
    except ValueError:
        raise ValueError(f"noise_multiplier, sampling_prob, steps and the target must broadcast together, got "
                         f"shapes {np.shape(s)}, {np.shape(q)}, {np.shape(steps)}, {np.shape(target)}") from None
    shape = arrays[0].shape
    return [a.reshape(-1) for a in arrays], shape


def _validate_concrete(query, sigma, q, steps, target) -> None:
    """At trace time: the arguments that are not traced, validated as in an eager call."""
    if not _traced.is_traced(sigma):
        _validate.positive("noise_multiplier", sigma)
    if q is not None and not _traced.is_traced(q):
        _validate.probability_open_closed("sampling_prob", q)
    if not _traced.is_traced(steps):
        for v in np.ravel(np.asarray(steps, dtype=object)):
            _validate.positive_int("steps", v)
    if not _traced.is_traced(target):
        if query == "epsilon":
            _validate.PrivacyTarget(delta=target)
        else:
            _validate.PrivacyTarget(epsilon=target, allow_zero_epsilon=True)


def _values(query, components: Callable, scalar: Callable, options, sigma, q, steps, target):
    """Elementwise values of flat concrete arrays (the batch path)."""
    from dpjax.pld.grid import batched

    sigma, q, steps, target = (np.asarray(a).reshape(-1) for a in (sigma, q, steps, target))
    qs = [None if math.isnan(v) else float(v) for v in q]
    if sigma.size == 1:
        return np.asarray([float(np.asarray(scalar(float(sigma[0]), qs[0], int(steps[0]), float(target[0]))))])
    comps = [components(float(s), qq, int(t)) for s, qq, t in zip(sigma, qs, steps)]
    many = batched.epsilon_many if query == "epsilon" else batched.delta_many
    return many(comps, target, options=options)


def _partials(query, components: Callable, scalar: Callable, options, wrt, sigma, q, steps, target):
    """Values and the derivatives named in ``wrt`` (``noise_multiplier``, ``sampling_prob``,
    ``target``) of flat concrete arrays, on each element's grid."""
    from dpjax.pld.grid import batched

    shape = np.shape(sigma)
    flat = [np.asarray(a).reshape(-1) for a in (sigma, q, steps, target)]
    values = _values(query, components, scalar, options, *flat)
    parts = {k: np.zeros(values.shape) for k in wrt}
    for i, (s, qq, t, tg) in enumerate(zip(*flat)):
        qv = None if math.isnan(float(qq)) else float(qq)
        comps = components(float(s), qv, int(t))
        v = float(values[i])
        if query == "epsilon":
            if v == 0.0:
                continue  # eps = 0 on a neighbourhood (delta(0) <= target): flat
            if _capped_value(comps, v, float(tg)):
                # The value is a closed-form cap (pld.accountant.epsilon_caps), not the grid's
                # curve: differentiate the call itself (central differences of closed forms).
                d = _central_partials(scalar, float(s), qv, int(t), float(tg), v)
                for k in wrt:
                    parts[k][i] = d[k]
                continue
            g = batched.grid_partials(comps, noise_multiplier=float(s), sampling_prob=qv, target_delta=float(tg),
                                      epsilon=v, options=options)
            slope = g["d_delta_d_eps"]
            d = {"noise_multiplier": -g["d_delta_d_sigma"] / slope, "sampling_prob": -g["d_delta_d_q"] / slope,
                 "target": 1.0 / slope}
            if not math.isfinite(v):
                d = dict.fromkeys(d, math.nan)
        else:
            if 0.0 < v < 1.0 and _capped_value(comps, v, float(tg), query="delta"):
                d = _central_partials(scalar, float(s), qv, int(t), float(tg), v)
                for k in wrt:
                    parts[k][i] = d[k]
                continue
            g = batched.grid_partials(comps, noise_multiplier=float(s), sampling_prob=qv, epsilon=float(tg),
                                      options=options)
            d = {"noise_multiplier": g["d_delta_d_sigma"], "sampling_prob": g["d_delta_d_q"],
                 "target": g["d_delta_d_eps"]}
            if v >= 1.0 or v <= 0.0:
                d = dict.fromkeys(d, 0.0)
        if qv is None:
            d["sampling_prob"] = 0.0
        for k in wrt:
            parts[k][i] = d[k]
    return values.reshape(shape), {k: p.reshape(shape) for k, p in parts.items()}


def _capped_value(comps, value: float, target: float, query: str = "epsilon") -> bool:
    """Whether a value is one of the closed-form caps of :func:`dpjax.pld.accountant.epsilon_caps`
    (:func:`~dpjax.pld.accountant.delta_caps` for delta queries)."""
    from dpjax.pld.accountant import delta_caps, epsilon_caps

    caps = (epsilon_caps if query == "epsilon" else delta_caps)(comps, np.asarray([target]))
    return any(float(c[0]) == value for c in caps.values())


def _central_partials(scalar: Callable, sigma: float, q, steps: int, target: float, value: float) -> dict:
    """Derivatives of ``scalar(sigma, q, steps, target)`` by central differences (steps 1e-6
    relative; for the closed forms the caps are, truncation ~1e-12 relative)."""
    out = {}
    h = 1e-6 * sigma
    out["noise_multiplier"] = (float(scalar(sigma + h, q, steps, target)) - float(scalar(sigma - h, q, steps, target))) \
        / (2 * h)
    if q is not None and 0.0 < q < 1.0:
        hq = 1e-6 * min(q, 1.0 - q)
        out["sampling_prob"] = (float(scalar(sigma, q + hq, steps, target)) - float(scalar(sigma, q - hq, steps, target))) \
            / (2 * hq)
    else:
        out["sampling_prob"] = 0.0
    ht = 1e-6 * target
    out["target"] = (float(scalar(sigma, q, steps, target + ht)) - float(scalar(sigma, q, steps, target - ht))) / (2 * ht)
    return out


def dispatch(query: str, name: str, sigma, q, steps, target, *, components: Callable, scalar: Callable,
             options=None, q_required: bool = True):
    """Route one public call (see the module docstring).

    ``components(sigma, q, steps)`` builds one element's composition (validated, floats in);
    ``scalar(sigma, q, steps, target)`` is the accountant's one-configuration call (it may get
    an array ``target`` with scalar others).  ``q`` may be None where the mechanism does not
    use it (fixed batches)."""
    target_name = "target_delta" if query == "epsilon" else "target_epsilon"
    _names.require(name, noise_multiplier=sigma, steps=steps, **{target_name: target})
    if q_required:
        _names.require(name, sampling_prob=q)
    if _traced.is_traced(sigma, q, steps, target):
        floats = {"noise_multiplier": sigma, "target": target}
        if q is not None:
            floats["sampling_prob"] = q
        ints = {"steps": steps}
        _validate_concrete(query, sigma, q, steps, target)

        def values(noise_multiplier, target, steps, sampling_prob=None):
            flat, shape = _validate_batch(query, noise_multiplier, sampling_prob, steps, target)
            return _values(query, components, scalar, options, *flat).reshape(shape)

        def partials(wrt, noise_multiplier, target, steps, sampling_prob=None):
            flat, shape = _validate_batch(query, noise_multiplier, sampling_prob, steps, target)
            v, p = _partials(query, components, scalar, options, wrt, *(a.reshape(shape) for a in flat))
            return v, p

        return _traced.host_call(values, partials, floats, ints, name=name)
    nd = [_ndim(x) for x in (sigma, q, steps, target)]
    if not any(nd):
        return scalar(sigma, q, steps, target)  # one configuration
    # An array anywhere, targets included, is a batch: each element equals its own call.
    # (dpsgd_accounting reads one composition at an array of targets on the grid planned for the
    # smallest, which may differ from an element's own grid within the grid's accuracy.)
    flat, shape = _validate_batch(query, sigma, q, steps, target)
    with _deferred_x64():  # the float64 contract (dpjax._base.x64): eager batches compute in float64
        return _values(query, components, scalar, options, *flat).reshape(shape)


def _components(sigma, q, steps):
    from dpjax.pld.grid import engine

    return engine.dpsgd_components(sigma, q, steps)


@host_only("dpjax.calibration.dpsgd_epsilon_fn / dpsgd_delta_fn on a grid from dpjax.calibration.dpsgd_grid")
def dpsgd_accounting(noise_multiplier, sampling_prob=None, steps=None, target_delta=None, target_epsilon=None, *,
                     options: GridOptions | None = None, with_lower: bool = True, noise_schedule=None,
                     sampling="poisson", epochs=None):
    """DP-SGD (Poisson sampling, add/remove adjacency): :class:`~dpjax.pld.EpsilonResult` or
    :class:`~dpjax.pld.DeltaResult`.

    Args:
      noise_multiplier: sigma > 0 (None with ``noise_schedule``).
      sampling_prob: q in (0, 1].
      steps: number of steps T >= 1.
      target_delta / target_epsilon: exactly one of them (scalar or 1-D array: one transform
        serves every target).
      noise_schedule: a per-step schedule instead of ``noise_multiplier`` (1-D, length ``steps``).
      sampling: ``"poisson"`` (default) or :class:`dpjax.Poisson` ``(q)``; or
        :class:`dpjax.RandomAllocation` / :class:`dpjax.BallsInBins` with ``epochs`` instead of
        ``sampling_prob`` and ``steps`` (:func:`dpjax.pld.allocation.dpsgd.accounting`; the
        result has the same fields, ``options`` do not apply).
      epochs: the number of epochs (random allocation and balls-in-bins).
    """
    if (target_delta is None) == (target_epsilon is None):
        raise ValueError("give exactly one of target_delta and target_epsilon")
    from dpjax.pld import accountant
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd
    from dpjax.pld.grid import engine

    s = scheme_keywords("dpsgd_accounting", sampling, sampling_prob, accepts=(Poisson, RandomAllocation, BallsInBins))
    sampling_prob = s.sampling_prob
    if allocation_dpsgd.is_allocation(s.sampling):
        if noise_schedule is not None or options is not None:
            raise ValueError(f"noise_schedule and options are for sampling='poisson', not {sampling!r}")
        return allocation_dpsgd.accounting(noise_multiplier, None, steps, target_delta, target_epsilon,
                                           sampling=s.sampling, batches_per_epoch=s.batches_per_epoch,
                                           selections_per_epoch=s.selections_per_epoch, epochs=epochs)
    if epochs is not None:
        raise ValueError("epochs is for random allocation / balls-in-bins here (give steps)")
    if noise_multiplier is not None and noise_schedule is not None:
        raise ValueError("give noise_multiplier or noise_schedule, not both")
    comps = engine.dpsgd_components(noise_multiplier, sampling_prob, steps, noise_schedule)
    if target_delta is not None:
        return accountant.epsilon(comps, target_delta, options=options, with_lower=with_lower)
    return accountant.delta(comps, target_epsilon, options=options, with_lower=with_lower)


# The one-configuration calls behind the public dpsgd_epsilon / dpsgd_delta below (which add
# batches of configurations, traced calls and the argument aliases).
@host_only("dpjax.dpsgd_epsilon (traceable)")
def _one_epsilon(noise_multiplier, sampling_prob, steps, target_delta, *, noise_schedule=None) -> float:
    """Certified epsilon of one DP-SGD configuration (Poisson-subsampled Gaussian, add/remove
    adjacency); :func:`dpsgd_epsilon` is the public function."""
    target_delta = _validate.PrivacyTarget(delta=target_delta).delta
    res = dpsgd_accounting(noise_multiplier, sampling_prob, steps, target_delta=target_delta, with_lower=False,
                           noise_schedule=noise_schedule)
    return res.epsilon


@host_only("dpjax.dpsgd_delta (traceable)")
def _one_delta(noise_multiplier, sampling_prob, steps, target_epsilon, *, noise_schedule=None) -> float:
    """Certified delta of one DP-SGD configuration at ``target_epsilon`` (>= 0);
    :func:`dpsgd_delta` is the public function."""
    target_epsilon = _validate.PrivacyTarget(epsilon=target_epsilon, allow_zero_epsilon=True).epsilon
    res = dpsgd_accounting(noise_multiplier, sampling_prob, steps, target_epsilon=target_epsilon, with_lower=False,
                           noise_schedule=noise_schedule)
    return res.delta


def _scalar(query):
    def call(sigma, q, steps, target, noise_schedule=None):
        fn = _one_epsilon if query == "epsilon" else _one_delta
        return fn(sigma, q, steps, target, noise_schedule=noise_schedule)

    return call


def _schedule(query, name, sigma, q, steps, target, noise_schedule):
    if sigma is not None:
        raise ValueError(f"{name}: give noise_multiplier or noise_schedule, not both")
    if _traced.is_traced(noise_schedule, q, steps, target):
        raise ValueError(f"{name}: a noise_schedule is accounted on the host (its values choose the grid) and "
                         f"cannot be traced; call it outside jax.jit/grad/vmap")
    if steps is None:
        steps = int(np.size(noise_schedule))
    _names.require(name, sampling_prob=q, **{"target_delta" if query == "epsilon" else "target_epsilon": target})
    return _scalar(query)(None, q, steps, target, noise_schedule=noise_schedule)


@accepts_scenario("target_delta", name="dpjax.pld.dpsgd_epsilon")
def dpsgd_epsilon(noise_multiplier=None, sampling_prob=None, steps=None, target_delta=None, *, noise_schedule=None,
                  sample_rate=None, epochs=None, sampling="poisson"):
    """Certified epsilon of DP-SGD (Poisson sampling, add/remove adjacency) at ``target_delta``.

    Args:
      noise_multiplier: sigma > 0 (noise std / clip norm); an array gives one epsilon per entry
        (a batch, broadcast with the other arguments).
      sampling_prob: Poisson sampling probability q in (0, 1] (alias ``sample_rate=``).
      steps: number of steps T >= 1 (or ``epochs=``: ``T = epochs / sampling_prob``
        rounded up, never fewer steps than training takes).
      target_delta: in (0, 1).
      noise_schedule: instead of ``noise_multiplier``, a per-step schedule (1-D, length
        ``steps``; ``steps`` may then be left out).
      sampling: ``"poisson"`` (default) or :class:`dpjax.Poisson` ``(q)``; or
        :class:`dpjax.RandomAllocation` ``(batches_per_epoch, selections_per_epoch)`` /
        :class:`dpjax.BallsInBins` ``(batches_per_epoch)`` (:mod:`dpjax.pld.allocation.dpsgd`):
        then ``epochs`` (the number of epochs) replaces ``sampling_prob`` and ``steps``.

    Returns:
      a float (scalar arguments), a float64 ndarray (arrays), or, traced (``jax.grad``,
      ``jax.vmap``, ``jax.jit``), a JAX array in the caller's float dtype with derivatives in
      ``noise_multiplier``, ``sampling_prob`` and ``target_delta``.  A certified upper bound,
      never below the true epsilon; each element equals the call with its own scalars.

    Example::

        >>> import dpjax, jax, numpy as np
        >>> dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)                          # doctest: +SKIP
        1.8282...
        >>> dpjax.dpsgd_epsilon(np.array([0.8, 1.0, 1.2]), 0.01, 1000, 1e-5)     # doctest: +SKIP
        >>> jax.grad(lambda s: dpjax.dpsgd_epsilon(s, 0.01, 1000, 1e-5))(1.0)    # doctest: +SKIP
        -3.82...
        >>> dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, sampling=dpjax.RandomAllocation(100),
        ...                     epochs=10)                                     # doctest: +SKIP
    """
    return _public_query("epsilon", "dpsgd_epsilon", noise_multiplier, sampling_prob, steps, target_delta,
                         noise_schedule, sample_rate, epochs, sampling)


def _public_query(query, name, sigma, sampling_prob, steps, target, noise_schedule, sample_rate, epochs, sampling):
    """:func:`dpsgd_epsilon` / :func:`dpsgd_delta`: the ``sample_rate=`` alias and the scheme
    record resolved, then :func:`query_keywords`."""

    s = scheme_keywords(name, sampling, sampling_prob, sample_rate=sample_rate,
                        accepts=(Poisson, RandomAllocation, BallsInBins))
    return query_keywords(query, name, sigma, s, steps, target, noise_schedule, epochs)


def query_keywords(query, name, sigma, s, steps, target, noise_schedule, epochs):
    """The query with the scheme ``s`` as the accounting layer's keywords
    (:class:`dpjax.pld.scenario.SchemeKeywords`; Poisson, random allocation or balls-in-bins)."""
    return _query(query, name, sigma, s.sampling_prob, steps, target, noise_schedule, s.sampling,
                  s.batches_per_epoch, s.selections_per_epoch, epochs)


def _query(query, name, sigma, q, steps, target, noise_schedule, sampling, batches_per_epoch, selections_per_epoch,
           epochs):
    """:func:`dpsgd_epsilon` (``query="epsilon"``, ``target`` a delta) or :func:`dpsgd_delta`
    (``"delta"``, ``target`` an epsilon) once the aliases are resolved: random allocation, a
    noise schedule, or the one-configuration / batched / traced dispatch."""
    if _allocation(sampling):
        return _allocation_query(query, name, sigma, q, steps, target, noise_schedule, sampling,
                                 batches_per_epoch, selections_per_epoch, epochs)
    if batches_per_epoch is not None or selections_per_epoch != 1:
        from dpjax.pld.allocation import dpsgd as allocation_dpsgd

        allocation_dpsgd.no_allocation_args(sampling, batches_per_epoch, selections_per_epoch)
    steps = _names.steps_from_epochs(name, q, steps, epochs)
    if noise_schedule is not None:
        return _schedule(query, name, sigma, q, steps, target, noise_schedule)
    return dispatch(query, name, sigma, q, steps, target, components=_components, scalar=_scalar(query))


def _allocation(sampling) -> bool:
    """True for random allocation / balls-in-bins; False for Poisson; other values refused."""
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd

    if allocation_dpsgd.is_allocation(sampling):
        return True
    if getattr(sampling, "value", sampling) != "poisson":
        raise ValueError(f"sampling must be 'poisson', 'random_allocation' or 'balls_in_bins' here, got {sampling!r}")
    return False


def _allocation_query(query, name, sigma, q, steps, target, noise_schedule, sampling, batches_per_epoch,
                      selections_per_epoch, epochs):
    from dpjax.pld.allocation import dpsgd as allocation_dpsgd

    if noise_schedule is not None:
        raise ValueError(f"{name}: noise_schedule is for sampling='poisson'; random allocation takes one "
                         f"noise_multiplier (per-epoch schedules: dpjax.interop.RunningAllocationAccountant)")
    scheme = SchemeKeywords(sampling=sampling, sampling_prob=q, batches_per_epoch=batches_per_epoch,
                            selections_per_epoch=selections_per_epoch)
    return allocation_dpsgd.query(query, name, sigma, target, scheme=scheme, epochs=epochs, steps=steps)


@accepts_scenario("target_epsilon", name="dpjax.pld.dpsgd_delta")
def dpsgd_delta(noise_multiplier=None, sampling_prob=None, steps=None, target_epsilon=None, *, noise_schedule=None,
                sample_rate=None, epochs=None, sampling="poisson"):
    """Certified delta of DP-SGD at ``target_epsilon`` (>= 0): as :func:`dpsgd_epsilon`, with
    the target epsilon last, and the same ``sampling`` values.
    Derivatives (traced) in ``noise_multiplier``, ``sampling_prob`` and ``target_epsilon``."""
    return _public_query("delta", "dpsgd_delta", noise_multiplier, sampling_prob, steps, target_epsilon,
                         noise_schedule, sample_rate, epochs, sampling)
