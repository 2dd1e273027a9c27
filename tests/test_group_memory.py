"""Large groups in bounded memory.

``group_epsilon(2.0, 0.01, 100, 1e-5, group_size=1000)`` used to ask XLA for 51.7 GB and die.
Now mixture components of total weight < 1e-295 are pruned (sound, see
``GroupSubsampledGaussian._components_needed``) and a program whose mixture-CDF evaluation
would exceed ``MAX_MIXTURE_BYTES`` (8 GiB) is refused with a ValueError before allocating.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dpjax
from dpjax.pld.grid import engine
from dpjax.pld.mog import GroupSubsampledGaussian

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pruning_keeps_what_matters():
    # Binomial(1000, 0.01): P(X > 511) < 1e-295, so 512 padded components suffice.
    assert GroupSubsampledGaussian(2.0, 1000, sampling_prob=0.01).num_components == 512
    assert GroupSubsampledGaussian(2.0, 100000, sampling_prob=0.01).num_components == 4096
    # Nothing to prune: every component of Binomial(1000, 1) ... up to j = k is kept.
    assert GroupSubsampledGaussian(2.0, 1000, sampling_prob=1.0).num_components == 1024
    # Small groups are unchanged (k + 1 padded to a power of two).
    assert GroupSubsampledGaussian(1.0, 8, sampling_prob=0.01).num_components == 16


@pytest.mark.slow
def test_pruning_changes_no_number():
    # Pruned (default) vs every component kept: the same certified epsilon (the dropped weight,
    # < 1e-295, is below the grid's flush threshold).
    full = [(GroupSubsampledGaussian(20.0, 300, sampling_prob=0.01, num_components=512), 20)]
    pruned = [(GroupSubsampledGaussian(20.0, 300, sampling_prob=0.01), 20)]
    assert pruned[0][0].num_components == 256
    a = dpjax.pld.epsilon(full, 1e-5)
    b = dpjax.pld.epsilon(pruned, 1e-5)
    assert b.epsilon == pytest.approx(a.epsilon, rel=1e-9)
    assert b.epsilon_lower == pytest.approx(a.epsilon_lower, rel=1e-9)


def test_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(engine, "MAX_MIXTURE_BYTES", 2**20)
    with pytest.raises(ValueError, match="group_size too large.*GiB"):
        dpjax.group_epsilon(2.0, 0.01, 100, 1e-5, group_size=64)


@pytest.mark.slow
@pytest.mark.parametrize("group_size", [1000, 100000])
def test_large_groups_within_8gb(group_size):
    code = ("import json, resource, dpjax\n"
            "try:\n"
            f"    out = dict(epsilon=float(dpjax.group_epsilon(2.0, 0.01, 100, 1e-5, group_size={group_size})))\n"
            "except ValueError as e:\n"
            "    out = dict(refused=str(e))\n"
            "out['peak_gib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20\n"
            "print(json.dumps(out))\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["peak_gib"] < 8.0, out
    # Either an answer (an upper bound: inf is allowed, it is never below the truth) or a clear refusal.
    assert "epsilon" in out and not np.isnan(out["epsilon"]) or "GiB" in out.get("refused", ""), out
