"""``sampling="random_allocation"`` / ``"balls_in_bins"`` in the DP-SGD accounting family.

The public functions :func:`dpjax.dpsgd_epsilon`, :func:`dpjax.dpsgd_delta`,
:func:`dpjax.dpsgd_noise_multiplier` (and :func:`dpjax.pld.dpsgd_accounting`,
:func:`dpjax.sweep`, :func:`dpjax.epsilon_curve`) take these two schemes with one spelling:

* ``sampling="random_allocation"``: every example takes part in ``selections_per_epoch`` (k,
  default 1) of the ``batches_per_epoch`` (t) steps of each epoch, drawn afresh each epoch, for
  ``epochs`` (E) epochs (Feldman & Shenfeld, "Privacy amplification by random allocation");
* ``sampling="balls_in_bins"``: every example in one of ``batches_per_epoch`` bins for the
  whole run, used once per epoch (Choquette-Choo et al. 2024, Def. 3.1, with ``C = I``).

``batches_per_epoch`` and ``epochs`` replace ``sampling_prob`` and ``steps`` (``steps``, if
given, must equal ``t E``).  Adjacency: add/remove.  The accountant is
:mod:`dpjax.pld.allocation.accountant` (docs/design.md §12).

This module routes one call the way :mod:`dpjax.pld.dpsgd` routes Poisson calls: scalar
arguments give the accountant's call; arrays of noise multipliers or targets (broadcast
together) give one answer per element, each equal to its own call; traced arguments
(``jax.grad``, ``jax.vmap``, a user's ``jax.jit``, from float32 code too) run the same calls on
the host through :func:`dpjax._base.traced.host_call`, with derivatives of the certified bound on
the call's own plan (its discretization held fixed:
:func:`dpjax.pld.allocation.accountant.epsilon_partials`).

Example::

    >>> import dpjax, jax
    >>> dpjax.dpsgd_epsilon(1.0, target_delta=1e-5, sampling="random_allocation",
    ...                     batches_per_epoch=100, epochs=10)                            # doctest: +SKIP
    >>> jax.grad(lambda s: dpjax.dpsgd_epsilon(s, target_delta=1e-5, sampling="balls_in_bins",
    ...                                         batches_per_epoch=128, epochs=4))(1.0)   # doctest: +SKIP
"""

from __future__ import annotations

import math

import numpy as np

from dpjax._base import traced as _traced
from dpjax._base import validate as _validate
from dpjax._base.enums import AllocationSampling

__all__ = ["ALLOCATION_SAMPLINGS", "is_allocation", "allocation_args", "no_allocation_args", "accounting", "query",
           "noise_multiplier", "sigma_partials"]

#: The ``sampling`` values accounted here.
ALLOCATION_SAMPLINGS = tuple(s.value for s in AllocationSampling)


def is_allocation(sampling) -> bool:
    """Whether ``sampling`` (a string or an enum with a ``value``) names one of
    :data:`ALLOCATION_SAMPLINGS`."""
    value = getattr(sampling, "value", sampling)
    return isinstance(value, str) and value in ALLOCATION_SAMPLINGS


def allocation_args(sampling, *, sampling_prob=None, steps=None, batches_per_epoch=None, selections_per_epoch=1,
                    epochs=None, group_size=1, dataset_size=None, batch_size=None) -> tuple[int, int, int]:
    """Validate the random-allocation / balls-in-bins arguments of a public call: ``(t, k, E)``.

    ``steps`` alone gives the epochs (``E = steps / t``, whole epochs only).  Arguments of the other
    schemes are refused with the reason (``sampling_prob``; ``steps`` unless it equals ``t E``;
    ``group_size`` other than 1; ``dataset_size`` / ``batch_size``)."""
    sampling = getattr(sampling, "value", sampling)
    if batches_per_epoch is None:
        raise ValueError(f"sampling={sampling!r} needs batches_per_epoch (an integer >= 1)")
    t = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    if epochs is None and steps is not None:
        # Whole epochs only: steps = t E (a partial epoch is another scheme).
        n = _validate.positive_int("steps", steps)
        if n % t:
            raise ValueError(f"steps must be a whole number of epochs of batches_per_epoch = {t} rounds with "
                             f"sampling={sampling!r} (steps = {t} * epochs), got {steps!r}")
        epochs = n // t
    if epochs is None:
        raise ValueError(f"sampling={sampling!r} needs epochs (an integer >= 1) or steps (a multiple of "
                         f"batches_per_epoch = {t})")
    E = _validate.positive_int("epochs", epochs)
    k = _validate.positive_int("selections_per_epoch", 1 if selections_per_epoch is None else selections_per_epoch,
                               maximum=t)
    if sampling == "balls_in_bins" and k != 1:
        raise ValueError(f"selections_per_epoch must be 1 for sampling='balls_in_bins' (one bin per example), "
                         f"got {selections_per_epoch!r}")
    if sampling_prob is not None:
        raise ValueError(f"sampling_prob is not used with sampling={sampling!r} (give batches_per_epoch, "
                         f"selections_per_epoch and epochs), got {sampling_prob!r}")
    if steps is not None and _validate.positive_int("steps", steps) != t * E:
        raise ValueError(f"steps must equal batches_per_epoch * epochs = {t * E} with sampling={sampling!r} "
                         f"(or be omitted), got {steps!r}")
    if group_size != 1:
        raise ValueError(f"group_size must be 1 with sampling={sampling!r} (group privacy is accounted for "
                         f"poisson and fixed_batch), got {group_size!r}")
    if dataset_size is not None or batch_size is not None:
        raise ValueError(f"dataset_size and batch_size are for sampling='fixed_batch', not {sampling!r}")
    return t, k, E


