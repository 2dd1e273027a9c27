"""``dpjax report``: a privacy report of one DP-SGD configuration (:mod:`dpjax.report`; the
``--help`` text is :data:`REPORT_DESCRIPTION`), optionally drawn with ``--plot FILE.png``.
"""

from __future__ import annotations

import argparse
import io
import os

from dpjax.cli import _args

REPORT_DESCRIPTION = """\
A privacy report of a DP-SGD configuration (the options of dpjax epsilon): the certified epsilon
at each --delta (default 1e-5,1e-6,1e-8,1e-10), the trade-off curve of both directions (upper
bounds on the true-positive rate of any attack at each false-positive rate: tpr_remove for
membership inference, "was this example used?", tpr_add for the reverse test; never merged),
and gdp_mu, the smallest Gaussian-DP mu whose curve is at least as powerful at the reported
points (an estimate, not a certificate).  The curves come from the certified hockey-stick curves
of both directions, each eps giving a line below the true trade-off function, so the reported
TPR is never below the power of a real attack (docs/design.md section 13).  --plot
FILE.png draws both curves and epsilon against steps (needs matplotlib: pip install
'dpjax[plot]').

Examples:
  dpjax report --noise-multiplier 1.1 --dataset-size 60000 --batch-size 256 --epochs 30
  dpjax report --noise-multiplier 1.0 --sampling-prob 0.01 --steps 1000 --delta 1e-5 --json
  dpjax report --noise-multiplier 1.1 --sampling random_allocation --dataset-size 60000 \\
               --batch-size 256 --epochs 30 --plot report.png"""

PLOT_EXTRA = "pip install 'dpjax[plot]'"


