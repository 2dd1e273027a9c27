"""Group-level DP-SGD accounting (MoG PLD composed T times) against the family-C reference rows."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpjax
from dpjax.group import group_accounting, group_epsilon
from dpjax.pld.mog import group_mixture_params, mog_loss_cdfs

SIGMAS = (1, 2, 4)
ALL_KS = (1, 2, 4, 8, 16)
DEFAULT_KS = (1, 4, 16)


def _check_row(case):
    """A Poisson row (the fixed-batch rows: tests/test_group_fixed_batch.py)."""
    p = case["params"]
    eps = group_epsilon(p["noise_multiplier"], p["sampling_probability"], p["steps"], p["delta"], group_size=p["group_size"])
    ref = case["value"]
    # Tolerance: at most 0.5% above dp_accounting's pessimistic 1e-4 value (measured: <= 2.3e-5
    # relative with the default GridOptions).
    assert eps <= ref * 1.005, (case["id"], eps, ref)
    # Never below the truth.  dp_accounting's connect-the-dots error is O(dx^2), so its 1e-4 value
    # exceeds the truth by about |eps(2e-4) - eps(1e-4)| / 3; the truth is therefore above
    # ref - |eps(2e-4) - eps(1e-4)|, and our certified value (an upper bound) must be too.
    gap = abs(case["extra"]["pld_pessimistic_2e-4"] - ref)
    assert eps >= ref - gap, (case["id"], eps, ref, gap)
    return eps


# Default subset (compile time dominates: every distinct grid shape is one XLA compile, ~5 s):
# k in {1, 4, 16} at sigma = 2, plus k = 16 at sigma = 1 (Ganesh et al.'s example regime).  All
# 15 Poisson rows: the slow test below; the 15 fixed-batch rows: tests/test_group_fixed_batch.py.
DEFAULT_ROWS = [f"C_poisson_s2_k{k}" for k in DEFAULT_KS] + ["C_poisson_s1_k16"]


@pytest.mark.parametrize("case_id", DEFAULT_ROWS)
def test_family_c_mog_subset(reference_cases, case_id):
    _check_row(reference_cases[case_id])


def test_family_c_epsilon_increases_with_group_size(reference_cases):
    eps = [_check_row(reference_cases[f"C_poisson_s2_k{k}"]) for k in DEFAULT_KS]
    assert eps[0] < eps[1] < eps[2]


@pytest.mark.slow
@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("k", ALL_KS)
def test_family_c_mog_all_rows(reference_cases, sigma, k):
    _check_row(reference_cases[f"C_poisson_s{sigma}_k{k}"])


def test_k1_is_exactly_the_dpsgd_epsilon():
    base = dpjax.pld.dpsgd_epsilon(2.0, 0.01, 2000, 1e-5)
    assert group_epsilon(2.0, 0.01, 2000, 1e-5, group_size=1) == base
    assert dpjax.dpsgd_epsilon(2.0, 0.01, 2000, 1e-5) == base
    assert dpjax.dpsgd_epsilon(2.0, 0.01, 2000, 1e-5, group_size=1) == base


def test_fixed_batch_k1_is_the_sensitivity_2_subsampled_gaussian():
    """Fixed batch, k = 1 (replace-one adjacency): Hypergeometric(N, 1, B) = Bernoulli(B/N) with
    sensitivity 2 and noise sigma (Ganesh (2024), Thm 3.3), i.e. the sensitivity-1 subsampled
    Gaussian at q = B/N with noise multiplier sigma / 2 -- exactly, same program -- and NOT
    Poisson DP-SGD at sigma (which is add/remove adjacency, sensitivity 1)."""
    fixed = dpjax.dpsgd_epsilon(2.0, None, 2000, 1e-5, sampling=dpjax.FixedBatch(500, 50_000))
    assert fixed == dpjax.pld.dpsgd_epsilon(1.0, 0.01, 2000, 1e-5)
    poisson = dpjax.pld.dpsgd_epsilon(2.0, 0.01, 2000, 1e-5)
    assert fixed > 2.5 * poisson  # 2.584 vs 0.900


def test_issue_example_fixed_batch_k6():
    """A worked example: sigma = 3, k = 6, B = 500 of N = 50,000, T = 2000 -> about 10.46
    (the old 'noise 2 sigma' reading gave 4.04, an understated epsilon).  Oracle: the same
    mixture {2j: Hypergeometric(50000, 6, 500)(j)}, std 3, through dp_accounting's PLD at
    interval 1e-4 (10.4563, pessimistic); 0.5%: the tolerance against dp_accounting."""
    eps = dpjax.dpsgd_epsilon(3.0, None, 2000, 1e-5, group_size=6, sampling=dpjax.FixedBatch(500, 50_000))
    assert eps == pytest.approx(10.4563, rel=5e-3)
    assert eps > 10.0


def test_mog_path_at_k1_agrees_with_the_dpsgd_mechanism():
    """The MoG mechanism itself (not the k = 1 shortcut) reproduces DP-SGD's epsilon."""
    from dpjax import pld
    from dpjax.pld.mog import GroupSubsampledGaussian

    base = pld.dpsgd_epsilon(2.0, 0.01, 2000, 1e-5)
    mog = pld.epsilon([(GroupSubsampledGaussian(2.0, 1.0, sampling_prob=0.01), 2000)], 1e-5, with_lower=False).epsilon
    # Same mechanism, two code paths (different inversions); both are certified upper bounds with
    # discretization error <= GridOptions.relative_accuracy (1e-4 default) relative.
    assert mog == pytest.approx(base, rel=2e-4)


