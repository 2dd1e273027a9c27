"""Write ``docs/benchmarks.md`` from ``benchmarks/results/*.json``.

Every number on that page comes from a result file, and every table says which machine ran it,
when, and with which command (the ``"meta"`` record of :mod:`_meta`; for files written before
the scripts recorded it, the record added to the file afterwards from git and the file's own
settings, which says how each field was obtained).
The page is a pure function of the result files: the same files give the same bytes, so the
test suite re-renders it and compares (``tests/test_benchmarks_doc.py``)::

    python benchmarks/render_docs.py           # rewrite docs/benchmarks.md
    python benchmarks/render_docs.py --check   # exit 1 if docs/benchmarks.md is stale

Adding a benchmark: write ``{"benchmark": ..., "rows": [{...}, ...], "meta": run_metadata(...)}``
(flat rows of numbers and strings) and the generic renderer makes a table of it with no change
here.  For a table of chosen columns, add a function ``(data) -> Rendered`` to :data:`RENDERERS`
under the file's name (a few lines with :func:`table`); for a record that should not become a
table, add its name pattern to :data:`NOT_TABULATED` with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import math
import pathlib
import re
import subprocess
import sys
import unicodedata
from typing import Any, Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
REFERENCE = ROOT / "tests" / "data" / "reference.json"

NOT_RECORDED = "not recorded"


# ------------------------------------------------------------------------------------------
# Formatting: deterministic, no exponent for ordinary magnitudes.

def num(x: Any, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits (integers above that shown whole, tiny values in
    exponent form); ``None`` -> ``-``, booleans -> ``yes`` / ``no``."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if mag < -3:
        return f"{x:.{digits - 1}e}"
    if mag >= digits - 1:
        return f"{x:,.0f}" if abs(x) >= 10_000 else f"{x:.0f}"
    return f"{x:.{digits - 1 - mag}f}"


def param(x: Any) -> str:
    """An input parameter as typed (``1``, ``0.01``, ``1e-05``), not rounded."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return num(x)
    return f"{x:g}" if isinstance(x, float) else str(x)


def seconds(x: Any) -> str:
    """A duration: ``ms`` below one second, ``s`` above."""
    if x is None:
        return "-"
    x = float(x)
    return f"{num(1000 * x)} ms" if abs(x) < 1 else f"{num(x)} s"


def ratio(x: Any) -> str:
    return "-" if x is None else f"{num(x)}x"


