"""Eager DP-SGD queries, host sweeps and the CLI's one-shot query never import JAX.

Importing JAX costs about a second of a process (more than answering most queries on the host),
so the host path keeps it out (``dpjax._base``: lazy modules, pytrees registered when JAX is
imported, a float64 scope entered on first JAX use).  One child interpreter runs every such
call with JAX's import made to fail, and this process (JAX imported) checks each value bit for
bit.  The same child then imports JAX and checks that dpjax's records are pytrees and that a
float64 function using JAX inside still computes in float64.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import dpjax

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r'''
import json, sys

class _NoJax:
    def find_spec(self, name, path=None, target=None):
        if name == "jax" or name.startswith(("jax.", "jaxlib")):
            raise ImportError("this test forbids importing " + name)
        return None

blocker = _NoJax()
sys.meta_path.insert(0, blocker)
import contextlib, io
import numpy as np
import dpjax
from dpjax.cli.main import main

out = {}
out["poisson"] = dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)
out["fixed_batch"] = dpjax.dpsgd_epsilon(1.0, None, 1000, 1e-5, sampling=dpjax.FixedBatch(100, 10000))
out["group"] = dpjax.dpsgd_epsilon(2.0, 0.01, 1000, 1e-5, group_size=2)
out["delta"] = dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0)
out["sigma"] = dpjax.dpsgd_noise_multiplier(sampling_prob=0.01, steps=1000, target_epsilon=2.0, target_delta=1e-5)
out["array"] = [float(v) for v in dpjax.dpsgd_epsilon(np.array([1.0, 1.5]), 0.01, 1000, 1e-5)]
out["curve"] = [float(v) for v in dpjax.epsilon_curve(1.0, 0.01, [10, 1000], 1e-5).epsilon]
table = dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[1.0, 2.0], sampling_prob=[0.01], steps=[100], delta=[1e-5]))
out["sweep"] = [row["epsilon"] for row in table.rows]
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "1000",
               "--delta", "1e-5", "--json"])
out["cli"] = json.loads(buf.getvalue())["epsilon"] if rc == 0 else rc
out["jax_imported"] = "jax" in sys.modules

# JAX arrives later: records become pytrees, and a float64 function that uses JAX inside runs
# in float64 though the process never enabled x64.
sys.meta_path.remove(blocker)
from dpjax.pld.mechanisms import PoissonSubsampledGaussian
from dpjax.numerics.exact import gaussian_delta
mech = PoissonSubsampledGaussian(np.array([1.5]), np.array([0.25]))
value = gaussian_delta(1.0, 0.5)
out["float64_inside"] = str(np.asarray(value).dtype)
out["float64_value"] = float(value)
import jax
out["x64_after"] = bool(jax.config.jax_enable_x64)
out["leaves"] = [float(np.asarray(x)[0]) for x in jax.tree_util.tree_leaves(mech)]
out["jit"] = float(jax.jit(lambda m: m.noise_multiplier[0] * 2.0)(mech))
print(json.dumps({k: (v.hex() if isinstance(v, float) else [x.hex() for x in v] if isinstance(v, list) else v)
                  for k, v in out.items()}))
'''


@pytest.fixture(scope="module")
def child(tmp_path_factory) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DPJAX_COMPILATION_CACHE"] = str(tmp_path_factory.mktemp("store"))
    env["DPJAX_PROGRESS"] = "0"
    env.pop("JAX_ENABLE_X64", None)
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    raw = json.loads(res.stdout.strip().splitlines()[-1])
    return {k: (float.fromhex(v) if isinstance(v, str) and v.startswith(("0x", "-0x", "inf"))
                else [float.fromhex(x) for x in v] if isinstance(v, list) and v and isinstance(v[0], str)
                else v) for k, v in raw.items()}


def test_queries_ran_without_importing_jax(child):
    assert child["jax_imported"] is False


def test_values_equal_the_calls_with_jax_imported(child):
    expect = {
        "poisson": dpjax.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5),
        "fixed_batch": dpjax.dpsgd_epsilon(1.0, None, 1000, 1e-5, sampling=dpjax.FixedBatch(100, 10000)),
        "group": dpjax.dpsgd_epsilon(2.0, 0.01, 1000, 1e-5, group_size=2),
        "delta": dpjax.dpsgd_delta(1.0, 0.01, 1000, 2.0),
        "sigma": dpjax.dpsgd_noise_multiplier(sampling_prob=0.01, steps=1000, target_epsilon=2.0,
                                              target_delta=1e-5),
        "array": [float(v) for v in dpjax.dpsgd_epsilon(np.array([1.0, 1.5]), 0.01, 1000, 1e-5)],
        "curve": [float(v) for v in dpjax.epsilon_curve(1.0, 0.01, [10, 1000], 1e-5).epsilon],
        "sweep": [r["epsilon"] for r in dpjax.sweep(dpjax.sweep_grid(noise_multiplier=[1.0, 2.0], sampling_prob=[0.01], steps=[100], delta=[1e-5]), progress=False).rows],
    }
    for key, value in expect.items():
        assert child[key] == (float(value) if not isinstance(value, list) else value), key
    # The CLI's one-shot query prints the Python call's value.
    assert child["cli"] == float(expect["poisson"])


def test_records_become_pytrees_when_jax_is_imported_later(child):
    assert child["leaves"] == [1.5, 0.25]
    assert child["jit"] == 3.0


def test_float64_scope_entered_at_first_jax_use(child):
    from dpjax.numerics.exact import gaussian_delta

    assert child["float64_inside"] == "float64"
    assert child["float64_value"] == float(gaussian_delta(1.0, 0.5))
    assert child["x64_after"] is False  # the scope ended with the call


def test_host_tree_flatten_matches_jax():
    """Before JAX is imported the host program flattens dpjax's records itself: the same leaves,
    in the same order, and the same record back."""
    import jax

    from dpjax._base import ops
    from dpjax.pld.mechanisms import Gaussian, PoissonSubsampledGaussian
    from dpjax.pld.mog import GroupSubsampledGaussian, MixtureOfGaussians

    records = [
        PoissonSubsampledGaussian(np.array([1.5, 2.0]), np.array([0.25, 0.5])),
        Gaussian(np.array([0.7])),
        MixtureOfGaussians(np.array([1.2]), (0.0, 1.0, 2.0), (0.5, 0.3, 0.2)),
        GroupSubsampledGaussian(noise_multiplier=np.ones(1), group_size=np.full(1, 2.0),
                                sampling_prob=np.full(1, 0.01), dataset_size=np.zeros(1), batch_size=np.zeros(1),
                                sampling="poisson", num_components=3),
        {"b": (1.0, None, [2.0]), "a": np.arange(2.0)},
    ]
    for rec in records:
        leaves, structure = ops.host_tree_flatten(rec)
        jax_leaves, jax_structure = jax.tree_util.tree_flatten(rec)
        assert len(leaves) == len(jax_leaves)
        assert all(a is b for a, b in zip(leaves, jax_leaves))
        back = ops.tree_unflatten(structure, leaves)
        assert jax.tree_util.tree_structure(back) == jax_structure
        assert ops.host_tree_flatten(back)[1] == structure
        assert repr(structure) == repr(ops.host_tree_flatten(back)[1])
