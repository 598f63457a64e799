"""pgmflow.tasks.tesla.gibbs: exact moments, a numpy reference sweep on the same uniforms, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks import backend
from pgmflow.tasks import rng as R
from pgmflow.tasks.tesla import gibbs as G


def _model(seed, p, scale=0.6, density=0.7):
    r = np.random.default_rng(seed)
    J = np.triu(r.normal(0.0, scale, (p, p)) * (r.random((p, p)) < density), 1)
    J = J + J.T
    h = r.normal(0.0, 0.4, p)
    return h, J


def _reference(spins, h, J, u):
    """Plain numpy systematic scan with the documented use of the uniforms u [S, C, p]."""
    x = spins.astype(np.int8).copy()
    S, C, p = u.shape
    flips = np.zeros(S)
    for s in range(S):
        for i in range(p):
            f = h[i] + x.astype(np.float64) @ J[:, i]
            prob = 1.0 / (1.0 + np.exp(-2.0 * f))
            new = np.where(u[s, :, i] < prob, 1, -1).astype(np.int8)
            flips[s] += np.sum(new != x[:, i])
            x[:, i] = new
    return x, flips / (C * p)


@pytest.mark.parametrize("seed,p", [(0, 5), (1, 8)])
def test_moments_match_exact_enumeration(seed, p):
    h, J = _model(seed, p)
    assert (J > 0).any() and (J < 0).any()
    ex = G.exact_moments(h, J)
    n = 40_000
    g = R.generator(seed, R.STAGE_TESLA_GIBBS, 0)
    state, info = G.step(g, G.init(g, p, n), h, J, 60)
    X = state.spins.astype(np.float64)
    m = X.mean(axis=0)
    se = np.sqrt(np.maximum(1.0 - ex.mean**2, 1e-3) / n)
    assert np.all(np.abs(m - ex.mean) < 5 * se + 1e-12), (m, ex.mean)
    s2 = X.T @ X / n
    se2 = np.sqrt(np.maximum(1.0 - ex.second**2, 1e-3) / n)
    iu = np.triu_indices(p, 1)
    assert np.all(np.abs(s2 - ex.second)[iu] < 5 * se2[iu]), (s2, ex.second)
    assert info.flip_rate.shape == (60,)
    assert np.all((info.flip_rate > 0) & (info.flip_rate < 1))


def test_exact_moments_of_independent_sites():
    h = np.array([0.3, -1.0, 0.0])
    ex = G.exact_moments(h, np.zeros((3, 3)))
    assert np.allclose(ex.mean, np.tanh(h))
    assert np.allclose(ex.second, np.outer(np.tanh(h), np.tanh(h)) + np.diag(1 - np.tanh(h) ** 2))
    assert np.isclose(ex.log_z, np.sum(np.log(2 * np.cosh(h))))


def test_same_spins_as_numpy_reference_on_same_uniforms():
    p, C, S = 7, 50, 6
    h, J = _model(3, p, scale=1.0)
    g = np.random.Generator(np.random.Philox(11))
    s0 = G.init(g, p, C)
    state, info = G.step(g, s0, h, J, S)
    g2 = np.random.Generator(np.random.Philox(11))
    ref0 = np.where(g2.random((C, p)) < 0.5, 1, -1).astype(np.int8)
    assert np.array_equal(ref0, s0.spins)
    ref, ref_flips = _reference(ref0, h, J, g2.random((S, C, p)))
    assert np.array_equal(state.spins, ref)
    assert np.allclose(info.flip_rate, ref_flips)


def test_blocking_of_uniforms_does_not_change_the_result(monkeypatch):
    p, C, S = 6, 9, 13
    h, J = _model(4, p)
    spins = G.init(np.random.default_rng(0), p, C)
    a, ia = G.step(np.random.default_rng(5), spins, h, J, S)
    monkeypatch.setattr(G, "_UNIFORM_BUDGET", 2 * C * p)  # two sweeps per block
    b, ib = G.step(np.random.default_rng(5), spins, h, J, S)
    assert np.array_equal(a.spins, b.spins) and np.array_equal(ia.flip_rate, ib.flip_rate)


def test_deterministic_and_independent_of_thread_count():
    p, C = 12, 64
    h, J = _model(5, p)
    nb = backend.numba()

    def run():
        g = R.generator(9, R.STAGE_TESLA_GIBBS, 3)
        return G.step(g, G.init(g, p, C), h, J, 20)

    a, ia = run()
    b, ib = run()
    assert np.array_equal(a.spins, b.spins) and np.array_equal(ia.flip_rate, ib.flip_rate)
    old = nb.get_num_threads()
    try:
        nb.set_num_threads(1)
        c, ic = run()
    finally:
        nb.set_num_threads(old)
    assert np.array_equal(a.spins, c.spins) and np.array_equal(ia.flip_rate, ic.flip_rate)


def test_state_not_modified_and_zero_sweeps():
    p, C = 5, 4
    h, J = _model(6, p)
    s0 = G.init(np.random.default_rng(1), p, C)
    keep = s0.spins.copy()
    s1, _ = G.step(np.random.default_rng(2), s0, h, J, 10)
    assert np.array_equal(s0.spins, keep)
    assert s1.spins.dtype == np.int8 and set(np.unique(s1.spins)) <= {-1, 1}
    s2, info0 = G.step(np.random.default_rng(2), s0, h, J, 0)
    assert np.array_equal(s2.spins, keep) and info0.flip_rate.shape == (0,)


def test_free_spins_flip_half_the_time():
    p, C = 10, 2000
    g = np.random.default_rng(3)
    _, info = G.step(g, G.init(g, p, C), np.zeros(p), np.zeros((p, p)), 5)
    assert np.allclose(info.flip_rate, 0.5, atol=0.01)


def test_strong_fields_pin_the_spins():
    p = 4
    h = np.array([50.0, -50.0, 50.0, -50.0])
    g = np.random.default_rng(0)
    s, _ = G.step(g, G.init(g, p, 10), h, np.zeros((p, p)), 1)
    assert np.all(s.spins == np.sign(h).astype(np.int8))


def test_init_is_uniform_and_from_the_generator():
    s = G.init(np.random.default_rng(4), 3, 20000)
    assert s.spins.dtype == np.int8 and s.spins.shape == (20000, 3)
    assert np.allclose(s.spins.mean(axis=0), 0, atol=0.03)
    assert np.array_equal(s.spins, G.init(np.random.default_rng(4), 3, 20000).spins)


@pytest.mark.parametrize(
    "h,J,match",
    [
        (np.zeros(3), np.ones((3, 3)) - np.eye(3) + np.diag([0, 1, 0]), "zero diagonal"),
        (np.zeros(3), np.array([[0, 1, 0], [0.5, 0, 0], [0, 0, 0]]), "symmetric"),
        (np.zeros(3), np.zeros((3, 2)), "shape"),
        (np.zeros(2), np.zeros((3, 3)), "shape"),
        (np.array([0, np.nan, 0]), np.zeros((3, 3)), "NaN"),
    ],
)
def test_bad_parameters(h, J, match):
    s = G.init(np.random.default_rng(0), 3, 2)
    with pytest.raises(ValueError, match=match):
        G.step(np.random.default_rng(0), s, h, J, 1)


def test_bad_state():
    with pytest.raises(ValueError, match="int8"):
        G.step(np.random.default_rng(0), G.GibbsState(np.ones((2, 3))), np.zeros(3), np.zeros((3, 3)), 1)
    with pytest.raises(ValueError, match="-1 and \\+1"):
        G.step(np.random.default_rng(0), G.GibbsState(np.zeros((2, 3), np.int8)), np.zeros(3), np.zeros((3, 3)), 1)