def cell(x: Any) -> str:
    text = num(x) if not isinstance(x, str) else x
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    """A Markdown table; cells that are not strings go through :func:`num`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Provenance: machine, date, command.

def _machine_text(m: Any) -> str | None:
    if m is None:
        return None
    if isinstance(m, str):
        return m
    parts = []
    if m.get("cpu") and m["cpu"] != NOT_RECORDED:  # a record may hold the CPU count without its model
        parts.append(str(m["cpu"]))
    count = m.get("cpu_count", m.get("cpus"))
    if count is not None:
        parts.append(f"{count} CPUs")
    if m.get("platform"):
        parts.append(str(m["platform"]))
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    versions = dict(m.get("versions") or {})
    if "jax" in m and "jax" not in versions:
        versions["jax"] = m["jax"]
    if versions:
        parts.append(", ".join(f"{k} {v}" for k, v in versions.items()))
    if m.get("gpu"):
        parts.append(f"GPU {m['gpu']}")
    if m.get("backend"):
        parts.append(f"backend {m['backend']}")
    if m.get("devices"):
        parts.append("devices " + " ".join(map(str, m["devices"])))
    load = m.get("loadavg") or m.get("loadavg_at_end")
    if load:
        parts.append("load average " + "/".join(f"{float(v):.1f}" for v in load))
    return ", ".join(parts) if parts else None


@dataclasses.dataclass(frozen=True)
class Provenance:
    machine: str | None
    date: str | None
    command: str | None
    commit: str | None = None
    afterwards: str | None = None  # how a record added after the run was obtained

    def text(self, script: str) -> str:
        command = f"`{self.command}`" if self.command else f"{NOT_RECORDED} (script: `benchmarks/{script}`)"
        lines = [f"- machine: {self.machine or NOT_RECORDED}",
                 f"- date: {self.date or NOT_RECORDED}",
                 f"- command: {command}"]
        if self.commit:
            lines.append(f"- commit: `{self.commit}`")
        if self.afterwards:
            lines.append(f"- recorded after the run: {self.afterwards}")
        return "\n".join(lines)

    def inline(self) -> str:
        """The same on one line (a part of a table that ran separately)."""
        text = (f"machine: {self.machine or NOT_RECORDED}; date: {self.date or NOT_RECORDED}; "
                f"command: {('`' + self.command + '`') if self.command else NOT_RECORDED}")
        return text + (f" (recorded after the run: {self.afterwards})" if self.afterwards else "")


def provenance(data: dict, outer: dict | None = None) -> Provenance:
    """What ``data`` records about its run: its ``"meta"`` record, else the older fields
    (``machine`` / ``platform`` / ``cpu_count`` / ``cpus`` / ``python``, ``finished``), else
    those of ``outer`` (the enclosing record)."""
    meta = data.get("meta")
    if isinstance(meta, dict):
        return Provenance(_machine_text(meta.get("machine")), meta.get("date"), meta.get("command"),
                          meta.get("commit"), meta.get("recorded_afterwards"))
    machine = data.get("machine")
    if machine is None and any(k in data for k in ("platform", "cpu_count", "cpus")):
        machine = {k: data[k] for k in ("platform", "cpu_count", "cpus", "python") if k in data}
    elif isinstance(machine, str) and data.get("cpus") is not None:
        machine = {"platform": machine, "cpus": data["cpus"], "python": data.get("python")}
    elif isinstance(machine, str) and data.get("python"):
        machine = {"platform": machine, "python": data["python"]}
    if isinstance(machine, dict) and "loadavg" not in machine and "loadavg_at_end" in data:
        machine = {**machine, "loadavg_at_end": data["loadavg_at_end"]}
    found = Provenance(_machine_text(machine), data.get("finished"), None)
    if outer is not None and found.machine is None:
        found = dataclasses.replace(found, machine=provenance(outer).machine)
    return found


# ------------------------------------------------------------------------------------------
# Renderers: one per result file (or group of files of one script), then the generic one.

@dataclasses.dataclass
class Rendered:
    title: str
    body: str  # Markdown: what is measured and the table(s)
    script: str  # benchmarks/<script> that writes the file
    headlines: list[list[str]] = dataclasses.field(default_factory=list)  # [what, against, ratio]
    own_provenance: bool = False  # True: ``body`` states machine, date and command per part


def _reference_params() -> dict:
    if not REFERENCE.exists():
        return {}
    cases = json.loads(REFERENCE.read_text())["cases"]
    return {c["id"]: c["params"] for c in cases}


def render_pld(d: dict) -> Rendered:
    params = _reference_params()
    rows, heads = [], []
    for r in d["rows"]:
        p = params.get(r["case"])
        case = r["case"] if p is None else (f"{r['case']}: sigma {param(p['noise_multiplier'])}, "
                                            f"q {param(p['sampling_probability'])}, T {param(p['steps'])}")
        rows.append([case, r["library"], r["setting"], num(r["epsilon"], 8), num(r["abs_error_vs_reference"], 2),
                     seconds(r["cold_s"]), seconds(r.get("cold_warm_disk_cache_s")), seconds(r["steady_s"]),
                     ratio(r["steady_speedup_vs_dp_accounting"])])
        if r["library"] == "dpjax" and r["setting"] == "default":
            heads.append([f"PLD accounting, DP-SGD case {r['case']}, steady call", "dp_accounting",
                          ratio(r["steady_speedup_vs_dp_accounting"])])
    body = "\n\n".join([
        f"Error: absolute difference from the pinned reference ({d['reference']}). "
        f"Cold: {d['cold_definition']}. Cold, warm cache: {d['cold_warm_disk_cache_definition']}. "
        f"Steady: {d['steady_definition']}. Target delta {param(d['delta'])}.",
        table(["case", "library", "setting", "epsilon", "error", "cold", "cold, warm cache", "steady",
               "speed-up (steady)"], rows)])
    return Rendered("PLD accounting against dp_accounting", body, "bench_pld.py", heads)


def render_first_call(d: dict) -> Rendered:
    api = [r for r in d["rows"] if r["kind"] != "cli"]
    cli = [r for r in d["rows"] if r["kind"] == "cli"]
    body = [f"Definition: {d['definition']}. Target: the time dp_accounting needs for the same task, "
            "or a fixed budget where it has none."]
    body.append(table(["entry point", "dpjax", "dp_accounting", "target", "met"],
                      [[f"`{r['name']}`", seconds(r["first_call_s"]), seconds(r.get("anchor_first_call_s")),
                        seconds(r["target_s"]), r["meets_target"]] for r in api]))
    if cli:
        body.append(table(["command", "first run", "second run", "target (second run)", "met"],
                          [[f"`dpjax {r['name'].split(':', 1)[1]}`", seconds(r["first_run_s"]),
                            seconds(r["second_run_s"]), seconds(r["target_s"]), r["meets_target"]] for r in cli]))
    met = sum(bool(r["meets_target"]) for r in d["rows"])
    heads = [["First call of every entry point and CLI command within its target", "-",
              f"{met} of {len(d['rows'])}"]]
    return Rendered("First call (fresh process, compilation included)", "\n\n".join(body),
                    "bench_first_call.py", heads)


def render_group(d: dict) -> Rendered:
    rows = [[r["sampling"], param(r["noise_multiplier"]), r["group_size"], param(r["steps"]), param(r["delta"]),
             num(r["dpjax"]["eps"], 7), num(r["dp_accounting"]["eps"], 7), seconds(r["dp_accounting"]["seconds"]),
             seconds(r["dpjax"]["cold_process_seconds"]), seconds(r["dpjax"]["steady_seconds"]),
             ratio(r["speedup_steady"])] for r in d["rows"]]
    speedups = [r["speedup_steady"] for r in d["rows"]]
    body = "\n\n".join([d.get("note", ""), table(
        ["sampling", "sigma", "k", "T", "delta", "epsilon dpjax", "epsilon dp_accounting", "dp_accounting",
         "dpjax cold", "dpjax steady", "speed-up (steady)"], rows)]).strip()
    heads = [["Group privacy (mixture of Gaussians), steady call", "dp_accounting",
              f"{ratio(min(speedups))} - {ratio(max(speedups))}"]]
    return Rendered("Group privacy against dp_accounting", body, "bench_group.py", heads)


def render_calibration(d: dict) -> Rendered:
    dj = d["dpjax"]
    body = [f"One `dpsgd_noise_multiplier` call calibrates a batch of {dj['batch_size']} targets "
            f"(T {param(dj['steps'])}, delta {param(dj['delta'])}, q in [{num(dj['sampling_prob_range'][0])}, "
            f"{num(dj['sampling_prob_range'][1])}], epsilon in [{num(dj['epsilon_range'][0])}, "
            f"{num(dj['epsilon_range'][1])}]): cold {seconds(dj['cold_seconds'])}, steady "
            f"{seconds(dj['steady_seconds'])}, {seconds(dj['steady_seconds_per_calibration'])} per calibration. "
            "dp_accounting's `calibrate_dp_mechanism` on the anchor targets:"]
    body.append(table(["q", "epsilon", "T", "delta", "sigma dpjax", "sigma dp_accounting", "relative difference",
                       "dp_accounting", "speed-up per calibration"],
                      [[param(r["sampling_prob"]), param(r["epsilon"]), param(r["steps"]), param(r["delta"]),
                        num(r["dpjax_sigma"], 7), num(r["dp_accounting_sigma"], 7), num(r["relative_difference"], 2),
                        seconds(r["dp_accounting_seconds"]), ratio(r["speedup"])] for r in d["dp_accounting"]]))
    heads = [["Noise calibration (batched), per calibration, steady", "dp_accounting",
              ratio(d["speedup_steady_per_calibration"])]]
    return Rendered("Noise calibration against dp_accounting", "\n\n".join(body), "bench_calibration.py", heads)


def render_montecarlo(d: dict) -> Rendered:
    rows = []
    for r in d["results"]:
        jp, dj = r["jax_privacy"], r["dpjax"]
        rows.append([r["n"], r["b"], r["epochs"], num(jp["num_samples"]), num(jp["us_per_sample"]),
                     num(dj["num_samples"]), num(dj["us_per_sample"]), seconds(dj["cold_s"]),
                     ratio(r["speedup_samples_per_s"]),
                     num(max(abs(z) for z in r["z_remove_vs_jax_privacy"]), 2)])
    speedups = [r["speedup_samples_per_s"] for r in d["results"]]
    body = "\n\n".join([
        f"Toeplitz C with first column {d['matrix_first_column']}, sigma {param(d['noise_multiplier'])}, "
        f"epsilon in {d['epsilons']}. Time per sample: jax_privacy's `get_privacy_loss_sample` (one direction) "
        "against `BallsInBins.estimate` (both directions, every epsilon, from each draw). |z|: the largest "
        "difference of the two delta estimates in combined standard errors.",
        table(["n", "b", "E", "jax_privacy samples", "jax_privacy us/sample", "dpjax samples", "dpjax us/sample",
               "dpjax cold", "speed-up", "max abs z"], rows)])
    heads = [["Monte Carlo balls-in-bins, time per sample", "jax_privacy",
              f"{ratio(min(speedups))} - {ratio(max(speedups))}"]]
    return Rendered("Monte Carlo accounting against jax_privacy", body, "bench_montecarlo.py", heads)


def render_optimize(d: dict) -> Rendered:
    rows, heads = [], []
    for r in d["rows"]:
        for label, x in (("dpjax", r.get("dpjax")), ("anchor (Algorithm 2)", r.get("anchor_algorithm2"))):
            if x is None:
                continue
            if "error" in x:
                rows.append([r["config"], label, "error", "-", "-", "-", "-", "-", "-"])
                continue
            measured = x.get("measured_300_steps")
            rows.append([r["config"], label, x["steps_run"], seconds(x["compile_and_first_step_s"]),
                         seconds(x["per_step_s"]),
                         seconds(x["extrapolated_300_steps_s"]) + ("" if measured else " (extrapolated)"),
                         seconds(x.get("optimize_total_s")), num(x.get("peak_rss_mb")),
                         ratio(r.get("speedup_per_step")) if label != "dpjax" else "-"])
    body = "\n\n".join(x for x in [
        f"{d.get('family', '')}, epsilon {param(d.get('epsilon'))}, delta {param(d.get('delta'))}. Config: epochs E x "
        "batches per epoch b x Monte Carlo samples per step. The anchor is the paper's Algorithm 2 (fresh draws "
        "every step, bisection, implicit gradient) run in the same process tree.",
        d.get("note", ""),
        table(["config", "run", "steps run", "compile + first step", "per step", "300 steps", "total", "peak RSS MB",
               "speed-up per step"], rows)] if x)
    configs = [r["config"] for r in d["rows"]]
    title = "Optimizing C: " + (", ".join(configs) if len(configs) <= 2
                                else f"{len(configs)} configurations, {configs[0]} to {configs[-1]}")
    speedups = [r["speedup_per_step"] for r in d["rows"] if r.get("speedup_per_step") is not None]
    if speedups:
        span = ratio(speedups[0]) if len(speedups) == 1 else f"{ratio(min(speedups))} - {ratio(max(speedups))}"
        heads.append([f"Optimizing C, time per step ({', '.join(configs) if len(configs) <= 2 else title[14:]})",
                      "Algorithm 2", span])
    return Rendered(title, body, "bench_optimize.py", heads)


def render_sweep(d: dict) -> Rendered:
    """``bench_sweep.py``: a distribution per file (``results``: rounds of rows, the steady state
    alternating in one process, the accuracy check), its device mode (``mode: "device"``), or
    the first version's single table (``rows`` with ``library`` / ``pass_``)."""
    if d.get("mode") == "device":
        return _render_sweep_device(d)
    if "results" not in d:
        return _render_sweep_v1(d)
    parts, heads = [], []
    if d.get("base") and not str(d["base"]).startswith("/"):   # a named revision, not a local path
        parts.append(f"Rows marked [base] ran from another checkout, {d['base']}, alternating with this one.")
    dists = [res["dist"] for res in d["results"]]
    for res in d["results"]:
        dist, n = res["dist"], res["configs"]
        what = SWEEP_DISTRIBUTIONS.get(dist, dist)
        parts.append(f"**{dist}**: {n} configurations, {what}. dp_accounting: `PLDAccountant` at "
                     f"interval 1e-4 per configuration"
                     + (f", timed on {res['anchor_subset']} and extrapolated" if res["anchor_subset"] < n else "")
                     + ". Each row is a fresh process (import included where stated); speed-ups against the "
                     "dp_accounting loop of the same round.")
        for k, rnd in enumerate(res["rounds"]):
            rows = [[r["row"], seconds(r["seconds"]), seconds(r.get("cpu_s")), num(r.get("programs")),
                     ratio(r.get("speedup_vs_dp_accounting")), num(r.get("load_before"), 2)] for r in rnd["rows"]]
            title = f"Round {k + 1} of {len(res['rounds'])}:" if len(res["rounds"]) > 1 else ""
            parts.append("\n\n".join(x for x in [title, table(
                ["row", "wall", "CPU", "programs", "speed-up vs dp_accounting", "load"], rows)] if x))
            notes = []
            if rnd.get("sweep_second_vs_loop_second") is not None:
                notes.append(f"sweep second pass against the single-call loop's second pass: "
                             f"{ratio(rnd['sweep_second_vs_loop_second'])} wall, "
                             f"{ratio(rnd['sweep_second_vs_loop_second_cpu'])} CPU")
            alt = rnd.get("alternating")
            if alt:
                r = alt["ratios"]
                notes.append(f"steady state alternating in one process ({len(r['sweep_vs_dp_accounting'])} rounds of "
                             "dp_accounting's loop, the sweep and the single-call loop): sweep against dp_accounting "
                             + ", ".join(ratio(x) for x in r["sweep_vs_dp_accounting"])
                             + "; against the single-call loop " + ", ".join(ratio(x) for x in r["sweep_vs_loop"]))
                if "sweep_upper_vs_loop" in r:
                    notes.append("the same work on both sides: the sweep's upper ends alone against the "
                                 "dpsgd_epsilon loop " + ", ".join(ratio(x) for x in r["sweep_upper_vs_loop"])
                                 + "; the sweep's brackets against a dpsgd_accounting loop "
                                 + ", ".join(ratio(x) for x in r["sweep_vs_loop_bracket"]))
            acc = rnd.get("accuracy")
            if acc:
                notes.append(f"accuracy: {acc['compared']} rows against dp_accounting at 1e-4, "
                             f"{acc['outside_at_1e4']} outside [{num(acc['tolerance'][0])}, {num(acc['tolerance'][1])}] "
                             f"relative re-checked at interval {num(acc['rechecked_at'])}; after the re-check the "
                             f"relative difference lies in [{num(acc['min_rel'], 2)}, {num(acc['max_rel'], 2)}] "
                             f"(rows outside: {len(acc['outside_after_recheck'])}); dp_accounting below the sweep's "
                             f"certified lower end: {len(acc['dp_accounting_below_sweep_lower'])} rows")
            vb = rnd.get("vs_base")
            if vb:
                notes.append(f"against the base checkout: {vb['identical_rows']} of {n} rows identical, largest "
                             f"relative difference {num(vb['max_rel_diff'], 2)}")
            if notes:
                parts.append("\n".join(f"- {x}" for x in notes))
        last = res["rounds"][-1]
        by = {r["row"]: r for r in last["rows"]}
        for label, row in (("first pass, compile included", "sweep first pass (in process, empty cache)"),
                           ("second pass", "sweep second pass (same process)"),
                           ("CLI, second process, warm cache", "CLI warm (second process, same cache)")):
            r = by.get(row)
            if r and r.get("speedup_vs_dp_accounting"):
                heads.append([f"Sweep of {n} configurations ({dist}), {label}", "dp_accounting loop",
                              ratio(r["speedup_vs_dp_accounting"])])
        if last.get("sweep_second_vs_loop_second") is not None:
            heads.append([f"Sweep of {n} configurations ({dist}), second pass", "dpjax single-call loop",
                          ratio(last["sweep_second_vs_loop_second"])])
    return Rendered(f"Sweeps against a dp_accounting loop ({', '.join(dists)})", "\n\n".join(parts),
                    "bench_sweep.py", heads)


