"""Properties of the random-allocation / balls-in-bins accountant over many random configurations
(slow tier; docs/design.md §12.7).

* The certified upper end is at most the unamplified Gaussian's (``mu = sqrt(k E) / sigma``;
  balls-in-bins ``sqrt(E) / sigma``), which dominates the scheme whatever the allocation.
* It is at least pld-accounting's lower end (Feldman & Shenfeld's PLD accountant, an independent
  implementation), and dpjax's lower end is at most pld-accounting's upper end: both brackets
  hold the truth, so they overlap.  The brackets are precomputed
  (``benchmarks/make_allocation_oracle.py``, its command and package version recorded in
  ``tests/data/allocation_oracle.json``): pld-accounting is not a dependency.  Its run holds
  brackets for the cheapest 617 random-allocation and 846 balls-in-bins configurations of the
  1,000 each (two hours on two shared cores; the rest are listed without one and checked for
  the other properties).
* Monotone: one neighbour per configuration, in turn more noise (x1.25), one more epoch, or a
  delta ten times smaller; the truth moves one way, and so must the reported epsilon.

A second set draws wider configurations (up to 20,000 steps per epoch, 1,000 epochs, noise 0.05
to 100, ``k`` up to ``t``) for the properties that need dpjax alone: finite, capped, monotone.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from dpjax.pld.allocation import accountant as R
from dpjax.pld.grid.engine import exact_epsilon

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "allocation_oracle.json"


def _oracle():
    return json.loads(DATA.read_text())


def _bracket(c):
    if c["scheme"] == "balls_in_bins":
        r = R.balls_in_bins_accounting(c["sigma"], c["t"], c["epochs"], target_delta=c["delta"])
    else:
        r = R.allocation_accounting(c["sigma"], c["t"], c["epochs"], target_delta=c["delta"],
                                    selections_per_epoch=c["k"])
    return float(r.epsilon_lower), float(r.epsilon)


def _unamplified(c):
    part = c["epochs"] * (c["k"] if c["scheme"] == "random_allocation" else 1)
    return float(exact_epsilon(np.asarray(c["delta"], np.float64), math.sqrt(part) / c["sigma"])[0])


def _neighbour(c, i):
    """A configuration whose true epsilon is at most (kinds 0) or at least (kinds 1, 2) ``c``'s:
    ``(config, kind)`` with kind 0 more noise, 1 one more epoch, 2 a smaller delta."""
    kind = i % 3
    if kind == 0:
        return dict(c, sigma=c["sigma"] * 1.25), 0
    if kind == 1:
        return dict(c, epochs=c["epochs"] + 1), 1
    return dict(c, delta=c["delta"] / 10.0), 2


def _check_monotone(c, up, nb, kind, up_nb):
    if kind == 0:
        assert up_nb <= up, (c, nb, up, up_nb)
    else:
        assert up_nb >= up, (c, nb, up, up_nb)


def _run(configs, with_reference: bool):
    stats = dict(n=0, n_ref=0, worst_ref_ratio=math.inf, worst_cap_ratio=0.0, worst_lower_ratio=0.0,
                 monotone=0, widest=0.0)
    for i, c in enumerate(configs):
        lo, up = _bracket(c)
        gauss = _unamplified(c)
        assert math.isfinite(up) and 0.0 <= lo <= up, (c, lo, up)
        assert up <= gauss, (c, up, gauss)
        stats["n"] += 1
        if gauss > 0:
            stats["worst_cap_ratio"] = max(stats["worst_cap_ratio"], up / gauss)
        if up > 1e-3 and (up - lo) / up > stats["widest"]:
            stats["widest"], stats["widest_at"] = (up - lo) / up, c
        if with_reference and "lower" in c:
            assert up >= c["lower"], (c, up)
            assert lo <= c["upper"], (c, lo)
            stats["n_ref"] += 1
            if c["lower"] > 0 and up / c["lower"] < stats["worst_ref_ratio"]:
                stats["worst_ref_ratio"], stats["worst_ref_at"] = up / c["lower"], c
            if c["upper"] > 0:
                stats["worst_lower_ratio"] = max(stats["worst_lower_ratio"], lo / c["upper"])
        nb, kind = _neighbour(c, i)
        lo_nb, up_nb = _bracket(nb)
        assert up_nb <= _unamplified(nb)
        _check_monotone(c, up, nb, kind, up_nb)
        stats["monotone"] += 1
    return stats


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["random_allocation", "balls_in_bins"])
def test_properties_against_pld_accounting(scheme):
    data = _oracle()
    configs = [c for c in data["configurations"] if c["scheme"] == scheme]
    assert len(configs) >= 1000
    stats = _run(configs, with_reference=True)
    print(f"\n{scheme}: {stats} (pld-accounting {data['package_version']})")
    # Every configuration with a recorded bracket was compared (pld-accounting ran the cheapest
    # part of the set within its time budget; see the file's command).
    assert stats["n_ref"] == sum(1 for c in configs if "lower" in c) >= 400


def _wide_configs(count: int, seed: int = 7) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        t = int(round(math.exp(rng.uniform(math.log(2), math.log(20000)))))
        u = rng.uniform()
        k = 1 if u < 0.6 else (int(rng.integers(1, t + 1)) if u < 0.9 else int(rng.integers(2, min(t, 8) + 1)))
        out.append(dict(scheme="random_allocation", t=t, k=k,
                        epochs=int(round(math.exp(rng.uniform(0, math.log(1000))))),
                        sigma=float(math.exp(rng.uniform(math.log(0.05), math.log(100)))),
                        delta=float(10 ** rng.uniform(-14, -2))))
    return out


@pytest.mark.slow
def test_wide_configurations_are_finite_capped_and_monotone():
    stats = _run(_wide_configs(200), with_reference=False)
    print(f"\nwide random allocation: {stats}")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["random_allocation", "balls_in_bins"])
def test_calibration_returns_at_most_the_smallest_certified_sigma_plus_0_1_percent(scheme):
    """Calibrating to the epsilon certified at a configuration's own sigma: that sigma certifies,
    so the returned one is at most 1.001 times it, and no sigma below ``returned / 1.001`` (a
    scan down to half) certifies."""
    configs = [c for c in _oracle()["configurations"] if c["scheme"] == scheme][:25]
    bib = scheme == "balls_in_bins"
    for c in configs:
        lo, up = _bracket(c)
        if not 1e-3 < up < 1e3:
            continue
        sigma = R.allocation_noise_multiplier(up, c["delta"], c["t"], c["epochs"], selections_per_epoch=c["k"],
                                              balls_in_bins=bib)
        assert sigma <= 1.001 * c["sigma"], (c, sigma)
        assert _bracket(dict(c, sigma=sigma))[1] <= up
        for f in (1.001, 1.01, 1.1, 1.5, 2.0):
            assert _bracket(dict(c, sigma=sigma / f))[1] > up, (c, sigma, f)
