"""The optimisation loop: correlation matrices under balls-in-bins (b-min-sep, random allocation) amplification, certified.

Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for matrix
mechanisms", §4 (Algorithm 2) and §5.  One step minimises ``log RMSE(C) = log(sigma*(C) *
err(C))`` (``err`` the noise-free objective, by default :func:`prefix_sum_error`) where
``sigma*(C)`` solves ``delta_hat(sigma; C) = target_delta`` on that step's Monte Carlo sample:

* the sample ``(I, U)`` (``num_samples x b``) is drawn from ``fold_in(key, k // R)`` and shared
  by the ``R = resample_every`` steps of a period (default 10; reproducible from the key and
  the step, so a resumed run redraws it exactly);
* ``sigma*`` by :func:`~dpjax.calibration.screened.calibrate_screened`: one float32 screen of
  all ``m x b`` entries at the previous step's sigma selects the samples that can contribute,
  then :class:`~dpjax.calibration.NewtonIllinois` and the implicit gradient (one reverse pass,
  Choquette-Choo et al. 2024 §4.2) run in float64 on those only -- the exact estimate's root
  and gradient, with a checked bound and a full float64 fallback; the next step of the same
  sample reuses that screen when a drift bound proves it still selects every contributing
  sample (no pass over the sample);
* or, for :class:`~dpjax.calibration.Bisection` (Algorithm 2 as written, the benchmark's anchor)
  and for samples too large to hold (``m b > 2^24``): fresh draws from ``fold_in(key, step)``
  every step, full passes (chunked when large).

The jitted step is cached on its static configuration (parameterization, ``b``, ``E``,
``num_samples``, optimizer, objective, solver), so repeated calls and resumed runs reuse one
compiled program.  Checkpoints (strict JSON, written atomically: :func:`dpjax._base.io.atomic_write`) hold the
parameters, the optimizer state, the step, the warm-start sigma and the history, with the
screen state in a binary sidecar ``<checkpoint>.screen-<step>.npz``, so a killed run resumes to
the identical result.  A non-finite loss or parameter stops the run, keeps the
last good parameters (and checkpoint) and says why.  The result is then certified
by the certify step :func:`certify_result` (:func:`dpjax.optimization.certify.certify_noise`)
with independent draws.

Under b-min-sep sampling (``CorrelationProblem(sampling=dpjax.BMinSepSampling(...))``; Dong &
Ganesh, "Privacy Amplification for BandMF via b-Min-Sep Subsampling") and under random
allocation (``CorrelationProblem(sampling=dpjax.RandomAllocation(t, k), epochs=E)``; Feldman &
Shenfeld, "Privacy amplification by random allocation") the step is a separate one, the chain
schemes' :func:`_compiled_chain`: a banded ``C`` (at most ``min_sep`` bands, or
:data:`dpjax.montecarlo.allocation.MAX_BANDS`), fresh draws from ``fold_in(key, step)``,
``sigma*`` by the scheme's ``calibrate_on_samples`` (:mod:`dpjax.montecarlo.bminsep`,
:mod:`dpjax.montecarlo.allocation`) with its implicit gradient through the bands, compiled once
per static part of the scheme (b-min-sep's ``sampling_prob`` is an argument of the program, not
part of its cache key); the same loop, checkpoints and resume; the certificate the scheme
accountant's ``certify_noise`` (:class:`dpjax.montecarlo.BMinSep`,
:class:`dpjax.montecarlo.RandomAllocation`; docs/design.md §4.3, §4.4).

What is optimised, how, where it checkpoints and how it is certified are records
(:mod:`dpjax.optimization.problem`: :class:`~dpjax.optimization.CorrelationProblem`,
:class:`~dpjax.optimization.OptimizerSettings`, :class:`~dpjax.optimization.Checkpoint`;
:class:`~dpjax.optimization.CertifySettings`).

Usage::

    import dpjax
    from dpjax.optimization import (CorrelationProblem, OptimizerSettings, make_parameterization,
                                    optimize_correlation)
    p = make_parameterization("blt", 64, num_buffers=2)
    problem = CorrelationProblem(sampling=dpjax.BallsInBins(16), epochs=4, target_epsilon=2.0,
                                 target_delta=1e-5)
    res = optimize_correlation(p, problem, OptimizerSettings(num_steps=50, num_samples=1 << 10))
    res.noise_multiplier, res.rmse, res.certificate.failure_probability
    res.to_json("result.json")
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import warnings
import zipfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpjax._base import io as _io
from dpjax._base.enums import StrEnum
from dpjax._base.results import ResultMixin
from dpjax._base.progress import elapsed_meter as _elapsed_meter
from dpjax._base.progress import note as _note
from dpjax._base.progress import progress as _progress
from dpjax.montecarlo.calibrate import (DEFAULT_NUM_ITERATIONS, MAX_PRECOMPUTED, DrawPlan, NewtonIllinois,
                                        calibrate_on_draws)
from dpjax.calibration.screened import (calibrate_screened_reusing, empty_screen_state,
                                        screened_draws)
from dpjax.montecarlo import Certificate, as_prng_key, gram_matrix
from dpjax.montecarlo.importance import default_proposal
from dpjax.optimization.certify import CertifySettings, certify_noise, sampler_terms
from dpjax.optimization.problem import (DEFAULT_NUM_SAMPLES, Checkpoint, CorrelationProblem, Estimator,
                                        OptimizerSettings)
from dpjax.optimization.parameterizations import (Parameterization, make_parameterization,
                                                  params_from_list, params_to_list)

__all__ = ["optimize_correlation", "certify_result", "OptimizationResult", "OptimizationStatus", "Estimator",
           "default_optimizer", "DEFAULT_LEARNING_RATE", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "dpjax-optimize-checkpoint-1"
RESULT_FORMAT = "dpjax-optimize-result-1"
DEFAULT_LEARNING_RATE = 0.05


@functools.lru_cache(maxsize=None)
def default_optimizer(learning_rate: float = DEFAULT_LEARNING_RATE) -> optax.GradientTransformation:
    """Adam with the given learning rate; one object per rate, so the compiled step is reused."""
    return optax.adam(learning_rate)


# --------------------------------------------------------------------------- result


class OptimizationStatus(StrEnum):
    """How a run ended: every step ran (``"completed"``) or a non-finite loss or parameter
    stopped it (``"stopped"``, the last good parameters kept; ``stop_reason`` says why)."""

    COMPLETED = "completed"
    STOPPED = "stopped"


@dataclasses.dataclass(frozen=True)
class OptimizationResult(ResultMixin):
    """Outcome of :func:`optimize_correlation` (all fields JSON-able; floats in float64).

    Attributes:
      parameterization: the family's ``to_dict()`` (``family``, ``n``, ``bands`` / ``num_buffers``).
      batches_per_epoch, epochs: ``b``, ``E``.
      target_epsilon, target_delta: the privacy target.
      params: the final parameters (dict of lists).
      first_column: ``C``'s first column (length ``n``, ``c0 = 1``); dense: column 0.
      noise_multiplier: the certified sigma (``inf`` when nothing was certified; ``nan`` when
        certification was not requested).
      noise_multiplier_estimate: sigma* from the optimisation's estimate (``num_samples`` draws).
      error: the noise-free objective ``err(C)`` (prefix sums: ``|A C^-1|_F / sqrt(n)``).
      rmse: ``noise_multiplier * error`` (at the certified sigma).
      rmse_estimate: ``noise_multiplier_estimate * error``.
      certificate: the :class:`~dpjax.montecarlo.Certificate` of
        :func:`~dpjax.optimization.certify.certify_noise`, or ``None`` (not requested).
      history: one row per completed step: ``step``, ``loss`` (log RMSE before the update),
        ``rmse``, ``noise_multiplier``, ``solver_passes``.
      num_steps, num_samples, seed, estimator: the run's configuration (``estimator``: the
        in-loop Monte Carlo estimate, an :class:`Estimator`).
      status: an :class:`OptimizationStatus`; ``stop_reason`` says why a run stopped.
      timings: seconds (``compile``, ``steps``, ``certify``).
      dataset_size, batch_size: the training sampler's ``N`` and fixed batch shape ``B``
        (:class:`dpjax.sampling.BallsInBinsSampler`), or ``None`` when not given: then the
        certificate holds for untruncated bins.
      truncation_delta: the delta truncating bins to ``B`` costs (0 without a sampler); the
        certificate is for ``target_delta - truncation_delta``, so training with
        ``noise_multiplier`` on that sampler is ``(target_epsilon, target_delta)``-DP.
      sampling: the participation scheme the result is for: ``None`` for balls-in-bins (then
        ``batches_per_epoch`` and ``epochs`` say which), or for b-min-sep
        ``{"scheme": "b_min_sep", "min_sep": b, "sampling_prob": p, "num_rounds": n,
        "warm_start": True}`` (then ``batches_per_epoch`` and ``epochs`` are ``None``; train
        with :class:`dpjax.sampling.BMinSepSampler` ``(N, p, b, n, B)``), or for random
        allocation ``{"scheme": "random_allocation", "batches_per_epoch": t,
        "selections_per_epoch": k, "epochs": E}`` (``batches_per_epoch`` and ``epochs`` are
        ``t`` and ``E``; each example in a fresh uniform ``k``-subset of each epoch's ``t``
        batches; dpjax has no batch sampler for it).

    ``to_dict()`` / ``to_json(path)`` / ``OptimizationResult.load(path)``: see
    :mod:`dpjax._base.results`; the JSON also holds ``format`` (``"dpjax-optimize-result-1"``) and
    ``gap_to_estimate`` (certified over estimated sigma, minus 1) for its readers.
    """

    parameterization: dict
    batches_per_epoch: int
    epochs: int
    target_epsilon: float
    target_delta: float
    params: dict
    first_column: list
    noise_multiplier: float
    noise_multiplier_estimate: float
    error: float
    rmse: float
    rmse_estimate: float
    certificate: Certificate | None
    history: list
    num_steps: int
    num_samples: int
    seed: int
    status: OptimizationStatus = OptimizationStatus.COMPLETED
    stop_reason: str = ""
    timings: dict = dataclasses.field(default_factory=dict)
    estimator: Estimator = Estimator.PLAIN
    dataset_size: int | None = None
    batch_size: int | None = None
    truncation_delta: float = 0.0
    sampling: dict | None = None

    _nested = {"certificate": Certificate}
    # Lists of numbers and of dicts, read back as lists (the parameters' own format).
    _plain = frozenset({"parameterization", "params", "first_column", "history", "timings", "sampling"})
    _format = RESULT_FORMAT
    _derived = ("gap_to_estimate",)
    _json_kwargs = {"indent": 1}

    def __post_init__(self):
        object.__setattr__(self, "status", OptimizationStatus.parse(self.status, "status"))
        object.__setattr__(self, "estimator", Estimator.parse(self.estimator, "estimator"))
        if isinstance(self.certificate, dict):
            object.__setattr__(self, "certificate", Certificate.from_dict(self.certificate))

    @property
    def gap_to_estimate(self) -> float:
        """``noise_multiplier / noise_multiplier_estimate - 1`` (``nan`` without an estimate)."""
        if not self.noise_multiplier_estimate:
            return math.nan
        return self.noise_multiplier / self.noise_multiplier_estimate - 1.0

    def correlation(self):
        """``C`` as the family's structured matrix (Toeplitz / BLT) or dense array."""
        p = make_parameterization(**{"family": self.parameterization["family"],
                                     **{k: v for k, v in self.parameterization.items()
                                        if k != "family"}})
        return p.correlation(params_from_list(self.params))


