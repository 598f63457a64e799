"""Known answers and cross-checks for pgmflow.tasks.tempering.exact.

Three independent routes to the same numbers -- brute-force enumeration, the row-to-row transfer
matrix (two numerical methods), and Kaufman's closed form -- are checked against each other, and
against hand-derived closed forms and Onsager's infinite-lattice results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from pgmflow.tasks.tempering import exact as ex

TC = 2.0 / math.log1p(math.sqrt(2.0))
ONSAGER_LOGZ_TC = 0.9296953983  # log Z / N of the infinite lattice at T_c, J = 1


def _random_lattice(m, n, seed, field=True):
    rng = np.random.default_rng(seed)
    bh = rng.choice(np.array([-1, 1], dtype=np.int8), size=(m, n))
    bv = rng.choice(np.array([-1, 1], dtype=np.int8), size=(m, n))
    h = rng.normal(scale=0.5, size=(m, n)) if field else 0.0
    return bh, bv, h


def _ferro(m, n):
    return np.ones((m, n), dtype=np.int8), np.ones((m, n), dtype=np.int8)


# ------------------------------------------------------------------------------------ energies


def test_ising_energy_known_configurations():
    bh, bv = _ferro(3, 4)
    up = np.ones((3, 4))
    # 2N bonds, all satisfied; field term -h N
    assert ex.ising_energy(up, bh, bv, 1.5, 0.25) == pytest.approx(-1.5 * 24 - 0.25 * 12)
    # checkerboard needs even sides: on 4 x 4 every bond is broken
    bh4, bv4 = _ferro(4, 4)
    cb = np.where((np.add.outer(np.arange(4), np.arange(4)) % 2) == 0, 1.0, -1.0)
    assert ex.ising_energy(cb, bh4, bv4, 1.0) == pytest.approx(32.0)
    # one flipped spin in a ferromagnet costs 2 J * 4 bonds
    s = np.ones((4, 4))
    s[1, 2] = -1
    assert ex.ising_energy(s, bh4, bv4, 1.0) - ex.ising_energy(np.ones((4, 4)), bh4, bv4, 1.0) == 8.0
    # batch shape, and bond sign convention: bonds_h[i, j] couples (i, j)-(i, j+1)
    bh_one = np.zeros((4, 4))
    bh_one[2, 3] = -1  # couples (2, 3) and (2, 0)
    s = np.ones((2, 4, 4))
    s[1, 2, 0] = -1
    e = ex.ising_energy(s, bh_one, np.zeros((4, 4)), 1.0)
    np.testing.assert_allclose(e, [1.0, -1.0])


# ----------------------------------------------------------------------- closed-form 2x2 torus


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.44, 1.0, 3.0])
def test_two_by_two_torus_closed_form(beta):
    """2x2 torus: each neighbour pair is doubly bonded, Z = 2 e^{8K} + 12 + 2 e^{-8K}."""
    K = beta
    log_z = math.log(2 * math.exp(8 * K) + 12 + 2 * math.exp(-8 * K))
    mean_e = -8 * (2 * math.exp(8 * K) - 2 * math.exp(-8 * K)) / math.exp(log_z) / 4
    bh, bv = _ferro(2, 2)
    enum = ex.ising_log_z_enumeration(bh, bv, 1.0, 0.0, beta)
    tm = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, 0.0, beta)
    assert enum["log_z"] == pytest.approx(log_z, abs=1e-12)
    assert tm["log_z"] == pytest.approx(log_z, abs=1e-12)
    assert ex.kaufman_log_z(2, 2, 1.0, beta) == pytest.approx(log_z, abs=1e-12)
    for u in (enum["mean_energy"], tm["mean_energy"], ex.kaufman_mean_energy(2, 2, 1.0, beta)):
        assert u == pytest.approx(mean_e, abs=1e-12)


# ------------------------------------------------------------------- enumeration vs transfer


@pytest.mark.parametrize("shape,seed", [((2, 2), 0), ((3, 4), 1), ((4, 3), 2), ((4, 4), 3), ((2, 5), 4), ((1, 4), 5)])
@pytest.mark.parametrize("beta", [-0.3, 0.2, 0.7, 1.5])
def test_enumeration_equals_transfer_matrix_random_bonds_and_fields(shape, seed, beta):
    bh, bv, h = _random_lattice(*shape, seed)
    J = 0.8
    enum = ex.ising_log_z_enumeration(bh, bv, J, h, beta)
    lin = ex.ising_log_z_transfer_matrix(bh, bv, J, h, beta, method="linear")
    log = ex.ising_log_z_transfer_matrix(bh, bv, J, h, beta, derivatives=2, method="log")
    for tm in (lin, log):
        assert tm["log_z"] == pytest.approx(enum["log_z"], abs=1e-10)
        assert tm["mean_energy"] == pytest.approx(enum["mean_energy"], abs=1e-10)
    assert log["specific_heat"] == pytest.approx(enum["specific_heat"], rel=1e-9, abs=1e-12)
    assert lin["log_z_per_site"] == pytest.approx(enum["log_z"] / enum["n_sites"], abs=1e-12)


def test_transfer_matrix_is_invariant_under_transposition():
    """A 3 x 6 lattice and its transpose (bonds_h <-> bonds_v) have the same Z; also vs brute force."""
    bh, bv, h = _random_lattice(3, 6, seed=11)
    a = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, h, 0.6)
    b = ex.ising_log_z_transfer_matrix(bv.T, bh.T, 1.0, h.T, 0.6)
    e = ex.ising_log_z_enumeration(bh, bv, 1.0, h, 0.6)
    assert a["log_z"] == pytest.approx(b["log_z"], abs=1e-11)
    assert a["log_z"] == pytest.approx(e["log_z"], abs=1e-11)
    assert a["mean_energy"] == pytest.approx(b["mean_energy"], abs=1e-12)


@pytest.mark.parametrize("beta,h", [(5.0, 0.0), (50.0, 0.3), (200.0, 0.0), (200.0, 0.3)])
def test_low_temperature_spin_glass_is_stable(beta, h):
    """Frustrated +-J at very low T: 'auto' switches to the log-domain method and stays exact."""
    bh, bv, _ = _random_lattice(4, 4, seed=1, field=False)
    enum = ex.ising_log_z_enumeration(bh, bv, 1.0, h, beta)
    tm = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, h, beta, derivatives=2)
    assert tm["method"] == "log"
    assert np.isfinite(tm["log_z"])
    assert tm["log_z"] == pytest.approx(enum["log_z"], rel=1e-13)
    assert tm["mean_energy"] == pytest.approx(enum["mean_energy"], abs=1e-12)
    assert tm["specific_heat"] == pytest.approx(enum["specific_heat"], rel=1e-10, abs=1e-18)
    if beta >= 50:
        # log Z + beta <E> -> entropy = log(ground-state degeneracy), an integer's log
        g = math.exp(tm["log_z"] + beta * 16 * tm["mean_energy"])
        assert round(g) >= 1 and g == pytest.approx(round(g), abs=1e-7)  # round-off ~ beta N 1e-14


def test_field_derivative_gives_magnetisation_and_susceptibility():
    """d log Z / dh = beta <M>, d<M>/dh = beta Var(M): finite differences of the TM and enumeration."""
    bh, bv, _ = _random_lattice(3, 4, seed=7, field=False)
    beta, h0, dh = 0.7, 0.2, 1e-4
    lz = [
        ex.ising_log_z_transfer_matrix(bh, bv, 1.0, h0 + k * dh, beta, derivatives=0)["log_z"] for k in (-2, -1, 1, 2)
    ]
    dlz = (lz[0] - 8 * lz[1] + 8 * lz[2] - lz[3]) / (12 * dh)
    enum = ex.ising_log_z_enumeration(bh, bv, 1.0, h0, beta)
    assert dlz / (beta * 12) == pytest.approx(enum["mean_m"], abs=1e-9)
    mm = [ex.ising_log_z_enumeration(bh, bv, 1.0, h0 + k * dh, beta)["mean_m"] for k in (-1, 1)]
    chi_fd = (mm[1] - mm[0]) / (2 * dh)  # d<M/N>/dh = beta Var(M) / N
    assert chi_fd == pytest.approx(enum["susceptibility"], rel=1e-6)
    assert enum["mean_m2"] >= enum["mean_m"] ** 2


def test_enumeration_magnetisation_symmetry_and_order():
    bh, bv = _ferro(4, 4)
    hot = ex.ising_log_z_enumeration(bh, bv, 1.0, 0.0, 0.1)
    cold = ex.ising_log_z_enumeration(bh, bv, 1.0, 0.0, 3.0)
    assert hot["mean_m"] == pytest.approx(0.0, abs=1e-12)  # spin-flip symmetry
    assert cold["mean_m"] == pytest.approx(0.0, abs=1e-12)
    assert cold["mean_abs_m"] == pytest.approx(1.0, abs=1e-8)  # ordered
    assert hot["mean_abs_m"] < 0.5
    assert ex.ising_log_z_enumeration(bh, bv, 1.0, 0.1, 0.5)["mean_m"] > 0


# ------------------------------------------------------------------------- infinite temperature


@pytest.mark.parametrize("shape", [(2, 3), (4, 4), (3, 5)])
def test_beta_zero_gives_n_log_2(shape):
    bh, bv, h = _random_lattice(*shape, seed=3)
    N = shape[0] * shape[1]
    enum = ex.ising_log_z_enumeration(bh, bv, 1.0, h, 0.0)
    tm = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, h, 0.0, derivatives=2)
    for r in (enum, tm):
        assert r["log_z"] == pytest.approx(N * math.log(2.0), abs=1e-12)
        assert r["specific_heat"] == 0.0
    assert tm["mean_energy"] == pytest.approx(enum["mean_energy"], abs=1e-14)
    assert ex.kaufman_log_z(*shape, 1.0, 0.0) == N * math.log(2.0)
    assert ex.kaufman_mean_energy(*shape, 1.0, 0.0) == 0.0
    assert ex.kaufman_log_z(64, 64, 1.0, 1e-12) == pytest.approx(4096 * math.log(2.0), abs=1e-9)
    assert ex.onsager_log_z_per_site(1.0, 0.0) == pytest.approx(math.log(2.0), abs=1e-14)


# ---------------------------------------------------------------------------------- Kaufman


@pytest.mark.parametrize("shape", [(4, 4), (6, 6), (8, 8), (4, 6), (6, 10), (3, 5), (10, 6)])
@pytest.mark.parametrize("T", [1.5, 2.269185, TC, 3.5])
def test_kaufman_equals_transfer_matrix(shape, T):
    """Both sides of T_c: fails with the wrong sign convention for gamma_0 (e.g. |gamma_0|)."""
    m, n = shape
    bh, bv = _ferro(m, n)
    tm = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, 0.0, 1.0 / T)
    assert ex.kaufman_log_z(m, n, 1.0, 1.0 / T) == pytest.approx(tm["log_z"], rel=1e-9)
    assert ex.kaufman_mean_energy(m, n, 1.0, 1.0 / T) == pytest.approx(tm["mean_energy"], abs=1e-11)


def test_kaufman_coupling_scale_and_symmetry():
    # Z depends on beta J only; E/N scales with J; m <-> n symmetric
    assert ex.kaufman_log_z(6, 10, 2.0, 0.25) == pytest.approx(ex.kaufman_log_z(10, 6, 1.0, 0.5), rel=1e-13)
    assert ex.kaufman_mean_energy(6, 10, 2.0, 0.25) == pytest.approx(
        2.0 * ex.kaufman_mean_energy(6, 10, 1.0, 0.5), rel=1e-12
    )
    with pytest.raises(ValueError):
        ex.kaufman_log_z(4, 4, -1.0, 0.5)


def test_kaufman_256_at_tc_close_to_onsager():
    lz = ex.kaufman_log_z(256, 256, 1.0, 1.0 / TC) / 256**2
    assert ex.onsager_log_z_per_site(1.0, 1.0 / TC) == pytest.approx(ONSAGER_LOGZ_TC, abs=1e-9)
    assert lz == pytest.approx(ONSAGER_LOGZ_TC, abs=1e-4)
    assert abs(lz - ONSAGER_LOGZ_TC) > 1e-7  # a real (small, positive) finite-size correction
    # at T_c the infinite-lattice energy is -sqrt(2) J; the 256^2 torus is within ~1e-2
    assert ex.onsager_mean_energy_per_site(1.0, 1.0 / TC) == pytest.approx(-math.sqrt(2.0), abs=1e-9)
    assert ex.kaufman_mean_energy(256, 256, 1.0, 1.0 / TC) == pytest.approx(-math.sqrt(2.0), abs=1e-2)


@pytest.mark.parametrize("T", [1.0, 1.8, 3.0, 5.0])
def test_kaufman_64_off_critical_matches_onsager(T):
    """Off-critical finite-size corrections are exponentially small, except that below T_c the
    torus has two ordered phases: log Z = N f_inf + log 2 (+ exponentially small)."""
    beta = 1.0 / T
    N = 64 * 64
    lz = ex.kaufman_log_z(64, 64, 1.0, beta)
    expected = N * ex.onsager_log_z_per_site(1.0, beta) + (math.log(2.0) if T < TC else 0.0)
    assert lz == pytest.approx(expected, abs=1e-8)
    assert ex.kaufman_mean_energy(64, 64, 1.0, beta) == pytest.approx(
        ex.onsager_mean_energy_per_site(1.0, beta), abs=1e-10
    )


def test_onsager_integral_against_double_integral():
    """The 1-D reduction equals Onsager's double integral (scipy dblquad) at two temperatures."""
    for beta in (0.3, 0.6):
        K = beta
        c2, s2 = math.cosh(2 * K) ** 2, math.sinh(2 * K)
        val, _ = integrate.dblquad(
            lambda a, b: math.log(c2 - s2 * (math.cos(a) + math.cos(b))),
            0,
            math.pi,
            0,
            math.pi,
            epsabs=1e-12,
            epsrel=1e-12,
        )
        ref = math.log(2.0) + val / (2 * math.pi**2)
        assert ex.onsager_log_z_per_site(1.0, beta) == pytest.approx(ref, abs=1e-10)


