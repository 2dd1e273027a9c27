"""``dpjax noise`` (DP-SGD, PLD) and ``dpjax mc-calibrate`` (balls-in-bins, Monte Carlo).

Examples::

    dpjax noise --epsilon 2 --delta 1e-5 --sampling-prob 0.01 --steps 1000 --json
    dpjax noise --epsilon 2 --delta 1e-5 --sampling random_allocation --batches-per-epoch 100 --epochs 10 --json
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
result with more samples and another ``--seed``: its default, 1, differs from this command's 0,
because Estimate-Verify-Release needs verification draws independent of the calibration's).  Adjacency: add/remove for Poisson sampling and for the
balls-in-bins Monte Carlo accountant, replace for fixed batches (``adjacency`` in the output).
Comma lists (``--epsilon 1,2,4``) calibrate once per value and print one row each.  Group
calibration is slow (tens of seconds): a progress bar is drawn on stderr when it is a terminal
(``--quiet`` turns it off).
"""

from __future__ import annotations

import argparse

from dpjax.cli import _args
from dpjax.cli.montecarlo import ADJACENCY as MC_ADJACENCY
from dpjax.cli.montecarlo import _accountant, add_correlation_args
from dpjax.pld.group_spec import Sampling


def _run_noise(args) -> dict:
    from dpjax.calibration import dpsgd_noise_multiplier

    if args.sampling in _args.ALLOCATION_SAMPLINGS:
        from dpjax.dpsgd import dpsgd_noise_multiplier as allocation_noise

        if args.group_size != 1 or args.dataset_size is not None or args.batch_size is not None:
            raise ValueError(f"--group-size, --dataset-size and --batch-size do not apply to --sampling {args.sampling}")
        sigma = allocation_noise(args.epsilon, args.delta, args.sampling_prob, args.steps, sampling=args.sampling,
                                 batches_per_epoch=args.batches_per_epoch,
                                 selections_per_epoch=args.selections_per_epoch, epochs=args.epochs)
        return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                    sampling=args.sampling, **_args.allocation_setting(args), accountant="pld (random allocation)",
                    guarantee="certified epsilon <= target_epsilon at this noise multiplier")
    if args.batches_per_epoch is not None or args.epochs is not None or args.selections_per_epoch != 1:
        raise ValueError("--batches-per-epoch, --selections-per-epoch and --epochs need --sampling random_allocation "
                         "or balls_in_bins")
    if args.steps is None:
        raise ValueError("--steps is required for --sampling poisson and fixed_batch (an integer >= 1)")
    if args.sampling == "poisson" and args.sampling_prob is None:
        raise ValueError("--sampling-prob is required for --sampling poisson (a number in (0, 1])")
    sigma = dpsgd_noise_multiplier(args.epsilon, args.delta, args.sampling_prob, args.steps,
                                   group_size=args.group_size, sampling=args.sampling,
                                   dataset_size=args.dataset_size, batch_size=args.batch_size,
                                   progress=None if not args.quiet else False)
    return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                sampling_prob=args.sampling_prob, steps=args.steps, group_size=args.group_size,
                sampling=args.sampling, dataset_size=args.dataset_size, batch_size=args.batch_size,
                adjacency=Sampling(args.sampling).adjacency, accountant="pld",
                guarantee="certified epsilon <= target_epsilon at this noise multiplier")


def _run_mc_calibrate(args) -> dict:
    acc = _accountant(args)
    samples = args.samples
    sigma = acc.calibrate(args.epsilon, args.delta, samples, args.seed)
    delta_hat, se = acc.delta(sigma, args.epsilon, samples, args.seed)
    return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                delta_estimate=float(delta_hat), standard_error=float(se), num_samples=int(samples),
                seed=args.seed, adjacency=MC_ADJACENCY, accountant="montecarlo (balls-in-bins, common random numbers)",
                guarantee="estimate only: certify with dpjax mc-certify, more samples and a --seed other than "
                          "this one (the verification draws must be independent of the calibration's)")


def register(subparsers) -> None:
    p = subparsers.add_parser("noise", help="DP-SGD noise multiplier for a target (epsilon, delta) (PLD; groups too)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epsilon", type=_args.real_list(0, None, lo_open=True), required=True,
                   help="target epsilon > 0 (comma list for several)")
    p.add_argument("--delta", type=_args.real_list(0, 1, lo_open=True, hi_open=True), required=True,
                   help="target " + _args.DELTA_TARGET_HELP)
    _args.add_sampling_prob(p, extra=" (required for --sampling poisson; fixed_batch: omit, or B/N)")
    _args.add_steps(p, required=False)
    _args.add_group_args(p)
    _args.add_allocation_args(p)
    p.set_defaults(run=_run_noise)

    p = subparsers.add_parser("mc-calibrate",
                              help="noise multiplier on the balls-in-bins Monte Carlo estimate (not a certificate)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_correlation_args(p)
    p.add_argument("--epsilon", type=_args.real_list(0, None, lo_open=True), required=True,
                   help="target epsilon > 0 (comma list for several)")
    p.add_argument("--delta", type=_args.real_list(0, 1, lo_open=True, hi_open=True), required=True,
                   help="target " + _args.DELTA_TARGET_HELP)
    p.add_argument("--samples", type=_args.integer(1, _args.MAX_SAMPLES), default=1 << 16,
                   help=_args.SAMPLES_HELP + "; default 2^16, should be >= 1/delta")
    p.add_argument("--seed", type=_args.integer(0, _args.MAX_SEED), default=0, help=_args.SEED_HELP)
    p.set_defaults(run=_run_mc_calibrate)
