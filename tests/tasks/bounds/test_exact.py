"""Exact log Z and marginals: enumeration against brute force, the transfer matrix against
enumeration, closed forms, finite differences and pgmflow.tasks.tempering.exact."""

import itertools
import math
import time

import numpy as np
import pytest
from scipy.special import logsumexp

from pgmflow.tasks.bounds import exact as X
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.tempering import exact as TE


def _brute(mrf):
    """Plain itertools enumeration: (log Z, E[x], E[x_i x_j] per edge)."""
    xs = np.array(list(itertools.product([-1.0, 1.0], repeat=mrf.n))).reshape(-1, mrf.n)
    lw = M.energy_terms(mrf, xs)
    lz = logsumexp(lw)
    p = np.exp(lw - lz)
    return lz, p @ xs, p @ (xs[:, mrf.edges[:, 0]] * xs[:, mrf.edges[:, 1]])


def _random_dense(rng, n, p=0.6, scale=1.0, hscale=1.0):
    A = rng.normal(scale=scale, size=(n, n)) * (rng.random((n, n)) < p)
    A = np.triu(A, 1)
    return M.from_dense(A + A.T, rng.normal(scale=hscale, size=n))


# --- enumeration ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11, 12, 13, 14, 16])
def test_enumeration_matches_brute_force(n):
    # n > 12 exercises the low/high split of the state index (edges within and across the halves)
    rng = np.random.default_rng(n)
    for p in (0.3, 1.0):
        mrf = _random_dense(rng, n, p=p)
        lz, mean, pair = _brute(mrf)
        r = X.exact_marginals(mrf)
        assert abs(r.log_z - lz) < 1e-10
        np.testing.assert_allclose(r.mean, mean, atol=1e-12)
        np.testing.assert_allclose(r.pair_mean, pair, atol=1e-12)
        assert r.pair_mean.shape == (mrf.E,)
        assert abs(X.log_z_enumeration(mrf) - r.log_z) < 1e-12


def test_enumeration_handles_huge_weights():
    rng = np.random.default_rng(3)
    mrf = _random_dense(rng, 14, p=1.0, scale=60.0, hscale=200.0)
    lz, mean, pair = _brute(mrf)
    r = X.exact_marginals(mrf)
    assert np.isfinite(r.log_z) and abs(r.log_z - lz) < 1e-9 * abs(lz)
    np.testing.assert_allclose(r.mean, mean, atol=1e-10)
    np.testing.assert_allclose(r.pair_mean, pair, atol=1e-10)


def test_enumeration_without_couplings_factorises():
    h = np.linspace(-2, 3, 17)
    mrf = M.make_mrf(h, np.zeros((0, 2)), [])
    r = X.exact_marginals(mrf)
    assert abs(r.log_z - np.sum(np.log(2 * np.cosh(h)))) < 1e-11
    np.testing.assert_allclose(r.mean, np.tanh(h), atol=1e-13)


def test_enumeration_agrees_with_tempering_convention():
    rng = np.random.default_rng(5)
    bh = rng.choice([-1, 1], size=(3, 4))
    bv = rng.choice([-1, 1], size=(3, 4))
    ref = TE.ising_log_z_enumeration(bh, bv, 1.3, 0.2, 0.8)["log_z"]
    mrf = M.ising_lattice(3, 4, J=1.3, h=0.2, beta=0.8, periodic=True, bonds_h=bh, bonds_v=bv)
    assert abs(X.log_z_enumeration(mrf) - ref) < 1e-11


def test_enumeration_n20_is_fast_and_n27_is_refused():
    rng = np.random.default_rng(7)
    mrf = _random_dense(rng, 20, p=0.5)
    t = time.perf_counter()
    X.exact_marginals(mrf)
    assert time.perf_counter() - t < 2.0
    with pytest.raises(ValueError, match="n <= 26"):
        X.log_z_enumeration(M.make_mrf(np.zeros(27), np.zeros((0, 2)), []))


# --- transfer matrix --------------------------------------------------------------------------------


def _random_lattice(rng, L, W, pr, pc, zero_frac=0.2):
    h = rng.normal(size=(L, W))
    Jr = rng.choice([-1, 1], size=(L, W)) * rng.uniform(0.1, 1.5, size=(L, W))
    Jd = rng.choice([-1, 1], size=(L, W)) * rng.uniform(0.1, 1.5, size=(L, W))
    Jr[rng.random((L, W)) < zero_frac] = 0.0  # zero bonds are all-ones factors, not identities
    Jd[rng.random((L, W)) < zero_frac] = 0.0
    if not pc or W == 1:
        Jr[:, -1] = 0.0
    if not pr or L == 1:
        Jd[-1, :] = 0.0
    return h, Jr, Jd


