"""TESLA's node-wise logistic coefficients to an MRF (``from_network.mrf_at``) reproduce a known MRF's
conditionals exactly; the held-out log-likelihood against exact enumeration; the sandwich check."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pgmflow.tasks.bounds import exact, from_network, heldout, summary, trw
from pgmflow.tasks.bounds import mrf as M


def random_mrf(rng, p, density=0.5, scale=0.7):
    J = np.triu(rng.normal(0.0, scale, (p, p)) * (rng.random((p, p)) < density), 1)
    return J + J.T, rng.normal(0.0, 0.4, p)


def joint(J, h):
    """All 2^p states [S, p] and their probabilities [S], by enumeration."""
    p = h.size
    X = np.array(list(itertools.product([-1, 1], repeat=p)), dtype=np.float64)
    lp = X @ h + 0.5 * np.einsum("si,ij,sj->s", X, J, X)
    w = np.exp(lp - lp.max())
    return X, w / w.sum()


def conditional_log_odds(J, h):
    """log P(x_i = +1 | x_-i) - log P(x_i = -1 | x_-i) for every node and state, [S, p], from the joint alone."""
    X, prob = joint(J, h)
    p = h.size
    index = np.arange(len(prob))  # itertools.product's order: node j is bit p - 1 - j of the index (+1: set)
    out = np.empty_like(X)
    for i in range(p):
        bit = 1 << (p - 1 - i)
        out[:, i] = np.log(prob[index | bit]) - np.log(prob[index & ~bit])
    return X, out


def logistic_coefficients(J, h):
    """theta [p, p] of the node-wise regressions ``P(x_i | x_-i) = sigmoid(2 x_i theta_i . z)``, ``z_j = x_j``
    (j != i), ``z_i = 1``, fitted exactly (least squares on the enumerated log-odds / 2: no noise)."""
    X, lo = conditional_log_odds(J, h)
    p = h.size
    theta = np.empty((p, p))
    for i in range(p):
        Z = X.copy()
        Z[:, i] = 1.0
        theta[i] = np.linalg.lstsq(Z, lo[:, i] / 2.0, rcond=None)[0]
    return theta


@pytest.mark.parametrize("p", [3, 8, 12])
def test_converter_reproduces_the_conditionals_exactly(p):
    rng = np.random.default_rng(p)
    J, h = random_mrf(rng, p)
    theta = logistic_coefficients(J, h)  # [p, p]; TESLA's layout is [p, T, p]
    Jc, hc = from_network.mrf_at(np.stack([np.zeros_like(theta), theta], axis=1), 1)
    np.testing.assert_allclose(Jc, J, atol=1e-9)
    np.testing.assert_allclose(hc, h, atol=1e-9)
    X, lo = conditional_log_odds(J, h)
    _, lo_c = conditional_log_odds(Jc, hc)
    np.testing.assert_allclose(lo_c, lo, atol=1e-8)
    np.testing.assert_allclose(lo, 2.0 * (h + X @ J), atol=1e-8)  # the stated convention


def test_converter_averages_the_two_estimates_of_a_coupling():
    theta = np.array([[0.3, 0.5, 0.0], [0.1, -0.2, 0.4], [0.0, 0.6, 0.7]])[:, None, :]
    J, h = from_network.mrf_at(theta, 0)
    np.testing.assert_array_equal(h, [0.3, -0.2, 0.7])
    np.testing.assert_allclose(J, [[0, 0.3, 0], [0.3, 0, 0.5], [0, 0.5, 0]])


def test_heldout_log_likelihood_against_enumeration():
    rng = np.random.default_rng(3)
    J, h = random_mrf(rng, 9)
    model = M.from_dense(J, h)
    X, prob = joint(J, h)
    draws = X[rng.choice(len(prob), size=500, p=prob)]
    log_z = exact.log_z_enumeration(model)
    b = summary.compute_bounds(model, trw.spanning_tree_rho(model, seed=0))
    res = heldout.heldout_log_likelihood(model, draws, log_z, 0.01, b.mf, b.trw)
    direct = float(np.mean(np.log(prob[[int(np.flatnonzero((X == d).all(1))[0]) for d in draws]])))
    assert res.log_lik == pytest.approx(direct, abs=1e-9)
    assert res.lower <= res.log_lik <= res.upper and res.sandwich_ok and res.n_samples == 500
    exact_mean = float(prob @ M.energy_terms(model, X)) - log_z  # the expected log-likelihood (negative entropy)
    assert abs(res.log_lik - exact_mean) < 4 * res.se_samples


def test_sandwich_check_reports_an_estimate_outside_the_bracket():
    assert heldout.sandwich_ok(5.0, 0.1, 4.0, 6.0)
    assert heldout.sandwich_ok(3.75, 0.1, 4.0, 6.0)  # 2.5 SE below MF: within 3 SE
    assert not heldout.sandwich_ok(3.6, 0.1, 4.0, 6.0)
    assert not heldout.sandwich_ok(6.4, 0.1, 4.0, 6.0)
    assert not heldout.sandwich_ok(float("nan"), 0.1, 4.0, 6.0)
    model = M.from_dense(np.array([[0.0, 0.5], [0.5, 0.0]]))
    res = heldout.heldout_log_likelihood(model, np.array([[1, 1], [-1, 1]]), 10.0, 0.1, 1.0, 2.0)
    assert not res.sandwich_ok
    with pytest.raises(ValueError, match="not ordered"):
        heldout.heldout_log_likelihood(model, np.array([[1, 1]]), 1.5, 0.1, 2.0, 1.0)
    with pytest.raises(ValueError, match="spins"):
        heldout.heldout_log_likelihood(model, np.array([[1, 0]]), 1.5, 0.1, 1.0, 2.0)
