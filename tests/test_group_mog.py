"""Mixture-of-Gaussians mechanism: loss CDFs, inverse, weights (single step; no composition)."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpjax.pld import PoissonSubsampledGaussian
from dpjax.pld import mog

MOG_IDS = [f"C_{s}_s{sig}_k{k}" for s in ("poisson", "fixed") for sig in (1, 2, 4) for k in (1, 2, 4, 8, 16)]
PAD = 17


def _padded(case):
    p = case["params"]
    c = np.zeros(PAD)
    w = np.zeros(PAD)
    s = np.asarray(p["mog_sensitivities"]) / p["mog_standard_deviation"]
    c[: len(s)] = s
    w[: len(s)] = p["mog_probabilities"]
    return c, w


@jax.jit
def _hockey_sticks(eps, c, w):
    """Single-step (delta_remove, delta_add) from the pure core; vmapped over padded mixtures."""

    def one(c, w):
        out = []
        for direction in ("remove", "add"):
            cd = mog.mog_loss_cdfs(direction, eps, c, w)
            out.append(jnp.maximum(cd.p_gt - jnp.exp(eps) * cd.q_gt, 0.0))
        return jnp.stack(out)

    return jax.vmap(one)(c, w)


def test_single_step_hockey_stick_matches_exact_quadrature(reference_cases):
    """All 30 family-C mixtures at once (one vmapped program over 17-padded vectors) against the
    reference's exact single-step quadrature values (extra.single_step_check_vs_exact_quadrature)."""
    cases = [reference_cases[i] for i in MOG_IDS]
    cw = [_padded(c) for c in cases]
    c = np.stack([x[0] for x in cw])
    w = np.stack([x[1] for x in cw])
    with jax.enable_x64(True):
        eps = jnp.asarray([0.0, 0.5, 2.0])
        got = np.asarray(_hockey_sticks(eps, c, w))
    checked = 0
    for case, g in zip(cases, got):
        for j, row in enumerate(case["extra"]["single_step_check_vs_exact_quadrature"]):
            assert row["epsilon"] == float(eps[j])
            exact = row["exact_remove"]
            if exact > 1e-30:
                # Closed form vs quadrature: 1e-9 relative (measured 3.5e-13; the difference
                # p_gt - e^eps q_gt loses digits only when delta << p_gt).
                assert g[0, j] == pytest.approx(exact, rel=1e-9), case["id"]
                checked += 1
            else:
                # Tiny deltas are dominated by cancellation of O(1e-16 * p_gt); both ~0.
                assert g[0, j] <= 1e-25
            assert abs(g[1, j] - row["exact_add"]) <= 1e-12
    assert checked >= 60


_params_jit = jax.jit(mog.group_mixture_params, static_argnames=("sampling", "num_components"))
_hyper_jit = jax.jit(mog.hypergeometric_log_pmf, static_argnums=3)
_binom_jit = jax.jit(mog.binomial_log_pmf, static_argnums=2)


@jax.enable_x64(True)
def test_reference_mixture_weights(reference_cases):
    for cid in MOG_IDS:
        p = reference_cases[cid]["params"]
        sampling = "poisson" if "poisson" in cid else "fixed_batch"
        # Padded to PAD components (group sizes up to 16): one compiled program per sampling
        # scheme, the first group_size + 1 entries the same bits as unpadded.
        k1 = p["group_size"] + 1
        s, w, sd = _params_jit(
            p["noise_multiplier"], p["group_size"], p.get("sampling_probability"), p["dataset_size"],
            p.get("batch_size"), sampling=sampling, num_components=PAD,
        )
        np.testing.assert_array_equal(np.asarray(s)[:k1], p["mog_sensitivities"])
        assert float(sd) == p["mog_standard_deviation"]
        # 1e-12 relative: both are float64 pmfs (ours via exact products/ratios).
        np.testing.assert_allclose(np.asarray(w)[:k1], p["mog_probabilities"], rtol=1e-12)
        assert np.all(np.asarray(w)[k1:] == 0)   # the padding carries no mass


#: One padding for every weight vector below (the sizes are traced, the padding is static: one
#: compiled program per function), at least the largest group size + 2 as the checks of the
#: zeros beyond the support need.
_WEIGHTS_PAD = 36


