"""``dpjax noise`` (DP-SGD, PLD) and ``dpjax mc-calibrate`` (balls-in-bins, Monte Carlo).

Examples::

    dpjax noise --epsilon 2 --delta 1e-5 --sampling-prob 0.01 --steps 1000 --json
    dpjax mc-calibrate --toeplitz 1,0.5 --batches-per-epoch 8 --epochs 2 \\
        --epsilon 2 --delta 1e-3 --samples 65536 --seed 0 --json

``noise`` prints the smallest noise multiplier whose certified epsilon (PLD accountant) is at
most ``--epsilon`` at ``--delta``: Poisson sampling with add/remove adjacency by default, or
``--sampling fixed_batch`` (batches of ``--batch-size`` out of ``--dataset-size``, replace-one
adjacency; for groups ``--group-size``).  The certified epsilon of the answer is at most the
target; its distance to the exact minimal noise is the accountant's discretization error
(at most ``min(1e-3 epsilon, 8e-9 steps)`` in epsilon with the default grid).
``mc-calibrate`` solves the Monte Carlo *estimate* ``delta_hat(sigma) = --delta`` with
``--samples`` common random numbers; it is not a certificate (run ``dpjax mc-certify`` on the
result with more samples).
"""

from __future__ import annotations

from dpjax.cli.montecarlo import _accountant, add_correlation_args
from dpjax.pld.group_spec import Sampling


def _run_noise(args) -> dict:
    from dpjax.calibration import dpsgd_noise_multiplier

    sigma = dpsgd_noise_multiplier(args.epsilon, args.delta, args.sampling_prob, args.steps,
                                   group_size=args.group_size, sampling=args.sampling,
                                   dataset_size=args.dataset_size, batch_size=args.batch_size)
    return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                sampling_prob=args.sampling_prob, steps=args.steps, group_size=args.group_size,
                sampling=args.sampling, adjacency=Sampling(args.sampling).adjacency, accountant="pld",
                guarantee="certified epsilon <= target_epsilon at this noise multiplier")


def _run_mc_calibrate(args) -> dict:
    acc = _accountant(args)
    samples = args.samples
    sigma = acc.calibrate(args.epsilon, args.delta, samples, args.seed)
    delta_hat, se = acc.delta(sigma, args.epsilon, samples, args.seed)
    return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                delta_estimate=float(delta_hat), standard_error=float(se), num_samples=int(samples),
                seed=args.seed, accountant="montecarlo (balls-in-bins, common random numbers)",
                guarantee="estimate only: certify with dpjax mc-certify and more samples")


def register(subparsers) -> None:
    p = subparsers.add_parser("noise", help="DP-SGD noise multiplier for a target (epsilon, delta) (PLD)")
    p.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    p.add_argument("--sampling-prob", type=float, default=None,
                   help="Poisson sampling probability q in (0, 1] (required for poisson sampling)")
    p.add_argument("--steps", type=int, required=True, help="number of steps T >= 1")
    p.add_argument("--group-size", type=int, default=1, help="group size k (default 1)")
    p.add_argument("--sampling", default="poisson",
                   help="poisson (default; add/remove adjacency) or fixed_batch (replace-one adjacency)")
    p.add_argument("--dataset-size", type=int, default=None, help="N (fixed_batch only)")
    p.add_argument("--batch-size", type=int, default=None, help="B (fixed_batch only)")
    p.set_defaults(run=_run_noise)

    p = subparsers.add_parser("mc-calibrate",
                              help="noise multiplier on the balls-in-bins Monte Carlo estimate")
    add_correlation_args(p)
    p.add_argument("--epsilon", type=float, required=True, help="target epsilon > 0")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    p.add_argument("--samples", type=int, default=1 << 16, help="Monte Carlo samples (default 2^16, >= 1/delta)")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed of the common random numbers")
    p.set_defaults(run=_run_mc_calibrate)
