"""``--scenario FILE``: a saved :class:`dpjax.TrainingScenario` in place of the run's options, in
``dpjax epsilon``, ``delta``, ``noise`` and ``report``; each value is the Python call's."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import dpjax
from dpjax import FixedBatch, Poisson, RandomAllocation, TrainingScenario
from dpjax.cli.main import main


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture()
def saved(tmp_path):
    def save(run: TrainingScenario) -> str:
        path = tmp_path / f"run{len(list(tmp_path.iterdir()))}.json"
        run.to_json(path)
        return str(path)

    return save


def test_values_equal_the_python_calls(saved):
    run = TrainingScenario(1.1, Poisson(256 / 60000), epochs=30)
    rc, out, _ = _cli("epsilon", "--scenario", saved(run), "--delta", "1e-5", "--json")
    assert rc == 0 and json.loads(out)["epsilon"] == dpjax.dpsgd_epsilon(run, 1e-5)
    assert json.loads(out)["steps"] == run.steps == 7032
    per_epoch = TrainingScenario(2.0, RandomAllocation(20), epochs=3)
    rc, out, _ = _cli("delta", "--scenario", saved(per_epoch), "--epsilon", "1", "--json")
    assert rc == 0 and json.loads(out)["delta"] == dpjax.dpsgd_delta(per_epoch, 1.0)
    calibrate = TrainingScenario(None, FixedBatch(70, 1000), epochs=7)
    rc, out, _ = _cli("noise", "--scenario", saved(calibrate), "--epsilon", "2", "--delta", "1e-5", "--json",
                      "--quiet")
    assert rc == 0 and json.loads(out)["noise_multiplier"] == dpjax.dpsgd_noise_multiplier(calibrate, 2.0, 1e-5)
    rc, out, _ = _cli("report", "--scenario", saved(run), "--json")
    assert rc == 0 and json.loads(out)["epsilon"][0] == dpjax.dpsgd_epsilon(run, 1e-5)


def test_refusals_name_the_option(saved, tmp_path):
    run = saved(TrainingScenario(1.1, Poisson(0.01), steps=100))
    cases = [
        (("epsilon", "--scenario", run, "--delta", "1e-5", "--steps", "10"), "do not give --steps"),
        (("epsilon", "--scenario", run, "--delta", "1e-5", "--noise-multiplier", "2"), "--noise-multiplier"),
        (("epsilon", "--delta", "1e-5", "--sampling-prob", "0.01", "--steps", "10"), "--noise-multiplier is required"),
        (("noise", "--scenario", run, "--epsilon", "2", "--delta", "1e-5"), "finds the noise multiplier"),
        (("epsilon", "--scenario", str(tmp_path / "missing.json"), "--delta", "1e-5"), "cannot read"),
    ]
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    cases.append((("epsilon", "--scenario", str(tmp_path / "other.json"), "--delta", "1e-5"),
                  "not a saved TrainingScenario"))
    for argv, message in cases:
        rc, out, err = _cli(*argv)
        assert rc == 2 and out == "" and message in err, (argv, err)