def _by_element(shape, wrt, partials_at) -> dict:
    """``{name: array of shape}`` filled element by element from ``partials_at(index)`` (a dict
    with every name of ``wrt``): the partial derivatives of a batch, each from its own call."""
    parts = {w: np.zeros(shape) for w in wrt}
    for i in np.ndindex(shape):
        d = partials_at(i)
        for w in wrt:
            parts[w][i] = d[w]
    return parts


def no_allocation_args(sampling, batches_per_epoch=None, selections_per_epoch=1) -> None:
    """Refuse the random-allocation arguments with the other schemes."""
    if batches_per_epoch is not None or selections_per_epoch not in (None, 1):
        raise ValueError(f"batches_per_epoch and selections_per_epoch are for sampling='random_allocation' or "
                         f"'balls_in_bins', not {getattr(sampling, 'value', sampling)!r}")


def accounting(noise_multiplier, sampling_prob=None, steps=None, target_delta=None, target_epsilon=None, *,
               sampling="random_allocation", batches_per_epoch=None, selections_per_epoch=1, epochs=None,
               options=None):
    """:class:`~dpjax.pld.EpsilonResult` / :class:`~dpjax.pld.DeltaResult` (certified upper end,
    certified lower end, ``adjacency="add_or_remove"``) of one configuration."""
    from dpjax.pld.allocation import accountant as ra

    sampling = getattr(sampling, "value", sampling)
    t, k, E = allocation_args(sampling, sampling_prob=sampling_prob, steps=steps, batches_per_epoch=batches_per_epoch,
                              selections_per_epoch=selections_per_epoch, epochs=epochs)
    if sampling == "balls_in_bins":
        return ra.balls_in_bins_accounting(noise_multiplier, t, E, target_delta=target_delta,
                                           target_epsilon=target_epsilon, options=options)
    return ra.allocation_accounting(noise_multiplier, t, E, target_delta=target_delta, target_epsilon=target_epsilon,
                                    selections_per_epoch=k, options=options)


def _effective(sampling, sigma: float, t: int, k: int, E: int):
    """``(noise multiplier of the accounted allocation, its blocks, d sigma_eff / d sigma)``."""
    from dpjax.pld.allocation import accountant as ra

    if sampling == "balls_in_bins":
        return sigma / math.sqrt(E), ra.allocation_blocks(t, 1, 1), 1.0 / math.sqrt(E)
    return sigma, ra.allocation_blocks(t, k, E), 1.0


def _one(q: str, sampling, sigma: float, target, t, k, E, options):
    kw = {"target_delta": target} if q == "epsilon" else {"target_epsilon": target}
    res = accounting(sigma, sampling=sampling, batches_per_epoch=t, selections_per_epoch=k, epochs=E, options=options,
                     **kw)
    return res.epsilon if q == "epsilon" else res.delta


def _closed_form_decides(q: str, sampling, sigma: float, target: float, t, k, E, options, value: float) -> bool:
    """Whether the call's value is the closed-form one: the lattice does not run there, or the
    value equals the unamplified Gaussian's cap."""
    from dpjax.pld.allocation import accountant as ra

    s_eff, blocks, _ = _effective(sampling, sigma, t, k, E)
    kw = {"target_delta": target} if q == "epsilon" else {"target_epsilon": target}
    if not ra.lattice_fits(s_eff, blocks, target_delta=kw.get("target_delta"), options=options):
        return True
    mu = math.sqrt(E) / sigma if sampling == "balls_in_bins" else None
    cap, _ = ra.closed_form_bracket(s_eff, blocks, mu=mu, **kw)
    return bool(value >= float(np.max(cap)))


