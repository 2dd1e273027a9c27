"""Privacy reports (:mod:`dpjax.report`, ``dpjax report``): the trade-off curves are upper bounds
on an attack's power, exact for Gaussian compositions, at or above an independent lower bound
from dp_accounting's optimistic PLD for Poisson DP-SGD; epsilon equals the public calls; the
command equals the library; ``--plot`` writes a figure or names the missing extra."""

from __future__ import annotations

import json
import logging
import math
import sys

import numpy as np
import pytest
from scipy.special import ndtr, ndtri

import dpjax
from dpjax import pld
from dpjax.cli.main import main
from dpjax.report import PrivacyReport, dpsgd_privacy_report, privacy_report

# FPR from 1e-6 to 0.5, 10 per decade.
FPR = np.logspace(-6, np.log10(0.5), 58)


def _gaussian_tpr(fpr, mu):
    """The exact power of the most powerful test against the Gaussian pair at ``mu``
    (Dong, Roth and Su, "Gaussian differential privacy"): ``Phi(Phi^-1(FPR) + mu)``."""
    return ndtr(ndtri(np.asarray(fpr)) + mu)


# T-fold compositions of Gaussians: mu = sqrt(sum_i T_i / sigma_i^2); small to large mu.
GAUSSIANS = [
    ([(pld.Gaussian(10.0), 1)], 0.1),
    ([(pld.Gaussian(1.0), 1)], 1.0),
    ([(pld.Gaussian(5.0), 100)], 2.0),
    ([(pld.Gaussian(2.0), 3), (pld.Gaussian(1.0), 2)], math.sqrt(3 / 4 + 2)),
    ([(pld.Gaussian(3.0), 225)], 5.0),
]


@pytest.mark.parametrize("components,mu", GAUSSIANS)
def test_gaussian_curve_is_exact_and_never_below(components, mu):
    rep = privacy_report(components, fpr=FPR)
    exact = _gaussian_tpr(FPR, mu)
    for tpr in (rep.tpr_remove, rep.tpr_add):
        dev = tpr - exact
        # Never below: the lines come from a delta above the closed form (by its 1e-9 relative
        # allowance) and the 1e-14 rounding allowance exceeds the oracle's float64 rounding.
        assert dev.min() >= 0.0, (mu, FPR[dev.argmin()], dev.min())
        assert dev.max() <= 1e-6, (mu, FPR[dev.argmax()], dev.max())
    # The symmetric pair: the two tests have the same curve.
    np.testing.assert_array_equal(rep.tpr_remove, rep.tpr_add)
    # gdp_mu: at least the true mu (up to ndtri's rounding) and close to it.
    assert mu * (1 - 1e-12) <= rep.gdp_mu <= mu * (1 + 1e-6)
    assert list(rep.epsilon) == [float(pld.epsilon(components, d).epsilon) for d in rep.target_delta]


def test_dpsgd_with_every_example_sampled_is_the_gaussian():
    # q = 1: T Gaussian steps, one Gaussian with mu = sqrt(T) / sigma (the closed form).
    rep = dpsgd_privacy_report(4.0, 1.0, 16, fpr=FPR)
    assert rep.adjacency == "add_or_remove"
    exact = _gaussian_tpr(FPR, 1.0)
    assert np.all(rep.tpr_remove >= exact) and np.max(rep.tpr_remove - exact) <= 1e-6