#: The distributions of ``bench_sweep.py``, as its docstring states them.
SWEEP_DISTRIBUTIONS = {
    "narrow": "sigma ~ U[0.6, 3], q log-uniform in [1e-3, 3e-2], T log-uniform in [1e2, 3e4], delta 1e-5, seed 0",
    "broad": "sigma ~ U[0.5, 4], q log-uniform in [10^-3.5, 0.1], T log-uniform in [1e2, 1e5], delta log-uniform "
             "in [1e-8, 1e-4], seed 1",
}


def _render_sweep_device(d: dict) -> Rendered:
    rows = [[r["row"], seconds(r["seconds"]), num(r.get("programs")), num(r.get("compiled")), num(r.get("loaded")),
             seconds(r.get("process_wall_s"))] for r in d["rows"]]
    body = "\n\n".join([
        f"{d['configs']} configurations ({d['dist']}: {SWEEP_DISTRIBUTIONS.get(d['dist'], d['dist'])}) on "
        f"{d['device']} (backend {d['backend']}, jax {d['jax']}); no anchor. Median epsilon "
        f"{num(d['epsilon_median'])}, rows without a finite epsilon: {d['rows_inf']}, rows by path: "
        + ", ".join(f"{k} {v}" for k, v in sorted(d["paths"].items())) + ".",
        table(["pass", "sweep", "programs", "compiled", "loaded", "whole process"], rows)])
    return Rendered(f"Sweeps on one device ({d['backend']})", body, "bench_sweep.py")


def _render_sweep_v1(d: dict) -> Rendered:
    rows = [[r["library"], r["pass_"], seconds(r["seconds"]), num(r.get("per_config_ms")),
             ratio(r.get("speedup_vs_dp_accounting"))] for r in d["rows"]]
    body = "\n\n".join([
        f"{d['configs']} random DP-SGD configurations ({d['distribution']}); dp_accounting's loop over "
        f"{d['anchor_subset']} of them. dpjax compiled {d['dpjax_programs']} programs; dp_accounting's epsilon "
        f"lies inside dpjax's certified bracket on {d['dp_accounting_inside_dpjax_bracket']} of "
        f"{d['anchor_subset']} (median relative difference {num(d['median_rel_diff_dp_accounting_vs_dpjax'], 2)}).",
        table(["library", "pass", "time", "ms per configuration", "speed-up"], rows)])
    heads = [[f"Sweep of {d['configs']} configurations, {r['pass_'].split(' (')[0]} pass", "dp_accounting loop",
              ratio(r["speedup_vs_dp_accounting"])] for r in d["rows"] if r.get("speedup_vs_dp_accounting")]
    return Rendered("Sweeps against a dp_accounting loop", body, "bench_sweep.py", heads)


def render_curve(d: dict) -> Rendered:
    rows = [[r["what"], seconds(r["first_s"]), seconds(r["second_s"])] for r in d["rows"]]
    rows.append(["ratio", ratio(d["ratio_first"]), ratio(d["ratio_second"])])
    body = "\n\n".join([
        f"Case: {d['case']}; grid size n = {num(d['n'])}. Largest relative difference between the two "
        f"{num(d['max_rel_diff'], 2)}; each value inside the other's certified bracket: "
        f"{num(d['inside_brackets'])}.",
        table(["what", "first (fresh process)", "second"], rows)])
    heads = [["eps(T) curve of 100 T, one call vs separate calls, first / second", "dpjax separate calls",
              f"{ratio(d['ratio_first'])} / {ratio(d['ratio_second'])}"]]
    return Rendered("eps(T) curves", body, "bench_curve.py", heads)


def render_plancherel(d: dict) -> Rendered:
    rows = [[num(r["n"]), num(r["inverse_ms_per_T"]), num(r["plancherel_ms_per_T"]),
             num(r["plancherel_fixed_ms_per_T"]), ratio(r["speedup_plancherel"]),
             ratio(r["speedup_plancherel_fixed"])] for r in d["rows"]]
    body = "\n\n".join([
        f"Per-T kernels of an eps(T) curve on one grid, batch {d['batch']}: the inverse transform against the "
        f"Plancherel inner product. {d['note']}.",
        table(["n", "inverse ms/T", "Plancherel ms/T", "Plancherel, weights precomputed, ms/T",
               "speed-up", "speed-up, precomputed"], rows)])
    return Rendered("eps(T) kernels: inverse transform against Plancherel", body, "bench_plancherel.py")


def render_mutation_check(d: dict) -> Rendered:
    c = d["counts"]
    rows = [[f"`{m['id']}`", f"`{m['file']}:{m['line']}`", m["description"], m["outcome"],
             f"`{m['first_failure']}`" if m.get("first_failure") else "", seconds(m["seconds"])]
            for m in d["mutations"]]
    base = d["baseline"] or {}
    body = "\n\n".join([
        f"One-line bugs seeded into soundness-critical code, one at a time in a fresh clone of commit "
        f"`{d['commit'][:7]}`, each run against its default-tier test files (`{d['pytest_command']}`). "
        f"Caught: {num(c['caught'])} of {num(c['total'])}; not caught: {num(c['not_caught'])}; errors: "
        f"{num(c['errors'])}. The unmutated baseline on every target: {base.get('summary', 'not run')}.",
        table(["mutation", "line", "what it breaks", "outcome", "first failing test", "time"], rows)])
    return Rendered("Mutation check of the default test tier", body, "mutation_check.py")


