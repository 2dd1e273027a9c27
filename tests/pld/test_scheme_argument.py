"""The sampling scheme as one argument: ``sampling=`` takes ``"poisson"`` or a scheme record in
every DP-SGD function, the sweep's grid and execution are records of their own."""

from __future__ import annotations

import pytest

import dpjax
from dpjax.pld import GridOptions
from dpjax.pld.scenario import SchemeKeywords, scheme_from_keywords, scheme_keywords

FIXED = dpjax.FixedBatch(100, 10_000)
ALLOCATION = dpjax.RandomAllocation(20, 2)
BINS = dpjax.BallsInBins(20)


def test_poisson_record_equals_the_probability_argument():
    assert dpjax.dpsgd_epsilon(1.0, None, 500, 1e-5, sampling=dpjax.Poisson(0.02)) == \
        dpjax.dpsgd_epsilon(1.0, 0.02, 500, 1e-5)
    assert dpjax.dpsgd_delta(1.0, None, 500, 2.0, sampling=dpjax.Poisson(0.02), group_size=2) == \
        dpjax.dpsgd_delta(1.0, 0.02, 500, 2.0, group_size=2)
    assert dpjax.pld.dpsgd_accounting(1.0, None, 500, 1e-5, sampling=dpjax.Poisson(0.02)).epsilon == \
        dpjax.pld.dpsgd_accounting(1.0, 0.02, 500, 1e-5).epsilon


def test_scheme_keywords_spell_each_record():
    assert scheme_keywords("f", "poisson", 0.1) == SchemeKeywords(sampling_prob=0.1)
    assert scheme_keywords("f", FIXED) == SchemeKeywords("fixed_batch", None, 10_000, 100)
    assert scheme_keywords("f", ALLOCATION) == SchemeKeywords("random_allocation", None, None, None, 20, 2)
    assert scheme_keywords("f", BINS) == SchemeKeywords("balls_in_bins", None, None, None, 20, 1)
    for record in (dpjax.Poisson(0.1), FIXED, ALLOCATION, BINS):
        spelled = {k: v for k, v in record.keywords().items() if k != "sampling_prob"}
        assert scheme_from_keywords(**spelled) == ("poisson" if isinstance(record, dpjax.Poisson) else record)


@pytest.mark.parametrize("call, scheme", [
    (lambda s: dpjax.group_epsilon(1.0, None, 10, 1e-5, group_size=2, sampling=s), ALLOCATION),
    (lambda s: dpjax.group_accounting(1.0, None, 10, 1e-5, group_size=2, sampling=s), BINS),
    (lambda s: dpjax.pld.dpsgd_epsilon(1.0, None, 10, 1e-5, sampling=s), FIXED),
    (lambda s: dpjax.pld.dpsgd_accounting(1.0, None, 10, 1e-5, sampling=s), FIXED),
    (lambda s: dpjax.epsilon_curve(1.0, None, [10], 1e-5, sampling=s), FIXED),
    (lambda s: dpjax.baselines.group_lemma_epsilon(1.0, None, 10, 1e-5, group_size=2, sampling=s), ALLOCATION),
    (lambda s: dpjax.baselines.group_rdp_epsilon(1.0, None, 10, 1e-5, group_size=2, sampling=s), BINS),
])
def test_a_scheme_a_function_does_not_account_is_refused_with_the_ones_it_does(call, scheme):
    with pytest.raises(ValueError, match=r"sampling must be 'poisson' or dpjax\.Poisson\(sampling_prob\) or "):
        call(scheme)


@pytest.mark.parametrize("bad, match", [
    ("shuffle", "sampling must be 'poisson' or"),
    (42, "sampling must be 'poisson' or"),
    ("balls_in_bins", r"states its sizes: sampling=dpjax\.BallsInBins\(batches_per_epoch\)"),
])
def test_bad_sampling_values_name_the_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        dpjax.dpsgd_epsilon(1.0, None, 10, 1e-5, sampling=bad)


