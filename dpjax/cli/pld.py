"""``dpjax epsilon`` / ``dpjax delta``: DP-SGD accounting with the FFT PLD accountant (see
:data:`EPSILON_DESCRIPTION` / :data:`DELTA_DESCRIPTION`, the ``--help`` texts).
"""

from __future__ import annotations

import argparse
import re

from dpjax.cli import _args


def _common(p: argparse.ArgumentParser) -> None:
    _args.add_noise_multiplier(p, required=False)
    _args.add_sampling_prob(p, extra=" (--sampling poisson: this, or --dataset-size and --batch-size)")
    _args.add_steps(p, required=False)
    p.add_argument("--relative-accuracy", type=_args.real(0, 1, lo_open=True), default=None,
                   help="target discretization error of epsilon relative to epsilon, in (0, 1] (default "
                        "1e-3, with the per-step bound 8e-9 x steps of dpjax.pld.GridOptions, whichever "
                        "is tighter)")
    p.add_argument("--max-grid-points", type=_args.integer(2**10, 2**26), default=None,
                   metavar="N",
                   help="largest FFT grid, an integer in [2^10, 2^26] (rounded up to a power of two; "
                        "default 2^21 = dpjax.pld.GridOptions.n_max); raise it when the result says "
                        "the grid is too small (memory grows linearly with N)")
    _args.add_group_args(p)
    _args.add_allocation_args(p)
    _args.add_scenario_arg(p)


def _options(args):
    from dpjax.pld import GridOptions

    kw = {}
    if args.relative_accuracy is not None:
        kw["relative_accuracy"] = args.relative_accuracy
    if args.max_grid_points is not None:
        n = 1 << (int(args.max_grid_points) - 1).bit_length()  # next power of two
        kw["n_max"] = n
        kw["n_min"] = min(GridOptions().n_min, n)
    return GridOptions(**kw) if kw else None


def _grid_info(res) -> dict:
    return {d.direction: {"n": d.n, "dx": d.dx, "p_inf": d.p_inf, "tail_above": d.tail_above,
                          "tail_below": d.tail_below, "roundoff": d.roundoff} for d in res.directions}


def _cli_reason(reason: str | None) -> str | None:
    # The library's reason names the Python knob; the CLI user's knob is --max-grid-points.
    if reason is None:
        return None
    return re.sub(r"GridOptions\.n_max", "--max-grid-points", reason)


def _prepare_jax() -> None:
    # A CLI process owns its JAX configuration: keep compiled programs on disk so that the next
    # invocation skips compilation (DPJAX_COMPILATION_CACHE=0 turns this off).
    from dpjax.numerics.cache import enable_from_environment

    enable_from_environment(default_on=True)


def _account(args, **target):
    """The accountant's result for resolved options (:func:`dpjax.cli._args.resolve_batching`)."""
    from dpjax import pld
    from dpjax.cli import group as group_cli

    if args.sampling in _args.ALLOCATION_SAMPLINGS:
        from dpjax.pld.allocation import dpsgd as allocation_dpsgd

        if args.group_size != 1:
            raise ValueError(f"--group-size does not apply to --sampling {args.sampling}")
        return allocation_dpsgd.accounting(args.noise_multiplier, None, args.steps, sampling=args.sampling,
                                           batches_per_epoch=args.batches_per_epoch,
                                           selections_per_epoch=args.selections_per_epoch, epochs=args.epochs,
                                           **target)
    if args.steps is None:
        raise ValueError("--steps (or --epochs) is required for --sampling poisson and fixed_batch (an integer >= 1)")
    _prepare_jax()
    if group_cli.requested(args):
        return group_cli.accounting(args, _options(args), **target)
    if args.sampling_prob is None:
        raise ValueError("--sampling-prob is required for --sampling poisson (a number in (0, 1])")
    return pld.dpsgd_accounting(args.noise_multiplier, args.sampling_prob, args.steps,
                                options=_options(args), **target)


def setting(args, resolved) -> dict:
    """The configuration part of a result: the accountant's arguments (``resolved``, from
    :func:`dpjax.cli._args.resolve_batching`) and the usual description as given (``args``)."""
    from dpjax.pld.group_spec import Sampling

    described = _args.batching_setting(args)
    sigma = getattr(resolved, "noise_multiplier", None)  # (dpjax noise computes it)
    if resolved.sampling in _args.ALLOCATION_SAMPLINGS:
        return {"noise_multiplier": sigma, "sampling": resolved.sampling,
                **_args.allocation_setting(resolved), "dataset_size": described["dataset_size"],
                "batch_size": described["batch_size"]}
    sampling = Sampling.parse(resolved.sampling)
    return {"noise_multiplier": sigma, "sampling_prob": resolved.sampling_prob,
            "steps": int(resolved.steps), "group_size": int(resolved.group_size), "sampling": sampling.value,
            **described, "adjacency": sampling.adjacency}


