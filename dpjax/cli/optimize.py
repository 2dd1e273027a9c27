"""``dpjax optimize``: optimise a correlation matrix under balls-in-bins amplification, certified.

Example::

    dpjax optimize --family blt --buffers 4 --batches-per-epoch 128 --epochs 16 \\
        --epsilon 2 --delta 1e-5 --optimizer-steps 300 --samples 131072 --out result.json [--resume]

What it prints (text mode): what was optimised and for what, in words; the certified noise
multiplier as the one to train with (printed rounded up: any larger noise multiplier is private
too), the in-loop estimate only as a diagnostic; the certificate in one sentence (method,
samples, failure probability; every detail with ``--verbose``); where the result was saved; and,
with ``--baselines`` (on with ``--example``), the alternatives in the same units.

Where the result goes.  ``--out FILE`` receives the :class:`dpjax.optimization.OptimizationResult`
JSON (written atomically, replacing FILE if it exists; the output says so); a checkpoint
``<out>.checkpoint.json`` is written every ``--checkpoint-every`` steps (with the screen state
of the in-loop calibration beside it, ``<out>.checkpoint.json.screen-<step>.npz``), and
``--resume`` continues a killed run from it; once the completed run is saved the checkpoint is
removed.  Without ``--out`` the result is saved in the current directory
as ``dpjax-optimize-<family>-b<b>-E<E>-eps<epsilon>-delta<delta>.json`` (:func:`default_out_name`)
and never overwrites anything: when that name is taken the first free ``...-2.json``,
``...-3.json``, ... is used.  No checkpoint is written then, and ``--no-save`` writes nothing.
``--amplification cyclic_poisson`` and ``auto`` save the printed JSON object instead of an
``OptimizationResult``.

``--amplification b_min_sep --min-sep B --sampling-prob P --steps N`` optimises a banded ``C``
(``--bands``, at most ``B``; default ``min(B, N)``) for ``N`` rounds under b-min-sep sampling
(Dong & Ganesh, "Privacy Amplification for BandMF via b-Min-Sep Subsampling"), certified by
:meth:`dpjax.montecarlo.BMinSep.certify_noise` (``bernoulli_kl``); its output names the
training sampler, :class:`dpjax.sampling.BMinSepSampler`.  ``auto`` adds that candidate (at
``n = b E``) only when ``--min-sep`` and ``--sampling-prob`` are given, and names the sampler
of the one it keeps (``training_sampler``).

``--amplification random_allocation --batches-per-epoch T --epochs E --selections-per-epoch K``
optimises a banded ``C`` (``--bands``, at most 6; default ``min(4, n)``) for ``n = T E`` rounds
under random allocation (Feldman & Shenfeld, "Privacy amplification by random allocation": each
epoch, each example takes part in a fresh uniformly random ``K``-subset of the ``T`` batches;
``K <= min(T, 32)``, default 1), certified by :meth:`dpjax.montecarlo.RandomAllocation.certify_noise`
(``bernoulli_kl``).  dpjax has no batch sampler for it: the output's ``training_sampler`` says so
and names what :mod:`dpjax.sampling` offers.  ``auto`` adds that candidate only when
``--selections-per-epoch`` is given.

Progress goes to stderr (off with ``--quiet`` or ``--json``): one line when each stage starts
(the alternatives, the optimisation, the certificate) and the optimisation's meter (a bar in a
terminal or notebook, a line every 10 s in a log; :mod:`dpjax._base.progress`).  The JSON object
holds ``noise_multiplier`` (certified), ``noise_multiplier_estimate``, ``first_column``,
``rmse`` (at the certified sigma), ``certificate`` and ``out`` (the file written, with
``out_replaced``).
"""

from __future__ import annotations

import argparse
import math
import os

from dpjax._base.enums import Adjacency, StrEnum
from dpjax.cli import _args


class Amplification(StrEnum):
    """``--amplification``: how batches amplify privacy, hence which matrix and accountant.

    ``balls_in_bins`` optimises ``C`` under balls-in-bins batching with a Monte Carlo
    certificate; ``cyclic_poisson`` takes dpjax's banded ``C`` under cyclic Poisson sampling,
    PLD-accounted; ``b_min_sep`` optimises a banded ``C`` (at most ``--min-sep`` bands) under
    b-min-sep sampling with a Monte Carlo certificate; ``auto`` runs balls-in-bins and cyclic
    Poisson (and b-min-sep when ``--min-sep`` and ``--sampling-prob`` are given, random
    allocation when ``--selections-per-epoch`` is) and keeps the smaller certified rmse;
    ``random_allocation`` optimises a banded ``C`` (at most 6 bands) under random allocation
    (``--selections-per-epoch`` of the ``--batches-per-epoch`` batches of every epoch) with a
    Monte Carlo certificate."""

    BALLS_IN_BINS = "balls_in_bins"
    CYCLIC_POISSON = "cyclic_poisson"
    B_MIN_SEP = "b_min_sep"
    RANDOM_ALLOCATION = "random_allocation"
    AUTO = "auto"


#: The training sampler each amplification's noise multiplier is certified for.
TRAINING_SAMPLERS = {
    Amplification.BALLS_IN_BINS: "dpjax.sampling.BallsInBinsSampler (balls-in-bins batches)",
    Amplification.CYCLIC_POISSON: ("cyclic Poisson sampling (the examples split into k = bands groups used in turn, "
                                   "each example of a round's group taken with probability k / b)"),
    Amplification.B_MIN_SEP: "dpjax.sampling.BMinSepSampler (b-min-sep batches)",
    Amplification.RANDOM_ALLOCATION: ("random allocation: each example in a uniformly random k-subset of the b batches "
                                      "of every epoch, drawn afresh each epoch (dpjax has no batch sampler for it; "
                                      "dpjax.sampling offers BallsInBinsSampler, PoissonSampler and BMinSepSampler)"),
}

#: Bands of the random-allocation C when ``--bands`` is not given (at most n): the accountant's
#: cost grows as 2^(bands - 1) (k + 1) states per round and sample, up to 6 bands.
DEFAULT_ALLOCATION_BANDS = 4


# ``--example``: the built-in problem of the README's first command.  Small enough to finish in
# well under a minute on 2 CPU cores (n = 32 rounds), large enough that amplification matters:
# a 2-buffer BLT under balls-in-bins batching with 8 batches per epoch for 4 epochs, certified at
# (2, 1e-5).  Flags given explicitly override these values.
EXAMPLE = dict(family="blt", buffers=2, batches_per_epoch=8, epochs=4, epsilon=2.0, delta=1e-5,
               optimizer_steps=100, samples=1 << 11)


def apply_example(args) -> None:
    """Fill the options the user left unset with :data:`EXAMPLE` (``--example``), and insist on the
    required ones otherwise (argparse cannot: they are optional under ``--example``)."""
    b_min_sep = getattr(args, "amplification", None) == Amplification.B_MIN_SEP
    if args.example and b_min_sep:
        raise ValueError("--example is a balls-in-bins problem: not with --amplification b_min_sep")
    if args.example and getattr(args, "amplification", None) == Amplification.RANDOM_ALLOCATION:
        raise ValueError("--example is a balls-in-bins problem: not with --amplification random_allocation")
    for name, value in EXAMPLE.items():
        if getattr(args, name, None) is None and args.example:
            setattr(args, name, value)
    if b_min_sep:
        _b_min_sep_defaults(args)
        return
    for name in ("batches_per_epoch", "epochs", "epsilon", "delta"):
        if getattr(args, name) is None:
            raise ValueError(f"--{name.replace('_', '-')} is required (or give --example for the built-in "
                             "problem)")
    if getattr(args, "amplification", None) == Amplification.RANDOM_ALLOCATION:
        _random_allocation_defaults(args)
    if args.family is None:
        args.family = "blt"
    if args.optimizer_steps is None:
        args.optimizer_steps = 300
    # args.samples None: the estimator's default (optimize_correlation).


