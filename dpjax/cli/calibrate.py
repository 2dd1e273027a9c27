"""``dpjax noise`` (DP-SGD, PLD) and ``dpjax mc-calibrate`` (balls-in-bins, Monte Carlo); their
``--help`` texts are :data:`NOISE_DESCRIPTION` and :data:`MC_CALIBRATE_DESCRIPTION`.
"""

from __future__ import annotations

import argparse

import numpy as np

from dpjax.cli import _args
from dpjax.cli.montecarlo import ADJACENCY as MC_ADJACENCY
from dpjax.cli.montecarlo import accountant_from_args, add_correlation_args


NOISE_DESCRIPTION = """\
The smallest DP-SGD noise multiplier whose certified epsilon (PLD accountant) is at most
--epsilon at --delta: Poisson sampling with add/remove adjacency by default, or --sampling
fixed_batch (batches of --batch-size out of --dataset-size, replace-one adjacency; for groups
--group-size).  The certified epsilon of the answer is at most the target; its distance to the
exact minimal noise is the accountant's discretization error (at most min(1e-3 epsilon,
8e-9 steps) in epsilon with the default grid).  Comma lists (--epsilon 1,2,4) calibrate once
per value and print a table.  Group calibration is slow (tens of seconds): a progress bar is
drawn on stderr when it is a terminal (--quiet turns it off).  --sampling random_allocation
(--batches-per-epoch, --selections-per-epoch, --epochs) and --sampling balls_in_bins calibrate
on the random-allocation accountant (dpjax.pld.allocation.accountant; add/remove adjacency).
--dataset-size N --batch-size B --epochs E is the usual description instead of --sampling-prob
and --steps (Poisson: q = B / N, steps = E / q rounded up) or --batches-per-epoch
(random_allocation, balls_in_bins: floor(N / B) batches per epoch).

Examples:
  dpjax noise --epsilon 2 --delta 1e-5 --sampling-prob 0.01 --steps 1000
  dpjax noise --epsilon 2 --delta 1e-5 --dataset-size 60000 --batch-size 256 --epochs 30
  dpjax noise --epsilon 2 --delta 1e-5 --sampling random_allocation --batches-per-epoch 100 --epochs 10
  dpjax noise --epsilon 1,2,4 --delta 1e-5 --sampling-prob 0.01 --steps 1000 --out sigmas.csv"""

MC_CALIBRATE_DESCRIPTION = """\
The noise multiplier solving the balls-in-bins Monte Carlo estimate delta_hat(sigma) = --delta at
--epsilon, with --samples common random numbers (Choquette-Choo, Ganesh, Haque, Steinke and
Thakurta, "Near exact privacy amplification for matrix mechanisms").  It is an estimate, not a
certificate: certify the result with dpjax mc-certify, more samples and another --seed (its
default, 1, differs from this command's 0, because Estimate-Verify-Release needs verification
draws independent of the calibration's).  --certify returns a certified noise multiplier instead,
in one command: calibrated on one sample and verified on an independent one (Estimate-Verify-
Release; "certificate" in the output says the method, sample count and failure probability).
Adjacency: add/remove (the max over both directions).

--sampling b_min_sep (--min-sep, --sampling-prob, --steps, --banded) calibrates on the b-min-sep
Monte Carlo accountant instead (Dong and Ganesh, "Privacy Amplification for BandMF via b-Min-Sep
Subsampling"): an example that participated sits out the next --min-sep - 1 rounds and is
otherwise chosen with probability --sampling-prob, from the stationary start; C is the banded
Toeplitz column --banded (at most --min-sep bands; default 1, DP-SGD).  Its --certify uses
bernoulli_kl (plain draws, Hoeffding's bound), the one method it supports.

Examples:
  dpjax mc-calibrate --toeplitz 1,0.5 --batches-per-epoch 8 --epochs 2 --epsilon 2 --delta 1e-3 \\
      --samples 65536 --seed 0
  dpjax mc-calibrate --toeplitz 1,0.5 --batches-per-epoch 8 --epochs 2 --epsilon 2 --delta 1e-3 --certify
  dpjax mc-calibrate --sampling b_min_sep --min-sep 4 --sampling-prob 0.1 --steps 64 --banded 1,0.5 \\
      --epsilon 2 --delta 1e-3 --samples 65536"""


