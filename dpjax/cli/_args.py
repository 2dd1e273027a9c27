"""Argument types of the ``dpjax`` command: every number is range-checked while parsing.

A bad value becomes an argparse error (exit status 2, one line naming the option and the valid
range, no traceback) before any computation starts.  List-valued options accept comma lists
(``--delta 1e-5,1e-6``); :func:`dpjax.cli.main.main` runs one computation per combination and
prints a list of rows.

    p.add_argument("--steps", type=integer(1, MAX_STEPS), ...)
    p.add_argument("--delta", type=real_list(0, 1, lo_open=True, hi_open=True), ...)
"""

from __future__ import annotations

import argparse
import math

# The library's limits (one definition each): seeds jax.random.key tells apart without x64,
# Monte Carlo sample counts.
from dpjax._base.enums import Adjacency, AllocationSampling
from dpjax._base.names import epochs_to_steps
from dpjax._base.validate import MAX_SAMPLES, MAX_SEED

MAX_STEPS = 2**31 - 1        # ~2e9 steps: far beyond any training run, exact in float64
MAX_COUNT = 2**53            # dataset / batch sizes: integers exact in float64
MAX_GROUP_SIZE = 2**31 - 1


def _interval(lo, hi, lo_open, hi_open) -> str:
    left = "(" if lo_open else "["
    right = ")" if (hi_open or hi is None) else "]"
    lo_s = "-inf" if lo is None else f"{lo:g}"
    hi_s = "inf" if hi is None else f"{hi:g}"
    return f"{left}{lo_s}, {hi_s}{right}"


