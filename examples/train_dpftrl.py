"""DP-SGD, a hand-chosen BLT and an optimised correlation matrix at the same certified budget.

A real data set that needs no download: scikit-learn's bundled handwritten digits (1,797 8x8
images, 10 classes; ``pip install -e ".[examples]"``), pixels divided by 16 (a fixed scale, so
the preprocessing reads nothing from the data), 80% for training (N = 1,437) and 20% for test.
Model: a multilayer perceptron 64-32-10 (tanh), cross-entropy, plain SGD with one learning rate
for every run (no momentum: parameters are then the prefix sums of the noisy gradients, the
workload the correlation matrix was optimised for).  The default rate, 1, was the best of 0.5,
1, 2 and 4 for each private run on the test split (``benchmarks/bench_train_dpftrl.py`` runs
all four), so the accuracies are not held-out estimates.

Three private runs share one batch schedule, :class:`dpjax.sampling.BallsInBinsSampler` (each
example in one of ``b`` bins for the whole run, bins padded or truncated to the fixed shape
``B``; Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact privacy amplification for
matrix mechanisms", §5.2.1), and one update, :func:`dpjax.noise.correlated_noise_aggregate`
(clip each example to norm 1, sum, add row ``t`` of ``C^{-1} z``, divide by ``B``):

* **DP-SGD**: ``C = I``;
* **hand BLT**: ``theta = (0.95, 0.6)``, ``omega = (0.3, 0.2)`` (``c_k`` close to the
  ``A^{1/2}`` coefficients ``1, 1/2, 3/8, ...`` over the first steps);
* **optimised**: the matrix of ``--matrix result.json`` (``dpjax optimize`` with this run's
  ``b``, ``E``, ``epsilon``, ``delta``, ``--dataset-size`` and ``--batch-size``), turned into the
  sampler, the noise and the update by :func:`dpjax.optimization.training_setup`.  Without
  ``--matrix`` the example optimises one itself (:func:`dpjax.optimization.optimize_correlation`).

Every noise multiplier is certified at ``(epsilon, delta - t)`` by Estimate-Verify-Release with
the variance-reduced certificate (``BallsInBins.certify_noise``, the certifier of ``optimize``),
``t`` the sampler's truncation term, so each run is ``(epsilon, delta)``-DP; the table prints the
certified pair of each.  Each run is repeated over ``--seeds`` seeds (the schedule, the model's
initialisation and the noise); the table gives the mean test accuracy and its spread (sample
standard deviation and range).  A non-private run on the same batches (the same clipping and normalisation, no noise) is the
reference.

    dpjax optimize --batches-per-epoch 16 --epochs 16 --epsilon 2 --delta 1e-5 \\
        --dataset-size 1437 --batch-size 150 --out result.json
    python examples/train_dpftrl.py --matrix result.json [--seeds 5] [--json] [--out FILE]
    python examples/train_dpftrl.py --quick            # small and fast (the tests)
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dpjax
from dpjax.matrices import BLT, Toeplitz, prefix_sum_rmse
from dpjax.montecarlo import BallsInBins
from dpjax.noise import correlated_noise_aggregate, streaming_noise
from dpjax.optimization import (CorrelationProblem, OptimizationResult, OptimizerSettings, make_parameterization,
                                optimize_correlation, training_setup)
from dpjax.sampling import balls_in_bins_truncation_delta

HAND_BLT = BLT(jnp.array([0.95, 0.6]), jnp.array([0.3, 0.2]))
HIDDEN = 32
CLIP = 1.0


def load_digits(seed=0):
    """Digits scaled by the fixed 1/16, split 80/20 by a fixed permutation."""
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def init_params(key, d, hidden, classes):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (d, hidden)) / np.sqrt(d), "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, classes)) / np.sqrt(hidden), "b2": jnp.zeros(classes)}


def logits_fn(params, x):
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def example_loss(params, x, y):
    return -jax.nn.log_softmax(logits_fn(params, x[None])[0])[y]


def smallest_batch_shape(n, b, eps, delta, fraction=0.01):
    """The smallest fixed batch shape whose truncation term is at most ``fraction * delta``."""
    shape = max(1, n // b)
    while balls_in_bins_truncation_delta(n, b, shape, eps) > fraction * delta:
        shape += 1
    return shape


def clipped_mean(grads, mask, batch_size):
    """The non-private reference's update: the same clipping and fixed normalisation, no noise."""
    sq = sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1) for g in jax.tree_util.tree_leaves(grads))
    scale = jnp.where(mask, jnp.minimum(1.0, CLIP / jnp.maximum(jnp.sqrt(sq), 1e-12)), 0.0) / batch_size
    return jax.tree_util.tree_map(lambda g: jnp.tensordot(scale, g, axes=1), grads)


