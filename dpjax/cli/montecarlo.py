"""``dpjax mc-delta`` / ``dpjax mc-certify`` / ``dpjax mc-epsilon``: balls-in-bins Monte Carlo.

Examples::

    dpjax mc-delta --toeplitz 1,0.5,0.25 --batches-per-epoch 32 --epochs 8 \\
        --noise-multiplier 1.0 --epsilon 2 --samples 1048576 --json
    dpjax mc-certify --toeplitz 1,0.5 --batches-per-epoch 32 --epochs 8 \\
        --noise-multiplier 2.0 --epsilon 4 --target-delta 1e-3 --samples 1048576 --json

The correlation matrix is a Toeplitz first column (``--toeplitz``), a BLT
(``--blt-decays`` + ``--blt-scales``), a dense ``.npy`` file (``--matrix``), or the identity
(default).
"""

from __future__ import annotations

import argparse

import numpy as np


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip() != ""]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def add_correlation_args(p: argparse.ArgumentParser) -> None:
    """The correlation matrix C and the balls-in-bins shape (read back by :func:`_accountant`)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--toeplitz", type=_float_list, help="Toeplitz first column c0,c1,... (banded; default: identity)")
    src.add_argument("--matrix", help="path of a dense (n, n) lower-triangular .npy matrix")
    src.add_argument("--blt-decays", type=_float_list, help="BLT buffer decays theta_j in (0,1) (with --blt-scales)")
    p.add_argument("--blt-scales", type=_float_list, help="BLT output scales omega_j > 0")
    p.add_argument("--batches-per-epoch", type=int, required=True, help="b")
    p.add_argument("--epochs", type=int, required=True, help="E (n = b * E rounds)")


def _add_common(p: argparse.ArgumentParser) -> None:
    add_correlation_args(p)
    p.add_argument("--noise-multiplier", type=float, required=True, help="sigma")
    p.add_argument("--samples", type=float, default=1 << 20, help="Monte Carlo sample count (default 2^20)")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed (default 0)")
    p.add_argument("--chunk-size", type=int, default=None, help="samples per chunk (memory bound)")


def _accountant(args):
    from dpjax.matrices import BLT, Toeplitz
    from dpjax.montecarlo import BallsInBins

    if args.blt_decays is not None or args.blt_scales is not None:
        if args.blt_decays is None or args.blt_scales is None:
            raise ValueError("--blt-decays and --blt-scales must be given together")
        corr = BLT(np.asarray(args.blt_decays), np.asarray(args.blt_scales))
    elif args.matrix is not None:
        try:
            corr = np.load(args.matrix)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--matrix: cannot read {args.matrix!r}: {exc}") from exc
    elif args.toeplitz is not None:
        if len(args.toeplitz) == 0:
            raise ValueError("--toeplitz must list at least one coefficient")
        corr = Toeplitz(np.asarray(args.toeplitz))
    else:
        corr = Toeplitz(np.ones(1))
    return BallsInBins(corr, args.batches_per_epoch, args.epochs)


def _run_delta(args) -> dict:
    acc = _accountant(args)
    eps = np.asarray(args.epsilon, dtype=np.float64)
    est = acc.estimate(args.noise_multiplier, eps, args.samples, args.seed, chunk_size=args.chunk_size)
    scalar = len(args.epsilon) == 1
    pick = (lambda a: float(a[0])) if scalar else (lambda a: [float(x) for x in a])
    return {
        "epsilon": pick(est.epsilon),
        "delta": pick(est.delta),
        "standard_error": pick(est.standard_error),
        "delta_remove": pick(est.delta_remove),
        "delta_add": pick(est.delta_add),
        "num_samples": est.num_samples,
        "unamplified_delta": pick(acc.unamplified_delta(args.noise_multiplier, eps)),
        "sensitivity": acc.sensitivity,
        "note": "Monte Carlo estimate (max over add/remove directions) with its standard error; "
                "use mc-certify for a rigorous (eps, delta)",
    }


def _run_certify(args) -> dict:
    acc = _accountant(args)
    cert = acc.certify(args.noise_multiplier, args.epsilon, args.target_delta, args.samples, args.seed,
                       chunk_size=args.chunk_size)
    return cert.as_dict()


def _run_epsilon(args) -> dict:
    acc = _accountant(args)
    eps = acc.epsilon(args.noise_multiplier, args.delta, args.samples, args.seed, chunk_size=args.chunk_size)
    return {
        "epsilon": eps,
        "delta": args.delta,
        "num_samples": int(args.samples),
        "unamplified_epsilon": acc.unamplified_epsilon(args.noise_multiplier, args.delta),
        "note": "Monte Carlo estimate eps_hat(delta); use mc-certify for a rigorous statement",
    }


def register(subparsers) -> None:
    p = subparsers.add_parser("mc-delta", help="balls-in-bins Monte Carlo delta(epsilon) with standard error")
    _add_common(p)
    p.add_argument("--epsilon", type=_float_list, required=True, help="epsilon (comma-separated for several)")
    p.set_defaults(run=_run_delta)

    p = subparsers.add_parser("mc-certify", help="Estimate-Verify-Release certificate for (epsilon, target delta)")
    _add_common(p)
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--target-delta", type=float, required=True)
    p.set_defaults(run=_run_certify)

    p = subparsers.add_parser("mc-epsilon", help="balls-in-bins Monte Carlo epsilon(delta) estimate")
    _add_common(p)
    p.add_argument("--delta", type=float, required=True)
    p.set_defaults(run=_run_epsilon)
