"""Likelihoods for SVGP (Hensman, Fusi and Lawrence 2013; Hensman, Matthews and Ghahramani 2015 for
non-conjugate ones): Gaussian, Bernoulli (probit or logit link), Poisson (log link), Student-t.

What SVGP needs of a likelihood ``p(y | f)`` is the *variational expectation* of one row under the
marginal ``q(f_i) = N(mu_i, var_i)`` of the variational posterior,

    E_i(mu_i, var_i) = E_{q(f_i)}[log p(y_i | f_i)],

and its derivatives ``g_i = dE_i/dmu_i``, ``h_i = dE_i/dvar_i`` and w.r.t. the likelihood's own
parameter (:func:`variational_expectations`). ``(g, h)`` feed both the hyperparameter gradient (the
chain rule through ``mu_i = k_i' alpha`` and ``var_i = k_ii - k_i' C k_i``; ``pgmflow.tasks.gp.svgp``)
and the natural-gradient step of ``q(u)``.

Closed forms and quadrature
---------------------------
* Gaussian, ``log N(y; f, s2)``: ``E = -log(2 pi s2)/2 - ((y - mu)^2 + var) / (2 s2)``.
* Poisson with the log link, ``log p = y f - exp(f) - log y!``:
  ``E = y mu - exp(mu + var/2) - log y!`` (the log-normal mean), ``g = y - exp(mu + var/2)``,
  ``h = -exp(mu + var/2) / 2``.
* Bernoulli (``y in {0, 1}``, ``s = 2y - 1``): ``log Phi(s f)`` (probit) or ``log sigmoid(s f)``
  (logit), Student-t (``nu`` degrees of freedom, scale ``sigma``, ``s2 = sigma^2``): no closed form;
  Gauss-Hermite quadrature with ``Q`` points ``(x_k, w_k)`` (``numpy.polynomial.hermite.hermgauss``):

      E ~= sum_k w_k log p(y | f_k) / sqrt(pi),           f_k = mu + sqrt(2 var) x_k
      g ~= sum_k w_k d/df log p(y | f_k) / sqrt(pi)                       (d/dmu of the rule)
      h ~= sum_k w_k x_k d/df log p(y | f_k) / (sqrt(pi) sqrt(2 var))     (d/dvar of the rule)

  the exact derivatives of the rule, so that the ELBO and its gradient agree to rounding (tested by
  finite differences). With the nodes paired ``+-x_k`` and equal weights, ``h <= 0`` whenever
  ``d/df log p`` decreases, i.e. for every log-concave likelihood (Bernoulli, Poisson, Gaussian). Below
  ``sqrt(var) = 1e-6`` Price's theorem, ``dE/dvar = E[d2/df2 log p] / 2``, replaces the division, which
  would lose the digits there (the two agree as ``var -> 0``).
* The probit's *predictive* probability is closed: ``p(y=1) = E[Phi(f)] = Phi(mu / sqrt(1 + var))``.

The likelihood's own parameter travels as ``log_noise`` (the slot the Gaussian noise variance has in
``GPParams``): the Gaussian's ``s2``, the Student-t's squared scale ``sigma^2``; Bernoulli and Poisson
have none (its gradient is 0, so Adam leaves it where it started). The Student-t's ``nu`` is fixed by
the config (``sparse_gp.student_t_dof``).

The natural-gradient step of q(u) for any likelihood
----------------------------------------------------
``q(v) = N(m, S)`` in whitened coordinates (``u = L v``, ``p(v) = N(0, I)``), natural parameters
``theta = (S^-1 m, -S^-1/2)``, expectation parameters ``eta = (m, S + m m')``. For an exponential
family the natural gradient w.r.t. ``theta`` is the ordinary gradient w.r.t. ``eta`` (Hensman et al.
2013, sec. 3.1; Khan and Lin 2017). With ``a_i = L^-1 k_i``, ``mu_i = a_i' m``,
``var_i = k_ii - a_i'a_i + a_i' S a_i``, and ``c = n / b`` the minibatch weight:

    dE/dm = c sum_i g_i a_i,   dE/dS = c sum_i h_i a_i a_i'
    dE/d eta2 = dE/dS,         dE/d eta1 = dE/dm - 2 (dE/dS) m = c sum_i (g_i - 2 h_i mu_i) a_i

and ``-KL(q(v) || N(0, I))`` has natural gradient ``theta_prior - theta`` with
``theta_prior = (0, -I/2)``. A step of size ``rho`` is therefore

    theta1 <- (1 - rho) theta1 + rho c sum_i (g_i - 2 h_i mu_i) a_i
    theta2 <- (1 - rho) theta2 + rho (-I/2 + c sum_i h_i a_i a_i')

For the Gaussian (``g = (y - mu)/s2``, ``h = -1/(2 s2)``) this is the familiar conjugate step with
``g - 2 h mu = y / s2`` (the code keeps that form, bit for bit). With ``h <= 0`` (log-concave) the new
``-2 theta2`` stays positive definite for every ``rho`` in (0, 1]. The Student-t is not log-concave:
``h_i > 0`` for outlying rows can make the full step indefinite, and ``pgmflow.tasks.gp.svgp.natgrad_step``
then halves ``rho`` for that step until it is not (a fixed point is still a stationary point of the ELBO).

Predictions and held-out scores
-------------------------------
:func:`predict_y` gives the predictive mean and variance of a new ``y`` (Bernoulli: the class-1
probability ``p`` and ``p (1 - p)``; Poisson: the rate ``E[exp f] = exp(mu + var/2)`` and the count
variance ``E[rate] + Var[rate]``; Student-t: ``mu`` and ``var + s2 nu / (nu - 2)``),
:func:`predictive_log_density` ``log p(y* | data)`` (quadrature where not closed),
:func:`predictive_quantiles` quantiles of ``y*`` (bisection on the quadrature mixture's CDF).
:func:`test_sums` returns per-chunk sums that add: ``(rows, squared-error sum, NLPD sum, extra)`` where
``extra`` is the number of correct classifications (Bernoulli), the Poisson deviance
``2 sum (y log(y / r) - (y - r))`` (Poisson), or the number of rows inside the central 90 % predictive
interval (Student-t); :func:`test_metrics` turns summed ones into metrics.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import scipy.special as sp

__all__ = [
    "LIKELIHOODS",
    "LINKS",
    "Likelihood",
    "check_targets",
    "gauss_hermite",
    "log_density",
    "predict_y",
    "predictive_log_density",
    "predictive_quantiles",
    "reliability_sums",
    "test_metrics",
    "test_sums",
    "variational_expectations",
    "variational_expectations_quadrature",
]

LIKELIHOODS = ("gaussian", "bernoulli", "poisson", "student_t")
LINKS = ("probit", "logit")
_LOG2PI = math.log(2.0 * math.pi)
_SQRT_PI = math.sqrt(math.pi)


class Likelihood(NamedTuple):
    """A likelihood ``p(y | f)`` (picklable, sent to the workers with the model).

    name: gaussian | bernoulli | poisson | student_t. link: probit | logit (Bernoulli only).
    dof: the Student-t's degrees of freedom ``nu`` (> 0; fixed). quadrature_points: Gauss-Hermite points.
    """

    name: str = "gaussian"
    link: str = "probit"
    dof: float = 4.0
    quadrature_points: int = 20

    @property
    def conjugate(self) -> bool:
        return self.name == "gaussian"

    @property
    def has_param(self) -> bool:
        """Whether ``log_noise`` means something (a Gaussian noise variance, a Student-t squared scale)."""
        return self.name in ("gaussian", "student_t")


GAUSSIAN = Likelihood()


@functools.lru_cache(maxsize=16)
def gauss_hermite(q: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``x`` [q] and weights ``w / sqrt(pi)`` [q] for ``E_{N(0,1)}[g(z)] ~= sum w_k g(sqrt(2) x_k)``."""
    x, w = np.polynomial.hermite.hermgauss(int(q))
    x.setflags(write=False)
    w = w / _SQRT_PI
    w.setflags(write=False)
    return x, w


