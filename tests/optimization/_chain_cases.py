"""The optimisation problems of the chain schemes (banded ``C``, an exact likelihood ratio by a
forward algorithm): one row per scheme, shared by ``test_chain_optimize.py`` (the checks every
scheme goes through) and the schemes' own test files.

* b-min-sep sampling (Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep
  Subsampling"): ``n = 16`` rounds, ``min_sep = 4``, ``p = 0.25``.
* random allocation (Feldman & Shenfeld, "Privacy amplification by random allocation"):
  ``t = 4`` batches per epoch, ``k = 2`` selections, ``E = 2`` epochs.

Both: a 2-band ``C`` from ``c_1 = 1``, eps 2, delta 1e-2, 512 draws per step, SGD(0.5) (one
optimizer object: a scheme's run and its gradient test share one compiled step), the
Bernoulli-KL certificate on 2^14 draws.  :func:`run` is each scheme's 8-step optimisation, made
once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpjax
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import BMinSep, RandomAllocation
from dpjax.optimization import (CertifySettings, CorrelationProblem, OptimizerSettings, make_parameterization,
                                optimize_correlation, prefix_sum_error)

EPS, DELTA, M = 2.0, 1e-2, 512
START = {"coeffs": np.array([math.log(math.expm1(1.0))])}  # c_1 = 1 (softplus)
CERTIFY = CertifySettings(num_samples=1 << 14, method="bernoulli_kl")
LR = 0.5
OPT = optax.sgd(LR)


@dataclasses.dataclass(frozen=True)
class Case:
    """One scheme's problem and what its result must record."""

    name: str
    problem: CorrelationProblem
    n: int
    sampling: dict                                   # the result's `sampling` record
    periods: tuple                                   # the result's (batches_per_epoch, epochs)
    accountant: Callable[[np.ndarray], object]       # the scheme's Monte Carlo accountant of a first column

    @property
    def param(self):
        return make_parameterization("banded", self.n, bands=2)


# b-min-sep
N_B, MIN_SEP, P = 16, 4, 0.25
# random allocation
T, K, E = 4, 2, 2

CASES = {
    "b_min_sep": Case(
        name="b_min_sep",
        problem=CorrelationProblem(sampling=dpjax.BMinSepSampling(min_sep=MIN_SEP, sampling_prob=P, num_rounds=N_B),
                                   target_epsilon=EPS, target_delta=DELTA),
        n=N_B,
        sampling={"scheme": "b_min_sep", "min_sep": MIN_SEP, "sampling_prob": P, "num_rounds": N_B,
                  "warm_start": True},
        periods=(None, None),
        accountant=lambda column: BMinSep(column, P, MIN_SEP, N_B)),
    "random_allocation": Case(
        name="random_allocation",
        problem=CorrelationProblem(sampling=dpjax.RandomAllocation(T, selections_per_epoch=K), epochs=E,
                                   target_epsilon=EPS, target_delta=DELTA),
        n=T * E,
        sampling={"scheme": "random_allocation", "batches_per_epoch": T, "selections_per_epoch": K, "epochs": E},
        periods=(T, E),
        accountant=lambda column: RandomAllocation(column, T, E, selections_per_epoch=K)),
}
NAMES = list(CASES)


@functools.lru_cache(maxsize=None)
def run(name: str):
    """The scheme's 8-step optimisation from ``c_1 = 1``, certified (once per process)."""
    case = CASES[name]
    settings = OptimizerSettings(num_steps=8, num_samples=M, optimizer=OPT, init_params=START, key=4)
    return optimize_correlation(case.param, case.problem, settings, certify=CERTIFY, progress=False)


def log_rmse_on_common_draws(case: Case, column) -> float:
    """``log(sigma* err)`` of the 2-band ``C`` with ``column``'s first two entries, its sigma
    calibrated on one fixed 2^13-draw sample (the same draws for every ``C``)."""
    column = np.asarray(column, np.float64)[:2]
    sigma = case.accountant(column).calibrate(EPS, DELTA, 1 << 13, key=9)
    with jax.enable_x64(True):
        err = float(prefix_sum_error(Toeplitz(jnp.asarray(column)), case.n))
    return math.log(sigma * err)