def _hockey_stick_at_atoms(pmf, eps_max):
    """``(eps, delta(eps))`` of a dp_accounting PMF at its loss atoms ``k * interval`` in
    ``[0, eps_max]``: ``delta(eps) = P(inf) + sum_{loss > eps} p (1 - e^{eps - loss})``, the formula
    of ``get_delta_for_epsilon``, with suffix sums (its loop over the ~5e5 atoms is slow)."""
    interval, lower, probs = pmf._discretization, pmf._lower_loss, np.asarray(pmf._probs, np.float64)
    index = np.arange(probs.size) + lower                   # loss = index * interval
    keep = index > 0
    index, probs = index[keep], probs[keep]
    k_max = int(eps_max / interval)
    mass = np.zeros(k_max + 2)
    weighted = np.zeros(k_max + 2)
    # Atoms beyond eps_max count in every suffix: fold them into the last bin.
    np.add.at(mass, np.minimum(index, k_max + 1), probs)
    np.add.at(weighted, np.minimum(index, k_max + 1), probs * np.exp(-index * interval))
    above_mass = np.cumsum(mass[::-1])[::-1]                # sum over index >= k
    above_weighted = np.cumsum(weighted[::-1])[::-1]
    k = np.arange(k_max + 1)
    eps = k * interval
    delta = pmf._infinity_mass + above_mass[k + 1] - np.exp(eps) * above_weighted[k + 1]  # index > k
    return eps, delta


def _dp_accounting_lower_curves(sigma, q, steps, fpr, eps_max, interval=1e-4):
    """Lower bounds on the power of both tests, independent of dpjax: dp_accounting's optimistic
    PLD (pessimistic_estimate=False: delta from below in each direction) and the same lines at
    every loss atom up to ``eps_max``.  The optimistic PMF sits on multiples of ``interval``, and
    between two atoms each line is monotone in eps, so the atoms give the supremum of the lines
    of the discrete pair; a lower delta gives a higher type II error, so the curve is at or
    below the true power (at FPRs whose best eps is below ``eps_max``)."""
    from dp_accounting.pld import privacy_loss_distribution as pldm

    logging.disable(logging.WARNING)  # "Connect-the-Dots does not support pessimistic_estimate=False"
    try:
        pair = pldm.from_gaussian_mechanism(sigma, sampling_prob=q, pessimistic_estimate=False,
                                            value_discretization_interval=interval,
                                            use_connect_dots=False).self_compose(steps)
    finally:
        logging.disable(logging.NOTSET)
    # dp_accounting's remove direction is (mixture || base), dpjax's too (docs/design.md section 1).
    eps, d_rem = _hockey_stick_at_atoms(pair._pmf_remove, eps_max)
    _, d_add = _hockey_stick_at_atoms(pair._pmf_add, eps_max)
    # The suffix sums are dp_accounting's own delta (checked on the last unit of eps, where its
    # loop is short).
    top = eps >= eps[-1] - 1.0
    for pmf, d in ((pair._pmf_remove, d_rem), (pair._pmf_add, d_add)):
        np.testing.assert_allclose(d[top], pmf.get_delta_for_epsilon(eps[top]), rtol=1e-9, atol=1e-15)
    alpha = np.asarray(fpr)
    curves = []
    for d_self, d_other in ((d_rem, d_add), (d_add, d_rem)):
        steep = (1 - d_self[:, None] - np.exp(eps)[:, None] * alpha[None, :]).max(axis=0)
        flat = (np.exp(-eps)[:, None] * (1 - d_other[:, None] - alpha[None, :])).max(axis=0)
        curves.append(1 - np.maximum(np.maximum(steep, flat), 0.0))
    return curves, (eps, d_rem, d_add)


