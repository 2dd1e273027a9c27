"""``--dataset-size N --batch-size B --epochs E`` in ``dpjax epsilon``, ``delta`` and ``noise``:
each answer equals the Python call with the arguments the one rule of each sampling scheme
gives (Poisson: ``q = B / N``, steps by :func:`dpjax._base.names.epochs_to_steps`; random
allocation and balls-in-bins: ``floor(N / B)`` batches per epoch), and mixing the two
descriptions is an error naming both options."""

from __future__ import annotations

import json

import pytest

import dpjax
from dpjax import pld
from dpjax._base.names import epochs_to_steps
from dpjax.cli.main import main


def _run(capsys, *argv):
    rc = main(list(argv) + ["--json"])
    out = capsys.readouterr()
    return rc, out.out, out.err


# The usual MNIST-sized run: 60,000 examples, batches of 256, 30 epochs.
USUAL = ["--dataset-size", "60000", "--batch-size", "256", "--epochs", "30"]


def test_epsilon_equals_the_python_call_with_epochs(capsys):
    rc, out, err = _run(capsys, "epsilon", "--noise-multiplier", "1.1", *USUAL, "--delta", "1e-5")
    assert rc == 0, err
    res = json.loads(out)
    want = dpjax.dpsgd_epsilon(1.1, sampling_prob=256 / 60000, epochs=30, target_delta=1e-5)
    assert res["epsilon"] == want  # the same call: bit for bit
    assert res["sampling_prob"] == 256 / 60000 and res["steps"] == epochs_to_steps(30, 256 / 60000) == 7032
    assert (res["dataset_size"], res["batch_size"], res["epochs"]) == (60000, 256, 30)
    assert res["sampling"] == "poisson" and res["adjacency"] == "add_or_remove"


def test_delta_and_noise_equal_the_python_calls(capsys):
    rc, out, err = _run(capsys, "delta", "--noise-multiplier", "1.1", *USUAL, "--epsilon", "2")
    assert rc == 0, err
    res = json.loads(out)
    # The command's delta is the accountant's bracket (dpjax delta always reports its lower end
    # too; dpjax.dpsgd_delta computes the upper end alone, on a program that may differ in the
    # last digits), at the steps of the epochs rule.
    assert res["steps"] == 7032
    assert res["delta"] == pld.dpsgd_accounting(1.1, 256 / 60000, 7032, target_epsilon=2.0).delta
    assert res["delta"] == pytest.approx(dpjax.dpsgd_delta(1.1, 256 / 60000, epochs=30, target_epsilon=2.0), rel=1e-5)
    rc, out, err = _run(capsys, "noise", *USUAL, "--epsilon", "2", "--delta", "1e-5")
    assert rc == 0, err
    res = json.loads(out)
    assert res["noise_multiplier"] == dpjax.dpsgd_noise_multiplier(sampling_prob=256 / 60000, epochs=30,
                                                                   target_epsilon=2.0, target_delta=1e-5)
    assert res["steps"] == 7032 and res["dataset_size"] == 60000


def test_random_allocation_counts_full_batches(capsys):
    # 60000 / 256 = 234.375: 234 full batches per epoch (the loader's 235th holds 96 examples).
    rc, out, err = _run(capsys, "epsilon", "--noise-multiplier", "1.1", *USUAL, "--delta", "1e-5",
                        "--sampling", "random_allocation")
    assert rc == 0, err
    res = json.loads(out)
    assert res["batches_per_epoch"] == 234 and res["epochs"] == 30
    assert res["epsilon"] == dpjax.dpsgd_epsilon(1.1, target_delta=1e-5, sampling=dpjax.RandomAllocation(234), epochs=30)


def test_floor_never_understates_epsilon(capsys):
    # N = 1000, B = 300: three full batches and one of 100.  The rule accounts three equally
    # likely batches; four (ceil) would claim more amplification than the loader gives: the
    # example is in the small batch with probability 0.1, not 0.25.
    rc, out, err = _run(capsys, "epsilon", "--noise-multiplier", "1", "--dataset-size", "1000", "--batch-size", "300",
                        "--epochs", "2", "--delta", "1e-5", "--sampling", "random_allocation")
    assert rc == 0, err
    res = json.loads(out)
    assert res["batches_per_epoch"] == 3
    kw = dict(target_delta=1e-5, epochs=2)
    floor_eps = dpjax.dpsgd_epsilon(1.0, sampling=dpjax.RandomAllocation(3), **kw)
    ceil_eps = dpjax.dpsgd_epsilon(1.0, sampling=dpjax.RandomAllocation(4), **kw)
    assert res["epsilon"] == floor_eps
    # Far apart (a quarter of the steps fewer), so the comparison does not rest on the
    # accountant's 1e-3 relative discretization.
    assert floor_eps > 1.05 * ceil_eps