# --------------------------------------------------------------------------- compiled step


def _optimizer_step(optimizer, grads, opt_state, params):
    """``(new_params, new_state, finite)``: one optax update, and whether every new parameter is
    finite (checked on device: the loop then fetches one flag, not every parameter, each step)."""
    updates, new_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(new_params)]))
    return new_params, new_state, finite


@functools.lru_cache(maxsize=32)
def _compiled(parameterization, b: int, epochs: int, num_samples: int, optimizer,
              objective: Callable, solver, precompute: bool | None, screened: bool = False,
              num_candidates: int | None = None, importance: bool = False):
    """``(step, evaluate, draw)``: jitted functions for this static configuration (cached).

    ``screened``: the step takes a prepared sample (``draw(key, period)``, reused for
    ``resample_every`` steps) and calibrates with :func:`calibrate_screened`; otherwise it draws
    its own sample from ``fold_in(key, step)`` and calibrates with :func:`calibrate_on_draws`
    (the path of :class:`Bisection`, Algorithm 2 as written, of samples too large to hold, and
    of the variance-reduced estimator).  ``importance``: the estimate is the variance-reduced
    one (:mod:`dpjax.montecarlo.importance`), its proposal chosen from the step's ``C`` and the
    warm-start ``sigma`` (a constant of the step: no gradient flows through it).  The unscreened
    ``step`` and ``evaluate`` are :func:`_spread_step`'s: their sample is spread over every device
    of every process.
    """
    n = parameterization.n

    def start_of(sigma0, gram):
        sens = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.diagonal(gram))))
        return jnp.where(jnp.isfinite(sigma0) & (sigma0 > 0), sigma0, sens)

    def loss_fn(params, eps, delta, sample, sigma0, screen_state):
        corr = parameterization.correlation(params)
        gram = gram_matrix(corr, b, epochs)
        start = start_of(sigma0, gram)
        if screened:
            res, screen_state, reused = calibrate_screened_reusing(
                gram, eps, delta, sample, screen_state, solver=solver, initial_noise=start,
                num_candidates=num_candidates)
            flag = res.screened
        else:
            proposal = None
            if importance:
                proposal = default_proposal(jax.lax.stop_gradient(gram), jax.lax.stop_gradient(start), eps)
            plan = DrawPlan(key=sample, num_samples=num_samples, proposal=proposal, precompute=precompute)
            res = calibrate_on_draws(gram, eps, delta, plan, solver=solver, initial_noise=start)
            flag = reused = jnp.zeros((), bool)
        err = objective(corr, n)
        rmse = res.root * err
        return jnp.log(rmse), (res.root, rmse, res.num_passes, res.status, flag, reused,
                               screen_state)

    def sample_of(sample, step_index):
        # Unscreened: `sample` is the run's key; this step's draws come from fold_in(key, step).
        return sample if screened else jax.random.fold_in(sample, step_index)

    def step(params, opt_state, eps, delta, sample, step_index, sigma0, screen_state):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, eps, delta, sample_of(sample, step_index), sigma0, screen_state)
        new_params, new_state, finite = _optimizer_step(optimizer, grads, opt_state, params)
        return new_params, new_state, loss, aux, finite

    def evaluate(params, eps, delta, sample, step_index, sigma0, screen_state):
        loss, aux = loss_fn(params, eps, delta, sample_of(sample, step_index), sigma0, screen_state)
        return loss, aux, objective(parameterization.correlation(params), n)

    def draw(key, index):
        return screened_draws(jax.random.fold_in(key, index), b, num_samples)

    def no_screen():
        # The state of "no screen yet on this sample" (None on the unscreened path).
        return (empty_screen_state(num_samples, b, num_candidates) if screened else None)

    if not screened:
        step, evaluate = _spread_step(parameterization, b, epochs, num_samples, optimizer, objective, solver,
                                      precompute, importance)
        return step, evaluate, jax.jit(draw), jax.jit(no_screen)
    return jax.jit(step), jax.jit(evaluate), jax.jit(draw), jax.jit(no_screen)


def _to_host(tree):
    """Arrays of one device as NumPy arrays (PRNG keys as they are): inputs a program over every
    device accepts from any process."""
    def host(x):
        if isinstance(x, jax.Array) and not jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            return np.asarray(x)
        return x

    return jax.tree_util.tree_map(host, tree)


def _on_first_device(tree):
    """The values of replicated arrays over several devices (or processes) as arrays on one
    device of this process: inputs of this process's own programs."""
    def first(x):
        if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
            return x.addressable_data(0)
        return x

    return jax.tree_util.tree_map(first, tree)


