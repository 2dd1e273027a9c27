"""One record of a DP-SGD training run: :class:`TrainingScenario`, with its sampling scheme as a
typed value (:class:`Poisson`, :class:`FixedBatch`, :class:`RandomAllocation`,
:class:`BallsInBins`).

The accounting of a run depends on its noise, on how batches are drawn, on how many steps it
takes and on the unit of privacy (one example or a group).  The keyword functions
(:func:`dpjax.dpsgd_epsilon`, :func:`dpjax.dpsgd_delta`, :func:`dpjax.dpsgd_noise_multiplier`,
:func:`dpjax.epsilon_curve`, :func:`dpjax.dpsgd_privacy_report`) spell these as a dozen keywords
whose valid combinations depend on ``sampling``; the record states them once, is checked when it
is made, and every one of those functions takes it in place of the keywords::

    >>> import dpjax
    >>> run = dpjax.TrainingScenario(noise_multiplier=1.0, sampling=dpjax.Poisson(0.07), epochs=7)
    >>> run.steps                     # the one epochs rule: 7 / 0.07 is 100 steps
    100
    >>> dpjax.dpsgd_epsilon(run, target_delta=1e-5)              # doctest: +SKIP
    >>> dpjax.dpsgd_noise_multiplier(run.replace(noise_multiplier=None), target_epsilon=2.0,
    ...                              target_delta=1e-5)          # doctest: +SKIP

Epochs become steps once, here, by :func:`dpjax._base.names.epochs_to_steps` (never fewer steps
than training takes) for Poisson and fixed batches (``q = batch_size / dataset_size``); random
allocation and balls-in-bins take ``batches_per_epoch`` steps per epoch.  The neighbouring
relation follows from the scheme: add/remove for Poisson, random allocation and balls-in-bins,
replace-one for fixed batches (:attr:`TrainingScenario.adjacency`).

New schemes are new record types with a ``keywords()`` method giving the keyword functions'
arguments; the functions themselves do not change.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Union

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.names import epochs_to_steps, resolve_sample_rate
from dpjax._base.results import ResultMixin

__all__ = ["Poisson", "FixedBatch", "RandomAllocation", "BallsInBins", "BMinSepSampling", "SamplingScheme",
           "TrainingScenario", "accepts_scenario", "STATED_KEYWORDS", "SchemeKeywords", "scheme_keywords",
           "scheme_from_keywords"]


@dataclasses.dataclass(frozen=True)
class Poisson:
    """Each example joins each batch independently with probability ``sampling_prob`` (in (0, 1])."""

    sampling_prob: float

    def __post_init__(self):
        object.__setattr__(self, "sampling_prob",
                           float(_validate.probability_open_closed("sampling_prob", self.sampling_prob)))

    def keywords(self) -> dict:
        return dict(sampling="poisson", sampling_prob=self.sampling_prob)

    @property
    def steps_per_epoch(self) -> float:
        return 1.0 / self.sampling_prob


@dataclasses.dataclass(frozen=True)
class FixedBatch:
    """Batches of exactly ``batch_size`` examples drawn without replacement from ``dataset_size``
    (replace-one adjacency; Ganesh (2024), "Tight Group-Level DP Guarantees for DP-SGD with
    Sampling via Mixture of Gaussians Mechanisms")."""

    batch_size: int
    dataset_size: int

    def __post_init__(self):
        n = _validate.positive_int("dataset_size", self.dataset_size)
        b = _validate.positive_int("batch_size", self.batch_size, maximum=n)
        object.__setattr__(self, "dataset_size", n)
        object.__setattr__(self, "batch_size", b)

    @property
    def sampling_prob(self) -> float:
        return self.batch_size / self.dataset_size

    @property
    def steps_per_epoch(self) -> float:
        return self.dataset_size / self.batch_size

    def keywords(self) -> dict:
        return dict(sampling="fixed_batch", dataset_size=self.dataset_size, batch_size=self.batch_size)


@dataclasses.dataclass(frozen=True)
class RandomAllocation:
    """Each epoch, each example takes part in ``selections_per_epoch`` of the ``batches_per_epoch``
    steps, drawn afresh (Feldman & Shenfeld, "Privacy amplification by random allocation")."""

    batches_per_epoch: int
    selections_per_epoch: int = 1

    def __post_init__(self):
        t = _validate.positive_int("batches_per_epoch", self.batches_per_epoch)
        k = _validate.positive_int("selections_per_epoch", self.selections_per_epoch, maximum=t)
        object.__setattr__(self, "batches_per_epoch", t)
        object.__setattr__(self, "selections_per_epoch", k)

    @property
    def steps_per_epoch(self) -> int:
        return self.batches_per_epoch

    def keywords(self) -> dict:
        return dict(sampling="random_allocation", batches_per_epoch=self.batches_per_epoch,
                    selections_per_epoch=self.selections_per_epoch)


@dataclasses.dataclass(frozen=True)
class BallsInBins:
    """Each epoch, each example falls into one of ``batches_per_epoch`` bins uniformly at random
    (Chua et al., "Balls-and-bins sampling for DP-SGD"; accounted with ``C = I``)."""

    batches_per_epoch: int

    def __post_init__(self):
        object.__setattr__(self, "batches_per_epoch",
                           _validate.positive_int("batches_per_epoch", self.batches_per_epoch))

    @property
    def steps_per_epoch(self) -> int:
        return self.batches_per_epoch

    def keywords(self) -> dict:
        return dict(sampling="balls_in_bins", batches_per_epoch=self.batches_per_epoch)


@dataclasses.dataclass(frozen=True)
class BMinSepSampling:
    """b-min-sep sampling (Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep
    Subsampling"): in each of ``num_rounds`` rounds an example that sat out the previous
    ``min_sep - 1`` rounds participates with probability ``sampling_prob``, from the chain's
    stationary start (jax_privacy's ``BMinSepSampling(sampling_prob, iterations, min_sep,
    warm_start=True)``; the training schedule :class:`dpjax.sampling.BMinSepSampler`).

    A scheme of the Monte Carlo accounting of banded matrix mechanisms
    (:class:`dpjax.montecarlo.BMinSep`) and of the correlation-matrix optimisation
    (:class:`dpjax.optimization.CorrelationProblem`); the PLD accountant and
    :class:`TrainingScenario` do not take it.  It has no epochs: the scheme fixes ``n``, the
    number of rounds, itself (``num_rounds``, jax_privacy's ``iterations``).

    Attributes:
      min_sep: ``b``, an integer ``>= 1`` (``1`` is Poisson sampling).
      sampling_prob: ``p`` in ``(0, 1]``, the probability that an eligible example participates;
        the stationary participation rate is ``p / (1 + (b - 1) p)``.  ``p = 1`` is balls-in-bins
        with ``b`` batches per epoch.
      num_rounds: ``n``, an integer ``>= 1``.

    Example::

        dpjax.BMinSepSampling(min_sep=4, sampling_prob=0.25, num_rounds=64)

    Raises:
      ValueError: naming the field and its range.
    """

    min_sep: int
    sampling_prob: float
    num_rounds: int

    def __post_init__(self):
        object.__setattr__(self, "min_sep", _validate.positive_int("min_sep", self.min_sep))
        object.__setattr__(self, "sampling_prob",
                           float(_validate.probability_open_closed("sampling_prob", self.sampling_prob)))
        object.__setattr__(self, "num_rounds", _validate.positive_int("num_rounds", self.num_rounds))

    @property
    def participation_rate(self) -> float:
        """``p / (1 + (b - 1) p)``: the probability that a given example is in a given round."""
        return self.sampling_prob / (1.0 + (self.min_sep - 1) * self.sampling_prob)


SamplingScheme = Union[Poisson, FixedBatch, RandomAllocation, BallsInBins]
_SCHEMES = (Poisson, FixedBatch, RandomAllocation, BallsInBins)
_PER_EPOCH = (RandomAllocation, BallsInBins)


_SCHEME_NAMES = {"poisson": Poisson, "fixed_batch": FixedBatch, "random_allocation": RandomAllocation,
                 "balls_in_bins": BallsInBins}

_SCHEME_SPELLINGS = ("Poisson(sampling_prob)", "FixedBatch(batch_size, dataset_size)",
                     "RandomAllocation(batches_per_epoch, selections_per_epoch)", "BallsInBins(batches_per_epoch)")


class SchemeKeywords(NamedTuple):
    """A sampling scheme spelt as the accounting layer's keywords (:func:`scheme_keywords`)."""

    sampling: str = "poisson"
    sampling_prob: object = None
    dataset_size: int | None = None
    batch_size: int | None = None
    batches_per_epoch: int | None = None
    selections_per_epoch: int = 1


def scheme_from_keywords(sampling="poisson", *, dataset_size=None, batch_size=None, batches_per_epoch=None,
                         selections_per_epoch=1):
    """The ``sampling=`` value of the accounting layer's keywords: ``"poisson"`` (the sampling
    probability stays a separate argument, a number or an array) or the scheme record
    (:class:`FixedBatch`, :class:`RandomAllocation`, :class:`BallsInBins`), checked; the
    inverse of :func:`scheme_keywords` for the command line and the sweep's rows."""
    name = getattr(sampling, "value", sampling)
    if name not in _SCHEME_NAMES:
        raise ValueError(f"sampling must be one of {sorted(_SCHEME_NAMES)}, got {sampling!r}")
    given = {k for k, v in dict(dataset_size=dataset_size, batch_size=batch_size, batches_per_epoch=batches_per_epoch,
                                 selections_per_epoch=None if selections_per_epoch == 1 else selections_per_epoch
                                 ).items() if v is not None}
    fields = {f.name for f in dataclasses.fields(_SCHEME_NAMES[name])} - {"sampling_prob"}
    if given - fields:
        raise ValueError(f"{', '.join(sorted(given - fields))} do not apply to sampling={name!r} "
                         f"(its sizes: {', '.join(sorted(fields)) or 'none'})")
    if name == "poisson":
        return "poisson"
    if name == "fixed_batch":
        if dataset_size is None or batch_size is None:
            raise ValueError("sampling='fixed_batch' needs dataset_size and batch_size (integers >= 1)")
        return FixedBatch(batch_size, dataset_size)
    if batches_per_epoch is None:
        raise ValueError(f"sampling={name!r} needs batches_per_epoch (an integer >= 1)")
    if name == "balls_in_bins":
        return BallsInBins(batches_per_epoch)
    return RandomAllocation(batches_per_epoch, selections_per_epoch)


def scheme_keywords(name: str, sampling, sampling_prob=None, *, sample_rate=None,
                    accepts: tuple = _SCHEMES) -> SchemeKeywords:
    """The scheme of a public function's ``sampling=`` argument as the accounting layer's keywords.

    ``sampling`` is ``"poisson"`` (the default of every DP-SGD function: the sampling
    probability is then ``sampling_prob``, a number, an array or a tracer) or a scheme record
    (:class:`Poisson`, :class:`FixedBatch`, :class:`RandomAllocation`, :class:`BallsInBins`),
    which states its own sizes, so ``sampling_prob`` must then be None.  ``sample_rate`` is
    Opacus's spelling of ``sampling_prob`` (:func:`dpjax._base.names.resolve_sample_rate`).
    ``accepts`` lists the schemes the function ``name`` accounts; any other value is a
    ``ValueError`` naming them.
    """
    sampling_prob = resolve_sample_rate(name, sampling_prob, sample_rate)
    if isinstance(sampling, str) or sampling is None:
        if sampling is None or getattr(sampling, "value", sampling) == "poisson":
            return SchemeKeywords(sampling_prob=sampling_prob)
        scheme = _SCHEME_NAMES.get(getattr(sampling, "value", sampling))
        if scheme is not None and scheme in accepts:
            raise ValueError(f"{name}: sampling={sampling!r} is given as a record that states its sizes: "
                             f"sampling=dpjax.{_SCHEME_SPELLINGS[_SCHEMES.index(scheme)]}")
    if not isinstance(sampling, accepts):
        raise ValueError(f"{name}: sampling must be 'poisson' or "
                         f"{' or '.join('dpjax.' + _SCHEME_SPELLINGS[_SCHEMES.index(s)] for s in accepts)} "
                         f"(the schemes it accounts), got {sampling!r}")
    if sampling_prob is not None:
        raise ValueError(f"{name}: sampling_prob is stated by sampling={sampling!r}; leave sampling_prob out")
    return SchemeKeywords(**sampling.keywords())


@dataclasses.dataclass(frozen=True)
class TrainingScenario(ResultMixin):
    """A DP-SGD training run as the accountant sees it.

    Attributes:
      noise_multiplier: the Gaussian noise's standard deviation over the clipping norm, a number
        > 0; or a schedule, one value per step (Poisson only; its length is the step count); or
        None for a scenario whose noise is to be calibrated (:func:`dpjax.dpsgd_noise_multiplier`).
      sampling: how batches are drawn (:class:`Poisson`, :class:`FixedBatch`,
        :class:`RandomAllocation`, :class:`BallsInBins`).
      steps: the number of training steps; or
      epochs: the number of passes over the data (give one of the two).  Random allocation and
        balls-in-bins take whole epochs of ``batches_per_epoch`` steps.
      group_size: the unit of privacy in examples (1: example-level; larger: group privacy,
        Poisson and fixed batches).

    The record is checked when it is made (a ``ValueError`` naming the field and its valid
    range); :attr:`steps` is the resolved step count whichever was given.  It saves as JSON
    (``to_json(path)`` / ``TrainingScenario.load(path)``), the scheme as
    ``{"scheme": "poisson", "sampling_prob": ...}``.
    """

    _format = "dpjax-training-scenario-1"

    noise_multiplier: object
    sampling: SamplingScheme
    steps: int | None = None
    epochs: float | None = None
    group_size: int = 1

    def __post_init__(self):
        if not isinstance(self.sampling, _SCHEMES):
            raise ValueError(f"sampling must be Poisson(q), FixedBatch(batch_size, dataset_size), "
                             f"RandomAllocation(batches_per_epoch, selections_per_epoch) or "
                             f"BallsInBins(batches_per_epoch), got {self.sampling!r}")
        object.__setattr__(self, "group_size", _validate.positive_int("group_size", self.group_size))
        if self.group_size != 1 and isinstance(self.sampling, _PER_EPOCH):
            raise ValueError(f"group_size must be 1 with {type(self.sampling).__name__} (group privacy is "
                             f"accounted for Poisson and FixedBatch), got {self.group_size}")
        schedule = self.noise_multiplier is not None and np.ndim(self.noise_multiplier) > 0
        if self.noise_multiplier is not None:
            sigma = _validate.positive("noise_multiplier", self.noise_multiplier)
            object.__setattr__(self, "noise_multiplier",
                               tuple(float(s) for s in np.ravel(sigma)) if schedule else float(sigma))
        if schedule and not isinstance(self.sampling, Poisson):
            raise ValueError(f"a noise schedule (one noise_multiplier per step) is accounted with Poisson "
                             f"sampling, not {type(self.sampling).__name__}")
        if schedule and self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", len(self.noise_multiplier))
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give steps or epochs (one of the two), got "
                             f"steps={self.steps!r}, epochs={self.epochs!r}")
        if self.epochs is not None:
            if isinstance(self.sampling, _PER_EPOCH):
                epochs = _validate.positive_int("epochs", self.epochs)
                steps = epochs * self.sampling.batches_per_epoch
            else:
                epochs = float(_validate.positive("epochs", self.epochs))
                steps = epochs_to_steps(epochs, self.sampling.sampling_prob)
            object.__setattr__(self, "epochs", epochs)
            object.__setattr__(self, "steps", steps)
        else:
            steps = _validate.positive_int("steps", self.steps)
            if isinstance(self.sampling, _PER_EPOCH) and steps % self.sampling.batches_per_epoch:
                raise ValueError(f"steps must be a multiple of batches_per_epoch = "
                                 f"{self.sampling.batches_per_epoch} with {type(self.sampling).__name__} "
                                 f"(whole epochs), got {steps}")
            object.__setattr__(self, "steps", steps)
        if schedule and len(self.noise_multiplier) != self.steps:
            raise ValueError(f"the noise schedule has {len(self.noise_multiplier)} values for {self.steps} steps")

    @property
    def adjacency(self) -> str:
        """``"replace"`` for fixed batches, ``"add_or_remove"`` for the other schemes."""
        return "replace" if isinstance(self.sampling, FixedBatch) else "add_or_remove"

    def replace(self, **changes) -> "TrainingScenario":
        """A copy with some fields changed (``steps`` or ``epochs`` given alone replaces both)."""
        if "steps" in changes and "epochs" not in changes:
            changes["epochs"] = None
        elif "epochs" in changes and "steps" not in changes:
            changes["steps"] = None
        elif "steps" not in changes and self.epochs is not None:
            changes["steps"] = None  # resolved again from the epochs (the scheme may change)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data: the fields, the scheme as ``{"scheme": name, **its fields}``."""
        sampling = {"scheme": self.sampling.keywords()["sampling"], **dataclasses.asdict(self.sampling)}
        noise = list(self.noise_multiplier) if isinstance(self.noise_multiplier, tuple) else self.noise_multiplier
        return {"format": self._format, "noise_multiplier": noise, "sampling": sampling, "steps": self.steps,
                "epochs": self.epochs, "group_size": self.group_size}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingScenario":
        """The record of :meth:`to_dict` data; a step count that its epochs no longer give (an
        edited file) is refused."""
        if not isinstance(data, dict) or data.get("format") != cls._format:
            raise ValueError(f"not a TrainingScenario (format {cls._format!r} expected)")
        unknown = set(data) - {"format", "noise_multiplier", "sampling", "steps", "epochs", "group_size"}
        if unknown:
            raise ValueError(f"TrainingScenario.from_dict: unknown fields {sorted(unknown)}")
        spec = dict(data.get("sampling") or {})
        scheme = _SCHEME_NAMES.get(spec.pop("scheme", None))
        if scheme is None:
            raise ValueError(f"sampling.scheme must be one of {sorted(_SCHEME_NAMES)}, got {data.get('sampling')!r}")
        fields = {f.name for f in dataclasses.fields(scheme)}
        required = {f.name for f in dataclasses.fields(scheme) if f.default is dataclasses.MISSING}
        if set(spec) - fields or required - set(spec):
            raise ValueError(f"sampling fields of {scheme.__name__} are {sorted(fields)} ({sorted(required)} "
                             f"required), got {sorted(spec)}")
        noise = data.get("noise_multiplier")
        run = cls(np.asarray(noise, np.float64) if isinstance(noise, list) else noise, scheme(**spec),
                  steps=None if data.get("epochs") is not None else data.get("steps"), epochs=data.get("epochs"),
                  group_size=data.get("group_size", 1))
        if data.get("steps") is not None and run.steps != data["steps"]:
            raise ValueError(f"steps {data['steps']!r} does not match epochs {data['epochs']!r} "
                             f"({run.steps} steps by the epochs rule)")
        return run

    def keywords(self) -> dict:
        """The keyword arguments of the keyword functions for this run (``target_*`` aside):
        ``sampling_prob`` for Poisson, ``sampling=`` the scheme record for the other schemes."""
        if isinstance(self.sampling, Poisson):
            kw = {"sampling_prob": self.sampling.sampling_prob}
        else:
            kw = {"sampling": self.sampling}
        if isinstance(self.sampling, _PER_EPOCH):
            kw["epochs"] = self.steps // self.sampling.batches_per_epoch
        else:
            kw["steps"] = self.steps
            if self.group_size != 1:
                kw["group_size"] = self.group_size
        if isinstance(self.noise_multiplier, tuple):
            kw["noise_schedule"] = np.asarray(self.noise_multiplier)
        elif self.noise_multiplier is not None:
            kw["noise_multiplier"] = self.noise_multiplier
        return kw


