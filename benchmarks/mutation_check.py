"""Mutation check of the default test tier on soundness-critical code.

Each entry of :data:`MUTATIONS` is a one-line change to ``dpjax/`` that would make a reported
epsilon or delta smaller than the truth, or a certificate's claim stronger than it is.  For each
one this script

1. clones the repository into a scratch directory (``git clone -q``) at the ``HEAD`` commit
   recorded when the check starts (the working tree's uncommitted changes are not part of the
   check),
2. replaces the one line (found by its stripped text, which must occur exactly once in the file
   unless an occurrence index is given; the indentation is kept) and checks that the file
   changed and still compiles,
3. runs the default tier on the mutation's targets::

       python -m pytest -q -x -m "not slow" -p no:cacheprovider <targets>

   in the copy, with ``PYTHONPATH=<copy>`` and ``DPJAX_COMPILATION_CACHE=0``, under a timeout,
4. records the outcome: ``caught`` (pytest exit code 1: a test failed), ``not caught`` (exit
   code 0), ``timeout``, or ``error`` (any other exit code, e.g. a collection error; the counts
   put timeouts with the errors), with the first failing test id, the wall time and, where not
   caught, the tail of the output,

and deletes the copy.  Before the mutations, the unmutated copy runs the union of all targets
(the baseline): it must pass, otherwise the check is void.

Usage::

    python benchmarks/mutation_check.py                       # every mutation
    python benchmarks/mutation_check.py --only epochs-truncated,rdp-order-denominator --out /tmp/some.json
    python benchmarks/mutation_check.py --out /tmp/mutation_check.json

The results go to ``benchmarks/results/mutation_check.json`` (``--out``): the commit, the date,
the pytest command, the baseline, one record per mutation and the counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _meta import run_metadata  # noqa: E402

PYTEST_ARGS = ["-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider"]
DEFAULT_TIMEOUT_S = 900
OUTPUT_TAIL_CHARS = 3000


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One single-line change.

    Attributes:
      id: short name.
      file: path relative to the repository root.
      original: the line's text without its indentation (stripped).
      replacement: the new text (indentation is copied from the original line).
      description: what the change does to a soundness claim, in one sentence.
      targets: default-tier test files or node ids expected to catch it.
      occurrence: which occurrence of ``original`` (0-based) when it occurs more than once.
    """

    id: str
    file: str
    original: str
    replacement: str
    description: str
    targets: tuple
    occurrence: int | None = None


