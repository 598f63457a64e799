"""Stepping stone and thermodynamic integration on a Gaussian path with an analytic answer.

Path: reference ref = N(0, 1), unnormalised target gamma(x) = c * exp(-x^2 / (2 s^2)), so

    l(x) = log gamma(x) - log ref(x) = log c + 0.5 log(2 pi) - x^2 / 2 * (1/s^2 - 1).

pi_b ∝ ref * exp(b l) is N(0, v_b) with precision 1/v_b = 1 + b (1/s^2 - 1), and

    Z(b) = int ref exp(b l) dx = exp(b (log c + 0.5 log 2 pi)) * v_b^{1/2},

so log Z(1)/Z(0) = log c + 0.5 log(2 pi) + log s (= log of int gamma = c sqrt(2 pi) s) and
E_b[l] = log c + 0.5 log(2 pi) - (1/s^2 - 1) v_b / 2, the exact integrand of TI.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

from pgmflow.tasks.tempering import estimators as E
from pgmflow.tasks.tempering.schedule import initial_schedule

C, SIG = 3.0, 0.5
CONST = np.log(C) + 0.5 * np.log(2 * np.pi)
KAPPA = 1.0 / SIG**2 - 1.0  # l(x) = CONST - KAPPA x^2 / 2
TRUTH = np.log(C) + 0.5 * np.log(2 * np.pi) + np.log(SIG)


def variance(b):
    return 1.0 / (1.0 + b * KAPPA)


def loglik(x):
    return CONST - 0.5 * KAPPA * x**2


def exact_trapezoid(betas):
    """TI's target on this ladder: the trapezoid rule of the exact E_b[l] (no Monte Carlo)."""
    f = CONST - 0.5 * KAPPA * variance(betas)
    return float(np.sum(np.diff(betas) * (f[1:] + f[:-1]) / 2))


def draw_loglik(rng, betas, T, rho=0.0):
    """loglik [K, T] of exact draws from each pi_b: iid (rho = 0) or AR(1) with exact marginals."""
    eps = rng.standard_normal((betas.shape[0], T))
    if rho:
        eps[:, 0] /= np.sqrt(1 - rho**2)
        eps = scipy.signal.lfilter([np.sqrt(1 - rho**2)], [1.0, -rho], eps, axis=-1)
    x = eps * np.sqrt(variance(betas))[:, None]
    return loglik(x)


BETAS = initial_schedule(12, kind="power", power=2.0)


def test_truth_is_consistent_with_the_path():
    # the closed form of log Z(b) differentiates to E_b[l]
    b, h = 0.37, 1e-6
    logZ = lambda b: b * CONST + 0.5 * np.log(variance(b))  # noqa: E731
    d = (logZ(b + h) - logZ(b - h)) / (2 * h)
    assert d == pytest.approx(CONST - 0.5 * KAPPA * variance(b), rel=1e-7)
    assert logZ(1.0) - logZ(0.0) == pytest.approx(TRUTH, rel=1e-14)


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_estimates_within_3_se_of_truth(rho):
    ll = draw_loglik(np.random.default_rng(11), BETAS, 5000, rho)
    fwd, rev = E.stepping_stone_both(BETAS, ll)
    assert E.stepping_stone(BETAS, ll) == fwd
    for est in (fwd, rev):
        assert 0 < est.se < 0.05
        assert abs(est.estimate - TRUTH) < 3 * est.se
    ti = E.thermodynamic_integration(BETAS, ll)
    assert 0 < ti.se < 0.05
    assert abs(ti.estimate - exact_trapezoid(BETAS)) < 3 * ti.se
    # TI's discretisation bias on this ladder is small but real, and not in the se
    bias = exact_trapezoid(BETAS) - TRUTH
    assert 1e-5 < abs(bias) < 0.01
    assert abs(ti.estimate - TRUTH) < 3 * ti.se + abs(bias)


def coverage(rho, n_seeds=50, T=1500):
    hits = {"ss": 0, "ss_rev": 0, "ti": 0, "ti_naive": 0}
    target_ti = exact_trapezoid(BETAS)
    c = np.zeros_like(BETAS)
    c[:-1] += np.diff(BETAS) / 2
    c[1:] += np.diff(BETAS) / 2
    for seed in range(n_seeds):
        ll = draw_loglik(np.random.default_rng([rho > 0, seed]), BETAS, T, rho)
        fwd, rev = E.stepping_stone_both(BETAS, ll)
        ti = E.thermodynamic_integration(BETAS, ll)
        naive_se = np.sqrt(np.sum(c**2 * ll.var(axis=1, ddof=1) / T))  # pretends draws are iid
        hits["ss"] += abs(fwd.estimate - TRUTH) < 2 * fwd.se
        hits["ss_rev"] += abs(rev.estimate - TRUTH) < 2 * rev.se
        hits["ti"] += abs(ti.estimate - target_ti) < 2 * ti.se
        hits["ti_naive"] += abs(ti.estimate - target_ti) < 2 * naive_se
    return {k: v / n_seeds for k, v in hits.items()}


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_standard_errors_are_calibrated(rho):
    frac = coverage(rho)
    for key in ("ss", "ss_rev", "ti"):
        assert 0.8 <= frac[key] <= 1.0, (key, frac)
    if rho:
        # the ESS correction matters: an iid se under-covers autocorrelated draws
        # (l is quadratic in x, so its lag-t autocorrelation is 0.81^t and tau = 1.81/0.19 ~ 9.5)
        assert frac["ti_naive"] < 0.7, frac


