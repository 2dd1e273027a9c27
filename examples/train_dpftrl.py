"""DP-SGD vs DP-FTRL (BLT correlated noise) at the same certified (epsilon, delta), on CPU.

Both runs use the same balls-in-bins batches (:class:`dpjax.sampling.BallsInBinsSampler`; the
practical variant of Choquette-Choo et al., "Near exact privacy amplification for matrix
mechanisms", §5.2.1: fixed batch shape, padding masked, truncation accounted) and are accounted
by the same schedule object (``sampler.accountant(C)``, Monte Carlo accounting with
Estimate-Verify-Release).  DP-SGD is the matrix mechanism with ``C = I``; DP-FTRL adds the
streaming ``C^{-1} z`` of a BLT (:func:`dpjax.noise.blt_noise`).

The BLT is hand-chosen (``theta = (0.95, 0.6)``, ``omega = (0.3, 0.2)``: ``c_k`` close to the
``A^{1/2}`` coefficients ``1, 1/2, 3/8, ...`` over the first steps); swap in a BLT optimised by
:func:`dpjax.optimization.optimize_correlation` for a better one.

Accounting per run: calibrate ``sigma`` on a Monte Carlo estimate (``num_samples_cal`` draws,
key 0) to ``delta_cal = target_delta / 3``, then certify ``(epsilon, target_delta - trunc)``
with Estimate-Verify-Release on ``num_samples_cert`` fresh draws (key 1; raising sigma by 3%
until it verifies), where ``trunc = sampler.truncation_delta(epsilon)`` bounds the effect of
truncating overflowing batches (docs/design.md §7).  The reported delta is the certificate's
plus ``trunc``: a guarantee, with the failure probability of EVR inside it.

Model: a 2-layer MLP on synthetic data (two classes separated by a noisy nonlinear boundary in
20 dimensions, made here), per-example clipping to norm 1, sum + noise, normalised by the fixed
batch size ``B``, SGD with momentum.  Prints a table and (``--json``) a JSON line.

    python examples/train_dpftrl.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from dpjax.matrices import BLT, Toeplitz, prefix_sum_rmse
from dpjax.noise import blt_noise, toeplitz_noise, tree_normal
from dpjax.sampling import BallsInBinsSampler


def make_data(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d) / np.sqrt(d)
    logits = x @ w + 0.8 * np.sin(2.0 * x[:, 0]) * x[:, 1]
    y = (logits + 0.3 * rng.standard_normal(n) > 0).astype(np.int32)
    return x, y


def init_params(key, d, hidden):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (d, hidden)) / np.sqrt(d), "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, 2)) / np.sqrt(hidden), "b2": jnp.zeros(2)}


def logits_fn(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    lg = logits_fn(params, x[None])[0]
    return -jax.nn.log_softmax(lg)[y]


def make_step(noise, sigma, batch_size, lr, momentum, clip=1.0):
    def step(carry, batch):
        params, velocity, noise_state, key = carry
        x, y, mask, t = batch
        grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)
        norms = jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.where(mask, jnp.minimum(1.0, clip / jnp.maximum(norms, 1e-12)), 0.0)  # padding -> 0
        summed = jax.tree_util.tree_map(lambda g: jnp.tensordot(scale, g, axes=1), grads)
        z = tree_normal(jax.random.fold_in(key, t), params, stddev=sigma * clip)
        corr, noise_state = noise.update(z, noise_state)               # (C^{-1} z)_t
        g = jax.tree_util.tree_map(lambda s, c: (s + c) / batch_size, summed, corr)  # fixed 1/B
        velocity = jax.tree_util.tree_map(lambda v, gi: momentum * v + gi, velocity, g)
        params = jax.tree_util.tree_map(lambda p, v: p - lr * v, params, velocity)
        return (params, velocity, noise_state, key), None

    return jax.jit(step)


def account(sampler, correlation, eps, delta, m_cal, m_cert):
    acc = sampler.accountant(correlation)
    trunc = sampler.truncation_delta(eps)
    if trunc >= delta / 2:
        raise ValueError(f"truncation term {trunc:.3g} too large for delta {delta}: raise batch_size")
    sigma = float(acc.calibrate(eps, delta / 3, m_cal, key=0))
    for _ in range(10):
        cert = acc.certify(sigma, eps, delta - trunc, m_cert, key=1)
        if cert.verified:
            break
        sigma *= 1.03
    else:
        raise RuntimeError("could not certify; raise num_samples_cert")
    return dict(noise_multiplier=sigma, epsilon=eps, delta=cert.delta + trunc, evr_delta=cert.delta,
                truncation_delta=trunc, delta_estimate=cert.delta_estimate, num_samples=cert.num_samples,
                unamplified_epsilon=float(acc.unamplified_epsilon(sigma, delta)),
                prefix_sum_rmse=float(prefix_sum_rmse(correlation, sigma, sampler.num_steps)))


def train(sampler, x, y, xt, yt, correlation, noise, sigma, args):
    params = init_params(jax.random.PRNGKey(args.seed), x.shape[1], args.hidden)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = make_step(noise, sigma, sampler.batch_size, args.lr, args.momentum)
    carry = (params, velocity, noise.init(params), jax.random.PRNGKey(args.seed + 1))
    for t, (idx, mask) in enumerate(sampler):
        carry, _ = step(carry, (x[idx], y[idx], mask, t))
    params = carry[0]
    acc = float(jnp.mean(jnp.argmax(logits_fn(params, xt), -1) == yt))
    return acc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller run (tests)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--momentum", type=float, default=0.9)
    args = ap.parse_args(argv)
    n, b, e = (8000, 20, 8) if not args.quick else (4000, 10, 4)
    batch_size = int(n / b + 6.5 * np.sqrt(n / b))  # ~6.5 sd above the mean: truncation negligible
    m_cal, m_cert = (100_000, 1_500_000) if not args.quick else (50_000, 400_000)
    delta = args.delta if not args.quick else 5e-4
    x_all, y_all = make_data(n + 4000, 20, args.seed)  # one labelling function; split train / test
    x, y, xt, yt = x_all[:n], y_all[:n], x_all[n:], y_all[n:]
    sampler = BallsInBinsSampler(n, b, e, batch_size, seed=args.seed)
    print(f"balls-in-bins: N={n}, b={b}, E={e}, B={batch_size}: expected truncation rate "
          f"{sampler.truncation_rate():.2e}, realised {sampler.truncated_fraction():.2e}, padded slots "
          f"{sampler.padded_fraction():.1%}, overflow probability bound {sampler.overflow_probability():.2e}")
    runs = {"DP-SGD (C = I)": (Toeplitz(jnp.array([1.0])), None),
            "DP-FTRL (BLT)": (BLT(jnp.array([0.95, 0.6]), jnp.array([0.3, 0.2])), None)}
    results = {}
    with jax.enable_x64(True):  # float64 accounting (the model below runs in float32 as usual)
        accounted = {name: account(sampler, c, args.epsilon, delta, m_cal, m_cert) for name, (c, _) in runs.items()}
    for name, (c, _) in runs.items():
        noise = blt_noise(c) if isinstance(c, BLT) else toeplitz_noise(c)
        t0 = time.perf_counter()
        test_acc = train(sampler, x, y, xt, yt, c, noise, accounted[name]["noise_multiplier"], args)
        results[name] = dict(accounted[name], test_accuracy=test_acc, train_seconds=time.perf_counter() - t0)
    # Non-private reference with the same batches.
    t0 = time.perf_counter()
    ref = train(sampler, x, y, xt, yt, None, toeplitz_noise(jnp.array([1.0])), 0.0, args)
    print(f"\n{'run':18s} {'sigma':>8s} {'eps':>5s} {'delta (cert.)':>13s} {'unampl. eps':>11s} "
          f"{'RMSE':>8s} {'test acc':>8s}")
    for name, r in results.items():
        print(f"{name:18s} {r['noise_multiplier']:8.3f} {r['epsilon']:5.2f} {r['delta']:13.3e} "
              f"{r['unamplified_epsilon']:11.3f} {r['prefix_sum_rmse']:8.2f} {r['test_accuracy']:8.4f}")
    print(f"{'non-private':18s} {'':8s} {'':5s} {'':13s} {'':11s} {'':8s} {ref:8.4f}")
    print("(delta = EVR certificate + truncation term; RMSE = prefix-sum RMSE of the noise, "
          f"sigma x ||A C^-1||_F / sqrt(n), n = {sampler.num_steps})")
    out = dict(settings=dict(num_examples=n, batches_per_epoch=b, epochs=e, batch_size=batch_size,
                             target_epsilon=args.epsilon, target_delta=delta,
                             truncation_rate=sampler.truncation_rate()),
               runs=results, non_private_accuracy=ref)
    if args.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
