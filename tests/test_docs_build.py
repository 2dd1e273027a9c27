"""The API reference builds from the docstrings: ``mkdocs build --strict`` with mkdocstrings.

Strict mode turns every warning into a failure: a docstring griffe cannot parse, a broken
cross-reference, a page missing from the navigation.  The build writes into a temporary
directory, and the test checks that the reference pages hold the public API (an empty page
also builds without a warning).  It runs in the slow tier (``pytest -m slow``): the build takes
a core for tens of seconds, and the default tier keeps to the code's own tests.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One public name per API page: each must come out as an anchor of its page.
EXPECTED = {
    "pld": ["dpjax.pld.dpsgd_epsilon", "dpjax.pld.GridOptions", "dpjax.pld.sweep",
            "dpjax.pld.allocation.accountant.allocation_accounting", "dpjax.pld.allocation.dpsgd.query"],
    "group": ["dpjax.group.group_dpsgd_epsilon", "dpjax.group.Sampling"],
    "report": ["dpjax.report.dpsgd_privacy_report", "dpjax.report.PrivacyReport"],
    "baselines": ["dpjax.baselines.rdp_epsilon"],
    "montecarlo": ["dpjax.montecarlo.BallsInBins", "dpjax.montecarlo.Certificate"],
    "matrices": ["dpjax.matrices.BLT", "dpjax.matrices.Toeplitz"],
    "calibration": ["dpjax.calibration.pld.dpsgd_noise_multiplier", "dpjax.calibration.root.solve_monotone_root"],
    "optimization": ["dpjax.optimization.optimize_correlation", "dpjax.optimization.make_parameterization"],
    "sampling": ["dpjax.sampling.BallsInBinsSampler"],
    "noise": ["dpjax.noise.blt_noise"],
    "interop": ["dpjax.interop.dp_accounting.PLDAccountant", "dpjax.interop.opacus.get_noise_multiplier",
                "dpjax.interop.allocation.RandomAllocationDpEvent"],
    "cli": ["dpjax.cli.main.main"],
}


@pytest.mark.slow
def test_api_reference_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page, names in EXPECTED.items():
        html = (site / "api" / page / "index.html").read_text()
        for name in names:
            assert f'id="{name}"' in html, f"{name} missing from the {page} page"
    assert (site / "benchmarks" / "index.html").exists()
    assert (site / "design" / "index.html").exists()
