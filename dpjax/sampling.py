"""Batch schedules that realise what the accountants assume (docs/design.md §7).

Two samplers with one interface, both yielding fixed-shape ``(indices, mask)`` pairs so that a
jit-compiled training step sees the same shapes at every step:

* :class:`BallsInBinsSampler` -- balls-in-bins batching (Choquette-Choo, Ganesh, Haque, Steinke
  & Thakurta, "Near exact privacy amplification for matrix mechanisms", Def. 3.1 and the
  practical variant of §5.2.1): every example falls into one of ``b`` bins uniformly at random,
  once; bin ``i`` is the batch of rounds ``i, i + b, i + 2b, ...`` (the same bin every epoch).
  It is implemented as in §5.2.1: shuffle once, draw the bin sizes from
  ``Multinomial(N, (1/b, ..., 1/b))``, cut the shuffled order into consecutive runs of those
  sizes (a uniformly random partition with multinomial sizes is exactly i.i.d. uniform bins).
  :meth:`BallsInBinsSampler.accountant` hands the same ``(b, E)`` to
  :class:`dpjax.montecarlo.BallsInBins`, so the batching that is trained and the batching that
  is accounted cannot drift apart.
* :class:`BMinSepSampler` -- b-min-sep sampling (Dong & Ganesh, "Privacy Amplification for
  BandMF via b-Min-Sep Subsampling"): an example that participated sits out the next ``b - 1``
  rounds and is otherwise chosen with probability ``p`` at each round, from the stationary
  start; :meth:`BMinSepSampler.accountant` hands the same ``(p, b, n)`` to
  :class:`dpjax.montecarlo.BMinSep`.
* :class:`PoissonSampler` -- Poisson sampling for DP-SGD (every example independently with
  probability ``q`` at every step), accounted by :func:`dpjax.dpsgd_epsilon` /
  :meth:`PoissonSampler.epsilon`.

Fixed shape: a batch is ``indices`` (``(batch_size,)`` int32) and ``mask`` (``(batch_size,)``
bool).  Short batches are padded with index 0 and ``mask = False``; long ones are truncated to
their first ``batch_size`` examples.  **The training step must zero the clipped gradients of
masked entries and normalise the noisy sum by the fixed ``1 / batch_size``** (not by the
number of real examples, which would depend on the data set size and leak through the
normalisation); both are post-processing of the noisy sum of clipped gradients that the
accountants analyse.

Truncation and the guarantee.  Choquette-Choo et al. (§5.2.1) argue that a truncated example
is an example with gradient 0.  Under add/remove adjacency, however, the added example can
push *another* example out of a full batch, a change of the sum by two clipped gradients.  We do
not rely on that argument: the truncating mechanism ``M'`` equals the untruncated ``M`` except
on the event that some batch overflows, so for every output set ``S``,
``P[M'(D) in S] <= e^eps P[M'(D') in S] + delta + (1 + e^eps) p`` where ``p`` bounds the
overflow probability on both neighbours (``N`` or ``N + 1`` examples).
:meth:`BallsInBinsSampler.overflow_probability` returns ``p`` (union bound over the bins,
exact binomial tails) and :meth:`~BallsInBinsSampler.truncation_delta` the term
``(1 + e^eps) p`` to add to the accounted delta.  Pick ``batch_size`` a few standard
deviations above ``N / b`` so that this term is negligible (it is printed by the example).

Memory: ``O(N)`` -- one int32 permutation of the examples (4 bytes per example) and ``b``
offsets; batches are views materialised one at a time.  Reproducible: everything derives from
``seed`` (NumPy ``PCG64``); the same seed gives the same batches.

Example::

    sampler = BallsInBinsSampler(num_examples=60_000, batches_per_epoch=100, epochs=5,
                                 batch_size=760, seed=0)
    acc = sampler.accountant(dpjax.matrices.BLT(...))        # BallsInBins(C, b=100, E=5)
    for step, (indices, mask) in enumerate(sampler):          # 500 steps
        params, state = train_step(params, state, x[indices], y[indices], mask)
    sampler.truncation_rate()        # expected fraction of example-visits dropped
    sampler.truncation_delta(eps)    # add to the accounted delta
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator

import numpy as np
import scipy.stats

from dpjax._base import validate as _validate
from dpjax._base.names import epochs_to_steps

__all__ = ["BallsInBinsSampler", "BMinSepSampler", "PoissonSampler", "balls_in_bins_truncation_delta"]


def _check_seed(seed) -> int:
    return _validate.prng_seed("seed", seed, key_allowed=False)


def _binomial_excess_mean(n: int, p: float, cap: int) -> float:
    """``E[(K - cap)_+]`` for ``K ~ Binomial(n, p)``, exactly (sum over the tail)."""
    # E[(K-c)+] = E[K] - c + E[(c-K)+]; the second term is a finite sum over k < c.
    k = np.arange(0, min(cap, n) + 1)
    below = float(np.sum((cap - k) * scipy.stats.binom.pmf(k, n, p)))
    return max(n * p - cap + below, 0.0)


def _log_binomial_sf(k: int, n: int, p: float) -> float:
    """An upper bound on ``log P(K > k)``, ``K ~ Binomial(n, p)``, that does not underflow.

    ``scipy.stats.binom.sf`` (and ``logsf``) underflow to 0 (``-inf``) below ~1e-308, where a
    truncation delta multiplied by ``1 + e^eps`` still matters.  There the tail is bounded by a
    geometric series: the ratio ``pmf(j + 1) / pmf(j) = (n - j) p / ((j + 1)(1 - p))`` decreases
    in ``j``, so ``P(K > k) <= pmf(k + 1) / (1 - r)`` with ``r`` the ratio at ``j = k + 1``.
    """
    if k >= n:
        return -math.inf
    sf = float(scipy.stats.binom.sf(k, n, p))
    if sf > 1e-280:
        return math.log(sf)
    r = (n - k - 1) * p / ((k + 2) * (1.0 - p)) if p < 1.0 else math.inf
    if not r < 1.0:  # not in the upper tail: the direct value is exact enough
        return math.log(sf) if sf > 0 else -math.inf
    # 1e-9: rounding allowance of logpmf (relative ~1e-13 at these magnitudes).
    return float(scipy.stats.binom.logpmf(k + 1, n, p)) - math.log1p(-r) + 1e-9


def _truncation_delta(log_overflow: float, eps: float) -> float:
    """``min(1, (1 + e^eps) * overflow)`` from ``log overflow``, in log space (no cap on eps)."""
    return min(1.0, math.exp(min(0.0, log_overflow + float(np.logaddexp(0.0, eps)))))


def _balls_in_bins_log_overflow(num_examples: int, batches_per_epoch: int, batch_size: int) -> float:
    """``log`` of the union bound on ``P(some bin holds more than B examples)`` with ``N + 1``
    examples (``N + 1`` covers both add/remove neighbours: the tail is increasing in ``N``)."""
    n = int(num_examples) + 1
    b = int(batches_per_epoch)
    return min(0.0, math.log(b) + _log_binomial_sf(int(batch_size), n, 1.0 / b))


def balls_in_bins_truncation_delta(num_examples, batches_per_epoch, batch_size, epsilon) -> float:
    """The delta that truncating balls-in-bins batches to ``batch_size`` adds at ``epsilon``.

    ``(1 + e^eps) p`` with ``p`` the union bound over the ``b`` bins on a bin of ``N + 1``
    examples holding more than ``B`` (exact binomial tails; module docstring): what
    :meth:`BallsInBinsSampler.truncation_delta` returns for a sampler of these sizes, without
    building its schedule (no ``O(N)`` shuffle).  The number of epochs does not enter: the bins
    are drawn once.  A run accounted at ``(eps, delta)`` for the untruncated batches is
    ``(eps, delta + this)``-DP with truncation.

    Args:
      num_examples: ``N``, an integer >= 1.
      batches_per_epoch: ``b``, an integer >= 1.
      batch_size: ``B``, the fixed batch shape, an integer >= 1.
      epsilon: >= 0.
    """
    n = _validate.positive_int("num_examples", num_examples)
    b = _validate.positive_int("batches_per_epoch", batches_per_epoch)
    bs = _validate.positive_int("batch_size", batch_size)
    eps = float(_validate.nonnegative("epsilon", epsilon))
    return _truncation_delta(_balls_in_bins_log_overflow(n, b, bs), eps)


def _num_examples(value) -> int:
    """A dataset size the samplers can index with int32."""
    n = _validate.positive_int("num_examples", value)
    if n >= 2**31:
        raise ValueError(f"num_examples must be < 2**31 (int32 indices), got {n}")
    return n

@dataclasses.dataclass(frozen=True)
class BallsInBinsSampler:
    """Balls-in-bins batch schedule (Choquette-Choo et al. 2024, Def. 3.1 and §5.2.1).

    Args:
      num_examples: ``N``, data set size (indices are ``0..N-1``, int32, so ``N < 2^31``).
      batches_per_epoch: ``b``, number of bins; round ``t`` uses bin ``t mod b``.
      epochs: ``E``; ``num_steps = b * E``.
      batch_size: ``B``, the fixed (physical) batch shape; bins are padded or truncated to it.
        The expected bin size is ``N / b``.
      seed: an integer in ``[0, 2**32 - 1]``; the whole schedule is a function of it.

    Iterating yields ``num_steps`` pairs ``(indices, mask)`` of shape ``(B,)`` (int32, bool),
    epoch after epoch; :meth:`batch` gives step ``t`` directly.  Attributes ``bin_sizes``
    (``(b,)`` int64, the multinomial draw) and ``order`` (``(N,)`` int32, the one shuffle) are
    computed once at construction.
    """

    num_examples: int
    batches_per_epoch: int
    epochs: int
    batch_size: int
    seed: int = 0

    def __post_init__(self):
        n = _num_examples(self.num_examples)
        b = _validate.positive_int("batches_per_epoch", self.batches_per_epoch)
        e = _validate.positive_int("epochs", self.epochs)
        bs = _validate.positive_int("batch_size", self.batch_size)
        s = _check_seed(self.seed)
        for name, v in (("num_examples", n), ("batches_per_epoch", b), ("epochs", e), ("batch_size", bs),
                        ("seed", s)):
            object.__setattr__(self, name, v)
        rng = np.random.Generator(np.random.PCG64(s))
        # One shuffle (in place on an int32 array: 4 bytes per example, no int64 temporary),
        # then multinomial bin sizes: a uniformly random ordered partition with multinomial
        # sizes has the law of i.i.d. uniform bin assignments.
        order = np.arange(n, dtype=np.int32)
        rng.shuffle(order)
        sizes = rng.multinomial(n, np.full(b, 1.0 / b))
        offsets = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        order.setflags(write=False)
        sizes.setflags(write=False)
        offsets.setflags(write=False)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "bin_sizes", sizes)
        object.__setattr__(self, "_offsets", offsets)

    # ------------------------------------------------------------------ schedule
    @property
    def num_steps(self) -> int:
        """``b * E``, the number of training steps (rounds)."""
        return self.batches_per_epoch * self.epochs

    def bin(self, i: int) -> np.ndarray:
        """All examples of bin ``i`` (variable length, before padding/truncation; a read-only view)."""
        i = int(i)
        if not 0 <= i < self.batches_per_epoch:
            raise ValueError(f"bin index must be in [0, {self.batches_per_epoch}), got {i}")
        return self.order[self._offsets[i]:self._offsets[i + 1]]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Fixed-shape ``(indices, mask)`` of step ``step`` in ``[0, num_steps)``: bin ``step mod b``."""
        step = int(step)
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step must be in [0, {self.num_steps}), got {step}")
        members = self.bin(step % self.batches_per_epoch)[: self.batch_size]
        indices = np.zeros(self.batch_size, dtype=np.int32)
        mask = np.zeros(self.batch_size, dtype=bool)
        indices[: members.size] = members
        mask[: members.size] = True
        return indices, mask

    def epoch(self, e: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The ``b`` batches of epoch ``e`` (identical across epochs: balls-in-bins reuses the bins)."""
        e = int(e)
        if not 0 <= e < self.epochs:
            raise ValueError(f"epoch must be in [0, {self.epochs}), got {e}")
        for i in range(self.batches_per_epoch):
            yield self.batch(e * self.batches_per_epoch + i)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for t in range(self.num_steps):
            yield self.batch(t)

    def __len__(self) -> int:
        return self.num_steps

    # ------------------------------------------------------------------ accounting
    def accountant(self, correlation):
        """:class:`dpjax.montecarlo.BallsInBins` for ``correlation`` with this schedule's ``b`` and ``E``.

        ``correlation`` is anything ``BallsInBins`` accepts (``(n, n)`` dense, ``Toeplitz``,
        ``BLT``, a Toeplitz column); ``n = b E`` rounds.  Remember to add
        :meth:`truncation_delta` to the delta it reports.
        """
        from dpjax.montecarlo import BallsInBins  # montecarlo pulls in the JAX estimators

        return BallsInBins(correlation, self.batches_per_epoch, self.epochs)

    def truncated_fraction(self) -> float:
        """Realised fraction of examples dropped by truncation in this draw (same every epoch)."""
        return float(np.maximum(self.bin_sizes - self.batch_size, 0).sum() / self.num_examples)

    def padded_fraction(self) -> float:
        """Realised fraction of padded (masked) slots over all batches."""
        return float(np.maximum(self.batch_size - self.bin_sizes, 0).sum() / (self.batch_size * self.batches_per_epoch))

    def truncation_rate(self) -> float:
        """Expected fraction of examples dropped by truncation, ``E[(K - B)_+] / (N / b)``, ``K ~ Bin(N, 1/b)``."""
        n, b = self.num_examples, self.batches_per_epoch
        return _binomial_excess_mean(n, 1.0 / b, self.batch_size) / (n / b)

    def overflow_probability(self, *, num_examples: int | None = None) -> float:
        """Upper bound on ``P(some bin holds more than B examples)`` for ``N + 1`` examples (union bound).

        ``N + 1`` covers both add/remove neighbours (the tail is increasing in ``N``).
        """
        return min(1.0, math.exp(self._log_overflow_probability(num_examples)))

    def _log_overflow_probability(self, num_examples: int | None = None) -> float:
        n = self.num_examples if num_examples is None else int(num_examples)
        return _balls_in_bins_log_overflow(n, self.batches_per_epoch, self.batch_size)

    def truncation_delta(self, epsilon) -> float:
        """``(1 + e^eps) * overflow_probability()``: add to the accounted delta (module docstring).

        Computed in log space: the overflow probability may be far below the smallest float
        while ``(1 + e^eps)`` times it is not."""
        eps = float(_validate.nonnegative("epsilon", epsilon))
        return _truncation_delta(self._log_overflow_probability(), eps)


def _fixed_shape(members: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, mask)`` of shape ``(batch_size,)``: the first ``batch_size`` members, padded."""
    members = members[:batch_size]
    indices = np.zeros(batch_size, dtype=np.int32)
    mask = np.zeros(batch_size, dtype=bool)
    indices[: members.size] = members
    mask[: members.size] = True
    return indices, mask


class _BinomialBatches:
    """What the schedules whose every batch is ``Binomial(N, rate)`` share (Poisson sampling;
    b-min-sep from its stationary start): iteration over the fixed-shape batches and the
    truncation terms.  A subclass has ``num_examples``, ``steps``, ``batch_size``, ``batch(step)``
    and ``_rate``, the probability that a given example is in a given batch."""

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for t in range(self.steps):
            yield self.batch(t)

    def __len__(self) -> int:
        return self.steps

    def truncation_rate(self) -> float:
        """Expected fraction of sampled examples dropped, ``E[(K - B)_+] / (q N)``, ``K ~ Bin(N, q)``."""
        q = self._rate
        return _binomial_excess_mean(self.num_examples, q, self.batch_size) / (self.num_examples * q)

    def overflow_probability(self) -> float:
        """Upper bound on ``P(some batch exceeds B)`` with ``N + 1`` examples: the union over the
        steps of ``P(Binomial(N + 1, q) > B)`` (``N + 1`` covers both add/remove neighbours)."""
        return min(1.0, math.exp(self._log_overflow_probability()))

    def _log_overflow_probability(self) -> float:
        return min(0.0, math.log(self.steps) + _log_binomial_sf(self.batch_size, self.num_examples + 1, self._rate))

    def truncation_delta(self, epsilon) -> float:
        """``(1 + e^eps) * overflow_probability()``: add to the accounted delta (in log space)."""
        eps = float(_validate.nonnegative("epsilon", epsilon))
        return _truncation_delta(self._log_overflow_probability(), eps)


@dataclasses.dataclass(frozen=True)
class PoissonSampler(_BinomialBatches):
    """Poisson-sampled batches for DP-SGD: each example independently with probability ``sampling_prob``.

    Args:
      num_examples: ``N``.
      sampling_prob: ``q`` in ``(0, 1]``; expected batch ``q N``.
      steps: number of steps ``T``.
      batch_size: ``B``, fixed shape (pad / truncate, as :class:`BallsInBinsSampler`).
      seed: an integer in ``[0, 2**32 - 1]``; step ``t`` uses ``PCG64([seed, t])`` (random access, streaming).

    Step ``t``: ``K ~ Binomial(N, q)``, then ``K`` distinct examples uniformly at random (the law
    of independent inclusions).  Memory ``O(B)`` per step beyond NumPy's sampler (at most
    ``O(N)`` transiently).  Account with :meth:`epsilon` (= ``dpjax.dpsgd_epsilon(sigma, q,
    T, delta)``) plus :meth:`truncation_delta`.
    """

    num_examples: int
    sampling_prob: float
    steps: int
    batch_size: int
    seed: int = 0

    def __post_init__(self):
        n = _num_examples(self.num_examples)
        q = float(_validate.probability_open_closed("sampling_prob", self.sampling_prob))
        object.__setattr__(self, "num_examples", n)
        object.__setattr__(self, "sampling_prob", q)
        object.__setattr__(self, "steps", _validate.positive_int("steps", self.steps))
        object.__setattr__(self, "batch_size", _validate.positive_int("batch_size", self.batch_size))
        object.__setattr__(self, "seed", _check_seed(self.seed))

    @classmethod
    def from_epochs(cls, num_examples: int, sampling_prob: float, epochs: float, batch_size: int,
                    seed: int = 0) -> "PoissonSampler":
        """The sampler of ``epochs`` epochs: ``steps`` by dpjax's one epochs rule
        (:func:`dpjax._base.names.epochs_to_steps`: ``epochs / sampling_prob`` rounded up, never fewer
        steps than the epochs take), the count every accounting entry point uses for ``epochs=``."""
        return cls(num_examples, sampling_prob, epochs_to_steps(epochs, sampling_prob), batch_size, seed)

    @property
    def num_steps(self) -> int:
        return self.steps

    def sample_size(self, step: int) -> int:
        """The untruncated batch size of step ``step`` (``Binomial(N, q)``)."""
        rng = np.random.Generator(np.random.PCG64([self.seed, int(step)]))
        return int(rng.binomial(self.num_examples, self.sampling_prob))

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        step = int(step)
        if not 0 <= step < self.steps:
            raise ValueError(f"step must be in [0, {self.steps}), got {step}")
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        k = int(rng.binomial(self.num_examples, self.sampling_prob))
        members = rng.choice(self.num_examples, size=k, replace=False).astype(np.int32)
        return _fixed_shape(members, self.batch_size)

    @property
    def _rate(self) -> float:
        return self.sampling_prob

    def epsilon(self, noise_multiplier, target_delta) -> float:
        """Certified DP-SGD epsilon of this schedule, ``dpjax.dpsgd_epsilon(sigma, q, T, delta)``."""
        from dpjax.pld import dpsgd_epsilon

        return dpsgd_epsilon(noise_multiplier, self.sampling_prob, self.steps, target_delta)


@dataclasses.dataclass(frozen=True)
class BMinSepSampler(_BinomialBatches):
    """b-min-sep batch schedule (Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep
    Subsampling"; jax_privacy's ``BMinSepSampling(sampling_prob, iterations, min_sep,
    warm_start=True)``).

    Args:
      num_examples: ``N`` (int32 indices, ``N < 2^31``).
      sampling_prob: ``p`` in ``(0, 1]``: the probability that an *eligible* example participates
        in a round.
      min_sep: ``b >= 1``: an example that participates in round ``t`` sits out rounds
        ``t + 1 .. t + b - 1`` (``b = 1`` is Poisson sampling).
      steps: ``n``, the number of rounds.
      batch_size: ``B``, the fixed batch shape (pad / truncate, as :class:`BallsInBinsSampler`).
      seed: an integer in ``[0, 2**32 - 1]``; the whole schedule is a function of it.

    Every example runs its own chain, independently of the others, from the chain's stationary
    law (the warm start of :class:`dpjax.montecarlo.BMinSep`): eligible at round 0 with
    probability ``1 / (1 + (b - 1) p)``, else sitting out ``d`` more rounds (``d = 1 .. b - 1``)
    with probability ``p / (1 + (b - 1) p)`` each.  So the batch of every round has the law
    ``Binomial(N, q)``, ``q = p / (1 + (b - 1) p)`` (the stationary participation rate).  The
    schedule is drawn at construction, one vectorised step per round (``O(N n)`` time, the batches
    ``O(q N n)`` int32 memory); the order of a batch is random, so truncation drops a uniformly
    random subset.  Account with :meth:`accountant` and add :meth:`truncation_delta` (the module
    docstring's argument: truncation changes the mechanism only on the event that some batch
    overflows).

    Example::

        sampler = BMinSepSampler(num_examples=10_000, sampling_prob=0.05, min_sep=4, steps=200,
                                 batch_size=620, seed=0)
        acc = sampler.accountant(np.array([1.0, 0.5]))      # BMinSep(C, p=0.05, b=4, n=200)
        for indices, mask in sampler:
            ...
        sampler.truncation_delta(2.0)   # add to the accounted delta
    """

    num_examples: int
    sampling_prob: float
    min_sep: int
    steps: int
    batch_size: int
    seed: int = 0

    def __post_init__(self):
        n = _num_examples(self.num_examples)
        p = float(_validate.probability_open_closed("sampling_prob", self.sampling_prob))
        b = _validate.positive_int("min_sep", self.min_sep)
        t = _validate.positive_int("steps", self.steps)
        bs = _validate.positive_int("batch_size", self.batch_size)
        s = _check_seed(self.seed)
        for name, v in (("num_examples", n), ("sampling_prob", p), ("min_sep", b), ("steps", t),
                        ("batch_size", bs), ("seed", s)):
            object.__setattr__(self, name, v)
        rng = np.random.Generator(np.random.PCG64(s))
        # Stationary start: the number of rounds still sat out (0 = eligible).
        pi0 = 1.0 / (1.0 + (b - 1) * p)
        weights = np.concatenate([[pi0], np.full(b - 1, p * pi0)])
        wait = rng.choice(b, size=n, p=weights / weights.sum()).astype(np.int32)
        batches = []
        for _ in range(t):
            part = (wait == 0) & (rng.random(n) < p)
            members = np.flatnonzero(part).astype(np.int32)
            rng.shuffle(members)
            members.setflags(write=False)
            batches.append(members)
            wait = np.where(part, b - 1, np.maximum(wait - 1, 0)).astype(np.int32)
        object.__setattr__(self, "_batches", tuple(batches))

    @property
    def num_steps(self) -> int:
        return self.steps

    @property
    def participation_rate(self) -> float:
        """``q = p / (1 + (b - 1) p)``: the probability that a given example is in a given batch."""
        return self.sampling_prob / (1.0 + (self.min_sep - 1) * self.sampling_prob)

    def members(self, step: int) -> np.ndarray:
        """All examples of round ``step`` (variable length, in random order, before truncation)."""
        step = int(step)
        if not 0 <= step < self.steps:
            raise ValueError(f"step must be in [0, {self.steps}), got {step}")
        return self._batches[step]

    def sample_size(self, step: int) -> int:
        """The untruncated batch size of round ``step``."""
        return int(self.members(step).size)

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Fixed-shape ``(indices, mask)`` of round ``step``: its members, padded or truncated to ``B``."""
        return _fixed_shape(self.members(step), self.batch_size)

    @property
    def _rate(self) -> float:
        return self.participation_rate

    def accountant(self, correlation):
        """:class:`dpjax.montecarlo.BMinSep` for ``correlation`` (at most ``min_sep`` bands) with this
        schedule's ``p``, ``b`` and ``n`` and the warm start.  Add :meth:`truncation_delta` to the
        delta it reports."""
        from dpjax.montecarlo import BMinSep  # montecarlo pulls in the JAX estimators

        return BMinSep(correlation, self.sampling_prob, self.min_sep, self.steps, warm_start=True)

