"""dpjax's private-JAX uses (dpjax/_base/jax_private.py) and their fallbacks.

Each private name is made missing (its lookup pointed at a name JAX does not have: what a JAX
release that renames it looks like to dpjax) and the public fallback must give the same
numbers, and the same decisions where it can see them.  A scan of dpjax's source checks that no
other module reads private JAX.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax._base import jax_private as _jax_private

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_private_jax_is_read_in_one_module_only():
    private = re.compile(r"jax\._src|from jax import _src|jax\.interpreters|jax\.lib\b|jaxlib\.|_cache_size\(\)"
                         r"|_ensure_backends_initialized")
    offenders = []
    for path in sorted((ROOT / "dpjax").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "dpjax/_base/jax_private.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if private.search(code) and "_jax_private" not in code:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


def _decisions():
    """under_jit's answer eagerly, under grad, vmap, jit, grad-in-jit and vmap-in-jit."""
    seen = {}

    def probe(label):
        def f(x):
            seen[label] = _jax_private.under_jit([x])
            return x * 2.0
        return f

    x = jnp.float32(1.5)
    seen["eager"] = _jax_private.under_jit([x])
    jax.grad(probe("grad"))(x)
    jax.vmap(probe("vmap"))(jnp.ones(3))
    jax.jit(probe("jit"))(x)
    jax.jit(jax.grad(probe("grad_in_jit")))(x)
    jax.jit(jax.vmap(probe("vmap_in_jit")))(jnp.ones(3))
    return seen


def _missing(monkeypatch, constant):
    module, _ = getattr(_jax_private, constant)
    monkeypatch.setattr(_jax_private, constant, (module, "renamed_in_a_later_jax"))
    assert _jax_private._private(getattr(_jax_private, constant)) is None


def test_under_jit_fallback_makes_the_same_decisions(monkeypatch):
    private = _decisions()
    assert private == {"eager": False, "grad": False, "vmap": False, "jit": True, "grad_in_jit": True,
                       "vmap_in_jit": True}
    _missing(monkeypatch, "UNDER_JIT")
    assert _decisions() == private


def test_float64_contract_without_the_private_helper(monkeypatch):
    from dpjax.pld import gaussian_delta

    def delta(mu):
        return gaussian_delta(1.0, mu)

    mu = jnp.float32(0.8)
    with_private = (float(delta(mu)), float(jax.grad(delta)(mu)), np.asarray(jax.vmap(delta)(jnp.ones(2) * mu)))
    _missing(monkeypatch, "UNDER_JIT")
    without = (float(delta(mu)), float(jax.grad(delta)(mu)), np.asarray(jax.vmap(delta)(jnp.ones(2) * mu)))
    assert without[:2] == with_private[:2]
    np.testing.assert_array_equal(without[2], with_private[2])
    with pytest.raises(ValueError, match="jax_enable_x64"):
        jax.jit(delta)(mu)  # still the clear error, not a lowering failure


def test_compile_options_fallback_gives_the_same_numbers(monkeypatch):
    from dpjax._base import xla as _xla

    f = _xla.jit(lambda x: jnp.cumsum(jnp.exp(-x * jnp.arange(1.0, 65.0))))
    with jax.enable_x64(True):
        x = jnp.float64(0.3)
        with_options = np.asarray(f(x))
        assert _jax_private.top_level_trace() is True
        _missing(monkeypatch, "TRACE_STATE_CLEAN")
        assert _jax_private.top_level_trace() is False and not _xla._use_options()
        np.testing.assert_array_equal(np.asarray(f(x)), with_options)


def test_jit_cache_size_says_when_it_is_unavailable():
    f = jax.jit(lambda x: x + 1)
    f(1.0)
    assert _jax_private.jit_cache_size(f) == 1
    with pytest.raises(NotImplementedError):
        _jax_private.jit_cache_size(lambda x: x)