def render_interop(d: dict) -> Rendered:
    parts, heads = [], []
    c = d.get("calibrate")
    if c:
        parts.append("**Calibration through the dp_accounting interface** "
                     "(`calibrate_dp_mechanism` with dpjax's `PLDAccountant` against dp_accounting's own):")
        parts.append(table(["run", "sigma", "time", "speed-up"], [
            ["dp_accounting", num(c["dp_accounting"]["sigma"], 7), seconds(c["dp_accounting"]["seconds"]), "1x"],
            ["dpjax, first", num(c["dpjax_first"]["sigma"], 7), seconds(c["dpjax_first"]["seconds"]),
             ratio(c["speedup_first"])],
            ["dpjax, steady", num(c["dpjax_steady"]["sigma"], 7), seconds(c["dpjax_steady"]["seconds"]),
             ratio(c["speedup_steady"])]]))
        parts.append(provenance(c, d).text("bench_interop.py"))
        heads.append(["`calibrate_dp_mechanism` with dpjax's accountant, steady", "dp_accounting's accountant",
                      ratio(c["speedup_steady"])])
    r = d.get("running")
    if r:
        parts.append("**Running accountant**, 20 queries (variants `fixed_grid`, `fresh`, `full`; each in a fresh "
                     f"process): fixed-grid epsilons within {num(r['max_rel_diff_fixed_grid_vs_fresh'], 2)} of "
                     f"fresh; full equals fresh: {num(r['full_equals_fresh'])}.")
        parts.append(table(["variant", "cold total", "cold first query", "steady total"], [
            [k, seconds(r[k]["cold"]["total_s"]), seconds(r[k]["cold"]["first_s"]), seconds(r[k]["steady"]["total_s"])]
            for k in ("fixed_grid", "fresh", "full") if k in r]))
        parts.append(provenance(r, d).text("bench_interop.py"))
    events = sorted((k for k in d if k.startswith("events")),
                    key=lambda k: [int(x) if x.isdigit() else -1 for x in k.split("_")[1:]])
    if events:
        parts.append("**dp_accounting events** accounted by dpjax against dp_accounting (interval per part):")
        parts.append(table(["part", "events", "interval", "worst relative difference", "all above the floor"], [
            [k, len(d[k]["rows"]), num(d[k]["interval"]), num(d[k]["worst_rel_diff"], 2), d[k]["all_above_floor"]]
            for k in events]))
        parts.append(provenance(d).text("bench_interop.py"))
    return Rendered("Interoperability (dp_accounting interface)", "\n\n".join(parts), "bench_interop.py", heads,
                    own_provenance=True)


def render_amplified_mf(d: dict) -> Rendered:
    eps = d["epsilons"]
    rows, prov = [], []
    for group, g in d["groups"].items():
        names: list[str] = []
        for r in g["rows"]:
            if r["name"] not in names:
                names.append(r["name"])
        for name in names:
            by_eps = {r["epsilon"]: r for r in g["rows"] if r["name"] == name}
            accounting = next(iter(by_eps.values()))["accounting"]
            rows.append([f"`{name}`", accounting] + [num(by_eps[e]["rmse"]) if e in by_eps else "" for e in eps])
        p = provenance(g, d)
        prov.append(f"- `{group}`: {p.inline()}")
    summary = []
    for entry in d.get("summary") or []:
        margin = entry.get("closest_baseline_margin")
        gain = lambda opt: entry.get(f"gain_{opt}_over_banded_cyclic_poisson_pld")  # noqa: E731
        summary.append([param(entry["epsilon"]), f"`{entry['best']}`", num(entry["best_rmse"]),
                        "yes" if entry["at_or_below_every_baseline"] else "no",
                        "-" if margin is None else f"{100 * margin:+.2f}%",
                        "-" if gain("optimized_blt") is None else f"{100 * gain('optimized_blt'):+.1f}%",
                        "-" if gain("optimized_toeplitz") is None else f"{100 * gain('optimized_toeplitz'):+.1f}%"])
    summary_text = [] if not summary else [
        "Per epsilon: dpjax's best certified row (the smallest RMSE among `optimized_blt`, `optimized_toeplitz` and "
        "dpjax's `banded_cyclic_poisson`, what `dpjax optimize --amplification auto` returns), whether it is at or "
        "below every baseline row (ties within 1e-6 relative count: two PLD calibrations of the same "
        "coefficients), the closest baseline's margin over it, and the optimized balls-in-bins rows' gain over "
        "jax_privacy's banded coefficients under cyclic Poisson accounted with dpjax's PLD "
        "(`rmse(banded) / rmse(optimized) - 1`; positive: the optimized matrix is better).",
        table(["eps", "best certified row", "RMSE", "at or below every baseline", "closest baseline",
               "gain: optimized BLT", "gain: optimized Toeplitz"], summary)]
    body = "\n\n".join([
        f"n = {d['n']} (E = {d['epochs']} epochs, b = {d['batches_per_epoch']} batches per epoch), "
        f"delta = {param(d['delta'])}. Every row in one normalization: {d['normalization']}.",
        table(["row", "accounting"] + [f"eps {param(e)}" for e in eps], rows)] + summary_text + [
        "Each group of rows ran separately (script: `benchmarks/table_amplified_mf.py --groups GROUP`):",
        "\n".join(prov)])
    heads = []
    entries = d.get("summary") or []
    if entries:
        gains = [max((entry.get(f"gain_{o}_over_banded_cyclic_poisson_pld") for o in ("optimized_blt", "optimized_toeplitz")
                      if entry.get(f"gain_{o}_over_banded_cyclic_poisson_pld") is not None), default=None)
                 for entry in entries]
        if all(g is not None for g in gains):
            heads.append([f"Main job (n = {d['n']}): best optimized C under balls-in-bins, certified RMSE gain (rmse(banded) / rmse(optimized) - 1), eps "
                          + " / ".join(param(entry["epsilon"]) for entry in entries),
                          "banded C, cyclic Poisson (PLD)",
                          " / ".join(f"{100 * g:+.1f}%" for g in gains)])
    return Rendered("The main job: amplified matrix factorization, prefix-sum RMSE", body,
                    "table_amplified_mf.py", heads, own_provenance=True)


def render_certify_n2048(d: dict) -> Rendered:
    """``certify_n2048.py``: per optimized n = 2048 matrix, the variance-reduced certificate and the
    Bernoulli-KL one against a plain 2^24-sample estimate of the same C (``summary``)."""
    rows, small = [], []
    for name, e in sorted((d.get("summary") or {}).items()):
        def cells(part):
            c = e.get(part) or {}
            gap = c.get("gap_to_reference")
            return [num(c.get("noise_multiplier"), 5), "-" if gap is None else f"{100 * gap:+.2f}%",
                    num(c.get("num_samples")), seconds(c.get("seconds"))]
        rows.append([f"`{name}`", num(e.get("reference_root"), 5)] + cells("importance") + cells("kl"))
        sd = e.get("small_delta_1e-7")
        if sd:
            small.append([f"`{name}`", num(sd.get("noise_multiplier"), 5), num(sd.get("noise_multiplier_estimate"), 5),
                          num(sd.get("num_samples")), str(sd.get("verified")), seconds(sd.get("seconds"))])
    parts = [
        f"b = {d.get('batches_per_epoch')}, E = {d.get('epochs')}, delta = {param(d.get('delta'))}; the optimized "
        "first columns of `certify_n2048_matrices.json`. Reference: the plain Monte Carlo estimate's root with "
        "2^24 samples (an estimate, with its own standard error in the file). Gap: certified sigma over the "
        "reference, minus 1. Both certificates of one matrix ran in the same process, one after the other. "
        "Draws: the verification sample; each certificate also draws a calibration sample (a quarter of it) "
        "that chooses the noise multiplier, the proposal and the bets." + (f" {d['note']}" if d.get("note") else ""),
        table(["matrix", "reference sigma", "variance-reduced sigma", "gap", "verification draws", "time",
               "Bernoulli-KL sigma", "gap", "verification draws", "time"], rows)]
    if small:
        parts += ["At delta = 1e-7, eps = 2 (variance-reduced certificate):",
                  table(["matrix", "certified sigma", "estimate", "draws", "verified", "time"], small)]
    return Rendered("Certificates at n = 2048 against a 2^24-sample reference", "\n\n".join(parts),
                    "certify_n2048.py")


def render_fig5(d: dict) -> Rendered:
    """``fig5_samples.py``: one row per run; with the in-loop estimator recorded (plain against
    variance-reduced), also each run's RMSE above the best run at its epsilon."""
    by_estimator = any("estimator" in r for r in d["runs"])
    runs = sorted(d["runs"], key=lambda r: (r["epsilon"], r.get("estimator", ""), r["num_samples"]))
    best = {e: min(r["rmse_eval"] for r in runs if r["epsilon"] == e) for e in {r["epsilon"] for r in runs}}
    rows = [[param(r["epsilon"])] + ([r.get("estimator", "-")] if by_estimator else [])
            + [num(r["num_samples"]), num(r["rmse_eval"], 4)]
            + ([f"{100 * (r['rmse_eval'] / best[r['epsilon']] - 1):+.2f}%"] if by_estimator else [])
            + [num(r.get("rmse_estimate"), 4), seconds(r["seconds"]), r.get("status", "-")] for r in runs]
    header = (["epsilon"] + (["in-loop estimator"] if by_estimator else []) + ["samples per step", "RMSE (evaluation)"]
              + (["above the best run"] if by_estimator else [])
              + ["RMSE (optimizer's estimate)", "time", "status"])
    body = "\n\n".join([
        f"{d['family']}, E = {d['epochs']}, b = {d['batches_per_epoch']}, delta {param(d['delta'])}, "
        f"{d['steps']} steps with fresh samples each step; evaluation: {d['evaluation']}.",
        table(header, rows)])
    title = (f"Samples per optimization step{' (plain against variance-reduced)' if by_estimator else ''}: "
             f"{d['family']}, n = {d['batches_per_epoch'] * d['epochs']}")
    return Rendered(title, body, "fig5_samples.py")