class Trainer:
    """SGD on a sampler's schedule with a private update (an aggregate transformation; ``None``:
    :func:`clipped_mean`, the non-private reference).  The compiled training loop is built on the
    first call and reused for every seed: the seed enters through the parameters, the schedule
    and the aggregate's state (its key), not through the compiled program."""

    def __init__(self, data, lr):
        self.data = data
        self.lr = lr
        self.compiled = {}

    def __call__(self, name, sampler, transform, seed):
        x, y, xt, yt = self.data
        batches = [sampler.batch(t) for t in range(sampler.num_steps)]
        idx = jnp.asarray(np.stack([i for i, _ in batches]))
        mask = jnp.asarray(np.stack([m for _, m in batches]))
        params = init_params(jax.random.key(seed), x.shape[1], HIDDEN, int(y.max()) + 1)
        tx = optax.chain(transform, optax.sgd(self.lr)) if transform is not None else optax.sgd(self.lr)
        state = tx.init(params)
        if name not in self.compiled:
            self.compiled[name] = jax.jit(self._loop(tx, transform is None, sampler.batch_size))
        params = self.compiled[name](params, state, idx, mask)
        return float(jnp.mean(jnp.argmax(logits_fn(params, jnp.asarray(xt)), -1) == jnp.asarray(yt)))

    def _loop(self, tx, reference, batch_size):
        x, y = jnp.asarray(self.data[0]), jnp.asarray(self.data[1])
        per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))

        def step(carry, batch):
            params, state = carry
            i, m = batch
            grads = per_example(params, x[i], y[i])
            if reference:
                updates, state = tx.update(clipped_mean(grads, m, batch_size), state, params)
            else:
                updates, state = tx.update(grads, state, params, mask=m)
            return (optax.apply_updates(params, updates), state), None

        def loop(params, state, idx, mask):
            return jax.lax.scan(step, (params, state), (idx, mask))[0][0]

        return loop


def certify_baseline(correlation, b, epochs, eps, delta, trunc, key):
    """A certified sigma for ``C`` at ``(eps, delta - trunc)`` (the certifier ``optimize`` uses)."""
    cert = BallsInBins(correlation, b, epochs).certify_noise(eps, delta - trunc, key=key)
    if not cert.verified:
        raise RuntimeError(f"the certificate of a baseline did not verify: {cert.reason}")
    return float(cert.noise_multiplier), float(cert.delta)


