"""``dpjax optimize``: optimise a correlation matrix under balls-in-bins amplification, certified.

Example::

    dpjax optimize --family blt --buffers 4 --batches-per-epoch 128 --epochs 16 \\
        --epsilon 2 --delta 1e-5 --optimizer-steps 300 --samples 131072 --out result.json [--resume]

Progress on stderr (off with ``--quiet`` or ``--json``).  ``--out`` receives the
:class:`dpjax.optimization.OptimizationResult` JSON (written atomically); a checkpoint
``<out>.checkpoint.json`` is written every ``--checkpoint-every`` steps (with the screen state
of the in-loop calibration beside it, ``<out>.checkpoint.json.screen-<step>.npz``), and
``--resume`` continues from it.  The printed object holds ``noise_multiplier`` (certified),
``noise_multiplier_estimate``, ``first_column``, ``rmse`` (at the certified sigma) and
``certificate``.
"""

from __future__ import annotations

import argparse
import math
import os

from dpjax.cli import _args


# ``--example``: the built-in problem of the README's first command.  Small enough to finish in
# well under a minute on 2 CPU cores (n = 32 rounds), large enough that amplification matters:
# a 2-buffer BLT under balls-in-bins batching with 8 batches per epoch for 4 epochs, certified at
# (2, 1e-5).  Flags given explicitly override these values.
EXAMPLE = dict(family="blt", buffers=2, batches_per_epoch=8, epochs=4, epsilon=2.0, delta=1e-5,
               optimizer_steps=100, samples=1 << 12)


def apply_example(args) -> None:
    """Fill the options the user left unset with :data:`EXAMPLE` (``--example``), and insist on the
    required ones otherwise (argparse cannot: they are optional under ``--example``)."""
    for name, value in EXAMPLE.items():
        if getattr(args, name, None) is None and args.example:
            setattr(args, name, value)
    for name in ("batches_per_epoch", "epochs", "epsilon", "delta"):
        if getattr(args, name) is None:
            raise ValueError(f"--{name.replace('_', '-')} is required (or give --example for the built-in "
                             "problem)")
    if args.family is None:
        args.family = "blt"
    if args.optimizer_steps is None:
        args.optimizer_steps = 300
    if args.samples is None:
        args.samples = 1 << 13


#: BLT buffers when ``--buffers`` is not given (at most ``n``, the number of rounds).
DEFAULT_BUFFERS = 4


def check_output_paths(out: str, *, resume: bool) -> None:
    """Before any work: ``--out`` and its checkpoint must be writable files, and ``--resume``
    needs a checkpoint to resume from (a failure after the whole optimization would lose it)."""
    import tempfile

    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise ValueError(f"--out: directory {directory!r} does not exist")
    checkpoint = out + ".checkpoint.json"
    for flag, path in (("--out", out), ("--out (its checkpoint)", checkpoint)):
        if os.path.isdir(path):
            raise ValueError(f"{flag}: {path!r} is a directory, not a file")
    try:  # the one reliable test that the directory takes new files (permissions, /proc, read-only mounts)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dpjax-write-test-"):
            pass
    except OSError as exc:
        raise ValueError(f"--out: cannot write in {directory!r}: {exc.strerror or exc}") from None
    if os.path.exists(out) and not os.access(out, os.W_OK):
        raise ValueError(f"--out: {out!r} is not writable")
    if resume and not os.path.exists(checkpoint):
        raise ValueError(f"--resume: no checkpoint {checkpoint!r} to resume from (drop --resume to start afresh)")


