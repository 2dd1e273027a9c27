"""dp_accounting ``DpEvent``s accounted by dpjax's certified PLD (docs/design.md §11).

:func:`events_to_components` translates a ``DpEvent`` tree into the ``(mechanism, count)``
list that :func:`dpjax.pld.epsilon` / :func:`dpjax.pld.delta` compose; :class:`PLDAccountant`
wraps that in dp_accounting's ``PrivacyAccountant`` interface (``compose``, ``get_epsilon``,
``get_delta``, ``supports``, ``ledger``), so that code written against dp_accounting --
``dp_accounting.mechanism_calibration.calibrate_dp_mechanism``, jax_privacy's accounting
configs -- runs on dpjax unchanged::

    import dp_accounting
    from dpjax.interop import PLDAccountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 1000)
    PLDAccountant().compose(event).get_epsilon(1e-5)           # certified upper bound
    sigma = dp_accounting.mechanism_calibration.calibrate_dp_mechanism(
        PLDAccountant, lambda s: dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(s)), 1000),
        target_epsilon=2.0, target_delta=1e-5)

Supported events and their dpjax mechanisms (noise multipliers relative to sensitivity 1, as in
dp_accounting):

============================================  ====================  ==================================
event                                         neighboring relation  dpjax components
============================================  ====================  ==================================
``GaussianDpEvent(s)``                        add/remove            ``Gaussian(s)``
``GaussianDpEvent(s)``                        replace-one           ``Gaussian(s, sensitivity=2)``
``LaplaceDpEvent(b)``                         add/remove            ``Laplace(b)``
``PoissonSampledDpEvent(q, Gaussian(s))``     add/remove            ``PoissonSubsampledGaussian(s, q)``
``PoissonSampledDpEvent(q, MoG(s, c, p))``    add/remove            ``MixtureOfGaussians(s, (0, c), (1 - q, q p))``
``MixtureOfGaussiansDpEvent(s, c, p)``        add/remove            ``MixtureOfGaussians(s, c, p)``
``SampledWithoutReplacementDpEvent(n, m,      replace-one           ``PoissonSubsampledGaussian(s / 2, m / n)``
Gaussian(s))``                                                      (both directions)
``RandomizedResponseDpEvent(p, k)``           replace-one           ``RandomizedResponse(p, k)``
``SelfComposedDpEvent(e, k)``                 any                   ``e``'s components, counts x k
``ComposedDpEvent([e1, ...])``                any                   concatenation
``NoOpDpEvent``                               any                   nothing
``NonPrivateDpEvent``, zero noise             any                   epsilon = inf, delta = 1
============================================  ====================  ==================================

Sampling without replacement under replace-one: ``(q P + (1 - q) Q, Q)`` dominates the
subsampled mechanism whenever ``(P, Q)`` dominates the base mechanism (Zhu, Dong & Wang,
"Optimal accounting of differential privacy via characteristic function", AISTATS 2022, Thm 10);
with ``P = N(1, s^2)``, ``Q = N(-1, s^2)`` (replace-one Gaussian, clip norm 1) this is, after a
shift and a scaling by 1/2, the remove pair of ``PoissonSubsampledGaussian(s / 2, q)``, and the
swapped pair its add pair; dpjax reports the max of both directions (jax_privacy's fixed-batch
analysis makes the same reduction).  Units: the noise multiplier is relative to the per-example
clip norm, so a replacement moves the sum by up to 2 -- as dp_accounting's PLD treats
``GaussianDpEvent`` under ``REPLACE_ONE`` (epsilon of ``GaussianDpEvent(2)`` 4.38 there, vs
1.99 under add/remove).  dp_accounting's RDP accountant reads the same events with replace
sensitivity 1 (2.17 for ``GaussianDpEvent(2)`` under either relation), a factor 2 in sigma;
its PLD accountant does not support this event.

Anything else (``PoissonSampledDpEvent`` of a Laplace, Poisson sampling under replace-one,
``REPLACE_SPECIAL``, tree aggregation, zCDP, truncated subsampled Gaussian, ...) raises
:class:`UnsupportedDpEventError` (a ``ValueError``) naming the event and why; through
:class:`PLDAccountant` it surfaces as dp_accounting's ``UnsupportedEventError`` from
``compose`` and as ``False`` from ``supports``.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import dp_accounting as _dpa_pkg
from dp_accounting import dp_event as _dpa
import numpy as np

from dpjax import pld
from dpjax._base import validate as _validate
from dpjax.pld.mog import MixtureOfGaussians

__all__ = ["PLDAccountant", "PLDAccountantConfig", "UnsupportedDpEventError", "events_to_components"]

NeighboringRelation = _dpa_pkg.NeighboringRelation
_ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE
_REPLACE = NeighboringRelation.REPLACE_ONE


class UnsupportedDpEventError(ValueError):
    """A ``DpEvent`` dpjax cannot account (the message names the event and the reason)."""

    def __init__(self, event, reason):
        super().__init__(f"dpjax cannot account {event!r}: {reason}")
        self.event = event
        self.reason = reason


class _NonPrivate(Exception):
    pass


def _relation(neighboring_relation):
    if isinstance(neighboring_relation, NeighboringRelation):
        return neighboring_relation
    try:
        return NeighboringRelation[str(neighboring_relation).upper()]
    except KeyError:
        raise ValueError(f"neighboring_relation must be a dp_accounting.NeighboringRelation or one of "
                         f"{[r.name for r in NeighboringRelation]}, got {neighboring_relation!r}") from None


def _need(event, rel, allowed):
    if rel not in allowed:
        names = " or ".join(f"`{r.name}`" for r in allowed)
        raise UnsupportedDpEventError(event, f"neighboring_relation must be {names} for {type(event).__name__}, "
                                             f"found `{rel.name}`")


def _walk(event, count: int, rel, out: list) -> None:
    """Append ``(mechanism, count)`` pairs of ``event`` composed ``count`` times to ``out``.

    Compositions recurse; every other event is a leaf whose mechanism comes from its entry of
    :data:`_LEAVES` (None: the event composes to nothing, e.g. sampling probability 0)."""
    if isinstance(event, _dpa.NoOpDpEvent):
        return
    if isinstance(event, _dpa.NonPrivateDpEvent):
        raise _NonPrivate()
    if isinstance(event, _dpa.SelfComposedDpEvent):
        if int(event.count) < 0:
            raise UnsupportedDpEventError(event, f"count must be >= 0, got {event.count}")
        _walk(event.event, count * int(event.count), rel, out)
        return
    if isinstance(event, _dpa.ComposedDpEvent):
        for e in event.events:
            _walk(e, count, rel, out)
        return
    for cls, leaf in _LEAVES:
        if isinstance(event, cls):
            mech = leaf(event, rel, count)
            if mech is not None:
                out.append((mech, count))
            return
    raise UnsupportedDpEventError(event, f"{type(event).__name__} is not supported by dpjax's PLD accountant")


def _noise(event, value) -> float:
    """A leaf's noise parameter: refused when negative or NaN, non-private when 0."""
    v = float(value)
    if v < 0 or math.isnan(v):
        raise UnsupportedDpEventError(event, f"noise_multiplier must be >= 0, got {v}")
    if v == 0:
        raise _NonPrivate()
    return v


