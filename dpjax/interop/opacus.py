"""Opacus / jax_privacy-style names for DP-SGD accounting, on dpjax's certified PLD accountant.

* :func:`get_noise_multiplier` -- ``get_noise_multiplier(*, target_epsilon, target_delta,
  sample_rate, steps=None, epochs=None)`` as in ``opacus.accountants.utils`` (``steps =
  epochs / sample_rate``, exactly, when ``epochs`` is given: :func:`steps_from_epochs`), answered by
  :func:`dpjax.calibration.dpsgd_noise_multiplier` (certified: the epsilon at the returned sigma
  is ``<= target_epsilon``).
* :class:`RunningAccountant` -- a training loop's accountant: ``step(noise_multiplier=...,
  sample_rate=..., num_steps=1)`` per step or per phase, ``get_epsilon(delta)`` at any time,
  ``state_dict()`` / ``load_state_dict()`` for checkpoints.
* :func:`calibrate_steps`, :func:`calibrate_batch_size` -- the largest number of steps, or
  the largest batch size, that meets a target ``(epsilon, delta)`` (as jax_privacy offers).

All accounting is Poisson-subsampled Gaussian, add/remove adjacency (docs/design.md §1-2).

Each of these also takes a :class:`dpjax.TrainingScenario` in place of the run's keywords
(``acc.step(scenario)``, ``get_noise_multiplier(scenario, target_epsilon=..., target_delta=...)``,
...) and gives the keyword call's value.  The scenario must be one this module accounts:
:class:`dpjax.Poisson` sampling at group size 1 (a fixed-batch run is replace-one adjacency,
random allocation and balls-in-bins are other mechanisms: :func:`dpjax.dpsgd_epsilon` and
:func:`dpjax.dpsgd_noise_multiplier` take those scenarios); anything else is a ``ValueError``
saying so.

Running accountant: cost of a query
------------------------------------
The history is kept as one count per distinct ``(noise_multiplier, sample_rate)`` phase
(composition order does not matter for PLD accounting).  ``get_epsilon(delta)`` with no
``horizon`` composes the phases with :func:`dpjax.pld.epsilon` (for one phase exactly the call
:func:`dpjax.dpsgd_epsilon` makes, so the two agree to the last bit) and caches the answer
until the next ``step``.  Given ``horizon`` (the planned total number of steps, which a training
loop knows), the accountant plans one :class:`dpjax.pld.FixedGrid` per distinct phase set at
that horizon and then answers every query with the jitted closed-form
:func:`dpjax.pld.grid_epsilon_fn` at the current counts: a certified upper bound for any counts
(the grid's wrap-around and truncation bounds are evaluated at the counts queried), tight to the
grid's discretization error (default ``1e-3`` relative), with no planning and no recompilation
per query.  ``get_epsilon(delta, exact=True)`` always takes the first path.

Example::

    acc = RunningAccountant(horizon=num_epochs * steps_per_epoch)
    for epoch in range(num_epochs):
        for _ in range(steps_per_epoch):
            ...                                                     # one DP-SGD step
            acc.step(noise_multiplier=sigma, sample_rate=q)
        print(epoch, acc.get_epsilon(1e-5))
    ckpt = acc.state_dict();  acc2 = RunningAccountant();  acc2.load_state_dict(ckpt)
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from dpjax import pld
from dpjax._base import deferred_x64 as _deferred_x64, lazy_module as _lazy_module
from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax._base.names import epochs_to_steps
from dpjax.numerics.root import bisect_integer
from dpjax.pld.scenario import Poisson, TrainingScenario
from dpjax._base.x64 import float64

jax = _lazy_module("jax")

__all__ = ["RunningAccountant", "get_noise_multiplier", "calibrate_steps", "calibrate_batch_size", "steps_from_epochs"]


def _steps_from(sample_rate: float, steps, epochs) -> int:
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps and epochs")
    if steps is not None:
        return _validate.positive_int("steps", steps)
    return steps_from_epochs(epochs, sample_rate)


def _poisson_run(name: str, scenario, stated: dict, *, noise: str) -> tuple:
    """``(noise_multiplier, sample_rate, steps)`` of a scenario this module accounts (Poisson
    sampling, group size 1), for the function ``name``.  ``stated``: the keywords the scenario
    replaces, as given (each must be None).  ``noise``: ``"scalar"`` (one noise multiplier),
    ``"any"`` (also a per-step schedule, as a tuple) or ``"calibrate"`` (None: the function finds it)."""
    if not isinstance(scenario, TrainingScenario):
        raise ValueError(f"{name}: scenario must be a dpjax.TrainingScenario, got {scenario!r}")
    given = sorted(k for k, v in stated.items() if v is not None)
    if given:
        raise ValueError(f"{name}: {', '.join(given)} given with a TrainingScenario, which states them; "
                         f"change the scenario instead (scenario.replace(...))")
    if not isinstance(scenario.sampling, Poisson):
        raise ValueError(f"{name} accounts Poisson sampling (add/remove adjacency), got "
                         f"{type(scenario.sampling).__name__} (adjacency {scenario.adjacency!r}): "
                         f"dpjax.dpsgd_epsilon(scenario, ...) and dpjax.dpsgd_noise_multiplier(scenario, ...) "
                         f"account it")
    if scenario.group_size != 1:
        raise ValueError(f"{name} accounts example-level privacy (group_size 1), got group_size "
                         f"{scenario.group_size}: dpjax.dpsgd_epsilon(scenario, ...) accounts groups")
    sigma = scenario.noise_multiplier
    if noise == "calibrate" and sigma is not None:
        raise ValueError(f"{name} finds the noise multiplier: give a scenario with noise_multiplier=None, "
                         f"got {sigma!r}")
    if noise != "calibrate" and sigma is None:
        raise ValueError(f"{name} needs the scenario's noise_multiplier (it is None)")
    if noise == "scalar" and isinstance(sigma, tuple):
        raise ValueError(f"{name} takes one noise multiplier for every step, got a noise schedule of "
                         f"{len(sigma)} values")
    return sigma, scenario.sampling.sampling_prob, scenario.steps


def steps_from_epochs(epochs: float, sample_rate: float) -> int:
    """The number of steps of ``epochs`` epochs at sampling rate ``sample_rate``: dpjax's one
    rule, :func:`dpjax._base.names.epochs_to_steps` (``epochs / sample_rate`` rounded to the nearest
    integer when it is within float rounding of one, so 7 epochs at 0.07 are 100 steps, else
    rounded up: a partial last epoch is still trained on).  Opacus truncates with ``int()``,
    which can certify one step fewer than the training takes."""
    return epochs_to_steps(epochs, sample_rate)


class Accountant(StrEnum):
    """Opacus's ``accountant`` argument: only ``PLD`` is accepted (Opacus's ``"prv"`` and
    ``"rdp"`` are looser bounds than the certified PLD one)."""

    PLD = "pld"


def get_noise_multiplier(scenario=None, *, target_epsilon, target_delta, sample_rate=None, steps=None, epochs=None,
                         accountant: str = "pld", **kwargs) -> float:
    """Smallest certified DP-SGD noise multiplier for ``(target_epsilon, target_delta)`` (Opacus's name).

    ``get_noise_multiplier(scenario, target_epsilon=..., target_delta=...)``: the same for a
    :class:`dpjax.TrainingScenario` with ``noise_multiplier=None`` and :class:`dpjax.Poisson`
    sampling, in place of ``sample_rate`` and ``steps`` / ``epochs`` (its resolved step count).

    Args:
      scenario: a :class:`dpjax.TrainingScenario` (Poisson, group size 1, noise None), or None
        for the keyword form.
      target_epsilon: > 0.
      target_delta: in (0, 1).
      sample_rate: Poisson sampling probability ``q`` in (0, 1].
      steps / epochs: exactly one; ``steps = epochs / sample_rate`` rounded to the nearest
        integer when within float rounding of one, else up (:func:`steps_from_epochs`; Opacus's
        ``int()`` certified 7 epochs at ``q = 0.07`` for 99 steps).
      accountant: only ``"pld"`` (Opacus's ``"prv"``/``"rdp"`` are looser; kept for signature
        compatibility and rejected clearly).
      kwargs: Opacus's ``epsilon_tolerance`` is accepted and ignored (dpjax's answer is the
        certified minimum to ~1e-8 relative in sigma on its grid).

    Returns:
      float sigma with certified ``epsilon(sigma) <= target_epsilon``.
    """
    Accountant.parse(accountant, "accountant")
    unknown = set(kwargs) - {"epsilon_tolerance"}
    if unknown:
        raise ValueError(f"unexpected keyword arguments {sorted(unknown)}")
    if scenario is not None:
        _, q, t = _poisson_run("get_noise_multiplier", scenario, dict(sample_rate=sample_rate, steps=steps,
                                                                      epochs=epochs), noise="calibrate")
    else:
        if sample_rate is None:
            raise ValueError("get_noise_multiplier needs sample_rate (or a TrainingScenario)")
        q = float(_validate.probability_open_closed("sample_rate", sample_rate))
        t = _steps_from(q, steps, epochs)
    from dpjax.calibration import dpsgd_noise_multiplier

    return float(dpsgd_noise_multiplier(q, t, target_epsilon, target_delta))


def _largest_feasible(lo: int, hi: int, feasible) -> int | None:
    """Largest integer in [lo, hi] with ``feasible`` True (``feasible`` monotone non-increasing)."""
    if not feasible(lo):
        return None
    if feasible(hi):
        return hi
    # feasible(lo), not feasible(hi): the largest feasible is one below the first infeasible.
    return bisect_integer(lambda n: not feasible(n), lo, hi) - 1


def calibrate_steps(scenario=None, *, noise_multiplier=None, sample_rate=None, target_epsilon, target_delta,
                    max_steps: int | None = None) -> int:
    """Largest number of DP-SGD steps whose certified epsilon is ``<= target_epsilon``.

    Keyword form: ``noise_multiplier`` (> 0), ``sample_rate`` (Poisson ``q`` in (0, 1]) and
    ``max_steps`` (an integer >= 1, default ``10**7``), the longest run considered.

    Scenario form: ``calibrate_steps(scenario, target_epsilon=..., target_delta=...)`` with a
    :class:`dpjax.TrainingScenario` of :class:`dpjax.Poisson` sampling, one noise multiplier and
    group size 1; its step count (``steps``, or ``epochs`` resolved) is the longest run
    considered, i.e. the keyword form with ``max_steps=scenario.steps``.

    Exponential then binary search on the (monotone) certified epsilon; ``ValueError`` if not
    even one step fits.  Returns ``max_steps`` if that still fits.
    """
    if scenario is not None:
        sigma, q, max_steps = _poisson_run("calibrate_steps", scenario, dict(
            noise_multiplier=noise_multiplier, sample_rate=sample_rate, max_steps=max_steps), noise="scalar")
    else:
        if noise_multiplier is None or sample_rate is None:
            raise ValueError("calibrate_steps needs noise_multiplier and sample_rate (or a TrainingScenario)")
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        q = float(_validate.probability_open_closed("sample_rate", sample_rate))
    target = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, delta = float(target.epsilon), float(target.delta)
    if scenario is None:
        max_steps = _validate.positive_int("max_steps", 10**7 if max_steps is None else max_steps)
    ok = lambda t: pld.dpsgd_epsilon(sigma, q, t, delta) <= eps  # noqa: E731
    if not ok(1):
        raise ValueError(f"even one step exceeds target_epsilon = {eps} at noise_multiplier = {sigma}, "
                         f"sample_rate = {q}")
    lo, hi = 1, 2
    while hi < max_steps and ok(hi):
        lo, hi = hi, min(2 * hi, max_steps)
    return _largest_feasible(lo, hi, ok)


def calibrate_batch_size(scenario=None, *, noise_multiplier=None, num_examples, steps=None, target_epsilon,
                         target_delta, max_batch_size: int | None = None) -> int:
    """Largest expected batch size ``B`` (Poisson sampling at ``q = B / N``) for ``steps`` steps
    within ``(eps, delta)``.

    As jax_privacy's ``calibrate_batch_size``: noise multiplier and number of updates fixed; a
    larger batch samples each example more often.  ``ValueError`` if ``B = 1`` already exceeds
    the target.

    Keyword form: ``noise_multiplier`` (> 0), ``num_examples`` ``N`` (an integer >= 1), ``steps``
    (an integer >= 1) and ``max_batch_size`` (an integer in [1, N], default ``N``), the largest
    batch considered.

    Scenario form: ``calibrate_batch_size(scenario, num_examples=N, target_epsilon=...,
    target_delta=...)`` with a :class:`dpjax.TrainingScenario` of :class:`dpjax.Poisson` sampling,
    one noise multiplier and group size 1: its noise multiplier and step count are the run's, and
    its sampling rate ``q`` the largest considered, i.e. the keyword form with ``max_batch_size``
    the largest ``B <= N`` with ``B / N <= q`` (``Poisson(1.0)`` searches every size).  A
    :class:`dpjax.FixedBatch` scenario is refused: fixed batches are replace-one adjacency, which
    this Poisson accounting does not bound.
    """
    if scenario is not None:
        sigma, q, t = _poisson_run("calibrate_batch_size", scenario, dict(
            noise_multiplier=noise_multiplier, steps=steps, max_batch_size=max_batch_size), noise="scalar")
        n = _validate.positive_int("num_examples", num_examples)
        largest = _largest_batch_at_rate(q, n)
    else:
        if noise_multiplier is None or steps is None:
            raise ValueError("calibrate_batch_size needs noise_multiplier and steps (or a TrainingScenario)")
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        n = _validate.positive_int("num_examples", num_examples)
        t = _validate.positive_int("steps", steps)
        largest = n if max_batch_size is None else _validate.positive_int("max_batch_size", max_batch_size, maximum=n)
    target = _validate.PrivacyTarget(target_epsilon, target_delta)
    eps, delta = float(target.epsilon), float(target.delta)
    ok = lambda b: pld.dpsgd_epsilon(sigma, b / n, t, delta) <= eps  # noqa: E731
    best = _largest_feasible(1, largest, ok)
    if best is None:
        raise ValueError(f"batch size 1 already exceeds target_epsilon = {eps} (noise_multiplier {sigma}, "
                         f"{t} steps, {n} examples)")
    return best


def _largest_batch_at_rate(q: float, n: int) -> int:
    """The largest ``B`` in [1, n] with ``B / n <= q`` (the division the accounting uses)."""
    b = min(n, math.floor(q * n))
    while b < n and (b + 1) / n <= q:
        b += 1
    while b > 0 and b / n > q:
        b -= 1
    if b < 1:
        raise ValueError(f"calibrate_batch_size: the scenario's sampling_prob {q!r} is below 1 / num_examples "
                         f"= 1 / {n} (no batch of one example or more)")
    return b


# One jitted program for every accountant: the grid is a pytree whose static part (FFT length,
# support lengths, directions) keys the compilation cache, so a new accountant with the same
# grid shape (a restarted loop, a restored checkpoint) reuses the compiled program.
_epsilon_on_grid = jax.jit(float64(lambda grid, delta, counts: pld.grid_epsilon_fn(grid, delta, counts=counts)))


class RunningAccountant:
    """DP-SGD accountant for a training loop (Opacus's ``accountant.step`` / ``get_epsilon``).

    Args:
      horizon: optional planned total number of steps; enables the fixed-grid query path
        (module docstring).  ``None``: every query is a full :func:`dpjax.pld.epsilon`.
      options: :class:`dpjax.pld.GridOptions` for both paths.

    ``history``: list of ``(noise_multiplier, sample_rate, count)``, one per distinct phase.
    """

    _VERSION = 1

    def __init__(self, *, horizon: int | None = None, options: "pld.GridOptions | None" = None):
        self.horizon = None if horizon is None else _validate.positive_int("horizon", horizon)
        self.options = options
        self._phases: "OrderedDict[tuple[float, float], int]" = OrderedDict()
        self._cache: dict = {}
        self._grids: dict = {}

    # ------------------------------------------------------------------ history
    def step(self, scenario=None, *, noise_multiplier=None, sample_rate=None,
             num_steps: int | None = None) -> "RunningAccountant":
        """Record ``num_steps`` (an integer >= 1, default 1) DP-SGD steps with this
        ``noise_multiplier`` (> 0) and ``sample_rate`` (in (0, 1]).

        ``step(scenario)``: record a :class:`dpjax.TrainingScenario`'s steps, the same history as
        the keyword calls.  The accountant accounts Poisson sampling at group size 1 (add/remove
        adjacency); a per-step noise schedule records each step at its own noise multiplier.
        Fixed batches (replace-one adjacency), random allocation, balls-in-bins and group
        privacy are a ``ValueError``.
        """
        if scenario is not None:
            sigma, q, t = _poisson_run("RunningAccountant.step", scenario, dict(
                noise_multiplier=noise_multiplier, sample_rate=sample_rate, num_steps=num_steps), noise="any")
            for s in (sigma if isinstance(sigma, tuple) else (sigma,)):
                self.step(noise_multiplier=s, sample_rate=q, num_steps=1 if isinstance(sigma, tuple) else t)
            return self
        if noise_multiplier is None or sample_rate is None:
            raise ValueError("RunningAccountant.step needs noise_multiplier and sample_rate (or a TrainingScenario)")
        sigma = float(_validate.positive("noise_multiplier", noise_multiplier))
        q = float(_validate.probability_open_closed("sample_rate", sample_rate))
        k = _validate.positive_int("num_steps", 1 if num_steps is None else num_steps)
        self._phases[(sigma, q)] = self._phases.get((sigma, q), 0) + k
        self._cache.clear()
        return self

    @property
    def history(self) -> list[tuple[float, float, int]]:
        return [(s, q, k) for (s, q), k in self._phases.items()]

    def __len__(self) -> int:
        return sum(self._phases.values())

    def components(self) -> list:
        """``[(PoissonSubsampledGaussian(sigma, q), count), ...]`` for :func:`dpjax.pld.epsilon`."""
        return [(pld.PoissonSubsampledGaussian(s, q), k) for (s, q), k in self._phases.items()]

    # ------------------------------------------------------------------ queries
    def get_epsilon(self, delta, *, exact: bool | None = None) -> float:
        """Certified epsilon of the steps so far at ``delta`` (0 before the first step).

        ``exact=None``: the fixed-grid path if ``horizon`` was given and the steps so far do not
        exceed it, else the full composition; ``exact=True`` forces the full composition.
        """
        delta = float(_validate.probability_open("delta", delta))
        if not self._phases:
            return 0.0
        fast = (not exact) and self.horizon is not None and len(self) <= self.horizon
        key = ("eps", delta, fast)
        if key not in self._cache:
            eps = self._fast_epsilon(delta) if fast else self._exact_epsilon(delta)
            if not math.isfinite(eps) and fast:
                # The fixed grid could not certify a direction: the full composition falls back on
                # the smallest certified bound there (dpjax.pld.fallback), as a single call does.
                eps = self._exact_epsilon(delta)
            self._cache[key] = eps
        return self._cache[key]

    def get_delta(self, epsilon) -> float:
        """Certified delta of the steps so far at ``epsilon`` (full composition, cached)."""
        eps = float(_validate.nonnegative("epsilon", epsilon))
        if not self._phases:
            return 0.0
        key = ("delta", eps)
        if key not in self._cache:
            res = pld.delta(self.components(), eps, options=self.options, with_lower=False)
            self._cache[key] = float(min(res.delta, 1.0))
        return self._cache[key]

    def _exact_epsilon(self, delta: float) -> float:
        res = pld.epsilon(self.components(), np.asarray(delta, np.float64), options=self.options, with_lower=False)
        return float(res.epsilon)

    def _fast_epsilon(self, delta: float) -> float:
        phases = tuple(self._phases)
        gkey = (phases, delta)
        if gkey not in self._grids:
            # Plan every distinct phase at the full horizon: the widest window any later count
            # needs; certified for every count, tight near the horizon.
            comps = [(pld.PoissonSubsampledGaussian(s, q), self.horizon) for s, q in phases]
            self._grids[gkey] = pld.plan_fixed_grid(comps, target_delta=delta, options=self.options)
        grid = self._grids[gkey]
        counts = tuple(np.asarray([self._phases[p]], np.int64) for p in phases)
        with _deferred_x64():
            return float(_epsilon_on_grid(grid, np.float64(delta), counts))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """JSON-ready state: ``{"version", "horizon", "history": [[sigma, q, count], ...]}``."""
        return {"version": self._VERSION, "horizon": self.horizon,
                "history": [[s, q, int(k)] for s, q, k in self.history]}

    def load_state_dict(self, state: dict) -> "RunningAccountant":
        """Replace the history (and horizon) by ``state`` from :meth:`state_dict`; validated."""
        if not isinstance(state, dict) or state.get("version") != self._VERSION or "history" not in state:
            raise ValueError(f"state must be a dict from RunningAccountant.state_dict() (version {self._VERSION}), "
                             f"got {state!r}")
        horizon = state.get("horizon")
        new = RunningAccountant(horizon=horizon, options=self.options)
        history = state["history"]
        if not isinstance(history, (list, tuple)):
            raise ValueError(f"state['history'] must be a list of [noise_multiplier, sample_rate, count] entries, "
                             f"got {history!r}")
        for entry in history:
            if not isinstance(entry, (list, tuple)) or len(entry) != 3:
                raise ValueError(f"history entries must be [noise_multiplier, sample_rate, count], got {entry!r}")
            new.step(noise_multiplier=entry[0], sample_rate=entry[1], num_steps=entry[2])
        self.horizon, self._phases = new.horizon, new._phases
        self._cache.clear()
        self._grids.clear()
        return self

    def __repr__(self) -> str:
        return f"RunningAccountant(steps={len(self)}, phases={self.history}, horizon={self.horizon})"