def _spread_step(parameterization, b, epochs, num_samples, optimizer, objective, solver, precompute,
                 importance):
    """``(step, evaluate)`` of the unscreened path, whose Monte Carlo sample is spread over every
    device of every process (:func:`calibrate_on_draws` with its default devices).

    A step is three programs.  The parameters' side -- ``C``, its Gram matrix ``G`` and square
    root ``L``, the warm start, the proposal, the objective; later their pullback and the
    optimizer update -- is compiled for one device of this process: every process computes it,
    from the same values, with the same program as a single-device run.  Only the calibration
    (its Monte Carlo sums, added in one order whatever the layout; the solver's steps; the
    implicit gradient with respect to ``G`` and ``L``) is compiled for every device.  So a step
    is the same bits on one device, on several, or on several processes: XLA compiles a program
    for several devices with other rewrites of some expressions (a division by a broadcast
    scalar, say) than a program for one, and the parameters' side (the parameterization, the
    objective, the optimizer) is arbitrary user-level code.  The loss is ``log sigma* + log err``
    (the log RMSE), its gradient ``(dsigma*/sigma*) + (derr/err)`` pulled back through ``G``,
    ``L`` and ``err``.
    """
    from dpjax.montecarlo import gram_sqrt

    n = parameterization.n

    def prep(params, eps, sigma0):
        corr = parameterization.correlation(params)
        gram = gram_matrix(corr, b, epochs)
        sens = jax.lax.stop_gradient(jnp.sqrt(jnp.max(jnp.diagonal(gram))))
        start = jnp.where(jnp.isfinite(sigma0) & (sigma0 > 0), sigma0, sens)
        proposal = None
        if importance:
            proposal = default_proposal(jax.lax.stop_gradient(gram), jax.lax.stop_gradient(start), eps)
        return (gram, gram_sqrt(gram), objective(corr, n)), (start, proposal)

    def solve(gram, sqrt_gram, eps, delta, sample, step_index, start, proposal):
        plan = DrawPlan(key=jax.random.fold_in(sample, step_index), num_samples=num_samples, proposal=proposal,
                        precompute=precompute)
        res = calibrate_on_draws(gram, eps, delta, plan, solver=solver, initial_noise=start, sqrt_gram=sqrt_gram)
        return res.root, (res.num_passes, res.status)

    def solve_with_gradient(*args):
        (root, aux), bars = jax.value_and_grad(solve, argnums=(0, 1), has_aux=True)(*args)
        return root, aux, bars

    def update(params, opt_state, eps, sigma0, root, err, bars):
        _, pullback = jax.vjp(lambda p: prep(p, eps, sigma0)[0], params)
        inverse = 1.0 / root
        (grads,) = pullback((bars[0] * inverse, bars[1] * inverse, 1.0 / err))
        new_params, new_state, finite = _optimizer_step(optimizer, grads, opt_state, params)
        # The step's loss and RMSE in the same program (eagerly they cost two more dispatches).
        rmse = root * err
        return new_params, new_state, finite, jnp.log(rmse), rmse

    prep_jit, solve_jit, solve_grad_jit, update_jit = (jax.jit(prep), jax.jit(solve), jax.jit(solve_with_gradient),
                                                       jax.jit(update))
    # On one device of one process the calibration's program takes the arrays where they are; the
    # copy through the host is for programs spanning other devices (the same values either way).
    _on_host = _to_host if (jax.process_count() > 1 or len(jax.devices()) > 1) else (lambda tree: tree)

    _FALSE = jnp.zeros((), bool)

    def aux_of(root, err, passes, status, screen_state):
        rmse = root * err
        return jnp.log(rmse), (root, rmse, passes, status, _FALSE, _FALSE, screen_state)

    def step(params, opt_state, eps, delta, sample, step_index, sigma0, screen_state):
        (gram, sqrt_gram, err), (start, proposal) = prep_jit(params, eps, sigma0)
        root, (passes, status), bars = _on_first_device(solve_grad_jit(
            *_on_host((gram, sqrt_gram, eps, delta)), sample, step_index, *_on_host((start, proposal))))
        new_params, new_state, finite, loss, rmse = update_jit(params, opt_state, eps, sigma0, root, err, bars)
        aux = (root, rmse, passes, status, _FALSE, _FALSE, screen_state)
        return new_params, new_state, loss, aux, finite

    def evaluate(params, eps, delta, sample, step_index, sigma0, screen_state):
        (gram, sqrt_gram, err), (start, proposal) = prep_jit(params, eps, sigma0)
        root, (passes, status) = _on_first_device(solve_jit(
            *_on_host((gram, sqrt_gram, eps, delta)), sample, step_index, *_on_host((start, proposal))))
        loss, aux = aux_of(root, err, passes, status, screen_state)
        return loss, aux, err

    # The step's programs, for timing them one by one (benchmarks/bench_optimize_ab.py).
    step.programs = dict(prep=prep_jit, solve=solve_jit, solve_with_gradient=solve_grad_jit, update=update_jit)
    return step, evaluate


# --------------------------------------------------------------------------- checkpoints


def _state_to_json(tree) -> list:
    leaves = jax.tree_util.tree_leaves(tree)
    return [{"dtype": str(np.asarray(x).dtype), "shape": list(np.shape(x)),
             "data": np.asarray(x).reshape(-1).tolist()} for x in leaves]


def _state_from_json(template, leaves_json):
    leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(leaves) != len(leaves_json):
        raise ValueError("checkpoint optimizer state does not match the optimizer "
                         f"({len(leaves_json)} leaves stored, {len(leaves)} expected)")
    out = []
    for leaf, j in zip(leaves, leaves_json):
        arr = np.asarray(j["data"], dtype=np.dtype(j["dtype"])).reshape(j["shape"])
        if arr.shape != np.shape(leaf):
            raise ValueError("checkpoint optimizer state does not match the optimizer (shapes)")
        out.append(jnp.asarray(arr))
    return jax.tree_util.tree_unflatten(treedef, out)


def _config(parameterization, b, epochs, eps, delta, num_samples, seed, solver, objective,
            resample_every=1, estimator="plain") -> dict:
    return {"parameterization": parameterization.to_dict(), "batches_per_epoch": b,
            "epochs": epochs, "target_epsilon": eps, "target_delta": delta,
            "num_samples": num_samples, "key": seed, "solver": repr(solver),
            "objective": getattr(objective, "__name__", repr(objective)),
            "resample_every": resample_every, "estimator": estimator}


def _write_checkpoint(path, config, step, params, opt_state, sigma, history) -> None:
    data = {"format": CHECKPOINT_FORMAT, "config": config, "step": step,
            "params": params_to_list(params), "opt_state": _state_to_json(opt_state),
            "sigma": sigma, "history": history}
    _io.atomic_write(path, _io.dumps(data))


def _screen_path(path, step: int) -> str:
    return f"{os.fspath(path)}.screen-{int(step)}.npz"


def _write_screen_state(path, step: int, state) -> None:
    """The screen state to use at ``step`` (binary sidecar of the checkpoint, written first).

    Written before the JSON checkpoint of the same step and named by the step, so whatever a
    kill leaves, the checkpoint's own step has its sidecar; older sidecars are removed after the
    checkpoint is in place (:func:`_drop_old_screen_states`).
    """
    if state is None:
        return
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(x) for name, x in zip(state._fields, state)})
    _io.atomic_write(_screen_path(path, step), buffer.getvalue())


def _drop_old_screen_states(path, keep_step: int) -> None:
    import glob

    keep = _screen_path(path, keep_step)
    for old in glob.glob(glob.escape(os.fspath(path)) + ".screen-*.npz"):
        if old != keep:
            try:
                os.unlink(old)
            except OSError:
                pass


def _read_screen_state(path, step: int, template):
    """The sidecar of ``step`` as a state like ``template``, or ``None`` (missing, unreadable or
    mismatched: the resumed run then screens afresh and agrees with an uninterrupted run to the
    solver's tolerance instead of bit for bit; a ``UserWarning`` says so)."""
    if template is None:
        return None
    sidecar = _screen_path(path, step)
    why = None
    try:
        with np.load(sidecar) as z:
            leaves = [np.asarray(z[name]) for name in template._fields]
    except FileNotFoundError:
        why = "is missing"
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        why = f"cannot be read ({type(exc).__name__}: {exc})"
    else:
        if any(a.shape != np.shape(t) or a.dtype != np.asarray(t).dtype for a, t in zip(leaves, template)):
            why = "does not match this configuration"
    if why is not None:
        warnings.warn(f"resume: the screen-state sidecar {sidecar!r} {why}; the run resumes with a fresh screen "
                      f"(agrees with an uninterrupted run to the solver's tolerance, not bit for bit)",
                      UserWarning, stacklevel=4)  # the caller of optimize_correlation
        return None
    return type(template)(*[jnp.asarray(a) for a in leaves])