def _gaussian(event, rel, count):
    _need(event, rel, (_ADD_REMOVE, _REPLACE))
    sigma = _noise(event, event.noise_multiplier)
    return pld.Gaussian(sigma, 2.0 if rel == _REPLACE else 1.0) if count else None


def _laplace(event, rel, count):
    _need(event, rel, (_ADD_REMOVE,))
    b = _noise(event, event.noise_multiplier)
    return pld.Laplace(b) if count else None


def _mixture(event, rel, count):
    _need(event, rel, (_ADD_REMOVE,))
    sens = tuple(float(c) for c in event.sensitivities)
    probs = tuple(float(p) for p in event.sampling_probs)
    if all(c == 0 for c in sens):
        return None
    if float(event.standard_deviation) == 0:
        raise _NonPrivate()
    mech = MixtureOfGaussians(float(event.standard_deviation), sens, probs)
    try:
        mech.validate()
    except ValueError as exc:
        raise UnsupportedDpEventError(event, str(exc)) from None
    return mech if count else None


def _poisson_sampled(event, rel, count):
    q = float(event.sampling_probability)
    if not 0 <= q <= 1:
        raise UnsupportedDpEventError(event, f"sampling_probability must be in [0, 1], got {q}")
    inner = event.event
    if rel != _ADD_REMOVE:
        raise UnsupportedDpEventError(
            event, "Poisson sampling is supported under `ADD_OR_REMOVE_ONE` only (under replace-one "
                   "dpjax has no certified dominating pair for it yet)")
    if isinstance(inner, _dpa.GaussianDpEvent):
        sigma = float(inner.noise_multiplier)
        if q == 0:
            return None
        if sigma == 0:
            raise _NonPrivate()
        return pld.PoissonSubsampledGaussian(sigma, q) if count else None
    if isinstance(inner, _dpa.MixtureOfGaussiansDpEvent):
        if q == 0:
            return None
        if float(inner.standard_deviation) == 0:
            raise _NonPrivate()
        # Poisson sampling of a MoG is the MoG that adds sensitivity 0 with weight 1 - q.
        sens = (0.0,) + tuple(float(c) for c in inner.sensitivities)
        probs = (1.0 - q,) + tuple(q * float(p) for p in inner.sampling_probs)
        return MixtureOfGaussians(float(inner.standard_deviation), sens, probs).validate() if count else None
    raise UnsupportedDpEventError(
        event, f"the sub-event of PoissonSampledDpEvent must be a GaussianDpEvent or a "
               f"MixtureOfGaussiansDpEvent, found {type(inner).__name__}")


