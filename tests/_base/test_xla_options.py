"""dpjax._base.xla.jit: XLA:CPU compile options for one-shot programs, without changing any number."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpjax._base import xla as _xla


@pytest.fixture
def restore_xla(monkeypatch):
    monkeypatch.setattr(_xla, "_enabled", True)
    yield
    # monkeypatch restores _enabled (and anything else the test patched)


def test_top_level_call_uses_the_options_and_nested_calls_do_not(restore_xla, monkeypatch):
    monkeypatch.setattr(_xla, "MAX_LIVE_PROGRAMS", 10**9)   # counts programs: nothing dropped meanwhile
    f = _xla.jit(lambda x: jnp.sin(x) * 2.0 + 1.0)
    if jax.default_backend() == "cpu":
        assert _xla.compile_options() == _xla.CPU_COMPILE_OPTIONS
    y = f(0.5)
    assert f._fast._cache_size() == (1 if jax.default_backend() == "cpu" else 0)
    # Explicit lower/compile (as the profiling and export code does) gives the same program.
    assert float(f.lower(0.5).compile()(0.5)) == float(y)
    # Under a user's jit, vmap and grad the plain program is staged (JAX refuses
    # compiler_options on a nested jit): same numbers, no error.
    np.testing.assert_allclose(float(jax.jit(lambda x: f(x) - 1.0)(0.5)), float(y) - 1.0, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(jnp.array([0.5, 0.5]))), [float(y)] * 2, rtol=1e-7)
    np.testing.assert_allclose(float(jax.grad(f)(0.5)), 2.0 * np.cos(0.5), rtol=1e-6)


def test_unknown_option_falls_back_to_the_plain_program(monkeypatch, restore_xla):
    if jax.default_backend() != "cpu":
        pytest.skip("the options are only passed on CPU")
    monkeypatch.setattr(_xla, "CPU_COMPILE_OPTIONS", {"xla_cpu_option_that_does_not_exist": True})
    f = _xla.jit(lambda x: x * 3.0)
    assert float(f(2.0)) == 6.0
    assert _xla._enabled is False          # disabled for the rest of the process...
    assert _xla.compile_options() == {}
    assert float(f(4.0)) == 12.0           # ...and the plain program keeps answering


def test_other_errors_are_not_swallowed(restore_xla):
    f = _xla.jit(lambda x: x.reshape((3,)))
    with pytest.raises(TypeError):
        f(jnp.ones(4))
    assert _xla._enabled is True


def _compiled_epsilon(sigma, q, steps, delta):
    """The compiled PLD program's certified epsilon of one DP-SGD configuration (the program the
    sweeps and the fixed-grid functions compile)."""
    import dataclasses

    import dpjax
    from dpjax.pld.grid import engine
    from dpjax.pld.grid import program as prog

    opts = dpjax.pld.GridOptions()
    groups, _, _, _ = engine.prepare(engine.dpsgd_components(sigma, q, steps), opts.max_distinct)
    plan = dpjax.pld.plan_grid(groups, ("remove", "add"), tail_mass=opts.tail_fraction * delta, eps_hint=None,
                               target_delta=delta, options=opts)
    plan = dataclasses.replace(plan, n=1 << (int(plan.n) - 1).bit_length())
    with jax.enable_x64(True):
        inp, spec = prog.host_inputs(plan, [delta], kinds=("up", "down"), want="eps")
        out = np.asarray(prog.run_jit(np.int32(1), prog.stack_inputs([inp], 8), prog.jit_spec(spec)))
    return out[0][..., 0]


def test_switch_off_gives_identical_program_results(monkeypatch, restore_xla):
    # The options change code generation, not arithmetic semantics.  Code generation may contract
    # other multiply-adds, which moves the last bits of the FFT round-off, and the per-bin noise
    # floor allowance is measured from that round-off (about 1e-17 per bin, over ~1e5 bins above
    # epsilon at delta 1e-5): the bracket moves by ~1e-10 relative, far below its width.
    from dpjax.pld.grid import program as prog

    on = _compiled_epsilon(1.3, 0.02, 300, 1e-5)
    prog._jitted.cache_clear()
    monkeypatch.setattr(_xla, "_enabled", False)
    off = _compiled_epsilon(1.3, 0.02, 300, 1e-5)
    np.testing.assert_allclose(on, off, rtol=1e-8, atol=0)


@pytest.mark.slow
def test_live_programs_are_bounded_and_the_numbers_unchanged(monkeypatch):
    # Each XLA:CPU executable holds ~190 memory mappings; with one program per shape, a process
    # that compiled a few hundred programs passed Linux's 65,530 and crashed in the next compile.
    # Past MAX_LIVE_PROGRAMS every dpjax cache is dropped.
    configs = [(0.9, 0.004, 300, 1e-5), (1.7, 0.02, 40, 1e-7), (3.1, 0.1, 7, 1e-4), (0.6, 0.001, 2000, 1e-6)]
    before = [_compiled_epsilon(*c) for c in configs]
    monkeypatch.setattr(_xla, "MAX_LIVE_PROGRAMS", 1)
    after = []
    for c in configs:
        after.append(_compiled_epsilon(*c))
        # Only the function just called keeps its program (the limit is per process, not per call).
        assert sum(j.live_programs() for j in list(_xla._INSTANCES)) <= 2
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)
