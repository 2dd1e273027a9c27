"""Training with an optimised correlation matrix: DP-SGD, a hand BLT and the optimised BLT.

Runs ``examples/train_dpftrl.py`` (scikit-learn's digits, an MLP, plain SGD; see its docstring)
on the matrix that ``dpjax optimize`` certifies for the digits sampler -- N = 1437 training
examples, b = 16 batches per epoch, E = 16 epochs, batch shape B = 150, (epsilon, delta) = (2,
1e-5), a 4-buffer BLT, 300 optimizer steps -- over 5 seeds per run, at each learning rate of
``--lrs`` (the same for the three runs; the first is the example's default).  Writes
``benchmarks/results/train_dpftrl.json`` (and the optimised matrix beside it,
``train_dpftrl_matrix.json``, which ``--matrix`` can reuse).

    python benchmarks/bench_train_dpftrl.py [--matrix FILE] [--seeds 5] [--lrs 1,0.5,2,4]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from _meta import run_metadata

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "examples"))

OPTIMIZE = ["optimize", "--family", "blt", "--buffers", "4", "--batches-per-epoch", "16", "--epochs", "16",
            "--epsilon", "2", "--delta", "1e-5", "--dataset-size", "1437", "--batch-size", "150",
            "--optimizer-steps", "300", "--quiet"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=None, help="an optimised result to reuse (default: optimise one)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--lrs", default="1,0.5,2,4", help="learning rates, comma-separated (the first is the main run)")
    args = ap.parse_args(argv)
    import train_dpftrl

    from dpjax.cli.main import main as dpjax_main

    t0 = time.perf_counter()
    matrix = args.matrix
    optimize_command = None
    if matrix is None:
        matrix = str(RESULTS / "train_dpftrl_matrix.json")
        optimize_command = "dpjax " + " ".join(OPTIMIZE + ["--out", "benchmarks/results/train_dpftrl_matrix.json"])
        if dpjax_main(OPTIMIZE + ["--out", matrix]) != 0:
            raise SystemExit("dpjax optimize failed")
    optimize_s = time.perf_counter() - t0
    runs = []
    for lr in [float(x) for x in args.lrs.split(",")]:
        out = train_dpftrl.main(["--matrix", matrix, "--seeds", str(args.seeds), "--lr", str(lr)])
        runs.append(out)
    main_run = runs[0]
    from dpjax.optimization import OptimizationResult

    res = OptimizationResult.load(matrix)
    record = {
        "benchmark": "bench_train_dpftrl",
        "settings": main_run["settings"],
        "matrix": {"file": pathlib.Path(matrix).name, "optimize_command": optimize_command,
                   "family": res.parameterization, "noise_multiplier": res.noise_multiplier,
                   "rmse": res.rmse, "certificate_delta": res.certificate.delta,
                   "truncation_delta": res.truncation_delta, "optimize_seconds": optimize_s},
        "runs": main_run["runs"],
        "non_private": main_run["non_private"],
        "learning_rates": [{"learning_rate": r["settings"]["learning_rate"],
                            "test_accuracy": {name: run["test_accuracy"] for name, run in r["runs"].items()}
                            | {"non-private": r["non_private"]["test_accuracy"]}} for r in runs],
        "seconds": time.perf_counter() - t0,
        "meta": run_metadata(__file__, argv),
    }
    path = RESULTS / "train_dpftrl.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return record


if __name__ == "__main__":
    main()
