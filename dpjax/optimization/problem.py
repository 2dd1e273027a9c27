"""The records of an optimisation: what is optimised, how, and where its checkpoints go.

:func:`dpjax.optimization.optimize_correlation` takes a parameterization (the family searched)
and three records, each checked when it is made:

* :class:`CorrelationProblem` -- what is optimised: the privacy target ``(epsilon, delta)``,
  the participation scheme (:class:`dpjax.BallsInBins` ``(batches_per_epoch)`` with the epochs,
  :class:`dpjax.BMinSepSampling` ``(min_sep, sampling_prob, num_rounds)``, or
  :class:`dpjax.RandomAllocation` ``(batches_per_epoch, selections_per_epoch)`` with the epochs), the noise-free
  objective and, for balls-in-bins, optionally the training sampler's ``dataset_size`` and
  ``batch_size`` (whose truncation the certificate pays for).
* :class:`OptimizerSettings` -- how: optimizer steps, the optax optimizer, the in-loop Monte
  Carlo estimate (samples, estimator, resampling, screening), the solver, the key, the start.
* :class:`Checkpoint` -- where the loop checkpoints, how often, and whether it resumes.

The certificate's settings are :class:`dpjax.optimization.CertifySettings`
(:mod:`dpjax.optimization.certify`), used by the separate certify step
:func:`dpjax.optimization.certify_result`.

Example::

    import dpjax
    from dpjax.optimization import (CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(16), epochs=4, target_epsilon=2.0,
                                 target_delta=1e-5)
    res = optimize_correlation(make_parameterization("blt", 64, num_buffers=2), problem,
                               OptimizerSettings(num_steps=50))
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import StrEnum
from dpjax.montecarlo.calibrate import Bisection, NewtonIllinois
from dpjax.optimization.certify import SamplerTerms, _check_key, sampler_terms
from dpjax.optimization.objectives import prefix_sum_error
from dpjax.pld.scenario import BallsInBins as BallsInBinsScheme
from dpjax.pld.scenario import BMinSepSampling
from dpjax.pld.scenario import RandomAllocation as RandomAllocationScheme

__all__ = ["CorrelationProblem", "OptimizerSettings", "Checkpoint", "Estimator", "ESTIMATORS",
           "DEFAULT_NUM_SAMPLES", "DEFAULT_SOLVER"]


class Estimator(StrEnum):
    """The in-loop Monte Carlo estimate of ``delta_hat(sigma; C)``: ``"importance"`` (the
    variance-reduced estimate of :mod:`dpjax.montecarlo.importance`) or ``"plain"``."""

    IMPORTANCE = "importance"
    PLAIN = "plain"


#: In-loop estimators and their default samples per step.
ESTIMATORS = tuple(e.value for e in Estimator)
DEFAULT_NUM_SAMPLES = {Estimator.IMPORTANCE: 1 << 11, Estimator.PLAIN: 1 << 13}
#: The in-loop solver by default.
DEFAULT_SOLVER = NewtonIllinois(xtol=1e-9)


def _optional_bool(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be None, True or False, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CorrelationProblem:
    """What :func:`~dpjax.optimization.optimize_correlation` optimises, and for which release.

    Attributes:
      sampling: the participation scheme: :class:`dpjax.BallsInBins` ``(batches_per_epoch)``
        (each example falls into one of ``b`` bins per epoch; the scheme the Monte Carlo
        accounting of Choquette-Choo et al. 2024 amplifies) or :class:`dpjax.BMinSepSampling`
        ``(min_sep, sampling_prob, num_rounds)`` (an eligible example participates with
        probability ``p`` and then sits out ``min_sep - 1`` rounds; Dong & Ganesh, "Privacy
        Amplification for BandMF via b-Min-Sep Subsampling"), or :class:`dpjax.RandomAllocation`
        ``(batches_per_epoch, selections_per_epoch)`` (each epoch, each example takes part in a
        uniformly random ``k``-subset of the ``t`` rounds, drawn afresh every epoch; Feldman &
        Shenfeld, "Privacy amplification by random allocation"; ``k <= min(t, 32)``,
        :data:`dpjax.montecarlo.allocation.MAX_SELECTIONS`).  Under b-min-sep the
        parameterization must be banded with at most ``min_sep`` bands, under random allocation
        with at most :data:`dpjax.montecarlo.allocation.MAX_BANDS` (6) bands.
      epochs: ``E``, an integer ``>= 1``, for balls-in-bins and random allocation (the matrix
        has ``n = t * E`` rounds); left out (``None``) for b-min-sep, whose record fixes
        ``n = num_rounds``.
      target_epsilon: ``> 0`` (required).
      target_delta: in ``(0, 1)`` (required).
      objective: ``(correlation, n) -> err``, the noise-free error (default
        :func:`~dpjax.optimization.prefix_sum_error`, ``|A C^-1|_F / sqrt(n)``); the loss is
        ``log(sigma*(C) err(C))``.
      dataset_size, batch_size: the training sampler, ``N`` examples in fixed batches of shape
        ``B`` (:class:`dpjax.sampling.BallsInBinsSampler` ``(N, b, E, B)``; both or neither,
        integers ``>= 1``).  The certificate is then for ``target_delta`` less the delta of
        truncating overflowing bins (:attr:`sampler`), so the released sigma holds for that
        sampler; the optimisation itself runs at ``target_delta``.  Without them the
        certificate holds for untruncated bins.  Balls-in-bins only: under b-min-sep the
        certificate holds for untruncated batches (add
        :meth:`dpjax.sampling.BMinSepSampler.truncation_delta` of a fixed batch shape yourself),
        and under random allocation for the untruncated batches of the ``k``-of-``t`` allocation
        (dpjax has no random-allocation batch sampler).

    Example::

        CorrelationProblem(sampling=dpjax.BallsInBins(128), epochs=16, target_epsilon=2.0,
                           target_delta=1e-5, dataset_size=60_000, batch_size=540)
        CorrelationProblem(sampling=dpjax.BMinSepSampling(min_sep=4, sampling_prob=0.25,
                           num_rounds=64), target_epsilon=2.0, target_delta=1e-5)
        CorrelationProblem(sampling=dpjax.RandomAllocation(16, selections_per_epoch=2), epochs=4,
                           target_epsilon=2.0, target_delta=1e-5)

    Raises:
      ValueError: naming the field: ``sampling`` not one of the three schemes, ``epochs`` not an
        integer ``>= 1`` (balls-in-bins, random allocation) or given for b-min-sep,
        ``selections_per_epoch`` above 32 (random allocation), a target missing or out of
        range, ``objective`` not callable, only one of ``dataset_size`` / ``batch_size`` (or
        either under b-min-sep or random allocation), or a ``batch_size`` that truncates too
        often (says the smallest that fits).
    """

    sampling: BallsInBinsScheme | BMinSepSampling | RandomAllocationScheme
    epochs: int | None = None
    target_epsilon: float | None = None
    target_delta: float | None = None
    objective: Callable = prefix_sum_error
    dataset_size: int | None = None
    batch_size: int | None = None

    def __post_init__(self):
        if not isinstance(self.sampling, (BallsInBinsScheme, BMinSepSampling, RandomAllocationScheme)):
            raise ValueError("sampling must be dpjax.BallsInBins(batches_per_epoch), dpjax.BMinSepSampling(min_sep, "
                             "sampling_prob, num_rounds) or dpjax.RandomAllocation(batches_per_epoch, "
                             "selections_per_epoch) (the schemes whose amplification the optimisation "
                             f"accounts), got {self.sampling!r}")
        if self.is_b_min_sep:
            if self.epochs is not None:
                raise ValueError(f"epochs does not apply to b-min-sep sampling (its rounds are BMinSepSampling's "
                                 f"num_rounds = {self.sampling.num_rounds}): leave it out, got {self.epochs!r}")
            if self.dataset_size is not None or self.batch_size is not None:
                raise ValueError("dataset_size and batch_size describe the balls-in-bins training sampler and do "
                                 "not apply to b-min-sep sampling (its certificate holds for untruncated batches; "
                                 "add dpjax.sampling.BMinSepSampler.truncation_delta yourself): leave them out")
        else:
            object.__setattr__(self, "epochs", _validate.positive_int("epochs", self.epochs))
        if self.is_random_allocation:
            from dpjax.montecarlo.allocation import MAX_SELECTIONS

            _validate.positive_int("selections_per_epoch", self.sampling.selections_per_epoch,
                                   maximum=min(self.sampling.batches_per_epoch, MAX_SELECTIONS))
            if self.dataset_size is not None or self.batch_size is not None:
                raise ValueError("dataset_size and batch_size describe the balls-in-bins training sampler and do "
                                 "not apply to random allocation (its certificate holds for the untruncated batches "
                                 "of the k-of-t allocation; dpjax has no random-allocation batch sampler): leave "
                                 "them out")
        for name in ("target_epsilon", "target_delta"):
            if getattr(self, name) is None:
                raise ValueError(f"{name} must be given ({'> 0' if name == 'target_epsilon' else 'in (0, 1)'})")
        target = _validate.PrivacyTarget(self.target_epsilon, self.target_delta)
        object.__setattr__(self, "target_epsilon", float(target.epsilon))
        object.__setattr__(self, "target_delta", float(target.delta))
        if not callable(self.objective):
            raise ValueError(f"objective must be a callable (correlation, n) -> err, got {self.objective!r}")
        terms = self.sampler
        object.__setattr__(self, "dataset_size", terms.dataset_size)
        object.__setattr__(self, "batch_size", terms.batch_size)

    @property
    def is_b_min_sep(self) -> bool:
        """Whether the scheme is :class:`dpjax.BMinSepSampling`."""
        return isinstance(self.sampling, BMinSepSampling)

    @property
    def is_random_allocation(self) -> bool:
        """Whether the scheme is :class:`dpjax.RandomAllocation` (``k`` of ``t`` rounds per epoch)."""
        return isinstance(self.sampling, RandomAllocationScheme)

    @property
    def batches_per_epoch(self) -> int | None:
        """``b`` (``t``), the scheme's batches (bins, rounds) per epoch (``None`` under b-min-sep)."""
        return None if self.is_b_min_sep else self.sampling.batches_per_epoch

    @property
    def n(self) -> int:
        """Rounds of the matrix mechanism: ``b * E`` (balls-in-bins, random allocation) or
        ``num_rounds`` (b-min-sep)."""
        return self.sampling.num_rounds if self.is_b_min_sep else self.batches_per_epoch * self.epochs

    @property
    def sampler(self) -> SamplerTerms:
        """The training sampler's part of the budget (:func:`~dpjax.optimization.certify.sampler_terms`):
        ``truncation_delta`` and the ``certify_delta`` a certificate must meet (under b-min-sep
        and random allocation no sampler is given: nothing is subtracted)."""
        if self.is_b_min_sep or self.is_random_allocation:
            return SamplerTerms(None, None, 0.0, self.target_delta)
        return sampler_terms(self.dataset_size, self.batch_size, self.batches_per_epoch, self.target_epsilon,
                             self.target_delta)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """How :func:`~dpjax.optimization.optimize_correlation` optimises.

    Attributes:
      num_steps: optimizer steps, an integer ``>= 0`` (default 300).
      optimizer: any optax ``GradientTransformation`` (default ``None``: Adam, learning rate
        0.05, on the log RMSE, :func:`~dpjax.optimization.default_optimizer`).
      num_samples: Monte Carlo samples per step, an integer ``>= 1`` (an estimate; default
        ``None``: :data:`DEFAULT_NUM_SAMPLES` of the ``estimator``, 2^11 importance, 2^13 plain).
      estimator: ``"importance"`` (default: the variance-reduced estimate of
        :mod:`dpjax.montecarlo.importance`, fresh draws every step, full passes) or ``"plain"``
        (the plain estimate, screened and resampled every ``resample_every`` steps).
      resample_every: steps that share one Monte Carlo sample, an integer ``>= 1`` (default 10;
        ``1``: fresh draws every step as in Algorithm 2).  Used by the screened NewtonIllinois
        path of the plain estimator (whenever ``num_samples * b <= 2^24``): the sample of steps
        ``p R .. p R + R - 1`` is drawn from ``fold_in(key, p)``.  Sound for the optimisation:
        each step's sigma and gradient are those of the exact estimate on a valid sample, over
        300 steps the optimiser still sees ``300 / R`` independent samples (Choquette-Choo et
        al. 2024, §5.1.4, Fig. 5 find ~2^9 fresh samples per step sufficient), and the result
        is certified on independent draws.
      num_candidates: samples per direction kept by the screen, an integer ``>= 1`` (default
        :func:`dpjax.calibration.screened.default_num_candidates`).
      precompute: materialise ``W`` per step (``None``: when ``num_samples * b <= 2^24``);
        ``False`` forces the chunked, unscreened path (bounded memory at any ``num_samples``).
      solver: :class:`~dpjax.calibration.NewtonIllinois` (default, ``xtol=1e-9``) or
        :class:`~dpjax.calibration.Bisection` (Algorithm 2 as written).
      key: int seed in ``[0, 2**32 - 1]`` or JAX key of the optimisation's draws (default 0;
        step ``k`` uses ``fold_in(key, k)``, or ``fold_in(key, k // resample_every)``).
      init_params: starting parameters (default ``None``: ``parameterization.init()``, closed
        form); checked against the parameterization when the run starts.

    Under :class:`dpjax.BMinSepSampling` and :class:`dpjax.RandomAllocation` each step calibrates
    by bisection on the plain estimate of fresh draws (``estimator`` is read as ``"plain"``):
    ``resample_every``, ``num_candidates``, ``precompute`` and ``solver`` do not apply, and
    :func:`~dpjax.optimization.optimize_correlation` refuses them with a ``ValueError`` when they
    are set away from their defaults.

    Example::

        OptimizerSettings(num_steps=300, optimizer=optax.adam(0.05), key=7)

    Raises:
      ValueError: naming the field: ``num_steps`` below 0, ``num_samples`` /
        ``resample_every`` / ``num_candidates`` below 1 (or not integers), an unknown
        ``estimator``, ``precompute`` not ``None`` / ``True`` / ``False``, a ``solver`` other
        than ``NewtonIllinois`` / ``Bisection``, an ``optimizer`` without ``init`` / ``update``,
        a ``key`` that is neither a seed nor a JAX key.
    """

    num_steps: int = 300
    optimizer: Any = None
    num_samples: int | None = None
    estimator: str = Estimator.IMPORTANCE
    resample_every: int = 10
    num_candidates: int | None = None
    precompute: bool | None = None
    solver: Any = DEFAULT_SOLVER
    key: Any = 0
    init_params: dict | None = None

    def __post_init__(self):
        def set_(name, value):  # a normalised field of this frozen record
            object.__setattr__(self, name, value)

        set_("num_steps", _validate.positive_int("num_steps", self.num_steps, minimum=0))
        if self.optimizer is not None and not (hasattr(self.optimizer, "init") and hasattr(self.optimizer, "update")):
            raise ValueError(f"optimizer must be an optax GradientTransformation, got {self.optimizer!r}")
        if self.num_samples is not None:
            set_("num_samples", _validate.positive_int("num_samples", self.num_samples))
        set_("estimator", Estimator.parse(self.estimator, "estimator"))
        set_("resample_every", _validate.positive_int("resample_every", self.resample_every))
        if self.num_candidates is not None:
            set_("num_candidates", _validate.positive_int("num_candidates", self.num_candidates))
        _optional_bool("precompute", self.precompute)
        if not isinstance(self.solver, (NewtonIllinois, Bisection)):
            raise ValueError(f"solver must be NewtonIllinois(...) or Bisection(...), got {self.solver!r}")
        _check_key("key", self.key)

    @property
    def samples_per_step(self) -> int:
        """``num_samples``, or the estimator's default (:data:`DEFAULT_NUM_SAMPLES`)."""
        return DEFAULT_NUM_SAMPLES[self.estimator] if self.num_samples is None else self.num_samples


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where :func:`~dpjax.optimization.optimize_correlation` checkpoints.

    The checkpoint is strict JSON (written atomically) holding the parameters, the optimizer
    state, the step, the warm-start sigma and the history, with the screen state in a binary
    sidecar ``<path>.screen-<step>.npz``; a killed run resumed from it gives the identical result.

    Attributes:
      path: the checkpoint file (``str`` or ``os.PathLike``).
      every: write it every ``every`` steps (an integer ``>= 1``, default 25) and at the end.
      resume: continue from ``path`` when it exists (the same configuration required; a
        different one is refused with a ``ValueError``).

    Example::

        Checkpoint("run.checkpoint.json", every=10, resume=True)

    Raises:
      ValueError: naming the field: ``path`` not a path, ``every`` below 1, ``resume`` not a bool.
    """

    path: str | os.PathLike
    every: int = 25
    resume: bool = False

    def __post_init__(self):
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise ValueError(f"path must be a non-empty str or os.PathLike (the checkpoint file), got {self.path!r}")
        object.__setattr__(self, "every", _validate.positive_int("every", self.every))
        if not isinstance(self.resume, (bool, np.bool_)):
            raise ValueError(f"resume must be True or False, got {self.resume!r}")
