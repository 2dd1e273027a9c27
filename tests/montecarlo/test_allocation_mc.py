"""Random allocation with correlated noise, Monte Carlo (dpjax.montecarlo.allocation, RandomAllocation).

Runs with x64 OFF (the suite's default, what users see).

Tolerances:

* Exact identities (the forward algorithm's likelihood ratio against the enumeration of every
  participation pattern): two float64 evaluations of the same quantity by different summation
  orders; the log-ratios are O(1) to O(10), so 1e-10 relative leaves ~1e5 ulps of room, while a
  float32 computation (~1e-6) or a missing cross term between neighbouring participations (O(1))
  fails.
* Monte Carlo against an exact value or a bracket: ``|difference| <= 3`` standard errors
  (combined, ``sqrt(se_1^2 + se_2^2)``, when both sides are Monte Carlo); a false alarm has
  probability 0.27% per comparison under a normal approximation (terms in [0, 1], >= 2^15
  samples).  The exact random-allocation accountant reports a bracket ``[delta_lower,
  delta_upper]`` of width ~1e-3 relative; the estimate is compared with the nearer end.  Seeds
  are fixed, so each run is deterministic, and each configuration has its own seed.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import logsumexp

import dpjax
from dpjax.montecarlo import BallsInBins, BMinSep, Certificate, RandomAllocation, estimate_from_sums
from dpjax.montecarlo import allocation as al
from dpjax.pld.allocation.accountant import allocation_accounting

from _chain_checks import assert_estimate_matches_losses, assert_float64_from_float32_caller

Z_MAX = 3.0
RTOL_EXACT = 1e-10
LEVEL = 1e-3


# --------------------------------------------------------------------------- helpers


def _banded(n, w, seed):
    """A random dense non-negative lower-triangular ``C`` with ``w`` bands (not Toeplitz)."""
    rng = np.random.default_rng(seed)
    return np.tril(rng.uniform(0.2, 1.0, (n, n))) * (np.subtract.outer(np.arange(n), np.arange(n)) < w)


def _enumerated_log_ratio(c, t, k, epochs, y, sigma):
    """``log sum_x P(x) N(C x, sigma^2)(y) / N(0, sigma^2)(y)`` over all ``binom(t, k)^E`` patterns."""
    per_epoch = []
    for subset in itertools.combinations(range(t), k):
        x = np.zeros(t)
        x[list(subset)] = 1.0
        per_epoch.append(x)
    patterns = np.array([np.concatenate(p) for p in itertools.product(per_epoch, repeat=epochs)])
    log_prob = -epochs * math.log(math.comb(t, k))
    means = patterns @ c.T
    log_f = (means @ y - 0.5 * np.sum(means ** 2, axis=1)[:, None]) / sigma ** 2
    return logsumexp(log_prob + log_f, axis=0)


def _z(a, se_a, b, se_b):
    return (a - b) / math.hypot(se_a, se_b)


def _distance_to_bracket(value, lower, upper):
    return 0.0 if lower <= value <= upper else (value - upper if value > upper else value - lower)


# --------------------------------------------------------------------------- exact identities


@pytest.mark.parametrize("t, k, epochs, w, seed", [
    (4, 1, 2, 1, 1),   # C = I scale: e_1 / t per epoch
    (4, 2, 2, 1, 2),   # C = I, k = 2: e_2 / binom(4, 2)
    (4, 1, 3, 2, 3),
    (4, 2, 2, 3, 4),   # cross terms inside an epoch and across its boundary
    (5, 2, 2, 3, 5),
    (3, 3, 2, 2, 6),   # k = t: one pattern
    (6, 3, 1, 3, 7),
])
def test_likelihood_ratio_matches_enumeration(t, k, epochs, w, seed):
    """The forward algorithm is the likelihood ratio of the mixture over all participation patterns."""
    n = t * epochs
    c = _banded(n, w, seed) if w > 1 else np.eye(n) * np.random.default_rng(seed).uniform(0.5, 1.5, n)
    sigma = 0.8
    y = np.random.default_rng(100 + seed).normal(0.4, 1.2, size=(n, 6))
    want = _enumerated_log_ratio(c, t, k, epochs, y, sigma)
    bands = al.band_table(c, t, epochs)
    assert bands.shape == (n, w)
    got = np.asarray(al.log_likelihood_ratio(bands, y, sigma, batches_per_epoch=t, selections_per_epoch=k))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=RTOL_EXACT, atol=0)


def test_identity_ratio_is_elementary_symmetric_polynomial():
    """At C = I the ratio is prod over epochs of e_k(f_1 .. f_t) / binom(t, k)."""
    t, k, epochs, sigma = 6, 3, 2, 1.3
    y = np.random.default_rng(8).normal(size=(t * epochs, 4))
    f = np.exp((y - 0.5) / sigma ** 2).reshape(epochs, t, -1)
    e_k = sum(np.prod(f[:, list(s)], axis=1) for s in itertools.combinations(range(t), k))  # (epochs, S)
    want = np.sum(np.log(e_k / math.comb(t, k)), axis=0)
    got = al.log_likelihood_ratio(al.band_table(np.ones(1), t, epochs), y, sigma, batches_per_epoch=t,
                                  selections_per_epoch=k)
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL_EXACT, atol=0)


# --------------------------------------------------------------------------- Monte Carlo vs exact


@pytest.mark.parametrize("t, epochs, sigma, eps, seed", [(8, 4, 0.8, 1.0, 11), (16, 2, 0.7, 2.0, 12)])
def test_identity_one_selection_matches_exact_allocation_accountant(t, epochs, sigma, eps, seed):
    """C = I, k = 1: the pair is exactly Feldman & Shenfeld's random-allocation pair, which dpjax's
    PLD accountant brackets tightly; the estimate lies within 3 standard errors of the bracket."""
    exact = allocation_accounting(sigma, t, epochs, target_epsilon=eps)
    est = RandomAllocation(np.array([1.0]), t, epochs).estimate(sigma, eps, 1 << 16, key=seed)
    assert est.num_samples == 1 << 16
    gap = _distance_to_bracket(est.delta[0], float(exact.delta_lower), float(exact.delta_upper))
    assert abs(gap) <= Z_MAX * est.standard_error[0], (est.delta, est.standard_error, exact.delta_lower,
                                                       exact.delta_upper)
    assert 0.005 < est.delta[0] < 0.9  # a delta the sample resolves (standard error ~4e-4)


def test_identity_several_selections_at_or_below_allocation_bound():
    """C = I, k > 1: dpjax's accountant bounds k-of-t allocation by k independent 1-of-(t/k)
    allocations (an upper bound); the exact-ratio estimate is at or below it within 3 standard
    errors (measured: about 10 standard errors below at this configuration)."""
    t, k, epochs, sigma, eps = 8, 2, 4, 1.0, 1.0
    bound = float(allocation_accounting(sigma, t, epochs, target_epsilon=eps, selections_per_epoch=k).delta_upper)
    est = RandomAllocation(np.array([1.0]), t, epochs, selections_per_epoch=k).estimate(sigma, eps, 1 << 16, key=13)
    assert est.delta[0] <= bound + Z_MAX * est.standard_error[0], (est.delta, est.standard_error, bound)


def test_one_epoch_one_selection_is_balls_in_bins():
    """With one epoch and k = 1 the round is uniform over t: balls-in-bins with t batches and one
    epoch.  For a banded C, dpjax's BallsInBins (Gram-reduction sampler, another stream) gives the
    same delta in both directions, within 3 combined standard errors."""
    c = np.array([1.0, 0.6, 0.3])  # a Toeplitz first column, as both accountants take it
    sigma, eps = 0.9, 1.0
    bib = BallsInBins(c, 12, 1).estimate(sigma, eps, 1 << 16, key=21)
    ours = RandomAllocation(c, 12, 1).estimate(sigma, eps, 1 << 16, key=22)
    assert abs(_z(ours.delta_remove[0], ours.se_remove[0], bib.delta_remove[0], bib.se_remove[0])) <= Z_MAX
    assert abs(_z(ours.delta_add[0], ours.se_add[0], bib.delta_add[0], bib.se_add[0])) <= Z_MAX


def test_every_round_selected_is_one_gaussian():
    """k = t: the example takes part in every round, a single Gaussian mechanism with mean
    ``C 1``, whose delta has a closed form; the cross terms of a three-band C matter here
    (|C 1|^2 is 2.3x the sum of the column norms)."""
    t, epochs, sigma, eps = 4, 3, 4.0, 0.5
    c = _banded(t * epochs, 3, 31)
    mu = np.linalg.norm(c @ np.ones(t * epochs)) / sigma
    exact = float(dpjax.pld.gaussian_delta(eps, mu))
    est = RandomAllocation(c, t, epochs, selections_per_epoch=t).estimate(sigma, eps, 1 << 15, key=32)
    for delta, se in ((est.delta_remove[0], est.se_remove[0]), (est.delta_add[0], est.se_add[0])):
        assert abs(delta - exact) <= Z_MAX * se, (delta, se, exact)
    assert exact > 0.05


def test_several_selections_banded_matches_independent_numpy_monte_carlo():
    """k = 2 of t = 5, two epochs, a three-band non-Toeplitz C: the deltas of both directions
    against a Monte Carlo written here independently (NumPy's own generator, each epoch's subset
    from a random permutation, the ratio by enumeration of the 100 patterns), within 3 combined
    standard errors (measured: z = +0.3 remove, -0.5 add, at deltas near 0.5)."""
    t, k, epochs, sigma, eps = 5, 2, 2, 1.0, 1.0
    n, m = t * epochs, 40_000
    c = _banded(n, 3, 71)
    rng = np.random.default_rng(72)
    x = np.zeros((m, epochs, t))
    chosen = np.argsort(rng.random((m, epochs, t)), axis=2)[:, :, :k]
    np.put_along_axis(x, chosen, 1.0, axis=2)
    z = rng.normal(size=(n, m))
    reference = {}
    for name, y, sign in (("remove", c @ x.reshape(m, n).T + sigma * z, 1.0), ("add", sigma * z, -1.0)):
        terms = -np.expm1(np.minimum(eps - sign * _enumerated_log_ratio(c, t, k, epochs, y, sigma), 0.0))
        reference[name] = (terms.mean(), terms.std(ddof=1) / math.sqrt(m))
    est = RandomAllocation(c, t, epochs, selections_per_epoch=k).estimate(sigma, eps, 1 << 16, key=73)
    for name, delta, se in (("remove", est.delta_remove[0], est.se_remove[0]), ("add", est.delta_add[0], est.se_add[0])):
        assert 0.05 < delta < 0.95
        assert abs(_z(delta, se, *reference[name])) <= Z_MAX, (name, delta, se, reference[name])


def test_tiny_noise_multipliers_give_delta_one():
    """Far below any useful noise the truth is delta = 1 to double precision (the Gaussian of one
    participation alone has mu >= 1e19 here); the log-masses reach 1e40 to 1e300, and below
    sigma ~1e-154 every loss is NaN, counted as +inf.  Both directions must report 1, never less
    (a NaN counted as 0, or an overflow read as a zero ratio, would fail here)."""
    acc = RandomAllocation(np.array([1.0, 0.5, 0.25]), 8, 2, selections_per_epoch=2)
    for sigma in (1e-20, 1e-150, 1e-200):
        est = acc.estimate(sigma, [0.0, 1.0, 10.0], 2048, key=81)
        np.testing.assert_array_equal(est.delta_remove, 1.0)
        np.testing.assert_array_equal(est.delta_add, 1.0)


# --------------------------------------------------------------------------- estimator mechanics


def test_estimate_record_both_directions_and_chunking():
    """The record: both directions, the max reported, sample count, a KL interval around it; the
    sums are the mean hockey-stick terms of the loss samples of the same stream, whatever the
    chunking; a new sigma does not recompile."""
    c, t, k, epochs, sigma = np.array([1.0, 0.5]), 8, 2, 4, 1.0
    acc = RandomAllocation(c, t, epochs, selections_per_epoch=k)
    m = 5000  # not a multiple of the block size: the last block is masked
    eps = np.array([0.5, 1.0, 2.0])
    est = assert_estimate_matches_losses(acc, sigma, eps, m, key=3)
    bands = jnp.asarray(acc.bands)
    fn = al.monte_carlo_sums.__wrapped_float64__
    with jax.enable_x64(True):
        one = fn(bands, sigma, eps, jax.random.key(3), batches_per_epoch=t, selections_per_epoch=k, num_samples=m,
                 chunk_blocks=1)
        size = fn._cache_size()
        whole = fn(bands, 0.7, eps, jax.random.key(3), batches_per_epoch=t, selections_per_epoch=k, num_samples=m,
                   chunk_blocks=1)
        assert fn._cache_size() == size
        three = fn(bands, sigma, eps, jax.random.key(3), batches_per_epoch=t, selections_per_epoch=k, num_samples=m,
                   chunk_blocks=3)
    np.testing.assert_allclose(np.asarray(one.total), np.asarray(three.total), rtol=1e-12)
    assert np.all(np.asarray(whole.total) > np.asarray(one.total))  # less noise, more delta
    mean, _ = estimate_from_sums(one, m)
    np.testing.assert_allclose(np.asarray(mean)[0], est.delta_remove, rtol=1e-12)


# --------------------------------------------------------------------------- calibration


N_T, N_E, M = 8, 2, 4096


def test_calibrate_round_trip_and_exact_value():
    """The calibrated sigma solves the estimate on its own draws (delta_hat <= target, within 1e-9
    relative of it), and at C = I, k = 1 the exact (PLD) delta at that sigma is the target within
    3 standard errors (plus 1% for the PLD bracket)."""
    eps, target, m = 1.0, 0.05, 1 << 13
    acc = RandomAllocation(np.array([1.0]), N_T, N_E)
    sigma = acc.calibrate(eps, target, m, key=41)
    assert isinstance(sigma, float)
    est = acc.estimate(sigma, eps, m, key=41)
    assert target * (1 - 1e-9) <= est.delta[0] <= target
    exact = float(allocation_accounting(sigma, N_T, N_E, target_epsilon=eps).delta_upper)
    assert abs(exact - target) <= Z_MAX * est.standard_error[0] + 0.01 * target, (sigma, exact)
    assert acc.calibrate(eps, 2 * target, m, key=41) < sigma  # more delta needs less noise (same draws)


def _root(col, eps, delta):
    mask = (np.arange(N_T * N_E)[:, None] + np.arange(2)[None, :] < N_T * N_E).astype(np.float64)
    return al.calibrate_on_samples(mask * col[None, :], eps, delta, jax.random.key(3), batches_per_epoch=N_T,
                                   selections_per_epoch=2, num_samples=M).root


_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_root, argnums=(0, 1, 2)))


@pytest.mark.slow
def test_implicit_gradient_matches_finite_differences():
    """The implicit adjoint against central differences of the calibration on the same draws
    (float64, step 1e-5, relative 1e-6; see tests/montecarlo/test_bminsep_calibrate.py for the
    tolerance's reasoning).  Larger coefficients need more noise; a larger target less."""
    col, eps, delta = np.array([1.0, 0.6]), 1.5, 0.05
    with jax.enable_x64(True):
        _, grads = _VALUE_AND_GRAD(col, eps, delta)
        h = 1e-5
        e = np.eye(2) * h

        def root(*args):
            return float(_VALUE_AND_GRAD(*args)[0])

        fd_col = [(root(col + e[i], eps, delta) - root(col - e[i], eps, delta)) / (2 * h) for i in range(2)]
        fd_eps = (root(col, eps + h, delta) - root(col, eps - h, delta)) / (2 * h)
    np.testing.assert_allclose(np.asarray(grads[0]), fd_col, rtol=1e-6)
    np.testing.assert_allclose(float(grads[1]), fd_eps, rtol=1e-6)
    assert np.all(np.asarray(grads[0]) > 0) and float(grads[1]) < 0 and float(grads[2]) < 0


def test_calibration_core_under_float32_jit_names_x64():
    """Traced inside a float32 jit the core cannot run in float64, and says so."""
    with pytest.raises(ValueError, match="x64"):
        jax.jit(functools.partial(al.calibrate_on_samples, batches_per_epoch=N_T, num_samples=M))(
            jnp.ones((N_T * N_E, 1), jnp.float32), 1.5, 0.05, jax.random.key(3))


# --------------------------------------------------------------------------- certificates

CERT_T, CERT_E, CERT_EPS, CERT_TARGET, M_CERT = 8, 2, 1.0, 0.05, 1 << 13


def _exact_delta(sigma):
    """The PLD accountant's upper end: at C = I, k = 1 the true delta is at most this (and within
    ~1e-3 relative of it), so counting a release as false when this exceeds ``tau * base_delta``
    can only over-count false releases."""
    return float(allocation_accounting(sigma, CERT_T, CERT_E, target_epsilon=CERT_EPS).delta_upper)


def test_certify_fixed_verdicts():
    """One test at a fixed sigma: verified well above the calibrated sigma, not verified below;
    the record states method, samples and failure probability; a verified delta bounds the exact."""
    acc = RandomAllocation(np.array([1.0]), CERT_T, CERT_E)
    sigma = acc.calibrate(CERT_EPS, CERT_TARGET, M_CERT // 4, key=7)
    good = acc.certify(1.3 * sigma, CERT_EPS, CERT_TARGET, M_CERT, key=8)
    bad = acc.certify(0.8 * sigma, CERT_EPS, CERT_TARGET, M_CERT, key=8)
    assert isinstance(good, Certificate)
    assert good.verified and not bad.verified
    assert good.method == "bernoulli_kl" and good.num_samples == M_CERT and good.num_tests == 1
    assert 0 < good.failure_probability < CERT_TARGET and good.delta <= CERT_TARGET
    assert bad.delta == math.inf
    assert _exact_delta(1.3 * sigma) <= good.delta


def _check_ladder(attempts, first_key):
    """Ladder certificates at C = I, k = 1: the count of false releases (exact delta above
    ``tau * base_delta``) is consistent with the stated failure probability (one-sided binomial
    test at level 1e-3)."""
    acc = RandomAllocation(np.array([1.0]), CERT_T, CERT_E)
    false, released, rates = 0, 0, set()
    for key in range(first_key, first_key + attempts):
        cert = acc.certify_noise(CERT_EPS, CERT_TARGET, key=key, num_samples=M_CERT)
        rates.add(cert.failure_probability)
        assert cert.method == "bernoulli_kl" and cert.procedure == "ladder" and cert.num_samples == M_CERT
        assert cert.delta <= CERT_TARGET
        if cert.verified:
            released += 1
            false += _exact_delta(cert.noise_multiplier) > cert.tau * cert.base_delta
    assert len(rates) == 1
    rate = rates.pop()
    assert 0 < rate < 1e-2
    assert released >= 0.9 * attempts
    assert stats.binom.sf(false - 1, attempts, rate) >= LEVEL, (false, attempts, rate)


def test_certify_noise_ladder_is_sound_against_exact():
    _check_ladder(6, first_key=1000)


@pytest.mark.slow
def test_certify_noise_ladder_is_sound_against_exact_many_attempts():
    _check_ladder(500, first_key=100_000)


# --------------------------------------------------------------------------- float64 contract


def test_float32_caller_gets_float64_answer():
    """x64 is off here: the public functions still compute in float64 (the ratio agrees with the
    float64 enumeration to 1e-10 relative; float32 arithmetic would be off by ~1e-6), and the
    estimate equals the x64-on estimate to 1e-12."""
    assert not jax.config.jax_enable_x64
    t, k, epochs, sigma = 4, 2, 2, 0.9
    c = _banded(t * epochs, 2, 51)
    y32 = np.random.default_rng(52).normal(size=(t * epochs, 4)).astype(np.float32)
    got = al.log_likelihood_ratio(al.band_table(c, t, epochs).astype(np.float32), y32, np.float32(sigma),
                                  batches_per_epoch=t, selections_per_epoch=k)
    assert got.dtype == jnp.float64
    want = _enumerated_log_ratio(c.astype(np.float32).astype(np.float64), t, k, epochs, y32.astype(np.float64),
                                 np.float64(np.float32(sigma)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL_EXACT, atol=0)
    assert_float64_from_float32_caller(RandomAllocation(c, t, epochs, selections_per_epoch=k))


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs, match", [
    (dict(correlation=np.ones(7)), r"correlation has 7 bands; .* supports 1 to 6"),
    (dict(correlation=np.tril(np.ones((16, 16)))), "correlation has 16 bands"),  # not banded
    (dict(correlation=np.array([1.0, -0.5])), "non-negative"),
    (dict(correlation=np.array([1.0, float("nan")])), "must be finite"),
    (dict(correlation=np.eye(5)), r"\(n, n\) = \(16, 16\)"),
    (dict(selections_per_epoch=9), r"selections_per_epoch must be an integer >= 1 \(and <= 8\)"),
    (dict(selections_per_epoch=0), "selections_per_epoch must be an integer >= 1"),
    (dict(batches_per_epoch=0), "batches_per_epoch must be an integer >= 1"),
    (dict(batches_per_epoch=40, selections_per_epoch=33), r"selections_per_epoch .*<= 32"),
    (dict(epochs=1.5), "epochs must be an integer >= 1"),
])
def test_constructor_validation(kwargs, match):
    args = dict(correlation=np.array([1.0, 0.5]), batches_per_epoch=8, epochs=2, selections_per_epoch=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        RandomAllocation(**args)


# (method, positional arguments, keyword arguments, message): the host methods are shared by the
# chain accountants (dpjax.montecarlo._chain.ChainAccountant), so each case runs on both.
METHOD_CASES = [
    ("estimate", (0.0, 1.0, 100, 0), {}, "noise_multiplier must be > 0"),
    ("estimate", (-1.0, 1.0, 100, 0), {}, "noise_multiplier must be > 0"),
    ("estimate", (float("nan"), 1.0, 100, 0), {}, "noise_multiplier must not be NaN"),
    ("estimate", (1.0, float("nan"), 100, 0), {}, "epsilon must not be NaN"),
    ("estimate", (1.0, -1.0, 100, 0), {}, "epsilon must be finite and >= 0"),
    ("estimate", (1.0, 1.0, 0, 0), {}, "num_samples must be an integer >= 1"),
    ("estimate", (1.0, 1.0, 100, 0), {"confidence": 1.0}, r"confidence must be in \(0, 1\)"),
    ("calibrate", (1.0, 0.0, 4096), {}, "delta"),
    ("calibrate", (1.0, 1.0, 4096), {}, "delta"),
    ("calibrate", (1.0, float("nan"), 4096), {}, "delta"),
    ("certify", (1.0, 1.0, 1.5, 1 << 13, 1), {}, "delta"),
    ("certify", (0.0, 1.0, 0.05, 1 << 13, 1), {}, "noise_multiplier"),
    ("certify", (1.0, 1.0, 0.05, 1 << 13, 1), {"method": "importance_betting"}, "method"),
    ("certify_noise", (1.0, 0.05, 0), {"method": "importance_betting"}, "method"),
    ("privacy_losses", (0.0, 100, 0), {}, "noise_multiplier must be > 0"),
]


@pytest.mark.parametrize("accountant", [RandomAllocation(np.array([1.0, 0.5]), 8, 2),
                                        BMinSep(np.array([1.0, 0.5]), 0.25, 2, 16)], ids=repr)
@pytest.mark.parametrize("method, args, kwargs, match", METHOD_CASES)
def test_method_validation(accountant, method, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        getattr(accountant, method)(*args, **kwargs)


def test_devices_are_refused_by_name():
    acc = RandomAllocation(np.array([1.0, 0.5]), 8, 2)
    with pytest.raises(ValueError, match="devices must be None for RandomAllocation"):
        acc.estimate(1.0, 1.0, 100, 0, devices=jax.devices())


def test_pure_function_validation():
    bands = al.band_table(np.array([1.0, 0.5]), 4, 3)
    with pytest.raises(ValueError, match=r"observations must have shape \(n,\) or \(n, S\) with n = 12"):
        al.log_likelihood_ratio(bands, np.zeros((11, 3)), 1.0, batches_per_epoch=4)
    with pytest.raises(ValueError, match="multiple of batches_per_epoch = 5"):
        al.log_likelihood_ratio(bands, np.zeros((12, 3)), 1.0, batches_per_epoch=5)
    with pytest.raises(ValueError, match="selections_per_epoch must be an integer >= 1 \\(and <= 4\\)"):
        al.log_likelihood_ratio(bands, np.zeros((12, 3)), 1.0, batches_per_epoch=4, selections_per_epoch=5)
    with pytest.raises(ValueError, match="bands must have between 1 and MAX_BANDS = 6 columns"):
        al.privacy_losses(np.ones((12, 7)), 1.0, jax.random.key(0), batches_per_epoch=4, num_samples=8)


def test_participation_is_exactly_k_per_epoch_even_with_ties():
    """Each epoch selects exactly k positions, the k smallest uniforms; a tie at the k-th value
    (possible with 52-bit uniforms) is broken by position instead of selecting k + 1."""
    rng = np.random.default_rng(61)
    t, k, epochs = 5, 2, 3
    with jax.enable_x64(True):
        u = rng.uniform(size=(t * epochs, 7))
        ranks = np.argsort(np.argsort(u.reshape(epochs, t, 7), axis=1), axis=1)
        np.testing.assert_array_equal(np.asarray(al._participation(jnp.asarray(u), t, k)),
                                      (ranks < k).reshape(t * epochs, 7))
        u[:3, 0] = 0.01  # three equal smallest values in epoch 0 of sample 0
        x = np.asarray(al._participation(jnp.asarray(u), t, k))
    assert np.all(x.reshape(epochs, t, 7).sum(axis=1) == k)
    np.testing.assert_array_equal(x[:t, 0], [1, 1, 0, 0, 0])