#: BLT buffers when ``--buffers`` is not given (at most ``n``, the number of rounds).
DEFAULT_BUFFERS = 4


def _b_min_sep_defaults(args) -> None:
    """``--amplification b_min_sep``: ``--min-sep``, ``--sampling-prob`` and ``--steps`` (the
    rounds ``n``) required, ``--batches-per-epoch`` / ``--epochs`` refused (b-min-sep has no
    epochs), the family banded with at most ``--min-sep`` bands (default ``min(min_sep, n)``)."""
    for name in ("min_sep", "sampling_prob", "steps", "epsilon", "delta"):
        if getattr(args, name) is None:
            raise ValueError(f"--{name.replace('_', '-')} is required with --amplification b_min_sep")
    for name in ("batches_per_epoch", "epochs"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to --amplification b_min_sep (it has no "
                             "epochs; the rounds are --steps)")
    _banded_family(args, Amplification.B_MIN_SEP, "--min-sep", min(args.min_sep, args.steps))
    if args.optimizer_steps is None:
        args.optimizer_steps = 300


def _banded_family(args, amplification, most: str, default_bands: int) -> None:
    """The family of a chain scheme's ``C``: banded (the default; any other refused), with
    ``default_bands`` bands unless ``--bands`` is given (``most``: the limit in words)."""
    if args.family is None:
        args.family = "banded"
    if args.family != "banded":
        raise ValueError(f"--family must be banded with --amplification {amplification} (a C with at most {most} "
                         f"bands; a {args.family} C is not banded), got --family {args.family}")
    if args.bands is None:
        args.bands = default_bands


def _random_allocation_defaults(args) -> None:
    """``--amplification random_allocation``: the family banded (default ``min(4, n)`` bands),
    ``--selections-per-epoch`` 1 unless given."""
    _banded_family(args, Amplification.RANDOM_ALLOCATION, "6",
                   min(DEFAULT_ALLOCATION_BANDS, args.batches_per_epoch * args.epochs))
    if args.selections_per_epoch is None:
        args.selections_per_epoch = 1


def random_allocation_requested(args) -> bool:
    """Whether random allocation takes part: ``--amplification random_allocation``, or ``auto``
    with ``--selections-per-epoch`` given."""
    return (args.amplification == Amplification.RANDOM_ALLOCATION
            or (args.amplification == Amplification.AUTO and args.selections_per_epoch is not None))


def check_random_allocation_args(args) -> None:
    """The random-allocation options: ``--selections-per-epoch`` only where random allocation takes
    part, ``k <= min(t, 32)``, at most 6 bands, the certificate method it has (``bernoulli_kl``)."""
    from dpjax.montecarlo.allocation import MAX_BANDS, MAX_SELECTIONS

    k = args.selections_per_epoch
    if k is not None and args.amplification not in (Amplification.RANDOM_ALLOCATION, Amplification.AUTO):
        raise ValueError(f"--selections-per-epoch applies to --amplification random_allocation or auto, got "
                         f"--amplification {args.amplification}")
    if not random_allocation_requested(args):
        return
    most = min(args.batches_per_epoch, MAX_SELECTIONS)
    if k > most:
        raise ValueError(f"--selections-per-epoch must be in [1, min(--batches-per-epoch, {MAX_SELECTIONS})] = "
                         f"[1, {most}], got {k}")
    if args.amplification != Amplification.RANDOM_ALLOCATION:
        return
    if args.certify_method == "importance_betting":
        raise ValueError("--certify-method must be bernoulli_kl with --amplification random_allocation (the "
                         "importance_betting certificate needs the balls-in-bins importance sampler)")
    most = min(MAX_BANDS, args.batches_per_epoch * args.epochs)
    if args.bands > most:
        raise ValueError(f"--bands must be in [1, min({MAX_BANDS}, n)] = [1, {most}] with --amplification "
                         f"random_allocation, got {args.bands}")
    if args.baselines:
        raise ValueError("--baselines compares balls-in-bins alternatives: not with --amplification random_allocation")


def b_min_sep_requested(args) -> bool:
    """Whether b-min-sep takes part: ``--amplification b_min_sep``, or ``auto`` with both
    ``--min-sep`` and ``--sampling-prob`` given."""
    if args.amplification == Amplification.B_MIN_SEP:
        return True
    return (args.amplification == Amplification.AUTO and args.min_sep is not None
            and args.sampling_prob is not None)


def check_b_min_sep_args(args) -> None:
    """The b-min-sep options: only where b-min-sep takes part, ``--steps`` only for
    ``b_min_sep`` (``auto`` uses the rounds of the other candidates), and the certificate
    method it has (``bernoulli_kl``)."""
    given = [f for f, v in (("--min-sep", args.min_sep), ("--sampling-prob", args.sampling_prob)) if v is not None]
    if given and args.amplification not in (Amplification.B_MIN_SEP, Amplification.AUTO):
        raise ValueError(f"{' and '.join(given)} apply to --amplification b_min_sep or auto, got --amplification "
                         f"{args.amplification}")
    if args.amplification == Amplification.AUTO and len(given) == 1:
        raise ValueError("--amplification auto includes b-min-sep only with both --min-sep and --sampling-prob, "
                         f"got only {given[0]}")
    if args.steps is not None and args.amplification != Amplification.B_MIN_SEP:
        raise ValueError("--steps (the rounds n) applies to --amplification b_min_sep only (otherwise n = "
                         "--batches-per-epoch * --epochs); for the optimizer's steps, did you mean "
                         "--optimizer-steps?")
    if args.amplification == Amplification.B_MIN_SEP:
        if args.certify_method == "importance_betting":
            raise ValueError("--certify-method must be bernoulli_kl with --amplification b_min_sep (the "
                             "importance_betting certificate needs the balls-in-bins importance sampler)")
        if args.bands > args.min_sep or args.bands > args.steps:
            raise ValueError(f"--bands must be in [1, min(--min-sep, --steps)] = [1, {min(args.min_sep, args.steps)}] "
                             f"with --amplification b_min_sep, got {args.bands}")
        if args.baselines:
            raise ValueError("--baselines compares balls-in-bins alternatives: not with --amplification b_min_sep")


def check_output_paths(out: str, *, resume: bool) -> None:
    """Before any work: ``--out`` and its checkpoint must be writable files, and ``--resume``
    needs a checkpoint to resume from (a failure after the whole optimization would lose it)."""
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise ValueError(f"--out: directory {directory!r} does not exist")
    checkpoint = out + ".checkpoint.json"
    for flag, path in (("--out", out), ("--out (its checkpoint)", checkpoint)):
        if os.path.isdir(path):
            raise ValueError(f"{flag}: {path!r} is a directory, not a file")
    _writable_directory(directory, "--out")
    if os.path.exists(out) and not os.access(out, os.W_OK):
        raise ValueError(f"--out: {out!r} is not writable")
    if resume and not os.path.exists(checkpoint):
        raise ValueError(f"--resume: no checkpoint {checkpoint!r} to resume from (drop --resume to start afresh)")


def default_out_name(args) -> str:
    """The result file's name when ``--out`` is not given: the configuration in a few tokens,
    ``dpjax-optimize-blt2-b8-E4-eps2-delta1e-05.json`` for the example (``cyclic-poisson`` /
    ``auto`` appended for those amplifications)."""
    if args.amplification == Amplification.RANDOM_ALLOCATION:
        return (f"dpjax-optimize-banded{args.bands}-b{args.batches_per_epoch}-k{args.selections_per_epoch}-"
                f"E{args.epochs}-eps{args.epsilon:g}-delta{args.delta:g}-random-allocation.json")
    if args.amplification == Amplification.B_MIN_SEP:
        return (f"dpjax-optimize-banded{args.bands}-minsep{args.min_sep}-p{args.sampling_prob:g}-n{args.steps}-"
                f"eps{args.epsilon:g}-delta{args.delta:g}-b-min-sep.json")
    if args.amplification == Amplification.CYCLIC_POISSON:  # a banded C, its bands chosen unless --bands
        family = "banded" if args.bands is None else f"banded{args.bands}"
    else:
        family = {"blt": f"blt{args.buffers}", "banded": f"banded{args.bands}"}.get(args.family, args.family)
    amp = "" if args.amplification == Amplification.BALLS_IN_BINS else "-" + args.amplification.replace("_", "-")
    return (f"dpjax-optimize-{family}-b{args.batches_per_epoch}-E{args.epochs}-eps{args.epsilon:g}-"
            f"delta{args.delta:g}{amp}.json")


def free_path(path: str) -> str:
    """``path`` if no file has that name, else the first free ``<stem>-2<ext>``, ``<stem>-3<ext>``, ..."""
    stem, ext = os.path.splitext(path)
    k = 1
    while os.path.lexists(path):
        k += 1
        path = f"{stem}-{k}{ext}"
    return path


def write_new(path: str, text: str) -> str:
    """Write ``text`` to ``path`` or, if that name is taken by the time of writing, to the next
    free name (:func:`free_path`); never replaces a file.  The file appears complete (a hard link
    of a finished temporary file).  Returns the path written."""
    from dpjax._base import io as _io

    tmp = _io.write_temp(path, text)
    try:
        for _ in range(1000):
            path = free_path(path)
            try:
                os.link(tmp, path)  # fails if the name was taken meanwhile: never overwrites
                return path
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links: exclusive creation instead
                with open(path, "x") as fh:
                    fh.write(text)
                return path
        raise ValueError(f"no free file name like {path!r}")
    finally:
        os.unlink(tmp)


def _writable_directory(directory: str, flag: str) -> None:
    import tempfile

    try:  # the one reliable test that the directory takes new files (permissions, /proc, read-only mounts)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dpjax-write-test-"):
            pass
    except OSError as exc:
        raise ValueError(f"{flag}: cannot write in {directory!r}: {exc.strerror or exc}") from None


def _stage(text: str) -> None:
    """One line on stderr when a stage starts (where progress shows: not with --quiet/--json)."""
    from dpjax._base.progress import note

    note(f"dpjax optimize: {text}")


def check_args(args) -> None:
    """Every option and their combinations, before any work (fills the defaults that depend on
    others: ``--example``'s values, ``--buffers``, ``--baselines``)."""
    apply_example(args)
    check_b_min_sep_args(args)
    check_random_allocation_args(args)

    if args.family != "blt" and args.buffers is not None:
        raise ValueError(f"--buffers is only used by --family blt, got --family {args.family}")
    if args.family != "banded" and args.bands is not None:
        raise ValueError(f"--bands is only used by --family banded, got --family {args.family}")
    n = args.batches_per_epoch * args.epochs if args.batches_per_epoch and args.epochs else args.steps
    if args.family == "blt" and args.buffers is None:
        args.buffers = DEFAULT_BUFFERS if n is None else min(DEFAULT_BUFFERS, n)
    elif args.family == "blt" and n is not None and args.buffers > n:
        raise ValueError(f"--buffers must be in [1, n] = [1, {n}] (n = --batches-per-epoch * --epochs rounds), "
                         f"got {args.buffers}")
    if args.family == "banded" and args.bands is None:
        raise ValueError("--bands must be given for --family banded (an integer >= 1)")
    for name in ("batches_per_epoch", "epochs", "optimizer_steps", "samples", "checkpoint_every"):
        value = getattr(args, name)
        if name == "samples" and value is None:  # the estimator's default (optimize_correlation)
            continue
        if name in ("batches_per_epoch", "epochs") and args.amplification == Amplification.B_MIN_SEP:
            continue
        if value is None or value < (0 if name == "optimizer_steps" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be an integer >= "
                             f"{0 if name == 'optimizer_steps' else 1}, got {value}")
    if not args.learning_rate > 0:
        raise ValueError(f"--learning-rate must be > 0, got {args.learning_rate}")
    check_sampler_args(args)
    if args.no_save and args.out is not None:
        raise ValueError("--no-save and --out contradict each other: give one")
    if args.out is not None:
        check_output_paths(args.out, resume=args.resume)
    elif args.resume:
        raise ValueError("--resume needs --out (the checkpoint is <out>.checkpoint.json)")
    elif not args.no_save:
        _writable_directory(os.getcwd(), "the result file (pass --out FILE or --no-save)")
    if args.baselines is None:
        args.baselines = bool(args.example)
    if args.certify_method is None:  # the method each scheme has by default
        from dpjax.montecarlo.evr import DEFAULT_METHOD

        args.certify_method = ("bernoulli_kl" if args.amplification in (Amplification.B_MIN_SEP,
                                                                        Amplification.RANDOM_ALLOCATION)
                               else DEFAULT_METHOD)


def check_sampler_args(args) -> None:
    """``--dataset-size`` / ``--batch-size``: the training sampler whose truncation the
    certificate accounts (both or neither; balls-in-bins only), checked before any work."""
    n, bs = args.dataset_size, args.batch_size
    if n is None and bs is None:
        return
    if n is None or bs is None:
        raise ValueError("--dataset-size and --batch-size go together (the training sampler's N and its fixed batch "
                         f"shape B), got only {'--dataset-size' if bs is None else '--batch-size'}")
    if args.amplification != Amplification.BALLS_IN_BINS:
        raise ValueError(f"--dataset-size and --batch-size describe a balls-in-bins training sampler "
                         f"(dpjax.sampling.BallsInBinsSampler); --amplification {args.amplification} has none in dpjax: "
                         "use --amplification balls_in_bins or drop them")
    from dpjax.optimization.certify import sampler_terms

    try:
        sampler_terms(n, bs, args.batches_per_epoch, args.epsilon, args.delta)
    except ValueError as exc:
        # The message in the command line's names (it starts with "batch_size = ...").
        raise ValueError(str(exc).replace("batch_size", "--batch-size")
                         .replace("target_delta", "--delta").replace("dataset_size", "--dataset-size")
                         .replace("batches_per_epoch", "--batches-per-epoch")) from None


def _run(args) -> dict:
    from dpjax._base.progress import set_progress
    from dpjax.optimization import (CertifySettings, Checkpoint, CorrelationProblem, OptimizerSettings,
                                    make_parameterization, optimize_correlation)
    from dpjax.optimization.loop import default_optimizer
    from dpjax.pld.scenario import BallsInBins

    check_args(args)
    if args.quiet or args.json:
        set_progress(False)
    checkpoint = None if args.out is None else args.out + ".checkpoint.json"
    if args.amplification in (Amplification.B_MIN_SEP, Amplification.RANDOM_ALLOCATION):
        out, res = (b_min_sep_result(args, args.steps, args.bands, checkpoint)
                    if args.amplification == Amplification.B_MIN_SEP
                    else random_allocation_result(args, args.bands, checkpoint))
        saved = save(out, args, text=res.to_json())
        if checkpoint is not None and res.status == "completed":
            remove_checkpoint(checkpoint)
        return saved
    n = args.batches_per_epoch * args.epochs
    param = make_parameterization(args.family, n, bands=args.bands,
                                  num_buffers=args.buffers if args.family == "blt" else None)
    if args.amplification == Amplification.CYCLIC_POISSON:
        return save(cyclic_poisson_result(args), args)
    # The baselines first: they do not depend on the optimised C, and a baseline that cannot be
    # certified is refused before minutes of optimisation and before anything is written.
    if args.baselines:
        _stage("the alternatives (DP-SGD unamplified, Poisson, balls-in-bins; the family's unamplified optimum)")
    rows = baseline_rows(param, args) if args.baselines else None
    _stage(f"optimizing C: {args.optimizer_steps} optimizer steps, then the certificate")
    problem = CorrelationProblem(sampling=BallsInBins(args.batches_per_epoch), epochs=args.epochs,
                                 target_epsilon=args.epsilon, target_delta=args.delta,
                                 dataset_size=args.dataset_size, batch_size=args.batch_size)
    settings = OptimizerSettings(num_steps=args.optimizer_steps, num_samples=args.samples,
                                 optimizer=default_optimizer(args.learning_rate), key=args.seed,
                                 estimator=args.estimator)
    certify = False if args.no_certify else CertifySettings(num_samples=args.certify_samples,
                                                            method=args.certify_method)
    res = optimize_correlation(
        param, problem, settings, certify=certify,
        checkpoint=None if checkpoint is None else Checkpoint(checkpoint, every=args.checkpoint_every,
                                                              resume=args.resume))
    out = balls_in_bins_output(res, rows, args)
    if args.amplification == Amplification.AUTO:
        candidates = [out, cyclic_poisson_result(args)]
        if b_min_sep_requested(args):
            bands = args.bands if args.family == "banded" and args.bands <= args.min_sep else min(args.min_sep, n)
            candidates.append(b_min_sep_result(args, n, bands, None)[0])
        if random_allocation_requested(args):
            from dpjax.montecarlo.allocation import MAX_BANDS

            bands = (args.bands if args.family == "banded" and args.bands <= MAX_BANDS
                     else min(DEFAULT_ALLOCATION_BANDS, n))
            candidates.append(random_allocation_result(args, bands, None)[0])
        saved = save(best_of(*candidates), args)
    else:
        saved = save(out, args, text=res.to_json())
    if checkpoint is not None and res.status == "completed":
        remove_checkpoint(checkpoint)
    return saved


def remove_checkpoint(checkpoint: str) -> None:
    """The checkpoint and its screen-state sidecars, once the result file holds the completed
    run (a run that stopped early keeps them, to be inspected or resumed)."""
    import glob

    for path in [checkpoint] + glob.glob(glob.escape(checkpoint) + ".screen-*.npz"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def balls_in_bins_output(res, rows, args) -> dict:
    """The printed / ``--json`` object of an optimised ``res`` (an :class:`OptimizationResult`):
    its main fields, ``null`` for what ``--no-certify`` left uncertified, and the baselines'
    ``rows`` with their ``gain``."""
    d = res.to_dict()
    out = {k: d[k] for k in ("noise_multiplier", "noise_multiplier_estimate", "gap_to_estimate",
                             "rmse", "rmse_estimate", "error", "first_column", "certificate",
                             "status", "stop_reason", "parameterization", "batches_per_epoch",
                             "epochs", "target_epsilon", "target_delta", "num_steps",
                             "num_samples", "estimator", "timings", "dataset_size", "batch_size",
                             "truncation_delta")}
    out["amplification"] = Amplification.BALLS_IN_BINS.value
    if not res.certificate and args.no_certify:
        # Not certified on request: say so with null rather than a NaN (a NaN is never an answer).
        for key in ("noise_multiplier", "rmse", "gap_to_estimate"):
            out[key] = None
    out["adjacency"] = Adjacency.ADD_OR_REMOVE  # balls-in-bins Monte Carlo accounting (Choquette-Choo et al. 2024)
    out["params"] = d["params"]
    out["history_rows"] = len(d["history"])
    if rows is not None:
        mine = res.rmse if res.certificate else res.rmse_estimate
        out["baselines"] = [dict(r, gain=r["rmse"] / mine - 1.0 if math.isfinite(mine) and mine > 0 else None)
                            for r in rows]
    return out


def save(result: dict, args, text: str | None = None) -> dict:
    """Write ``text`` (default: ``result`` as JSON) to ``--out`` (replacing it) or to a new file
    named :func:`default_out_name` (never replacing one); ``result`` gains ``out`` (the path) and
    ``out_replaced``.  ``--no-save``: nothing is written."""
    if args.no_save:
        return result
    from dpjax._base import io as _io

    if text is None:
        text = _io.dumps(result, indent=1)
    if args.out is not None:
        replaced = os.path.lexists(args.out)
        _io.atomic_write(args.out, text)
        path = args.out
    else:
        path, replaced = write_new(default_out_name(args), text), False
    result["out"] = path
    result["out_replaced"] = replaced
    return result


def cyclic_poisson_result(args) -> dict:
    """``--amplification cyclic_poisson``: dpjax's banded ``C`` under cyclic Poisson sampling, the
    band count chosen under the PLD accountant, the noise multiplier certified by it
    (:func:`dpjax.optimization.baselines.banded_cyclic_poisson_pld`)."""
    from dpjax.optimization import baselines as bl

    bands = [args.bands] if args.family == "banded" and args.bands is not None else None
    if bands is not None and bands[0] > args.batches_per_epoch:
        raise ValueError(f"--bands must be <= --batches-per-epoch = {args.batches_per_epoch} for "
                         f"--amplification cyclic_poisson, got {bands[0]}")
    row = bl.banded_cyclic_poisson_pld([args.epsilon], args.delta, args.batches_per_epoch, args.epochs,
                                       bands_list=bands)[0]
    e = row.extra
    return {"amplification": Amplification.CYCLIC_POISSON.value, "noise_multiplier": row.noise_multiplier,
            "noise_multiplier_estimate": row.noise_multiplier, "gap_to_estimate": 0.0, "rmse": row.rmse,
            "rmse_estimate": row.rmse, "error": row.error, "first_column": row.first_column,
            "certificate": {"method": "pld", "epsilon": row.epsilon, "delta": row.delta, "num_samples": None,
                            "failure_probability": 0.0, "verified": True,
                            "reason": f"{row.accounting}: PLD accountant's certified epsilon <= target at this "
                                      "noise multiplier"},
            "bands": e["bands"], "per_bands": e["per_bands"], "status": "completed", "stop_reason": "",
            "parameterization": {"family": "banded", "n": args.batches_per_epoch * args.epochs, "bands": e["bands"]},
            "batches_per_epoch": args.batches_per_epoch, "epochs": args.epochs, "target_epsilon": args.epsilon,
            "target_delta": args.delta, "adjacency": Adjacency.ADD_OR_REMOVE}


def best_of(*candidates: dict) -> dict:
    """``--amplification auto``: the candidate with the smaller certified rmse, every candidate's row
    (same units: rmse = sigma |A C^-1|_F / sqrt(n) at the same (epsilon, delta)) under ``candidates``;
    ``training_sampler`` names the sampler the chosen noise multiplier is certified for (the
    training loop must draw its batches so).  Without a certified candidate: the cyclic Poisson
    one (its PLD certificate always holds)."""
    rows = []
    for cand in candidates:
        cert = cand.get("certificate") or {}
        rows.append({"amplification": cand["amplification"], "noise_multiplier": cand["noise_multiplier"],
                     "rmse": cand["rmse"], "error": cand["error"], "certified": bool(cert.get("verified")),
                     "method": cert.get("method"), "family": cand["parameterization"],
                     "training_sampler": TRAINING_SAMPLERS[cand["amplification"]],
                     # The chance that an example is in a given batch: the expected batch is this times N.
                     "participation_rate": cand.get("participation_rate") or 1.0 / cand["batches_per_epoch"]})
    usable = [c for c, r in zip(candidates, rows)
              if r["certified"] and r["rmse"] is not None and math.isfinite(r["rmse"])]
    fallback = next(c for c in candidates if c["amplification"] == Amplification.CYCLIC_POISSON)
    best = dict(min(usable, key=lambda c: c["rmse"]) if usable else fallback)
    best["candidates"] = rows
    best["training_sampler"] = TRAINING_SAMPLERS[best["amplification"]]
    return best


def _optimize_banded(args, problem, num_rounds: int, bands: int, checkpoint: str | None):
    """The optimisation of a chain scheme's ``problem`` from the command line: a ``bands``-banded
    Toeplitz ``C`` for ``num_rounds`` rounds, the plain in-loop estimate, certified by the scheme
    accountant's Bernoulli-KL ladder (``--no-certify``: not certified)."""
    from dpjax.optimization import (CertifySettings, Checkpoint, OptimizerSettings, make_parameterization,
                                    optimize_correlation)
    from dpjax.optimization.loop import default_optimizer

    settings = OptimizerSettings(num_steps=args.optimizer_steps, num_samples=args.samples,
                                 optimizer=default_optimizer(args.learning_rate), key=args.seed, estimator="plain")
    certify = False if args.no_certify else CertifySettings(num_samples=args.certify_samples, method="bernoulli_kl")
    return optimize_correlation(
        make_parameterization("banded", num_rounds, bands=bands), problem, settings, certify=certify,
        checkpoint=None if checkpoint is None else Checkpoint(checkpoint, every=args.checkpoint_every,
                                                              resume=args.resume))


def _chain_output(res, args, amplification: Amplification, drop: tuple, **fields) -> dict:
    """The printed / ``--json`` object of a chain scheme's result: the balls-in-bins output's
    fields (add/remove adjacency too) less ``drop`` (those of its sampler, and its epochs where the
    scheme has none), the scheme record, and ``fields``."""
    out = {k: v for k, v in balls_in_bins_output(res, None, args).items() if k not in drop}
    out.update(amplification=amplification.value, sampling=res.sampling, **fields)
    return out


def b_min_sep_result(args, num_rounds: int, bands: int, checkpoint: str | None):
    """``(output, result)`` of the b-min-sep optimisation: a ``bands``-banded Toeplitz ``C`` for
    ``num_rounds`` rounds under ``dpjax.BMinSepSampling(--min-sep, --sampling-prob, n)``, certified
    by :meth:`dpjax.montecarlo.BMinSep.certify_noise` (Bernoulli-KL).  ``output`` is the printed /
    ``--json`` object (the :class:`OptimizationResult`'s main fields, the scheme and the training
    sampler, ``dpjax.sampling.BMinSepSampler``)."""
    from dpjax.optimization import CorrelationProblem
    from dpjax.pld.scenario import BMinSepSampling

    scheme = BMinSepSampling(args.min_sep, args.sampling_prob, num_rounds)
    _stage(f"optimizing a {bands}-banded C under b-min-sep sampling (min_sep {args.min_sep}, sampling_prob "
           f"{args.sampling_prob:g}, n = {num_rounds}): {args.optimizer_steps} optimizer steps, then the certificate")
    problem = CorrelationProblem(sampling=scheme, target_epsilon=args.epsilon, target_delta=args.delta)
    res = _optimize_banded(args, problem, num_rounds, bands, checkpoint)
    sampler = (f"dpjax.sampling.BMinSepSampler(num_examples, sampling_prob={args.sampling_prob:g}, "
               f"min_sep={args.min_sep}, steps={num_rounds}, batch_size)")
    return _chain_output(res, args, Amplification.B_MIN_SEP,
                         ("batches_per_epoch", "epochs", "dataset_size", "batch_size", "truncation_delta"),
                         participation_rate=scheme.participation_rate, training_sampler=sampler), res


def random_allocation_result(args, bands: int, checkpoint: str | None):
    """``(output, result)`` of the random-allocation optimisation: a ``bands``-banded Toeplitz
    ``C`` for ``n = b E`` rounds under ``dpjax.RandomAllocation(--batches-per-epoch,
    --selections-per-epoch)`` with ``--epochs``, certified by
    :meth:`dpjax.montecarlo.RandomAllocation.certify_noise` (Bernoulli-KL).  ``output`` is the
    printed / ``--json`` object (the :class:`OptimizationResult`'s main fields, the scheme and the
    training sampler: the k-of-t allocation, for which dpjax has no batch sampler)."""
    from dpjax.optimization import CorrelationProblem
    from dpjax.pld.scenario import RandomAllocation

    t, k, epochs = args.batches_per_epoch, args.selections_per_epoch, args.epochs
    _stage(f"optimizing a {bands}-banded C under random allocation ({k} of {t} batches per epoch, {epochs} epochs, "
           f"n = {t * epochs}): {args.optimizer_steps} optimizer steps, then the certificate")
    problem = CorrelationProblem(sampling=RandomAllocation(t, selections_per_epoch=k), epochs=epochs,
                                 target_epsilon=args.epsilon, target_delta=args.delta)
    res = _optimize_banded(args, problem, t * epochs, bands, checkpoint)
    return _chain_output(res, args, Amplification.RANDOM_ALLOCATION, ("dataset_size", "batch_size", "truncation_delta"),
                         participation_rate=k / t,
                         training_sampler=TRAINING_SAMPLERS[Amplification.RANDOM_ALLOCATION]), res


def baseline_rows(param, args) -> list[dict]:
    """The alternatives in the result's own units (``--baselines``; on with ``--example``).

    Every row is ``rmse = sigma |A C^-1|_F / sqrt(n)`` at ``(epsilon, delta)``
    (:data:`dpjax.optimization.baselines.NORMALIZATION`): DP-SGD (``C = I``) without
    amplification (exact Gaussian), under Poisson sampling ``q = 1/b`` and under balls-in-bins
    (both dpjax's PLD accountant), and the unamplified optimum of the same family.  The caller adds ``gain``,
    ``rmse(row) / rmse(result) - 1`` (positive: the optimised ``C`` is better).  The jax_privacy
    banded rows need jax_privacy and minutes of CPU: ``benchmarks/table_amplified_mf.py``.
    """
    from dpjax.optimization import baselines as bl

    b, epochs, eps, delta = args.batches_per_epoch, args.epochs, args.epsilon, args.delta
    rows = [bl.dpsgd_unamplified(eps, delta, b, epochs), bl.dpsgd_poisson(eps, delta, b, epochs),
            bl.dpsgd_balls_in_bins(eps, delta, b, epochs)]
    rows += bl.unamplified_optimum(param, [eps], delta, b, epochs)
    return [{"name": r.name, "noise_multiplier": r.noise_multiplier, "rmse": r.rmse, "accounting": r.accounting}
            for r in rows]


#: The certificate methods in words (the method's name follows in brackets).
METHOD_WORDS = {
    "importance_betting": "Estimate-Verify-Release with importance-sampled Monte Carlo draws and a betting test",
    "bernoulli_kl": "Estimate-Verify-Release with plain Monte Carlo draws and a Bernoulli-KL (Hoeffding) bound",
    "pld": "the PLD accountant (a deterministic upper bound, no sampling)",
}


def round_up(x: float, digits: int = 6) -> str:
    """``x`` with ``digits`` significant digits, rounded up (a noise multiplier printed for
    training: any larger one is private too, a smaller one is not certified)."""
    from decimal import ROUND_CEILING, Decimal

    if not math.isfinite(x):
        return str(x)
    short = f"{x:.{digits}g}"
    if float(short) >= x:  # the same float or a larger one
        return short
    d = Decimal(x)
    q = d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_CEILING)
    return f"{q.normalize():f}" if abs(d.adjusted()) < 6 else f"{q.normalize():E}"


def _g(x) -> str:
    return "-" if x is None else f"{x:.6g}"


def _count(n) -> str:
    return "?" if n is None else f"{int(n):,}"


def _family_words(family: dict) -> str:
    kind = family.get("family")
    if kind == "blt":
        k = family.get("num_buffers")
        return f"a {k}-buffer BLT (buffered linear Toeplitz) correlation matrix C"
    if kind == "banded":
        bands = family.get("bands")
        return f"a banded Toeplitz correlation matrix C with {bands} band{'' if bands == 1 else 's'}"
    return "a full lower-triangular Toeplitz correlation matrix C"


def _family_short(family: dict) -> str:
    extra = {"blt": "num_buffers", "banded": "bands"}.get(family.get("family"))
    return family.get("family", "?") + (f"({family.get(extra)})" if extra else "")


def _wrap(text: str, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def _scheme_words(result: dict) -> str:
    """The participation scheme of an optimised result, in words (after "for n = ... rounds")."""
    s = result.get("sampling")
    if result.get("amplification") == Amplification.RANDOM_ALLOCATION and s:
        return (f"(b = {s['batches_per_epoch']} batches per epoch, E = {s['epochs']} epochs) to minimize the prefix-sum "
                f"RMSE, sigma |A C^-1|_F / sqrt(n), under random allocation (each example in a uniformly random "
                f"k = {s['selections_per_epoch']} of the b batches of every epoch, drawn afresh each epoch)")
    if result.get("amplification") != Amplification.B_MIN_SEP or not s:
        return (f"(b = {result['batches_per_epoch']} batches per epoch, E = {result['epochs']} epochs) to minimize "
                "the prefix-sum RMSE, sigma |A C^-1|_F / sqrt(n), under balls-in-bins batching")
    return (f"to minimize the prefix-sum RMSE, sigma |A C^-1|_F / sqrt(n), under b-min-sep sampling (min_sep b = "
            f"{s['min_sep']}, sampling_prob p = {s['sampling_prob']:g}: an eligible example participates with "
            f"probability p, then sits out b - 1 rounds; participation rate {result['participation_rate']:.4g} per "
            "round)")


def sampler_sentence(result: dict) -> str:
    """For which training sampler the certificate holds: the given ``N`` and batch shape ``B``
    (truncation accounted), or what was assumed without them; under b-min-sep the sampler the
    training loop must use."""
    if result.get("amplification") == Amplification.B_MIN_SEP:
        return (f"Sampler the training loop must use: {result['training_sampler']} (the certificate holds for its "
                "untruncated batches; add its truncation_delta(epsilon) for a fixed batch shape).")
    if result.get("amplification") == Amplification.RANDOM_ALLOCATION:
        return (f"Batches the training loop must draw: {result['training_sampler']}; the certificate holds for "
                "those batches untruncated.")
    b = result["batches_per_epoch"]
    if result.get("dataset_size") is None:
        return (f"Sampler assumed: balls-in-bins batches, each example in one of the b = {b} bins for the whole run and "
                "every bin trained whole (no fixed batch shape); for fixed-shape batches "
                "(dpjax.sampling.BallsInBinsSampler) give --dataset-size and --batch-size, and the certificate also "
                "covers truncating a bin that overflows.")
    n, bs = result["dataset_size"], result["batch_size"]
    return (f"Sampler: dpjax.sampling.BallsInBinsSampler with N = {n:,} examples, b = {b} bins, batches of shape "
            f"B = {bs:,} (mean N / b = {n / b:.6g}); certified at delta {_g(result['target_delta'])} - "
            f"{result['truncation_delta']:.2g} (the truncation term), so the run on this sampler is "
            f"({_g(result['target_epsilon'])}, {_g(result['target_delta'])})-DP.")


def certificate_sentence(result: dict) -> str:
    """The certificate in one sentence: method, samples, failure probability (or why there is none)."""
    cert = result.get("certificate") or {}
    sigma = result.get("noise_multiplier")
    if sigma is None:
        return ("Certificate: none (--no-certify), so the noise multiplier above is an estimate and not a "
                "privacy guarantee.")
    method = cert.get("method", "?")
    words = METHOD_WORDS.get(method, method)
    if method == "pld":
        return (f"Certificate: {words} certifies epsilon <= {_g(result['target_epsilon'])} at delta "
                f"{_g(result['target_delta'])} for this noise multiplier.")
    if not cert.get("verified") or not math.isfinite(sigma):
        return (f"Certificate: none, because {words} ({method}) verified no noise multiplier on "
                f"{_count(cert.get('num_samples'))} samples; do not train with the estimate (rerun with more "
                "--certify-samples, or see --verbose).")
    return (f"Certificate: {words} ({method}) verified this noise multiplier on {_count(cert.get('num_samples'))} "
            f"fresh samples, with failure probability at most {cert.get('failure_probability'):.2g} (included in "
            f"delta).")


def _render(result: dict, args=None) -> str:
    verbose = bool(getattr(args, "verbose", False))
    if result.get("amplification") == Amplification.CYCLIC_POISSON:
        return _render_cyclic(result, verbose)
    fam = result["parameterization"]
    n = fam.get("n") or result["batches_per_epoch"] * result["epochs"]
    sigma = result["noise_multiplier"]
    certified = sigma is not None and math.isfinite(sigma) and (result.get("certificate") or {}).get("verified")
    lines = _wrap(
        f"Optimized {_family_words(fam)} for n = {n} rounds {_scheme_words(result)} at "
        f"(epsilon, delta) = ({result['target_epsilon']:g}, {result['target_delta']:g}), add/remove adjacency: "
        f"{result['num_steps']} Adam steps, each on a {_count(result['num_samples'])}-sample Monte Carlo "
        f"estimate of the noise multiplier.")
    lines.append("")
    if certified:
        lines.append(f"Train with noise multiplier sigma = {round_up(sigma)} (certified).")
        lines.append(f"  prefix-sum RMSE at this sigma: {_g(result['rmse'])}")
    else:
        lines.append("No certified noise multiplier: do not train with the estimate below.")
    lines += _wrap(sampler_sentence(result))
    lines += _wrap(certificate_sentence(result))
    est = result["noise_multiplier_estimate"]
    diag = (f"Diagnostic only (not a guarantee): the optimization's Monte Carlo estimate of sigma was {_g(est)}")
    if certified and est:
        gap = 100 * (sigma / est - 1)
        diag += f"; the certified sigma is {abs(gap):.2f}% {'above' if gap >= 0 else 'below'} it."
    else:
        diag += "."
    lines += _wrap(diag)
    if result.get("status") != "completed":
        lines += _wrap(f"Stopped early: {result.get('stop_reason')}")
    lines += _saved_lines(result)
    lines += _render_candidates(result)
    if result.get("baselines"):
        mine = result["rmse"] if certified else result["rmse_estimate"]
        lines += ["", "Alternatives at the same (epsilon, delta), rmse = sigma |A C^-1|_F / sqrt(n) (lower is better):",
                  f"  {'row':26s} {'sigma':>9s} {'rmse':>9s}  {'optimized C is better by':s}",
                  f"  {'optimized ' + fam['family']:26s} "
                  f"{sigma if certified else est:9.4g} {mine:9.4g}"]
        for r in result["baselines"]:
            gain = "" if r["gain"] is None else f"{100 * r['gain']:+.1f}%"
            lines.append(f"  {r['name']:26s} {r['noise_multiplier']:9.4g} {r['rmse']:9.4g}  {gain}")
    if verbose:
        lines += _details(result)
    return "\n".join(lines)


def _saved_lines(result: dict) -> list[str]:
    if "out" not in result:
        return ["Not saved (--no-save)."]
    what = ("the optimized C, this sigma and its certificate; dpjax.optimization.OptimizationResult.load reads it"
            if result.get("amplification") in (Amplification.BALLS_IN_BINS, Amplification.B_MIN_SEP,
                                               Amplification.RANDOM_ALLOCATION) and "candidates" not in result
            else "the JSON object --json prints")
    return _wrap(f"Saved to {result['out']} ({what}){'; it replaced the file that was there' if result.get('out_replaced') else ''}.")


def _details(result: dict) -> list[str]:
    cert = result.get("certificate") or {}
    lines = ["", "Details (--verbose):"]
    if cert:
        lines += _wrap(f"certificate: {cert.get('reason', '')}", "  ")
        keys = ("method", "procedure", "epsilon", "delta", "target_delta", "base_delta", "tau", "failure_probability",
                "num_tests", "tests_run", "growth", "num_samples", "calibration_samples", "noise_multiplier",
                "noise_multiplier_estimate", "delta_estimate", "standard_error", "delta_remove", "delta_add",
                "range_remove", "range_add")
        lines += [f"  certificate.{k} = {cert[k]}" for k in keys if k in cert]
    for k in ("noise_multiplier", "noise_multiplier_estimate", "rmse", "rmse_estimate", "error", "estimator",
              "status", "stop_reason", "history_rows"):
        if result.get(k) not in (None, ""):
            lines.append(f"  {k} = {result[k]}")
    if "first_column" in result:
        lines += _wrap("first column of C = " + ", ".join(f"{c:.6g}" for c in result["first_column"]), "  ")
    if result.get("timings"):
        lines.append("  seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in result["timings"].items()))
    return lines


def _render_candidates(result: dict) -> list[str]:
    if not result.get("candidates"):
        return []
    lines = [""] + _wrap(f"Amplification: {result['amplification']}, the smaller certified rmse of the candidates "
                         "(rmse = sigma |A C^-1|_F / sqrt(n) at the same (epsilon, delta)); train on batches of "
                         f"{result['training_sampler']}:")
    for r in result["candidates"]:
        rate = "" if r.get("participation_rate") is None else f"  rate {r['participation_rate']:.4g}"
        lines.append(f"  {r['amplification']:16s} sigma {r['noise_multiplier']:9.5g}  rmse {r['rmse']:9.5g}{rate}  "
                     f"{'certified' if r['certified'] else 'NOT certified'} ({r['method']}; {_family_short(r['family'])})")
    if len({r.get("participation_rate") for r in result["candidates"]}) > 1:
        lines += _wrap("The candidates' participation rates (the chance that an example is in a given batch; the "
                       "expected batch is the rate times N) differ: a smaller rate trains on smaller batches.", "  ")
    return lines


def _render_cyclic(result: dict, verbose: bool = False) -> str:
    b, epochs = result["batches_per_epoch"], result["epochs"]
    lines = _wrap(
        f"Chose {_family_words(result['parameterization'])} for n = {b * epochs} rounds "
        f"(b = {b} batches per epoch, E = {epochs} epochs) minimizing the prefix-sum RMSE, sigma |A C^-1|_F / "
        f"sqrt(n), under cyclic Poisson sampling at (epsilon, delta) = ({result['target_epsilon']:g}, "
        f"{result['target_delta']:g}), add/remove adjacency.")
    lines += ["", f"Train with noise multiplier sigma = {round_up(result['noise_multiplier'])} (certified).",
              f"  prefix-sum RMSE at this sigma: {_g(result['rmse'])}"]
    lines += _wrap(certificate_sentence(result))
    lines += _saved_lines(result)
    lines += _render_candidates(result)
    if verbose:
        lines += _details(result)
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
                    "multiplier certified by Estimate-Verify-Release on independent draws.  --amplification\n"
                    "b_min_sep (--min-sep, --sampling-prob, --steps) optimises a banded C under b-min-sep\n"
                    "sampling (Dong and Ganesh) instead, and --amplification random_allocation\n"
                    "(--selections-per-epoch) a banded C under random allocation (Feldman and Shenfeld).\n"
                    "Comma lists in\n"
                    "--epsilon / --delta run one optimisation per combination.\n\n"
                    "Examples:\n"
                    "  dpjax optimize --example\n"
                    "  dpjax optimize --family blt --buffers 4 --batches-per-epoch 128 --epochs 16 \\\n"
                    "      --epsilon 2 --delta 1e-5 --optimizer-steps 300 --samples 131072 --out result.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_problem_arguments(p)
    _add_method_arguments(p)
    _add_output_arguments(p)
    # --out is the loadable OptimizationResult (dpjax.optimization.OptimizationResult.load), a
    # superset of the --json object; main() must not overwrite it.  render takes the arguments
    # (--verbose).
    p.set_defaults(run=_run, render=_render, render_takes_args=True, owns_out=True,
                   out_formats={".json": "the loadable result, dpjax.optimization.OptimizationResult.load"})


def _add_problem_arguments(p) -> None:
    """What to optimise for: the family of ``C``, ``b``, ``E`` and the privacy target."""
    p.add_argument("--family", type=_args.choice("blt", "toeplitz", "banded"), default=None,
                   help="parameterization of C: blt (buffered linear Toeplitz), toeplitz (full), "
                        "banded (Toeplitz with --bands bands); default blt")
    p.add_argument("--buffers", type=_args.integer(1, 64), default=None,
                   help="BLT buffers d, an integer in [1, 64] and at most n = b E (default 4, or n when "
                        "smaller; --family blt only)")
    p.add_argument("--bands", type=_args.integer(1, _args.MAX_STEPS), default=None,
                   help="bands of a banded Toeplitz C, an integer >= 1 (--family banded only)")
    p.add_argument("--batches-per-epoch", type=_args.integer(1, 2**20), default=None,
                   help="b, batches per epoch (an integer >= 1; required unless --example or --amplification "
                        "b_min_sep)")
    p.add_argument("--epochs", type=_args.integer(1, 2**20), default=None,
                   help="E, epochs (an integer >= 1; required unless --example or --amplification b_min_sep); "
                        "n = b * E rounds")
    _args.add_target_epsilon(p, required=False, extra="; required unless --example")
    _args.add_target_delta(p, required=False, extra="; required unless --example")
    g = p.add_argument_group("the training sampler (dpjax.sampling.BallsInBinsSampler; both or neither)")
    g.add_argument("--dataset-size", type=_args.integer(1, 2**31 - 1), default=None,
                   help="N, the examples the run trains on, an integer >= 1 (with --batch-size)")
    g.add_argument("--batch-size", type=_args.integer(1, 2**31 - 1), default=None,
                   help="B, the sampler's fixed batch shape, an integer >= 1: bins are padded to B or truncated "
                        "to it; the certificate is then for --delta less the truncation term, so the released "
                        "sigma holds for this sampler (without them: for untruncated bins)")


def _add_method_arguments(p) -> None:
    """How: the optimiser, its Monte Carlo estimate, the certificate, the amplification."""
    # Not --steps: elsewhere that is the number of DP-SGD training steps.
    p.add_argument("--optimizer-steps", type=_args.integer(0, 10**7), default=None,
                   help="optimizer (Adam) steps on the correlation matrix, an integer >= 0 (default 300)")
    p.add_argument("--samples", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="Monte Carlo samples per optimisation step, an integer >= 1 (default 2^11 with "
                        "--estimator importance, 2^13 with plain; the in-loop sigma is an estimate, only the "
                        "final certificate is a guarantee)")
    p.add_argument("--certify-samples", type=_args.integer(1, _args.MAX_SAMPLES), default=None,
                   help="verification samples of the certificate (default: importance_betting sizes it from "
                        "its calibration sample, 2^16 to 2^22; bernoulli_kl the smallest power of two that "
                        "verifies about 0.4 delta)")
    p.add_argument("--estimator", type=_args.choice("importance", "plain"), default="importance",
                   help="in-loop Monte Carlo estimate: importance (variance-reduced, default) or plain")
    p.add_argument("--certify-method", type=_args.choice("importance_betting", "bernoulli_kl"),
                   default=None,
                   help="certificate of the result: importance_betting (variance-reduced draws and a betting "
                        "test; the default for balls-in-bins) or bernoulli_kl (plain draws, Hoeffding's bound; "
                        "the only one for b_min_sep)")
    p.add_argument("--amplification", type=_args.choice(*Amplification),
                   default=Amplification.BALLS_IN_BINS.value,
                   help="balls_in_bins (default: optimise C, Monte Carlo certificate), cyclic_poisson (banded C "
                        "under cyclic Poisson sampling, bands chosen and sigma certified by the PLD accountant), "
                        "b_min_sep (optimise a banded C under b-min-sep sampling, --min-sep, --sampling-prob, "
                        "--steps; Monte Carlo certificate), random_allocation (optimise a banded C, at most 6 "
                        "bands, under random allocation, --selections-per-epoch of the --batches-per-epoch batches of "
                        "every epoch; Monte Carlo certificate) or auto (balls_in_bins and cyclic_poisson, b_min_sep "
                        "when --min-sep and --sampling-prob are given, random_allocation when --selections-per-epoch "
                        "is; the smaller certified rmse, every candidate printed)")
    _args.add_b_min_sep_args(p.add_argument_group("b-min-sep sampling (Dong & Ganesh; --amplification b_min_sep "
                                                  "or auto)"),
                             min_sep_extra="; C gets at most b bands",
                             steps_extra="; --amplification auto uses n = --batches-per-epoch * --epochs")
    p.add_argument_group("random allocation (Feldman & Shenfeld; --amplification random_allocation or auto)").add_argument(
        "--selections-per-epoch", type=_args.integer(1, 32), default=None,
        help="k, the batches each example takes part in per epoch, a fresh uniformly random k-subset of the "
             "--batches-per-epoch batches every epoch; an integer in [1, min(b, 32)] (default 1 with "
             "--amplification random_allocation; with auto it adds the random-allocation candidate)")
    p.add_argument("--no-certify", action="store_true",
                   help="skip the certificate: report the estimate only (noise_multiplier is null)")
    p.add_argument("--learning-rate", type=_args.real(0, lo_open=True), default=0.05,
                   help="Adam learning rate > 0 (default 0.05)")
    p.add_argument("--seed", type=_args.integer(0, _args.MAX_SEED), default=0, help=_args.SEED_HELP)


def _add_output_arguments(p) -> None:
    """Where the result goes (file, checkpoint, resume), the built-in example, the baselines and
    what is printed (in the order ``--help`` lists them)."""
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write the loadable result JSON (OptimizationResult.load) to FILE, replacing it; the "
                        "checkpoint is FILE.checkpoint.json (with its binary screen-state sidecar "
                        "FILE.checkpoint.json.screen-<step>.npz, which makes --resume bit-identical).  Default: "
                        "./dpjax-optimize-<configuration>.json, numbered -2, -3, ... rather than replacing a file, "
                        "and no checkpoint")
    p.add_argument("--checkpoint-every", type=_args.integer(1, 10**7), default=25,
                   help="steps between checkpoints, an integer >= 1 (default 25; needs --out)")
    p.add_argument("--resume", action="store_true",
                   help="continue a killed run from <out>.checkpoint.json (removed once a run completes)")
    p.add_argument("--example", action="store_true",
                   help="the built-in example: a 2-buffer BLT, 8 batches per epoch, 4 epochs (n = 32), "
                        "epsilon 2, delta 1e-5, 100 optimizer steps of 2^11 samples (flags given override it)")
    p.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=None,
                   help="also compute the alternatives in the same units (DP-SGD unamplified, Poisson, "
                        "balls-in-bins; the family's unamplified optimum) and the gain over each "
                        "(default: on with --example, off otherwise)")
    p.add_argument("--no-save", action="store_true",
                   help="write no result file (without --out the result is saved as "
                        "./dpjax-optimize-<configuration>.json, never replacing a file)")
    p.add_argument("--verbose", action="store_true",
                   help="also print every detail of the certificate, the first column of C and the timings")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