@pytest.mark.parametrize("shape", [(4, 4), (64, 64), (256, 256)])
@pytest.mark.parametrize("beta", [1e-3, 0.3, 1.0 / TC, 0.7, 5.0, 60.0])
def test_kaufman_energy_is_derivative_of_log_z(shape, beta):
    m, n = shape
    d = 1e-5 * beta
    f = [ex.kaufman_log_z(m, n, 1.0, beta + k * d) for k in (-2, -1, 1, 2)]
    fd = -(f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * d) / (m * n)
    assert ex.kaufman_mean_energy(m, n, 1.0, beta) == pytest.approx(fd, abs=1e-7)


def test_kaufman_extreme_temperatures_do_not_overflow():
    for beta in (1e-8, 0.01, 1.0 / TC, 30.0, 500.0):
        lz = ex.kaufman_log_z(256, 256, 1.0, beta)
        u = ex.kaufman_mean_energy(256, 256, 1.0, beta)
        assert np.isfinite(lz) and np.isfinite(u)
    # ground state: two ordered states, E/N = -2 J
    N = 256 * 256
    assert ex.kaufman_log_z(256, 256, 1.0, 500.0) == pytest.approx(2 * 500.0 * N + math.log(2.0), rel=1e-15)
    assert ex.kaufman_mean_energy(256, 256, 1.0, 500.0) == pytest.approx(-2.0, abs=1e-12)
    # high temperature: E/N = -2 tanh(K) J + O(K^3)
    assert ex.kaufman_mean_energy(256, 256, 1.0, 1e-8) == pytest.approx(-2e-8, rel=1e-6)
    # energy is continuous through T_c (gamma_0 changes sign there)
    u = [ex.kaufman_mean_energy(64, 64, 1.0, 1.0 / TC + k) for k in (-1e-10, 0.0, 1e-10)]
    assert max(u) - min(u) < 1e-8