def _lattice_mrf(h, Jr, Jd):
    """The model of lattice_transfer_matrix(h, Jr, Jd) built bond by bond (wrap bonds included
    whenever the entry is non-zero)."""
    L, W = h.shape
    idx = np.arange(L * W).reshape(L, W)
    e, j = [], []
    for r in range(L):
        for c in range(W):
            if Jr[r, c] != 0:
                e.append((idx[r, c], idx[r, (c + 1) % W]))
                j.append(Jr[r, c])
            if Jd[r, c] != 0:
                e.append((idx[r, c], idx[(r + 1) % L, c]))
                j.append(Jd[r, c])
    return M.make_mrf(h.ravel(), np.array(e, dtype=np.int64).reshape(-1, 2), j)


SHAPES = [(3, 3), (4, 4), (3, 5), (5, 3), (2, 4), (4, 2), (2, 2), (1, 6), (6, 1), (1, 1), (3, 2), (6, 3), (2, 7)]


@pytest.mark.parametrize("L,W", SHAPES)
@pytest.mark.parametrize("pr,pc", [(False, False), (True, True), (True, False), (False, True)])
def test_transfer_matrix_matches_enumeration(L, W, pr, pc):
    rng = np.random.default_rng(100 * L + 10 * W + 2 * pr + pc)
    for _ in range(3):
        h, Jr, Jd = _random_lattice(rng, L, W, pr, pc)
        res = X.lattice_transfer_matrix(h, Jr, Jd, periodic_rows=pr, periodic_cols=pc)
        ex = X.exact_marginals(_lattice_mrf(h, Jr, Jd))
        assert abs(res.log_z - ex.log_z) < 1e-10
        assert res.mean.shape == (L, W)
        np.testing.assert_allclose(res.mean.ravel(), ex.mean, atol=1e-10)


@pytest.mark.parametrize("L,W", SHAPES)
@pytest.mark.parametrize("periodic", [False, True])
def test_transfer_matrix_of_an_ising_lattice_mrf(L, W, periodic):
    rng = np.random.default_rng(7 * L + W + periodic)
    bh = rng.choice([-1, 1], size=(L, W))
    bv = rng.choice([-1, 1], size=(L, W))
    mrf = M.ising_lattice(L, W, J=0.9, h=0.0, beta=1.1, periodic=periodic, bonds_h=bh, bonds_v=bv)
    mrf = mrf._replace(h=rng.normal(size=L * W))  # arbitrary per-site fields
    mrf = mrf._replace(J=mrf.J * rng.uniform(0.3, 1.6, size=mrf.E))  # and per-bond couplings
    res = X.lattice_transfer_matrix_mrf(mrf, L, W, periodic=periodic)
    ex = X.exact_marginals(mrf)
    assert abs(res.log_z - ex.log_z) < 1e-10
    np.testing.assert_allclose(res.mean.ravel(), ex.mean, atol=1e-10)


def test_lattice_arrays_round_trip_and_refusals():
    rng = np.random.default_rng(11)
    for L, W, per in [(4, 5, True), (4, 5, False), (2, 3, True), (3, 2, True), (1, 4, True)]:
        mrf = M.ising_lattice(
            L,
            W,
            beta=0.7,
            periodic=per,
            bonds_h=rng.choice([-1, 1], size=(L, W)),
            bonds_v=rng.choice([-1, 1], size=(L, W)),
        )
        mrf = mrf._replace(h=rng.normal(size=L * W))
        h, Jr, Jd = X.lattice_arrays(mrf, L, W, per)
        back = _lattice_mrf(h, Jr, Jd)
        xs = rng.choice([-1.0, 1.0], size=(50, L * W))
        np.testing.assert_allclose(M.energy_terms(back, xs), M.energy_terms(mrf, xs), atol=1e-12)
    # a diagonal bond, a wrap bond on an open lattice, the wrong size
    bad = M.make_mrf(np.zeros(9), [(0, 1), (0, 4)], [1.0, 1.0])
    with pytest.raises(ValueError, match="not a bond"):
        X.lattice_arrays(bad, 3, 3, True)
    wrap = M.ising_lattice(3, 3, periodic=True)
    with pytest.raises(ValueError, match="not a bond"):
        X.lattice_arrays(wrap, 3, 3, False)
    with pytest.raises(ValueError, match="nodes"):
        X.lattice_arrays(wrap, 3, 4, True)


def test_transfer_matrix_refuses_nonexistent_bonds_and_wide_lattices():
    h = np.zeros((3, 4))
    Jr = np.zeros((3, 4))
    Jr[1, 3] = 0.5
    with pytest.raises(ValueError, match="Jr"):
        X.lattice_transfer_matrix(h, Jr, None, periodic_rows=True, periodic_cols=False)
    Jd = np.zeros((3, 4))
    Jd[2, 0] = 0.5
    with pytest.raises(ValueError, match="Jd"):
        X.lattice_transfer_matrix(h, None, Jd, periodic_rows=False, periodic_cols=True)
    with pytest.raises(ValueError, match="width"):
        X.lattice_transfer_matrix(np.zeros((13, 14)))


