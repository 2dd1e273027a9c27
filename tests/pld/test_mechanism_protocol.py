"""Every mechanism satisfies the mechanism protocol, and the accountant takes exactly those."""

from __future__ import annotations

import dataclasses

import pytest

import dpjax
from dpjax import pld
from dpjax.pld.mog import GroupSubsampledGaussian, MixtureOfGaussians

MECHANISMS = [
    pld.Gaussian(2.0),
    pld.PoissonSubsampledGaussian(1.0, 0.01),
    pld.Laplace(1.0),
    pld.RandomizedResponse.from_probability_correct(0.75),
    MixtureOfGaussians(2.0, (0.0, 1.0), (0.9, 0.1)),
    GroupSubsampledGaussian(2.0, 2.0, sampling_prob=0.01),
]


@pytest.mark.parametrize("mech", MECHANISMS, ids=lambda m: type(m).__name__)
def test_every_mechanism_is_one(mech):
    assert isinstance(mech, pld.Mechanism)
    assert mech.validate() is mech
    assert isinstance(type(mech).symmetric, bool)


@dataclasses.dataclass(frozen=True)
class _NoValidate:
    """Has the loss functions but neither ``validate`` nor ``symmetric``."""

    sigma: float = 1.0

    def loss_cdfs(self, direction, y, ops=None):
        return pld.Gaussian(self.sigma).loss_cdfs(direction, y, ops)


def test_the_accountant_refuses_what_is_not_a_mechanism():
    assert not isinstance(_NoValidate(), pld.Mechanism)
    with pytest.raises(ValueError, match=r"not a mechanism \(a dataclass with symmetric, loss_cdfs and validate"):
        pld.epsilon([(pld.Gaussian(2.0), 3), (_NoValidate(), 2)], 1e-5)
    with pytest.raises(ValueError, match="components must be a mechanism"):
        pld.epsilon(42, 1e-5)
    assert pld.epsilon(pld.Gaussian(2.0), 1e-5).epsilon == dpjax.pld.epsilon([(pld.Gaussian(2.0), 1)], 1e-5).epsilon
