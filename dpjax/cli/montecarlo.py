"""``dpjax mc-delta`` / ``dpjax mc-certify`` / ``dpjax mc-epsilon``: balls-in-bins Monte Carlo
(the ``--help`` texts: :data:`MC_ABOUT` and the examples in :func:`register`).
"""

from __future__ import annotations

import argparse

import numpy as np

from dpjax._base.enums import Adjacency
from dpjax.cli import _args

ADJACENCY = Adjacency.ADD_OR_REMOVE  # balls-in-bins Monte Carlo: max over the add and remove directions

MC_ABOUT = """\
The correlation matrix is a Toeplitz first column (--toeplitz), a BLT (--blt-decays with
--blt-scales), a dense .npy file (--matrix), or the identity (default: DP-SGD).  Balls-in-bins
batching (Choquette-Choo, Ganesh, Haque, Steinke and Thakurta, "Near exact privacy
amplification for matrix mechanisms"): each example falls in one of --batches-per-epoch batches,
the same in every epoch; the accounting is under add/remove adjacency (the max over both
directions; "adjacency" in the output).  Comma lists run one computation per value and print a
table (--epsilon of mc-delta shares one set of draws)."""

MC_DELTA_DESCRIPTION = """\
Monte Carlo estimate of delta(epsilon) with its standard error and sample count (an estimate:
use mc-certify for a rigorous (epsilon, delta)).

Example:
  dpjax mc-delta --toeplitz 1,0.5,0.25 --batches-per-epoch 32 --epochs 8 \\
      --noise-multiplier 1.0 --epsilon 2 --samples 1048576

""" + MC_ABOUT

MC_CERTIFY_DESCRIPTION = """\
Estimate-Verify-Release certificate: (epsilon, delta)-DP at the noise multiplier, with the
failure probability of the verification (a rigorous statement, on draws independent of any
calibration: --seed defaults to 1).

Example:
  dpjax mc-certify --toeplitz 1,0.5 --batches-per-epoch 32 --epochs 8 \\
      --noise-multiplier 2.0 --epsilon 4 --delta 1e-3 --samples 1048576

""" + MC_ABOUT

MC_EPSILON_DESCRIPTION = """\
Monte Carlo estimate of epsilon(delta) with a confidence interval [epsilon_lower,
epsilon_upper] and its sample count (an estimate: use mc-certify for a rigorous statement).

Example:
  dpjax mc-epsilon --toeplitz 1,0.5 --batches-per-epoch 8 --epochs 4 \\
      --noise-multiplier 1.5 --delta 1e-3 --samples 262144

""" + MC_ABOUT


def add_correlation_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The correlation matrix C and the balls-in-bins shape (read back by :func:`accountant_from_args`).

    ``required=False``: --batches-per-epoch and --epochs are optional to argparse (a command with
    another sampling scheme checks them itself)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--toeplitz", type=_args.real_vector(0, None),
                     help="Toeplitz first column c0,c1,... >= 0 (banded; default: the identity, i.e. DP-SGD)")
    src.add_argument("--matrix", metavar="FILE", help="path of a dense (n, n) lower-triangular non-negative .npy matrix")
    src.add_argument("--blt-decays", type=_args.real_vector(0, 1, lo_open=True, hi_open=True),
                     help="BLT buffer decays theta_j in (0, 1), comma list (with --blt-scales)")
    p.add_argument("--blt-scales", type=_args.real_vector(0, None, lo_open=True),
                   help="BLT output scales omega_j > 0, comma list (with --blt-decays)")
    p.add_argument("--batches-per-epoch", type=_args.integer(1, 2**20), required=required,
                   help="b: batches per epoch; each example falls in one of b batches (integer >= 1)")
    p.add_argument("--epochs", type=_args.integer(1, 2**20), required=required,
                   help="E: epochs (n = b * E rounds; integer >= 1)")


#: ``mc-certify``'s default seed.  Estimate-Verify-Release is only rigorous when the verification
#: draws are independent of whatever chose the noise multiplier; the draws of a seed are a prefix
#: of the same stream whatever the sample count, so ``mc-calibrate`` (default seed 0) followed by
#: ``mc-certify`` with the same seed would verify on the calibration's own samples.  A different
#: default keeps the documented two-step workflow sound when no seed is given.
CERTIFY_DEFAULT_SEED = 1


def _add_common(p: argparse.ArgumentParser, seed_default: int = 0, seed_help: str = _args.SEED_HELP) -> None:
    add_correlation_args(p)
    _args.add_noise_multiplier(p)
    p.add_argument("--samples", type=_args.integer(1, _args.MAX_SAMPLES), default=1 << 20,
                   help=_args.SAMPLES_HELP + "; default 2^20")
    p.add_argument("--seed", type=_args.integer(0, _args.MAX_SEED), default=seed_default, help=seed_help)
    p.add_argument("--chunk-size", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="samples per chunk, an integer >= 1 (bounds memory; default: automatic)")