def _run(args) -> dict:
    from dpjax._progress import set_progress
    from dpjax.optimization import make_parameterization, optimize_correlation
    from dpjax.optimization.loop import default_optimizer

    apply_example(args)

    if args.family != "blt" and args.buffers is not None:
        raise ValueError(f"--buffers is only used by --family blt, got --family {args.family}")
    if args.family != "banded" and args.bands is not None:
        raise ValueError(f"--bands is only used by --family banded, got --family {args.family}")
    n = args.batches_per_epoch * args.epochs if args.batches_per_epoch and args.epochs else None
    if args.family == "blt" and args.buffers is None:
        args.buffers = DEFAULT_BUFFERS if n is None else min(DEFAULT_BUFFERS, n)
    elif args.family == "blt" and n is not None and args.buffers > n:
        raise ValueError(f"--buffers must be in [1, n] = [1, {n}] (n = --batches-per-epoch * --epochs rounds), "
                         f"got {args.buffers}")
    if args.family == "banded" and args.bands is None:
        raise ValueError("--bands must be given for --family banded (an integer >= 1)")
    for name in ("batches_per_epoch", "epochs", "optimizer_steps", "samples", "checkpoint_every"):
        value = getattr(args, name)
        if value is None or value < (0 if name == "optimizer_steps" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= "
                             f"{0 if name == 'optimizer_steps' else 1}, got {value}")
    if not args.learning_rate > 0:
        raise ValueError(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.out is not None:
        check_output_paths(args.out, resume=args.resume)
    elif args.resume:
        raise ValueError("--resume needs --out (the checkpoint is <out>.checkpoint.json)")
    if args.baselines is None:
        args.baselines = bool(args.example)
    if args.baselines and args.no_certify:
        # The balls-in-bins DP-SGD row is EVR-certified with --certify-samples (or its default):
        # refuse now, before minutes of optimization and a written result, if that cannot work.
        # (With certification on, the loop validates the certificate size the row then reuses.)
        from dpjax.montecarlo import _evr
        from dpjax.optimization.baselines import DEFAULT_CERTIFY_SAMPLES

        count = args.certify_samples or DEFAULT_CERTIFY_SAMPLES
        if _evr.base_delta_for_target(int(count), float(args.delta)) is None:
            raise ValueError(f"--baselines: the balls-in-bins DP-SGD row cannot be certified at --delta {args.delta:g} "
                             f"with {count} samples; pass --certify-samples >= {_evr.minimum_samples(float(args.delta))} "
                             f"(more, e.g. 10x, to leave room for the estimate) or --no-baselines")
    n = args.batches_per_epoch * args.epochs
    param = make_parameterization(args.family, n, bands=args.bands,
                                  num_buffers=args.buffers if args.family == "blt" else None)
    if args.quiet or args.json:
        set_progress(False)
    checkpoint = None if args.out is None else args.out + ".checkpoint.json"
    res = optimize_correlation(
        param, batches_per_epoch=args.batches_per_epoch, epochs=args.epochs,
        target_epsilon=args.epsilon, target_delta=args.delta, num_steps=args.optimizer_steps,
        num_samples=args.samples, optimizer=default_optimizer(args.learning_rate), key=args.seed,
        checkpoint_path=checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume,
        certify=not args.no_certify, certify_samples=args.certify_samples)
    if args.out is not None:
        res.to_json(args.out)
    d = res.to_dict()
    out = {k: d[k] for k in ("noise_multiplier", "noise_multiplier_estimate", "gap_to_estimate",
                             "rmse", "rmse_estimate", "error", "first_column", "certificate",
                             "status", "stop_reason", "parameterization", "batches_per_epoch",
                             "epochs", "target_epsilon", "target_delta", "num_steps",
                             "num_samples", "timings")}
    if not res.certificate and args.no_certify:
        # Not certified on request: say so with null rather than a NaN (a NaN is never an answer).
        for key in ("noise_multiplier", "rmse", "gap_to_estimate"):
            out[key] = None
    out["adjacency"] = "add_or_remove"  # balls-in-bins Monte Carlo accounting (Choquette-Choo et al. 2024)
    out["params"] = d["params"]
    out["history_rows"] = len(d["history"])
    if args.baselines:
        out["baselines"] = baseline_rows(param, res, args)
    if args.out is not None:
        out["out"] = args.out
    return out


def baseline_rows(param, res, args) -> list[dict]:
    """The alternatives in the result's own units (``--baselines``; on with ``--example``).

    Every row is ``rmse = sigma |A C^-1|_F / sqrt(n)`` at ``(epsilon, delta)``
    (:data:`dpjax.optimization.baselines.NORMALIZATION`): DP-SGD (``C = I``) without
    amplification (exact Gaussian), under Poisson sampling ``q = 1/b`` (PLD) and under
    balls-in-bins (Monte Carlo, EVR-certified with as many samples as the result's certificate),
    and the unamplified optimum of the same family.  ``gain`` is ``rmse(row) / rmse(result) - 1``
    (positive: the optimised ``C`` is better).  The jax_privacy banded rows need jax_privacy and
    minutes of CPU: ``benchmarks/table_amplified_mf.py``.
    """
    import jax.numpy as jnp

    from dpjax.matrices import Toeplitz
    from dpjax.optimization import baselines as bl

    b, epochs, eps, delta = res.batches_per_epoch, res.epochs, res.target_epsilon, res.target_delta
    # The result's own certificate size (else --certify-samples, else the baseline's default).
    samples = (res.certificate or {}).get("num_samples") or args.certify_samples
    rows = [bl.dpsgd_unamplified(eps, delta, b, epochs), bl.dpsgd_poisson(eps, delta, b, epochs)]
    kw = {} if samples is None else {"certify_samples": int(samples)}
    rows.append(bl.balls_in_bins_certified(Toeplitz(jnp.ones(1)), eps, delta, b, epochs,
                                           name="dpsgd_balls_in_bins", key=args.seed + 1, **kw))
    rows += bl.unamplified_optimum(param, [eps], delta, b, epochs)
    mine = res.rmse if res.certificate else res.rmse_estimate
    out = []
    for r in rows:
        out.append({"name": r.name, "noise_multiplier": r.noise_multiplier, "rmse": r.rmse,
                    "accounting": r.accounting,
                    "gain": r.rmse / mine - 1.0 if math.isfinite(mine) and mine > 0 else None})
    return out


def _render(result: dict) -> str:
    cert = result.get("certificate") or {}
    if result["noise_multiplier"] is None:
        sigma_line = (f"noise_multiplier  not certified (--no-certify); estimate "
                      f"{result['noise_multiplier_estimate']:.6g}")
        rmse_line = f"rmse_estimate     {result['rmse_estimate']:.6g}  (at the estimated noise multiplier)"
    else:
        sigma_line = (f"noise_multiplier  {result['noise_multiplier']:.6g}  (certified; estimate "
                      f"{result['noise_multiplier_estimate']:.6g}, gap {100 * result['gap_to_estimate']:+.2f}%)")
        rmse_line = f"rmse              {result['rmse']:.6g}  (at the certified noise multiplier)"
    lines = [
        f"family            {result['parameterization']}",
        sigma_line,
        rmse_line,
        f"certificate       {cert.get('reason', 'not requested')}",
        f"failure prob.     {cert.get('failure_probability', float('nan')):.3g} "
        f"({cert.get('num_samples', 0)} samples)",
        f"status            {result['status']} {result['stop_reason']}".rstrip(),
    ]
    if "out" in result:
        lines.append(f"saved             {result['out']}")
    if result.get("baselines"):
        mine = result["rmse"] if result["noise_multiplier"] is not None else result["rmse_estimate"]
        lines += ["", "rmse = sigma |A C^-1|_F / sqrt(n), every row at the same (epsilon, delta):",
                  f"  {'row':26s} {'sigma':>9s} {'rmse':>9s}  {'optimized C is better by':s}",
                  f"  {'optimized ' + result['parameterization']['family']:26s} "
                  f"{result['noise_multiplier'] or result['noise_multiplier_estimate']:9.4g} {mine:9.4g}"]
        for r in result["baselines"]:
            gain = "" if r["gain"] is None else f"{100 * r['gain']:+.1f}%"
            lines.append(f"  {r['name']:26s} {r['noise_multiplier']:9.4g} {r['rmse']:9.4g}  {gain}")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "optimize", help="optimise a correlation matrix C under balls-in-bins amplification and certify "
                         "its noise multiplier",
        description="Optimise a lower-triangular Toeplitz / banded / BLT correlation matrix C (c0 = 1) for\n"
                    "prefix-sum RMSE sigma*(C) |A C^-1|_F / sqrt(n) under balls-in-bins batching (b batches per\n"
                    "epoch, E epochs, n = b E rounds, add/remove adjacency), with sigma*(C) calibrated on a\n"
                    "Monte Carlo estimate at every step (Choquette-Choo, Ganesh, Haque, Steinke and Thakurta,\n"
                    "'Near exact privacy amplification for matrix mechanisms'), then release the noise\n"
                    "multiplier certified by Estimate-Verify-Release on independent draws.  Comma lists in\n"
                    "--epsilon / --delta run one optimisation per combination.\n\n"
                    "Examples:\n"
                    "  dpjax optimize --example\n"
                    "  dpjax optimize --family blt --buffers 4 --batches-per-epoch 128 --epochs 16 \\\n"
                    "      --epsilon 2 --delta 1e-5 --optimizer-steps 300 --samples 131072 --out result.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", type=_args.choice("blt", "toeplitz", "banded"), default=None,
                   help="parameterization of C: blt (buffered linear Toeplitz), toeplitz (full), "
                        "banded (Toeplitz with --bands bands); default blt")
    p.add_argument("--buffers", type=_args.integer(1, 64), default=None,
                   help="BLT buffers d, an integer in [1, 64] and at most n = b E (default 4, or n when "
                        "smaller; --family blt only)")
    p.add_argument("--bands", type=_args.integer(1, _args.MAX_STEPS), default=None,
                   help="bands of a banded Toeplitz C, an integer >= 1 (--family banded only)")
    p.add_argument("--batches-per-epoch", type=_args.integer(1, 2**20), default=None,
                   help="b, batches per epoch (an integer >= 1; required unless --example)")
    p.add_argument("--epochs", type=_args.integer(1, 2**20), default=None,
                   help="E, epochs (an integer >= 1; required unless --example); n = b * E rounds")
    _args.add_target_epsilon(p, required=False, extra="; required unless --example")
    _args.add_target_delta(p, required=False, extra="; required unless --example")
    # Not --steps: elsewhere that is the number of DP-SGD training steps.
    p.add_argument("--optimizer-steps", type=_args.integer(0, 10**7), default=None,
                   help="optimizer (Adam) steps on the correlation matrix, an integer >= 0 (default 300)")
    p.add_argument("--samples", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="Monte Carlo samples per optimisation step, an integer >= 1 (default 2^13; the "
                        "in-loop sigma is an estimate, only the final certificate is a guarantee)")
    p.add_argument("--certify-samples", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="samples per certification sample set (default: the smallest power of two that "
                        "verifies about 0.4 delta)")
    p.add_argument("--no-certify", action="store_true",
                   help="skip the certificate: report the estimate only (noise_multiplier is null)")
    p.add_argument("--learning-rate", type=_args.real(0, lo_open=True), default=0.05,
                   help="Adam learning rate > 0 (default 0.05)")
    p.add_argument("--seed", type=_args.integer(0, _args.MAX_SEED), default=0, help=_args.SEED_HELP)
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write the loadable result JSON (OptimizationResult.load) to FILE; the checkpoint "
                        "is FILE.checkpoint.json (with its binary screen-state sidecar "
                        "FILE.checkpoint.json.screen-<step>.npz, which makes --resume bit-identical)")
    p.add_argument("--checkpoint-every", type=_args.integer(1, 10**7), default=25,
                   help="steps between checkpoints, an integer >= 1 (default 25; needs --out)")
    p.add_argument("--resume", action="store_true", help="continue from <out>.checkpoint.json")
    p.add_argument("--example", action="store_true",
                   help="the built-in example: a 2-buffer BLT, 8 batches per epoch, 4 epochs (n = 32), "
                        "epsilon 2, delta 1e-5, 100 optimizer steps of 2^12 samples (flags given override it)")
    p.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=None,
                   help="also compute the alternatives in the same units (DP-SGD unamplified, Poisson, "
                        "balls-in-bins; the family's unamplified optimum) and the gain over each "
                        "(default: on with --example, off otherwise)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    # --out is the loadable OptimizationResult (dpjax.optimization.OptimizationResult.load), a
    # superset of the --json object; main() must not overwrite it.
    p.set_defaults(run=_run, render=_render, owns_out=True)