@jax.enable_x64(True)
def test_hypergeometric_weights_exact_against_rationals():
    n, b = 50_000, 500
    for k in (1, 2, 7, 16, 33):
        ours = np.exp(np.asarray(_hyper_jit(k, n, b, _WEIGHTS_PAD)))
        exact = [Fraction(math.comb(k, j) * math.comb(n - k, b - j), math.comb(n, b)) for j in range(k + 1)]
        for j, e in enumerate(exact):
            if e > 1e-300:
                # k ulps of round-off from the product/ratio recursion.
                assert abs(float((Fraction(ours[j]) - e) / e)) < 1e-13
        assert np.all(ours[k + 1 :] == 0.0)
    # Small population (support does not start at 0): the gammaln branch.
    from scipy.stats import hypergeom

    ours = np.exp(np.asarray(_hyper_jit(4, 10, 8, _WEIGHTS_PAD)))
    np.testing.assert_allclose(ours, hypergeom.pmf(np.arange(_WEIGHTS_PAD), 10, 4, 8), atol=1e-14)


@jax.enable_x64(True)
def test_binomial_weights():
    from scipy.stats import binom

    for k, q in [(1, 0.01), (16, 0.01), (5, 0.5), (3, 1.0)]:
        ours = np.exp(np.asarray(_binom_jit(k, q, _WEIGHTS_PAD)))
        np.testing.assert_allclose(ours[: k + 1], binom.pmf(np.arange(k + 1), k, q), rtol=1e-12, atol=1e-300)
        assert np.all(ours[k + 1 :] == 0.0)


def test_k1_mixture_is_the_poisson_subsampled_gaussian():
    with jax.enable_x64(True):
        y = jnp.linspace(-0.05, 3.0, 4001)
        a = mog.GroupSubsampledGaussian(1.3, 1.0, sampling_prob=0.02)
        b = PoissonSubsampledGaussian(1.3, 0.02)
        for direction in ("remove", "add"):
            f = jax.jit(lambda m, y, d=direction: m.loss_cdfs(d, y))
            ca, cb = f(a, y), f(b, y)
            for x, z in zip(ca, cb):
                # Same closed form, different inversion (Newton vs log): 1e-12 absolute, and
                # relative 1e-9 in the tails.
                np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=1e-9, atol=1e-12)


mixtures = st.integers(2, 8).flatmap(
    lambda K: st.tuples(
        st.lists(st.floats(0.05, 6.0), min_size=K - 1, max_size=K - 1),
        st.lists(st.floats(1e-6, 1.0), min_size=K, max_size=K),
    )
)


def _mixture(data):
    """Random mixture padded to 8 components (weight 0), so every example reuses one compile."""
    sens, weights = data
    c = np.zeros(8)
    w = np.zeros(8)
    c[1 : len(sens) + 1] = np.sort(sens)
    w[: len(weights)] = np.asarray(weights) / np.sum(weights)
    return jnp.asarray(c), jnp.asarray(w)


@jax.jit
def _inverse_both(y, c, w):
    lw = jnp.log(w)
    fast = mog.mog_inverse_privacy_loss(y, c, lw)
    full = mog.mog_inverse_privacy_loss(y, c, lw, exact=True)
    back = mog.mog_privacy_loss(jnp.where(jnp.isfinite(full), full, 0.0), c, lw)
    return fast, full, back


@given(mixtures)
def test_fast_inverse_matches_full_newton(data):
    with jax.enable_x64(True):
        c, w = _mixture(data)
        y = jnp.concatenate([jnp.log(w[0]) + jnp.logspace(-12, 0, 200), jnp.linspace(-1.0, 60.0, 2000)])
        fast, full, back = (np.asarray(a) for a in _inverse_both(y, c, w))
    finite = np.isfinite(full)
    assert np.array_equal(np.isfinite(fast), finite)
    # Both converge to the root: agreement to float64 round-off (scaled by |z|).
    err = np.abs(fast[finite] - full[finite]) / (1 + np.abs(full[finite]))
    assert err.max() < 1e-12
    # And the root is a root: L(z(y)) = y.
    np.testing.assert_allclose(back[finite], np.asarray(y)[finite], atol=1e-11)


_cdfs_jit = jax.jit(mog.mog_loss_cdfs, static_argnums=0)