def test_balls_in_bins_and_its_noise(capsys):
    rc, out, err = _run(capsys, "delta", "--noise-multiplier", "2", "--dataset-size", "1000", "--batch-size", "300",
                        "--epochs", "2", "--epsilon", "1", "--sampling", "balls_in_bins")
    assert rc == 0, err
    res = json.loads(out)
    assert res["batches_per_epoch"] == 3
    assert res["delta"] == dpjax.dpsgd_delta(2.0, target_epsilon=1.0, sampling=dpjax.BallsInBins(3), epochs=2)
    rc, out, err = _run(capsys, "noise", "--dataset-size", "1000", "--batch-size", "300", "--epochs", "2",
                        "--epsilon", "2", "--delta", "1e-5", "--sampling", "random_allocation")
    assert rc == 0, err
    assert json.loads(out)["noise_multiplier"] == dpjax.dpsgd_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sampling=dpjax.RandomAllocation(3), epochs=2)


def test_fixed_batch_epochs_use_the_same_rule(capsys):
    rc, out, err = _run(capsys, "epsilon", "--noise-multiplier", "2", "--dataset-size", "1000", "--batch-size", "30",
                        "--epochs", "3", "--delta", "1e-5", "--sampling", "fixed_batch")
    assert rc == 0, err
    res = json.loads(out)
    assert res["steps"] == epochs_to_steps(3, 30 / 1000) == 100 and res["adjacency"] == "replace"
    assert res["epsilon"] == dpjax.dpsgd_epsilon(2.0, None, epochs=3, target_delta=1e-5, sampling=dpjax.FixedBatch(30, 1000))


def test_epochs_with_sampling_prob(capsys):
    rc, out, err = _run(capsys, "epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.07", "--epochs", "7",
                        "--delta", "1e-5")
    assert rc == 0, err
    res = json.loads(out)
    assert res["steps"] == 100  # 7 / 0.07 is 99.99999999999999 in binary: the rule's 100
    assert res["epsilon"] == dpjax.dpsgd_epsilon(1.0, 0.07, epochs=7, target_delta=1e-5)


@pytest.mark.parametrize("command,target", [("epsilon", ["--delta", "1e-5"]), ("delta", ["--epsilon", "1"]),
                                            ("noise", ["--epsilon", "1", "--delta", "1e-5"])])
@pytest.mark.parametrize("extra,names", [
    (["--dataset-size", "100", "--batch-size", "10", "--epochs", "2", "--steps", "20"], ["--steps", "--epochs"]),
    (["--sampling-prob", "0.01", "--epochs", "2", "--steps", "200"], ["--steps", "--epochs"]),
    (["--dataset-size", "100", "--batch-size", "10", "--sampling-prob", "0.1", "--steps", "5"],
     ["--sampling-prob", "--batch-size"]),
    (["--dataset-size", "100", "--batch-size", "10", "--batches-per-epoch", "10", "--epochs", "2",
      "--sampling", "random_allocation"], ["--batches-per-epoch", "--batch-size"]),
    (["--batch-size", "10", "--epochs", "2"], ["--dataset-size", "--batch-size"]),
    (["--dataset-size", "10", "--batch-size", "20", "--epochs", "2"], ["--batch-size", "--dataset-size"]),
    (["--epochs", "2"], ["--epochs", "--sampling-prob"]),
    (["--sampling-prob", "0.1", "--batches-per-epoch", "10", "--epochs", "2", "--sampling", "balls_in_bins"],
     ["--sampling-prob"]),
    (["--dataset-size", "100", "--batch-size", "10", "--epochs", "2", "--selections-per-epoch", "2",
      "--sampling", "random_allocation"], ["--selections-per-epoch"]),
])
def test_mixed_descriptions_name_both_options(capsys, command, target, extra, names):
    argv = [command] + (["--noise-multiplier", "1"] if command != "noise" else []) + target + extra
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
