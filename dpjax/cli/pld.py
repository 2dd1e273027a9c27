"""``dpjax epsilon`` / ``dpjax delta``: DP-SGD accounting with the FFT PLD accountant.

Examples::

    dpjax epsilon --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --delta 1e-5 --json
    dpjax delta   --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --epsilon 2 --json

The printed ``epsilon`` (``delta``) is a certified upper bound; ``epsilon_lower`` /
``epsilon_upper`` bracket the exact value.  Compiled programs are cached on disk
(``~/.cache/dpjax/xla``; ``DPJAX_COMPILATION_CACHE=0`` disables, ``=<dir>`` relocates).
"""

from __future__ import annotations

import argparse
import math


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--noise-multiplier", type=float, required=True,
                   help="noise std / clip norm (sigma > 0)")
    p.add_argument("--sampling-prob", type=float, required=True,
                   help="Poisson sampling probability q in (0, 1]")
    p.add_argument("--steps", type=float, required=True, help="number of steps T (integer >= 1)")
    p.add_argument("--relative-accuracy", type=float, default=None,
                   help="target discretization error of epsilon relative to epsilon (default 1e-3, "
                        "with the per-step bound 8e-9 x steps of dpjax.pld.GridOptions, whichever "
                        "is tighter)")


def _options(args):
    from dpjax.pld import GridOptions

    if args.relative_accuracy is None:
        return None
    ra = args.relative_accuracy
    if not (ra > 0 and math.isfinite(ra)):
        raise ValueError(f"relative_accuracy must be finite and > 0, got {ra!r}")
    return GridOptions(relative_accuracy=ra)


def _grid_info(res) -> dict:
    return {d.direction: {"n": d.n, "dx": d.dx, "p_inf": d.p_inf, "tail_above": d.tail_above,
                          "tail_below": d.tail_below, "roundoff": d.roundoff} for d in res.directions}


def _prepare_jax() -> None:
    # A CLI process owns its JAX configuration: keep compiled programs on disk so that the next
    # invocation skips compilation (DPJAX_COMPILATION_CACHE=0 turns this off).
    from dpjax.pld.cache import enable_from_environment

    enable_from_environment(default_on=True)


def _run_epsilon(args) -> dict:
    from dpjax import pld

    _prepare_jax()
    from dpjax.cli import group as group_cli

    if group_cli.requested(args) or args.sampling_prob is None:
        return group_cli.run(args, _options(args), _grid_info)
    res = pld.dpsgd_accounting(args.noise_multiplier, args.sampling_prob, args.steps,
                               target_delta=args.delta, options=_options(args))
    out = {"epsilon": res.epsilon, "epsilon_lower": res.epsilon_lower, "epsilon_upper": res.epsilon_upper,
           "delta": res.target_delta, "noise_multiplier": args.noise_multiplier,
           "sampling_prob": args.sampling_prob, "steps": int(args.steps), "adjacency": "add_remove",
           "grid": _grid_info(res)}
    if res.reason:
        out["reason"] = res.reason
    return out


def _run_delta(args) -> dict:
    from dpjax import pld

    _prepare_jax()

    res = pld.dpsgd_accounting(args.noise_multiplier, args.sampling_prob, args.steps,
                               target_epsilon=args.epsilon, options=_options(args))
    return {"delta": res.delta, "delta_lower": res.delta_lower, "delta_upper": res.delta_upper,
            "epsilon": res.target_epsilon, "noise_multiplier": args.noise_multiplier,
            "sampling_prob": args.sampling_prob, "steps": int(args.steps), "adjacency": "add_remove",
            "grid": _grid_info(res)}


def _render(result: dict) -> str:
    lines = []
    for key, value in result.items():
        if key == "grid":
            for d, info in value.items():
                lines.append(f"grid[{d}]  n={info['n']} dx={info['dx']:.3g} tail_above={info['tail_above']:.2g}")
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        lines.append(f"{key:<16} {value}")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("epsilon", help="certified epsilon of DP-SGD (PLD accountant)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    from dpjax.cli import group as group_cli

    group_cli.add_arguments(p)
    p.set_defaults(run=_run_epsilon, render=_render)

    p = subparsers.add_parser("delta", help="certified delta of DP-SGD at epsilon (PLD accountant)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--epsilon", type=float, required=True, help="target epsilon >= 0")
    p.set_defaults(run=_run_delta, render=_render)