#: The keyword arguments a :class:`TrainingScenario` states, with the keyword functions' defaults
#: (a keyword at its default is not "given"): the one list the functions taking a scenario, the
#: sweep and the command line check against.
STATED_KEYWORDS = {"noise_multiplier": None, "noise_schedule": None, "sampling_prob": None, "sample_rate": None,
                   "steps": None, "epochs": None, "group_size": 1, "sampling": "poisson"}


def accepts_scenario(*targets: str, name: str, noise: str = "use", overridable: tuple[str, ...] = ()):
    """Decorator: the keyword function also takes a :class:`TrainingScenario` as its first
    argument, followed by ``targets`` (positional or by name), and nothing the scenario states
    but the ``overridable`` keywords (an eps(T) curve's list of step counts or epochs).

    ``name`` is the public name errors use; ``noise="use"`` passes the scenario's noise,
    ``"calibrate"`` requires it to be None (the function finds it)."""

    def decorate(fn):
        import inspect

        params = set(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not args or not isinstance(args[0], TrainingScenario):
                return fn(*args, **kwargs)
            scenario, rest = args[0], args[1:]
            if len(rest) > len(targets):
                raise ValueError(f"{name}(scenario, ...) takes {', '.join(targets)} after the scenario, "
                                 f"got {len(rest)} positional values")
            given = dict(zip(targets, rest))
            for target in targets:
                if target in kwargs:
                    if target in given:
                        raise ValueError(f"{name}: {target} given twice")
                    given[target] = kwargs.pop(target)
            owned = scenario.keywords()
            overrides = {k: kwargs.pop(k) for k in overridable if k in kwargs}
            if overrides:
                owned = {k: v for k, v in owned.items() if k not in ("steps", "epochs")}
                owned.update(overrides)
            clash = sorted(set(kwargs) & (set(owned) | set(STATED_KEYWORDS)))
            if clash:
                raise ValueError(f"{name}: {', '.join(clash)} given with a TrainingScenario, which "
                                 f"states them; change the scenario instead (scenario.replace(...))")
            if noise == "calibrate":
                if scenario.noise_multiplier is not None:
                    raise ValueError(f"{name} finds the noise multiplier: give a scenario with "
                                     f"noise_multiplier=None, got {scenario.noise_multiplier!r}")
            elif scenario.noise_multiplier is None:
                raise ValueError(f"{name} needs the scenario's noise_multiplier (it is None)")
            unknown = sorted(set(owned) - params)
            if unknown:
                raise ValueError(f"{name} does not take {', '.join(unknown)}: this scenario "
                                 f"({type(scenario.sampling).__name__}"
                                 f"{', a noise schedule' if 'noise_schedule' in unknown else ''}) is not "
                                 f"accounted by it")
            return fn(**owned, **given, **kwargs)

        wrapper.__wrapped_keywords__ = fn  # type: ignore[attr-defined]
        return wrapper

    return decorate