def _read_checkpoint(path, config):
    try:
        with open(path, "rb") as f:
            data = _io.loads(f.read())
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise ValueError(f"checkpoint.path: cannot read checkpoint {os.fspath(path)!r}: {exc}") from exc
    if data.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint.path: {os.fspath(path)!r} is not a dpjax optimize checkpoint")
    stored = data["config"]
    if stored != _io.loads(_io.dumps(config)):
        diff = sorted(k for k in set(stored) | set(config) if stored.get(k) != config.get(k))
        raise ValueError(f"checkpoint.path: {os.fspath(path)!r} was written by a different "
                         f"configuration (differs in {diff}); use another path or resume=False")
    return data


# --------------------------------------------------------------------------- the loop


def _certify_settings(certify) -> CertifySettings | None:
    """``certify=`` of :func:`optimize_correlation` as settings, or ``None`` (no certificate)."""
    if certify is True:
        return CertifySettings()
    if certify is False or certify is None:
        return None
    if isinstance(certify, CertifySettings):
        return certify
    raise ValueError("certify must be a CertifySettings(...), True (the default settings) or False (no "
                     f"certificate), got {certify!r}")


def _check_records(parameterization, problem, settings, checkpoint) -> None:
    """``ValueError`` naming the argument whose record is of the wrong type."""
    if not isinstance(parameterization, Parameterization):
        raise ValueError("parameterization must be a dpjax.optimization parameterization "
                         f"(make_parameterization(...)), got {type(parameterization).__name__}")
    for name, value, kind in (("problem", problem, CorrelationProblem), ("settings", settings, OptimizerSettings)):
        if not isinstance(value, kind):
            raise ValueError(f"{name} must be a dpjax.optimization.{kind.__name__}(...), got {value!r}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise ValueError(f"checkpoint must be None or a dpjax.optimization.Checkpoint(path, ...), got {checkpoint!r}")


def optimize_correlation(parameterization, problem: CorrelationProblem,
                         settings: OptimizerSettings = OptimizerSettings(), *,
                         certify: CertifySettings | bool = True, checkpoint: Checkpoint | None = None,
                         progress: bool | None = None) -> OptimizationResult:
    """Optimise ``C`` in ``parameterization`` for the RMSE under balls-in-bins, b-min-sep or
    random-allocation sampling, then certify.

    Args:
      parameterization: from :func:`dpjax.optimization.make_parameterization` (``n = b * E``;
        under b-min-sep ``n = num_rounds`` and a banded Toeplitz family with at most
        ``min_sep`` bands; under random allocation ``n = t * E`` and a banded Toeplitz family
        with at most :data:`dpjax.montecarlo.allocation.MAX_BANDS` = 6 bands).
      problem: :class:`~dpjax.optimization.CorrelationProblem`, what is optimised: the privacy
        target, the scheme ``dpjax.BallsInBins(b)`` with the epochs ``E`` or
        ``dpjax.BMinSepSampling(min_sep, sampling_prob, num_rounds)``, the objective, and the
        balls-in-bins training sampler's ``dataset_size`` / ``batch_size`` when the certificate
        must pay for its truncation.  Under b-min-sep each step calibrates ``sigma`` with
        :func:`dpjax.montecarlo.bminsep.calibrate_on_samples` on ``num_samples`` fresh plain
        draws (default 2^13; the estimate is the plain one whatever ``estimator`` says, and
        ``resample_every``, ``num_candidates``, ``precompute`` and ``solver`` are balls-in-bins
        settings, refused when set away from their defaults), and the result records the scheme
        in ``sampling``.  Under ``dpjax.RandomAllocation(t, k)`` with ``epochs = E`` the same, with
        :func:`dpjax.montecarlo.allocation.calibrate_on_samples` (``k <= min(t, 32)``).
      settings: :class:`~dpjax.optimization.OptimizerSettings`, how: steps, optax optimizer,
        in-loop samples and estimator, resampling, screening, solver, key, start (default:
        300 Adam steps on the importance estimate, 2^11 samples per step, key 0).
      certify: :class:`~dpjax.optimization.CertifySettings` of the certificate, ``True`` (the
        default settings; under b-min-sep and random allocation ``CertifySettings(method=
        "bernoulli_kl")``, the one method :meth:`dpjax.montecarlo.BMinSep.certify_noise` and
        :meth:`dpjax.montecarlo.RandomAllocation.certify_noise` have) or ``False`` (no
        certificate: ``noise_multiplier`` and ``rmse`` are NaN).  The certificate is the
        certify step :func:`certify_result` on the optimised result, its key by default
        ``fold_in(settings.key, 2^31 - 1)``, which the optimisation
        never uses; a ``"bernoulli_kl"`` sample count that cannot verify the target is refused
        before the first step.
      checkpoint: :class:`~dpjax.optimization.Checkpoint` (path, every, resume), or ``None``.
      progress: progress bar and stage notes on stderr (``None``: auto, see
        :mod:`dpjax._base.progress`).

    Returns:
      :class:`OptimizationResult` (``noise_multiplier``: the certified sigma, noise std over
      the clipping norm; ``rmse``: at that sigma; floats in float64).

    Example::

        problem = CorrelationProblem(sampling=dpjax.BallsInBins(8), epochs=4, target_epsilon=2.0,
                                     target_delta=1e-5)
        res = optimize_correlation(make_parameterization("blt", 32, num_buffers=2), problem,
                                   OptimizerSettings(num_steps=100))
        res.noise_multiplier, res.rmse, res.certificate.failure_probability

        # b-min-sep: a 2-band C for 64 rounds, each example sitting out 3 rounds after it trains.
        problem = CorrelationProblem(sampling=dpjax.BMinSepSampling(min_sep=4, sampling_prob=0.25,
                                     num_rounds=64), target_epsilon=2.0, target_delta=1e-3)
        res = optimize_correlation(make_parameterization("banded", 64, bands=2), problem,
                                   OptimizerSettings(num_steps=100, num_samples=1 << 12))
        res.noise_multiplier, res.sampling, res.certificate.num_samples

        # random allocation: each example in 2 of 8 batches per epoch, drawn afresh for 4 epochs.
        problem = CorrelationProblem(sampling=dpjax.RandomAllocation(8, selections_per_epoch=2), epochs=4,
                                     target_epsilon=2.0, target_delta=1e-3)
        res = optimize_correlation(make_parameterization("banded", 32, bands=2), problem,
                                   OptimizerSettings(num_steps=100, num_samples=1 << 12))

    Raises:
      ValueError: bad input, naming the argument (a record of the wrong type,
        ``parameterization.n != b * E`` or ``!= num_rounds``, a BLT or a family with more than
        ``min_sep`` bands under b-min-sep (more than 6 under random allocation),
        ``method="importance_betting"`` or a balls-in-bins setting under b-min-sep or random
        allocation, bad
        ``init_params``, a ``"bernoulli_kl"`` ``num_samples`` that cannot verify the target
        (says the minimum), a checkpoint of another configuration).  Nothing is written before
        the inputs are validated.
    """
    _check_records(parameterization, problem, settings, checkpoint)
    if problem.is_b_min_sep or problem.is_random_allocation:
        return _optimize_chain(parameterization, problem, settings, certify, checkpoint, progress)
    certify = _certify_settings(certify)
    b, epochs = parameterization._check_pattern(problem.batches_per_epoch, problem.epochs)
    eps, delta = problem.target_epsilon, problem.target_delta
    if certify is not None:
        certify.samples_for(delta, problem.sampler.certify_delta)  # refused now, not after the steps
    estimator, num_samples, num_steps = settings.estimator, settings.samples_per_step, settings.num_steps
    solver, precompute, objective = settings.solver, settings.precompute, problem.objective
    importance = estimator == Estimator.IMPORTANCE
    screened = (not importance and isinstance(solver, NewtonIllinois) and precompute is not False
                and (precompute or num_samples * b <= MAX_PRECOMPUTED))
    # The unscreened step draws fresh samples every step.
    resample_every = settings.resample_every if screened else 1
    seed, jkey, optimizer, params = _run_start(parameterization, settings)
    key_data = np.asarray(jax.random.key_data(jkey)).tolist()
    config = _config(parameterization, b, epochs, eps, delta, num_samples, key_data, solver, objective,
                     resample_every, estimator)
    checkpoint_path = None if checkpoint is None else checkpoint.path

    t_start = time.perf_counter()
    with jax.enable_x64(True):
        fns = _compiled(parameterization, b, epochs, num_samples, optimizer, objective, solver, precompute,
                        screened, settings.num_candidates, importance)
        run = _start(params, optimizer.init(params), fns,
                     checkpoint_path if checkpoint is not None and checkpoint.resume else None, config, num_steps)
        _run_steps(run, fns, jkey, eps, delta, num_steps, resample_every if screened else None,
                   checkpoint, config, progress)
        done = run.history[-1]["step"] + 1 if run.history else run.start
        if checkpoint_path is not None:
            _save(checkpoint_path, config, done, run)
        # The estimate at the final parameters (fresh draws of index `done`).
        _, eval_fn, draw_fn, _ = fns
        eval_sample = draw_fn(jkey, done) if screened else jkey
        _, aux_f, err_f = eval_fn(run.params, eps, delta, eval_sample, done, run.sigma, run.no_screen)
        sigma_est, err = float(aux_f[0]), float(err_f)
        first_column = np.asarray(parameterization.first_column(run.params)).tolist()
    sampler = problem.sampler
    result = _uncertified_result(
        parameterization, run, problem, (sigma_est, err, first_column), t_start, batches_per_epoch=b, epochs=epochs,
        num_steps=num_steps, num_samples=num_samples, seed=seed, estimator=estimator,
        dataset_size=sampler.dataset_size, batch_size=sampler.batch_size, truncation_delta=sampler.truncation_delta)
    if certify is None:
        return result
    ckey = jax.random.fold_in(jkey, _CERTIFY_FOLD) if certify.key is None else as_prng_key(certify.key)
    return _certify(result, certify, ckey, progress)


#: The fold of the optimisation's key that gives the certificate's default key (never a step's).
_CERTIFY_FOLD = 2**31 - 1


def _run_start(parameterization, settings: OptimizerSettings):
    """``(seed, key, optimizer, params)`` of a run: the int seed (``-1`` for a JAX key), the JAX
    key, the optax optimizer and the checked starting parameters."""
    key = settings.key
    seed = int(key) if isinstance(key, (int, np.integer)) and not isinstance(key, bool) else -1
    optimizer = default_optimizer() if settings.optimizer is None else settings.optimizer
    params = parameterization.init() if settings.init_params is None else settings.init_params
    return seed, as_prng_key(key), optimizer, params_from_list(params_to_list(parameterization.check_params(params)))


def _uncertified_result(parameterization, run: "_Run", problem: CorrelationProblem, estimate, t_start: float,
                        **fields) -> OptimizationResult:
    """The result of a finished run before its certificate: ``estimate = (sigma_est, err,
    first_column)`` at the final parameters; ``fields``: the scheme's and the run's configuration."""
    sigma_est, err, first_column = estimate
    return OptimizationResult(
        parameterization=parameterization.to_dict(), target_epsilon=problem.target_epsilon,
        target_delta=problem.target_delta, params=params_to_list(run.params), first_column=first_column,
        noise_multiplier=math.nan, noise_multiplier_estimate=sigma_est, error=err, rmse=math.nan,
        rmse_estimate=sigma_est * err, certificate=None, history=run.history, status=run.status,
        stop_reason=run.stop_reason, timings={**run.timings, "certify": 0.0, "total": time.perf_counter() - t_start},
        **fields)


def _with_certificate(result: OptimizationResult, certificate: Certificate, seconds: float) -> OptimizationResult:
    """``result`` released at the certificate's noise multiplier (``seconds``: the certificate's time)."""
    sigma = certificate.noise_multiplier
    timings = {**result.timings, "certify": seconds, "total": result.timings.get("total", 0.0) + seconds}
    return dataclasses.replace(result, noise_multiplier=sigma, rmse=sigma * result.error, certificate=certificate,
                               timings=timings)


def _default_certify_settings(sampling) -> CertifySettings:
    """The certify step's default settings for a result of scheme record ``sampling``: the
    balls-in-bins default (``None``), Bernoulli-KL for a chain scheme (its accountants' one method)."""
    return CertifySettings() if sampling is None else CertifySettings(method="bernoulli_kl")


def certify_result(result: OptimizationResult, settings: CertifySettings | None = None, *,
                   progress: bool | None = None) -> OptimizationResult:
    """The certify step: ``result`` with its noise multiplier certified by Estimate-Verify-Release.

    Certifies the optimised ``C`` of ``result`` at its ``(target_epsilon, target_delta)`` (less
    the sampler's ``truncation_delta`` when the result names a training sampler) on draws
    independent of the optimisation's (:func:`~dpjax.optimization.certify_noise`), starting the
    ladder near ``result.noise_multiplier_estimate``.
    ``optimize_correlation(..., certify=settings)`` is this step applied to the uncertified
    result (``certify=False``), value for value.

    Args:
      result: an :class:`OptimizationResult` (certified or not; a certificate it holds is
        replaced).
      settings: :class:`~dpjax.optimization.CertifySettings`; its ``key`` by default is
        ``fold_in(key(result.seed), 2^31 - 1)``, the key ``optimize_correlation`` certifies
        with (a result optimised from a JAX key stores no seed: give ``key`` then).  ``None``
        (default): ``CertifySettings()`` for balls-in-bins, ``CertifySettings(method=
        "bernoulli_kl")`` for a b-min-sep or random-allocation result (``result.sampling``; the
        only method there: :meth:`dpjax.montecarlo.BMinSep.certify_noise`,
        :meth:`dpjax.montecarlo.RandomAllocation.certify_noise`).
      progress: a note and an elapsed-time meter on stderr (``None``: auto).

    Returns:
      the :class:`OptimizationResult` with ``noise_multiplier`` (the certified sigma; ``inf``
      when no rung verified), ``rmse = noise_multiplier * error``, ``certificate`` and
      ``timings["certify"]`` (seconds) set; every other field as in ``result``.

    Example::

        res = optimize_correlation(p, problem, certify=False)
        res = certify_result(res, CertifySettings(method="bernoulli_kl", num_samples=1 << 21))
        res.noise_multiplier, res.certificate.failure_probability

    Raises:
      ValueError: ``result`` or ``settings`` of the wrong type; no ``key`` for a result without
        a seed; a ``"bernoulli_kl"`` sample count that cannot verify the target (says the
        minimum); ``method="importance_betting"`` for a b-min-sep or random-allocation result.
    """
    if not isinstance(result, OptimizationResult):
        raise ValueError(f"result must be an OptimizationResult (optimize_correlation's), got {type(result).__name__}")
    if settings is None:
        settings = _default_certify_settings(result.sampling)
    if not isinstance(settings, CertifySettings):
        raise ValueError(f"settings must be a dpjax.optimization.CertifySettings(...), got {settings!r}")
    if settings.key is not None:
        ckey = as_prng_key(settings.key)
    elif result.seed >= 0:
        ckey = jax.random.fold_in(as_prng_key(result.seed), _CERTIFY_FOLD)
    else:
        raise ValueError("key: the result was optimised from a JAX key, which it does not store; give the "
                         "certificate's key, CertifySettings(key=...)")
    return _certify(result, settings, ckey, progress)


def _certify(result: OptimizationResult, settings: CertifySettings, ckey, progress) -> OptimizationResult:
    """:func:`certify_result` with the certificate's key resolved."""
    if result.sampling is not None:
        return _certify_chain(result, settings, ckey, progress)
    b, epochs, eps = result.batches_per_epoch, result.epochs, result.target_epsilon
    certify_delta = sampler_terms(result.dataset_size, result.batch_size, b, eps, result.target_delta).certify_delta
    settings = dataclasses.replace(settings, num_samples=settings.samples_for(result.target_delta, certify_delta),
                                   key=ckey)
    t_c = time.perf_counter()
    with jax.enable_x64(True):
        corr = result.correlation()
    certificate = _certificate(corr, b, epochs, eps, certify_delta, settings, result.noise_multiplier_estimate,
                               progress)
    return _with_certificate(result, certificate, time.perf_counter() - t_c)


@dataclasses.dataclass
class _Run:
    """The loop's mutable state: what a checkpoint stores and what the result reports.

    ``stop_reason`` is empty while the run goes on (status ``"completed"``); a step with a
    non-finite loss or parameter sets it (``"stopped"``).  ``timings``: the loop's seconds under
    the result's names (``compile_and_first_step``, ``steps``, ``draws``, ``first_draw``)."""

    params: Any
    opt_state: Any
    start: int
    sigma: float
    history: list
    no_screen: Any
    screen_state: Any
    restored: bool
    stop_reason: str = ""
    timings: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(
        ("compile_and_first_step", "steps", "draws", "first_draw"), 0.0))

    @property
    def status(self) -> OptimizationStatus:
        return OptimizationStatus.STOPPED if self.stop_reason else OptimizationStatus.COMPLETED