def _one_partials(q: str, sampling, sigma: float, target: float, t, k, E, options, value: float) -> dict:
    """``{"noise_multiplier": d value / d sigma, "target": d value / d target}`` of the certified
    bound of one configuration, on the plan its call uses (discretization held fixed)."""
    from dpjax.pld.allocation import accountant as ra

    if q == "epsilon" and (value == 0.0 or not math.isfinite(value)):
        return dict.fromkeys(("noise_multiplier", "target"), 0.0 if value == 0.0 else math.nan)
    if q == "delta" and (value >= 1.0 or value <= 0.0):
        return dict.fromkeys(("noise_multiplier", "target"), 0.0)
    s_eff, blocks, scale = _effective(sampling, sigma, t, k, E)
    if all(tb == 1 for tb, _ in blocks) or _closed_form_decides(q, sampling, sigma, target, t, k, E, options, value):
        # Every step selected (the exact Gaussian), or the value is the unamplified Gaussian's
        # cap or the closed-form bracket's (docs/design.md §12.7): smooth closed forms, central
        # differences of the call itself (not of the lattice bound on a plan, which it is not).
        h, ht = 1e-6 * sigma, 1e-6 * max(abs(target), 1e-12)
        d_s = (_one(q, sampling, sigma + h, target, t, k, E, options)
               - _one(q, sampling, sigma - h, target, t, k, E, options)) / (2 * h)
        lo_t = max(target - ht, 0.0 if q == "delta" else target * 0.5)
        d_t = (_one(q, sampling, sigma, target + ht, t, k, E, options)
               - _one(q, sampling, sigma, lo_t, t, k, E, options)) / (target + ht - lo_t)
        return {"noise_multiplier": float(d_s), "target": float(d_t)}
    kw = {"target_delta": target} if q == "epsilon" else {"target_epsilon": target}
    plan, _ = ra.account_blocks(s_eff, blocks, options=options, **kw)
    d_s, d_t = ra.plan_partials(plan, s_eff, np.asarray(target, np.float64), query=q)
    return {"noise_multiplier": float(d_s) * scale, "target": float(d_t)}


def _scheme_args(scheme, *, epochs, steps, group_size) -> tuple[str, int, int, int]:
    """``(sampling, t, k, E)`` of a public call's scheme (a
    :class:`~dpjax.pld.scenario.SchemeKeywords`) and run length, checked by :func:`allocation_args`."""
    sampling = getattr(scheme.sampling, "value", scheme.sampling)
    t, k, E = allocation_args(sampling, sampling_prob=scheme.sampling_prob, steps=steps,
                              batches_per_epoch=scheme.batches_per_epoch,
                              selections_per_epoch=scheme.selections_per_epoch, epochs=epochs, group_size=group_size,
                              dataset_size=scheme.dataset_size, batch_size=scheme.batch_size)
    return sampling, t, k, E


def query(q: str, name: str, noise_multiplier, target, *, scheme, epochs=None, steps=None, group_size=1,
          options=None):
    """Epsilon (``q="epsilon"``, ``target`` a delta) or delta (``q="delta"``, ``target`` an
    epsilon) of one public call: scalars, a batch, or traced arguments (see the module
    docstring).  ``scheme``: the call's :class:`~dpjax.pld.scenario.SchemeKeywords` (its
    ``sampling`` one of :data:`ALLOCATION_SAMPLINGS`; the sizes of the other schemes are
    refused, see :func:`allocation_args`)."""
    sampling, t, k, E = _scheme_args(scheme, epochs=epochs, steps=steps, group_size=group_size)
    target_name = "target_delta" if q == "epsilon" else "target_epsilon"
    if noise_multiplier is None or target is None:
        raise ValueError(f"{name}: missing required argument {'noise_multiplier' if noise_multiplier is None else target_name}")
    check_target = _validate.probability_open if q == "epsilon" else _validate.nonnegative

    def values(noise_multiplier, target):
        sig = _validate.positive("noise_multiplier", noise_multiplier)
        tg = check_target(target_name, target)
        s_b, t_b = np.broadcast_arrays(sig, tg)
        out = [_one(q, sampling, float(s), float(x), t, k, E, options) for s, x in zip(s_b.ravel(), t_b.ravel())]
        return np.asarray(out, np.float64).reshape(s_b.shape)

    if _traced.is_traced(noise_multiplier, target):
        if not _traced.is_traced(noise_multiplier):
            _validate.positive("noise_multiplier", noise_multiplier)
        if not _traced.is_traced(target):
            check_target(target_name, target)

        def partials(wrt, noise_multiplier, target):
            vals = values(noise_multiplier, target)
            s_b, t_b = np.broadcast_arrays(np.asarray(noise_multiplier, np.float64), np.asarray(target, np.float64))
            return vals, _by_element(vals.shape, wrt, lambda i: _one_partials(
                q, sampling, float(s_b[i]), float(t_b[i]), t, k, E, options, float(vals[i])))

        return _traced.host_call(values, partials, {"noise_multiplier": noise_multiplier, "target": target},
                                 name=name)
    if np.ndim(noise_multiplier) == 0 and np.ndim(target) == 0:
        return _one(q, sampling, noise_multiplier, target, t, k, E, options)
    # A batch: one call per element.  (An array of targets on one composition would plan it for
    # the smallest delta, and its elements would differ from their own calls.)
    return values(noise_multiplier, target)