def test_stepping_stone_known_answers_and_stability():
    betas = np.array([0.0, 0.25, 1.0])
    ll = np.array([[2.0, 2.0, 2.0], [-4.0, -4.0, -4.0], [7.0, 7.0, 7.0]])
    fwd, rev = E.stepping_stone_both(betas, ll)
    assert fwd.estimate == pytest.approx(0.25 * 2.0 + 0.75 * -4.0, abs=1e-14)
    assert rev.estimate == pytest.approx(0.25 * -4.0 + 0.75 * 7.0, abs=1e-14)
    assert fwd.se == 0.0 and rev.se == 0.0
    # two draws: log mean exp by hand
    ll2 = np.array([[0.0, np.log(3.0)], [5.0, 5.0]])
    assert E.stepping_stone([0.0, 1.0], ll2).estimate == pytest.approx(np.log(2.0), abs=1e-14)
    # a huge offset in l shifts the answer exactly by offset * (b_{K-1} - b_0) without overflow
    ll = draw_loglik(np.random.default_rng(3), BETAS, 500)
    base = E.stepping_stone(BETAS, ll)
    shifted = E.stepping_stone(BETAS, ll + 1e5)
    assert np.isfinite(shifted.estimate)
    assert shifted.estimate - 1e5 == pytest.approx(base.estimate, abs=1e-8)
    assert shifted.se == pytest.approx(base.se, rel=1e-8)
    assert np.isfinite(E.stepping_stone(BETAS, ll - 1e5).estimate)


def test_thermodynamic_integration_known_answer():
    # E_b[l] linear in b is integrated exactly by the trapezoid rule
    betas = np.array([0.0, 0.1, 0.5, 1.0])
    means = 2.0 - 3.0 * betas
    ll = means[:, None] + np.array([-1.0, 1.0, 1.0, -1.0])[None, :]
    est = E.thermodynamic_integration(betas, ll)
    assert est.estimate == pytest.approx(2.0 - 1.5, abs=1e-14)
    assert est.se > 0


def test_per_level_summary():
    rng = np.random.default_rng(4)
    x = np.vstack([rng.standard_normal(4000) * 2 + 1, np.full(4000, 5.0)])
    s = E.per_level_summary(x)
    assert s.mean == pytest.approx([1.0, 5.0], abs=0.1)
    assert s.var[0] == pytest.approx(4.0, rel=0.1)
    assert s.var[1] == 0.0 and s.ess[1] == 4000 and s.mcse[1] == 0.0
    assert s.mcse[0] == pytest.approx(np.sqrt(s.var[0] / s.ess[0]))


def test_inputs_are_validated():
    with pytest.raises(ValueError, match="shape"):
        E.stepping_stone(BETAS, np.zeros((3, 10)))
    bad = np.zeros((BETAS.shape[0], 10))
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="levels \\[2\\]"):
        E.thermodynamic_integration(BETAS, bad)
    with pytest.raises(ValueError, match="direction"):
        E.stepping_stone(BETAS, np.zeros((BETAS.shape[0], 10)), direction="both")
    with pytest.raises(ValueError, match="strictly increasing"):
        E.stepping_stone([0.0, 0.0, 1.0], np.zeros((3, 10)))


# --- joint standard errors (correlation between levels, as parallel tempering creates) ------------


def draw_loglik_shared(rng, betas, T, shared):
    """Exact draws whose noise is partly shared across levels at each scan (correlation ``shared``)."""
    z_common = rng.standard_normal(T)
    z_own = rng.standard_normal((betas.shape[0], T))
    eps = np.sqrt(shared) * z_common[None, :] + np.sqrt(1 - shared) * z_own
    x = np.abs(eps) * np.sqrt(variance(betas))[:, None]  # |x|: l depends on x^2 only; keep the marginal
    return loglik(x)


def test_joint_estimates_equal_the_level_wise_ones():
    ll = draw_loglik(np.random.default_rng(0), BETAS, 4000)
    fwd, rev = E.stepping_stone_both(BETAS, ll)
    joint = E.stepping_stone_joint(BETAS, ll)
    assert joint.estimate == pytest.approx(0.5 * (fwd.estimate + rev.estimate), abs=1e-12)
    assert E.thermodynamic_integration_joint(BETAS, ll).estimate == pytest.approx(
        E.thermodynamic_integration(BETAS, ll).estimate, abs=1e-12
    )


def test_joint_se_matches_level_wise_se_for_independent_levels():
    ll = draw_loglik(np.random.default_rng(1), BETAS, 20000)
    lvl = 0.5 * sum(e.se for e in E.stepping_stone_both(BETAS, ll))
    assert E.stepping_stone_joint(BETAS, ll).se == pytest.approx(lvl, rel=0.15)
    assert E.thermodynamic_integration_joint(BETAS, ll).se == pytest.approx(
        E.thermodynamic_integration(BETAS, ll).se, rel=0.15
    )


def test_joint_se_is_calibrated_when_levels_are_correlated():
    """With strongly shared noise the level-wise SE (independence) is too small; the joint one is not."""
    rng = np.random.default_rng(2)
    hits_joint = hits_levels = 0
    n = 60
    for _ in range(n):
        ll = draw_loglik_shared(rng, BETAS, 3000, shared=0.9)
        j = E.thermodynamic_integration_joint(BETAS, ll)
        lv = E.thermodynamic_integration(BETAS, ll)
        target = exact_trapezoid(BETAS)
        hits_joint += abs(j.estimate - target) < 2 * j.se
        hits_levels += abs(lv.estimate - target) < 2 * lv.se
    assert 0.85 <= hits_joint / n <= 1.0
    assert hits_levels / n < 0.8  # the independence assumption fails here, and the test can tell