def test_finite_tight_where_the_lemma_is_infinite(reference_cases):
    """Ganesh's (2024) example regime (T = 2000, q = 0.01, sigma = 1, k = 16): the lemma gives inf,
    the MoG accountant a finite epsilon close to the reference."""
    from dpjax.baselines import group_lemma_epsilon

    assert reference_cases["C_vadhan_poisson_s1_k16"]["value"] == math.inf
    lemma = group_lemma_epsilon(1.0, 0.01, 2000, 1e-5, group_size=16)
    assert lemma.epsilon == math.inf and lemma.reason
    eps = group_epsilon(1.0, 0.01, 2000, 1e-5, group_size=16)
    assert math.isfinite(eps)
    assert eps == pytest.approx(reference_cases["C_poisson_s1_k16"]["value"], rel=5e-3)


@jax.jit
def _single_step_deltas(eps, c, w):
    out = []
    for direction in ("remove", "add"):
        cd = mog_loss_cdfs(direction, eps, c, w)
        out.append(cd.p_gt - jnp.exp(eps) * cd.q_gt)
    return jnp.stack(out)


@given(
    sigma=st.floats(0.5, 5.0),
    q=st.floats(1e-3, 0.2),
    k=st.integers(1, 14),
    fixed=st.booleans(),
)
def test_group_pair_k_is_dominated_by_pair_k_plus_1(sigma, q, k, fixed):
    """eps is non-decreasing in k: a group of k+1 contains a group of k.  Per step, the pair for k
    is dominated by the pair for k+1 iff H_{e^eps} is ordered for every eps in R, both directions
    (Blackwell); domination is preserved by composition, so every composed eps(delta) is ordered.
    Checked on eps in [-6, 6] with the exact closed form (slack 1e-14: float64 round-off)."""
    n = 50_000
    b = max(k + 1, int(round(q * n)))
    kw = dict(sampling="fixed_batch", num_components=16) if fixed else dict(sampling="poisson", num_components=16)
    with jax.enable_x64(True):
        eps = jnp.linspace(-6.0, 6.0, 241)
        curves = []
        for kk in (k, k + 1):
            s, w, sd = _params_jit(sigma, kk, q, n, b, **kw)
            curves.append(np.asarray(_single_step_deltas(eps, s / sd, w)))
    assert np.all(curves[1] >= curves[0] - 1e-14)


_params_jit = jax.jit(group_mixture_params, static_argnames=("sampling", "num_components"))