def test_transfer_matrix_matches_tempering_transfer_matrix():
    rng = np.random.default_rng(13)
    for L, W in [(6, 6), (8, 5), (5, 9)]:
        bh = rng.choice([-1, 1], size=(L, W))
        bv = rng.choice([-1, 1], size=(L, W))
        hf = rng.normal(scale=0.5, size=(L, W))
        beta, J = 0.8, 1.2
        ref = TE.ising_log_z_transfer_matrix(bh, bv, J, hf, beta, derivatives=0)["log_z"]
        res = X.lattice_transfer_matrix(beta * hf, beta * J * bh, beta * J * bv, periodic_rows=True, periodic_cols=True)
        assert abs(res.log_z - ref) < 1e-10 * abs(ref)


@pytest.mark.parametrize("beta", [0.2, math.log1p(math.sqrt(2)) / 2, 0.7, 3.0])
def test_transfer_matrix_matches_kaufman_on_the_torus(beta):
    L, W = 8, 6
    res = X.lattice_transfer_matrix_mrf(M.ising_lattice(L, W, beta=beta, periodic=True), L, W, periodic=True)
    assert abs(res.log_z - TE.kaufman_log_z(L, W, 1.0, beta)) < 1e-10 * abs(res.log_z)
    np.testing.assert_allclose(res.mean, 0.0, atol=1e-12)  # zero field: spin-flip symmetry


def test_transfer_matrix_10x10_torus_is_exact_and_fast():
    beta = 0.44
    mrf = M.ising_lattice(10, 10, beta=beta, periodic=True)
    t = time.perf_counter()
    res = X.lattice_transfer_matrix_mrf(mrf, 10, 10, periodic=True)
    dt = time.perf_counter() - t
    assert abs(res.log_z - TE.kaufman_log_z(10, 10, 1.0, beta)) < 1e-11 * res.log_z
    assert dt < 10.0


def test_long_chains_match_closed_forms():
    # W = 1: a 1-D chain (exercises the per-row rescaling over thousands of rows)
    for K in (0.3, -2.0, 25.0):
        L = 3000
        Jd = np.full((L, 1), K)
        Jd[-1] = 0.0
        open_ = X.lattice_transfer_matrix(np.zeros((L, 1)), None, Jd, periodic_rows=False)
        assert abs(open_.log_z - (math.log(2) + (L - 1) * math.log(2 * math.cosh(K)))) < 1e-12 * L
        ring = X.lattice_transfer_matrix(np.zeros((L, 1)), None, np.full((L, 1), K), periodic_rows=True)
        # Z = (2 cosh K)^L + (2 sinh K)^L
        t = math.tanh(abs(K)) ** L if (L % 2 == 0 or K > 0) else -(math.tanh(abs(K)) ** L)
        assert abs(ring.log_z - (L * math.log(2 * math.cosh(K)) + math.log1p(t))) < 1e-12 * L
        np.testing.assert_allclose(ring.mean, 0.0, atol=1e-12)


def test_means_are_derivatives_of_log_z_on_a_large_lattice():
    # 7 x 9 torus (63 sites, beyond enumeration): E[x_rc] = d log Z / d h_rc (central differences)
    rng = np.random.default_rng(17)
    h, Jr, Jd = _random_lattice(rng, 7, 9, True, True, zero_frac=0.0)
    res = X.lattice_transfer_matrix(h, Jr, Jd, periodic_rows=True, periodic_cols=True)
    d = 1e-5
    for r, c in [(0, 0), (3, 4), (6, 8), (2, 7)]:
        hp, hm = h.copy(), h.copy()
        hp[r, c] += d
        hm[r, c] -= d
        zp = X.lattice_transfer_matrix(hp, Jr, Jd, periodic_rows=True, periodic_cols=True).log_z
        zm = X.lattice_transfer_matrix(hm, Jr, Jd, periodic_rows=True, periodic_cols=True).log_z
        assert abs((zp - zm) / (2 * d) - res.mean[r, c]) < 1e-7


def test_transfer_matrix_with_strong_couplings_and_fields():
    rng = np.random.default_rng(19)
    for pr, pc in [(True, True), (False, False)]:
        h, Jr, Jd = _random_lattice(rng, 4, 4, pr, pc)
        h, Jr, Jd = 40 * h, 30 * Jr, 30 * Jd
        res = X.lattice_transfer_matrix(h, Jr, Jd, periodic_rows=pr, periodic_cols=pc)
        ex = X.exact_marginals(_lattice_mrf(h, Jr, Jd))
        assert abs(res.log_z - ex.log_z) < 1e-12 * abs(ex.log_z)
        np.testing.assert_allclose(res.mean.ravel(), ex.mean, atol=1e-10)