def _figure_class():
    """matplotlib's :class:`~matplotlib.figure.Figure` (its object API: no pyplot, no global
    backend state), or a ``ValueError`` naming ``--plot`` and the extra to install."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(f"--plot needs matplotlib, which is not installed: {PLOT_EXTRA}") from None
    return Figure


def _plot_format(path: str) -> str:
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    supported = ("png", "pdf", "svg")
    if fmt not in supported:
        raise ValueError(f"--plot must name a .png, .pdf or .svg file, got {path!r}")
    return fmt


def _report(sigma: float, r):
    """:func:`dpjax.report.dpsgd_privacy_report` of resolved options ``r``."""
    from dpjax.report import dpsgd_privacy_report

    kw = dict(target_delta=r.delta, fpr=r.fpr)
    if r.sampling in _args.ALLOCATION_SAMPLINGS:
        if r.group_size != 1:
            raise ValueError(f"--group-size does not apply to --sampling {r.sampling}")
        if r.batches_per_epoch is None or r.epochs is None:
            raise ValueError(f"--sampling {r.sampling} needs --epochs and --batches-per-epoch (or --dataset-size "
                             "and --batch-size)")
        return dpsgd_privacy_report(sigma, sampling=_args.sampling_scheme(r), epochs=r.epochs, **kw)
    if r.steps is None:
        raise ValueError("--steps (or --epochs) is required for --sampling poisson and fixed_batch (an integer >= 1)")
    if r.sampling == "poisson" and r.sampling_prob is None:
        raise ValueError("--sampling-prob (or --dataset-size and --batch-size) is required for --sampling poisson "
                         "(a number in (0, 1])")
    return dpsgd_privacy_report(sigma, r.sampling_prob, r.steps,
                                group_size=r.group_size, sampling=_args.sampling_scheme(r), **kw)


def _epsilon_by_steps(sigma: float, r, delta: float, points: int = 16):
    """``(steps, certified epsilon at delta)`` after up to ``points`` step counts of the run
    (for the plot): :func:`dpjax.epsilon_curve` (Poisson, or every few epochs of the allocation
    schemes), one call per count for groups and fixed batches."""
    import numpy as np

    import dpjax

    if r.sampling in _args.ALLOCATION_SAMPLINGS:
        epochs = sorted({int(e) for e in np.linspace(1, r.epochs, min(points, r.epochs)).round()})
        curve = dpjax.epsilon_curve(sigma, target_delta=delta, sampling=_args.sampling_scheme(r), epochs=epochs)
        return np.asarray(curve.steps), np.asarray(curve.epsilon)
    steps = np.unique(np.linspace(1, r.steps, min(points, r.steps)).round().astype(np.int64))
    if r.sampling == "poisson" and r.group_size == 1:
        curve = dpjax.epsilon_curve(sigma, r.sampling_prob, steps.tolist(), delta)
        return np.asarray(curve.steps), np.asarray(curve.epsilon)
    eps = dpjax.dpsgd_epsilon(sigma, r.sampling_prob, steps, delta,
                              group_size=r.group_size, sampling=_args.sampling_scheme(r))
    return steps, np.asarray(eps)


def _draw(report, steps, eps_by_steps, delta: float, path: str) -> None:
    """The trade-off curves (both directions, with the diagonal of a useless test and
    ``G_mu`` of ``gdp_mu``) and epsilon against steps, written to ``path`` atomically."""
    import numpy as np
    from scipy.special import ndtr, ndtri

    from dpjax._base.io import atomic_write

    Figure = _figure_class()
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    fpr = np.asarray(report.fpr)
    ax.plot(fpr, report.tpr_remove, "o-", ms=3, label="remove: membership inference (upper bound)")
    ax.plot(fpr, report.tpr_add, "s--", ms=3, label="add: the reverse test (upper bound)")
    if np.isfinite(report.gdp_mu):
        ax.plot(fpr, ndtr(ndtri(fpr) + report.gdp_mu), ":", color="gray", label=f"G_mu, mu = {report.gdp_mu:.3g}")
    ax.plot(fpr, fpr, "-", color="lightgray", lw=1, label="TPR = FPR (no information)")
    ax.set_xscale("log")
    ax.set_yscale("log")  # the low false-positive rates, where attacks are judged, are visible
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate, at most")
    ax.set_ylim(float(fpr[0]) / 2, 1.5)
    ax.grid(alpha=0.3)
    ax.set_title("Trade-off curve (certified)")
    ax.legend(fontsize=8, loc="upper left")
    bx.plot(steps, eps_by_steps, "o-", ms=3)
    bx.set_xlabel("steps")
    bx.set_ylabel(f"certified epsilon at delta = {delta:g}")
    bx.set_title("Epsilon against steps")
    bx.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format=_plot_format(path), dpi=120)
    try:
        atomic_write(path, buf.getvalue())
    except OSError as exc:
        raise ValueError(f"--plot: cannot write {path!r}: {exc.strerror}") from None


def _row(args, sigma: float) -> tuple[dict, object, argparse.Namespace]:
    from dpjax.cli.pld import setting

    one = argparse.Namespace(**vars(args))
    one.noise_multiplier = sigma
    r = _args.resolve_batching(one)
    rep = _report(sigma, r)
    out = {"epsilon": rep.epsilon, "target_delta": rep.target_delta, "gdp_mu": rep.gdp_mu,
           **setting(one, r), "adjacency": rep.adjacency, "fpr": rep.fpr, "tpr_remove": rep.tpr_remove,
           "tpr_add": rep.tpr_add, "num_lines": rep.num_lines}
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in out.items()}, rep, r


def _run(args):
    args = _args.apply_scenario(args)
    _args.require_noise_multiplier(args)
    sigmas = args.noise_multiplier if isinstance(args.noise_multiplier, list) else [args.noise_multiplier]
    if args.plot is not None:
        if len(sigmas) != 1:
            raise ValueError("--plot draws one configuration: give one --noise-multiplier")
        _plot_format(args.plot)
        _figure_class()  # before the computation: a missing matplotlib is said at once
    rows = []
    for sigma in sigmas:
        row, rep, r = _row(args, sigma)
        if args.plot is not None:
            delta = float(rep.target_delta[0])
            steps, eps = _epsilon_by_steps(sigma, r, delta)
            _draw(rep, steps, eps, delta, args.plot)
            row["plot"] = args.plot
        rows.append(row)
    return rows if len(rows) > 1 else rows[0]


def _render(result: dict) -> str:
    lines = []
    head = {k: v for k, v in result.items()
            if k not in ("epsilon", "target_delta", "fpr", "tpr_remove", "tpr_add", "gdp_mu")}
    lines.append(_args.render_fields(head, skip_none=True))
    lines.append("certified epsilon:")
    lines += [f"  delta {d:<8.3g} epsilon {e:.6g}" for d, e in zip(result["target_delta"], result["epsilon"])]
    lines.append(f"gdp_mu (estimate at the points below) {result['gdp_mu']:.6g}")
    lines.append("true-positive rate of any attack, at most (remove: membership inference; add: the reverse test)")
    lines.append(f"  {'fpr':<10} {'tpr_remove':>12} {'tpr_add':>12}")
    lines += [f"  {a:<10.3g} {b:>12.6g} {c:>12.6g}"
              for a, b, c in zip(result["fpr"], result["tpr_remove"], result["tpr_add"])]
    return "\n".join(lines)


def register(subparsers) -> None:
    from dpjax.report import DEFAULT_FPR, DEFAULT_TARGET_DELTAS

    p = subparsers.add_parser("report", help="privacy report of DP-SGD: epsilon at several deltas, the trade-off "
                                             "curve of both directions, a Gaussian-DP estimate (--plot draws it)",
                              description=REPORT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _args.add_noise_multiplier(p, required=False)
    _args.add_sampling_prob(p, extra=" (--sampling poisson: this, or --dataset-size and --batch-size)")
    _args.add_steps(p, required=False)
    _args.add_target_delta(p, required=False, default=list(DEFAULT_TARGET_DELTAS), help_prefix="",
                           extra="; epsilon is reported at each (default 1e-5,1e-6,1e-8,1e-10)")
    p.add_argument("--fpr", type=_args.real_list(0, 1, lo_open=True, hi_open=True), default=list(DEFAULT_FPR),
                   help="false-positive rates in (0, 1) at which the trade-off curves are reported, a comma list "
                        "(default: 5 per decade from 1e-6 to 0.1, then 0.2, 0.3, 0.4, 0.5)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="also draw the trade-off curves (both directions) and epsilon against steps at the first "
                        f"--delta into FILE (.png, .pdf or .svg; needs matplotlib: {PLOT_EXTRA})")
    _args.add_group_args(p)
    _args.add_allocation_args(p)
    _args.add_scenario_arg(p)
    p.set_defaults(run=_run, render=_render, vectorized=("delta", "fpr", "noise_multiplier"))
