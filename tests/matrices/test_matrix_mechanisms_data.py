"""Slow tier: the reduced grid of notebooks/matrix_mechanisms_data.py (Figs. 2 and 3(a))."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


@pytest.mark.slow
def test_reduced_grid(tmp_path):
    pytest.importorskip("jax_privacy")
    out = tmp_path / "mm.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "notebooks", "matrix_mechanisms_data.py"),
                    "--reduced", "--samples", str(1 << 17), "--out", str(out)], check=True, cwd=ROOT,
                   timeout=3000)
    data = json.loads(out.read_text())
    assert data["n"] == 64 and set(data) >= {"fig2a", "fig2b", "fig3a"}
    for fig in ("fig2a", "fig2b"):
        d = data[fig]
        # Balls-in-bins never does worse than no amplification (the unamplified Gaussian
        # dominates the balls-in-bins mixture); the MC estimate at 2^17 samples keeps a margin.
        assert all(bib < un for bib, un in zip(d["balls_in_bins"], d["unamplified"]))
    # C = I: Poisson sampling (q = 1/b, n steps) beats E deterministic participations (Fig. 2(a)).
    assert all(p < un for p, un in zip(data["fig2a"]["poisson"], data["fig2a"]["unamplified"]))
    assert sorted(map(int, data["fig3a"])) == [1, 2, 4, 8, 16, 32, 64]
