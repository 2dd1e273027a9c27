"""Random allocation and balls-in-bins in the interop layer (docs/design.md §12).

* :class:`RandomAllocationDpEvent` -- a dp_accounting ``DpEvent``: ``num_selected`` of
  ``num_steps`` steps per epoch, drawn uniformly, of a Gaussian inner event (one epoch; compose
  epochs with ``SelfComposedDpEvent``).  Balls-in-bins with ``C = I`` over ``E`` epochs is
  ``RandomAllocationDpEvent(GaussianDpEvent(sigma / sqrt(E)), b)`` (one event).  dp_accounting's
  own ``RandomAllocationDpEvent``, where the installed dp_accounting has one, is read the same way.
* :class:`AllocationAccountant` -- a ``dp_accounting.PrivacyAccountant`` for trees of such events
  (``SelfComposedDpEvent`` / ``ComposedDpEvent`` of them, add/remove adjacency), answered by
  :mod:`dpjax.pld.allocation.accountant` (certified upper bounds).
* :class:`RunningAllocationAccountant` -- a training loop's accountant for random allocation or
  balls-in-bins: ``epoch(noise_multiplier=...)`` per epoch (a partial epoch counts as a whole
  one: its outputs are a post-processing of the whole epoch's), ``get_epsilon(delta)``,
  ``state_dict()`` / ``load_state_dict()``.

Example::

    import dp_accounting
    from dpjax.interop.allocation import AllocationAccountant, RandomAllocationDpEvent

    event = dp_accounting.SelfComposedDpEvent(
        RandomAllocationDpEvent(dp_accounting.GaussianDpEvent(1.0), num_steps=100), 10)
    AllocationAccountant().compose(event).get_epsilon(1e-5)   # = dpjax.dpsgd_epsilon(1.0,
    # target_delta=1e-5, sampling="random_allocation", batches_per_epoch=100, epochs=10)
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict

from dpjax._base import validate as _validate
from dpjax._base.enums import AllocationSampling

__all__ = ["RandomAllocationDpEvent", "AllocationAccountant", "RunningAllocationAccountant", "allocation_blocks_of"]


def _dp_accounting():
    import dp_accounting

    return dp_accounting


def _event_base():
    try:
        return _dp_accounting().DpEvent
    except ImportError:  # pragma: no cover - dp_accounting is an optional extra
        return object


@dataclasses.dataclass(frozen=True)
class RandomAllocationDpEvent(_event_base()):
    """One epoch of random allocation: every record in ``num_selected`` of ``num_steps`` steps
    (uniformly), each step the (Gaussian) ``event``."""

    event: object
    num_steps: int
    num_selected: int = 1


def _native_allocation_class():
    try:
        return getattr(_dp_accounting(), "RandomAllocationDpEvent", None)
    except ImportError:  # pragma: no cover
        return None


def _fields(event):
    """``(inner event, num_steps, num_selected)`` of a dpjax or dp_accounting allocation event."""
    inner = getattr(event, "event", getattr(event, "dp_event", None))
    t = getattr(event, "num_steps", getattr(event, "num_rounds", None))
    k = getattr(event, "num_selected", getattr(event, "num_participations", 1))
    if inner is None or t is None:
        raise ValueError(f"cannot read the allocation parameters of {event!r} (expected an inner Gaussian "
                         f"event and num_steps)")
    return inner, t, k


def allocation_blocks_of(event, count: int = 1, out: list | None = None) -> list:
    """``[(noise_multiplier, num_steps, num_selected, epochs)]`` of a tree of allocation events
    (``SelfComposedDpEvent``, ``ComposedDpEvent``, ``NoOpDpEvent`` around them); anything else
    raises ``ValueError``."""
    dpa = _dp_accounting()
    out = [] if out is None else out
    native = _native_allocation_class()
    if isinstance(event, dpa.NoOpDpEvent):
        return out
    if isinstance(event, dpa.SelfComposedDpEvent):
        return allocation_blocks_of(event.event, count * _validate.positive_int("count", event.count), out)
    if isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            allocation_blocks_of(e, count, out)
        return out
    if isinstance(event, RandomAllocationDpEvent) or (native is not None and isinstance(event, native)):
        inner, t, k = _fields(event)
        if not isinstance(inner, dpa.GaussianDpEvent):
            raise ValueError(f"random allocation is accounted for a Gaussian inner event, got {inner!r}")
        sigma = float(_validate.positive("noise_multiplier", inner.noise_multiplier))
        t = _validate.positive_int("num_steps", t)
        k = _validate.positive_int("num_selected", k, maximum=t)
        out.append((sigma, t, k, count))
        return out
    raise ValueError(f"AllocationAccountant accounts random-allocation events (and compositions of them), "
                     f"got {event!r}")


def _account(blocks, *, target_delta=None, target_epsilon=None):
    """Blocks with one noise multiplier and one (t, k): exactly the public call; else a
    composition of every 1-of-t_b block with its own noise multiplier."""
    import numpy as np

    from dpjax.pld.allocation import accountant as ra

    merged: "OrderedDict[tuple, int]" = OrderedDict()
    for sigma, t, k, e in blocks:
        merged[(sigma, t, k)] = merged.get((sigma, t, k), 0) + e
    if len(merged) == 1:
        (sigma, t, k), e = next(iter(merged.items()))
        target = dict(target_delta=target_delta) if target_delta is not None else dict(target_epsilon=target_epsilon)
        return ra.allocation_accounting(sigma, t, e, selections_per_epoch=k, **target)
    sub, sig = [], []
    for (sigma, t, k), e in merged.items():
        for tb, c in ra.allocation_blocks(t, k, e):
            sub.append((tb, c))
            sig.append(sigma)
    # The same bracket as a single call: the lattice capped by the unamplified Gaussian (mu^2 =
    # sum_b c_b / sigma_b^2), or the closed forms where the lattice does not run.
    res = ra._account_result(sig, sub, target_delta, target_epsilon, None)
    return float(np.max(res.epsilon if target_delta is not None else res.delta))


def _value(res, key):
    return float(getattr(res, key)) if hasattr(res, key) else float(res)


def _accountant_base():
    try:
        return _dp_accounting().PrivacyAccountant
    except ImportError:  # pragma: no cover - dp_accounting is an optional extra
        return object


class AllocationAccountant(_accountant_base()):
    """dp_accounting ``PrivacyAccountant`` for random-allocation events (add/remove adjacency)."""

    def __init__(self):
        dpa = _dp_accounting()
        super().__init__(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        self._blocks: list = []

    def supports(self, event) -> bool:
        try:
            allocation_blocks_of(event)
            return True
        except ValueError:
            return False

    def _maybe_compose(self, event, count: int, do_compose: bool):
        dpa = _dp_accounting()
        try:
            blocks = allocation_blocks_of(event, count)
        except ValueError as exc:
            return dpa.CompositionErrorDetails(invalid_event=event, error_message=str(exc))
        if do_compose:
            self._blocks.extend(blocks)
        return None

    def get_epsilon(self, target_delta: float) -> float:
        target_delta = float(_validate.PrivacyTarget(delta=target_delta).delta)
        if not self._blocks:
            return 0.0
        return _value(_account(self._blocks, target_delta=target_delta), "epsilon")

    def get_delta(self, target_epsilon: float) -> float:
        target_epsilon = float(_validate.PrivacyTarget(epsilon=target_epsilon, allow_zero_epsilon=True).epsilon)
        if not self._blocks:
            return 0.0
        return _value(_account(self._blocks, target_epsilon=target_epsilon), "delta")


class RunningAllocationAccountant:
    """Random-allocation (or balls-in-bins) accountant for a training loop.

    Args:
      batches_per_epoch: steps per epoch ``t``.
      selections_per_epoch: ``k`` (random allocation).
      sampling: ``"random_allocation"`` (every epoch drawn afresh) or ``"balls_in_bins"`` (one bin
        per example for the whole run, ``C = I``: the epochs' observations of a bin add up, so
        the run is accounted as one 1-of-``t`` allocation at ``(sum_e sigma_e^-2)^-1/2``).

    ``epoch(noise_multiplier=..., num_epochs=1)`` records epochs; ``get_epsilon(delta)`` is the
    certified epsilon of the epochs so far (for one noise multiplier exactly
    :func:`dpjax.dpsgd_epsilon` with the same arguments).
    """

    _VERSION = 1

    def __init__(self, *, batches_per_epoch: int, selections_per_epoch: int = 1, sampling: str = "random_allocation"):
        self.batches_per_epoch = _validate.positive_int("batches_per_epoch", batches_per_epoch)
        self.selections_per_epoch = _validate.positive_int("selections_per_epoch", selections_per_epoch,
                                                           maximum=self.batches_per_epoch)
        self.sampling = AllocationSampling.parse(sampling, "sampling")
        if self.sampling is AllocationSampling.BALLS_IN_BINS and self.selections_per_epoch != 1:
            raise ValueError("selections_per_epoch must be 1 for sampling='balls_in_bins'")
        self._phases: "OrderedDict[float, int]" = OrderedDict()
        self._cache: dict = {}

    @classmethod
    def from_scenario(cls, scenario) -> "RunningAllocationAccountant":
        """The accountant of a :class:`dpjax.TrainingScenario` of :class:`dpjax.RandomAllocation`
        or :class:`dpjax.BallsInBins` sampling, with the scenario's epochs recorded at its noise
        multiplier (``get_epsilon(delta)`` is then ``dpjax.dpsgd_epsilon(scenario, delta)``);
        later epochs are recorded with :meth:`epoch`.  Other schemes, and a scenario without a
        noise multiplier, are a ``ValueError``."""
        from dpjax.pld.scenario import BallsInBins, RandomAllocation, TrainingScenario

        if not isinstance(scenario, TrainingScenario):
            raise ValueError(f"scenario must be a dpjax.TrainingScenario, got {scenario!r}")
        run = scenario.sampling
        if not isinstance(run, (RandomAllocation, BallsInBins)):
            raise ValueError(f"RunningAllocationAccountant accounts RandomAllocation and BallsInBins sampling, got "
                             f"{type(run).__name__} (dpjax.interop.opacus.RunningAccountant accounts Poisson)")
        if scenario.noise_multiplier is None:
            raise ValueError("RunningAllocationAccountant.from_scenario needs the scenario's noise_multiplier (it is None)")
        acc = cls(batches_per_epoch=run.batches_per_epoch, selections_per_epoch=getattr(run, "selections_per_epoch", 1),
                  sampling=run.keywords()["sampling"])
        return acc.epoch(noise_multiplier=scenario.noise_multiplier,
                         num_epochs=scenario.steps // run.batches_per_epoch)

    def epoch(self, *, noise_multiplier, num_epochs: int = 1) -> "RunningAllocationAccountant":
        """Record ``num_epochs`` epochs at ``noise_multiplier``."""
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        e = _validate.positive_int("num_epochs", num_epochs)
        self._phases[sigma] = self._phases.get(sigma, 0) + e
        self._cache.clear()
        return self

    @property
    def epochs(self) -> int:
        return sum(self._phases.values())

    @property
    def history(self) -> list[tuple[float, int]]:
        return list(self._phases.items())

    def _result(self, **target):
        from dpjax.pld.allocation import accountant as ra

        t, k = self.batches_per_epoch, self.selections_per_epoch
        if self.sampling is AllocationSampling.BALLS_IN_BINS:
            if len(self._phases) == 1:
                (sigma, e), = self._phases.items()
                return ra.balls_in_bins_accounting(sigma, t, e, **target)
            inv = sum(e / (s * s) for s, e in self._phases.items())
            return ra.allocation_accounting(1.0 / math.sqrt(inv), t, 1, **target)
        blocks = [(s, t, k, e) for s, e in self._phases.items()]
        return _account(blocks, **target)

    def get_epsilon(self, delta) -> float:
        """Certified epsilon of the epochs so far at ``delta`` (0 before the first epoch)."""
        delta = float(_validate.probability_open("delta", delta))
        return self._cached("epsilon", ("eps", delta), target_delta=delta)

    def get_delta(self, epsilon) -> float:
        """Certified delta of the epochs so far at ``epsilon``."""
        eps = float(_validate.nonnegative("epsilon", epsilon))
        return self._cached("delta", ("delta", eps), target_epsilon=eps)

    def _cached(self, quantity: str, key: tuple, **target) -> float:
        """``quantity`` ("epsilon" / "delta") of the epochs so far at ``target``, cached under
        ``key`` (0 before the first epoch)."""
        if not self._phases:
            return 0.0
        if key not in self._cache:
            self._cache[key] = _value(self._result(**target), quantity)
        return self._cache[key]

    def state_dict(self) -> dict:
        return {"version": self._VERSION, "batches_per_epoch": self.batches_per_epoch,
                "selections_per_epoch": self.selections_per_epoch, "sampling": self.sampling.value,
                "history": [[s, int(e)] for s, e in self.history]}

    def load_state_dict(self, state: dict) -> "RunningAllocationAccountant":
        if not isinstance(state, dict) or state.get("version") != self._VERSION or "history" not in state:
            raise ValueError(f"state must be a dict from RunningAllocationAccountant.state_dict() "
                             f"(version {self._VERSION}), got {state!r}")
        new = RunningAllocationAccountant(batches_per_epoch=state["batches_per_epoch"],
                                          selections_per_epoch=state.get("selections_per_epoch", 1),
                                          sampling=state.get("sampling", "random_allocation"))
        for entry in state["history"]:
            if len(entry) != 2:
                raise ValueError(f"history entries must be [noise_multiplier, epochs], got {entry!r}")
            new.epoch(noise_multiplier=entry[0], num_epochs=entry[1])
        self.__dict__.update(new.__dict__)
        return self

    def __repr__(self) -> str:
        return (f"RunningAllocationAccountant(sampling={self.sampling.value!r}, batches_per_epoch={self.batches_per_epoch}, "
                f"epochs={self.epochs}, phases={self.history})")