def _start(params, opt_state, fns, resume_path, config, num_steps) -> _Run:
    """The state at the first step: fresh, or restored from the checkpoint at ``resume_path``
    (when it exists) with its screen-state sidecar."""
    no_screen = fns[3]()
    run = _Run(params=params, opt_state=opt_state, start=0, sigma=math.nan, history=[], no_screen=no_screen,
               screen_state=no_screen, restored=False)
    if resume_path is not None and os.path.exists(resume_path):
        ck = _read_checkpoint(resume_path, config)
        run.params = params_from_list(ck["params"])
        run.opt_state = _state_from_json(opt_state, ck["opt_state"])
        run.start, run.sigma, run.history = int(ck["step"]), float(ck["sigma"]), list(ck["history"])
        restored_state = _read_screen_state(resume_path, run.start, no_screen)
        if restored_state is not None:
            run.screen_state, run.restored = restored_state, True
        if run.start > num_steps:
            raise ValueError(f"num_steps = {num_steps} is below the checkpoint's step {run.start}")
    return run


def _save(checkpoint_path, config, step: int, run: _Run) -> None:
    """Checkpoint ``run`` at ``step``: the screen-state sidecar first, then the JSON, then the
    older sidecars removed (whatever a kill leaves, the checkpoint's step has its sidecar).
    Several processes (``jax.distributed``) hold the same state: process 0 writes it, and every
    process reads it when a run resumes (a file system they share)."""
    if jax.process_index() != 0:
        return
    _write_screen_state(checkpoint_path, step, run.screen_state)
    _write_checkpoint(checkpoint_path, config, step, run.params, run.opt_state, run.sigma, run.history)
    _drop_old_screen_states(checkpoint_path, step)