# ------------------------------------------------------------------------------- mean energy


@pytest.mark.parametrize("beta", [0.1, 0.3, 1.0 / TC, 0.6, 1.2])
def test_mean_energy_and_specific_heat_three_ways_on_4x4(beta):
    bh, bv = _ferro(4, 4)
    enum = ex.ising_log_z_enumeration(bh, bv, 1.0, 0.0, beta)
    tm = ex.ising_log_z_transfer_matrix(bh, bv, 1.0, 0.0, beta, derivatives=2)
    assert tm["mean_energy"] == pytest.approx(enum["mean_energy"], abs=1e-12)
    assert ex.kaufman_mean_energy(4, 4, 1.0, beta) == pytest.approx(enum["mean_energy"], abs=1e-12)
    assert tm["specific_heat"] == pytest.approx(enum["specific_heat"], rel=1e-10)
    assert ex.kaufman_specific_heat(4, 4, 1.0, beta) == pytest.approx(enum["specific_heat"], rel=1e-7)


# -------------------------------------------------------------------------------- validation


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="N = m\\*n"):
        ex.ising_log_z_enumeration(np.ones((5, 5)), np.ones((5, 5)), 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="width"):
        ex.ising_log_z_transfer_matrix(np.ones((15, 15)), np.ones((15, 15)), 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="same|one shape"):
        ex.ising_log_z_transfer_matrix(np.ones((3, 4)), np.ones((4, 3)), 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="derivatives=2"):
        ex.ising_log_z_transfer_matrix(np.ones((3, 4)), np.ones((3, 4)), 1.0, 0.0, 1.0, derivatives=2, method="linear")
    with pytest.raises(ValueError):
        ex.gaussian_mixture_log_z([0.5, -0.1], [1.0, 1.0], 2)


