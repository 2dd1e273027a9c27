"""One table of reference training scenarios, each with what is known of its true epsilon.

Every public path that accounts a DP-SGD run is checked against the same table
(``tests/test_reference_paths.py``), as optimistix runs one table of test problems against every
solver.  A row states the run as a :class:`dpjax.TrainingScenario`, the target delta, and where
the true epsilon lies:

* ``exact``: the closed form (``q = 1``: ``T`` Gaussian steps compose into one Gaussian with
  ``mu = sqrt(T) / sigma``; the epsilon at ``delta`` solved here with SciPy, independently of
  dpjax);
* ``lower``: a lower bound of the truth from an outside library (dp_accounting's optimistic
  PLD estimate at these deltas, ``tests/data/dpsgd_oracle.json``; pld-accounting's certified
  lower end for random allocation, ``tests/data/allocation_oracle.json``);
* ``upper``: an outside upper bound that a certified epsilon must not exceed by more than
  :data:`TIGHT_RELATIVE` (pld-accounting's upper end);
* ``estimate``: a tight outside estimate of the truth that a certified epsilon must come within
  :data:`TIGHT_RELATIVE` of, either way (dp_accounting's connect-the-dots pessimistic PLD on a
  1e-5 grid, the pinned references of ``tests/data/reference.json``);
* nothing: rows checked for agreement between the paths only (balls-in-bins, groups).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import scipy.optimize
import scipy.stats

import dpjax

DATA = pathlib.Path(__file__).resolve().parent / "data"

#: How far from a tight reference a certified epsilon may lie: the accountant's grid error
#: (``GridOptions.relative_accuracy`` = 1e-3 of epsilon) plus the reference's own
#: (dp_accounting's 1e-5 grid; pld-accounting's default accuracy, 1e-3 relative).
TIGHT_RELATIVE = 2e-3


@dataclasses.dataclass(frozen=True)
class ReferenceRow:
    name: str
    scenario: dpjax.TrainingScenario
    target_delta: float
    exact: float | None = None
    lower: float | None = None
    upper: float | None = None
    estimate: float | None = None


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The epsilon of the Gaussian mechanism with ``mu = sensitivity / sigma`` at ``delta``
    (Balle & Wang, "Improving the Gaussian mechanism for differential privacy", Thm 8)."""
    def excess(eps):
        return (scipy.stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * scipy.stats.norm.cdf(-eps / mu - mu / 2)
                - delta)
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return scipy.optimize.brentq(excess, 0.0, hi, xtol=1e-14, rtol=1e-14)


def _dp_accounting_row(name: str, index: int) -> ReferenceRow:
    c = json.loads((DATA / "dpsgd_oracle.json").read_text())["configs"][index]
    scheme = dpjax.Poisson(c["q"]) if c["scheme"] == "poisson" else dpjax.FixedBatch(c["batch_size"],
                                                                                      c["dataset_size"])
    return ReferenceRow(name, dpjax.TrainingScenario(c["sigma"], scheme, steps=c["steps"]), c["delta"],
                        lower=c["dp_accounting_optimistic"])


def _pinned_row(name: str, case_id: str) -> ReferenceRow:
    c = next(c for c in json.loads((DATA / "reference.json").read_text())["cases"] if c["id"] == case_id)
    p = c["params"]
    if "batch_size" in p and "fixed" in case_id:
        scheme = dpjax.FixedBatch(p["batch_size"], p["dataset_size"])
    else:
        scheme = dpjax.Poisson(p["sampling_probability"])
    run = dpjax.TrainingScenario(p["noise_multiplier"], scheme, steps=p["steps"], group_size=p.get("group_size", 1))
    return ReferenceRow(name, run, p["delta"], estimate=c["value"])


def _allocation_row(name: str, index: int) -> ReferenceRow:
    c = json.loads((DATA / "allocation_oracle.json").read_text())["configurations"][index]
    assert c["scheme"] == "random_allocation"
    run = dpjax.TrainingScenario(c["sigma"], dpjax.RandomAllocation(c["t"], c["k"]), epochs=c["epochs"])
    return ReferenceRow(name, run, c["delta"], lower=c["lower"], upper=c["upper"])


def reference_rows() -> list[ReferenceRow]:
    """The table (built from the data files on each call; a few milliseconds)."""
    return [
        ReferenceRow("gaussian_q1", dpjax.TrainingScenario(2.0, dpjax.Poisson(1.0), steps=100), 1e-5,
                     exact=gaussian_epsilon(math.sqrt(100) / 2.0, 1e-5)),
        ReferenceRow("gaussian_q1_tiny_delta", dpjax.TrainingScenario(0.8, dpjax.Poisson(1.0), steps=3), 1e-8,
                     exact=gaussian_epsilon(math.sqrt(3) / 0.8, 1e-8)),
        _dp_accounting_row("poisson_short", 4),       # sigma 0.49, q 0.0055, 31 steps, delta 4e-5
        _dp_accounting_row("poisson_long", 16),       # sigma 0.77, q 0.014, 391 steps, delta 1.5e-7
        _dp_accounting_row("fixed_batch_short", 3),   # sigma 4.07, B 21 of 1000, 310 steps, delta 1.5e-6
        _pinned_row("poisson_b1", "B1"),              # sigma 1, q 0.01, 1000 steps, delta 1e-5
        _pinned_row("poisson_b3", "B3"),              # sigma 2, q 0.1, 100 steps, delta 1e-5
        _pinned_row("fixed_batch", "C_fixed_s1_k1"),  # sigma 2, B 500 of 50000, 2000 steps, delta 1e-5
        _pinned_row("poisson_group", "C_poisson_s2_k4"),  # sigma 2, q 0.01, 2000 steps, groups of 4
        _allocation_row("random_allocation", 0),      # sigma 1.15, t 21, k 1, 4 epochs, delta 1.9e-5
        ReferenceRow("balls_in_bins", dpjax.TrainingScenario(1.5, dpjax.BallsInBins(16), epochs=3), 1e-5),
    ]
