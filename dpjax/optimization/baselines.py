"""Baselines for optimised correlation matrices, all in one normalization (docs/design.md §6.4).

The setting of the table in Choquette-Choo, Ganesh, Haque, Steinke & Thakurta, "Near exact
privacy amplification for matrix mechanisms", §5.1: ``n = b E`` rounds (``b`` batches per
epoch, ``E`` epochs), target ``(epsilon, delta)``.

**Normalization (every row).**  ``C`` lower-triangular with ``c_0 = 1``; the mechanism releases
``C x + z``, ``z ~ N(0, sigma^2 I)`` per coordinate, clip norm 1, and ``sigma`` is the noise
multiplier that makes it ``(epsilon, delta)``-DP under the row's batching and accounting.  The
reported error is the prefix-sum RMSE

    rmse = sigma * |A C^{-1}|_F / sqrt(n)          (A = lower-triangular ones)

(:func:`dpjax.optimization.prefix_sum_error` times ``sigma``).  A ``C`` given with another
diagonal (jax_privacy's unit-norm banded coefficients) is the same mechanism with ``sigma``
scaled by ``c_0``; ``rmse`` is invariant.  ``rmse_jax_privacy = rmse / E`` is the same number in
jax_privacy's ``BandMFConfig.rmse`` normalization (``sigma_total / k * sqrt(mean per-query
squared error)`` with ``k = E`` participations), so the rows read across with numbers quoted in
that normalization.

Rows (each a :class:`BaselineRow`):

* :func:`dpsgd_unamplified` -- ``C = I``, fixed batches: Gaussian mechanism with sensitivity
  ``sqrt(E)`` (exact).
* :func:`dpsgd_poisson` -- ``C = I``, Poisson sampling ``q = 1/b`` for ``n`` steps, dpjax PLD
  accountant (certified upper bound).
* :func:`balls_in_bins_certified` -- any ``C`` (``C = I`` for DP-SGD) under balls-in-bins
  batching, Monte Carlo: ``sigma`` calibrated and certified by the Estimate-Verify-Release
  ladder of :func:`dpjax.montecarlo.evr.certify_noise`; the certificate is in the row.
* :func:`unamplified_optimum` -- the optimum of a family (:mod:`.parameterizations`) without
  amplification: ``sigma = sensitivity(C) * gaussian_noise_multiplier(eps, delta)``, the
  sensitivity for ``E`` participations ``b`` apart.
* :func:`banded_cyclic_poisson_pld` -- dpjax's own banded matrices (the family's optimum for
  each band count) under cyclic Poisson sampling, PLD-accounted, the best band count per epsilon
  (``dpjax optimize --amplification cyclic_poisson``).
* :func:`banded_cyclic_poisson` -- jax_privacy's banded matrices under (block-)cyclic Poisson
  sampling (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Thm 4, as
  implemented by ``matrix_factorization.toeplitz.optimize_coefs_for_amplifications``), with its
  own RDP accounting, and the same coefficients re-accounted with dpjax's PLD accountant.
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from dpjax._base import validate as _validate
from dpjax._base.results import ResultMixin
from dpjax.matrices import Toeplitz
from dpjax.montecarlo import Certificate
from dpjax.optimization.objectives import prefix_sum_error

__all__ = [
    "BaselineRow",
    "NORMALIZATION",
    "dpsgd_unamplified",
    "dpsgd_poisson",
    "dpsgd_balls_in_bins",
    "balls_in_bins_certified",
    "unamplified_optimum",
    "banded_cyclic_poisson",
    "banded_cyclic_poisson_pld",
    "jax_privacy_banded_coefficients",
]

NORMALIZATION = ("rmse = sigma * |A C^-1|_F / sqrt(n), C lower-triangular with c_0 = 1, sigma the "
                 "noise multiplier (clip norm 1) of the row's (epsilon, delta) guarantee; "
                 "rmse_jax_privacy = rmse / E (jax_privacy BandMFConfig.rmse: sigma_total / k * "
                 "sqrt(mean per-query squared error), k = E participations)")


@dataclasses.dataclass(frozen=True)
class BaselineRow(ResultMixin):
    """One row of the table.

    Attributes:
      name: what the row is (e.g. ``"dpsgd_poisson"``).
      epsilon, delta: the privacy target.
      noise_multiplier: ``sigma`` for ``C`` normalised to ``c_0 = 1``.
      error: ``|A C^{-1}|_F / sqrt(n)`` (noise-free).
      rmse: ``sigma * error``.
      rmse_jax_privacy: ``rmse / epochs``.
      accounting: how ``sigma`` was obtained (one line).
      first_column: ``C``'s first column (truncated to its support for banded ``C``), or None.
      extra: row-specific details (bands, timings, ...).
      certificate: the Estimate-Verify-Release :class:`~dpjax.montecarlo.Certificate` of a
        Monte Carlo row (:func:`balls_in_bins_certified`), ``None`` for the other rows.

    ``to_dict()`` / ``to_json(path)`` (strict JSON) / ``BaselineRow.load(path)``: see
    :mod:`dpjax._base.results`.
    """

    name: str
    epsilon: float
    delta: float
    batches_per_epoch: int
    epochs: int
    noise_multiplier: float
    error: float
    rmse: float
    rmse_jax_privacy: float
    accounting: str
    first_column: list | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    certificate: Certificate | None = None

    _nested = {"certificate": Certificate}
    _plain = frozenset({"first_column", "extra"})


def _row(name, eps, delta, b, epochs, sigma, error, accounting, column=None, certificate=None,
         **extra) -> BaselineRow:
    rmse = float(sigma) * float(error)
    col = None if column is None else [float(x) for x in np.asarray(column, np.float64)]
    return BaselineRow(name=name, epsilon=float(eps), delta=float(delta), batches_per_epoch=int(b),
                       epochs=int(epochs), noise_multiplier=float(sigma), error=float(error),
                       rmse=rmse, rmse_jax_privacy=rmse / epochs, accounting=accounting,
                       first_column=col, extra=extra, certificate=certificate)


def _check(eps, delta, b, epochs):
    eps = float(_validate.positive("epsilon", eps))
    delta = float(_validate.probability_open("delta", delta))
    b = _validate.positive_int("batches_per_epoch", b)
    epochs = _validate.positive_int("epochs", epochs)
    return eps, delta, b, epochs


def _identity_error(n: int) -> float:
    # A I^{-1} = A: row t has t + 1 ones; |A|_F^2 = n (n + 1) / 2.
    return math.sqrt((n + 1) / 2.0)


def dpsgd_unamplified(epsilon, delta, batches_per_epoch, epochs) -> BaselineRow:
    """``C = I`` with fixed batches: ``E`` compositions of a Gaussian mechanism (exact)."""
    from dpjax.calibration import gaussian_noise_multiplier

    eps, delta, b, epochs = _check(epsilon, delta, batches_per_epoch, epochs)
    sigma = float(gaussian_noise_multiplier(eps, delta, steps=epochs))
    return _row("dpsgd_unamplified", eps, delta, b, epochs, sigma, _identity_error(b * epochs),
                f"exact Gaussian, sensitivity sqrt(E) = {math.sqrt(epochs):.4g}", column=[1.0])


def dpsgd_poisson(epsilon, delta, batches_per_epoch, epochs) -> BaselineRow:
    """``C = I`` with Poisson sampling ``q = 1/b`` for ``n = b E`` steps (dpjax PLD, certified)."""
    from dpjax.calibration import dpsgd_noise_multiplier

    eps, delta, b, epochs = _check(epsilon, delta, batches_per_epoch, epochs)
    n = b * epochs
    sigma = float(dpsgd_noise_multiplier(1.0 / b, n, eps, delta))
    return _row("dpsgd_poisson", eps, delta, b, epochs, sigma, _identity_error(n),
                f"dpjax PLD, Poisson q = 1/{b}, {n} steps", column=[1.0])


def dpsgd_balls_in_bins(epsilon, delta, batches_per_epoch, epochs) -> BaselineRow:
    """``C = I`` under balls-in-bins batching (each example in one of ``b`` batches per epoch):
    dpjax's random-allocation PLD accountant (exact up to its certified discretization; no Monte
    Carlo), the smallest noise multiplier it certifies for ``(epsilon, delta)``."""
    from dpjax.calibration import dpsgd_noise_multiplier
    from dpjax.pld.scenario import BallsInBins

    eps, delta, b, epochs = _check(epsilon, delta, batches_per_epoch, epochs)
    sigma = float(dpsgd_noise_multiplier(sampling=BallsInBins(b), epochs=epochs, target_epsilon=eps,
                                         target_delta=delta))
    return _row("dpsgd_balls_in_bins", eps, delta, b, epochs, sigma, _identity_error(b * epochs),
                f"dpjax PLD, balls-in-bins, b = {b}, {epochs} epochs", column=[1.0])


#: Certificate size of the Bernoulli-KL method of :func:`balls_in_bins_certified` when none is
#: given (verification samples; 0.41 delta verified at delta = 1e-5).
DEFAULT_CERTIFY_SAMPLES = 1 << 23


def balls_in_bins_certified(correlation, epsilon, delta, batches_per_epoch, epochs, *,
                            name="balls_in_bins", settings=None) -> BaselineRow:
    """``C`` under balls-in-bins batching, with a noise multiplier certified by EVR.

    The ladder of :func:`dpjax.montecarlo.evr.certify_noise` (the one every dpjax certificate
    uses), as ``settings`` (a :class:`~dpjax.optimization.CertifySettings`; default
    ``CertifySettings()``) states it: ``sigma_0`` calibrated on ``calibration_samples`` draws
    (default ``num_samples // 4``), then ``max_attempts`` pre-committed rungs ``sigma_0 growth^j``
    verified on ``num_samples`` independent draws (default: the method's), the first passing
    rung released; the stated failure probability is the union bound over the rungs.  ``method``:
    ``"importance_betting"`` (default) or ``"bernoulli_kl"`` (:mod:`dpjax.montecarlo.evr`); ``key``:
    the draws' seed or JAX key (default 0).  The certificate is in the row (``certificate``).

    Raises ValueError if ``num_samples`` cannot certify ``delta`` or no rung verifies.
    """
    from dpjax.montecarlo import BallsInBins, evr
    from dpjax.optimization.certify import CertifySettings

    if settings is None:
        settings = CertifySettings()
    elif not isinstance(settings, CertifySettings):
        raise ValueError(f"settings must be a dpjax.optimization.CertifySettings(...), got {settings!r}")
    eps, delta, b, epochs = _check(epsilon, delta, batches_per_epoch, epochs)
    n = b * epochs
    acc = BallsInBins(correlation, b, epochs)
    t0 = time.perf_counter()
    cert = evr.certify_noise(acc, target_epsilon=eps, target_delta=delta, num_samples=settings.num_samples,
                             key=0 if settings.key is None else settings.key, method=settings.method,
                             ladder=evr.Ladder(rungs=settings.max_attempts, growth=settings.growth,
                                               calibration_samples=settings.calibration_samples))
    t_total = time.perf_counter() - t0
    if not cert.verified:
        raise ValueError(f"no noise multiplier verified (epsilon={eps:g}, delta={delta:g}): {cert.reason}")
    from dpjax.matrices import correlation_array

    column = correlation_array(correlation, n)
    error = float(prefix_sum_error(correlation, n))
    col = np.asarray(column) if np.ndim(column) == 1 else None
    return _row(name, eps, delta, b, epochs, cert.noise_multiplier, error,
                f"dpjax Monte Carlo balls-in-bins, EVR-certified ({cert.method}, {cert.num_tests} tests, "
                f"{cert.num_samples} samples)",
                method=cert.method,
                column=None if col is None else np.trim_zeros(col, "b"),
                noise_multiplier_estimate=cert.noise_multiplier_estimate, base_delta=cert.base_delta,
                calibration_samples=cert.calibration_samples, certificate=cert,
                seconds=t_total)


def unamplified_optimum(parameterization, epsilon_values, delta, batches_per_epoch, epochs, *,
                        params=None, max_iterations=1000, name=None) -> list[BaselineRow]:
    """The unamplified optimum of a family at each epsilon (one optimisation: it is eps-free).

    ``params`` (optional) skips the optimisation.  ``sigma = sensitivity(C) * s(eps, delta)`` with
    ``s`` the single-Gaussian noise multiplier (exact) and the sensitivity for ``E``
    participations ``b`` apart (:func:`~dpjax.optimization.unamplified_sensitivity`).
    """
    from dpjax.calibration import gaussian_noise_multiplier
    from dpjax.optimization.parameterizations import unamplified_sensitivity

    _, delta, b, epochs = _check(1.0, delta, batches_per_epoch, epochs)
    t0 = time.perf_counter()
    if params is None:
        params = parameterization.init(batches_per_epoch=b, epochs=epochs, max_iterations=max_iterations)
    t_opt = time.perf_counter() - t0
    n = parameterization.n
    corr = parameterization.correlation(params)
    column = parameterization.first_column(params)
    with jax.enable_x64(True):
        sens = float(unamplified_sensitivity(jnp.asarray(column), b, epochs))
    error = float(prefix_sum_error(corr, n))
    rows = []
    for eps in epsilon_values:
        eps = float(_validate.positive("epsilon", eps))
        s = float(gaussian_noise_multiplier(eps, delta))
        rows.append(_row(name or f"unamplified_{parameterization.name}", eps, delta, b, epochs, s * sens,
                         error, f"exact Gaussian, sensitivity {sens:.6g} (E={epochs} participations, "
                         f"{b} apart)", column=np.trim_zeros(np.asarray(column), "b"),
                         family=parameterization.to_dict(), sensitivity=sens,
                         optimize_seconds=t_opt))
    return rows


def jax_privacy_banded_coefficients(n: int, bands: int, *, max_optimizer_steps: int = 250):
    """jax_privacy's optimised ``bands``-banded Toeplitz coefficients (unit L2 norm; eps-free)."""
    from jax_privacy.matrix_factorization import toeplitz

    with jax.enable_x64(True):
        return np.asarray(toeplitz.optimize_banded_toeplitz(n=int(n), bands=int(bands),
                                                            max_optimizer_steps=max_optimizer_steps),
                          np.float64)


def _jax_privacy_rdp_noise_multiplier(n, bands, dataset_size, batch_size, eps, delta) -> float:
    """The total noise multiplier jax_privacy's ``optimize_coefs_for_amplifications`` uses."""
    from jax_privacy.matrix_factorization import toeplitz

    helper = toeplitz._AmplifiedBandMFHelper(n, dataset_size, batch_size, eps, delta)  # noqa: SLF001
    with jax.enable_x64(True):
        return float(helper.total_noise_multiplier(bands=int(bands)))


def banded_cyclic_poisson(epsilon_values, delta, batches_per_epoch, epochs, *, dataset_size=None,
                          batch_size=None, coefficients=None, bands_list=None,
                          max_optimizer_steps=250) -> list[BaselineRow]:
    """Best banded ``C`` under cyclic Poisson sampling: jax_privacy's choice, RDP and dpjax PLD.

    Reproduces ``jax_privacy.matrix_factorization.toeplitz.optimize_coefs_for_amplifications``
    (``n = b E``, ``dataset_size / batch_size = b``, default ``batch_size = 512``): for each
    band count among the factors of ``dataset_size`` up to ``b`` it takes
    ``optimize_banded_toeplitz`` coefficients (eps-free, so computed once per band count and
    reused for every epsilon: ``coefficients`` maps bands -> coefficients to skip this) and
    jax_privacy's RDP noise multiplier for ``ceil(n / bands)`` participations with sampling
    probability ``batch_size / (dataset_size / bands) = bands / b``; the best RMSE wins.  Each
    epsilon gives two rows: ``banded_cyclic_poisson_rdp`` (jax_privacy's accounting) and
    ``banded_cyclic_poisson_pld`` (the same coefficients, noise multiplier from dpjax's PLD
    accountant for the same sampled Gaussian).  ``extra["per_bands"]`` has every band count.
    """
    from dpjax.calibration import dpsgd_noise_multiplier

    _, delta, b, epochs = _check(1.0, delta, batches_per_epoch, epochs)
    n = b * epochs
    if batch_size is None:
        batch_size = 512
    if dataset_size is None:
        dataset_size = b * int(batch_size)
    if dataset_size != b * batch_size:
        raise ValueError(f"dataset_size must equal batches_per_epoch * batch_size = {b * batch_size}, "
                         f"got {dataset_size}")
    if bands_list is None:
        bands_list = [d for d in range(1, b + 1) if dataset_size % d == 0]
    coefficients = dict(coefficients or {})
    times = {}
    for bands in bands_list:
        if bands not in coefficients:
            t0 = time.perf_counter()
            coefficients[bands] = jax_privacy_banded_coefficients(n, bands, max_optimizer_steps=max_optimizer_steps)
            times[bands] = time.perf_counter() - t0
    # Error of each banded C (scale-invariant in the product sigma * error; use c_0 = 1).
    errors = {}
    for bands, coef in coefficients.items():
        coef = np.asarray(coef, np.float64)
        errors[bands] = float(prefix_sum_error(Toeplitz(jnp.asarray(coef / coef[0])), n))
    eps_values = [float(_validate.positive("epsilon", e)) for e in epsilon_values]
    # Noise multipliers per band count for all epsilons at once (dpjax's PLD calibration is
    # vectorized over epsilon).
    z_rdp, z_pld = {}, {}
    for bands in bands_list:
        k = math.ceil(n / bands)
        z_rdp[bands] = [_jax_privacy_rdp_noise_multiplier(n, bands, dataset_size, batch_size, e, delta)
                        for e in eps_values]
        z_pld[bands] = [float(z) for z in np.atleast_1d(np.asarray(
            dpsgd_noise_multiplier(bands / b, k, np.asarray(eps_values), delta)))]
    rows = []
    for i, eps in enumerate(eps_values):
        per = []
        for bands in bands_list:
            coef = np.asarray(coefficients[bands], np.float64)
            sens = float(np.linalg.norm(coef)) / coef[0]  # per-participation sensitivity, c_0 = 1
            k = math.ceil(n / bands)
            q = bands / b
            zr, zp = z_rdp[bands][i], z_pld[bands][i]
            per.append({"bands": bands, "sampling_prob": q, "participations": k, "sensitivity": sens,
                        "error": errors[bands], "noise_multiplier_rdp": zr * sens,
                        "noise_multiplier_pld": zp * sens,
                        "rmse_rdp": zr * sens * errors[bands], "rmse_pld": zp * sens * errors[bands]})
        best = min(per, key=lambda r: r["rmse_rdp"])  # jax_privacy's choice (its own accounting)
        coef = np.asarray(coefficients[best["bands"]], np.float64)
        for acct in ("rdp", "pld"):
            label = ("jax_privacy RDP (its own accounting)" if acct == "rdp"
                     else "dpjax PLD re-accounting of jax_privacy's RDP-chosen coefficients")
            rows.append(_row(f"banded_cyclic_poisson_{acct}", eps, delta, b, epochs,
                             best[f"noise_multiplier_{acct}"], best["error"],
                             f"{label}; {best['bands']} bands, q = {best['sampling_prob']:g}, "
                             f"{best['participations']} participations",
                             column=coef / coef[0], bands=best["bands"], dataset_size=dataset_size,
                             batch_size=batch_size, per_bands=per,
                             best_bands_pld=min(per, key=lambda r: r["rmse_pld"])["bands"],
                             optimize_seconds=times))
    return rows


def banded_cyclic_poisson_pld(epsilon_values, delta, batches_per_epoch, epochs, *, bands_list=None,
                              max_iterations=1000, name="banded_cyclic_poisson") -> list[BaselineRow]:
    """dpjax's own banded ``C`` under cyclic Poisson sampling, accounted with dpjax's PLD.

    Choquette-Choo, Dvijotham, Pillutla, Ganesh, Steinke & Thakurta 2023, "(Amplified) banded matrix
    factorization", Thm 4: in the normalization of this module, a participation touches ``bands``
    consecutive rows of a banded ``C`` and participations are ``b >= bands`` rounds apart, so the
    mechanism is DP-SGD
    with sampling probability ``q = bands / b`` for ``ceil(n / bands)`` steps at noise multiplier
    ``sigma / |c|_2`` (``c_0 = 1``).  For each band count (default: the divisors of ``b``) the
    coefficients are the family's optimum of ``|c|_2^2 |A C^-1|_F^2`` (eps-free: the unamplified
    objective of :func:`~dpjax.optimization.unamplified_loss`, whose sensitivity for participations
    ``b >= bands`` apart is ``sqrt(E) |c|_2``), the noise multiplier is the PLD accountant's
    (:func:`dpjax.calibration.dpsgd_noise_multiplier`: its epsilon at ``delta`` is at most the
    target, a certified bound, exact up to the accountant's discretization), and the band count with
    the smallest rmse is kept, per epsilon.  ``extra["per_bands"]`` has every band count.
    """
    from dpjax.calibration import dpsgd_noise_multiplier
    from dpjax.optimization.parameterizations import make_parameterization

    _, delta, b, epochs = _check(1.0, delta, batches_per_epoch, epochs)
    n = b * epochs
    eps_values = [float(_validate.positive("epsilon", e)) for e in epsilon_values]
    if bands_list is None:
        bands_list = [d for d in range(1, b + 1) if b % d == 0]
    per = []
    for bands in bands_list:
        bands = _validate.positive_int("bands", bands, maximum=b)
        t0 = time.perf_counter()
        par = make_parameterization("banded", n, bands=bands)
        params = par.init(batches_per_epoch=b, epochs=epochs, max_iterations=max_iterations)
        col = np.asarray(par.first_column(params), np.float64)[:bands]
        error = float(prefix_sum_error(par.correlation(params), n))
        z = np.atleast_1d(np.asarray(dpsgd_noise_multiplier(
            sampling_prob=bands / b, steps=math.ceil(n / bands), target_epsilon=np.asarray(eps_values),
            target_delta=delta), np.float64))
        sens = float(np.linalg.norm(col))
        per.append({"bands": bands, "sampling_prob": bands / b, "steps": math.ceil(n / bands),
                    "sensitivity": sens, "error": error, "first_column": col.tolist(),
                    "noise_multiplier": (z * sens).tolist(), "rmse": (z * sens * error).tolist(),
                    "seconds": time.perf_counter() - t0})
    rows = []
    for i, eps in enumerate(eps_values):
        best = min(per, key=lambda r: r["rmse"][i])
        rows.append(_row(name, eps, delta, b, epochs, best["noise_multiplier"][i], best["error"],
                         f"dpjax PLD, cyclic Poisson: {best['bands']} bands, q = {best['sampling_prob']:g}, "
                         f"{best['steps']} steps", column=best["first_column"], bands=best["bands"],
                         per_bands=[{k: (v[i] if isinstance(v, list) and k in ("noise_multiplier", "rmse") else v)
                                     for k, v in r.items() if k != "first_column"} for r in per]))
    return rows
