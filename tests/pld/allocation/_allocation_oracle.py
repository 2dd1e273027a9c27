"""An independent quadrature oracle for one epoch of 1-of-t random allocation (small t).

Under Q the likelihood ratio is ``V = (1/t) sum_i Z_i`` with ``log Z_i ~ N(-s^2/2, s^2)``, ``s =
1/sigma``.  The density of ``U_j = log(Z_1 + ... + Z_j)`` on a uniform grid in ``u`` follows from
``U_{j+1} = log(e^{U_j} + Z)``, split by which term is the smaller (its log is then below
``u - log 2``, and the larger one's log, ``log(e^u - e^{smaller})``, lies in ``[u - log 2, u)``
with Jacobian ``e^u / (e^u - e^{smaller})`` in ``[1, 2]``: no singular integrand):

    p_{j+1}(u) = int_{a < u - log 2} p_j(a) phi(log(e^u - e^a)) J da
               + int_{b < u - log 2} phi(b) p_j(log(e^u - e^b)) J db,

``phi`` the normal density of ``log Z`` (closed form).  Both integrals run over the grid points
(trapezoidal rule); the second needs ``p_j`` between grid points: cubic interpolation of
``log p_j`` (smooth, near-quadratic in the tails).  Then

    delta_remove(eps) = int p_t(u) (e^u / t - e^eps)_+ du,    delta_add(eps) = int p_t(u) (1 - e^eps e^u / t)_+ du.

This shares nothing with the accountant (no lattice, no FFT, no band decomposition); its error is
the quadrature's on a grid of spacing ``h`` (checked by halving ``h``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.interpolate import CubicSpline
from scipy.optimize import brentq

_LN2 = math.log(2.0)


def log_sum_density(sigma: float, t: int, h: float = 2e-3, width: float = 10.0):
    """Grid ``u`` and the density of ``U_t = log(Z_1 + ... + Z_t)`` on it."""
    s = 1.0 / sigma
    mu = -0.5 * s * s
    lo = mu - width * s
    hi = mu + width * s + math.log(t)
    u = np.arange(lo, hi + h, h)
    n = len(u)

    def log_phi(x):
        return -0.5 * ((x - mu) / s) ** 2 - math.log(s * math.sqrt(2.0 * math.pi))

    p = np.exp(log_phi(u))
    for _ in range(t - 1):
        logp = np.log(np.maximum(p, 1e-300))
        spline = CubicSpline(u, logp)
        new = np.zeros(n)
        for start in range(0, n, 256):
            rows = np.arange(start, min(n, start + 256))
            ui = u[rows][:, None]
            small = u[None, :]                                        # the smaller term's log
            ok = small < ui - _LN2
            d = np.where(ok, ui - small, 1.0)
            frac = -np.expm1(-d)                                      # (e^u - e^small) / e^u
            big = ui + np.log(frac)
            jac = 1.0 / frac
            # trapezoid weights over the included grid points (half weight at the last one)
            last = np.sum(ok, axis=1) - 1
            wts = np.where(ok, h, 0.0)
            idx = np.arange(n)[None, :]
            wts = np.where(idx == last[:, None], 0.5 * h, wts)
            wts[:, 0] *= 0.5
            t1 = p[None, :] * np.exp(log_phi(big)) * jac
            inside = (big >= u[0]) & (big <= u[-1])
            t2 = np.exp(log_phi(small)) * np.where(inside, np.exp(spline(np.clip(big, u[0], u[-1]))), 0.0) * jac
            body = np.sum(np.where(ok, (t1 + t2) * wts, 0.0), axis=1)
            # The sliver from the last grid point a_L to the split point e = u - log 2: trapezoid
            # with the integrand at e (both terms equal there: e and log(e^u - e^e) = e coincide).
            e = u[rows] - _LN2
            f_e = 2.0 * 2.0 * np.exp(log_phi(e) + spline(np.clip(e, u[0], u[-1])))
            f_e = np.where(e >= u[0], f_e, 0.0)
            a_l = u[np.maximum(last, 0)]
            f_l = np.take_along_axis(t1 + t2, np.maximum(last, 0)[:, None], axis=1)[:, 0]
            sliver = np.where(last >= 0, 0.5 * (e - a_l) * (f_l + f_e), 0.0)
            new[rows] = body + sliver
        p = new
    return u, p


def deltas(u, p, t, eps):
    """(delta_remove, delta_add) at ``eps`` from the density of ``U_t``."""
    v = np.exp(u) / t
    c = math.exp(eps)
    w = np.full_like(u, u[1] - u[0])
    w[0] = w[-1] = 0.5 * (u[1] - u[0])
    rem = float(np.sum(w * p * np.maximum(v - c, 0.0)))
    add = float(np.sum(w * p * np.maximum(1.0 - c * v, 0.0)))
    return rem, add


def epsilon(u, p, t, delta):
    """Smallest eps >= 0 with max(delta_remove, delta_add)(eps) <= delta."""
    def f(e):
        return max(deltas(u, p, t, e)) - delta

    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
    return brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12)


def normalization(u, p, t):
    """(Q-mass, P-mass) of the computed density: both should be 1."""
    h = u[1] - u[0]
    return float(np.sum(p) * h), float(np.sum(p * np.exp(u) / t) * h)