def accountant_from_args(args):
    from dpjax.matrices import BLT, Toeplitz
    from dpjax.montecarlo import BallsInBins

    if args.blt_decays is not None or args.blt_scales is not None:
        if args.blt_decays is None or args.blt_scales is None:
            raise ValueError("--blt-decays and --blt-scales must be given together")
        source = "--blt-decays / --blt-scales"
    elif args.matrix is not None:
        try:
            dense = np.load(args.matrix)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--matrix: cannot read {args.matrix!r}: {exc}") from exc
        source = "--matrix"
    elif args.toeplitz is not None:
        if len(args.toeplitz) == 0:
            raise ValueError("--toeplitz must list at least one coefficient")
        source = "--toeplitz"
    else:
        source = None
    try:  # the library's checks of C speak of its arguments: say which option gave C
        if source is None:
            corr = Toeplitz(np.ones(1))
        elif source == "--matrix":
            corr = dense
        elif source == "--toeplitz":
            corr = Toeplitz(np.asarray(args.toeplitz))
        else:
            corr = BLT(np.asarray(args.blt_decays), np.asarray(args.blt_scales))
        return BallsInBins(corr, args.batches_per_epoch, args.epochs)
    except ValueError as exc:
        if source is None or str(exc).startswith("batches_per_epoch") or str(exc).startswith("epochs"):
            raise
        raise ValueError(f"{source}: {exc}") from None


def _run_delta(args) -> list[dict]:
    acc = accountant_from_args(args)
    eps = np.asarray(args.epsilon, dtype=np.float64)
    # One set of draws serves every epsilon (common random numbers): --epsilon is vectorized.
    est = acc.estimate(args.noise_multiplier, eps, args.samples, args.seed, chunk_size=args.chunk_size)
    unamplified = np.atleast_1d(acc.unamplified_delta(args.noise_multiplier, eps))
    return [{
        "target_epsilon": float(est.epsilon[i]),
        "delta": float(est.delta[i]),
        "standard_error": float(est.standard_error[i]),
        "delta_remove": float(est.delta_remove[i]),
        "delta_add": float(est.delta_add[i]),
        "num_samples": int(est.num_samples),
        "seed": args.seed,
        "noise_multiplier": args.noise_multiplier,
        "unamplified_delta": float(unamplified[i]),
        "sensitivity": acc.sensitivity,
        "adjacency": ADJACENCY,
        "note": "Monte Carlo estimate (max over add/remove directions) with its standard error; "
                "use mc-certify for a rigorous (eps, delta)",
    } for i in range(eps.size)]


def _run_certify(args) -> dict:
    acc = accountant_from_args(args)
    cert = acc.certify(args.noise_multiplier, args.epsilon, args.delta, args.samples, args.seed,
                       chunk_size=args.chunk_size, method=args.certify_method)
    return {**cert.to_dict(), "seed": args.seed, "adjacency": ADJACENCY}


def _run_epsilon(args) -> dict:
    acc = accountant_from_args(args)
    # The point estimate with its confidence interval and sample count (never a bare number).
    est = acc.epsilon_estimate(args.noise_multiplier, args.delta, args.samples, args.seed,
                               confidence=args.confidence, chunk_size=args.chunk_size)
    return {
        "epsilon": est.epsilon,
        "epsilon_lower": est.epsilon_lower,
        "epsilon_upper": est.epsilon_upper,
        "confidence": est.confidence,
        "resolved": est.resolved,
        "reason": est.reason,
        "target_delta": args.delta,
        "num_samples": int(est.num_samples),
        "unamplified_epsilon": acc.unamplified_epsilon(args.noise_multiplier, args.delta),
        "seed": args.seed,
        "noise_multiplier": args.noise_multiplier,
        "adjacency": ADJACENCY,
        "note": ("Monte Carlo estimate eps_hat(delta) with a confidence interval [epsilon_lower, epsilon_upper] "
                 "from num_samples draws; use mc-certify for a rigorous statement"),
    }


def register(subparsers) -> None:
    p = subparsers.add_parser("mc-delta", help="balls-in-bins Monte Carlo delta(epsilon) with standard error",
                              description=MC_DELTA_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    _args.add_target_epsilon(p, required=True, positive=False, help_prefix="", extra="; one set of draws serves all")
    p.set_defaults(run=_run_delta, vectorized=("epsilon",))

    p = subparsers.add_parser("mc-certify", help="Estimate-Verify-Release certificate for (epsilon, target delta)",
                              description=MC_CERTIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p, seed_default=CERTIFY_DEFAULT_SEED,
                seed_help=_args.seed_help(CERTIFY_DEFAULT_SEED, ", not mc-calibrate's 0: certify a calibrated noise "
                                                                "multiplier on draws independent of the calibration's"))
    _args.add_target_epsilon(p, required=True, positive=False, help_prefix="epsilon to certify, ")
    _args.add_target_delta(p, required=True, help_prefix="delta to certify, ")
    p.add_argument("--certify-method", type=_args.choice("importance_betting", "bernoulli_kl"),
                   default="importance_betting",
                   help="the test: importance_betting (variance-reduced draws and a betting test: far fewer samples "
                        "where the summands' proven range is small; default, as for optimize) or bernoulli_kl "
                        "(plain draws, Hoeffding's bound)")
    p.set_defaults(run=_run_certify)

    p = subparsers.add_parser("mc-epsilon", help="balls-in-bins Monte Carlo epsilon(delta) estimate",
                              description=MC_EPSILON_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_common(p)
    _args.add_target_delta(p, required=True)
    p.add_argument("--confidence", type=_args.real(0, 1, lo_open=True, hi_open=True), default=0.95,
                   help="confidence level of the reported interval on epsilon, in (0, 1) (default 0.95)")
    p.set_defaults(run=_run_epsilon)
