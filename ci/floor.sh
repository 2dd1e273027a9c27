#!/usr/bin/env bash
# dpjax at the oldest supported versions of its runtime dependencies (ci/constraints-floor.txt,
# the lower bounds in pyproject.toml): a fresh virtualenv, then a fast subset of the test suite
# that covers every layer (PLD, float32 callers, Monte Carlo, calibration, matrices, the optax
# loop, the compile options and the private-JAX fallbacks).
#
#   bash ci/floor.sh [VENV_DIR]      # default VENV_DIR: .venv-floor (git-ignored)
#
# docs/supported-versions.md records the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-floor}"
python -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -c ci/constraints-floor.txt jax jaxlib optax numpy scipy \
  "pytest>=7" "pytest-xdist>=3" "hypothesis>=6" "mpmath>=1.3" "flatbuffers>=24" "dp-accounting==0.6.0"
"$venv/bin/python" -m pip install -q --no-deps -e .
"$venv/bin/python" -m pip list 2>/dev/null | grep -E -i "^(jax|jaxlib|optax|numpy|scipy|chex|ml.dtypes) "
"$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" -n 2 \
  tests/pld/test_pld_core.py tests/pld/test_pld_gaussian.py tests/pld/test_float32_pld.py tests/montecarlo/test_float32_montecarlo.py \
  tests/calibration/test_calibration_root.py tests/matrices/test_matrices.py tests/optimization/test_optimization.py tests/_base/test_xla_options.py \
  tests/_base/test_jax_private.py tests/_base/test_results.py tests/test_imports.py
