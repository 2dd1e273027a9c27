"""``dpjax epsilon --group-size K [--sampling fixed_batch --dataset-size N --batch-size B] --json``."""

from __future__ import annotations

import json

import pytest

import dpjax

from dpjax.cli.main import main
from dpjax.group import group_epsilon


def _run(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow  # 20-45 s on 2 cores; moved to the slow tier to keep the default suite near 10 min
def test_cli_group_poisson_and_fixed_batch(capsys):
    # sigma = 2, q = 0.01, T = 2000, k = 4: the C_*_s2_k4 rows (programs shared with test_group).
    base = ["epsilon", "--noise-multiplier", "2", "--steps", "2000", "--delta", "1e-5", "--group-size", "4", "--json"]
    rc, out, _ = _run(capsys, base + ["--sampling-prob", "0.01"])
    assert rc == 0
    res = json.loads(out)
    assert res["epsilon"] == group_epsilon(2.0, 0.01, 2000, 1e-5, group_size=4)
    assert res["group_size"] == 4 and res["sampling"] == "poisson" and res["adjacency"] == "add_or_remove"
    assert res["epsilon_lower"] <= res["epsilon"] == res["epsilon_upper"]
    rc, out, _ = _run(capsys, base + ["--sampling", "fixed_batch", "--dataset-size", "50000", "--batch-size", "500"])
    assert rc == 0
    res = json.loads(out)
    want = group_epsilon(2.0, None, 2000, 1e-5, group_size=4, sampling=dpjax.FixedBatch(500, 50_000))
    assert res["epsilon"] == want and res["adjacency"] == "replace"
    # The row C_fixed_s1_k4 is this run (noise std = --noise-multiplier 2): 13.0999, not the
    # 4.25 of the old doubled-noise reading.
    assert res["epsilon"] == pytest.approx(13.09985, rel=5e-3)


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--sampling-prob", "0.01", "--group-size", "0"], "group_size"),
        (["--sampling-prob", "0.01", "--group-size", "2.5"], "group_size"),
        (["--sampling-prob", "0.01", "--sampling", "shuffle"], "sampling"),
        (["--sampling", "fixed_batch", "--dataset-size", "100", "--batch-size", "200"], "batch_size"),
        (["--sampling", "fixed_batch", "--batch-size", "20"], "dataset_size"),
        (["--sampling", "fixed_batch", "--dataset-size", "100", "--batch-size", "3", "--group-size", "4"], "group_size"),
        ([], "sampling-prob"),
    ],
)
def test_cli_group_bad_input_exits_2_with_one_line(capsys, extra, needle):
    argv = ["epsilon", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", "--json"] + extra
    rc, out, err = _run(capsys, argv)
    assert rc == 2 and out == ""
    assert needle.replace("-", "_") in err.replace("-", "_") and "Traceback" not in err
