"""examples/train_dpftrl.py runs end to end (slow tier)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_dpftrl_quick_reports_accuracy_and_certified_privacy():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_dpftrl.py"), "--quick", "--json"],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    target_delta = out["settings"]["target_delta"]
    assert set(out["runs"]) == {"DP-SGD (C = I)", "DP-FTRL (BLT)"}
    for name, r in out["runs"].items():
        # Same certified (eps, delta) for both runs: EVR certificate + truncation term <= target.
        assert r["epsilon"] == out["settings"]["target_epsilon"]
        assert 0 < r["delta"] <= target_delta, (name, r)
        assert r["truncation_delta"] < 1e-6
        # Trained: well above chance (balanced synthetic classes), below the non-private run + noise.
        assert 0.6 < r["test_accuracy"] <= 1.0, (name, r)
    assert out["non_private_accuracy"] > 0.8