def _run_steps(run: _Run, fns, jkey, eps, delta, num_steps, resample_every, checkpoint: Checkpoint | None,
               config, progress) -> None:
    """Steps ``run.start .. num_steps - 1`` (fewer if one gives a non-finite loss or parameter),
    updating ``run`` in place.  ``resample_every``: steps per shared sample on the screened
    path, ``None`` on the unscreened one (each step draws its own).  ``checkpoint``: written
    every ``checkpoint.every`` steps (``None``: never)."""
    step_fn, _, draw_fn, _ = fns
    screened = resample_every is not None
    every = resample_every if screened else 1
    sample, period = jkey, None
    t_steps = time.perf_counter()
    # warmup=1: the first step compiles; the ETA is that of the steps after it.
    with _progress(num_steps, "optimize", enabled=progress, initial=run.start, warmup=1) as bar:
        for k in range(run.start, num_steps):
            t0 = time.perf_counter()
            if screened and period != k // every:
                # The sample depends only on (key, k // R): a resumed run redraws it exactly.
                period = k // every
                sample = jax.block_until_ready(draw_fn(jkey, period))
                if k == run.start:
                    run.timings["first_draw"] = time.perf_counter() - t0  # includes its compilation
                run.timings["draws"] += time.perf_counter() - t0
                t0 = time.perf_counter()
            if k % every == 0 or (k == run.start and not run.restored):
                # A screen is reused only on the sample it was computed on.  A resumed run
                # restores the state from the checkpoint's sidecar, so it computes exactly
                # the steps of an uninterrupted run (same screens, same summation order).
                run.screen_state = run.no_screen
            new_params, new_state, loss, aux, params_finite = step_fn(run.params, run.opt_state, eps, delta,
                                                                      sample, k, run.sigma, run.screen_state)
            # One device-to-host transfer for the step's scalars (the state stays on device).
            loss, scalars, params_finite = jax.device_get((loss, aux[:6], params_finite))
            loss = float(loss)
            s_k, rmse_k, passes, solver_status, was_screened, was_reused = (
                float(scalars[0]), float(scalars[1]), int(scalars[2]), int(scalars[3]),
                bool(scalars[4]), bool(scalars[5]))
            if k == run.start:
                run.timings["compile_and_first_step"] = time.perf_counter() - t0
            if not (math.isfinite(loss) and bool(params_finite)) or solver_status != 0:
                run.stop_reason = (f"step {k}: non-finite loss or parameters (loss={loss}, sigma={s_k}, "
                              f"solver status {solver_status}); kept the parameters of step {k}")
                break
            run.history.append({"step": k, "loss": loss, "rmse": rmse_k, "noise_multiplier": s_k,
                                "solver_passes": passes, "screened": was_screened,
                                "screen_reused": was_reused})
            run.params, run.opt_state, run.sigma, run.screen_state = new_params, new_state, s_k, aux[6]
            bar.update(1, rmse=f"{rmse_k:.5g}", sigma=f"{s_k:.5g}")
            if checkpoint is not None and ((k + 1) % checkpoint.every == 0):
                _save(checkpoint.path, config, k + 1, run)
    run.timings["steps"] = time.perf_counter() - t_steps


def _certificate(corr, b, epochs, eps, delta, settings: CertifySettings, sigma_est, progress) -> Certificate:
    """The certificate of the optimised ``C`` (:func:`certify_noise`), or, when the
    variance-reduced method finds from its calibration sample that its sample count cannot
    certify this ``C``, an unverified certificate that says why (the optimised ``C`` is kept)."""
    method = settings.method
    _note(f"certify: the noise multiplier of the optimized C by Estimate-Verify-Release ({method}) on "
          "fresh Monte Carlo samples", enabled=progress)
    try:
        with _elapsed_meter("certify", enabled=progress):
            return Certificate.from_dict(certify_noise(
                corr, b, epochs, target_epsilon=eps, target_delta=delta, settings=settings,
                initial_noise=sigma_est if math.isfinite(sigma_est) else None))
    except ValueError as exc:
        if method != "importance_betting":
            raise
        # The variance-reduced certificate learns only from its calibration sample whether its
        # sample count can certify this C (the summands' range depends on C).
        nan = math.nan
        return Certificate(verified=False, method=method, procedure="ladder", epsilon=eps,
                           delta=math.inf, target_delta=delta, base_delta=nan, tau=nan,
                           failure_probability=nan, num_tests=int(settings.max_attempts),
                           num_samples=settings.num_samples, calibration_samples=0, noise_multiplier=math.inf,
                           noise_multiplier_estimate=sigma_est, delta_estimate=nan, standard_error=nan,
                           delta_remove=nan, delta_add=nan, tests_run=0, growth=nan, range_remove=nan,
                           range_add=nan, reason=f"not certified: {exc}")


# --------------------------------------------------------------------------- chain schemes


#: The scheme records of the chain-scheme results (:attr:`OptimizationResult.sampling`).
B_MIN_SEP = "b_min_sep"
RANDOM_ALLOCATION = "random_allocation"


