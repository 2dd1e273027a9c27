"""Group-privacy arguments of DP-SGD: the sampling scheme, its adjacency, and ONE validator.

Two batching schemes, each with its own neighbouring relation (Ganesh (2024), "Tight
Group-Level DP Guarantees for DP-SGD with Sampling via Mixture of Gaussians Mechanisms"):

* :attr:`Sampling.POISSON` -- every example joins each batch independently with probability
  ``q``; datasets are neighbours when they differ by adding or removing one example
  (add/remove-k for a group of k).  A group member moves the clipped sum by at most 1, so the
  group's mixture has sensitivities ``j = 0..k``, weights ``Binomial(k, q)``, noise ``sigma``
  (Ganesh (2024), Thm 3.1).
* :attr:`Sampling.FIXED_BATCH` -- each batch is ``B`` examples drawn without replacement from
  ``N``; datasets are neighbours when one example is replaced by another (replace-one;
  replace-k for a group).  Replacing one example moves the clipped sum by up to 2, so the
  mixture has sensitivities ``2j``, weights ``Hypergeometric(N, k, B)`` and standard deviation
  ``sigma``, the run's own noise multiplier (Ganesh (2024), Thm 3.3): nothing doubles the noise.
  (Ganesh (2024), Fig. 2 *plots* fixed-batch runs against half their noise multiplier, "a
  doubled noise multiplier", to share an axis with Poisson; that is a plotting choice only.)

:func:`validate_group_spec` is the single definition of what group arguments are valid; the
public entry points (:mod:`dpjax.group`, the group baselines, calibration) and
:class:`dpjax.pld.mog.GroupSubsampledGaussian` all call it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import Adjacency, StrEnum

__all__ = ["Sampling", "GroupSpec", "validate_group_spec", "SAMPLINGS"]


class Sampling(StrEnum):
    """How DP-SGD forms its batches (a :class:`~dpjax._base.enums.StrEnum`: ``"poisson"`` and
    ``"fixed_batch"`` still work; :meth:`~dpjax._base.enums.StrEnum.parse` names ``sampling`` and the
    valid values in its error)."""

    POISSON = "poisson"
    FIXED_BATCH = "fixed_batch"

    @property
    def adjacency(self) -> Adjacency:
        """The neighbouring relation the guarantee is stated for (per example; a group of k
        is add/remove-k resp. replace-k): ``ADD_OR_REMOVE`` (Poisson) or ``REPLACE``."""
        return Adjacency.ADD_OR_REMOVE if self is Sampling.POISSON else Adjacency.REPLACE

    @property
    def sensitivity(self) -> float:
        """Largest change of the clipped gradient sum (in clip norms) from one example under
        :attr:`adjacency`: 1 for add/remove, 2 for replace-one."""
        return 1.0 if self is Sampling.POISSON else 2.0


SAMPLINGS = tuple(s.value for s in Sampling)


class GroupSpec(NamedTuple):
    """Validated group-privacy arguments.

    ``sampling_prob`` is the per-step probability that a given example is in the batch: ``q``
    (Poisson) or ``batch_size / dataset_size`` (fixed batch; filled in by the validator).
    ``dataset_size`` and ``batch_size`` are None for Poisson sampling.  Scalars are Python
    numbers; a ``sampling_prob`` given as an array stays a float64 array.
    """

    group_size: int
    sampling: Sampling
    sampling_prob: Any
    dataset_size: int | None
    batch_size: int | None

    @property
    def adjacency(self) -> Adjacency:
        """``ADD_OR_REMOVE`` or ``REPLACE`` (of ``group_size`` examples together)."""
        return self.sampling.adjacency


def _integers(name: str, value: Any, *, allow_array: bool) -> Any:
    """Integer(s) >= 1: a Python int, or (``allow_array``) a float64 array of integral values."""
    if not allow_array or np.ndim(value) == 0:
        return _validate.positive_int(name, value)
    arr = _validate.positive(name, value)
    if (arr != np.floor(arr)).any():
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return arr


def _show(integers) -> str:
    """Validated integer(s) for messages: ``10``, not ``10.0`` or ``array([10.])``."""
    arr = np.asarray(integers)
    return str(int(arr)) if arr.ndim == 0 else str(arr.astype(np.int64).tolist())


def validate_group_spec(
    sampling_prob,
    *,
    group_size=1,
    sampling="poisson",
    dataset_size=None,
    batch_size=None,
    allow_arrays: bool = False,
) -> GroupSpec:
    """The one boundary check of group arguments (``ValueError`` naming the argument and range).

    * ``sampling``: ``"poisson"`` or ``"fixed_batch"`` (or a :class:`Sampling`);
    * ``group_size``: integer >= 1;
    * Poisson: ``sampling_prob`` in (0, 1] (required); ``dataset_size`` / ``batch_size`` must
      be None (they only describe fixed batches);
    * fixed batch: ``dataset_size`` and ``batch_size`` integers with
      ``1 <= group_size <= batch_size <= dataset_size``; ``sampling_prob`` None or equal to
      ``batch_size / dataset_size`` (relative 1e-9).

    ``allow_arrays`` (for stacked mechanism fields and vectorized calibration) accepts arrays
    for the numeric arguments and checks them elementwise.  Returns a :class:`GroupSpec`.
    """
    sampling = Sampling.parse(sampling)
    k = _integers("group_size", group_size, allow_array=allow_arrays)
    if sampling is Sampling.POISSON:
        if dataset_size is not None or batch_size is not None:
            raise ValueError("dataset_size and batch_size are only for sampling='fixed_batch' "
                             "(Poisson sampling takes sampling_prob in (0, 1])")
        if sampling_prob is None:
            raise ValueError("sampling_prob is required for sampling='poisson' (a number in (0, 1])")
        q = _validate.probability_open_closed("sampling_prob", sampling_prob)
        q = float(q) if q.ndim == 0 else q
        return GroupSpec(k, sampling, q, None, None)
    if dataset_size is None:
        raise ValueError("dataset_size is required for sampling='fixed_batch' (an integer >= 1)")
    if batch_size is None:
        raise ValueError("batch_size is required for sampling='fixed_batch' (an integer in [group_size, dataset_size])")
    n = _integers("dataset_size", dataset_size, allow_array=allow_arrays)
    b = _integers("batch_size", batch_size, allow_array=allow_arrays)
    if np.any(np.asarray(b) > np.asarray(n)):
        raise ValueError(f"batch_size must be <= dataset_size={_show(n)}, got {_show(b)}")
    if np.any(np.asarray(k) > np.asarray(b)):
        raise ValueError(f"group_size must be <= batch_size={_show(b)}, got {_show(k)}")
    ratio = np.asarray(b, np.float64) / np.asarray(n, np.float64)
    if sampling_prob is not None:
        q = _validate.probability_open_closed("sampling_prob", sampling_prob)
        # 1e-9 relative: B / N computed in another order differs by a few ulps, a different
        # sampling rate by far more.
        if not np.allclose(q, ratio, rtol=1e-9, atol=0.0):
            raise ValueError(f"sampling_prob must be None or equal batch_size/dataset_size={ratio!r} "
                             f"for sampling='fixed_batch', got {sampling_prob!r}")
    q = float(ratio) if ratio.ndim == 0 else ratio
    return GroupSpec(k, sampling, q, n, b)