MUTATIONS = [
    # --- epochs to steps
    Mutation(
        "epochs-truncated", "dpjax/_base/names.py",
        "return max(int(math.ceil(x)), 1)",
        "return max(int(x), 1)",
        "A partial last epoch is truncated instead of counted: the guarantee covers fewer steps "
        "than training takes.",
        ("tests/pld/test_epochs_rule.py",)),
    # --- PLD discretization (connect-the-dots split, +inf atom)
    Mutation(
        "grid-split-rounds-down", "dpjax/pld/grid/program.py",
        "a = xp.clip(a, 0.0, p_bin)",
        "a = p_bin",
        "The pessimistic discretization puts each bin's whole P-mass on its lower grid point "
        "(every loss rounded down): the 'upper' PMF no longer dominates the mechanism.",
        ("tests/pld/test_pld_gaussian.py",)),
    Mutation(
        "grid-top-mass-dropped", "dpjax/pld/grid/program.py",
        "return xp.concatenate(rows, axis=0), c.p_gt[..., -1] + 2 * m * FLUSH",
        "return xp.concatenate(rows, axis=0), 2 * m * FLUSH",
        "The P-mass above the last grid point is not put on the +inf atom: it is lost from "
        "every delta.",
        ("tests/pld/test_pld_core.py",)),
    Mutation(
        "host-grid-split-rounds-down", "dpjax/pld/grid/program.py",
        "np.clip(a, 0.0, p_bin, out=a)",
        "a = p_bin.copy()",
        "The host program's pessimistic PMF (the upper curve alone) puts each bin's whole P-mass on "
        "its lower grid point: it no longer dominates the mechanism.",
        ("tests/pld/test_pld_gaussian.py", "tests/pld/grid/test_pld_program.py", "tests/pld/test_pld_many_distinct.py")),
    Mutation(
        "host-grid-top-mass-dropped", "dpjax/pld/grid/program.py",
        "return pmf, p_gt_last + 2 * m * FLUSH",
        "return pmf, 2 * m * FLUSH",
        "The host program's pessimistic PMF loses the P-mass above the last grid point instead of "
        "putting it on the +inf atom.",
        ("tests/pld/test_pld_core.py", "tests/pld/grid/test_pld_program.py", "tests/pld/test_pld_many_distinct.py")),
    # --- FFT composition: wrap-around, +inf atom, frequency truncation, round-off floor
    Mutation(
        "wrap-tail-above-dropped", "dpjax/pld/grid/program.py",
        "const = xp.where(is_up, p_inf + above + roundoff, p_inf - below - roundoff)",
        "const = xp.where(is_up, p_inf + roundoff, p_inf - below - roundoff)",
        "The Chernoff bound on mass wrapped around from above the window is not added to the "
        "upper delta curve.",
        ("tests/pld/test_pld_gaussian.py", "tests/pld/test_pld_references.py", "tests/pld/test_pld_tilted_tail.py",
         "tests/pld/grid/test_pld_program.py")),
    Mutation(
        "fixed-grid-tail-above-dropped", "dpjax/pld/grid/convert.py",
        "const = pld.p_inf + pld.tail_above + pld.roundoff",
        "const = pld.p_inf + pld.roundoff",
        "The fixed grid's upper delta curve leaves out the mass wrapped around from above its "
        "window (large when the grid is read away from its planning point).",
        ("tests/pld/grid/test_fixed_grid_looseness.py", "tests/pld/grid/test_pld_fixed_grid.py",
         "tests/pld/grid/test_convert.py")),
    Mutation(
        "inf-atom-not-composed", "dpjax/pld/grid/program.py",
        'log_fin = carry["log_fin"] + xp.where(live, c * xp.log1p(-p_inf_up), 0.0) if "up" in spec.kinds \\',
        'log_fin = carry["log_fin"] + xp.where(live, xp.log1p(-p_inf_up), 0.0) if "up" in spec.kinds \\',
        "The +inf atom of a mechanism composed c times is counted once instead of "
        "1 - (1 - p_inf)^c: the composed delta misses mass at infinite loss.",
        ("tests/pld/test_pld_gaussian.py", "tests/pld/grid/test_pld_program.py")),
    Mutation(
        "freq-truncation-half-power", "dpjax/pld/grid/program.py",
        'log_hi = xp.where(inp.nf < half, 0.5 * xp.log(xp.maximum(top, 1e-300)), 0.0)',
        'log_hi = xp.where(inp.nf < half, xp.log(xp.maximum(top, 1e-300)), 0.0)',
        "The bound on the dropped frequencies uses |F|^2 instead of |F| per coefficient, "
        "so the allowance for frequency truncation is too small.",
        ("tests/pld/test_pld_truncation.py", "tests/pld/grid/test_pld_program.py")),
    Mutation(
        "noise-floor-dropped", "dpjax/pld/grid/program.py",
        "rows.append(xp.maximum(r[sl], 0.0) + nu[sl, None])",
        "rows.append(xp.maximum(r[sl], 0.0))",
        "The FFT round-off allowance is no longer added to every bin of the pessimistic PMF.",
        ("tests/pld/test_pld_small_delta.py",)),
    # --- conversion to (epsilon, delta)
    Mutation(
        "delta-segment-above", "dpjax/pld/grid/program.py",
        "j = xp.clip(xp.floor((eps - y0) / dx).astype(np.int64), -1, n - 1)",
        "j = xp.clip(xp.ceil((eps - y0) / dx).astype(np.int64), -1, n - 1)",
        "delta(eps) is read on the segment above eps: the grid point just above eps drops out "
        "of the hockey-stick sum.",
        ("tests/pld/test_pld_gaussian.py",)),
    Mutation(
        "eps-grid-point-below", "dpjax/pld/grid/program.py",
        "eps = xp.where((ratio > 0) & (B > 0), xp.clip(eps, lo_end, hi_end), hi_end)",
        "eps = xp.where((ratio > 0) & (B > 0), lo_end, hi_end)",
        "epsilon(delta) is the grid point below the crossing instead of the crossing: up to one "
        "grid spacing too small.",
        ("tests/pld/test_pld_gaussian.py",)),
    # --- exact Gaussian curve
    Mutation(
        "gaussian-curve-sign", "dpjax/numerics/exact.py",
        "log_a, log_phi_b = py_log_ndtr(x_a), py_log_ndtr(x_b)",
        "log_a, log_phi_b = py_log_ndtr(x_a - mu), py_log_ndtr(x_b)",
        "Sign slip in the first term of the exact Gaussian curve (host epsilon search): the "
        "oracle's delta collapses.",
        ("tests/pld/grid/test_pld_program.py", "tests/numerics/test_exact.py")),
    Mutation(
        "gaussian-epsilon-margin-sign", "dpjax/numerics/exact.py",
        "return ((math.isfinite(error) and log_delta <= log_target - max(_LOG_DELTA_MARGIN, error))",
        "return ((math.isfinite(error) and log_delta <= log_target + max(_LOG_DELTA_MARGIN, error))",
        "The exact Gaussian epsilon's rounding margin is applied on the unsafe side: the returned "
        "epsilon may have delta above the target.",
        ("tests/pld/test_pld_small_delta.py", "tests/numerics/test_exact.py")),
    Mutation(
        "gaussian-large-mu-rounding-side", "dpjax/numerics/exact.py",
        "x = -(w - _W_ROUNDING * (abs(ratio) + 0.5 * mu))",
        "x = -(w + _W_ROUNDING * (abs(ratio) + 0.5 * mu))",
        "The large-mu bound Phi(-w) moves w up by its rounding margin instead of down (host "
        "path): delta below the bound's, epsilon understated at mu ~ 1e10.",
        ("tests/numerics/test_exact.py",)),
    Mutation(
        "gaussian-compiled-margin-sign", "dpjax/numerics/exact.py",
        "return ((jnp.isfinite(error) & (log_delta <= log_target - jnp.maximum(_LOG_DELTA_MARGIN, error)))",
        "return ((jnp.isfinite(error) & (log_delta <= log_target + jnp.maximum(_LOG_DELTA_MARGIN, error)))",
        "The compiled exact Gaussian epsilon search applies its rounding margin on the unsafe "
        "side: jitted epsilons with delta above the target.",
        ("tests/numerics/test_exact.py",)),
    Mutation(
        "gaussian-mu-squares-underflow", "dpjax/pld/grid/engine.py",
        "if not mu2 < _SQUARES_UNDERFLOW:",
        "if True:",
        "mu = sqrt(sum c r^2) without the rescaling where r^2 underflows: noise multipliers above "
        "~1e154 get mu 0 and delta 0.",
        ("tests/pld/test_huge_noise.py",)),
    Mutation(
        "allocation-closed-form-bare-margin", "dpjax/pld/allocation/accountant.py",
        "_, upper = host_gaussian_delta_and_upper(eps, mu)",
        "upper = np.minimum(np.asarray(gaussian_delta(eps, mu), np.float64) * (1 + 1e-9), 1.0)",
        "The allocation accountant's closed-form delta upper end keeps a bare 1e-9 margin: below "
        "the truth at small mu and deep tails.",
        ("tests/pld/allocation/test_allocation.py",)),
    Mutation(
        "dominating-cap-bare-margin", "dpjax/pld/accountant.py",
        "gauss = (np_gaussian_delta_upper(eps, mu_dom, _ROUNDING)",
        "gauss = (np.minimum(np.exp(np_gaussian_log_delta(eps, mu_dom)) * (1.0 + _ROUNDING), 1.0)",
        "The dominating Gaussian's delta cap keeps a bare 1e-9 margin: below the truth at small mu "
        "and deep tails.",
        ("tests/pld/test_pld_caps.py",)),
    Mutation(
        "mixture-bare-margin", "dpjax/pld/fallback.py",
        "value = plain if raised <= plain * (1.0 + _ROUNDING / 2) else raised",
        "value = plain",
        "The binomial-mixture fallback keeps a bare 1e-9 margin on its closed-form terms: below "
        "the truth at small mu and deep tails.",
        ("tests/pld/test_pld_fallback.py",)),
    Mutation(
        "closed-form-delta-underflow-zero", "dpjax/numerics/exact.py",
        "return np.where(np.asarray(mu, np.float64) > 0, np.maximum(upper, SMALLEST_DELTA), upper)",
        "return upper",
        "The closed forms' delta upper ends are 0 where delta is below every double: pure DP "
        "claimed for Gaussian noise.",
        ("tests/pld/test_pld_small_delta.py",)),
    Mutation(
        "callback-flushes-subnormals", "dpjax/_base/x64.py",
        "lib, default = _c_library() if flushes_subnormals() else (None, None)",
        "lib, default = None, None",
        "Host numerics run in a thread's flush-to-zero mode (a host callback's): a certified "
        "delta below 2.2e-308 reads 0, pure DP claimed.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "traced-headline-rounded-to-nearest", "dpjax/_base/traced.py",
        "return round_up(res, dtype)",
        "return np.asarray(res, dtype)",
        "The headline functions' float64 answers reach float32 callers rounded to nearest: up to "
        "6e-8 relative below the certified value.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "float32-upper-bound-rounded-to-nearest", "dpjax/_base/x64.py",
        "wrong = near.astype(jnp.float64) < value if up else near.astype(jnp.float64) > value",
        "wrong = near.astype(jnp.float64) < value if not up else near.astype(jnp.float64) > value",
        "Traced upper bounds (and lower bounds) handed to float32 code on the wrong side of "
        "their float64 value.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "float32-upper-bound-below-smallest-normal", "dpjax/_base/x64.py",
        "return jnp.where(sub, jnp.float32(tiny if up else -tiny), moved)",
        "return moved",
        "A traced upper bound between 0 and float32's smallest normal is flushed by XLA and "
        "reaches float32 code below its float64 value.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "float32-record-fields-rounded-to-nearest", "dpjax/_base/x64.py",
        "return rounding.get(name, \"nearest\")",
        "return \"nearest\"",
        "A calibration's noise multiplier (and an epsilon report's epsilon) reaches float32 code "
        "rounded to nearest: up to 6e-8 relative below the certified value.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "float32-noise-multiplier-root-to-nearest", "dpjax/numerics/root.py",
        'UPPER_ROOT_ROUNDING = {"root": "up", "lower": "down", "upper": "up"}',
        'UPPER_ROOT_ROUNDING = {"root": "nearest", "lower": "down", "upper": "up"}',
        "A calibrated noise multiplier's root reaches float32 code rounded to nearest: a sigma "
        "up to 6e-8 relative below the calibrated one.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "float32-epsilon-report-to-nearest", "dpjax/pld/grid/fixed_grid.py",
        'return {"epsilon": "up", "epsilon_lower_estimate": "down"} if with_report else "up"',
        'return "up"',
        "A fixed grid's EpsilonReport reaches float32 code with its epsilon rounded to nearest.",
        ("tests/_base/test_x64.py",)),
    Mutation(
        "gaussian-rounding-bound-ignored", "dpjax/numerics/exact.py",
        "return ((math.isfinite(error) and log_delta <= log_target - max(_LOG_DELTA_MARGIN, error))",
        "return ((log_delta <= log_target - _LOG_DELTA_MARGIN)",
        "The exact Gaussian epsilon's search ignores the bound on the closed form's rounding "
        "error (host path): small-mu and deep-tail epsilons with delta above the target.",
        ("tests/numerics/test_exact.py",)),
    # --- RDP
    Mutation(
        "rdp-order-denominator", "dpjax/numerics/rdp.py",
        "return log_a / (alpha - 1.0)",
        "return log_a / alpha",
        "The per-step RDP is log(A_alpha) / alpha instead of / (alpha - 1): too small at every order.",
        ("tests/baselines/test_baselines_rdp.py",)),
    Mutation(
        "rdp-zero-eps-test", "dpjax/numerics/rdp.py",
        "eps = jnp.where(delta**2 + jnp.expm1(-rdp) > 0, 0.0, eps)",
        "eps = jnp.where(delta + jnp.expm1(-rdp) > 0, 0.0, eps)",
        "The Bretagnolle-Huber shortcut certifies epsilon = 0 when delta >= 1 - exp(-rdp) "
        "instead of delta^2 >= 1 - exp(-rdp).",
        ("tests/baselines/test_baselines_rdp.py", "tests/pld/test_pld_fallback.py", "tests/baselines/test_baselines_group.py")),
    Mutation(
        "rdp-standard-conversion", "dpjax/numerics/rdp.py",
        "eps = rdp - jnp.log(delta) / (orders - 1.0)",
        "eps = rdp - jnp.log(delta) / orders",
        "Mironov's conversion divides log(1/delta) by alpha instead of alpha - 1.",
        ("tests/baselines/test_baselines_rdp.py",)),
    # --- fallback bounds
    Mutation(
        "support-bound-ignores-count", "dpjax/pld/fallback.py",
        "total += float(np.sum(m * np.asarray(count, np.float64)))",
        "total += float(np.sum(m))",
        "The pure-DP composition bound adds one mechanism's largest loss instead of count times it.",
        ("tests/pld/test_pld_fallback.py",)),
    Mutation(
        "mixture-bound-off-by-one", "dpjax/pld/fallback.py",
        "prev_sf = np.r_[1.0, sf[:-1]]",
        "prev_sf = sf",
        "The binomial mixture bound weights each Gaussian increment by P(K > k_j) instead of "
        "P(K > k_{j-1}): the mass of every mixture point is shifted down.",
        ("tests/pld/test_pld_fallback.py",)),
    # --- accountant: directions, caps, lower ends
    Mutation(
        "directions-min", "dpjax/pld/grid/engine.py",
        "upper = np.max([r.upper for r in dir_reports], axis=0)",
        "upper = np.min([r.upper for r in dir_reports], axis=0)",
        "The add/remove guarantee takes the smaller of the two directions' epsilons.",
        ("tests/pld/test_pld_references.py",)),
    Mutation(
        "fallback-directions-min", "dpjax/pld/accountant.py",
        "upper = np.max([r.upper for r in out], axis=0)",
        "upper = np.min([r.upper for r in out], axis=0)",
        "Where the grid failed, the fallback answer takes the smaller direction.",
        ("tests/pld/test_pld_fallback.py", "tests/pld/test_pld_small_qt.py", "tests/pld/test_monotonicity_properties.py")),
    Mutation(
        "one-step-lower-drops-q", "dpjax/pld/accountant.py",
        "rows.append(np.log(q) + np_gaussian_log_delta(shifted, mu))",
        "rows.append(np_gaussian_log_delta(shifted, mu))",
        "The closed-form one-step lower end forgets the factor q of amplification: the certified "
        "lower end of epsilon is too high.",
        ("tests/pld/test_pld_caps.py",)),
    Mutation(
        "dominating-mixture-min", "dpjax/pld/grid/engine.py",
        's = max((si for si, pi in zip(static["sensitivities"], static["probabilities"]) if pi > 0), default=0.0)',
        's = min((si for si, pi in zip(static["sensitivities"], static["probabilities"]) if pi > 0), default=0.0)',
        "The Gaussian said to dominate a mixture of Gaussians uses its smallest sensitivity: the "
        "cap it imposes is not an upper bound.",
        ("tests/test_group_mog.py", "tests/interop/test_interop_dp_accounting.py")),
    # --- group privacy mixtures
    Mutation(
        "fixed-batch-sensitivity", "dpjax/pld/mog.py",
        "return sampling.sensitivity * j, xp.exp(log_p), sigma",
        "return j, xp.exp(log_p), sigma",
        "Replace-k adjacency uses sensitivities j instead of 2j.",
        ("tests/test_group_fixed_batch.py",)),
    Mutation(
        "binomial-weights-drop-top", "dpjax/pld/mog.py",
        "inside = j <= k",
        "inside = j < k",
        "The group mixture drops its component j = k (every group member sampled), the one of "
        "largest sensitivity.",
        ("tests/test_group_mog.py",)),
    # --- random allocation
    Mutation(
        "allocation-blocks-one-epoch", "dpjax/pld/allocation/accountant.py",
        "blocks.append((lo + 1, r * E))",
        "blocks.append((lo + 1, r))",
        "The larger 1-of-t blocks of a k-of-t allocation are composed for one epoch instead of E.",
        ("tests/pld/allocation/test_allocation.py",)),
    Mutation(
        "allocation-inf-atom-dropped", "dpjax/pld/allocation/lattice.py",
        "const = xp.where(is_up, comp.p_inf + comp.tail_above, comp.p_inf - comp.tail_below)",
        "const = xp.where(is_up, comp.tail_above, comp.p_inf - comp.tail_below)",
        "The allocation lattice's +inf atom (truncated bands) is left out of the upper delta curve.",
        ("tests/pld/allocation/test_allocation.py", "tests/pld/allocation/test_allocation_integration.py",
         "tests/pld/allocation/test_allocation_hostile.py", "tests/pld/allocation/test_lattice_curves.py")),
    Mutation(
        "allocation-directions-min", "dpjax/pld/allocation/accountant.py",
        "upper = up.max(0)",
        "upper = up.min(0)",
        "Random allocation's add/remove guarantee takes the smaller direction.",
        ("tests/pld/allocation/test_allocation.py",)),
    Mutation(
        "allocation-summed-mu-unamplified", "dpjax/pld/allocation/accountant.py",
        "return float(math.sqrt(sum(int(c) / (int(tb) * sb * sb) for sb, (tb, c) in zip(sig, blocks))))",
        "return float(math.sqrt(sum(int(c) / (sb * sb) for sb, (tb, c) in zip(sig, blocks))))",
        "The Gaussian released by an epoch's summed outputs forgets the variance of its t_b steps: "
        "the lower end it certifies is the unamplified Gaussian's.",
        ("tests/pld/allocation/test_allocation.py",)),
    # --- Monte Carlo: the participation-chain accountants (b-min-sep, random allocation)
    Mutation(
        "allocation-mc-cross-terms-dropped", "dpjax/montecarlo/allocation.py",
        "return -(_pair_terms(bands) @ bits.T) * (1.0 / (sigma * sigma))",
        "return 0.0 * (_pair_terms(bands) @ bits.T)",
        "Random allocation's likelihood ratio forgets |C x|^2's cross terms between participations "
        "closer than the band count (the pair of a banded C with overlapping columns).",
        ("tests/montecarlo/test_allocation_mc.py",)),
    Mutation(
        "bminsep-warm-start-ineligible-mass", "dpjax/montecarlo/bminsep.py",
        "ring = ring.at[1:].set(jnp.broadcast_to(log_p - log_norm, (b - 1,) + batch).astype(dtype))",
        "ring = ring.at[1:].set(jnp.broadcast_to(-log_norm, (b - 1,) + batch).astype(dtype))",
        "The b-min-sep chain starts with mass 1 / (1 + (b - 1) p), not p / (1 + (b - 1) p), on each "
        "recent participation: not the stationary law the sampler draws from.",
        ("tests/montecarlo/test_bminsep.py",)),
    Mutation(
        "chain-nan-loss-is-zero", "dpjax/montecarlo/_chain.py",
        "return core._nan_to_plus_inf(log_ratio[0]), core._nan_to_plus_inf(-log_ratio[1])",
        "return jnp.nan_to_num(log_ratio[0], nan=0.0), jnp.nan_to_num(-log_ratio[1], nan=0.0)",
        "A NaN privacy loss of the chain accountants counts as 0 instead of +inf.",
        ("tests/montecarlo/test_bminsep.py", "tests/montecarlo/test_allocation_mc.py")),
    # --- Monte Carlo: Estimate-Verify-Release, confidence intervals, losses
    Mutation(
        "evr-union-bound-dropped", "dpjax/montecarlo/evr.py",
        "return tau * base_delta + k * failure_probability(num_samples, base_delta, tau)",
        "return tau * base_delta + failure_probability(num_samples, base_delta, tau)",
        "The certified delta of a procedure with K tests counts one test's failure probability.",
        ("tests/montecarlo/test_evr.py",)),
    Mutation(
        "host-bisection-root-unsafe-end", "dpjax/numerics/root.py",
        'return lo if self.safe == "lower" else hi',
        'return hi if self.safe == "lower" else lo',
        "The host bisection returns the end of its final bracket where the predicate failed "
        "(base_delta_for_target: a base delta whose overall delta exceeds the target).",
        ("tests/montecarlo/test_montecarlo.py", "tests/numerics/test_root_host.py")),
    Mutation(
        "host-bisection-solve-unsafe-end", "dpjax/numerics/root.py",
        'root = lo if self.safe == "lower" else hi',
        'root = hi if self.safe == "lower" else lo',
        "HostBisection.solve returns the infeasible end of its final bracket as the root.",
        ("tests/numerics/test_root_host.py",)),
    Mutation(
        "betting-one-direction", "dpjax/montecarlo/evr.py",
        "passed = all(ranges[d] <= level or (np.isfinite(wealth[d]) and wealth[d] >= log_inv_beta) for d in range(2))",
        "passed = any(ranges[d] <= level or (np.isfinite(wealth[d]) and wealth[d] >= log_inv_beta) for d in range(2))",
        "The betting test passes when either direction passes, not both.",
        ("tests/montecarlo/test_evr.py", "tests/montecarlo/test_montecarlo.py", "tests/montecarlo/test_importance.py")),
    Mutation(
        "betting-level-without-beta", "dpjax/montecarlo/evr.py",
        "level = target - beta - _sampler_allowance(b)",
        "level = target - _sampler_allowance(b)",
        "The one-test certificate tests at target_delta without reserving its failure "
        "probability: the released delta exceeds the target.",
        ("tests/montecarlo/test_evr.py",)),
    Mutation(
        "ladder-rungs-not-counted", "dpjax/montecarlo/evr.py",
        "log_inv_beta = math.log(rungs / beta_total)",
        "log_inv_beta = math.log(1.0 / beta_total)",
        "Each rung of the betting ladder is tested at the whole failure probability instead of "
        "its share: the union bound over rungs is lost.",
        ("tests/montecarlo/test_evr.py",)),
    Mutation(
        "mc-interval-min-direction", "dpjax/montecarlo/_accountant.py",
        "delta_low=np.max(lo, axis=0), delta_high=np.max(hi, axis=0), confidence=confidence)",
        "delta_low=np.max(lo, axis=0), delta_high=np.min(hi, axis=0), confidence=confidence)",
        "The upper confidence bound on the max-direction delta is the smaller direction's.",
        ("tests/montecarlo/test_montecarlo_interval.py",)),
    Mutation(
        "mc-interval-no-union-bound", "dpjax/montecarlo/_accountant.py",
        "lo, hi = _kl_bounds(mean, m, 1.0 - (1.0 - confidence) / 2.0)",
        "lo, hi = _kl_bounds(mean, m, confidence)",
        "The per-direction confidence bounds are taken at the overall level: the max-direction "
        "interval no longer holds with the stated confidence.",
        ("tests/montecarlo/test_montecarlo_interval.py", "tests/montecarlo/test_mc_epsilon_interval.py")),
    Mutation(
        "mc-nan-loss-is-zero", "dpjax/montecarlo/core.py",
        "return jnp.where(jnp.isnan(losses), jnp.inf, losses)",
        "return jnp.where(jnp.isnan(losses), 0.0, losses)",
        "A privacy loss that cannot be evaluated counts as 0 instead of +inf.",
        ("tests/montecarlo/test_montecarlo_extreme_sigma.py",)),
    Mutation(
        "mc-half-norm-doubled", "dpjax/montecarlo/core.py",
        "half_norms = (0.5 * inv_var) * jnp.diagonal(gram)",
        "half_norms = inv_var * jnp.diagonal(gram)",
        "The Gaussian log-likelihood ratio subtracts |c|^2 / sigma^2 instead of half of it: every "
        "sampled remove-direction loss is too small.",
        ("tests/montecarlo/test_montecarlo.py",)),
    # --- calibration: the safe end of a bracket
    Mutation(
        "root-unsafe-end", "dpjax/numerics/root.py",
        "root = jnp.where(status == int(SolverStatus.CONVERGED), good, jnp.where(ok_bad, bad0, jnp.nan))",
        "root = jnp.where(status == int(SolverStatus.CONVERGED), bad, jnp.where(ok_bad, bad0, jnp.nan))",
        "The monotone root finder returns the infeasible end of its final bracket.",
        ("tests/calibration/test_calibration_root.py",)),
    Mutation(
        "pld-calibration-tolerance", "dpjax/calibration/pld.py",
        "feas = [x for x, y in self.points if y <= 0]",
        "feas = [x for x, y in self.points if y <= 1e-3]",
        "The PLD calibration accepts a noise multiplier whose certified epsilon is up to 0.1% "
        "above the target.",
        ("tests/calibration/test_calibration_pld.py",)),
    Mutation(
        "gaussian-calibration-drops-steps", "dpjax/calibration/gaussian.py",
        "return jnp.sqrt(jnp.asarray(steps, jnp.float64)) / jnp.asarray(noise_multiplier, jnp.float64)",
        "return 1.0 / jnp.asarray(noise_multiplier, jnp.float64)",
        "The Gaussian calibration accounts for one step whatever the number of steps.",
        ("tests/calibration/test_calibration_root.py",)),
    # --- sampling truncation term
    Mutation(
        "truncation-one-neighbour", "dpjax/sampling.py",
        "n = int(num_examples) + 1",
        "n = int(num_examples)",
        "The balls-in-bins overflow bound is taken for N examples, not the N + 1 of the larger "
        "neighbour.",
        ("tests/test_sampling.py",)),
    Mutation(
        "truncation-factor", "dpjax/sampling.py",
        "return min(1.0, math.exp(min(0.0, log_overflow + float(np.logaddexp(0.0, eps)))))",
        "return min(1.0, math.exp(min(0.0, log_overflow + eps)))",
        "The truncation delta is e^eps p instead of (1 + e^eps) p.",
        ("tests/test_sampling.py",)),
]