def _sampled_without_replacement(event, rel, count):
    _need(event, rel, (_REPLACE,))
    n, m = int(event.source_dataset_size), int(event.sample_size)
    if not 0 <= m <= n or n <= 0:
        raise UnsupportedDpEventError(event, f"need 0 <= sample_size <= source_dataset_size, got {m}, {n}")
    inner = event.event
    if not isinstance(inner, _dpa.GaussianDpEvent):
        raise UnsupportedDpEventError(
            event, f"the sub-event of SampledWithoutReplacementDpEvent must be a GaussianDpEvent, "
                   f"found {type(inner).__name__}")
    if m == 0:
        return None
    sigma = float(inner.noise_multiplier)
    if sigma == 0:
        raise _NonPrivate()
    # Zhu, Dong & Wang (2022), Thm 10: (q P + (1-q) Q, Q) with P = N(1), Q = N(-1); see module doc.
    return pld.PoissonSubsampledGaussian(sigma / 2.0, m / n) if count else None


def _randomized_response(event, rel, count):
    _need(event, rel, (_REPLACE,))
    k, p = int(event.num_buckets), float(event.noise_parameter)
    if k == 1:
        return None
    if p == 0:
        raise _NonPrivate()
    return pld.RandomizedResponse(p, k).validate() if count else None


#: The leaf events :func:`_walk` accounts, in the order they are tested, each with the function
#: ``(event, relation, count) -> mechanism or None`` that checks it and builds its mechanism.
_LEAVES = (
    (_dpa.GaussianDpEvent, _gaussian),
    (_dpa.LaplaceDpEvent, _laplace),
    (_dpa.MixtureOfGaussiansDpEvent, _mixture),
    (_dpa.PoissonSampledDpEvent, _poisson_sampled),
    (_dpa.SampledWithoutReplacementDpEvent, _sampled_without_replacement),
    (_dpa.RandomizedResponseDpEvent, _randomized_response),
)


def events_to_components(event, neighboring_relation=_ADD_REMOVE, count: int = 1):
    """``DpEvent`` -> ``(components, non_private)``.

    Args:
      event: a dp_accounting ``DpEvent`` (nested compositions allowed).
      neighboring_relation: ``dp_accounting.NeighboringRelation`` (or its name).
      count: compose the event this many times.

    Returns:
      ``components``: list of ``(dpjax mechanism, count)`` with equal mechanisms merged (counts
      added), ready for :func:`dpjax.pld.epsilon`; ``non_private``: True if some sub-event has no
      privacy (epsilon is then ``inf``).

    Raises:
      UnsupportedDpEventError: an event dpjax cannot account (message says which and why).
    """
    rel = _relation(neighboring_relation)
    out: list = []
    try:
        _walk(event, int(count), rel, out)
    except _NonPrivate:
        return [], True
    merged: "OrderedDict[object, int]" = OrderedDict()
    for mech, k in out:
        merged[mech] = merged.get(mech, 0) + int(k)
    return [(m, k) for m, k in merged.items() if k > 0], False