def render_example(d: dict) -> Rendered:
    """``bench_example.py``: wall time of ``dpjax optimize --example`` per variant, warm cache."""
    rows = []
    for name, v in d["variants"].items():
        runs = v.get("runs") or []
        first = runs[0] if runs else {}
        rows.append([name, " ".join(v.get("args") or []) or "(the defaults)", seconds(v.get("warmup", {}).get("seconds")),
                     seconds(v.get("median_seconds")), ", ".join(seconds(r["seconds"]) for r in runs),
                     seconds(v.get("median_cpu_seconds")), ", ".join(num(r.get("load_average")) for r in runs),
                     num(first.get("noise_multiplier"), 5), first.get("method") or "-",
                     num(first.get("certificate_samples"))])
    body = ("Fresh processes of `python -m dpjax optimize --example --json --quiet --no-save` (plus the variant's "
            "arguments), each variant's runs alternating with the other's, the persistent compilation cache in a "
            "private directory: the first run of each variant fills it (its time includes XLA's compilations), the "
            "runs after it find it warm.\n\n"
            + table(["variant", "arguments", "first run (empty cache)", "warm: median", "warm: every run",
                     "warm: median CPU time", "load average (1 min)", "certified sigma", "certificate",
                     "certificate samples"], rows))
    return Rendered("The example: wall time", body, "bench_example.py")


def render_example_memory(d: dict) -> Rendered:
    """``bench_example_memory.py``: peak RSS of ``dpjax optimize --example``, this version against a baseline."""
    rows = []
    for name, v in d["versions"].items():
        warm = v.get("warm") or []
        rows.append([name if name == "head" else f"baseline ({d.get('baseline_commit')})",
                     num(v["cold"]["peak_rss_mib"]), seconds(v["cold"]["seconds"]),
                     num(v.get("warm_peak_rss_mib_median")), ", ".join(num(r["peak_rss_mib"]) for r in warm),
                     ", ".join(seconds(r["seconds"]) for r in warm), num(v["cold"].get("noise_multiplier"), 5)])
    body = ("Peak resident set size of one fresh `python -m dpjax optimize --example --json --quiet` process "
            "(`--no-save` where the version has it), read from the kernel when it exits (`os.wait4`).  Cold: the "
            "first run with an empty private compilation cache; warm: the runs after it, alternating between the "
            "versions.\n\n"
            + table(["version", "cold peak MiB", "cold time", "warm peak MiB (median)", "warm peaks MiB",
                     "warm times", "certified sigma"], rows)
            + f"\n\nPeak RSS, this version over the baseline: {ratio(d.get('warm_peak_ratio_head_over_baseline'))} "
              f"warm, {ratio(d.get('cold_peak_ratio_head_over_baseline'))} cold.")
    return Rendered("The example: peak memory", body, "bench_example_memory.py")


def render_traced(d: dict) -> Rendered:
    """``bench_traced.py``: ``jax.vmap`` over 64 noise multipliers against 64 eager calls, the first
    gradients, and the single call's steady state against a baseline commit."""
    v = d["vmap_64"]
    med = v["median"]
    rows = [["64 eager calls (a Python loop)", seconds(v["eager_first_s"]), seconds(med["eager_wall_s"]),
             seconds(med["eager_cpu_s"]), "-", "-"],
            ["jax.jit(jax.vmap(dpjax.dpsgd_epsilon)) over 64", seconds(v["vmap_first_s"]), seconds(med["vmap_wall_s"]),
             seconds(med["vmap_cpu_s"]), ratio(v["speedup_wall"]), ratio(v["speedup_cpu"])]]
    parts = [str(d.get("note") or "").strip(),
             "`dpsgd_epsilon(sigma, 0.01, 1000, 1e-5)` for 64 noise multipliers in `linspace(0.9, 1.2, 64)`, x64 on; "
             f"largest relative difference between the batch and the eager calls: {num(v['max_rel_diff'])}.  Steady "
             f"state: the median of {len(v['repeats'])} alternating timings of each after both are compiled; CPU: the "
             "process's CPU time.",
             table(["run", "first call", "steady wall", "steady CPU", "speed-up (wall)", "speed-up (CPU)"], rows)]
    g = d.get("first_grad")
    if g:
        parts.append(table(["first gradient (after one eager call)", "seconds"], [
            ["jax.grad(dpsgd_epsilon) in sigma", seconds(g["grad_epsilon_first_s"])],
            ["the same at a second point", seconds(g["grad_epsilon_second_point_s"])],
            ["jax.grad(dpsgd_noise_multiplier) in epsilon", seconds(g["grad_noise_multiplier_first_s"])]]))
    b = d.get("b1")
    if b:
        parts.append(f"The single eager call's steady state (B1), median of {len(b['pairs'])} alternating fresh "
                     f"processes: {seconds(b['head_median_s'])} here, {seconds(b['baseline_median_s'])} at "
                     f"{b['baseline_commit']} (ratio {num(b['ratio_head_over_baseline'])}).")
    heads = [["jax.vmap over 64 noise multipliers, steady state (wall)", "64 eager calls", ratio(v["speedup_wall"])]]
    return Rendered("Traced calls: vmap over 64 noise multipliers, first gradients", "\n\n".join(p for p in parts if p),
                    "bench_traced.py", heads)


def _allocation_rows(d: dict, extra, blanks: int) -> list[list]:
    """Table rows of a ``bench_allocation.py`` summary: the configuration, both brackets and
    dpjax's width, then ``extra(row)``; a failed row shows its error and ``blanks`` dashes."""
    rows = []
    for r in d["rows"]:
        c = r["config"]
        head = [c["kind"], param(c["sigma"]), c["t"], c["k"], c["epochs"], param(c["delta"])]
        if "error" in r:
            rows.append(head + [r["error"]] + ["-"] * blanks)
            continue
        rows.append(head + [num(r["dpjax_lower"], 6), num(r["dpjax_upper"], 6), num(r["pld_lower"], 6),
                            num(r["pld_upper"], 6), num(r["width_rel"], 2)] + extra(r))
    return rows


def render_allocation(d: dict, speed_record: bool = False) -> Rendered:
    """``bench_allocation.py``: random allocation against ``pld-accounting``, per configuration.

    ``speed_record``: a run of the speed set alone (``--record``); its speed-ups are the summary
    rows (the run of every configuration then keeps its soundness row only)."""
    if d.get("speed") is None:
        return _render_allocation_recheck(d)
    rows = _allocation_rows(d, lambda r: [seconds(r["pld_first"]), seconds(r["dpjax_first"]),
                                          ratio(r["first_ratio"]), ratio(r["steady_ratio"])], 8)
    snd, spd = d["soundness"], d["speed"]
    body = "\n\n".join([
        "DP-SGD under random allocation (each example in k of the t steps of every epoch), dpjax's certified "
        "bracket against pld-accounting's `gaussian_allocation_epsilon_range` (its default accuracy). "
        "Each library runs each configuration in its own fresh process; dpjax's steady time is the faster "
        "of its one-shot call and its jitted `allocation_epsilon_fn` on the same plan. " + d.get("note", ""),
        f"Sound on {sum(1 for r in d['rows'] if r.get('sound'))} of {snd['configurations']} configurations "
        f"(dpjax's upper end at or above pld-accounting's lower, its lower end at or below pld-accounting's "
        f"upper); brackets within 0.5% (or 1e-4 where epsilon < 0.02) on {snd['widths_ok']}; widest "
        f"{num(snd['max_width_rel'], 2)} relative. Speed set ({spd['configurations']} configurations: the "
        f"anchors and the first 20 random ones): first call at least {ratio(spd['min_first_ratio'])} "
        f"({spd['first_ratio_10x']} at 10x or more), steady state at least {ratio(spd['min_steady_ratio'])} "
        f"({spd['steady_ratio_100x']} at 100x or more).",
        table(["kind", "sigma", "t", "k", "E", "delta", "dpjax lower", "dpjax upper", "pld-accounting lower",
               "pld-accounting upper", "dpjax width", "pld-accounting first", "dpjax first", "first-call speed-up",
               "steady speed-up"], rows)])
    if speed_record:
        heads = [["Random allocation, steady call (speed set, one run)", "pld-accounting",
                  f"{ratio(spd['min_steady_ratio'])} or more"],
                 ["Random allocation, first call (speed set, one run)", "pld-accounting",
                  f"{ratio(spd['min_first_ratio'])} or more"]]
        return Rendered("Random allocation against pld-accounting: the speed set", body, "bench_allocation.py", heads)
    return Rendered("Random allocation against pld-accounting", body, "bench_allocation.py")