# ------------------------------------------------------------------------------------------


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _clone(repo: pathlib.Path, parent: pathlib.Path, commit: str) -> pathlib.Path:
    """A scratch clone of ``repo`` inside ``parent``, at ``commit`` (the HEAD recorded when the
    check started, so that every run of one check tests the same code)."""
    dest = parent / "repo"
    subprocess.run(["git", "clone", "-q", str(repo), str(dest)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=dest, check=True)
    return dest


def apply_mutation(root: pathlib.Path, mutation: Mutation) -> int:
    """Replace the mutation's line in the copy at ``root``; returns its 1-based line number.

    Raises ``ValueError`` when the line is not found (or not exactly once, without an occurrence
    index), when the file does not change, or when the result is not valid Python."""
    path = root / mutation.file
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == mutation.original.strip()]
    if mutation.occurrence is None:
        if len(hits) != 1:
            raise ValueError(f"{mutation.id}: line found {len(hits)} times in {mutation.file}, expected once")
        index = hits[0]
    else:
        if mutation.occurrence >= len(hits):
            raise ValueError(f"{mutation.id}: occurrence {mutation.occurrence} of the line, found {len(hits)}")
        index = hits[mutation.occurrence]
    line = lines[index]
    indent = line[: len(line) - len(line.lstrip())]
    ending = line[len(line.rstrip("\r\n")):]
    lines[index] = indent + mutation.replacement.strip() + ending
    new_text = "".join(lines)
    if new_text == text:
        raise ValueError(f"{mutation.id}: the replacement leaves {mutation.file} unchanged")
    compile(new_text, str(path), "exec")  # a SyntaxError here is a broken table entry
    path.write_text(new_text)
    return index + 1