class PLDAccountant(_dpa_pkg.PrivacyAccountant):
    """``dp_accounting.PrivacyAccountant`` backed by dpjax's certified FFT PLD accountant.

    Args:
      neighboring_relation: ``dp_accounting.NeighboringRelation`` (default ``ADD_OR_REMOVE_ONE``).
      options: :class:`dpjax.pld.GridOptions` (accuracy knobs; default as :func:`dpjax.pld.epsilon`).

    ``get_epsilon(delta)`` is a certified upper bound (``inf`` when nothing can be certified or a
    non-private event was composed); ``get_delta(eps)`` likewise.  Results are cached per
    query until the next ``compose``.
    """

    def __init__(self, neighboring_relation=_ADD_REMOVE, options: "pld.GridOptions | None" = None):
        super().__init__(_relation(neighboring_relation))
        self._options = options
        self._components: list = []
        self._non_private = False
        self._cache: dict = {}

    def _maybe_compose(self, event, count, do_compose):
        try:
            comps, non_private = events_to_components(event, self.neighboring_relation, count)
        except UnsupportedDpEventError as exc:
            return self.CompositionErrorDetails(invalid_event=exc.event, error_message=exc.reason)
        if do_compose:
            self._non_private |= non_private
            merged: "OrderedDict[object, int]" = OrderedDict(self._components)
            for mech, k in comps:
                merged[mech] = merged.get(mech, 0) + k
            self._components = list(merged.items())
            self._cache.clear()
        return None

    def __repr__(self) -> str:
        steps = sum(int(k) for _, k in self._components)
        return (f"PLDAccountant(neighboring_relation={self.neighboring_relation.name}, "
                f"components={len(self._components)}, steps={steps}, non_private={self._non_private})")

    @property
    def components(self) -> list:
        """The composed ``(mechanism, count)`` list (what :func:`dpjax.pld.epsilon` receives)."""
        return list(self._components)

    def get_epsilon(self, target_delta: float) -> float:
        delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
        if self._non_private:
            return math.inf
        if not self._components:
            return 0.0
        key = ("eps", delta)
        if key not in self._cache:
            res = pld.epsilon(self._components, delta, options=self._options, with_lower=False)
            self._cache[key] = float(res.epsilon)
        return self._cache[key]

    def get_delta(self, target_epsilon: float) -> float:
        eps = float(_validate.PrivacyTarget(epsilon=target_epsilon, allow_zero_epsilon=True).epsilon)
        if self._non_private:
            return 1.0
        if not self._components:
            return 0.0
        key = ("delta", eps)
        if key not in self._cache:
            res = pld.delta(self._components, eps, options=self._options, with_lower=False)
            self._cache[key] = float(np.minimum(res.delta, 1.0))
        return self._cache[key]


class PLDAccountantConfig:
    """jax_privacy accountant config for dpjax: ``create_accountant()`` returns a fresh :class:`PLDAccountant`.

    jax_privacy's training accountants take a ``dp_accountant_config`` and call only its
    ``create_accountant()``; pass this instead of ``jax_privacy.accounting.PldAccountantConfig``::

        from jax_privacy.accounting import analysis
        acc = analysis.DpsgdTrainingAccountant(dp_accountant_config=PLDAccountantConfig())
        acc.compute_epsilon(num_updates=1000, dp_params=analysis.DpParams(
            noise_multipliers=1.0, num_samples=50_000, delta=1e-5, batch_size=500))

    Args:
      options: :class:`dpjax.pld.GridOptions` for the accountants it creates.
    """

    def __init__(self, options: "pld.GridOptions | None" = None):
        self.options = options

    def __repr__(self) -> str:
        return f"PLDAccountantConfig(options={self.options!r})"

    def create_accountant(self) -> PLDAccountant:
        return PLDAccountant(_ADD_REMOVE, options=self.options)