def _render_allocation_recheck(d: dict) -> Rendered:
    """``bench_allocation.py --which dpjax --reuse-pld``: dpjax's brackets against pld-accounting's
    bounds from an earlier record (soundness and width; no times)."""
    rows = _allocation_rows(d, lambda r: ["yes" if r["sound"] else "NO"], 6)
    snd = d["soundness"]
    sound = sum(1 for r in d["rows"] if r.get("sound"))
    body = "\n\n".join([
        "dpjax's certified bracket for DP-SGD under random allocation, recomputed, against the bounds "
        f"pld-accounting gave in the record{'s' if len(d['pld_reused_from']) > 1 else ''} "
        f"{', '.join('`' + x + '.json`' for x in d['pld_reused_from'])} (soundness and width only: the two "
        "sides did not run together, so no times are compared). " + d.get("note", ""),
        f"Sound on {sound} of {snd['configurations']} configurations; brackets within 0.5% (or 1e-4 where "
        f"epsilon < 0.02) on {snd['widths_ok']}; widest {num(snd['max_width_rel'], 2)} relative.",
        table(["kind", "sigma", "t", "k", "E", "delta", "dpjax lower", "dpjax upper", "pld-accounting lower",
               "pld-accounting upper", "dpjax width", "sound"], rows)])
    heads = [["Random allocation, soundness (every configuration, current code)", "pld-accounting",
              f"sound on {sound} of {snd['configurations']}"]]
    return Rendered("Random allocation: brackets against pld-accounting's bounds", body, "bench_allocation.py", heads)


SCHEME_NAMES = {"poisson": "Poisson (q = 1/b)", "random_allocation": "random allocation",
                "balls_in_bins": "balls-in-bins (C = I)", "none": "no amplification"}


def render_table_allocation(d: dict) -> Rendered:
    """``table_allocation.py``: epsilon and the calibrated noise under four batchings."""
    schemes = [s for s in SCHEME_NAMES if s in d["epsilon"][0]]
    eps_rows = [[r["epochs"], r["batches_per_epoch"], param(r["noise_multiplier"])] + [num(r[s], 4) for s in schemes]
                for r in d["epsilon"]]
    sig_rows = [[r["epochs"], r["batches_per_epoch"], param(r["target_epsilon"])] + [num(r[s], 4) for s in schemes]
                for r in d["noise_multiplier"]]
    names = [SCHEME_NAMES[s] for s in schemes]
    partial = "" if d.get("complete", True) else " (the rows the run completed within its time limit)"
    earlier = [provenance({"meta": m}) for m in d.get("earlier_runs", [])]
    resumed = ("" if not earlier else
               " Rows kept from earlier runs of the same grid (this run resumed them) were computed on: "
               + "; ".join(f"{p.machine or NOT_RECORDED}, {p.date or NOT_RECORDED}" for p in earlier) + ".")
    body = "\n\n".join([
        f"Certified epsilon at delta = {param(d['delta'])} (noise multiplier sigma, b batches per epoch, E epochs, "
        f"T = b E steps){partial}:{resumed}",
        table(["E", "b", "sigma"] + names, eps_rows),
        f"Smallest noise multiplier whose certified epsilon meets the target at delta = {param(d['delta'])}:",
        table(["E", "b", "target epsilon"] + names, sig_rows)])
    return Rendered("DP-SGD under four batchings", body, "table_allocation.py")


