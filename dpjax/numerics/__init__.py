"""Numerical infrastructure below the accountants: the monotone root finder and its implicit
adjoint, the exact Gaussian curve, Renyi-DP of the (subsampled) Gaussian, and the compiled-program cache."""