def _run_noise(args) -> dict:
    from dpjax.calibration import dpsgd_noise_multiplier
    from dpjax.cli.pld import setting

    args = _args.apply_scenario(args)
    r = _args.resolve_batching(args)
    if r.sampling in _args.ALLOCATION_SAMPLINGS:
        if r.group_size != 1:
            raise ValueError(f"--group-size does not apply to --sampling {r.sampling}")
        sigma = dpsgd_noise_multiplier(None, r.steps, args.epsilon, args.delta, sampling=_args.sampling_scheme(r),
                                       epochs=r.epochs)
        accountant = "pld (random allocation)"
    else:
        if r.steps is None:
            raise ValueError("--steps (or --epochs) is required for --sampling poisson and fixed_batch "
                             "(an integer >= 1)")
        if r.sampling == "poisson" and r.sampling_prob is None:
            raise ValueError("--sampling-prob (or --dataset-size and --batch-size) is required for --sampling "
                             "poisson (a number in (0, 1])")
        sigma = dpsgd_noise_multiplier(r.sampling_prob, r.steps,
                                       args.epsilon, args.delta, group_size=r.group_size,
                                       sampling=_args.sampling_scheme(r), progress=None if not args.quiet else False)
        accountant = "pld"
    out = dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
               **{k: v for k, v in setting(args, r).items() if k != "noise_multiplier"})
    return dict(out, accountant=accountant, guarantee="certified epsilon <= target_epsilon at this noise multiplier")


#: mc-calibrate's options that only --sampling b_min_sep takes, and those it does not take.
_BMINSEP_ONLY = ("min_sep", "sampling_prob", "steps", "banded")
_BALLS_IN_BINS_ONLY = ("toeplitz", "matrix", "blt_decays", "blt_scales", "batches_per_epoch", "epochs")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _bminsep_from_args(args):
    from dpjax.montecarlo import BMinSep

    for dest in _BALLS_IN_BINS_ONLY:
        if getattr(args, dest) is not None:
            raise ValueError(f"{_option(dest)} does not apply to --sampling b_min_sep (C is --banded c0,c1,...)")
    for dest in ("min_sep", "sampling_prob", "steps"):
        if getattr(args, dest) is None:
            raise ValueError(f"{_option(dest)} is required for --sampling b_min_sep")
    col = np.ones(1) if args.banded is None else np.asarray(args.banded, np.float64)
    if col.size == 0 or not np.any(col > 0):
        raise ValueError("--banded must list at least one coefficient, one of them > 0")
    try:
        return BMinSep(col, args.sampling_prob, args.min_sep, args.steps)
    except ValueError as exc:
        raise ValueError(f"--banded: {exc}") from None


def certify_method_of(args) -> str:
    """``--certify-method``, or the scheme's default: the library's (``evr.DEFAULT_METHOD``) for
    balls-in-bins, ``bernoulli_kl`` for b-min-sep (the one certificate it has)."""
    if args.certify_method is not None:
        return args.certify_method
    if args.sampling == "b_min_sep":
        return "bernoulli_kl"
    from dpjax.montecarlo import evr

    return evr.DEFAULT_METHOD


def _run_mc_calibrate_bminsep(args) -> dict:
    acc = _bminsep_from_args(args)
    setting = dict(sampling="b_min_sep", min_sep=acc.min_sep, sampling_prob=acc.sampling_prob, steps=acc.num_rounds,
                   banded=[float(c) for c in acc.bands[0]], warm_start=True)
    if args.certify:
        method = certify_method_of(args)
        if method != "bernoulli_kl":
            raise ValueError(f"--certify-method {method} does not apply to --sampling b_min_sep (use bernoulli_kl)")
        cert = acc.certify_noise(args.epsilon, args.delta, args.seed, num_samples=args.certify_samples)
        return _certified_output(cert, args, "b-min-sep", setting)
    return _estimate_output(acc, args, "b-min-sep", setting,
                            "certify with --certify (verification draws independent of the calibration's)")


def _certified_output(cert, args, scheme: str, setting: dict) -> dict:
    """mc-calibrate's JSON for a certificate (refused when nothing was certified)."""
    if not cert.verified:
        raise ValueError(f"no noise multiplier was certified: {cert.reason}")
    return dict(noise_multiplier=cert.noise_multiplier, noise_multiplier_estimate=cert.noise_multiplier_estimate,
                target_epsilon=args.epsilon, target_delta=args.delta,
                certificate={k: v for k, v in cert.to_dict().items()},
                seed=args.seed, adjacency=MC_ADJACENCY, **setting,
                accountant=f"montecarlo ({scheme}), Estimate-Verify-Release",
                guarantee=f"(epsilon, delta) = ({cert.epsilon:g}, {cert.delta:.6g}) certified at noise_multiplier "
                          f"with failure probability {cert.failure_probability:.3g} ({cert.method})")


