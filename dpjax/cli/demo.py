"""``dpjax demo``: account a standard DP-SGD run on a built-in example.

The example is the classic CIFAR-10-style setting: N = 50,000 examples, expected batch size 500
(Poisson sampling probability q = 0.01), noise multiplier 1.0, 1,000 steps (20 epochs),
delta = 1e-5.  It prints the certified epsilon of the tight FFT PLD accountant with its
(lower, upper) bracket, the moments-accountant (RDP) epsilon users would otherwise report, and
how much tighter the PLD answer is.  All flags are optional, so ``dpjax demo`` runs as is.
"""

from __future__ import annotations

import argparse
import math
import time

from dpjax._base.enums import Adjacency
from dpjax.cli import _args


def _run(args) -> dict:
    from dpjax import pld
    from dpjax.baselines import rdp_epsilon

    t0 = time.perf_counter()
    res = pld.dpsgd_accounting(args.noise_multiplier, args.sampling_prob, args.steps, target_delta=args.delta)
    t_pld = time.perf_counter() - t0
    t0 = time.perf_counter()
    eps_rdp, order = rdp_epsilon(args.noise_multiplier, args.sampling_prob, args.steps, args.delta)
    eps_rdp_std, _ = rdp_epsilon(args.noise_multiplier, args.sampling_prob, args.steps, args.delta,
                                 conversion="standard")
    t_rdp = time.perf_counter() - t0
    eps = float(res.epsilon)
    if not math.isfinite(eps):
        raise ValueError(f"--noise-multiplier {args.noise_multiplier:g} gives no finite certified epsilon at "
                         f"--delta {args.delta:g} in this setting (q={args.sampling_prob:g}, "
                         f"steps={args.steps}); the demo compares finite epsilons: use a noise multiplier "
                         "of about 0.5 or more")
    return {
        "setting": "DP-SGD, Poisson sampling, add/remove adjacency",
        "adjacency": Adjacency.ADD_OR_REMOVE,
        "noise_multiplier": args.noise_multiplier,
        "sampling_prob": args.sampling_prob,
        "steps": int(args.steps),
        "target_delta": args.delta,
        "epsilon": eps,
        "epsilon_lower": float(res.epsilon_lower),
        "epsilon_upper": float(res.epsilon_upper),
        "epsilon_rdp": eps_rdp,
        "epsilon_rdp_standard_conversion": eps_rdp_std,
        "rdp_optimal_order": order,
        "rdp_overstatement_percent": 100.0 * (eps_rdp / eps - 1.0),
        "seconds_pld_including_compile": t_pld,
        "seconds_rdp": t_rdp,
    }


def _bracket(lo: float, hi: float) -> str:
    """``[lo, hi]`` with enough significant digits that the two ends differ on the page."""
    for digits in range(4, 17):
        a, b = f"{lo:.{digits}g}", f"{hi:.{digits}g}"
        if a != b or lo == hi:
            break
    # one more digit than the first that separates them, so the width of the bracket is visible
    digits = min(digits + 1, 17)
    return f"[{lo:.{digits}g}, {hi:.{digits}g}]  (width {hi - lo:.2g})"


def _render(r: dict) -> str:
    return "\n".join([
        f"{r['setting']}",
        f"  noise_multiplier={r['noise_multiplier']}  sampling_prob={r['sampling_prob']}  "
        f"steps={r['steps']}  target_delta={r['target_delta']:g}",
        "",
        f"  PLD (dpjax, certified upper bound)   epsilon = {r['epsilon']:.4f}",
        f"      bracket on the exact epsilon      {_bracket(r['epsilon_lower'], r['epsilon_upper'])}",
        f"  RDP / moments accountant (improved)   epsilon = {r['epsilon_rdp']:.4f}  (order {r['rdp_optimal_order']:g})",
        f"  RDP (standard conversion)             epsilon = {r['epsilon_rdp_standard_conversion']:.4f}",
        "",
        f"  RDP overstates epsilon by {r['rdp_overstatement_percent']:.1f}% against the tight PLD bound.",
        f"  PLD time (compile included): {r['seconds_pld_including_compile']:.2f} s",
    ])


DESCRIPTION = """\
Account a standard DP-SGD run: N = 50,000 examples, expected batch size 500 (Poisson sampling
probability q = 0.01), noise multiplier 1.0, 1,000 steps (20 epochs), delta = 1e-5.  Prints the
certified epsilon of the tight FFT PLD accountant with its (lower, upper) bracket, the
moments-accountant (RDP) epsilon users would otherwise report, and how much tighter the PLD
answer is.  Every option is optional.

Examples:
  dpjax demo
  dpjax demo --noise-multiplier 0.8,1.0,1.2 --steps 2000"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="account a standard DP-SGD run (built-in example)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--noise-multiplier", type=_args.real_list(0, None, lo_open=True), default=[1.0],
                   help=_args.NOISE_MULTIPLIER_HELP + " (default 1.0)")
    p.add_argument("--sampling-prob", type=_args.real(0, 1, lo_open=True), default=0.01,
                   help="Poisson sampling probability q in (0, 1] (default 0.01)")
    _args.add_steps(p, required=False, default=1000)
    _args.add_target_delta(p, required=False, default=[1e-5], extra=" (default 1e-5)")
    p.set_defaults(run=_run, render=_render)