def _run_epsilon(args) -> dict:
    args = _args.apply_scenario(args)
    _args.require_noise_multiplier(args)
    resolved = _args.resolve_batching(args)
    res = _account(resolved, target_delta=args.delta)
    out = {"epsilon": res.epsilon, "epsilon_lower": res.epsilon_lower, "epsilon_upper": res.epsilon_upper,
           "target_delta": res.target_delta, **setting(args, resolved), "grid": _grid_info(res)}
    if res.reason:
        out["reason"] = _cli_reason(res.reason)
    return out


def _run_delta(args) -> dict:
    args = _args.apply_scenario(args)
    _args.require_noise_multiplier(args)
    resolved = _args.resolve_batching(args)
    res = _account(resolved, target_epsilon=args.epsilon)
    return {"delta": res.delta, "delta_lower": res.delta_lower, "delta_upper": res.delta_upper,
            "target_epsilon": res.target_epsilon, **setting(args, resolved), "grid": _grid_info(res)}


def _grid_lines(grid: dict) -> list[str]:
    return [f"grid[{d}]  n={info['n']} dx={info['dx']:.3g} tail_above={info['tail_above']:.2g}"
            for d, info in grid.items()]


def _render(result: dict) -> str:
    return _args.render_fields(result, {"grid": _grid_lines}, skip_none=True)


_ABOUT = """\
The printed epsilon (delta) is a certified upper bound; epsilon_lower / epsilon_upper bracket the
exact value.  Adjacency: Poisson sampling is accounted under add/remove adjacency
("add_or_remove": neighbouring datasets differ by adding or removing one example, k for a group
of k), --sampling fixed_batch under replace adjacency ("replace": one example, k for a group,
replaced by another); every result names it in "adjacency".  Group privacy (--group-size k)
uses the tight mixture-of-Gaussians accountant of Ganesh (2024), "Tight group-level DP
guarantees for DP-SGD with sampling via mixture of Gaussians mechanisms".  --sampling
random_allocation (each example in --selections-per-epoch of the --batches-per-epoch steps of
every epoch, --epochs epochs; Feldman & Shenfeld, "Privacy amplification by random allocation")
and --sampling balls_in_bins (one bin per example for the whole run, C = I) are accounted under
add/remove adjacency by dpjax.pld.allocation.accountant (no --steps or --sampling-prob then).
--dataset-size N --batch-size B --epochs E is the usual description of a run instead of
--sampling-prob and --steps: Poisson sampling takes q = B / N and steps = E / q rounded up (the
rule of dpjax.dpsgd_epsilon(epochs=)); random_allocation and balls_in_bins take floor(N / B)
batches per epoch (a loader's last, smaller batch is not counted as a full one: that never
understates epsilon); mixing the two descriptions is an error.
--scenario FILE reads the whole run (noise, sampling, steps or epochs, group size) from a
dpjax.TrainingScenario saved with to_json, in place of those options.
Comma lists run once
per value and print a table.  Compiled programs are cached on disk (~/.cache/dpjax/xla;
DPJAX_COMPILATION_CACHE=0 disables, =<dir> relocates)."""

EPSILON_DESCRIPTION = """\
Certified epsilon of DP-SGD (noise multiplier, sampling probability, steps) at a target delta.

Examples:
  dpjax epsilon --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --delta 1e-5
  dpjax epsilon --noise-multiplier 1.1 --dataset-size 60000 --batch-size 256 --epochs 30 --delta 1e-5
  dpjax epsilon --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --delta 1e-5,1e-6 --out eps.csv
  dpjax epsilon --noise-multiplier 1 --steps 2000 --delta 1e-5 --group-size 8 \\
                --sampling fixed_batch --dataset-size 50000 --batch-size 500 --json
  dpjax epsilon --sampling random_allocation --batches-per-epoch 100 --epochs 10 \\
                --noise-multiplier 1.0 --delta 1e-5 --json

""" + _ABOUT

DELTA_DESCRIPTION = """\
Certified delta of DP-SGD (noise multiplier, sampling probability, steps) at a target epsilon.

Examples:
  dpjax delta --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --epsilon 0.5,1,2
  dpjax delta --noise-multiplier 1 --steps 2000 --epsilon 4 --group-size 8 \\
              --sampling fixed_batch --dataset-size 50000 --batch-size 500 --json
  dpjax delta --sampling balls_in_bins --batches-per-epoch 128 --epochs 4 \\
              --noise-multiplier 1.0 --epsilon 2 --json

""" + _ABOUT


def register(subparsers) -> None:
    p = subparsers.add_parser("epsilon", help="certified epsilon of DP-SGD at a target delta (groups too)",
                              description=EPSILON_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    _args.add_target_delta(p, required=True)
    p.set_defaults(run=_run_epsilon, render=_render)

    p = subparsers.add_parser("delta", help="certified delta of DP-SGD at a target epsilon (groups too)",
                              description=DELTA_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    _args.add_target_epsilon(p, required=True, positive=False)
    p.set_defaults(run=_run_delta, render=_render)