def render_sweep_profile(d: dict) -> Rendered:
    """``bench_sweep_profile.py``: the sweep's steady state split into the lower end and the
    bucket padding, against the single-call loop, and the default sweep's buckets."""
    labels = dict(sweep="sweep (default: brackets, buckets by cost)",
                  sweep_upper="sweep, upper ends only (with_lower=False)",
                  sweep_own_shapes="sweep, every configuration at its own sizes (max_padding=1)",
                  sweep_upper_own_shapes="sweep, upper ends only, own sizes",
                  loop="loop of dpsgd_epsilon (upper ends, the single call's grids)")
    rows = []
    for name, vals in d["times"].items():
        walls = sorted(v[0] for v in vals)
        shares = sorted(d["shares"][name])
        rows.append([labels.get(name, name), seconds(walls[len(walls) // 2]), num(shares[len(shares) // 2]),
                     d["programs"].get(name, "-")])
    buckets = [[b["n"], b["m"], b["n_freq"] if b["n_freq"] is not None else "all", b["members"],
                f"{b['chunk_run_s'] * 1e3 / b['chunk']:.1f} ms", num(b["modelled_cost_ms"])] for b in d["buckets"]]
    body = "\n\n".join([
        f"The broad distribution ({d['configs']} configurations), one process, {d['rounds']} rounds after a first "
        "pass of each variant; median wall time per pass, and its share of the default sweep's time in the same round:",
        table(["variant", "wall", "share of default", "programs"], rows),
        "The default sweep's buckets (static sizes: FFT length n, support capacity m, kept frequencies), "
        "the measured run time per configuration of one chunk, and the cost model's estimate of the bucket "
        f"(ms; at their own sizes the configurations model to {num(d['own_shapes_modelled_cost_ms'])} ms in all):",
        table(["n", "m", "kept frequencies", "members", "run per configuration", "modelled cost"], buckets)])
    return Rendered("Where a sweep's steady state goes", body, "bench_sweep_profile.py")


def render_session(d: dict) -> Rendered:
    body, heads = [], []
    sess = d.get("session") or {}
    if sess:
        rows = []
        for label, rec in sess.items():
            sm = rec["summary"]
            rows.append([label, sm["queries"], seconds(sm["dpjax_total_s"]), seconds(sm["dp_accounting_total_s"]),
                         ratio(sm["speedup"]), seconds(sm["import_dpjax_s"]), seconds(sm["import_dp_accounting_s"]),
                         ratio(sm.get("speedup_with_imports")), seconds(sm["dpjax_first_call_s"]),
                         seconds(sm["dpjax_median_call_s"]),
                         f"{100 * sm['dpjax_calls_after_first_under_100ms']:.0f}%",
                         seconds(sm["dp_accounting_median_call_s"])])
            short = "fresh process" if label.startswith("fresh") else "second process, warm store"
            heads.append([f"Notebook session of {sm['queries']} varied DP-SGD queries, {short}, calls",
                          "dp_accounting", ratio(sm["speedup"])])
            heads.append([f"Notebook session of {sm['queries']} varied DP-SGD queries, {short}, imports included",
                          "dp_accounting", ratio(sm.get("speedup_with_imports"))])
        body.append("A notebook session: varied DP-SGD queries drawn by a seeded generator, each answered by "
                    "`dpjax.dpsgd_epsilon` and by dp_accounting's `PLDAccountant` (interval 1e-4), interleaved, "
                    "in one fresh process on an empty program store, then in a second process on the store the "
                    "first left. Imports are timed apart (dpjax's includes loading its modules).")
        body.append(table(["process", "queries", "dpjax calls", "dp_accounting calls", "ratio (calls)",
                           "dpjax import", "dp_accounting import", "ratio (imports included)", "dpjax first call",
                           "dpjax median call", "dpjax calls after the first under 100 ms",
                           "dp_accounting median call"], rows))
    whole = d.get("whole_session")
    if whole:
        med = whole["median_s"]
        body.append(f"Each library's whole session alone (a fresh process that imports it and answers the same "
                    f"{whole['queries']} queries; numpy, which the query generator uses, imported before the "
                    f"clock starts), dpjax and dp_accounting alternating, median of {whole['repeats']} each "
                    f"(dpjax's first on an empty program store: {seconds(whole['dpjax_first_run_empty_store_s'])}):")
        body.append(table(["library", "whole session (median)", "whole process (median)"],
                          [[k, seconds(v), seconds(whole["median_process_wall_s"][k])] for k, v in med.items()]))
        heads.append([f"Notebook session of {whole['queries']} varied DP-SGD queries, whole session alone "
                      f"(import and calls)", "dp_accounting", ratio(whole["speedup"])])
    cli = d.get("cli")
    if cli:
        med = cli["median_s"]
        body.append(f"The CLI's one-shot query, whole processes (imports included), median of the runs: "
                    f"`{cli['command']}`.")
        body.append(table(["command", "median"], [[k, seconds(v)] for k, v in med.items()]))
        base = med.get("dp_accounting script")
        for k in ("dpjax CLI, empty program store", "dpjax CLI, warm program store"):
            if base and med.get(k):
                heads.append([f"One-shot epsilon query, {k}", "dp_accounting script", ratio(base / med[k])])
    sw = d.get("sweep")
    if sw:
        body.append(f"The broad sweep distribution ({sw['distribution']}), {sw['configs']} configurations.")
        body.append(table(["run", "seconds", "ratio"], [[r["row"], seconds(r["seconds"]), ratio(r["speedup"])]
                                                        for r in sw["rows"]]))
        for r in sw["rows"][1:]:
            heads.append([f"Sweep of {sw['configs']} configurations (broad), {r['row']}", "dp_accounting loop",
                          ratio(r["speedup"])])
    return Rendered("A user's first hour: session, one-shot CLI, sweep", "\n\n".join(body), "bench_session.py", heads)


def render_programs(d: dict) -> Rendered:
    rows = [[r["family"], r["case"], r.get("stage", ""), r.get("n", "-"), r["hlo_instructions"], seconds(r["lower_s"]),
             seconds(r["compile_s"])] for r in d["rows"]]
    sm = d["summary"]
    body = ("Every XLA program a PLD query or sweep compiles, lowered and compiled from scratch (program store "
            "off), one at a time: HLO instructions after XLA's optimizations, tracing and lowering time, compile "
            "time (median of the repeats). Single queries, batches, curves, calibration and the derivatives of "
            f"traced calls compile nothing. {sm['programs']} sweep programs: at most {num(sm['max_hlo_instructions'])} "
            f"instructions and {seconds(sm['max_compile_s'])} of compile; {sm['over_half_second']} over 0.5 s.\n\n"
            + table(["family", "case", "stage", "n", "HLO instructions", "trace and lower", "compile"], rows))
    heads = [["Slowest compile of any sweep program", "0.5 s budget", seconds(sm["max_compile_s"])]]
    return Rendered("Every compiled program: size and compile time", body, "bench_programs.py", heads)


def render_train_dpftrl(d: dict) -> Rendered:
    """``bench_train_dpftrl.py``: test accuracy of DP-SGD, the hand BLT and the optimized matrix."""
    st, m = d["settings"], d["matrix"]

    def acc(a: dict) -> str:
        return f"{num(a['mean'], 3)} +- {num(a['std'], 2)} [{num(a['min'], 3)}, {num(a['max'], 3)}]"

    rows = [[name, num(r["noise_multiplier"], 4), param(r["epsilon"]), num(r["delta"], 4),
             num(r["truncation_delta"], 2), num(r["prefix_sum_rmse"], 4), acc(r["test_accuracy"])]
            for name, r in d["runs"].items()]
    rows.append(["non-private (same clipping, no noise)", "-", "-", "-", "-", "-", acc(d["non_private"]["test_accuracy"])])
    names = list(d["runs"]) + ["non-private"]
    lr_rows = [[param(r["learning_rate"])] + [acc(r["test_accuracy"][k]) for k in names] for r in d["learning_rates"]]
    body = "\n\n".join([
        f"`examples/train_dpftrl.py --matrix` on {st['dataset']} ({st['num_train']} training, {st['num_test']} test "
        f"examples), {st['model']}, plain SGD at learning rate {param(st['learning_rate'])}, clip norm "
        f"{param(st['clip_norm'])}; balls-in-bins batches, b = {st['batches_per_epoch']}, E = {st['epochs']}, batch "
        f"shape B = {st['batch_size']}; every run certified at (epsilon, delta) = ({param(st['target_epsilon'])}, "
        f"{param(st['target_delta'])}): the certificate's delta plus the truncation term. The optimized matrix: "
        f"`{m['optimize_command']}` (a {m['family'].get('num_buffers', '')}-buffer {m['family']['family']}, certified "
        f"sigma {num(m['noise_multiplier'], 6)}). Test accuracy over {st['seeds']} seeds (schedule, initialization, "
        "noise): mean +- sample standard deviation [min, max]; the three private runs of a seed share its batches "
        "and its Gaussian draws.",
        table(["run", "sigma", "epsilon", "delta (certified)", "of which truncation", "prefix-sum RMSE",
               "test accuracy"], rows),
        "The same runs at each learning rate tried (one rate for all runs; the first is the table above and the "
        "example's default, chosen as the best of these for every private run on this test set, so the accuracies "
        "are not held-out estimates; the ranking of the three runs is the same at every rate):",
        table(["learning rate"] + names, lr_rows)])
    return Rendered("Training with the optimized matrix: digits, DP-SGD, hand BLT, optimized BLT", body,
                    "bench_train_dpftrl.py")


def _busy_text(rows: list[dict]) -> str:
    """What the cores-busy column says about one process against several, from the rows."""
    def busy(r):
        return r["process0_cpu_seconds"] / r["seconds"]

    one = [busy(r) for r in rows if r["processes"] == 1 and r["devices"] > 1 and r.get("process0_cpu_seconds")]
    many = [busy(r) for r in rows if r["processes"] > 1 and r.get("process0_cpu_seconds")]
    if not one or not many:
        return ""
    return (f"One process kept at most {num(max(one), 2)} cores busy whatever its number of forced host devices; "
            f"with several processes each kept {num(min(many), 2)} busy. ")


def render_scaling(d: dict) -> Rendered:
    """``bench_scaling.py``: Monte Carlo samples per second on forced host devices and processes."""
    rows = [[r["layout"], r["processes"], r["devices"], num(r["samples_per_second"]), seconds(r["seconds"]),
             ratio(r["speedup"]), num(r["efficiency"], 2),
             num(r["process0_cpu_seconds"] / r["seconds"], 2) if r.get("process0_cpu_seconds") is not None else "-",
             num(r["load_average_before"], 2) if r.get("load_average_before") is not None else "-"]
            for r in d["rows"]]
    cores = d.get("cores")
    body = "\n\n".join([
        f"The plain balls-in-bins Monte Carlo sums (`dpjax.montecarlo.sharded_monte_carlo_sums`, b = "
        f"{d['batches_per_epoch']}, E = {d['epochs']}) of {num(d['samples'])} samples per call over every device of "
        f"every process; the median of {d['repeats']} calls after a warm-up call, each layout in fresh processes. "
        "Efficiency: the speed-up over one device divided by the number of devices. Cores busy: process 0's CPU "
        "time per call over the call's wall time. Load: the machine's one-minute load average before the layout "
        "ran (other work took cores from it). "
        + (f"The machine has {cores} cores: forced host devices beyond {cores} take turns on them, so their "
           "efficiency measures what splitting the sample costs, not a speed-up. " if cores else "")
        + _busy_text(d["rows"])
        + ("The sums were the same bits on every layout." if d.get("same_bits_on_every_layout")
           else "The sums were NOT the same bits on every layout."),
        table(["layout", "processes", "devices", "samples/s", "per call", "speed-up", "efficiency",
               "cores busy (process 0)", "load"], rows)])
    return Rendered("Monte Carlo over several devices and processes", body, "bench_scaling.py")

def render_bminsep(d: dict) -> Rendered:
    rows = []
    for r in d["results"]:
        jp, dj = r["jax_privacy"], r["dpjax"]
        rows.append([r["n"], r["min_sep"], param(r["sampling_prob"]), r["bands"],
                     num(jp["num_samples_per_direction"]), num(jp["samples_per_s_one_direction"]),
                     num(jp["samples_per_s_both_directions"]), num(dj["num_samples"]),
                     num(dj["samples_per_s_both_directions"]), seconds(dj["compile_s_approx"]),
                     ratio(r["ratio_both_directions"]), num(r["z_remove"], 2)])
    ratios = [r["ratio_both_directions"] for r in d["results"]]
    body = "\n\n".join([
        f"b-min-sep sampling (warm start), Toeplitz C with first column {d['matrix_first_column']}, sigma "
        f"{param(d['noise_multiplier'])}, epsilon {param(d['epsilon'])}. Samples per second: jax_privacy's "
        "`get_privacy_loss_sample` (NumPy; per direction, and per sample of both directions from its two calls) "
        "against `BMinSep.estimate` (steady state, both directions and the delta sums from each draw). z: the "
        "difference of the two remove-direction deltas in combined standard errors.",
        table(["n", "min_sep", "p", "bands", "jax_privacy samples", "jax_privacy samples/s (one direction)",
               "jax_privacy samples/s (both)", "dpjax samples", "dpjax samples/s (both)", "dpjax compile",
               "ratio (both)", "z"], rows)])
    heads = [["Monte Carlo b-min-sep, samples per second", "jax_privacy",
              f"{ratio(min(ratios))} - {ratio(max(ratios))}"]]
    return Rendered("Monte Carlo b-min-sep against jax_privacy", body, "bench_bminsep.py", heads)


#: file name -> renderer, in the order of the page.  Several files of one script may share one.
RENDERERS: dict[str, Callable[[dict], Rendered]] = {
    "mutation_check.json": render_mutation_check,
    "table_amplified_mf.json": render_amplified_mf,
    "bench_pld.json": render_pld,
    "bench_first_call.json": render_first_call,
    "bench_session.json": render_session,
    "bench_programs.json": render_programs,
    "bench_group.json": render_group,
    "bench_calibration.json": render_calibration,
    "bench_montecarlo.json": render_montecarlo,
    "bench_bminsep.json": render_bminsep,
    "bench_optimize_quick.json": render_optimize,
    "bench_optimize_grid17.json": render_optimize,
    "bench_optimize_grid20.json": render_optimize,
    "bench_optimize_grid20_anchors.json": render_optimize,
    "bench_optimize_64x128x20.json": render_optimize,
    "bench_sweep_broad.json": render_sweep,
    "bench_sweep_narrow.json": render_sweep,
    "bench_sweep_narrow_side_by_side.json": render_sweep,
    "bench_sweep_profile.json": render_sweep_profile,
    "bench_allocation.json": render_allocation,
    "bench_allocation_speed_2core.json": lambda d: render_allocation(d, speed_record=True),
    "bench_allocation_recheck.json": render_allocation,
    "table_allocation.json": render_table_allocation,
    "bench_curve.json": render_curve,
    "bench_plancherel.json": render_plancherel,
    "bench_interop.json": render_interop,
    "fig5_samples_full_blt.json": render_fig5,
    "fig5_samples_toeplitz.json": render_fig5,
    "fig5_samples_toeplitz_vr.json": render_fig5,
    "certify_n2048.json": render_certify_n2048,
    "bench_example.json": render_example,
    "bench_example_memory.json": render_example_memory,
    "bench_traced.json": render_traced,
    "train_dpftrl.json": render_train_dpftrl,
    "bench_scaling.json": render_scaling,
}

#: Result files kept as records but not tabulated here (name pattern -> why).
NOT_TABULATED = {
    "table_amplified_mf.*.json": "one group or row of table_amplified_mf.json, which is tabulated whole",
    "bench_first_call_*.json": "a side-by-side comparison of two versions, or a repeat, of the first-call benchmark",
    "bench_pld_ab_*.json": "the PLD steady state of two versions in alternating fresh processes",
    "bench_calibration_first_call.json": "a side-by-side comparison of two versions of the calibration's first call",
    "bench_optimize_quick_base.json": "the optimization benchmark on a previous version (side by side)",
    "bench_pld_side_by_side_*.json": "the PLD benchmark on two versions, one after the other in one session (one file per version)",
    "bench_optimize_side_by_side_*.json": "the quick optimization benchmark on two versions, alternating in one session (one file per version and round)",
    "bench_optimize_cpu.json": "a CPU-time profile of the optimization loop",
    "bench_optimize_ab_*.json": "the optimization's time per step on two versions in alternating fresh processes",
    "certify_n2048_verify_2p20.json": "certify_n2048 with 2^20 verification draws per certificate (plus 2^18 calibration draws)",
    "certify_n2048_matrices.json": "the fixed inputs (optimized first columns) of certify_n2048.json",
    "bench_sweep_cost.json": "the fit of the sweep's run-cost model (dpjax.pld.BucketPolicy) to measured program times",
    "profile_sweep*.json": "an XLA-op profile of the sweep's programs (time per part)",
    "bench_optimize_memory.json": "a peak-memory measurement of the optimization loop",
    "bench_optimize_profile.json": "a per-phase profile of one optimization step",
    "optimize_resample.json": "a study of sample reuse across optimization steps",
    "recheck_optimize.json": "a re-check of a certified result with an independent sampler",
    "recheck_table.json": "a re-check of certified table rows with an independent sampler",
    "train_dpftrl_matrix.json": "the optimized matrix (an OptimizationResult) that train_dpftrl.json trains with",
}


def _flat(row: dict) -> dict:
    """One level of nested dicts flattened to ``a.b``; lists and deeper values left out."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, (str, int, float, bool)) or v2 is None:
                    out[f"{k}.{k2}"] = v2
        elif isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
    return out


def render_generic(d: dict, name: str) -> Rendered:
    """A table of ``rows`` (flat values, one nesting level flattened), or of the top-level values."""
    rows = d.get("rows")
    title = str(d.get("benchmark") or pathlib.Path(name).stem)
    note = d.get("note") or d.get("description") or ""
    if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
        flat = [_flat(r) for r in rows]
        columns: list[str] = []
        for r in flat:
            columns += [k for k in r if k not in columns]
        body = table(columns, [[r.get(c) for c in columns] for r in flat])
    else:
        scalars = {k: v for k, v in _flat({k: v for k, v in d.items() if k != "meta"}).items()
                   if k not in ("note", "description", "benchmark")}
        body = table(["field", "value"], [[k, v] for k, v in scalars.items()])
    body = "\n\n".join(x for x in [str(note).strip(), body] if x)
    script = (str(d["benchmark"]) + ".py") if d.get("benchmark") else pathlib.Path(name).stem + ".py"
    return Rendered(title, body, script)


def _not_tabulated(name: str) -> str | None:
    for pattern, why in NOT_TABULATED.items():
        if fnmatch.fnmatchcase(name, pattern):
            return why
    return None


# ------------------------------------------------------------------------------------------
# The page.

HEADER = """# Benchmarks

Generated by `python benchmarks/render_docs.py` from `benchmarks/results/*.json`; do not edit by
hand (the test suite checks that this page matches the result files). Each benchmark runs dpjax
and the reference library side by side in one run and writes its numbers there; each table
below names the machine, the date and the command of its run. Times are wall-clock. Where the
machine was shared with other work the absolute times are inflated: compare a row with the
reference measured in the same run (the ratios), not across tables. "Cold" and "first" include
the process start, the imports and XLA compilation; "steady" is a repeated call after warm-up.
"""


def result_files(results: pathlib.Path = RESULTS) -> list[str]:
    """The ``*.json`` names in ``results``: those git tracks when ``results`` is this repository's
    (``.gitignore`` keeps a benchmark run's output out of git until it is added on purpose, so
    the page is the same in a working copy and in a fresh clone), else every one there."""
    names = sorted(p.name for p in results.glob("*.json"))
    if results.resolve() != RESULTS.resolve():
        return names
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--", "*.json"], cwd=results, capture_output=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return names
    if proc.returncode != 0:
        return names
    tracked = {pathlib.PurePosixPath(p).name for p in proc.stdout.decode().split("\0") if p}
    return [n for n in names if n in tracked]


def render(results: pathlib.Path = RESULTS) -> str:
    """The whole page for the result files in ``results`` (deterministic)."""
    return _render(results)[0]


def _render(results: pathlib.Path) -> tuple[str, list[list[str]]]:
    files = result_files(results)
    order = [f for f in RENDERERS if f in files]
    skipped: dict[str, list[str]] = {}
    for f in files:
        if f not in RENDERERS and _not_tabulated(f):
            skipped.setdefault(_not_tabulated(f), []).append(f)
    generic = [f for f in files if f not in RENDERERS and not _not_tabulated(f)]
    sections, headlines, titles = [], [], set()
    for name in order + generic:
        data = json.loads((results / name).read_text())
        out = RENDERERS[name](data) if name in RENDERERS else render_generic(data, name)
        title = out.title or pathlib.Path(name).stem
        if title in titles:  # headings must be unique (they are link targets)
            title = f"{title} ({pathlib.Path(name).stem})"
        titles.add(title)
        text = [f"## {title}", f"Source: `benchmarks/results/{name}`, written by `benchmarks/{out.script}`."]
        if not out.own_provenance:
            text.append(provenance(data).text(out.script))
        text.append(out.body)
        sections.append("\n\n".join(t for t in text if t))
        headlines += [[h[0], h[1], h[2], f"[{title}](#{_anchor(title)})"] for h in out.headlines]
    page = [HEADER.strip()]
    if headlines:
        page.append("## Headline ratios\n\nSpeed-ups of dpjax over the reference named in each row (higher is better "
                    "for dpjax), and the first-call targets met, from the tables below.\n\n"
                    + table(["what", "against", "ratio", "table"], headlines))
    page += sections
    if skipped:
        page.append("## Other records\n\nKept in `benchmarks/results/` and not tabulated here:\n\n"
                    + "\n".join(f"- {', '.join(f'`{f}`' for f in names)}: {why}" for why, names in skipped.items()))
    return "\n\n".join(page).rstrip() + "\n", headlines


def _anchor(title: str) -> str:
    """The heading id Python-Markdown's ``toc`` extension gives ``title`` (its ``slugify``)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if docs/benchmarks.md differs from a fresh render")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if (DOC.read_text() if DOC.exists() else "") != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python benchmarks/render_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
