"""Naive mean field: a lower bound on log Z everywhere, monotone coordinate ascent, fixed points,
closed forms."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from pgmflow.tasks.bounds import exact as X
from pgmflow.tasks.bounds import mean_field as MF
from pgmflow.tasks.bounds import mrf as M


def _graph(rng, kind, n):
    if kind == "gnp":
        p = rng.uniform(0.2, 0.8)
        return [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    if kind == "tree":
        return [(int(rng.integers(0, i)), i) for i in range(1, n)]
    if kind == "cycle":
        return [(i, (i + 1) % n) for i in range(n)]
    if kind == "complete":
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    raise ValueError(kind)


def _random_models(count=240, seed=0):
    """Random small models: G(n, p), trees, cycles, complete graphs (n in 3..12) and small
    lattices, mixed-sign (frustrated) couplings up to 1.5, random fields."""
    rng = np.random.default_rng(seed)
    kinds = ["gnp", "tree", "cycle", "complete", "lattice"]
    out = []
    for t in range(count):
        kind = kinds[t % len(kinds)]
        Jmax = rng.choice([0.3, 0.8, 1.5])
        hs = rng.choice([0.0, 0.3, 1.0])
        if kind == "lattice":
            L, W = (int(v) for v in rng.integers(2, 4, size=2))
            per = bool(rng.random() < 0.5)
            mrf = M.ising_lattice(L, W, periodic=per)
            mrf = mrf._replace(J=rng.uniform(-Jmax, Jmax, size=mrf.E), h=rng.normal(scale=hs, size=L * W))
        else:
            n = int(rng.integers(3, 13))
            e = np.array(_graph(rng, kind, n), dtype=np.int64).reshape(-1, 2)
            mrf = M.make_mrf(rng.normal(scale=hs, size=n), e, rng.uniform(-Jmax, Jmax, size=e.shape[0]))
        out.append((kind, mrf))
    return out


MODELS = _random_models()


def _monotone(hist):
    return np.all(np.diff(hist) >= -1e-12 * (1.0 + np.abs(hist[1:])))


def test_bound_holds_on_random_models():
    rng = np.random.default_rng(1)
    assert len(MODELS) >= 200
    gaps = []
    for kind, mrf in MODELS:
        lz = X.log_z_enumeration(mrf)
        # arbitrary points of [-1, 1]^n, including the corners (the entropy is exactly 0 there)
        for m in [
            rng.uniform(-1, 1, mrf.n),
            rng.choice([-1.0, 1.0], mrf.n),
            np.tanh(3 * rng.normal(size=mrf.n)),
            np.zeros(mrf.n),
        ]:
            assert MF.mf_bound(mrf, m) <= lz + 1e-9, kind
        res = MF.mean_field(mrf, n_restarts=2, seed=3)
        assert res.log_z_lower <= lz + 1e-9, kind
        assert abs(res.log_z_lower - MF.mf_bound(mrf, res.mean)) < 1e-12 * (1 + abs(lz))
        assert _monotone(res.history), kind
        assert abs(res.history[-1] - res.log_z_lower) < 1e-10 * (1 + abs(lz))
        if res.converged:
            assert res.residual < 1e-8, kind
        gaps.append(lz - res.log_z_lower)
    gaps = np.array(gaps)
    # MF is not exact on coupled models, but it is a useful bound: a few nats at worst here
    assert gaps.min() >= -1e-9 and np.median(gaps) < 1.0


@pytest.mark.parametrize("damping", [0.0, 0.3, 0.8])
def test_sweeps_never_decrease_the_bound(damping):
    for kind, mrf in MODELS[::4]:
        for init in (None, np.random.default_rng(mrf.n).uniform(-1, 1, mrf.n)):
            res = MF.mean_field(mrf, damping=damping, init=init, tol=1e-12, max_iter=5000)
            assert res.history.shape == (res.n_iter + 1,)
            assert _monotone(res.history), (kind, damping)
            assert res.history[-1] >= res.history[0] - 1e-12


def test_fixed_point_equation_at_convergence():
    for kind, mrf in MODELS[:60]:
        res = MF.mean_field(mrf, tol=1e-13, max_iter=20000)
        assert res.converged, kind
        J = M.to_dense(mrf)
        np.testing.assert_allclose(res.mean, np.tanh(mrf.h + J @ res.mean), atol=1e-11)
        assert MF.mf_residual(mrf, res.mean) < 1e-11
        # a local maximum in every coordinate: perturbing one m_i does not raise F
        for i in range(mrf.n):
            for d in (-1e-3, 1e-3):
                m = res.mean.copy()
                m[i] = np.clip(m[i] + d, -1, 1)
                assert MF.mf_bound(mrf, m) <= res.log_z_lower + 1e-12


def test_exact_without_couplings():
    h = np.array([-3.0, -0.5, 0.0, 0.2, 1.7, 40.0])
    mrf = M.make_mrf(h, np.zeros((0, 2)), [])
    res = MF.mean_field(mrf)
    assert abs(res.log_z_lower - np.sum(np.logaddexp(h, -h))) < 1e-12
    np.testing.assert_allclose(res.mean, np.tanh(h), atol=1e-15)
    assert res.converged and res.n_iter <= 2


def test_single_edge_closed_forms():
    # exact: Z = 2 e^J cosh(h1 + h2) + 2 e^-J cosh(h1 - h2)
    for h1, h2, J in [(0.3, -0.7, 0.9), (1.0, 1.0, -1.5), (0.0, 0.0, 0.5), (-2.0, 0.4, 1.2)]:
        mrf = M.make_mrf([h1, h2], [(0, 1)], [J])
        lz = math.log(2 * math.exp(J) * math.cosh(h1 + h2) + 2 * math.exp(-J) * math.cosh(h1 - h2))
        assert abs(X.log_z_enumeration(mrf) - lz) < 1e-13
        res = MF.mean_field(mrf, tol=1e-14)
        assert res.log_z_lower <= lz + 1e-12
        # the best bound over a fine grid of (m1, m2) cannot beat the MF optimum (up to grid error)
        g = np.linspace(-1, 1, 801)
        m1, m2 = np.meshgrid(g, g, indexing="ij")
        ent = MF._entropy(m1) + MF._entropy(m2)
        grid = (h1 * m1 + h2 * m2 + J * m1 * m2 + ent).max()
        assert grid <= res.log_z_lower + 1e-12
        assert res.log_z_lower - grid < 1e-4
    # zero fields: m = 0 is the only fixed point for |J| <= 1 (bound 2 log 2); for |J| > 1 the
    # magnetised solution m* = tanh(|J| m*) gives |J| m*^2 + 2 H(m*)
    for J in (0.5, 1.0, 1.5, -2.5):
        a = abs(J)
        res = MF.mean_field(M.make_mrf([0.0, 0.0], [(0, 1)], [J]), tol=1e-15, max_iter=100000)
        if abs(J) <= 1:
            assert abs(res.log_z_lower - 2 * math.log(2)) < 1e-9
        else:
            ms = brentq(lambda x, a=a: x - math.tanh(a * x), 1e-3, 1.0, xtol=1e-15)
            want = abs(J) * ms * ms + 2 * float(MF._entropy(np.array(ms)))
            assert abs(res.log_z_lower - want) < 1e-12
            assert abs(abs(res.mean[0]) - ms) < 1e-10 and res.mean[0] * res.mean[1] * J > 0


def test_restarts_never_lower_the_bound_and_are_reproducible():
    for _kind, mrf in MODELS[::3]:
        base = MF.mean_field(mrf)
        more = MF.mean_field(mrf, n_restarts=6, seed=11)
        assert more.log_z_lower >= base.log_z_lower
        again = MF.mean_field(mrf, n_restarts=6, seed=11)
        assert again.log_z_lower == more.log_z_lower and np.array_equal(again.mean, more.mean)


def test_ferromagnet_below_tc_magnetises():
    # 6 x 6 torus at beta = 0.6 (> beta_c^MF = 1/4, > beta_c = 0.4407), zero field: m = tanh(h) = 0
    # is a saddle with bound N log 2; the +-0.5 starts reach the magnetised maxima
    L = 6
    mrf = M.ising_lattice(L, L, beta=0.6, periodic=True)
    res = MF.mean_field(mrf, tol=1e-13)
    assert res.start in (1, 2)
    assert np.all(np.abs(res.mean) > 0.9) and abs(np.ptp(res.mean)) < 1e-10
    assert res.log_z_lower > L * L * math.log(2) + 1.0
    from_zero = MF.mean_field(mrf, init=np.zeros(L * L))
    assert abs(from_zero.log_z_lower - L * L * math.log(2)) < 1e-12
    lz = X.lattice_transfer_matrix_mrf(mrf, L, L, periodic=True).log_z
    assert res.log_z_lower <= lz
    # the uniform magnetisation solves m = tanh(4 beta m)
    ms = brentq(lambda x: x - math.tanh(4 * 0.6 * x), 1e-3, 1.0, xtol=1e-15)
    np.testing.assert_allclose(np.abs(res.mean), ms, atol=1e-10)


def test_bound_at_the_corners_is_the_state_log_weight():
    rng = np.random.default_rng(4)
    for _, mrf in MODELS[:30]:
        x = rng.choice([-1.0, 1.0], mrf.n)
        assert abs(MF.mf_bound(mrf, x) - float(M.energy_terms(mrf, x))) < 1e-12


def test_refusals():
    mrf = M.make_mrf([0.0, 0.1], [(0, 1)], [0.5])
    with pytest.raises(ValueError, match="damping"):
        MF.mean_field(mrf, damping=1.0)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        MF.mf_bound(mrf, [0.0, 1.2])
    with pytest.raises(ValueError, match="shape"):
        MF.mean_field(mrf, init=np.zeros(3))