def noise_multiplier(name: str, target_epsilon, target_delta, *, scheme, epochs=None, steps=None, group_size=1,
                     options=None):
    """Smallest noise multiplier whose certified epsilon meets ``target_epsilon`` at
    ``target_delta`` (:func:`dpjax.pld.allocation.accountant.allocation_noise_multiplier`), for
    scalars, arrays (broadcast, one search per element) or traced targets, whose gradient is the
    implicit derivative at the returned sigma: ``d sigma / d target_epsilon = 1 / (d eps / d
    sigma)``, ``d sigma / d target_delta = -(d eps / d delta) / (d eps / d sigma)``, both partials
    of the certified bound on the plan of the returned sigma (docs/design.md §5, §12.6).
    ``scheme``: as in :func:`query`."""
    from dpjax.pld.allocation import accountant as ra

    sampling, t, k, E = _scheme_args(scheme, epochs=epochs, steps=steps, group_size=group_size)
    if target_epsilon is None or target_delta is None:
        raise ValueError(f"{name}: missing required argument "
                         f"{'target_epsilon' if target_epsilon is None else 'target_delta'}")
    bib = sampling == "balls_in_bins"

    def one(eps, delta):
        return ra.allocation_noise_multiplier(eps, delta, t, E, selections_per_epoch=k, balls_in_bins=bib,
                                              options=options)

    def values(target_epsilon, target_delta):
        privacy = _validate.PrivacyTarget(target_epsilon, target_delta)
        e, d = privacy.epsilon, privacy.delta
        e_b, d_b = np.broadcast_arrays(e, d)
        out = [one(float(x), float(y)) for x, y in zip(e_b.ravel(), d_b.ravel())]
        return np.asarray(out, np.float64).reshape(e_b.shape)

    if _traced.is_traced(target_epsilon, target_delta):
        if not _traced.is_traced(target_epsilon):
            _validate.PrivacyTarget(epsilon=target_epsilon)
        if not _traced.is_traced(target_delta):
            _validate.PrivacyTarget(delta=target_delta)

        def partials(wrt, target_epsilon, target_delta):
            sig = values(target_epsilon, target_delta)
            e_b, d_b = np.broadcast_arrays(np.asarray(target_epsilon, np.float64), np.asarray(target_delta, np.float64))
            return sig, _by_element(sig.shape, wrt, lambda i: sigma_partials(
                sampling, float(sig[i]), float(d_b[i]), t, k, E, options))

        return _traced.host_call(values, partials, {"target_epsilon": target_epsilon, "target_delta": target_delta},
                                 name=name)
    if np.ndim(target_epsilon) == 0 and np.ndim(target_delta) == 0:
        return one(target_epsilon, target_delta)
    return values(target_epsilon, target_delta)


def sigma_partials(sampling, sigma: float, delta: float, t: int, k: int, E: int, options=None) -> dict:
    """Implicit derivatives ``{"target_epsilon": d sigma / d eps, "target_delta": d sigma / d
    delta}`` of the calibrated ``sigma`` (the certified bound's partials on the plan at
    ``sigma``)."""
    d = _one_partials("epsilon", sampling, sigma, delta, t, k, E, options,
                      _one("epsilon", sampling, sigma, delta, t, k, E, options))
    de_ds, de_dd = d["noise_multiplier"], d["target"]
    return {"target_epsilon": 1.0 / de_ds, "target_delta": -de_dd / de_ds}
