"""Group-privacy flags of ``dpjax epsilon`` (helpers used by :mod:`dpjax.cli.pld`).

    dpjax epsilon --noise-multiplier 1 --sampling-prob 0.01 --steps 2000 --delta 1e-5 --group-size 8 --json
    dpjax epsilon --noise-multiplier 1 --steps 2000 --delta 1e-5 --group-size 8 \\
                  --sampling fixed_batch --dataset-size 50000 --batch-size 500 --json

With ``--group-size 1`` and Poisson sampling (the defaults) the example-level accountant runs
unchanged.  Poisson sampling is accounted under add/remove adjacency; ``--sampling
fixed_batch`` under replace adjacency (replace-k for a group of k), with noise std equal to
``--noise-multiplier`` and sensitivity 2 per replaced example (Ganesh (2024), Thm 3.3).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--group-size``, ``--sampling``, ``--dataset-size``, ``--batch-size`` to ``p``."""
    for action in p._actions:
        # Fixed-batch sampling derives q = B / N, so --sampling-prob becomes optional here
        # (still required for Poisson sampling: checked in run()).
        if action.dest == "sampling_prob":
            action.required = False
            action.default = None
            action.help = "Poisson sampling probability q in (0, 1] (fixed batch: omit, or B/N)"
    g = p.add_argument_group("group privacy (Ganesh et al.: tight mixture-of-Gaussians accounting)")
    g.add_argument("--group-size", type=float, default=1, help="k examples protected together (integer >= 1)")
    g.add_argument("--sampling", default="poisson",
                   help="poisson (default; add/remove adjacency) or fixed_batch (batches of --batch-size "
                        "out of --dataset-size; replace adjacency: sensitivity 2 per example, noise std "
                        "= --noise-multiplier)")
    g.add_argument("--dataset-size", type=float, default=None, help="N (fixed_batch)")
    g.add_argument("--batch-size", type=float, default=None, help="B <= N (fixed_batch)")


def requested(args) -> bool:
    """True when the group accountant (not the plain DP-SGD one) must run."""
    return not (args.group_size == 1 and args.sampling == "poisson" and args.dataset_size is None and args.batch_size is None)


def run(args, options, grid_info) -> dict:
    """``dpjax epsilon`` with group flags: the JSON-able result dict."""
    from dpjax.group import group_accounting
    from dpjax.pld.group_spec import Sampling

    if not requested(args) and args.sampling_prob is None:
        raise ValueError("--sampling-prob is required for Poisson sampling (a number in (0, 1])")
    res = group_accounting(
        args.noise_multiplier, args.sampling_prob, args.steps, target_delta=args.delta,
        group_size=args.group_size, sampling=args.sampling, dataset_size=args.dataset_size,
        batch_size=args.batch_size, options=options,
    )
    sampling = Sampling.parse(args.sampling)
    out = {"epsilon": res.epsilon, "epsilon_lower": res.epsilon_lower, "epsilon_upper": res.epsilon_upper,
           "delta": res.target_delta, "noise_multiplier": args.noise_multiplier,
           "sampling_prob": args.sampling_prob, "steps": int(args.steps), "group_size": int(args.group_size),
           "sampling": sampling.value, "dataset_size": args.dataset_size, "batch_size": args.batch_size,
           "adjacency": sampling.adjacency, "grid": grid_info(res)}
    if res.reason:
        out["reason"] = res.reason
    return out