def _estimate_output(acc, args, scheme: str, setting: dict, how_to_certify: str) -> dict:
    """mc-calibrate's JSON for a calibration on common random numbers (an estimate)."""
    samples = args.samples
    sigma = acc.calibrate(args.epsilon, args.delta, samples, args.seed)
    delta_hat, se = acc.delta(sigma, args.epsilon, samples, args.seed)
    return dict(noise_multiplier=float(sigma), target_epsilon=args.epsilon, target_delta=args.delta,
                delta_estimate=float(delta_hat), standard_error=float(se), num_samples=int(samples),
                seed=args.seed, adjacency=MC_ADJACENCY, **setting,
                accountant=f"montecarlo ({scheme}, common random numbers)",
                guarantee=f"estimate only: {how_to_certify}")


def _run_mc_calibrate(args) -> dict:
    if args.sampling == "b_min_sep":
        return _run_mc_calibrate_bminsep(args)
    for dest in _BMINSEP_ONLY:
        if getattr(args, dest) is not None:
            raise ValueError(f"{_option(dest)} applies to --sampling b_min_sep only")
    for dest in ("batches_per_epoch", "epochs"):
        if getattr(args, dest) is None:
            raise ValueError(f"{_option(dest)} is required for --sampling balls_in_bins (an integer >= 1)")
    args.certify_method = certify_method_of(args)
    acc = accountant_from_args(args)
    if args.certify:
        # The certified path in one command: calibrate and verify (evr.certify_noise), the
        # calibration and verification draws derived from --seed (independent streams).
        cert = acc.certify_noise(args.epsilon, args.delta, args.seed, num_samples=args.certify_samples,
                                 method=args.certify_method)
        return _certified_output(cert, args, "balls-in-bins", {})
    return _estimate_output(acc, args, "balls-in-bins", {},
                            "certify with dpjax mc-certify, more samples and a --seed other than this one (the "
                            "verification draws must be independent of the calibration's)")


def register(subparsers) -> None:
    p = subparsers.add_parser("noise", help="smallest DP-SGD noise multiplier for a target (epsilon, delta) (groups too)",
                              description=NOISE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _args.add_target_epsilon(p, required=True)
    _args.add_target_delta(p, required=True)
    _args.add_sampling_prob(p, extra=" (--sampling poisson: this, or --dataset-size and --batch-size)")
    _args.add_steps(p, required=False)
    _args.add_group_args(p)
    _args.add_allocation_args(p)
    _args.add_scenario_arg(p)
    p.set_defaults(run=_run_noise)

    p = subparsers.add_parser("mc-calibrate",
                              help="noise multiplier on the balls-in-bins Monte Carlo estimate (--certify: a certified one)",
                              description=MC_CALIBRATE_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sampling", type=_args.choice("balls_in_bins", "b_min_sep"), default="balls_in_bins",
                   help="balls_in_bins (default: --batches-per-epoch, --epochs and C) or b_min_sep (--min-sep, "
                        "--sampling-prob, --steps, --banded)")
    add_correlation_args(p, required=False)
    _args.add_b_min_sep_args(p)
    p.add_argument("--banded", type=_args.real_vector(0, None), default=None,
                   help="b_min_sep: banded Toeplitz first column c0,c1,... >= 0, at most --min-sep entries after "
                        "trailing zeros (default 1: DP-SGD)")
    _args.add_target_epsilon(p, required=True)
    _args.add_target_delta(p, required=True)
    p.add_argument("--samples", type=_args.integer(1, _args.MAX_SAMPLES), default=1 << 16,
                   help=_args.SAMPLES_HELP + "; default 2^16, should be >= 1/delta (the estimate; not used "
                        "with --certify)")
    p.add_argument("--seed", type=_args.integer(0, _args.MAX_SEED), default=0, help=_args.SEED_HELP)
    p.add_argument("--certify", action="store_true",
                   help="return a certified noise multiplier: calibrate and verify with Estimate-Verify-Release "
                        "on independent draws (noise_multiplier is certified, noise_multiplier_estimate is the "
                        "calibration's estimate, certificate says how)")
    p.add_argument("--certify-samples", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="verification samples of --certify (default: the method's; importance_betting sizes "
                        "it between 2^16 and 2^22, bernoulli_kl uses ~0.4 delta as its base)")
    p.add_argument("--certify-method", type=_args.choice("importance_betting", "bernoulli_kl"),
                   default=None,
                   help="certificate of --certify: importance_betting (variance-reduced draws and a betting test, "
                        "default for balls_in_bins) or bernoulli_kl (plain draws, Hoeffding's bound; the default "
                        "and only method for b_min_sep)")
    p.set_defaults(run=_run_mc_calibrate)
