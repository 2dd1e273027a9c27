"""Compiles count: DP-SGD queries answered without compiling a program per query.

docs/design.md §2.5 states the bound: any sequence of one-configuration DP-SGD queries (epsilon,
delta, noise multiplier, arrays of them, eps(T) curves, group privacy, fixed batches) runs the PLD
program on the host and compiles no XLA program at all (dpjax.pld.grid.program.DPSGD_QUERY_PROGRAMS).
"""

from __future__ import annotations

import jax
import numpy as np

import dpjax
from dpjax.pld.grid import program


def _queries(count: int, seed: int):
    rng = np.random.default_rng(seed)
    calls = []
    for i in range(count):
        sigma = float(rng.uniform(0.7, 4.0))
        q = float(10 ** rng.uniform(-3.5, -1.0))
        steps = int(10 ** rng.uniform(2.0, 4.0))
        delta = float(10 ** rng.uniform(-8.0, -4.0))
        k = int(rng.choice([1, 1, 2, 3, 4, 8]))
        kind = i % 10
        if kind < 5:
            calls.append(lambda s=sigma, q=q, t=steps, d=delta, k=k: dpjax.dpsgd_epsilon(s, q, t, d, group_size=k))
        elif kind == 5:
            calls.append(lambda s=sigma, q=q, t=steps, k=k: dpjax.dpsgd_delta(s, q, t, 2.0, group_size=k))
        elif kind == 6:
            n = int(rng.choice([10_000, 60_000]))
            b = int(n * q) + 1
            calls.append(lambda s=sigma, t=steps, d=delta, k=k, n=n, b=b: dpjax.dpsgd_epsilon(2 * s, None, t, d, group_size=k, sampling=dpjax.FixedBatch(b, n)))
        elif kind == 7:
            calls.append(lambda s=sigma, q=q, t=steps, d=delta: dpjax.dpsgd_epsilon(
                np.array([s, 1.2 * s]), q, t, d))
        elif kind == 8:
            calls.append(lambda s=sigma, q=q, t=steps, d=delta: dpjax.epsilon_curve(s, q, [t // 2 + 1, t], d))
        else:
            calls.append(lambda s=sigma, q=q, t=steps: dpjax.dpsgd_noise_multiplier(q, t, 2.0, 1e-5)
                         if i % 40 == 9 else dpjax.dpsgd_epsilon(s, q, t, 1e-6))
    return calls


def test_two_hundred_random_dpsgd_queries_compile_at_most_the_stated_bound():
    events, active = [], [True]

    def listener(name, secs, **kwargs):
        if active[0] and name == "/jax/core/compile/backend_compile_duration":
            events.append(secs)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        values = [call() for call in _queries(200, seed=46)]
    finally:
        active[0] = False
    assert len(values) == 200
    assert all(np.all(np.isfinite(np.asarray(v.epsilon if hasattr(v, "epsilon") else v))) for v in values)
    assert len(events) <= program.DPSGD_QUERY_PROGRAMS