@dataclasses.dataclass(frozen=True)
class _Chain:
    """A scheme the loop accounts with a chain accountant (:mod:`dpjax.montecarlo._chain`: an
    exact likelihood ratio by a forward algorithm, for banded ``C`` only): ``scheme`` a
    :class:`dpjax.BMinSepSampling` (``epochs`` ``None``) or a :class:`dpjax.RandomAllocation`
    with its ``epochs``.  What differs between the two is here: the band limit, the scheme
    record, the accountant of the certificate, and the split of the scheme into its static part
    (:attr:`static`, with the per-step calibration: the key of the compiled-program cache) and
    its data (:attr:`data`: b-min-sep's ``sampling_prob``, an argument of those programs)."""

    scheme: Any
    epochs: int | None = None

    @classmethod
    def of_problem(cls, problem: CorrelationProblem) -> "_Chain":
        return cls(problem.sampling, None if problem.is_b_min_sep else problem.epochs)

    @classmethod
    def of_record(cls, record) -> "_Chain":
        """The scheme of a result's ``sampling`` record (``ValueError`` for any other record)."""
        from dpjax.pld.scenario import BMinSepSampling, RandomAllocation

        scheme = record.get("scheme") if isinstance(record, dict) else None
        if scheme == B_MIN_SEP and record.get("warm_start", True) is not True:
            raise ValueError(f"result.sampling: the optimisation accounts b-min-sep from the stationary start "
                             f"(warm_start True), got {record!r}")
        if scheme == B_MIN_SEP:
            return cls(BMinSepSampling(record["min_sep"], record["sampling_prob"], record["num_rounds"]))
        if scheme == RANDOM_ALLOCATION:
            return cls(RandomAllocation(record["batches_per_epoch"], record["selections_per_epoch"]),
                       int(record["epochs"]))
        raise ValueError(f"result.sampling must be a b-min-sep record (scheme {B_MIN_SEP!r}) or a random-allocation "
                         f"record (scheme {RANDOM_ALLOCATION!r}), got {record!r}")

    @property
    def is_b_min_sep(self) -> bool:
        return self.epochs is None

    @property
    def words(self) -> str:
        """The scheme in words, after "for"/"under"."""
        return "b-min-sep sampling" if self.is_b_min_sep else "random allocation"

    @property
    def num_rounds(self) -> int:
        return self.scheme.num_rounds if self.is_b_min_sep else self.scheme.batches_per_epoch * self.epochs

    def band_limit(self) -> tuple[int, str, str]:
        """``(most bands, the limit's name, why)``."""
        if self.is_b_min_sep:
            return (self.scheme.min_sep, f"min_sep = {self.scheme.min_sep}",
                    "two participations' columns of C must not overlap")
        from dpjax.montecarlo.allocation import MAX_BANDS

        return (MAX_BANDS, f"dpjax.montecarlo.allocation.MAX_BANDS = {MAX_BANDS}",
                "the exact likelihood ratio carries the last bands - 1 participations in the state of a forward "
                "algorithm, 2^(bands - 1) (k + 1) states; docs/design.md §4.4")

    def record(self) -> dict:
        """:attr:`OptimizationResult.sampling` of a result under this scheme."""
        s = self.scheme
        if self.is_b_min_sep:
            return {"scheme": B_MIN_SEP, "min_sep": s.min_sep, "sampling_prob": s.sampling_prob,
                    "num_rounds": s.num_rounds, "warm_start": True}
        return {"scheme": RANDOM_ALLOCATION, "batches_per_epoch": s.batches_per_epoch,
                "selections_per_epoch": s.selections_per_epoch, "epochs": self.epochs}

    @property
    def static(self) -> "_ChainStatic":
        """The part of the scheme the compiled programs depend on (the key of their cache)."""
        s = self.scheme
        if self.is_b_min_sep:
            return _ChainStatic(B_MIN_SEP, (s.min_sep, s.num_rounds))
        return _ChainStatic(RANDOM_ALLOCATION, (s.batches_per_epoch, s.selections_per_epoch, self.epochs))

    @property
    def data(self):
        """The part of the scheme the compiled programs take as an argument: b-min-sep's
        ``sampling_prob`` as a float64 array (a new ``p`` is data, not a new program), ``None``
        under random allocation (none)."""
        return np.asarray(self.scheme.sampling_prob, np.float64) if self.is_b_min_sep else None

    def accountant(self, first_column):
        """The scheme's Monte Carlo accountant of ``C`` (its Toeplitz ``first_column``), whose
        ``certify_noise`` certifies the result."""
        from dpjax.montecarlo import BMinSep, allocation

        s = self.scheme
        if self.is_b_min_sep:
            return BMinSep(first_column, s.sampling_prob, s.min_sep, s.num_rounds, warm_start=True)
        return allocation.RandomAllocation(first_column, s.batches_per_epoch, self.epochs,
                                           selections_per_epoch=s.selections_per_epoch)


@dataclasses.dataclass(frozen=True)
class _ChainStatic:
    """The static part of a chain scheme (:attr:`_Chain.static`), on which its compiled step and
    evaluate programs are cached: ``kind`` :data:`B_MIN_SEP` with ``sizes`` ``(min_sep,
    num_rounds)``, or :data:`RANDOM_ALLOCATION` with ``(batches_per_epoch, selections_per_epoch,
    epochs)``.  The rest of the scheme (:attr:`_Chain.data`: b-min-sep's ``sampling_prob``) is an
    argument of those programs."""

    kind: str
    sizes: tuple

    def calibrate(self, bands, eps, delta, key, num_samples: int, data):
        """``sigma*`` on ``num_samples`` draws of ``key`` (:class:`~dpjax.calibration.Solution`,
        the implicit gradient through ``bands``): the scheme's ``calibrate_on_samples``, ``data``
        the scheme's :attr:`_Chain.data` (traced: b-min-sep's ``sampling_prob``)."""
        from dpjax.montecarlo import allocation, bminsep

        if self.kind == B_MIN_SEP:
            min_sep, _ = self.sizes
            return bminsep.calibrate_on_samples(bands, eps, delta, data, key, min_sep=min_sep,
                                                num_samples=num_samples)
        batches_per_epoch, selections_per_epoch, _ = self.sizes
        return allocation.calibrate_on_samples(bands, eps, delta, key, batches_per_epoch=batches_per_epoch,
                                               num_samples=num_samples, selections_per_epoch=selections_per_epoch)


def _chain_bands(parameterization, chain: _Chain) -> int:
    """The band count of ``C`` for a chain scheme, or a ``ValueError`` naming the argument: the
    accountant's likelihood ratio is exact only for ``C`` with at most the scheme's limit of bands
    (``min_sep`` for b-min-sep, :data:`dpjax.montecarlo.allocation.MAX_BANDS` for random
    allocation), and the family must be non-negative Toeplitz."""
    from dpjax.optimization.parameterizations import (BandedToeplitzParameterization, BLTParameterization,
                                                      ToeplitzParameterization)

    most, limit, why = chain.band_limit()
    accounting = "b-min-sep" if chain.is_b_min_sep else "random-allocation"
    hint = f"use make_parameterization('banded', n, bands=k) with 1 <= k <= {limit}"
    if isinstance(parameterization, BLTParameterization):
        raise ValueError(f"parameterization: a BLT correlation matrix is not banded (every entry below the diagonal "
                         f"is non-zero), and {accounting} accounting needs C with at most {limit} bands; {hint}")
    if isinstance(parameterization, BandedToeplitzParameterization):
        k = parameterization.bands
    elif isinstance(parameterization, ToeplitzParameterization):
        k = parameterization.n
    else:
        raise ValueError(f"parameterization must be a banded Toeplitz family for {chain.words}, got "
                         f"{parameterization!r}; {hint}")
    if k > most:
        short = "min_sep" if chain.is_b_min_sep else f"{most}"
        raise ValueError(f"parameterization has {k} bands but {limit}: {accounting} accounting needs C with at "
                         f"most {short} bands ({why}); {hint}")
    if parameterization.n != chain.num_rounds:
        rounds = ("BMinSepSampling's num_rounds" if chain.is_b_min_sep else
                  "batches_per_epoch * epochs of the random allocation")
        raise ValueError(f"n must equal {rounds} = {chain.num_rounds}, got n={parameterization.n}")
    return k


def _band_table_of(parameterization, params, num_bands: int):
    """The ``(n, k)`` band table of ``C(params)`` (``bands[j, t] = c_t`` while ``j + t < n``;
    :func:`dpjax.montecarlo.bminsep.band_table`, :func:`dpjax.montecarlo.allocation.band_table`),
    differentiable in ``params``."""
    n = parameterization.n
    column = parameterization.first_column(params)[:num_bands]
    inside = (np.arange(n)[:, None] + np.arange(num_bands)[None, :]) < n
    return jnp.where(inside, column[None, :], 0.0)


@functools.lru_cache(maxsize=16)
def _chain_programs(parameterization, static: _ChainStatic, num_bands: int, num_samples: int, optimizer,
                    objective: Callable):
    """``(step, evaluate)``: the jitted programs of a chain scheme, cached on its static part only
    (:class:`_ChainStatic`); both take the scheme's data (:attr:`_Chain.data`) as their last
    argument, so schemes that differ only there (b-min-sep's ``sampling_prob``) share them."""
    n = parameterization.n
    passes = jnp.asarray(DEFAULT_NUM_ITERATIONS, jnp.int32)
    no = jnp.zeros((), bool)

    def loss_fn(params, eps, delta, key, data):
        corr = parameterization.correlation(params)
        sol = static.calibrate(_band_table_of(parameterization, params, num_bands), eps, delta, key, num_samples,
                               data)
        err = objective(corr, n)
        rmse = sol.root * err
        return jnp.log(rmse), (sol.root, rmse, sol.status, err)

    def _chain_step(params, opt_state, eps, delta, sample, step_index, sigma0, screen_state, data):
        # Fresh draws every step, from fold_in(key, step); sigma0 is unused (the bisection
        # brackets from the sensitivity) and there is no screen.
        (loss, (root, rmse, status, _)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, eps, delta, jax.random.fold_in(sample, step_index), data)
        new_params, new_state, finite = _optimizer_step(optimizer, grads, opt_state, params)
        return new_params, new_state, loss, (root, rmse, passes, status, no, no, screen_state), finite

    def evaluate(params, eps, delta, sample, step_index, sigma0, screen_state, data):
        loss, (root, rmse, status, err) = loss_fn(params, eps, delta, jax.random.fold_in(sample, step_index), data)
        return loss, (root, rmse, passes, status, no, no, screen_state), err

    return jax.jit(_chain_step), jax.jit(evaluate)


