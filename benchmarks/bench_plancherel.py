"""Per-T cost of an eps(T) / delta(T) curve: inverse FFT per T (dpjax) vs Plancherel's inner product.

Koskela & Honkela ("Computing Differential Privacy Guarantees for Heterogeneous Compositions
Using FFT", 2021, §5.5, Lemma 5) evaluate ``delta(eps)`` after ``T`` compositions without the
inverse transform: by Plancherel, ``sum_j w_j b_j = (1/n) sum_k W_k conj(B_k)`` where ``b`` is the
composed circular PMF (``B = F^T`` up to a phase) and ``w`` the hockey-stick weights
``(1 - e^{eps - y_j})_+``.  ``dpjax.epsilon_curve`` instead inverts ``F^T`` for every ``T`` (batched)
and sums over a window it places per ``T``.  This benchmark times the per-``T`` kernel of both
routes, batched over 16 values of ``T`` as the curve runs them, on the same grid:

* ``inverse``: ``F^T`` (from the precomputed ``log|F|`` and ``arg F``), one inverse real FFT, the
  window gather and the hockey-stick sum (dpjax's route, without its certification terms);
* ``plancherel``: ``F^T``, the weights' transform in closed form (two geometric series, one
  per-``T`` window as dpjax places it) and the inner product -- ONE epsilon per ``T`` (a
  ``delta(T)`` curve; an ``eps(T)`` curve needs a root search, i.e. several of these per ``T``);
* ``plancherel_fixed``: the paper's most favourable setting: the weights' transform
  precomputed once (one window and one epsilon for every ``T``), only the phase of the
  per-``T`` circular offset, the power and the inner product per ``T``.

A correctness check runs first: on a discretized Gaussian privacy-loss distribution
(``sigma = 20``, ``T = 1000``: ``mu_T = 1.25``), both routes give the same hockey-stick sum (to
1e-10 relative) and match the exact Gaussian delta (to the discretization's 1e-3).

Prints a table and writes ``benchmarks/results/bench_plancherel.json``.

    python benchmarks/bench_plancherel.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import norm

jax.config.update("jax_enable_x64", True)
ROOT = pathlib.Path(__file__).resolve().parents[1]

SIGMA, EPS, D = 20.0, 1.0, 4       # D: 2 directions x 2 bracket ends, as in an accountant call
MU = 1.0 / (2.0 * SIGMA**2)        # Gaussian mechanism's PLD: N(mu, 2 mu) per step


def gaussian_delta(mu_t: float, eps: float) -> float:
    """Exact delta(eps) of the T-fold Gaussian mechanism (PLD N(mu_T, 2 mu_T))."""
    s = math.sqrt(2.0 * mu_t)
    return norm.cdf((mu_t - eps) / s) - math.exp(eps) * norm.cdf((-mu_t - eps) / s)


def setup(n: int):
    dx = 40.0 / n
    o = int(round(-0.5 / dx))
    m = int(round(1.0 / dx))
    y = (o + np.arange(m)) * dx
    p = norm.pdf(y, MU, math.sqrt(2 * MU))
    p = p / p.sum()
    pmf = np.zeros((D, n))
    pmf[:, :m] = p
    F = np.fft.rfft(pmf, axis=-1)
    with np.errstate(divide="ignore"):  # |F| = 0 -> log = -inf -> |F|^T = 0
        return dx, o, jnp.asarray(np.log(np.abs(F))), jnp.asarray(np.angle(F))


def kernels(n: int, dx: float, o: int, la, an):
    half = n // 2 + 1
    k = jnp.arange(half, dtype=jnp.int64)
    wts = jnp.where((k == 0) | (k == n // 2), 1.0, 2.0)

    def power(T):
        return jnp.exp(T * la), T * an

    def window(T):
        centre = T * MU
        w = jnp.floor(centre / dx).astype(jnp.int64) - n // 2
        s = jnp.mod(w - jnp.mod(T.astype(jnp.int64) * o, n), n)
        return w, s

    def inverse(T):
        mag, ph = power(T)
        b = jnp.fft.irfft(mag * (jnp.cos(ph) + 1j * jnp.sin(ph)), n, axis=-1)
        w, s = window(T)
        r = b[:, jnp.mod(jnp.arange(n) + s, n)]
        y = (w + jnp.arange(n)) * dx
        return jnp.sum(r * jnp.maximum(0.0, -jnp.expm1(EPS - y)), axis=-1)

    def weights_transform(w):
        # U_k = sum_{t >= t0} (1 - e^{eps - (w + t) dx}) e^{-2 pi i k t / n}: two geometric series.
        t0 = jnp.maximum(jnp.ceil(EPS / dx - w).astype(jnp.int64), 0)
        th = -2.0 * jnp.pi * jnp.mod(k * t0, n) / n
        e0 = jnp.cos(th) + 1j * jnp.sin(th)
        z1 = jnp.cos(-2.0 * jnp.pi * k / n) + 1j * jnp.sin(-2.0 * jnp.pi * k / n)
        den1 = jnp.where(k == 0, 1.0, 1.0 - z1)
        g1 = jnp.where(k == 0, (n - t0).astype(jnp.float64), (e0 - 1.0) / den1)
        rho = math.exp(-dx)
        a0 = jnp.exp(EPS - (w + t0) * dx)          # e^{eps - y_{t0}} <= 1
        an_ = jnp.exp(EPS - (w + n) * dx)
        g2 = (a0 * e0 - an_) / (1.0 - rho * z1)
        return g1 - g2

    def plancherel(T):
        mag, ph = power(T)
        w, s = window(T)
        U = weights_transform(w)
        th = ph + 2.0 * jnp.pi * jnp.mod(k * s, n) / n   # B_k e^{2 pi i k s / n}: the circular shift
        return jnp.sum(wts * mag * (jnp.real(U) * jnp.cos(th) + jnp.imag(U) * jnp.sin(th)), axis=-1) / n

    def plancherel_fixed(T, U):
        mag, ph = power(T)
        _, s = window(T)
        th = ph + 2.0 * jnp.pi * jnp.mod(k * s, n) / n
        return jnp.sum(wts * mag * (jnp.real(U) * jnp.cos(th) + jnp.imag(U) * jnp.sin(th)), axis=-1) / n

    return inverse, plancherel, plancherel_fixed, weights_transform, window


def timed(fn, *args, reps):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def main(argv=None):
    from _meta import run_metadata

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16384,65536,262144")
    ap.add_argument("--batch", type=int, default=16, help="values of T per batched call")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_plancherel.json"))
    args = ap.parse_args(argv)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        dx, o, la, an = setup(n)
        inverse, plancherel, fixed, wt, window = kernels(n, dx, o, la, an)
        # Correctness: both routes, one T, against each other and the exact Gaussian delta.
        T1 = jnp.asarray(1000.0)
        d_inv = float(jax.jit(inverse)(T1)[0])
        d_pl = float(jax.jit(plancherel)(T1)[0])
        exact = gaussian_delta(1000 * MU, EPS)
        assert abs(d_inv - d_pl) <= 1e-10 * exact, (n, d_inv, d_pl)
        assert abs(d_inv - exact) <= 1e-3 * exact, (n, d_inv, exact)
        Ts = jnp.asarray(np.linspace(900.0, 1000.0, args.batch))
        U = wt(window(T1)[0])
        reps = max(2, int(2e6 // n))
        t_inv = timed(jax.vmap(inverse), Ts, reps=reps) / args.batch
        t_pl = timed(jax.vmap(plancherel), Ts, reps=reps) / args.batch
        t_fx = timed(jax.vmap(fixed, in_axes=(0, None)), Ts, U, reps=reps) / args.batch
        rows.append(dict(n=n, inverse_ms_per_T=1e3 * t_inv, plancherel_ms_per_T=1e3 * t_pl,
                         plancherel_fixed_ms_per_T=1e3 * t_fx, speedup_plancherel=t_inv / t_pl,
                         speedup_plancherel_fixed=t_inv / t_fx, check_delta_inverse=d_inv,
                         check_delta_plancherel=d_pl, check_delta_exact=exact))
    print(f"{'n':>8} {'inverse':>10} {'plancherel':>11} {'(fixed W)':>10} {'inv/pl':>7} {'inv/fixed':>9}   ms per T")
    for r in rows:
        print(f"{r['n']:>8} {r['inverse_ms_per_T']:>10.3f} {r['plancherel_ms_per_T']:>11.3f} "
              f"{r['plancherel_fixed_ms_per_T']:>10.3f} {r['speedup_plancherel']:>7.2f} {r['speedup_plancherel_fixed']:>9.2f}")
    out = dict(benchmark="bench_plancherel", batch=args.batch, directions_x_kinds=D,
               note="per-T kernels only (no certification terms); one epsilon per T for the Plancherel rows; "
                    "an eps(T) curve needs several Plancherel evaluations per T (root search)",
               rows=rows, machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(), jax=jax.__version__,
                                       backend=jax.default_backend(), loadavg=os.getloadavg()),
               meta=run_metadata(__file__, argv))
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