def _parse_real(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    return value


def _check_real(value: float, text: str, lo, hi, lo_open, hi_open, what: str) -> float:
    ok = math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def real(lo=None, hi=None, *, lo_open=False, hi_open=False):
    """A finite float in the interval; ``type=real(0, None, lo_open=True)`` is ``> 0``."""
    what = f"a finite number in {_interval(lo, hi, lo_open, hi_open)}"

    def parse(text: str) -> float:
        return _check_real(_parse_real(text, what), text, lo, hi, lo_open, hi_open, what)

    parse.__name__ = "number"
    parse.interval = what
    return parse


def real_list(lo=None, hi=None, *, lo_open=False, hi_open=False):
    """A comma-separated list of finite floats in the interval (one value is a list of one)."""
    what = f"a comma-separated list of finite numbers in {_interval(lo, hi, lo_open, hi_open)}"

    def parse(text: str) -> list[float]:
        parts = [s.strip() for s in text.split(",")]
        if not parts or any(s == "" for s in parts):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return [_check_real(_parse_real(s, what), text, lo, hi, lo_open, hi_open, what) for s in parts]

    parse.__name__ = "number list"
    parse.interval = what
    parse.is_list = True
    return parse


def real_vector(lo=None, hi=None, *, lo_open=False, hi_open=False):
    """A comma-separated vector of finite floats (ONE value, e.g. a Toeplitz column; not expanded into rows)."""
    parse = real_list(lo, hi, lo_open=lo_open, hi_open=hi_open)

    def vector(text: str) -> list[float]:
        return parse(text)

    vector.__name__ = "number vector"
    vector.interval = parse.interval
    return vector


def integer(lo: int, hi: int):
    """An integer in ``[lo, hi]``; ``1e3`` is accepted (an exact integer), ``1.5`` and ``1e30`` are not."""
    what = f"an integer in [{lo}, {hi}]"

    def parse(text: str) -> int:
        t = text.strip()
        try:
            value = int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
            if not (math.isfinite(f) and f == int(f)):
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
            if abs(f) > 2**53:  # beyond 2^53 a float literal is not an exact integer
                raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
            value = int(f)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = "integer"
    parse.interval = what
    return parse


def choice(*values: str):
    """One of ``values`` (a clearer one-line error than argparse's ``choices`` for our usage)."""
    what = "one of " + ", ".join(values)

    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return text

    parse.__name__ = "choice"
    parse.interval = what
    return parse


# Shared argument definitions: the same name, type and help for the same thing everywhere.
NOISE_MULTIPLIER_HELP = "noise multiplier sigma = noise std / clip norm, > 0 (comma list for several)"
EPSILON_TARGET_HELP = "epsilon >= 0 (comma list for several)"
DELTA_TARGET_HELP = "delta in (0, 1) (comma list for several)"
STEPS_HELP = f"number of DP-SGD training steps T, an integer in [1, {MAX_STEPS}]"


def seed_help(default: int = 0, why: str = "") -> str:
    """Help of a ``--seed`` option with its default (and, optionally, why that default)."""
    return f"PRNG seed of the Monte Carlo draws, an integer in [0, {MAX_SEED}] (default {default}{why})"


SEED_HELP = seed_help()
SAMPLES_HELP = f"Monte Carlo sample count m, an integer in [1, 2^{MAX_SAMPLES.bit_length() - 1}] (1e6 accepted)"


def add_target_delta(p, *, required=True, default=None, help_prefix="target ", extra=""):
    """``--delta`` (also spelled ``--target-delta``, the Python name): the target delta, a comma list."""
    p.add_argument("--delta", "--target-delta", dest="delta", type=real_list(0, 1, lo_open=True, hi_open=True),
                   required=required, default=default, help=help_prefix + DELTA_TARGET_HELP + extra)


def add_target_epsilon(p, *, required=True, default=None, positive=True, help_prefix="target ", extra=""):
    """``--epsilon`` (also spelled ``--target-epsilon``): the target epsilon, a comma list."""
    typ = real_list(0, None, lo_open=positive)
    what = "epsilon > 0 (comma list for several)" if positive else EPSILON_TARGET_HELP
    p.add_argument("--epsilon", "--target-epsilon", dest="epsilon", type=typ, required=required, default=default,
                   help=help_prefix + what + extra)


def add_noise_multiplier(p, *, required=True, default=None):
    p.add_argument("--noise-multiplier", type=real_list(0, None, lo_open=True), required=required,
                   default=default, help=NOISE_MULTIPLIER_HELP + ("" if default is None else f"; default {default}"))


def add_steps(p, *, required=True, default=None):
    """``--steps`` (also ``--train-steps``): DP-SGD training steps (``optimize`` has
    ``--optimizer-steps`` instead)."""
    p.add_argument("--steps", "--train-steps", dest="steps", type=integer(1, MAX_STEPS), required=required,
                   default=default, help=STEPS_HELP + ("" if default is None else f" (default {default})"))


def add_sampling_prob(p, *, required=False, default=None, extra=""):
    p.add_argument("--sampling-prob", type=real(0, 1, lo_open=True), required=required, default=default,
                   help="Poisson sampling probability q in (0, 1]" + extra)


def add_b_min_sep_args(p, *, min_sep_extra="", steps_extra=""):
    """``--min-sep``, ``--sampling-prob`` and ``--steps`` of b-min-sep sampling (Dong & Ganesh,
    "Privacy Amplification for BandMF via b-Min-Sep Subsampling"), all optional (``None``)."""
    p.add_argument("--min-sep", type=integer(1, 2**20), default=None,
                   help="b_min_sep: b, the rounds between two participations of an example (integer >= 1; 1 is "
                        "Poisson sampling)" + min_sep_extra)
    p.add_argument("--sampling-prob", type=real(0, 1, lo_open=True), default=None,
                   help="b_min_sep: probability that an eligible example participates, in (0, 1]")
    p.add_argument("--steps", type=integer(1, 2**20), default=None,
                   help="b_min_sep: rounds n (integer >= 1" + steps_extra + ")")


def add_group_args(p, *, title="group privacy (Ganesh (2024), tight mixture-of-Gaussians accounting)"):
    """``--group-size`` in its group, and ``--sampling``, ``--dataset-size``, ``--batch-size`` in
    the batching group (the same for every subcommand): how batches are formed is not a
    group-privacy option."""
    g = p.add_argument_group(title)
    g.add_argument("--group-size", type=integer(1, MAX_GROUP_SIZE), default=1,
                   help=f"group size k: examples protected together, an integer in [1, {MAX_GROUP_SIZE}] "
                        "(default 1)")
    g = p.add_argument_group("batching (how the data loader forms batches; README: which sampling does my "
                             "loader do?)")
    g.add_argument("--sampling", type=choice("poisson", "fixed_batch", "random_allocation", "balls_in_bins"),
                   default="poisson",
                   help="poisson (default; add/remove adjacency: neighbours differ by adding or removing one "
                        "example, k for a group) or fixed_batch (batches of --batch-size out of "
                        "--dataset-size; replace adjacency: neighbours differ by replacing one example, "
                        "sensitivity 2 per example, noise std = the noise multiplier); random_allocation "
                        "(each example in --selections-per-epoch of the --batches-per-epoch steps of every "
                        "epoch, for --epochs epochs) or balls_in_bins (one bin per example for the whole run): "
                        "add/remove adjacency")
    g.add_argument("--dataset-size", type=integer(1, MAX_COUNT), default=None,
                   help="dataset size N, an integer >= 1; with --batch-size the usual DP-SGD description "
                        "(with --epochs): poisson q = B / N (instead of --sampling-prob), random_allocation "
                        "and balls_in_bins floor(N / B) batches per epoch (instead of --batches-per-epoch), "
                        "fixed_batch batches of B out of N")
    g.add_argument("--batch-size", type=integer(1, MAX_COUNT), default=None,
                   help="batch size B, an integer in [1, N] (with --dataset-size, see there)")


def add_scenario_arg(p) -> None:
    """``--scenario FILE``: a :class:`dpjax.TrainingScenario` saved as JSON in place of the run's
    options (noise multiplier where the command takes one, batching, steps or epochs, group size)."""
    p.add_argument("--scenario", metavar="FILE", default=None,
                   help="a dpjax.TrainingScenario saved as JSON (TrainingScenario.to_json): the run's noise "
                        "multiplier, sampling, steps or epochs and group size, in place of those options "
                        "(giving any of them too is an error)")


def apply_scenario(args) -> argparse.Namespace:
    """``args`` with ``--scenario FILE``'s run in the options it states (a copy; ``args`` itself
    when no scenario is given).  A ``ValueError`` names an option given beside the scenario, a
    file that is not a scenario, and a noise multiplier where the command finds one (or none
    where it needs one)."""
    path = getattr(args, "scenario", None)
    if path is None:
        return args
    from dpjax.pld.scenario import STATED_KEYWORDS, SchemeKeywords, TrainingScenario

    # An option at its default counts as not given (the scheme's sizes are options here).
    stated = {**STATED_KEYWORDS, **SchemeKeywords()._asdict()}
    clash = sorted("--" + k.replace("_", "-") for k, default in stated.items()
                   if hasattr(args, k) and getattr(args, k) != default)
    if clash:
        raise ValueError(f"--scenario states the run; do not give {', '.join(clash)} with it")
    try:
        run = TrainingScenario.load(path)
    except OSError as exc:
        raise ValueError(f"--scenario: cannot read {path!r}: {exc.strerror}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--scenario: {path!r} is not a saved TrainingScenario: {exc}") from None
    out = argparse.Namespace(**vars(args))
    if isinstance(run.noise_multiplier, tuple):
        raise ValueError("--scenario: a noise schedule is not accounted by the command line (use "
                         "dpjax.dpsgd_epsilon(scenario, ...) in Python)")
    if hasattr(args, "noise_multiplier"):
        if run.noise_multiplier is None:
            raise ValueError("--scenario: the scenario has no noise_multiplier (this command needs one)")
        out.noise_multiplier = run.noise_multiplier
    elif run.noise_multiplier is not None:
        raise ValueError(f"--scenario: this command finds the noise multiplier; the scenario gives "
                         f"{run.noise_multiplier!r} (save it with noise_multiplier=None)")
    kw = {**run.keywords(), **run.sampling.keywords()}   # the scheme as the options spell it
    for key in ("sampling", "sampling_prob", "steps", "epochs", "dataset_size", "batch_size", "batches_per_epoch",
                "selections_per_epoch", "group_size"):
        if key in kw:
            setattr(out, key, kw[key])
    return out


def sampling_scheme(args):
    """The ``sampling=`` value of the Python functions for the options ``--sampling``,
    ``--dataset-size``, ``--batch-size``, ``--batches-per-epoch`` and ``--selections-per-epoch``
    (``"poisson"``, whose probability is ``--sampling-prob``, or a scheme record)."""
    from dpjax.pld.scenario import scheme_from_keywords

    def get(name, default=None):
        return getattr(args, name, default)

    sampling = get("sampling", "poisson")
    # N and B describe a fixed batch; for the other schemes resolve_batching has turned them into
    # q = B / N or floor(N / B) batches per epoch (and keeps them for the output only).
    fixed = sampling == "fixed_batch"
    return scheme_from_keywords(sampling, dataset_size=get("dataset_size") if fixed else None,
                                batch_size=get("batch_size") if fixed else None,
                                batches_per_epoch=get("batches_per_epoch"),
                                selections_per_epoch=get("selections_per_epoch", 1))


def require_noise_multiplier(args) -> None:
    """``--noise-multiplier`` is required unless ``--scenario`` gave it."""
    if getattr(args, "noise_multiplier", None) is None:
        raise ValueError("--noise-multiplier is required (a number > 0, or comma list), unless --scenario gives it")


def add_allocation_args(p, *, title="random allocation / balls-in-bins (--sampling random_allocation|balls_in_bins)"):
    """``--batches-per-epoch``, ``--selections-per-epoch``, ``--epochs`` (the same for every subcommand)."""
    g = p.add_argument_group(title)
    g.add_argument("--batches-per-epoch", type=integer(1, MAX_STEPS), default=None,
                   help="steps per epoch t, an integer >= 1 (random_allocation, balls_in_bins)")
    g.add_argument("--selections-per-epoch", type=integer(1, MAX_STEPS), default=1,
                   help="steps each example takes part in per epoch k, an integer in [1, t] (random_allocation; "
                        "default 1)")
    g.add_argument("--epochs", type=integer(1, MAX_STEPS), default=None,
                   help="number of epochs E, an integer >= 1: random_allocation, balls_in_bins (steps = "
                        "batches per epoch * E); poisson, fixed_batch: instead of --steps, steps = E / q "
                        "rounded up (q = --sampling-prob or B / N), the rule of dpjax.dpsgd_epsilon(epochs=)")


ALLOCATION_SAMPLINGS = tuple(s.value for s in AllocationSampling)


def resolve_batching(args) -> argparse.Namespace:
    """The accountant's arguments from the usual DP-SGD description (``--dataset-size N
    --batch-size B --epochs E``), one rule per ``--sampling``; a copy of ``args`` with
    ``sampling_prob``, ``steps`` and ``batches_per_epoch`` filled in (``dataset_size``,
    ``batch_size`` and ``epochs`` kept, for the output).

    * ``poisson``: ``q = B / N`` (instead of ``--sampling-prob``); ``--epochs`` gives
      ``steps = dpjax._base.names.epochs_to_steps(E, q)``, the one epochs rule of dpjax (also with
      ``--sampling-prob``).
    * ``fixed_batch``: batches of ``B`` out of ``N`` (required, as before); ``--epochs`` gives the
      steps by the same rule at ``q = B / N``.
    * ``random_allocation``, ``balls_in_bins``: ``batches_per_epoch = floor(N / B)`` (instead of
      ``--batches-per-epoch``).  A loader of fixed-size batches over a shuffled dataset makes
      ``ceil(N / B)`` batches (the last one smaller) or ``floor(N / B)`` (the rest dropped);
      either way an example's batch is spread at least as evenly as uniform over ``floor(N / B)``
      batches (its probabilities ``B / N`` per full batch, the rest on a smaller last batch or
      on no batch at all), and the hockey-stick divergence of the mixture over batches is
      convex and symmetric in these probabilities, so ``floor(N / B)`` never understates
      epsilon; ``ceil`` could (``N = 1000, B = 300``: three full batches and one of 100, not
      four equally likely ones).  ``--selections-per-epoch`` stays 1 with this description.

    Mixing the two descriptions is an error naming both options: ``--steps`` with ``--epochs``
    (any ``--sampling``: the allocation schemes take ``--epochs`` alone), ``--sampling-prob`` or
    ``--batches-per-epoch`` with ``--batch-size``."""
    out = argparse.Namespace(**vars(args))
    n, b, e = args.dataset_size, args.batch_size, args.epochs
    if (n is None) != (b is None):
        raise ValueError("--dataset-size and --batch-size go together (N and B of the usual DP-SGD description), "
                         f"got only {'--dataset-size' if b is None else '--batch-size'}")
    if b is not None and b > n:
        raise ValueError(f"--batch-size must be an integer in [1, --dataset-size] = [1, {n}], got {b}")
    if b is not None and args.sampling_prob is not None:
        raise ValueError("give --sampling-prob or --batch-size (with --dataset-size: q = B / N), not both")
    if e is not None and args.steps is not None:
        raise ValueError("give --steps or --epochs (steps from epochs), not both")
    if args.sampling in ALLOCATION_SAMPLINGS:
        if args.sampling_prob is not None:
            raise ValueError(f"--sampling-prob does not apply to --sampling {args.sampling} (give "
                             "--batches-per-epoch, or --dataset-size and --batch-size)")
        if b is not None:
            if args.batches_per_epoch is not None:
                raise ValueError("give --batches-per-epoch or --batch-size (with --dataset-size: floor(N / B) "
                                 "batches per epoch), not both")
            if args.selections_per_epoch != 1:
                raise ValueError("--selections-per-epoch needs --batches-per-epoch (with --dataset-size and "
                                 "--batch-size an example is in one batch per epoch)")
            out.batches_per_epoch = n // b
        return out
    if args.batches_per_epoch is not None or args.selections_per_epoch != 1:
        raise ValueError("--batches-per-epoch and --selections-per-epoch need --sampling random_allocation or "
                         "balls_in_bins")
    if args.sampling == "poisson" and b is not None:
        out.sampling_prob = b / n
        out.dataset_size = out.batch_size = None  # q = B / N is the whole description
    if e is not None:
        q = out.sampling_prob if args.sampling == "poisson" else (b / n if b is not None else None)
        if q is None:
            raise ValueError(f"--epochs with --sampling {args.sampling} needs "
                             f"{'--sampling-prob, or ' if args.sampling == 'poisson' else ''}--dataset-size and "
                             "--batch-size (steps = E / q, rounded up)")
        out.steps = epochs_to_steps(e, q)
    return out


def batching_setting(args) -> dict:
    """The usual DP-SGD description as given (``dataset_size``, ``batch_size``, ``epochs``; None
    where not given), for the output next to the accountant's arguments."""
    return {"dataset_size": args.dataset_size, "batch_size": args.batch_size, "epochs": args.epochs}


def allocation_setting(args) -> dict:
    """The random-allocation part of a result's setting (batches, selections, epochs, adjacency)."""
    return {"batches_per_epoch": args.batches_per_epoch, "selections_per_epoch": args.selections_per_epoch,
            "epochs": args.epochs, "adjacency": Adjacency.ADD_OR_REMOVE}


def render_fields(result: dict, sections: dict | None = None, *, skip_none: bool = False,
                  width: int | None = 16) -> str:
    """The human-readable form of a result: one ``key  value`` line per field (floats to 6
    significant digits), keys padded to ``width`` (None: the longest key).  ``sections`` maps a
    key to a function of its value returning the lines to print instead (e.g. a table);
    ``skip_none`` leaves out fields whose value is None."""
    sections = sections or {}
    if width is None:
        width = max((len(k) for k in result), default=0)
        fmt = lambda k, v: f"{k:<{width}}  {v}"
    else:
        fmt = lambda k, v: f"{k:<{width}} {v}"
    lines = []
    for key, value in result.items():
        if key in sections:
            lines.extend(sections[key](value))
            continue
        if value is None and skip_none:
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        lines.append(fmt(key, value))
    return "\n".join(lines)
