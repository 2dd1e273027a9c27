"""Group-privacy baselines: the group-privacy lemma and the RDP over-approximation of the group-privacy note.

Both are sound but loose; :func:`dpjax.group_epsilon` (mixture-of-Gaussians PLD) is tight.

Group-privacy lemma (Vadhan 2017, Lemma 2.2; Ganesh 2024, Lemma 1.1)
-----------------------------------------------------------------
An ``(eps_1, delta_1)``-DP mechanism is ``(k eps_1, k e^{(k-1) eps_1} delta_1)``-DP for groups of
``k``.  Given the target ``delta_k`` we need ``delta_1`` with
``log k + (k-1) eps_1(delta_1) + log delta_1 <= log delta_k``: for moderate k this forces
``delta_1`` to tiny values where floating-point PLD accountants lose all accuracy (Ganesh 2024, §1:
TensorFlow Privacy returns inf).  The numerically stable way (used here) parametrises by
``eps_1`` instead: the certified k = 1 PLD gives ``log delta_1(eps_1)`` (an upper bound, including
every truncation/wrap-around/round-off term) on a grid of ``eps_1`` in ONE FFT, and the
condition ``h(eps_1) = log k + (k-1) eps_1 + log delta_1(eps_1) <= log delta_k`` is checked in log
space.  The smallest feasible grid ``eps_1`` (refined by a second, finer grid between the last
infeasible and the first feasible point) gives ``eps_k = k eps_1``; any feasible point is a valid
guarantee, so the search only affects tightness.

The certified PLD ``delta_1`` bound cannot go below the accountant's error floor (its FFT
round-off allowance, ~4e-12 for T = 2000 steps): the lemma then needs ``delta_1`` where no
float64 PLD can certify anything.  By default (``rdp_tail=True``) ``delta_1(eps_1)`` is the minimum
of the PLD bound and the RDP bound ``log delta_1 <= (a-1)(R(a) - eps_1 + log(1 - 1/a)) - log a``
(Canonne, Kamath & Steinke 2020 Prop. 12, minimised over the default orders), which is valid at
any scale; both are certified upper bounds, so is their minimum.  When neither gives a feasible
``eps_1`` the answer is an explicit ``inf`` with a reason.

RDP over-approximation (the group-privacy note, "I-am-using-keras" method)
------------------------------------------------------------
Shift all the mixture mass with ``j >= 1`` to the largest sensitivity ``k``: the MoG with
``P(J = j)`` is dominated (Ganesh 2024, Lemma 2.9) by the two-point mixture
``{0: P(J = 0), k: 1 - P(J = 0)}``, which is a Poisson-subsampled Gaussian with
``q_eff = 1 - P(J = 0)`` and noise multiplier ``sigma / k`` (``sigma / (2k)`` for fixed
batches: replace adjacency doubles every sensitivity, Ganesh (2024), Thm 3.3); its RDP
(moments accountant) gives a sound, loose epsilon.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.enums import Adjacency
from dpjax._base.results import ResultMixin
from dpjax._base.x64 import float64
from dpjax.numerics.rdp import rdp_epsilon
from dpjax.pld.group_spec import Sampling


@dataclasses.dataclass(frozen=True)
class GroupLemmaResult(ResultMixin):
    """Result of :func:`group_lemma_epsilon`.

    Attributes:
      epsilon: ``k * epsilon_1`` (``inf`` when no delta_1 is feasible).
      epsilon_1: per-example epsilon used.
      delta_1: certified per-example delta at ``epsilon_1`` (upper bound).
      group_delta: ``k e^{(k-1) eps_1} delta_1`` (<= target_delta).
      reason: why the answer is inf (else None).
      adjacency: the neighbouring relation of the guarantee, per example (a group of k:
        add/remove-k or replace-k): ``"add_or_remove"`` (Poisson) or ``"replace"`` (fixed batch).

    ``to_dict()`` / ``to_json(path)`` / ``GroupLemmaResult.load(path)``: see :mod:`dpjax._base.results`.
    """

    epsilon: float
    epsilon_1: float
    delta_1: float
    group_delta: float
    reason: str | None = None
    adjacency: Adjacency = Adjacency.ADD_OR_REMOVE


def _rdp_log_delta_curve(sigma: float, q: float, steps: int):
    """``eps -> log delta`` upper bound from RDP (improved conversion, default orders), vectorized."""
    from dpjax.numerics.rdp import DEFAULT_RDP_ORDERS, rdp_poisson_subsampled_gaussian

    orders = np.asarray(DEFAULT_RDP_ORDERS)
    orders = orders[orders > 1.01]  # the improved conversion is unstable next to 1
    total = rdp_poisson_subsampled_gaussian(sigma, q, orders) * steps

    def curve(eps):
        eps = np.asarray(eps, np.float64)[..., None]
        log_delta = (orders - 1) * (total - eps + np.log1p(-1 / orders)) - np.log(orders)
        return np.minimum(np.min(log_delta, axis=-1), 0.0)

    return curve


def _log_h(k, eps1, delta1):
    with np.errstate(divide="ignore"):
        return math.log(k) + (k - 1) * eps1 + np.log(delta1)


@float64(rounding="up")
def group_lemma_epsilon(
    noise_multiplier: float,
    sampling_prob: float | None,
    steps: int,
    target_delta: float,
    *,
    group_size: int,
    sampling="poisson",
    grid_points: int = 1024,
    rdp_tail: bool = True,
    options=None,
) -> GroupLemmaResult:
    """Group-privacy lemma applied to the tight (certified PLD) k = 1 guarantee of DP-SGD.

    Takes the arguments of :func:`dpjax.group_epsilon` (``sampling``: ``"poisson"``,
    :class:`dpjax.Poisson` or :class:`dpjax.FixedBatch`), plus ``grid_points`` and ``rdp_tail``.

    Args:
      grid_points: eps_1 grid per search stage.
      rdp_tail: also use the RDP bound on delta_1 where it is smaller (see the module docstring).

    Returns:
      :class:`GroupLemmaResult`; ``.epsilon`` is ``inf`` where no ``delta_1`` is feasible.

    Example::

        >>> group_lemma_epsilon(1.0, 0.01, 2000, 1e-5, group_size=8).epsilon       # doctest: +SKIP
        inf
    """
    from dpjax import pld

    spec, sigma = _group_spec_and_sigma("group_lemma_epsilon", noise_multiplier, sampling_prob, group_size, sampling)
    t = _validate.positive_int("steps", steps)
    delta_k = float(_validate.PrivacyTarget(delta=target_delta).delta)
    m = _validate.positive_int("grid_points", grid_points, minimum=16)
    k = spec.group_size
    # k = 1 mechanism: the subsampled Gaussian with the adjacency's per-example sensitivity
    # (fixed batch, replace-one: sensitivity 2 at q = B/N, i.e. noise multiplier sigma / 2).
    sigma_unit = sigma / spec.sampling.sensitivity
    comps = [(pld.PoissonSubsampledGaussian(sigma_unit, float(spec.sampling_prob)), t)]
    if k == 1:
        eps = float(pld.epsilon(comps, delta_k, options=options, with_lower=False).epsilon)
        return GroupLemmaResult(eps, eps, delta_k, delta_k, adjacency=spec.adjacency)
    rdp_curve = _rdp_log_delta_curve(sigma_unit, float(spec.sampling_prob), t) if rdp_tail else None
    search = _LemmaSearch(comps, k, math.log(delta_k), m, options, rdp_curve)
    eps_lo, eps_hi = _lemma_bracket(search, delta_k)
    found = None
    if math.isfinite(eps_lo) and eps_hi > eps_lo:
        found = search.first_feasible(eps_lo, _rdp_upper_end(search, eps_lo, eps_hi))
    if found is None:
        return GroupLemmaResult(
            math.inf, math.nan, math.nan, math.nan,
            reason=(f"no eps_1 satisfies k e^((k-1) eps_1) delta_1(eps_1) <= {delta_k:g} with a certified "
                    f"delta_1 (PLD{' or RDP' if rdp_tail else ''} upper bound; the PLD cannot certify "
                    f"below its float64 error floor, ~1e-12)"),
            adjacency=spec.adjacency)
    eps1, delta1 = _refine(search, *found)
    return GroupLemmaResult(k * eps1, eps1, delta1, k * math.exp((k - 1) * eps1) * delta1, adjacency=spec.adjacency)


def _group_spec_and_sigma(name, noise_multiplier, sampling_prob, group_size, sampling):
    """The validated group (:func:`dpjax.group.validate_group_args`; ``sampling`` is ``"poisson"``,
    :class:`dpjax.Poisson` or :class:`dpjax.FixedBatch`) and noise multiplier."""
    from dpjax import group as group_mod
    from dpjax.pld.scenario import FixedBatch, Poisson, scheme_keywords

    s = scheme_keywords(name, sampling, sampling_prob, accepts=(Poisson, FixedBatch))
    spec = group_mod.validate_group_args(s.sampling_prob, group_size=group_size, sampling=s.sampling,
                                         dataset_size=s.dataset_size, batch_size=s.batch_size)
    return spec, float(_validate.positive("noise_multiplier", noise_multiplier))


@dataclasses.dataclass(frozen=True)
class _LemmaSearch:
    """The search for the smallest feasible ``eps_1``: ``k e^{(k-1) eps_1} delta_1(eps_1) <=
    delta_k``, ``delta_1`` the certified PLD bound of the k = 1 composition ``comps`` (or the
    RDP curve where smaller), on grids of ``grid_points`` values."""

    comps: list
    k: int
    log_target: float
    grid_points: int
    options: object
    rdp_curve: object

    def first_feasible(self, lo, hi):
        """``(grid, delta_1 on it, index of the first feasible point)`` on ``linspace(lo, hi)``,
        or ``None`` when no point is feasible."""
        from dpjax import pld

        grid = np.linspace(lo, hi, self.grid_points)
        d1 = np.asarray(pld.delta(self.comps, grid, options=self.options, with_lower=False).delta,
                        np.float64)
        if self.rdp_curve is not None:
            d1 = np.minimum(d1, np.exp(self.rdp_curve(grid)))
        ok = _log_h(self.k, grid, d1) <= self.log_target
        if not ok.any():
            return None
        return grid, d1, int(np.argmax(ok))


def _lemma_bracket(search: _LemmaSearch, delta_k: float) -> tuple[float, float]:
    """``(eps_lo, eps_hi)``: ``delta_1 <= delta_k / k`` is necessary (lower end); with
    ``delta_1 >= 1e-300`` (or the PLD floor without the RDP tail), beyond ``eps_hi`` the factor
    ``e^{(k-1) eps_1}`` alone exceeds the budget."""
    from dpjax import pld

    k = search.k
    eps_lo = float(pld.epsilon(search.comps, delta_k / k, options=search.options,
                               with_lower=False).epsilon)
    floor = 1e-300 if search.rdp_curve is not None else 1e-16
    return eps_lo, (search.log_target - math.log(k) - math.log(floor)) / (k - 1)


def _rdp_upper_end(search: _LemmaSearch, eps_lo: float, eps_hi: float) -> float:
    """The RDP curve alone (cheap, NumPy) may already give a feasible ``eps_1``: search below it."""
    if search.rdp_curve is None:
        return eps_hi
    fine = np.linspace(eps_lo, eps_hi, 200_001)
    ok = _log_h(search.k, fine, np.exp(search.rdp_curve(fine))) <= search.log_target
    return float(fine[int(np.argmax(ok))]) if ok.any() else eps_hi


def _refine(search: _LemmaSearch, grid, d1, i) -> tuple[float, float]:
    """Refine between the last infeasible and the first feasible point until the ``eps_1``
    spacing is below 1e-7 relative (each stage shrinks it by ``grid_points - 1``); returns
    ``(eps_1, delta_1)``."""
    for _ in range(4):
        if i == 0 or grid[i] - grid[i - 1] <= 1e-7 * max(grid[i], 1e-3):
            break
        refined = search.first_feasible(grid[i - 1], grid[i])
        if refined is None:
            break
        grid, d1, i = refined
    return float(grid[i]), float(d1[i])


def group_rdp_epsilon(
    noise_multiplier: float,
    sampling_prob: float | None,
    steps: int,
    target_delta: float,
    *,
    group_size: int,
    sampling="poisson",
    orders=None,
) -> tuple[float, float]:
    """The group-privacy note's RDP over-approximation of group privacy: ``(epsilon, optimal_order)``.

    All mixture mass at ``j >= 1`` is moved to ``k`` (sound by stochastic dominance), giving a
    Poisson-subsampled Gaussian with ``q_eff = 1 - P(J = 0)`` and noise multiplier ``sigma / k``
    (``sigma / (2k)`` for fixed batches, replace adjacency),
    accounted with the moments accountant (:func:`dpjax.baselines.rdp_epsilon`).
    ``P(J = 0) = (1 - q)^k`` (Poisson) or ``prod_{i<k} (1 - B / (N - i))`` (fixed batch).

    Example::

        >>> group_rdp_epsilon(1.0, 0.01, 2000, 1e-5, group_size=4)    # doctest: +SKIP
    """
    spec, sigma = _group_spec_and_sigma("group_rdp_epsilon", noise_multiplier, sampling_prob, group_size, sampling)
    k = spec.group_size
    if spec.sampling is Sampling.POISSON:
        q_eff = -math.expm1(k * math.log1p(-spec.sampling_prob)) if spec.sampling_prob < 1 else 1.0
    else:
        n, b = spec.dataset_size, spec.batch_size
        log_p0 = sum(math.log1p(-b / (n - i)) for i in range(k)) if n - k >= b else -math.inf
        q_eff = -math.expm1(log_p0)
    # Largest sensitivity k times the per-example sensitivity of the adjacency (2 for fixed-batch
    # replace-one: mixture {0, 2k} with noise sigma, Ganesh (2024), Thm 3.3).
    return rdp_epsilon(sigma / (k * spec.sampling.sensitivity), q_eff, steps, target_delta, orders=orders)