@pytest.mark.parametrize("sigma,q,steps", [(0.8, 0.05, 200), (0.5, 0.5, 3)])
def test_poisson_curves_are_at_or_above_dp_accounting_lower_bound(sigma, q, steps):
    pytest.importorskip("dp_accounting")
    rep = dpsgd_privacy_report(sigma, q, steps)
    # Lines up to one past the largest reported epsilon (delta 1e-10): further out none is better
    # at these FPRs (the argument of dpjax.report's "Which eps").
    (low_remove, low_add), (eps, d_rem, d_add) = _dp_accounting_lower_curves(sigma, q, steps, rep.fpr,
                                                                             eps_max=max(rep.epsilon) + 1)
    for ours, low in ((rep.tpr_remove, low_remove), (rep.tpr_add, low_add)):
        margin = ours - low
        # At or above (1e-10: the float64 rounding of the oracle's suffix sums over ~5e5 atoms,
        # at most about 5e5 * 2^-53).
        assert margin.min() >= -1e-10, (rep.fpr[margin.argmin()], margin.min())
        # And close: the optimistic PMF rounds each step's loss down by up to 1e-4, which moves
        # the composed curve by about steps * 1e-4 in loss (a few 1e-3 in power here).
        assert margin.max() <= 5e-3, (rep.fpr[margin.argmax()], margin.max())
    # The test can fail: the add test's curve from the add direction's delta alone (the usual
    # conversion of a symmetric guarantee) is not a bound; it falls below the lower bound.
    alpha = rep.fpr
    res = pld.dpsgd_accounting(sigma, q, steps, target_epsilon=eps[::50])
    d = {r.direction: np.asarray(r.upper) for r in res.directions}["add"]
    e = eps[::50][:, None]
    naive = 1 - np.maximum(np.maximum((1 - d[:, None] - np.exp(e) * alpha).max(0),
                                      (np.exp(-e) * (1 - d[:, None] - alpha)).max(0)), 0.0)
    assert (naive - low_add).min() < -1e-3


def test_epsilon_entries_equal_their_public_calls_and_round_trip():
    q = 256 / 60000
    rep = dpsgd_privacy_report(1.1, q, epochs=30, target_delta=[1e-5, 1e-8])
    assert list(rep.epsilon) == [dpjax.dpsgd_epsilon(1.1, sampling_prob=q, epochs=30, target_delta=d)
                                 for d in (1e-5, 1e-8)]
    assert rep.adjacency == "add_or_remove" and rep.num_lines > 257
    # A trade-off curve's power: at least the FPR (a coin flip achieves it), increasing, <= 1.
    for tpr in (rep.tpr_remove, rep.tpr_add):
        assert np.all(tpr >= rep.fpr) and np.all(np.diff(tpr) > 0) and np.all(tpr <= 1.0)
    back = PrivacyReport.load(rep.to_json())
    for name in ("target_delta", "epsilon", "fpr", "tpr_remove", "tpr_add"):
        np.testing.assert_array_equal(getattr(back, name), getattr(rep, name))
    assert back.gdp_mu == rep.gdp_mu and back.adjacency == rep.adjacency and back.num_lines == rep.num_lines


def test_replace_adjacency_has_one_curve():
    rep = dpsgd_privacy_report(2.0, None, 100, sampling=dpjax.FixedBatch(10, 1000), target_delta=1e-5)
    assert rep.adjacency == "replace"
    np.testing.assert_array_equal(rep.tpr_remove, rep.tpr_add)
    assert rep.epsilon[0] == dpjax.dpsgd_epsilon(2.0, None, 100, 1e-5, sampling=dpjax.FixedBatch(10, 1000))


@pytest.mark.parametrize("kwargs,name", [
    (dict(fpr=[0.0, 0.1]), "fpr"), (dict(fpr=[0.1, 1.0]), "fpr"), (dict(fpr=[[0.1]]), "fpr"),
    (dict(target_delta=1.0), "target_delta"), (dict(target_delta=[1e-5, -1.0]), "target_delta"),
])
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpsgd_privacy_report(1.0, 0.01, 10, **kwargs)


def test_noise_multiplier_must_be_a_scalar():
    with pytest.raises(ValueError, match="noise_multiplier"):
        dpsgd_privacy_report([1.0, 2.0], 0.01, 10)


def _cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_report_is_the_library_report(capsys):
    argv = ["report", "--noise-multiplier", "1.1", "--dataset-size", "60000", "--batch-size", "256", "--epochs", "30",
            "--delta", "1e-5,1e-6", "--fpr", "1e-5,1e-3,0.1,0.5"]
    rc, out, err = _cli(capsys, *argv, "--json")
    assert rc == 0, err
    res = json.loads(out)
    rep = dpsgd_privacy_report(1.1, 256 / 60000, epochs=30, target_delta=[1e-5, 1e-6], fpr=[1e-5, 1e-3, 0.1, 0.5])
    assert res["epsilon"] == list(rep.epsilon) and res["target_delta"] == [1e-5, 1e-6]
    assert res["tpr_remove"] == list(rep.tpr_remove) and res["tpr_add"] == list(rep.tpr_add)
    assert res["gdp_mu"] == rep.gdp_mu and res["fpr"] == [1e-5, 1e-3, 0.1, 0.5]
    assert res["steps"] == 7032 and res["dataset_size"] == 60000 and res["adjacency"] == "add_or_remove"
    rc, out, err = _cli(capsys, *argv)
    assert rc == 0, err
    assert "tpr_remove" in out and "gdp_mu" in out and f"{rep.epsilon[0]:.6g}" in out


