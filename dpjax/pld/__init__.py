"""FFT privacy-loss-distribution accounting (placeholder docstring, replaced below)."""

from dpjax.pld.accountant import (
    DeltaResult, DirectionReport, EpsilonResult, delta, dpsgd_accounting, dpsgd_delta, dpsgd_epsilon, epsilon,
)
from dpjax.pld.compose import ComposedPLD, Group, compose
from dpjax.pld.convert import delta_at, eps_at, table
from dpjax.pld.discretize import GridPMF, discretize
from dpjax.pld.mechanisms import (
    DIRECTIONS, Gaussian, Laplace, LossCDFs, PoissonSubsampledGaussian, RandomizedResponse,
)
from dpjax.pld.plan import GridOptions, GridPlan, plan_grid