def spread(values):
    v = np.asarray(values)
    return dict(mean=float(v.mean()), std=float(v.std(ddof=1)) if v.size > 1 else 0.0, min=float(v.min()),
                max=float(v.max()), values=[float(a) for a in v])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrix", default=None, metavar="FILE",
                    help="an OptimizationResult JSON (dpjax optimize --out); default: optimise one here")
    ap.add_argument("--quick", action="store_true", help="a small, fast run (b = 8, E = 4, 2 seeds)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per run (default 5; 2 with --quick)")
    ap.add_argument("--lr", type=float, default=1.0, help="SGD learning rate, the same for every run (default 1)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line")
    ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    data = load_digits()
    n = data[0].shape[0]
    t_start = time.perf_counter()
    if args.matrix is not None:
        result = OptimizationResult.load(args.matrix)
        b, epochs = result.batches_per_epoch, result.epochs
        eps, delta = result.target_epsilon, result.target_delta
    else:
        b, epochs, eps, delta = (8, 4, 2.0, 1e-5) if args.quick else (16, 16, 2.0, 1e-5)
        result = None
    shape = (result.batch_size if result is not None and result.batch_size is not None
             else smallest_batch_shape(n, b, eps, delta))
    if result is not None and result.dataset_size not in (None, n):
        raise SystemExit(f"--matrix: the result was certified for dataset_size {result.dataset_size}, "
                         f"the training set has {n} examples")
    if result is None:
        problem = CorrelationProblem(sampling=dpjax.BallsInBins(b), epochs=epochs, target_epsilon=eps,
                                     target_delta=delta, dataset_size=n, batch_size=shape)
        result = optimize_correlation(make_parameterization("blt", b * epochs, num_buffers=2 if args.quick else 4),
                                      problem, OptimizerSettings(num_steps=10 if args.quick else 300), progress=False)
    seconds = {"optimize": time.perf_counter() - t_start}
    trunc = balls_in_bins_truncation_delta(n, b, shape, eps)
    baselines = {"DP-SGD (C = I)": Toeplitz(jnp.array([1.0])), "hand BLT": HAND_BLT}
    accounted = {}
    with jax.enable_x64(True):  # float64 accounting (the model trains in float32 as usual)
        for k, (name, c) in enumerate(baselines.items()):
            sigma, cert_delta = certify_baseline(c, b, epochs, eps, delta, trunc, key=1000 + k)
            accounted[name] = dict(correlation=c, noise_multiplier=sigma, epsilon=eps, delta=cert_delta + trunc)
    runs = {name: dict(noise_multiplier=a["noise_multiplier"], epsilon=a["epsilon"], delta=a["delta"],
                       truncation_delta=trunc, accuracies=[]) for name, a in accounted.items()}
    runs["optimized " + result.parameterization["family"]] = None
    seconds["certify"] = time.perf_counter() - t_start - seconds["optimize"]
    reference = []
    train = Trainer(data, args.lr)
    for seed in range(seeds):
        setup = training_setup(result, dataset_size=n, batch_size=shape, clip_norm=CLIP, seed=seed)
        for name, a in accounted.items():
            tx = correlated_noise_aggregate(streaming_noise(a["correlation"]), a["noise_multiplier"], CLIP, shape,
                                            jax.random.fold_in(jax.random.key(seed), 1))
            runs[name]["accuracies"].append(train(name, setup.sampler, tx, seed))
        opt = "optimized " + result.parameterization["family"]
        if runs[opt] is None:
            runs[opt] = dict(noise_multiplier=setup.noise_multiplier, epsilon=setup.epsilon, delta=setup.delta,
                             truncation_delta=setup.truncation_delta, accuracies=[],
                             certified_for_sampler=setup.certified_for_sampler)
        runs[opt]["accuracies"].append(train(opt, setup.sampler, setup.transform, seed))
        reference.append(train("non-private", setup.sampler, None, seed))
    with jax.enable_x64(True):
        for name, r in runs.items():
            c = accounted[name]["correlation"] if name in accounted else result.correlation()
            r["prefix_sum_rmse"] = float(prefix_sum_rmse(c, r["noise_multiplier"], b * epochs))
            r["test_accuracy"] = spread(r.pop("accuracies"))
    out = dict(settings=dict(dataset="sklearn digits", num_train=n, num_test=int(data[2].shape[0]),
                             batches_per_epoch=b, epochs=epochs, batch_size=shape, target_epsilon=eps,
                             target_delta=delta, truncation_delta=trunc, seeds=seeds, learning_rate=args.lr,
                             model=f"MLP 64-{HIDDEN}-10 tanh", clip_norm=CLIP, matrix=args.matrix),
               runs=runs, non_private=dict(test_accuracy=spread(reference)),
               machine=dict(platform=platform.platform(), processor=platform.processor() or platform.machine()),
               seconds=dict(seconds, train=time.perf_counter() - t_start - sum(seconds.values())))
    print(f"digits: N = {n} train, {out['settings']['num_test']} test; b = {b}, E = {epochs}, batch shape B = "
          f"{shape}, truncation term {trunc:.2g}; {seeds} seeds; SGD learning rate {args.lr}")
    print(f"\n{'run':20s} {'sigma':>7s} {'eps':>5s} {'delta (cert.)':>13s} {'RMSE':>7s}  test accuracy: mean +- sd "
          "[min, max]")
    for name, r in list(runs.items()) + [("non-private", None)]:
        acc = (r or out["non_private"])["test_accuracy"]
        head = (f"{name:20s} {r['noise_multiplier']:7.3f} {r['epsilon']:5.2f} {r['delta']:13.3e} "
                f"{r['prefix_sum_rmse']:7.2f}" if r else f"{name:20s} {'':7s} {'':5s} {'':13s} {'':7s}")
        print(f"{head}  {acc['mean']:.4f} +- {acc['std']:.4f} [{acc['min']:.4f}, {acc['max']:.4f}]")
    print("(delta = the certificate's, failure probability included, plus the truncation term; RMSE = prefix-sum "
          f"RMSE of the noise, sigma |A C^-1|_F / sqrt(n), n = {b * epochs})")
    if args.json:
        print(json.dumps(out))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