def test_cli_report_random_allocation(capsys):
    rc, out, err = _cli(capsys, "report", "--noise-multiplier", "1", "--sampling", "random_allocation",
                        "--dataset-size", "1000", "--batch-size", "300", "--epochs", "2", "--delta", "1e-5",
                        "--fpr", "1e-4,0.1", "--json")
    assert rc == 0, err
    res = json.loads(out)
    rep = dpsgd_privacy_report(1.0, sampling=dpjax.RandomAllocation(3), epochs=2, target_delta=1e-5, fpr=[1e-4, 0.1])
    assert res["batches_per_epoch"] == 3
    assert res["epsilon"] == list(rep.epsilon) and res["tpr_remove"] == list(rep.tpr_remove)


CHEAP = ["report", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "10", "--delta", "1e-5",
         "--fpr", "1e-3,0.1"]


def test_plot_without_matplotlib_names_the_option_and_the_extra(capsys, monkeypatch, tmp_path):
    # None in sys.modules makes the import fail, as if matplotlib were not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    rc, out, err = _cli(capsys, *CHEAP, "--plot", str(tmp_path / "r.png"))
    assert rc == 2 and out == ""
    assert "--plot" in err and "dpjax[plot]" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.png").exists()


@pytest.mark.parametrize("extra", [["--plot", "r.txt"], ["--plot", "r.png", "--noise-multiplier", "1,2"]])
def test_plot_refusals_name_the_option(capsys, tmp_path, extra):
    argv = [a if a not in ("r.txt", "r.png") else str(tmp_path / a) for a in extra]
    rc, out, err = _cli(capsys, *CHEAP, *argv)
    assert rc == 2 and "--plot" in err and len(err.strip().splitlines()) == 1


def test_plot_writes_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "report.png"
    rc, out, err = _cli(capsys, *CHEAP, "--plot", str(path), "--json")
    assert rc == 0, err
    assert json.loads(out)["plot"] == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("sigma,q,steps,interval", [(1.0, 0.01, 1000, 1e-5), (1.1, 256 / 60000, 7032, 1e-5),
                                                    (2.0, 0.2, 50, 1e-4)])
def test_poisson_curves_against_dp_accounting_more_configurations(sigma, q, steps, interval):
    pytest.importorskip("dp_accounting")
    rep = dpsgd_privacy_report(sigma, q, steps)
    (low_remove, low_add), _ = _dp_accounting_lower_curves(sigma, q, steps, rep.fpr, eps_max=max(rep.epsilon) + 1,
                                                           interval=interval)
    for ours, low in ((rep.tpr_remove, low_remove), (rep.tpr_add, low_add)):
        assert (ours - low).min() >= -1e-10
        # The optimistic curve moves by about steps * interval in loss (up to 0.07 here).
        assert (ours - low).max() <= 0.03


@pytest.mark.slow
@pytest.mark.parametrize("mu", [0.05, 0.3, 0.7, 1.5, 3.0, 4.0, 7.0, 10.0])
def test_gaussian_curve_dense(mu):
    fpr = np.logspace(-6, np.log10(0.5), 400)
    rep = privacy_report([(pld.Gaussian(1.0 / mu), 1)], fpr=fpr)
    exact = _gaussian_tpr(fpr, mu)
    for tpr in (rep.tpr_remove, rep.tpr_add):
        assert (tpr - exact).min() >= 0.0 and (tpr - exact).max() <= 1e-6