def _first_failure(output: str) -> str | None:
    """The first ``FAILED`` / ``ERROR`` test id of pytest's short summary."""
    m = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", output, re.MULTILINE)
    return m.group(1).strip() if m else None


def run_pytest(root: pathlib.Path, targets, timeout_s: float) -> dict:
    """Run the default tier on ``targets`` in the copy at ``root``; exit code, output, seconds."""
    env = dict(os.environ, PYTHONPATH=str(root), DPJAX_COMPILATION_CACHE="0")
    cmd = [sys.executable, *PYTEST_ARGS, *targets]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        code = proc.returncode
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest process group this function started
        output, _ = proc.communicate()
        code = None
        timed_out = True
    return dict(exit_code=code, timed_out=timed_out, output=output or "", seconds=round(time.monotonic() - start, 1))


def _outcome(run: dict) -> str:
    if run["timed_out"]:
        return "timeout"
    return {1: "caught", 0: "not caught"}.get(run["exit_code"], "error")


def check_mutation(repo: pathlib.Path, commit: str, mutation: Mutation, timeout_s: float) -> dict:
    """Clone, mutate, run the targets, clean up; the mutation's record."""
    record = dict(id=mutation.id, file=mutation.file, line=None, original=mutation.original.strip(),
                  replacement=mutation.replacement.strip(), description=mutation.description,
                  targets=list(mutation.targets))
    start = time.monotonic()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="dpjax-mutation-"))
    try:
        root = _clone(repo, scratch, commit)
        try:
            record["line"] = apply_mutation(root, mutation)
        except (ValueError, SyntaxError) as exc:
            record.update(outcome="error", exit_code=None, first_failure=None, seconds=0.0,
                          output_tail=f"mutation not applied: {exc}")
            return record
        run = run_pytest(root, mutation.targets, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outcome = _outcome(run)
    record.update(outcome=outcome, exit_code=run["exit_code"], first_failure=_first_failure(run["output"]),
                  pytest_seconds=run["seconds"], seconds=round(time.monotonic() - start, 1))
    if outcome != "caught":
        record["output_tail"] = run["output"][-OUTPUT_TAIL_CHARS:]
    return record


def check_baseline(repo: pathlib.Path, commit: str, targets, timeout_s: float) -> dict:
    """The unmutated copy on the union of the targets: must pass (exit code 0)."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="dpjax-mutation-baseline-"))
    try:
        run = run_pytest(_clone(repo, scratch, commit), targets, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = dict(targets=list(targets), exit_code=run["exit_code"], timed_out=run["timed_out"],
               passed=run["exit_code"] == 0, seconds=run["seconds"],
               summary=(run["output"].strip().splitlines() or [""])[-1])
    if not out["passed"]:
        out["output_tail"] = run["output"][-OUTPUT_TAIL_CHARS:]
    return out


def _union(mutations) -> list:
    return list(dict.fromkeys(t for m in mutations for t in m.targets))


def _counts(records) -> dict:
    outcomes = [r["outcome"] for r in records]
    return dict(total=len(records), caught=outcomes.count("caught"), not_caught=outcomes.count("not caught"),
                errors=len(records) - outcomes.count("caught") - outcomes.count("not caught"))


def _write(path: pathlib.Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def main(argv=None) -> int:
    here = pathlib.Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=pathlib.Path, default=here, help="repository root (default: this script's)")
    parser.add_argument("--only", default=None, help="comma-separated mutation ids to run")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="output JSON (default: benchmarks/results/mutation_check.json in --repo)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per pytest run")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unmutated run (the result is then recorded as incomplete)")
    args = parser.parse_args(argv)

    repo = args.repo.resolve()
    if args.only and args.out is None:
        # The committed record is of every mutation; a partial run must not replace it.
        parser.error("--only needs --out (the default output is the full run's record)")
    out = args.out or repo / "benchmarks" / "results" / "mutation_check.json"
    ids = [m.id for m in MUTATIONS]
    if len(set(ids)) != len(ids):
        parser.error("duplicate mutation ids in the table")
    selected = MUTATIONS
    if args.only:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = sorted(set(wanted) - set(ids))
        if unknown:
            parser.error(f"unknown mutation ids: {', '.join(unknown)}")
        selected = [m for m in MUTATIONS if m.id in wanted]

    start = time.monotonic()
    doc = dict(commit=_git(repo, "rev-parse", "HEAD"),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               pytest_command="python " + " ".join(a if " " not in a else repr(a) for a in PYTEST_ARGS) + " <targets>",
               environment=dict(PYTHONPATH="<copy>", DPJAX_COMPILATION_CACHE="0"),
               timeout_s=args.timeout, baseline=None, void=None, mutations=[], counts=None, seconds=None,
               meta=run_metadata(__file__, argv))
    if not args.no_baseline:
        print(f"baseline: {len(_union(selected))} target(s)", flush=True)
        doc["baseline"] = check_baseline(repo, doc["commit"], _union(selected), args.timeout)
        doc["void"] = not doc["baseline"]["passed"]
        print(f"  {'passed' if doc['baseline']['passed'] else 'FAILED'} in {doc['baseline']['seconds']} s: "
              f"{doc['baseline']['summary']}", flush=True)
        _write(out, doc)
        if doc["void"]:
            print("baseline failed: the check is void", flush=True)
            doc["seconds"] = round(time.monotonic() - start, 1)
            _write(out, doc)
            return 2
    for m in selected:
        rec = check_mutation(repo, doc["commit"], m, args.timeout)
        doc["mutations"].append(rec)
        doc["counts"] = _counts(doc["mutations"])
        doc["seconds"] = round(time.monotonic() - start, 1)
        _write(out, doc)
        print(f"{m.id:34s} {rec['outcome']:10s} {rec['seconds']:7.1f} s  {m.file}:{rec['line']}  "
              f"{rec.get('first_failure') or ''}", flush=True)
    doc["counts"] = _counts(doc["mutations"])
    doc["seconds"] = round(time.monotonic() - start, 1)
    _write(out, doc)
    c = doc["counts"]
    print(f"{c['caught']} of {c['total']} caught, {c['not_caught']} not caught, {c['errors']} errors "
          f"({doc['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