@given(mixtures)
def test_loss_cdfs_are_consistent_with_the_likelihood_ratio(data):
    """dQ = e^{-Y} dP for the pair's loss Y: on every bin (y_i, y_{i+1}] the Q-mass lies in
    [e^{-y_{i+1}}, e^{-y_i}] times the P-mass -- a check that the CDFs belong to the stated loss."""
    with jax.enable_x64(True):
        c, w = _mixture(data)
        y = jnp.linspace(-4.0, 8.0, 601)
        for direction in ("remove", "add"):
            cd = _cdfs_jit(direction, y, c, w)
            p_le, p_gt, q_le, q_gt = (np.asarray(a) for a in cd)
            np.testing.assert_allclose(p_le + p_gt, 1.0, atol=1e-14)
            np.testing.assert_allclose(q_le + q_gt, 1.0, atol=1e-14)
            p_bin = np.diff(p_le)
            q_bin = np.diff(q_le)
            yy = np.asarray(y)
            # 1e-13 absolute slack: differences of float64 CDF values.
            assert np.all(q_bin <= np.exp(-yy[:-1]) * p_bin + 1e-13)
            assert np.all(q_bin >= np.exp(-yy[1:]) * p_bin - 1e-13)


def test_padding_does_not_change_the_cdfs():
    with jax.enable_x64(True):
        c = jnp.asarray([0.0, 0.5, 1.0])
        w = jnp.asarray([0.9, 0.09, 0.01])
        # As many points as the likelihood-ratio check's grid: the padded call is its program.
        y = jnp.linspace(-0.2, 4.0, 601)
        a = _cdfs_jit("remove", y, c, w)
        b = _cdfs_jit("remove", y, jnp.concatenate([c, jnp.zeros(5)]), jnp.concatenate([w, jnp.zeros(5)]))
        for x, z in zip(a, b):
            np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=1e-13, atol=1e-16)


def test_mixture_of_gaussians_validation():
    with pytest.raises(ValueError, match="probabilities"):
        mog.MixtureOfGaussians(1.0, sensitivities=(0.0, 1.0), probabilities=(0.5, 0.6)).validate()
    with pytest.raises(ValueError, match="sensitivities"):
        mog.MixtureOfGaussians(1.0, sensitivities=(0.0, -1.0), probabilities=(0.5, 0.5)).validate()
    with pytest.raises(ValueError, match="same length"):
        mog.MixtureOfGaussians(1.0, sensitivities=(0.0, 1.0, 2.0), probabilities=(0.5, 0.5)).validate()
    with pytest.raises(ValueError, match="standard_deviation"):
        mog.MixtureOfGaussians(0.0, sensitivities=(0.0, 1.0), probabilities=(0.5, 0.5)).validate()
    with pytest.raises(ValueError, match="group_size"):
        mog.GroupSubsampledGaussian(1.0, 2.5, sampling_prob=0.1, num_components=4).validate()


def test_composed_mixture_epsilon_matches_dp_accounting():
    # A mixture of Gaussians composed 20 times (sigma 4, sensitivities 0 / 1 / 2 with weights
    # 0.9 / 0.09 / 0.01, a group-of-2 DP-SGD-like step), against dp_accounting's pessimistic PLD
    # at a 1e-4 interval (an upper estimate, about 1e-5 relative above the truth here).  The
    # Gaussian that dominates the mixture, which caps the grid, must use the largest sensitivity:
    # with any other the certified epsilon collapses.
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from dpjax import pld

    mixture = mog.MixtureOfGaussians(4.0, (0.0, 1.0, 2.0), (0.9, 0.09, 0.01))
    ours = pld.epsilon([(mixture, 20)], target_delta=1e-5)
    event = dp_event.SelfComposedDpEvent(dp_event.MixtureOfGaussiansDpEvent(4.0, [0.0, 1.0, 2.0], [0.9, 0.09, 0.01]), 20)
    theirs = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(1e-5)
    assert ours.epsilon_lower <= ours.epsilon
    # Both are pessimistic estimates of the same value: within 3e-3 relative (the interop
    # comparison's tolerance), and ours is not looser than the anchor's.
    assert abs(ours.epsilon - theirs) <= 3e-3 * theirs, (ours.epsilon, theirs)
    assert ours.epsilon <= theirs * (1 + 1e-4)