def _check(lik: Likelihood):
    if lik.name not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood {lik.name!r}; use one of {', '.join(LIKELIHOODS)}")
    if lik.name == "bernoulli" and lik.link not in LINKS:
        raise ValueError(f"unknown link {lik.link!r}; use one of {', '.join(LINKS)}")


def log_density(lik: Likelihood, y, f, log_noise: float = 0.0, derivatives: bool = False):
    """``log p(y | f)`` (broadcast over ``y`` and ``f``); with ``derivatives`` also ``d/df``, ``d2/df2`` and
    ``d/dlog_noise`` of it: a tuple of four arrays."""
    _check(lik)
    y = np.asarray(y, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    name = lik.name
    if name == "gaussian":
        s2 = math.exp(float(log_noise))
        r = y - f
        lp = -0.5 * (_LOG2PI + float(log_noise)) - r * r / (2.0 * s2)
        if not derivatives:
            return lp
        return lp, r / s2, np.full(np.broadcast(y, f).shape, -1.0 / s2), -0.5 + r * r / (2.0 * s2)
    if name == "bernoulli":
        s = 2.0 * y - 1.0
        z = s * f
        if lik.link == "probit":
            lp = sp.log_ndtr(z)
            if not derivatives:
                return lp
            ratio = np.exp(-0.5 * z * z - 0.5 * _LOG2PI - lp)  # phi(z) / Phi(z)
            return lp, s * ratio, -ratio * (z + ratio), np.zeros_like(lp)
        lp = -np.logaddexp(0.0, -z)
        if not derivatives:
            return lp
        sig = sp.expit(z)
        return lp, s * (1.0 - sig), -sig * (1.0 - sig), np.zeros_like(lp)
    if name == "poisson":
        rate = np.exp(f)
        lp = y * f - rate - sp.gammaln(y + 1.0)
        if not derivatives:
            return lp
        return lp, y - rate, -rate, np.zeros_like(lp)
    # student_t
    nu = float(lik.dof)
    s2 = math.exp(float(log_noise))
    r = y - f
    den = nu * s2 + r * r
    const = sp.gammaln(0.5 * (nu + 1.0)) - sp.gammaln(0.5 * nu) - 0.5 * math.log(nu * math.pi)
    lp = const - 0.5 * float(log_noise) - 0.5 * (nu + 1.0) * np.log1p(r * r / (nu * s2))
    if not derivatives:
        return lp
    d1 = (nu + 1.0) * r / den
    d2 = (nu + 1.0) * (r * r - nu * s2) / (den * den)
    dln = -0.5 + 0.5 * (nu + 1.0) * r * r / den
    return lp, d1, d2, dln


def variational_expectations_quadrature(lik: Likelihood, y, mu, var, log_noise: float = 0.0):
    """``(E [b], dE/dmu [b], dE/dvar [b], dE/dlog_noise [b])`` by Gauss-Hermite quadrature (see the module
    docstring), for any likelihood."""
    x, w = gauss_hermite(lik.quadrature_points)
    y = np.asarray(y, dtype=np.float64)[:, None]
    mu = np.asarray(mu, dtype=np.float64)
    sd = np.sqrt(np.maximum(np.asarray(var, dtype=np.float64), 0.0))
    f = mu[:, None] + (math.sqrt(2.0) * sd)[:, None] * x[None, :]  # [b, q]
    lp, d1, d2, dln = log_density(lik, y, f, log_noise, derivatives=True)
    # dE/dvar: the derivative of the rule, sum_k w_k d1(f_k) x_k / sqrt(2 var); Price's form
    # E[d2] / 2 where var is so small that the division would lose the digits (the two agree as var -> 0)
    tiny = sd < 1e-6
    h = (d1 @ (w * x)) / (math.sqrt(2.0) * np.where(tiny, 1.0, sd))
    h = np.where(tiny, 0.5 * (d2 @ w), h)
    return lp @ w, d1 @ w, h, dln @ w


def variational_expectations(lik: Likelihood, y, mu, var, log_noise: float = 0.0):
    """``(E [b], dE/dmu [b], dE/dvar [b], dE/dlog_noise [b])``: ``E_i = E_{N(f; mu_i, var_i)}[log p(y_i | f)]``
    and its derivatives; closed forms for the Gaussian and the Poisson, quadrature otherwise."""
    _check(lik)
    y = np.asarray(y, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    if lik.name == "gaussian":
        s2 = math.exp(float(log_noise))
        r = y - mu
        e = -0.5 * (_LOG2PI + float(log_noise)) - (r * r + var) / (2.0 * s2)
        return e, r / s2, np.full(e.shape, -0.5 / s2), -0.5 + (r * r + var) / (2.0 * s2)
    if lik.name == "poisson":
        er = np.exp(mu + 0.5 * var)  # E[exp f]
        e = y * mu - er - sp.gammaln(y + 1.0)
        return e, y - er, -0.5 * er, np.zeros_like(e)
    return variational_expectations_quadrature(lik, y, mu, var, log_noise)


# ------------------------------------------------------------------------------------------------
# predictions
# ------------------------------------------------------------------------------------------------


def _nodes(lik: Likelihood, mu, var):
    x, w = gauss_hermite(lik.quadrature_points)
    sd = np.sqrt(np.maximum(np.asarray(var, dtype=np.float64), 0.0))
    return np.asarray(mu, dtype=np.float64)[:, None] + (math.sqrt(2.0) * sd)[:, None] * x[None, :], w  # [n, q]


def class_probability(lik: Likelihood, mu, var) -> np.ndarray:
    """Bernoulli: ``p(y* = 1) = E_{N(f; mu, var)}[link^-1(f)]`` [n] (probit: ``Phi(mu / sqrt(1 + var))``)."""
    mu = np.asarray(mu, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    if lik.link == "probit":
        return sp.ndtr(mu / np.sqrt(1.0 + var))
    f, w = _nodes(lik, mu, var)
    return sp.expit(f) @ w


def predict_y(lik: Likelihood, mu, var, log_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean and variance [n] of a new ``y`` from the latent ``N(mu, var)`` (module docstring)."""
    _check(lik)
    mu = np.asarray(mu, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    if lik.name == "gaussian":
        return mu, var + math.exp(float(log_noise))
    if lik.name == "bernoulli":
        p = class_probability(lik, mu, var)
        return p, p * (1.0 - p)
    if lik.name == "poisson":
        rate = np.exp(mu + 0.5 * var)
        return rate, rate + rate * rate * np.expm1(var)  # E[r] + Var[r] (log-normal r)
    nu = float(lik.dof)
    extra = math.exp(float(log_noise)) * nu / (nu - 2.0) if nu > 2.0 else math.inf
    return mu, var + extra


def predictive_log_density(lik: Likelihood, y, mu, var, log_noise: float = 0.0) -> np.ndarray:
    """``log p(y* | data) = log E_{N(f; mu, var)}[p(y* | f)]`` [n] (closed for Gaussian and Bernoulli-probit,
    quadrature in log space otherwise)."""
    _check(lik)
    y = np.asarray(y, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    if lik.name == "gaussian":
        v = var + math.exp(float(log_noise))
        r = y - mu
        return -0.5 * (np.log(2.0 * np.pi * v) + r * r / v)
    if lik.name == "bernoulli" and lik.link == "probit":
        return sp.log_ndtr((2.0 * y - 1.0) * mu / np.sqrt(1.0 + var))
    f, w = _nodes(lik, mu, var)
    lp = log_density(lik, y[:, None], f, log_noise)
    return sp.logsumexp(lp + np.log(w)[None, :], axis=1)


def _cdf(lik: Likelihood, t, f, w, log_noise):
    """Predictive CDF at ``t`` [n] of the quadrature mixture (Gaussian or Student-t noise around ``f`` [n, q])."""
    scale = math.exp(0.5 * float(log_noise))
    z = (t[:, None] - f) / scale
    c = sp.stdtr(float(lik.dof), z) if lik.name == "student_t" else sp.ndtr(z)
    return c @ w


def predictive_quantiles(lik: Likelihood, mu, var, probs, log_noise: float = 0.0) -> np.ndarray:
    """Quantiles [n, len(probs)] of a new ``y`` (Gaussian and Student-t): bisection on the CDF of the
    quadrature mixture ``sum_k w_k F((y - f_k) / sigma)`` (Gaussian: closed form ``mu + z sqrt(var + s2)``)."""
    _check(lik)
    if lik.name not in ("gaussian", "student_t"):
        raise ValueError(f"predictive quantiles are for continuous targets (gaussian, student_t), not {lik.name}")
    mu = np.asarray(mu, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    probs = np.atleast_1d(np.asarray(probs, dtype=np.float64))
    if lik.name == "gaussian":
        sd = np.sqrt(var + math.exp(float(log_noise)))
        return mu[:, None] + sd[:, None] * sp.ndtri(probs)[None, :]
    f, w = _nodes(lik, mu, var)
    scale = math.exp(0.5 * float(log_noise))
    out = np.empty((mu.shape[0], probs.shape[0]))
    for j, p in enumerate(probs):  # a few probabilities; vectorised over the rows
        half = (abs(float(sp.stdtrit(float(lik.dof), p))) + 1.0) * scale + 6.0 * np.sqrt(var) + 1.0
        lo, hi = mu - half, mu + half
        for _ in range(80):  # bisection: 80 halvings reach float64 resolution of any bracket used here
            mid = 0.5 * (lo + hi)
            below = _cdf(lik, mid, f, w, log_noise) < p
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out[:, j] = 0.5 * (lo + hi)
    return out


# ------------------------------------------------------------------------------------------------
# targets and held-out scores
# ------------------------------------------------------------------------------------------------


def check_targets(lik: Likelihood, y) -> str | None:
    """None when every target fits the likelihood, else a short reason naming the first bad value."""
    y = np.asarray(y, dtype=np.float64)
    if lik.name == "bernoulli":
        bad = np.flatnonzero((y != 0.0) & (y != 1.0))
        if bad.size:
            return f"row {int(bad[0])} has the label {y[bad[0]]:g}; Bernoulli labels must be 0 or 1"
    elif lik.name == "poisson":
        bad = np.flatnonzero((y < 0.0) | (y != np.floor(y)))
        if bad.size:
            return f"row {int(bad[0])} has the count {y[bad[0]]:g}; Poisson counts must be integers >= 0"
    return None


TEST_EXTRA = {"bernoulli": "correct", "poisson": "deviance", "student_t": "inside_90"}


def test_sums(lik: Likelihood, y, mu, var, log_noise: float = 0.0, y_mean: float = 0.0, y_std: float = 1.0):
    """``(rows, squared-error sum, NLPD sum, extra)`` of held-out targets ``y`` [n] (original units) from the
    latent ``N(mu, var)`` [n] (standardised units; ``y_mean``, ``y_std``: the target's standardisation,
    identity for Bernoulli and Poisson). Squared errors: of the class-1 probability (the Brier score's sum),
    of the rate, of the predictive mean. ``extra``: see ``TEST_EXTRA`` and the module docstring."""
    _check(lik)
    y = np.asarray(y, dtype=np.float64)
    n = int(y.shape[0])
    if n == 0:
        return 0, 0.0, 0.0, 0.0
    if lik.name == "bernoulli":
        p, _ = predict_y(lik, mu, var)
        nlpd = -predictive_log_density(lik, y, mu, var)
        r = p - y
        return n, float(r @ r), float(np.sum(nlpd)), float(np.sum((p > 0.5) == (y == 1.0)))
    if lik.name == "poisson":
        rate, _ = predict_y(lik, mu, var)
        nlpd = -predictive_log_density(lik, y, mu, var)
        r = rate - y
        dev = 2.0 * (sp.xlogy(y, y) - sp.xlogy(y, rate) - (y - rate))
        return n, float(r @ r), float(np.sum(nlpd)), float(np.sum(dev))
    ys = (y - y_mean) / y_std
    nlpd = -predictive_log_density(lik, ys, mu, var, log_noise) + math.log(y_std)
    r = (mu * y_std + y_mean) - y
    if lik.name == "gaussian":
        return n, float(r @ r), float(np.sum(nlpd)), 0.0
    q = predictive_quantiles(lik, mu, var, (0.05, 0.95), log_noise)
    inside = float(np.sum((ys >= q[:, 0]) & (ys <= q[:, 1])))
    return n, float(r @ r), float(np.sum(nlpd)), inside


RELIABILITY_BINS = 10


def reliability_sums(p, y, bins: int = RELIABILITY_BINS) -> np.ndarray:
    """float64 [3, bins]: per bin of the predicted class-1 probability ``p`` ([0, 0.1), ..., [0.9, 1]),
    the rows, the sum of ``p`` and the positives ``y == 1`` -- sums that add over chunks (a reliability
    diagram: the observed frequency ``positives / rows`` against the mean predicted ``sum p / rows``)."""
    p = np.asarray(p, dtype=np.float64)
    k = np.minimum((p * bins).astype(np.int64), bins - 1)
    out = np.zeros((3, bins))
    out[0] = np.bincount(k, minlength=bins)
    out[1] = np.bincount(k, weights=p, minlength=bins)
    out[2] = np.bincount(k, weights=(np.asarray(y) == 1.0).astype(np.float64), minlength=bins)
    return out


def test_metrics(lik: Likelihood, sums) -> dict:
    """Held-out metrics from summed :func:`test_sums` (NaN without rows): every likelihood ``test_nlpd``;
    Bernoulli ``test_accuracy``, ``test_log_loss`` (= NLPD), ``test_brier``; Poisson ``test_deviance``
    (mean per row), ``test_rmse`` (of the rate); Student-t and Gaussian ``test_rmse``; Student-t
    ``test_coverage_90``."""
    n, sse, nlpd, extra = sums
    if not n:
        nan = float("nan")
        n, sse, nlpd, extra = 0, nan, nan, nan
    d = max(n, 1)
    out = {"test_nlpd": nlpd / d}
    if lik.name == "bernoulli":
        out.update(test_accuracy=extra / d, test_log_loss=nlpd / d, test_brier=sse / d)
    elif lik.name == "poisson":
        out.update(test_deviance=extra / d, test_rmse=math.sqrt(sse / d))
    else:
        out["test_rmse"] = math.sqrt(sse / d)
        if lik.name == "student_t":
            out["test_coverage_90"] = extra / d
    return out