def test_critical_temperature():
    assert ex.critical_temperature() == pytest.approx(2.269185314213022, abs=1e-12)
    assert ex.critical_temperature(2.5) == pytest.approx(2.5 * 2.269185314213022, abs=1e-12)
    # sinh(2 K_c) = 1
    assert math.sinh(2.0 / ex.critical_temperature()) == pytest.approx(1.0, abs=1e-15)


# -------------------------------------------------------------------------- Gaussian mixture


def test_gaussian_mixture_log_z_known_answers():
    assert ex.gaussian_mixture_log_z([1.0], [1.0], 2) == pytest.approx(math.log(2 * math.pi))
    assert ex.gaussian_mixture_log_z([0.3, 0.7], 0.5, 3) == pytest.approx(1.5 * math.log(2 * math.pi * 0.25))
    # a huge dimension stays finite (log-sum-exp)
    assert np.isfinite(ex.gaussian_mixture_log_z([0.5, 0.5], [1e-3, 1e3], 5000))


def test_gaussian_mixture_log_z_against_quadrature():
    w, s, mu = np.array([0.2, 1.3, 0.5]), np.array([0.4, 1.0, 2.5]), np.array([-3.0, 0.0, 4.0])

    def gamma(x):
        return float(np.sum(w * np.exp(-((x - mu) ** 2) / (2 * s**2))))

    val, _ = integrate.quad(gamma, -40, 40, points=list(mu), limit=200, epsabs=1e-13)
    assert ex.gaussian_mixture_log_z(w, s, 1) == pytest.approx(math.log(val), abs=1e-10)

    # 2-D: the isotropic integral factorises per component
    def gamma2(y, x):
        r2 = (x - mu) ** 2 + y**2
        return float(np.sum(w * np.exp(-r2 / (2 * s**2))))

    val2, _ = integrate.dblquad(gamma2, -20, 20, -20, 20, epsabs=1e-11)
    assert ex.gaussian_mixture_log_z(w, s, 2) == pytest.approx(math.log(val2), abs=1e-8)
