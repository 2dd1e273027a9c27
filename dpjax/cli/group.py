"""Group-privacy / fixed-batch options of ``dpjax epsilon`` and ``dpjax delta`` (used by :mod:`dpjax.cli.pld`).

    dpjax epsilon --noise-multiplier 1 --sampling-prob 0.01 --steps 2000 --delta 1e-5 --group-size 8 --json
    dpjax delta   --noise-multiplier 1 --steps 2000 --epsilon 4 --group-size 8 \\
                  --sampling fixed_batch --dataset-size 50000 --batch-size 500 --json

With ``--group-size 1`` and Poisson sampling (the defaults) the example-level accountant runs
unchanged.  Poisson sampling is accounted under add/remove adjacency; ``--sampling
fixed_batch`` under replace adjacency (replace-k for a group of k), with noise std equal to
``--noise-multiplier`` and sensitivity 2 per replaced example (Ganesh (2024), "Tight group-level
DP guarantees for DP-SGD with sampling via mixture of Gaussians mechanisms", Thm 3.3).  The
options themselves are defined once in :func:`dpjax.cli._args.add_group_args`.
"""

from __future__ import annotations


def requested(args) -> bool:
    """True when the group accountant (not the plain DP-SGD one) must run."""
    return not (args.group_size == 1 and args.sampling == "poisson" and args.dataset_size is None
                and args.batch_size is None)


def accounting(args, options, **target):
    """:func:`dpjax.group.group_accounting` on the parsed options (``target_delta=`` or ``target_epsilon=``)."""
    from dpjax.group import group_accounting

    if args.sampling == "poisson" and args.sampling_prob is None:
        raise ValueError("--sampling-prob is required for --sampling poisson (a number in (0, 1])")
    from dpjax.cli import _args

    return group_accounting(
        args.noise_multiplier, args.sampling_prob, args.steps, group_size=args.group_size,
        sampling=_args.sampling_scheme(args), options=options, **target,
    )