def test_scheme_from_keywords_refuses_sizes_of_another_scheme():
    with pytest.raises(ValueError, match="dataset_size do not apply to sampling='random_allocation'"):
        scheme_from_keywords("random_allocation", dataset_size=10, batches_per_epoch=3)
    with pytest.raises(ValueError, match="needs dataset_size and batch_size"):
        scheme_from_keywords("fixed_batch", dataset_size=10)
    with pytest.raises(ValueError, match="needs batches_per_epoch"):
        scheme_from_keywords("balls_in_bins")


@pytest.mark.parametrize("kwargs, match", [
    (dict(per_device=0), "per_device"),
    (dict(per_device=2.5), "per_device"),
    (dict(backend="gpu"), "backend must be 'auto', 'host' or 'compiled'"),
])
def test_sweep_execution_validates_its_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dpjax.SweepExecution(**kwargs)


def test_sweep_refusals():
    grid = dpjax.sweep_grid(1.0, 0.01, 100, delta=1e-5)
    with pytest.raises(ValueError, match="execution must be a SweepExecution"):
        dpjax.sweep(grid, execution={"backend": "host"})
    with pytest.raises(ValueError, match="configs must be a list"):
        dpjax.sweep(None)
    rows = dpjax.sweep_grid(1.0, sampling=ALLOCATION, epochs=1, delta=1e-5)
    with pytest.raises(ValueError, match="options and execution are for Poisson rows"):
        dpjax.sweep(rows, options=GridOptions())
    with pytest.raises(ValueError, match="epochs is for random-allocation"):
        dpjax.sweep_grid(1.0, 0.01, 100, delta=1e-5, epochs=2)
    with pytest.raises(ValueError, match="sampling_prob, steps and group_size are for Poisson grids"):
        dpjax.sweep_grid(1.0, 0.01, sampling=ALLOCATION, epochs=1, delta=1e-5)
    with pytest.raises(ValueError, match="needs epochs"):
        dpjax.sweep_grid(1.0, sampling=BINS, delta=1e-5)
    with pytest.raises(ValueError, match="RandomAllocation / BallsInBins"):
        dpjax.sweep_grid(1.0, sampling=[FIXED], epochs=1, delta=1e-5)


def test_allocation_grid_rows_are_the_single_calls():
    rows = dpjax.sweep(dpjax.sweep_grid([1.0, 2.0], sampling=[ALLOCATION, BINS], epochs=[1, 2], delta=1e-5),
                       progress=False).rows
    assert len(rows) == 8
    order = [(s, scheme, e) for s in (1.0, 2.0) for scheme in (ALLOCATION, BINS) for e in (1, 2)]
    for row, (s, scheme, e) in zip(rows, order):
        assert row["epsilon"] == dpjax.dpsgd_epsilon(s, target_delta=1e-5, sampling=scheme, epochs=e)


@pytest.mark.parametrize("scheme", [dpjax.BallsInBins(8), dpjax.RandomAllocation(6, 2)])
def test_steps_of_whole_epochs_are_the_epochs(scheme):
    # steps = t E gives the same accounting as epochs = E; a partial epoch is refused.
    t = scheme.batches_per_epoch
    assert (dpjax.dpsgd_epsilon(1.0, sampling=scheme, steps=3 * t, target_delta=1e-5)
            == dpjax.dpsgd_epsilon(1.0, sampling=scheme, epochs=3, target_delta=1e-5))
    assert (dpjax.dpsgd_delta(1.0, sampling=scheme, steps=3 * t, target_epsilon=2.0)
            == dpjax.dpsgd_delta(1.0, sampling=scheme, epochs=3, target_epsilon=2.0))
    assert (dpjax.dpsgd_noise_multiplier(sampling=scheme, steps=3 * t, target_epsilon=2.0, target_delta=1e-5)
            == dpjax.dpsgd_noise_multiplier(sampling=scheme, epochs=3, target_epsilon=2.0, target_delta=1e-5))
    with pytest.raises(ValueError, match="whole number of epochs"):
        dpjax.dpsgd_epsilon(1.0, sampling=scheme, steps=3 * t + 1, target_delta=1e-5)
    with pytest.raises(ValueError, match="needs epochs"):
        dpjax.dpsgd_epsilon(1.0, sampling=scheme, target_delta=1e-5)
