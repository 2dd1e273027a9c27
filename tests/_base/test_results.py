"""Every public result type round-trips through to_dict / to_json / from_dict / load.

``json.dumps(result)`` used to fail on ndarray fields; every result now inherits
:class:`dpjax._base.results.ResultMixin`.  ``test_every_public_result_type_is_covered`` enumerates the
public classes of every sub-package whose name marks a result and fails when one is neither in
``CASES`` below nor exempted with a reason, so a new result type without ``to_json`` is caught.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import math

import numpy as np
import pytest

import dpjax

SUBPACKAGES = ("dpjax.pld", "dpjax.montecarlo", "dpjax.baselines", "dpjax.calibration",
               "dpjax.optimization", "dpjax.matrices", "dpjax.group", "dpjax.report")
RESULT_SUFFIXES = ("Result", "Estimate", "Report", "Certificate", "Table", "Curve", "Solution")
# Public names that end like results but are not user-facing results (with the reason).
EXEMPT: dict[str, str] = {
    "HockeyStickTable": "a precomputed pytree of grid tables (dpjax.pld.grid.fixed_grid), an input to jitted code, not a result",
}


def _direction(direction, upper, lower):
    from dpjax.pld import DirectionReport

    return DirectionReport(direction=direction, upper=upper, lower=lower, n=4096, dx=1e-3, p_inf=0.0,
                           tail_above=1e-20, tail_below=0.0, roundoff=2.7e-12, truncation_budget=1e-7)


def _epsilon_result():
    # Built directly (the serialisation is under test; computing one costs a compile): array
    # fields, a tuple of nested reports, an inf, a reason.
    from dpjax.pld import EpsilonResult

    up = np.array([1.8282416892690323, np.inf])
    lo = np.array([1.8282264761240046, 9.9])
    return EpsilonResult(epsilon=up, epsilon_lower=lo, epsilon_upper=up, target_delta=np.array([1e-5, 1e-300]),
                         directions=(_direction("remove", up, lo), _direction("add", up - 0.1, lo - 0.1)),
                         blocked=False, reason="target_delta is below what the grid can certify")


def _delta_result():
    from dpjax.pld import DeltaResult

    return DeltaResult(delta=7.05335e-06, delta_lower=7.05321e-06, delta_upper=7.05335e-06, target_epsilon=2.0,
                       directions=(_direction("replace", 7.05335e-06, 7.05321e-06),), blocked=True,
                       adjacency="replace")


# The two estimates share their sample count, and the delta estimate evaluates as many
# epsilons as the epsilon estimate's search grid (grid_size = 32): one compiled program of
# Monte Carlo sums serves both (only the serialisation is under test, not the values).
@functools.lru_cache(maxsize=None)
def _delta_estimate():
    from dpjax.montecarlo import BallsInBins

    return BallsInBins(np.array([1.0, 0.5]), 2, 2).estimate(1.0, np.linspace(0.5, 1.0, 32), 4096, 0)


@functools.lru_cache(maxsize=None)
def _epsilon_estimate():
    from dpjax.montecarlo import BallsInBins

    return BallsInBins(np.array([1.0, 0.5]), 2, 2).epsilon_estimate(1.0, 0.1, 4096, 0)


@functools.lru_cache(maxsize=None)
def _certificate():
    from dpjax.montecarlo import BallsInBins

    return BallsInBins(np.array([1.0, 0.5]), 2, 2).certify(1.0, 2.0, 0.5, 4096, 0)


def _group_lemma():
    from dpjax.baselines import GroupLemmaResult

    return GroupLemmaResult(epsilon=math.inf, epsilon_1=1.5, delta_1=1e-9, group_delta=3e-6,
                            reason="no feasible delta_1", adjacency="replace")


def _root_result():

    from dpjax.calibration import bisect_monotone

    return bisect_monotone(lambda x: x * x, 2.0, (0.0, 10.0), decreasing=False)


def _sweep_table():
    from dpjax.pld import SweepTable

    row = dict(noise_multiplier=1.0, sampling_prob=0.01, steps=100, delta=1e-5, group_size=1,
               query="epsilon", epsilon=1.25, lower=1.2499, upper=1.25, n=65536, dx=1e-4, path="batched")
    return SweepTable(rows=(row, dict(row, epsilon=math.inf, upper=math.inf)), programs=1, seconds=0.5)


def _epsilon_curve():
    from dpjax.pld import EpsilonCurve

    eps = np.array([0.5, 0.9, math.inf])
    return EpsilonCurve(steps=np.array([10, 100, 1000]), epsilon=eps, epsilon_lower=np.array([0.49, 0.89, 0.0]),
                        epsilon_upper=eps, target_delta=1e-5, n=65536, dx=1e-4,
                        recomputed=np.array([False, True, False]))


def _optimization_result():
    from dpjax.optimization import OptimizationResult

    return OptimizationResult(
        parameterization={"family": "blt", "n": 4, "num_buffers": 1}, batches_per_epoch=2, epochs=2,
        target_epsilon=2.0, target_delta=1e-3, params={"theta": [0.1], "omega": [-0.3]},
        first_column=[1.0, 0.5, 0.25, 0.125], noise_multiplier=1.5, noise_multiplier_estimate=1.4,
        error=1.1, rmse=1.65, rmse_estimate=1.54,
        certificate=_certificate(),
        history=[{"step": 0, "loss": 0.5, "rmse": 1.6, "noise_multiplier": 1.4, "solver_passes": 5}],
        num_steps=1, num_samples=1024, seed=0, timings={"steps": 0.1})


def _calibration_result():
    from dpjax.calibration import Solution, SolverStats

    return Solution(root=np.float64(1.25), lower=np.float64(1.2), upper=np.float64(math.inf),
                    status=np.int32(0), stats=SolverStats(num_passes=np.int32(5)))


def _screened_result():
    from dpjax.calibration import Solution, SolverStats

    return Solution(root=np.float64(1.25), lower=np.float64(1.2), upper=np.float64(1.3),
                    status=np.int32(0),
                    stats=SolverStats(num_passes=np.int32(3), screened=np.bool_(True)))


def _privacy_report():
    from dpjax.report import PrivacyReport

    return PrivacyReport(target_delta=np.array([1e-5, 1e-10]), epsilon=np.array([1.6362437860639458, math.inf]),
                         fpr=np.array([1e-6, 0.5]), tpr_remove=np.array([7.392e-06, 0.656336]),
                         tpr_add=np.array([6.321e-06, 0.656888]), gdp_mu=math.inf, num_lines=2083,
                         adjacency="add_or_remove")


CASES = {
    "PrivacyReport": _privacy_report,
    "Solution (screened)": _screened_result,
    "SweepTable": _sweep_table,
    "EpsilonCurve": _epsilon_curve,
    "OptimizationResult": _optimization_result,
    "Solution (calibration)": _calibration_result,
    "EpsilonResult": _epsilon_result,
    "DeltaResult": _delta_result,
    "DirectionReport": lambda: _epsilon_result().directions[0],
    "DeltaEstimate": _delta_estimate,
    "EpsilonEstimate": _epsilon_estimate,
    "Certificate": _certificate,
    "GroupLemmaResult": _group_lemma,
    "Solution": _root_result,
}


def _public_result_types():
    found = {}
    for name in SUBPACKAGES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", dir(module)):
            obj = getattr(module, attr, None)
            if inspect.isclass(obj) and attr.endswith(RESULT_SUFFIXES):
                found[attr] = obj
    return found


def test_every_public_result_type_is_covered():
    found = _public_result_types()
    # A key is the class name, optionally followed by " (variant)" for a further case of it.
    classes = {name.split(" ")[0] for name in CASES}
    assert classes <= set(found), classes - set(found)
    missing = set(found) - classes - set(EXEMPT)
    assert not missing, f"public result types without a round-trip case (add to CASES): {sorted(missing)}"
    for name, cls in found.items():
        if name in EXEMPT:
            continue
        assert callable(getattr(cls, "to_json", None)), f"{name} has no to_json()"
        assert callable(getattr(cls, "to_dict", None)), f"{name} has no to_dict()"
        assert (cls.to_json.__doc__ or "").strip(), f"{name}.to_json is undocumented"


def _assert_same(a, b, path="result"):
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, (tuple, list)) and not hasattr(a, "shape"):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (str, type(None), bool)):
        assert a == b, path
    else:
        x, y = np.asarray(a), np.asarray(b)
        assert x.shape == y.shape, path
        # exact: JSON keeps float64 to the last bit (repr round-trips)
        np.testing.assert_array_equal(x, y, err_msg=path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip(name, tmp_path):
    found = _public_result_types()
    cls = found[name.split(" ")[0]]
    result = CASES[name]()
    assert isinstance(result, cls)
    # json.dumps of to_dict works (arrays -> lists); to_json is strict JSON (no Infinity/NaN)
    json.dumps(result.to_dict())
    text = result.to_json()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    _assert_same(result, cls.from_dict(result.to_dict()))
    _assert_same(result, cls.load(text))
    path = tmp_path / f"{name}.json"
    assert result.to_json(path) == text
    _assert_same(result, cls.load(path))


def test_infinite_fields_are_strings_in_json_and_floats_again():
    r = _group_lemma()
    assert json.loads(r.to_json())["epsilon"] == "inf"
    assert type(r).load(r.to_json()).epsilon == math.inf


def test_optimization_result_status_is_a_mode_and_its_json_keeps_its_format():
    from dpjax.optimization import OptimizationResult
    from dpjax.optimization.loop import OptimizationStatus

    r = dataclasses.replace(_optimization_result(), status="stopped", stop_reason="step 0: non-finite loss",
                            noise_multiplier=math.inf, certificate=None)
    assert r.status is OptimizationStatus.STOPPED and r.status == "stopped"
    d = json.loads(r.to_json())
    assert d["format"] == "dpjax-optimize-result-1" and d["status"] == "stopped"
    assert d["noise_multiplier"] == "inf" and d["gap_to_estimate"] == "inf" and d["certificate"] is None
    back = OptimizationResult.load(r.to_json())
    assert back == r and back.status is OptimizationStatus.STOPPED
    with pytest.raises(ValueError, match="status must be one of"):
        dataclasses.replace(r, status="done")
    with pytest.raises(ValueError, match="format"):
        OptimizationResult.from_dict({k: v for k, v in r.to_dict().items() if k != "format"})


def test_baseline_row_round_trip_is_strict_json(tmp_path):
    from dpjax.optimization.baselines import BaselineRow

    row = BaselineRow(name="balls_in_bins", epsilon=2.0, delta=1e-5, batches_per_epoch=2, epochs=2,
                      noise_multiplier=math.inf, error=1.1, rmse=math.inf, rmse_jax_privacy=math.inf,
                      accounting="test", first_column=[1.0, 0.5],
                      extra={"per_bands": [{"bands": 1, "rmse": math.inf}]}, certificate=_certificate())
    text = row.to_json()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert BaselineRow.load(text) == row
    path = tmp_path / "row.json"
    assert row.to_json(path) == text and BaselineRow.load(path) == row


def test_io_strict_json_and_atomic_write(tmp_path):
    from dpjax._base import io as _io

    data = {"a": [1.0, math.inf, -math.inf], "b": np.float64(math.nan), "c": np.arange(3), "d": ("x", None)}
    text = _io.dumps(data)
    assert text == '{"a": [1.0, "inf", "-inf"], "b": "nan", "c": [0, 1, 2], "d": ["x", null]}'
    back = _io.loads(text)
    assert back["a"] == [1.0, math.inf, -math.inf] and math.isnan(back["b"]) and back["c"] == [0, 1, 2]
    path = tmp_path / "f.json"
    path.write_text("old")
    _io.atomic_write(path, text)
    assert path.read_text() == text
    _io.atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]  # no temp file left


def test_as_dict_alias():
    cert = _certificate()
    assert cert.as_dict() == cert.to_dict()


@pytest.mark.slow
def test_computed_results_round_trip_and_name_their_adjacency():
    from dpjax import pld
    from dpjax.group import group_accounting

    eps = pld.dpsgd_accounting(1.0, 0.01, 100, target_delta=np.array([1e-5, 1e-6]))
    dlt = pld.dpsgd_accounting(1.0, 0.01, 100, target_epsilon=1.0)
    grp = group_accounting(2.0, None, 20, target_delta=1e-5, group_size=2, sampling=dpjax.FixedBatch(10, 1000))
    assert eps.adjacency == dlt.adjacency == "add_or_remove" and grp.adjacency == "replace"
    for r in (eps, dlt, grp):
        _assert_same(r, type(r).load(r.to_json()))
