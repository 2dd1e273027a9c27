"""Monotone root finding with a fixed iteration count, and its implicit-differentiation adjoint.

Calibration problems in DP accounting have one shape: a privacy quantity ``f(x; theta)``
(delta at a fixed epsilon, or a certified epsilon) is *monotone* in a scalar ``x`` (the noise
multiplier, or epsilon itself), and we want the boundary of the feasible set
``{x : f(x; theta) <= target}``.  Two requirements follow from dpjax's guarantees:

* **Soundness.**  A root finder returns *some* point near the boundary; we return the end of the
  final bracket that lies *inside* the feasible set, so ``f(root; theta) <= target`` holds for the
  returned value (up to the accuracy of ``f`` itself), never the midpoint.
* **Jit/vmap friendliness.**  Bisection with a *fixed* number of iterations is a
  ``lax.fori_loop`` of static length: it compiles once, its cost is known, and ``vmap`` over
  ``theta``/``target``/``bracket`` calibrates a batch in one call.  With ``log_scale=True`` the
  bracket is halved in ``log x``, so ``k`` iterations reach a relative width of
  ``(upper / lower) ** (2 ** -k)``; 50 iterations take ``[1e-3, 1e4]`` to ~1.4e-14 relative.
  Below ~``|log x| * 2.2e-16`` relative (adjacent float64 values of ``log x``) more iterations
  do not shrink the bracket further: 64 iterations on ``[1e-3, 1e3]`` reach that floor
  (~1e-15 relative), not the 7.5e-19 the formula would give.

Bisection is piecewise constant in ``theta``, so autodiff through it gives zero.  The implicit
function theorem gives the true derivative of the root ``x*(theta)`` of ``f(x*, theta) = target``
(Choquette-Choo et al. 2024, §4.2; docs/design.md §5)::

    d x*/d theta  = -(df/dtheta) / (df/dx)     at (x*, theta)
    d x*/d target =  1 / (df/dx)

:class:`ImplicitAdjoint` implements exactly this as a ``jax.custom_vjp`` (in the style of
optimistix's ``ImplicitAdjoint``): the backward pass costs one VJP of ``f`` at the root, whatever
the number of bisection steps.  :class:`StopGradientAdjoint` returns the value with zero gradient
(for the final certificate, where no gradient is wanted).

Usage::

    import jax, jax.numpy as jnp
    from dpjax.calibration import solve_monotone_root

    # x* solving x**2 * theta = target on [0.1, 10]  (f increasing in x)
    f = lambda x, theta: theta * x**2
    root = lambda theta: solve_monotone_root(
        f, theta, 4.0, (0.1, 10.0), decreasing=False).root
    root(1.0)            # ~2.0 (the lower end of the final bracket: f(root) <= 4)
    jax.grad(root)(1.0)  # d/dtheta sqrt(4/theta) = -1.0
"""

# The code lives in dpjax.numerics.root (a foundation module: the Monte Carlo layer, below this one,
# solves with it too); this module is its public import path.
from dpjax.numerics.root import (ImplicitAdjoint, Solution, SolverStats, SolverStatus, StopGradientAdjoint,
                                 bisect_monotone, solve_monotone_root)

#: Every public name of the solver module but its integer bisection (an internal of the samplers).
__all__ = ["SolverStatus", "Solution", "SolverStats", "bisect_monotone", "ImplicitAdjoint", "StopGradientAdjoint",
           "solve_monotone_root"]