@pytest.mark.slow
def test_accounting_returns_bracket_and_delta():
    res = group_accounting(2.0, 0.01, 500, target_delta=1e-5, group_size=4)
    assert res.epsilon_lower <= res.epsilon <= res.epsilon_upper
    d = dpjax.group_delta(2.0, 0.01, 500, res.epsilon, group_size=4)
    # delta at the certified epsilon is at most the target (up to the delta grid's own error).
    assert d <= 1e-5 * (1 + 1e-3)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(group_size=0), "group_size"),
        (dict(group_size=2.5), "group_size"),
        (dict(group_size=True), "group_size"),
        (dict(sampling="shuffle"), "sampling"),
        (dict(sampling="fixed_batch"), r"FixedBatch\(batch_size, dataset_size\)"),
        (dict(sampling=dpjax.FixedBatch(4, 100), sampling_prob=None, group_size=5), "group_size"),
        (dict(sampling=dpjax.FixedBatch(10, 100), sampling_prob=0.2), "sampling_prob"),
        (dict(sampling_prob=None), "sampling_prob"),
        (dict(sampling=dpjax.BallsInBins(10)), r"FixedBatch\(batch_size, dataset_size\) \(the schemes it accounts\)"),
        (dict(sampling_prob=1.5), "sampling_prob"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(noise_multiplier=[1.0, -2.0]), "noise_multiplier"),   # a batch with a bad element
        (dict(steps=0), "steps"),
        (dict(target_delta=0.0), "target_delta"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    args = dict(noise_multiplier=1.0, sampling_prob=0.01, steps=10, target_delta=1e-5, group_size=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        group_epsilon(args.pop("noise_multiplier"), args.pop("sampling_prob"), args.pop("steps"), args.pop("target_delta"), **args)


def test_fixed_batch_accepts_consistent_sampling_prob():
    from dpjax.group import Sampling, validate_group_args

    a = validate_group_args(None, group_size=3, sampling="fixed_batch", dataset_size=1000, batch_size=10)
    b = validate_group_args(0.01, group_size=3, sampling=Sampling.FIXED_BATCH, dataset_size=1000, batch_size=10)
    assert a == b == (3, "fixed_batch", 0.01, 1000, 10)
    assert a.sampling is Sampling.FIXED_BATCH and a.adjacency == "replace"
    c = validate_group_args(0.01, group_size=3)
    assert c.sampling is Sampling.POISSON and c.adjacency == "add_or_remove"


def test_fixed_batch_is_a_record_not_a_name():
    """A fixed batch states its sizes: the name alone (string or enum) is refused with the
    record to write instead, and Poisson's name and record give the same answer."""
    from dpjax.group import Sampling

    for name in ("fixed_batch", Sampling.FIXED_BATCH):
        with pytest.raises(ValueError, match=r"sampling=dpjax\.FixedBatch\(batch_size, dataset_size\)"):
            group_epsilon(4.0, None, 2000, 1e-5, group_size=2, sampling=name)
    a = group_epsilon(4.0, None, 2000, 1e-5, group_size=2, sampling=dpjax.Poisson(0.01))
    assert a == group_epsilon(4.0, 0.01, 2000, 1e-5, group_size=2, sampling=Sampling.POISSON)
    assert Sampling.POISSON.sensitivity == 1.0 and Sampling.FIXED_BATCH.sensitivity == 2.0
    assert str(Sampling.FIXED_BATCH) == "fixed_batch" and Sampling("poisson") is Sampling.POISSON


def test_one_validator_for_every_entry_point():
    """group.py, the baselines, calibration and the mechanism all reject the same bad input with
    the same message (one definition: dpjax.pld.group_spec.validate_group_spec)."""
    from dpjax.baselines import group_rdp_epsilon
    from dpjax.calibration import dpsgd_noise_multiplier
    from dpjax.group import validate_group_args
    from dpjax.pld import group_spec
    from dpjax.pld.mog import GroupSubsampledGaussian

    assert validate_group_args is group_spec.validate_group_spec
    bad = dict(group_size=20, sampling=dpjax.FixedBatch(10, 1000))
    messages = set()
    for call in (
        lambda: group_epsilon(1.0, None, 10, 1e-5, **bad),
        lambda: group_rdp_epsilon(1.0, None, 10, 1e-5, **bad),
        lambda: dpsgd_noise_multiplier(None, 10, 2.0, 1e-5, **bad),
        lambda: GroupSubsampledGaussian(1.0, 20.0, dataset_size=1000.0, batch_size=10.0, sampling="fixed_batch").validate(),
    ):
        with pytest.raises(ValueError, match="group_size must be <= batch_size") as info:
            call()
        messages.add(str(info.value).split(", got")[0])
    assert len(messages) == 1
    # A sampling probability beside a fixed batch is rejected (not silently ignored).
    with pytest.raises(ValueError, match="sampling_prob is stated by"):
        group_epsilon(1.0, 0.01, 10, 1e-5, group_size=2, sampling=dpjax.FixedBatch(10, 1000))
    with pytest.raises(ValueError, match="sampling must be one of"):
        GroupSubsampledGaussian(1.0, 2.0, sampling_prob=0.1, sampling="shuffle").validate()