def _compiled_chain(parameterization, chain: _Chain, num_samples: int, optimizer, objective: Callable):
    """``(step, evaluate, draw, no_screen)`` of a chain scheme, in the shape :func:`_run_steps`
    and :func:`_start` take (no screen: ``draw`` returns the run's key and ``no_screen`` ``None``).

    ``step`` and ``evaluate`` are thin wrappers that pass ``chain.data`` (b-min-sep's
    ``sampling_prob``, a float64 array) to :func:`_chain_programs`' jitted programs, which are
    cached on the static configuration (the scheme's static part, like :func:`_compiled`): a new
    ``sampling_prob`` is a new argument, not a new program."""
    step_jit, evaluate_jit = _chain_programs(parameterization, chain.static, _chain_bands(parameterization, chain),
                                             num_samples, optimizer, objective)
    data = chain.data

    def step(params, opt_state, eps, delta, sample, step_index, sigma0, screen_state):
        return step_jit(params, opt_state, eps, delta, sample, step_index, sigma0, screen_state, data)

    def evaluate(params, eps, delta, sample, step_index, sigma0, screen_state):
        return evaluate_jit(params, eps, delta, sample, step_index, sigma0, screen_state, data)

    return step, evaluate, (lambda key, index: key), (lambda: None)


def _check_chain_settings(settings: OptimizerSettings, chain: _Chain) -> None:
    """A ``ValueError`` for the :class:`OptimizerSettings` fields the chain path has no use for,
    when set away from their defaults: each step calibrates by bisection on the plain estimate of
    fresh draws, so there is no screen to resample (``resample_every``, ``num_candidates``), no
    materialised projections (``precompute``) and no choice of solver (``solver``).  Ignoring them
    would let a user believe a setting took effect."""
    defaults = OptimizerSettings()
    unused = [name for name in ("resample_every", "num_candidates", "precompute", "solver")
              if getattr(settings, name) != getattr(defaults, name)]
    if unused:
        raise ValueError(f"{', '.join(unused)}: not used under {chain.words} (each step calibrates sigma by "
                         f"bisection on the plain estimate of fresh draws: no screen, no materialised projections, "
                         f"no solver choice); leave {'them' if len(unused) > 1 else 'it'} at the default")


def _chain_certify_settings(certify, chain: _Chain) -> CertifySettings | None:
    """``certify=`` under a chain scheme: ``True`` is the Bernoulli-KL certificate (the only one
    the chain accountants have); ``"importance_betting"`` is refused before the first step."""
    if certify is True:
        return _default_certify_settings(chain.record())
    settings = _certify_settings(certify)
    if settings is not None and settings.method != "bernoulli_kl":
        raise ValueError(f"method must be 'bernoulli_kl' for {chain.words}, CertifySettings(method="
                         f"'bernoulli_kl', ...) (the 'importance_betting' certificate needs the balls-in-bins "
                         f"importance sampler), got {str(settings.method)!r}")
    return settings


def _optimize_chain(parameterization, problem: CorrelationProblem, settings: OptimizerSettings, certify,
                    checkpoint: Checkpoint | None, progress) -> OptimizationResult:
    """:func:`optimize_correlation` under :class:`dpjax.BMinSepSampling` or
    :class:`dpjax.RandomAllocation` (records checked).

    Each step calibrates ``sigma*`` on ``num_samples`` fresh draws from ``fold_in(key, step)``
    with the scheme's ``calibrate_on_samples`` (:func:`dpjax.montecarlo.bminsep.calibrate_on_samples`,
    :func:`dpjax.montecarlo.allocation.calibrate_on_samples`: bisection in ``log sigma``, the
    plain estimate: there is no importance sampler or screen for these schemes) and takes an
    optax step on ``log(sigma* err)``, the gradient through the bands by the implicit function
    theorem.  The loop, checkpoints and resume are :func:`_run_steps`'s; the certificate is the
    scheme accountant's ``certify_noise`` (Bernoulli-KL; :meth:`dpjax.montecarlo.BMinSep.certify_noise`,
    :meth:`dpjax.montecarlo.RandomAllocation.certify_noise`) on independent draws.
    """
    chain = _Chain.of_problem(problem)
    _chain_bands(parameterization, chain)
    _check_chain_settings(settings, chain)
    certify = _chain_certify_settings(certify, chain)
    eps, delta = problem.target_epsilon, problem.target_delta
    if certify is not None:
        certify.samples_for(delta)  # refused now, not after the steps
    num_samples = DEFAULT_NUM_SAMPLES[Estimator.PLAIN] if settings.num_samples is None else settings.num_samples
    num_steps, objective = settings.num_steps, problem.objective
    seed, jkey, optimizer, params = _run_start(parameterization, settings)
    config = {"parameterization": parameterization.to_dict(), "sampling": chain.record(),
              "target_epsilon": eps, "target_delta": delta, "num_samples": num_samples,
              "key": np.asarray(jax.random.key_data(jkey)).tolist(),
              "objective": getattr(objective, "__name__", repr(objective)), "estimator": Estimator.PLAIN.value}
    t_start = time.perf_counter()
    with jax.enable_x64(True):
        fns = _compiled_chain(parameterization, chain, num_samples, optimizer, objective)
        run = _start(params, optimizer.init(params), fns,
                     checkpoint.path if checkpoint is not None and checkpoint.resume else None, config, num_steps)
        _run_steps(run, fns, jkey, eps, delta, num_steps, None, checkpoint, config, progress)
        done = run.history[-1]["step"] + 1 if run.history else run.start
        if checkpoint is not None:
            _save(checkpoint.path, config, done, run)
        # The estimate at the final parameters (fresh draws of index `done`).
        _, aux_f, err_f = fns[1](run.params, eps, delta, jkey, done, run.sigma, None)
        sigma_est, err = float(aux_f[0]), float(err_f)
        first_column = np.asarray(parameterization.first_column(run.params)).tolist()
    result = _uncertified_result(
        parameterization, run, problem, (sigma_est, err, first_column), t_start,
        batches_per_epoch=problem.batches_per_epoch, epochs=chain.epochs, num_steps=num_steps,
        num_samples=num_samples, seed=seed, estimator=Estimator.PLAIN, sampling=chain.record())
    if certify is None:
        return result
    ckey = jax.random.fold_in(jkey, _CERTIFY_FOLD) if certify.key is None else as_prng_key(certify.key)
    return _certify(result, certify, ckey, progress)


def _certify_chain(result: OptimizationResult, settings: CertifySettings, ckey, progress) -> OptimizationResult:
    """:func:`_certify` of a chain-scheme result (``result.sampling``): the scheme accountant's
    ``certify_noise`` (Bernoulli-KL ladder) of the result's ``C`` at its target, on draws from ``ckey``."""
    chain = _Chain.of_record(result.sampling)
    _chain_certify_settings(settings, chain)
    eps, delta = result.target_epsilon, result.target_delta
    num_samples = settings.samples_for(delta)
    acc = chain.accountant(np.asarray(result.first_column, np.float64))
    sigma_est = result.noise_multiplier_estimate
    _note(f"certify: the noise multiplier of the optimized C under {chain.words} by Estimate-Verify-Release "
          "(bernoulli_kl) on fresh Monte Carlo samples", enabled=progress)
    t_c = time.perf_counter()
    with _elapsed_meter("certify", enabled=progress):
        certificate = acc.certify_noise(eps, delta, ckey, num_samples=num_samples, method="bernoulli_kl",
                                        initial_noise=sigma_est if math.isfinite(sigma_est) else None,
                                        rungs=settings.max_attempts, growth=settings.growth,
                                        calibration_samples=settings.calibration_samples)
    return _with_certificate(result, certificate, time.perf_counter() - t_c)
