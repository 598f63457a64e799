"""Checkerboard Ising kernels: the numba kernel against a literal re-implementation of the spec
(bit for bit), independence of batching / threads / kernel path, the sampled distribution
against exact enumeration of a 4x4 lattice, the thresholds, energy and magnetisation, and the
CUDA kernel -- on the GPU when there is one, and its source compiled for the CPU otherwise."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest

from pgmflow.tasks import backend
from pgmflow.tasks.philox import philox4x32_numpy
from pgmflow.tasks.tempering import ising_cuda
from pgmflow.tasks.tempering import ising_kernels as K

TWO32 = 2**32
PM1 = np.array([-1, 1], dtype=np.int8)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def reference_uniforms(R, L, key, replica_ids, chain, t, c):
    """The spec's uniforms of colour c in sweep t, built literally: u[r, i, q] (int, [R, L, H]) is the
    32-bit integer whose bit 31 - k is bit q & 63 of plane k of word (i, q >> 6), plane k being
    words 2 (k & 1) (low half) and 2 (k & 1) + 1 (high half) of the Philox block with counter
    ((i W + w) 16 + (k >> 1), 2 t + c, replica_id, chain)."""
    H = L // 2
    W = (H + 63) // 64
    rid = np.asarray(replica_ids, dtype=np.int64)
    r_, f_, g_ = np.meshgrid(np.arange(R), np.arange(L * W), np.arange(16), indexing="ij")
    ctr = np.stack(
        [
            (f_ * 16 + g_) & 0xFFFFFFFF,
            np.full_like(f_, (2 * t + c) & 0xFFFFFFFF),
            rid[r_] & 0xFFFFFFFF,
            np.full_like(f_, chain & 0xFFFFFFFF),
        ],
        axis=-1,
    )
    words = philox4x32_numpy(ctr.astype(np.uint32), np.asarray(key, dtype=np.uint32)).astype(np.uint64)
    planes = np.empty((R, L * W, 32), dtype=np.uint64)  # [R, word, k]
    planes[:, :, 0::2] = words[..., 0] | (words[..., 1] << np.uint64(32))
    planes[:, :, 1::2] = words[..., 2] | (words[..., 3] << np.uint64(32))
    u = np.zeros((R, L, H), dtype=object)
    for r in range(R):
        for i in range(L):
            for q in range(H):
                bits = planes[r, i * W + (q >> 6)] >> np.uint64(q & 63) & np.uint64(1)  # [32]
                u[r, i, q] = sum(int(bits[k]) << (31 - k) for k in range(32))
    return u


def reference_sweep(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps):
    """The spec of ``ising_sweep`` transcribed literally: natural layout, site by site, Python
    integers, Philox from the NumPy reference. Updates ``spins`` in place; returns int64 [R]."""
    R, L, _ = spins.shape
    changed = np.zeros(R, dtype=np.int64)
    for t in range(sweep0, sweep0 + n_sweeps):
        for c in (0, 1):
            u_all = reference_uniforms(R, L, key, replica_ids, chain, t, c)
            new_spins = spins.copy()
            for r in range(R):
                for i in range(L):
                    for j in range(L):
                        if (i + j) % 2 != c:
                            continue
                        u = u_all[r, i, j // 2]
                        s = int(spins[r, i, j])
                        nbrs = [
                            (bonds_h[i, j], spins[r, i, (j + 1) % L]),
                            (bonds_h[i, (j - 1) % L], spins[r, i, (j - 1) % L]),
                            (bonds_v[i, j], spins[r, (i + 1) % L, j]),
                            (bonds_v[(i - 1) % L, j], spins[r, (i - 1) % L, j]),
                        ]
                        n = sum(1 for b, sk in nbrs if int(b) * int(sk) > 0)
                        new = 1 if u < int(thr[r, n, (s + 1) // 2]) else -1
                        changed[r] += new != s
                        new_spins[r, i, j] = new
            spins[...] = new_spins
    return changed


def brute_energy(spins, bonds_h, bonds_v, J_abs, h):
    R, L, _ = spins.shape
    E = np.zeros(R)
    for r in range(R):
        for i in range(L):
            for j in range(L):
                s = int(spins[r, i, j])
                E[r] -= J_abs * int(bonds_h[i, j]) * s * int(spins[r, i, (j + 1) % L])
                E[r] -= J_abs * int(bonds_v[i, j]) * s * int(spins[r, (i + 1) % L, j])
                E[r] -= h * s
    return E


def random_problem(rng, R, L, glass=True):
    spins = rng.choice(PM1, size=(R, L, L))
    if glass:
        bh = rng.choice(PM1, size=(L, L))
        bv = rng.choice(PM1, size=(L, L))
    else:
        bh = np.ones((L, L), np.int8)
        bv = np.ones((L, L), np.int8)
    return spins, bh, bv


KEY = np.array([0x1234ABCD, 0x9E3779B9], dtype=np.uint32)


# ----------------------------------------------------------------------------------------------
# thresholds
# ----------------------------------------------------------------------------------------------


def test_thresholds_shape_dtype_range_and_beta_zero():
    betas = np.array([0.0, 0.1, 0.44, 2.0, 50.0])
    for method in K.METHODS:
        thr = K.ising_thresholds(betas, 1.3, -0.4, method)
        assert thr.shape == (5, 5, 2) and thr.dtype == np.int64
        assert thr.min() >= 0 and thr.max() <= TWO32
        assert np.all(thr[0] == 2**31)  # beta == 0: a fair coin for either method
    # extreme beta reaches both ends of the range
    hb = K.ising_thresholds(np.array([50.0]), 1.0, 0.0, "heatbath")
    assert hb[0, 0, 0] == 0 and hb[0, 4, 1] == TWO32


def test_heatbath_values():
    beta, J, h = 0.37, 1.1, 0.25
    thr = K.ising_thresholds(np.array([beta]), J, h, "heatbath")[0]
    for n in range(5):
        x = J * (2 * n - 4) + h
        p = 1.0 / (1.0 + math.exp(-2.0 * beta * x))
        want = round(p * TWO32)
        assert abs(int(thr[n, 0]) - want) <= 1 and thr[n, 0] == thr[n, 1]
    # p(+1 | n) increases with the number of satisfied bonds
    assert np.all(np.diff(thr[:, 0]) > 0)


def test_metropolis_values():
    beta, J, h = 0.6, 1.0, 0.2
    thr = K.ising_thresholds(np.array([beta]), J, h, "metropolis")[0]
    for n in range(5):
        x = J * (2 * n - 4) + h
        for b, s in ((0, -1), (1, 1)):
            a = min(1.0, math.exp(-beta * 2 * s * x))  # flip probability
            p_plus = 1.0 - a if s == 1 else a
            assert abs(int(thr[n, b]) - p_plus * TWO32) <= 1
    # aligned up spin with all bonds satisfied: stays up unless the rare flip; down spin flips surely
    assert thr[4, 0] == TWO32
    assert thr[0, 1] == 0  # up spin with all bonds violated and small h: flips surely
    assert TWO32 - thr[4, 1] == round(math.exp(-beta * 2 * (4 * J + h)) * TWO32)


def test_thresholds_reject_bad_input():
    with pytest.raises(ValueError, match="method"):
        K.ising_thresholds(np.array([1.0]), 1.0, 0.0, "gibbs")
    with pytest.raises(ValueError, match="finite"):
        K.ising_thresholds(np.array([np.nan]), 1.0, 0.0, "heatbath")
    with pytest.raises(ValueError, match=r"\[R\]"):
        K.ising_thresholds(np.ones((2, 2)), 1.0, 0.0, "heatbath")


# ----------------------------------------------------------------------------------------------
# the numba kernel against the spec, bit for bit
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [2, 4, 6, 8, 10])
@pytest.mark.parametrize("method", K.METHODS)
def test_numba_matches_reference(L, method):
    rng = np.random.default_rng(1000 * L + len(method))
    R = 4
    spins, bh, bv = random_problem(rng, R, L)
    # beta 0, moderate, critical-ish, and extreme (thresholds 0 and 2**32); a field
    thr = K.ising_thresholds(np.array([0.0, 0.3, 0.9, 40.0]), 0.8, 0.35, method)
    rids = np.array([5, 2**33 + 7, 0, 123456789], dtype=np.int64)  # > 2**32: only low word counts
    a, b = spins.copy(), spins.copy()
    ca = K.ising_sweep(a, bh, bv, thr, KEY, rids, 3, 11, 3)
    cb = reference_sweep(b, bh, bv, thr, KEY, rids, 3, 11, 3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ca, cb)
    assert ca.dtype == np.int64 and ca.shape == (R,)
    assert ca[0] > 0  # beta = 0 replica moves


@pytest.mark.parametrize("mode", ["replica", "rows"])
@pytest.mark.parametrize("nfast", [0, 1, 2, 4])
def test_parallel_modes_and_scalar_pass_match_reference(mode, nfast):
    """Both parallel layouts, and the pass that draws further Philox blocks for the words still
    holding an undecided site: with ``nfast`` = 0 every site is decided there (from block 0 on),
    with 1 and 2 most words pass through it, with 4 (the default) about one in six."""
    rng = np.random.default_rng(7)
    R, L = 3, 6
    spins, bh, bv = random_problem(rng, R, L)
    for method in K.METHODS:
        thr = K.ising_thresholds(np.array([0.2, 1.0, 40.0]), 1.0, -0.6, method)
        rids = np.array([9, 1, 4])
        a, b = spins.copy(), spins.copy()
        ca = K._sweep_numba(a, bh, bv, thr, KEY, rids, 2**32 + 5, 4, 2, mode=mode, nfast=nfast)
        cb = reference_sweep(b, bh, bv, thr, KEY, rids, 2**32 + 5, 4, 2)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ca, cb)


@pytest.mark.parametrize("L", [130, 256])
def test_multiword_rows_match_reference(L):
    """Rows of more than one 64-site word (L = 130: 65 sites per row and colour, the second word
    holding one; L = 256: two full words), where the side neighbour crosses words and wraps around
    the row, with a glass and a field; thresholds that tie with u in the top 8 bits at a high rate
    (T = 2**31 + 1 at beta 0 ... and random ones), so words take the scalar pass next to words that
    do not."""
    rng = np.random.default_rng(L)
    R = 2
    spins, bh, bv = random_problem(rng, R, L)
    for method in K.METHODS:
        thr = K.ising_thresholds(np.array([0.35, 0.0]), 1.0, 0.2, method)
        rids = np.array([3, 8])
        a, b = spins.copy(), spins.copy()
        ca = K._sweep_numba(a, bh, bv, thr, KEY, rids, 1, 6, 1, mode="replica")
        cb = reference_sweep(b, bh, bv, thr, KEY, rids, 1, 6, 1)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ca, cb)


def test_pack_and_unpack_round_trip_and_count_bad_spins():
    """The bit-plane packing (8 bytes at a time when L % 8 == 0, else bit by bit) is exact, and its
    validation counts every byte that is not +-1, whatever its value."""
    from pgmflow.tasks.tempering import ising_cpu as C

    k = C.kernels()
    rng = np.random.default_rng(5)
    for L in (2, 6, 8, 16, 130, 136):
        W = (L // 2 + 63) // 64
        spins = rng.choice(PM1, size=(3, L, L))
        P = np.zeros((3, 2, (L + 2) * W), np.uint64)
        assert k["pack_planes"](spins, P) == 0
        back = np.zeros_like(spins)
        k["unpack_planes"](P, back, C.UNPACK_TABLE)
        np.testing.assert_array_equal(back, spins)
        for v in range(-128, 128):
            if v in (-1, 1):
                continue
            bad = spins.copy()
            bad[2, L - 1, L - 2] = v
            bad[0, 0, 1] = v
            assert k["pack_planes"](bad, P) == 2, (L, v)


def test_result_independent_of_batching_threads_and_sweep_split():
    nb = pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    R, L = 8, 16
    spins, bh, bv = random_problem(rng, R, L)
    betas = np.linspace(0.1, 1.2, R)
    rids = np.arange(100, 100 + R)
    for method in K.METHODS:
        thr = K.ising_thresholds(betas, 1.0, 0.1, method)
        whole = spins.copy()
        c_whole = K.ising_sweep(whole, bh, bv, thr, KEY, rids, 1, 20, 6)
        # replicas split into two calls, each with its own global ids
        parts = spins.copy()
        c_lo = K.ising_sweep(parts[:4], bh, bv, thr[:4], KEY, rids[:4], 1, 20, 6)
        c_hi = K.ising_sweep(parts[4:], bh, bv, thr[4:], KEY, rids[4:], 1, 20, 6)
        np.testing.assert_array_equal(parts, whole)
        np.testing.assert_array_equal(np.concatenate([c_lo, c_hi]), c_whole)
        # a single replica on its own, in the row-parallel layout
        one = spins[5:6].copy()
        c_one = K._sweep_numba(one, bh, bv, thr[5:6], KEY, rids[5:6], 1, 20, 6, mode="rows")
        np.testing.assert_array_equal(one[0], whole[5])
        assert c_one[0] == c_whole[5]
        # the same sweeps in two calls
        split = spins.copy()
        c1 = K.ising_sweep(split, bh, bv, thr, KEY, rids, 1, 20, 2)
        c2 = K.ising_sweep(split, bh, bv, thr, KEY, rids, 1, 22, 4)
        np.testing.assert_array_equal(split, whole)
        np.testing.assert_array_equal(c1 + c2, c_whole)
        # one numba thread
        n0 = nb.get_num_threads()
        try:
            nb.set_num_threads(1)
            serial = spins.copy()
            c_serial = K.ising_sweep(serial, bh, bv, thr, KEY, rids, 1, 20, 6)
        finally:
            nb.set_num_threads(n0)
        np.testing.assert_array_equal(serial, whole)
        np.testing.assert_array_equal(c_serial, c_whole)
    # and the identity really matters: other ids, chain, key or sweep index give other bits
    thr = K.ising_thresholds(betas, 1.0, 0.1, "heatbath")
    base = spins.copy()
    K.ising_sweep(base, bh, bv, thr, KEY, rids, 1, 20, 1)
    for args in [(KEY, rids + 1, 1, 20), (KEY, rids, 2, 20), (KEY[::-1].copy(), rids, 1, 20), (KEY, rids, 1, 21)]:
        other = spins.copy()
        K.ising_sweep(other, bh, bv, thr, args[0], args[1], args[2], args[3], 1)
        assert not np.array_equal(other, base)


def test_in_place_on_non_contiguous_spins_and_zero_sweeps():
    rng = np.random.default_rng(11)
    R, L = 3, 8
    spins, bh, bv = random_problem(rng, R, L)
    thr = K.ising_thresholds(np.array([0.3, 0.5, 0.8]), 1.0, 0.0, "metropolis")
    rids = np.arange(R)
    big = np.ones((R, L, 2 * L), np.int8)
    big[:, :, ::2] = spins
    view = big[:, :, ::2]  # strided view
    ref = spins.copy()
    c_ref = K.ising_sweep(ref, bh, bv, thr, KEY, rids, 0, 0, 2)
    c_view = K.ising_sweep(view, bh, bv, thr, KEY, rids, 0, 0, 2)
    np.testing.assert_array_equal(big[:, :, ::2], ref)
    assert np.all(big[:, :, 1::2] == 1)
    np.testing.assert_array_equal(c_view, c_ref)
    before = ref.copy()
    assert np.all(K.ising_sweep(ref, bh, bv, thr, KEY, rids, 0, 2, 0) == 0)
    np.testing.assert_array_equal(ref, before)


def test_sweep_rejects_bad_input():
    rng = np.random.default_rng(0)
    spins, bh, bv = random_problem(rng, 2, 4)
    thr = K.ising_thresholds(np.array([0.3, 0.5]), 1.0, 0.0, "metropolis")
    rids = np.arange(2)
    with pytest.raises(ValueError, match="even"):
        K.ising_sweep(
            np.ones((2, 5, 5), np.int8), np.ones((5, 5), np.int8), np.ones((5, 5), np.int8), thr, KEY, rids, 0, 0, 1
        )
    with pytest.raises(TypeError, match="int8"):
        K.ising_sweep(spins.astype(np.int32), bh, bv, thr, KEY, rids, 0, 0, 1)
    bad = spins.copy()
    bad[1, 2, 3] = 0
    with pytest.raises(ValueError, match="-1 and \\+1"):
        K.ising_sweep(bad, bh, bv, thr, KEY, rids, 0, 0, 1)
    with pytest.raises(ValueError, match="bonds_h"):
        K.ising_sweep(spins, bh * 0, bv, thr, KEY, rids, 0, 0, 1)
    with pytest.raises(ValueError, match="thr"):
        K.ising_sweep(spins, bh, bv, thr[:1], KEY, rids, 0, 0, 1)
    with pytest.raises(ValueError, match="replica_ids"):
        K.ising_sweep(spins, bh, bv, thr, KEY, rids[:1], 0, 0, 1)
    with pytest.raises(ValueError, match=">= 0"):
        K.ising_sweep(spins, bh, bv, thr, KEY, rids, 0, -1, 1)
    frozen = spins.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        K.ising_sweep(frozen, bh, bv, thr, KEY, rids, 0, 0, 1)
    with pytest.raises(ValueError, match="-1 and \\+1"):
        K.ising_sweep(spins, bh.astype(np.int64) * 3, bv, thr, KEY, rids, 0, 0, 1)


# ----------------------------------------------------------------------------------------------
# energy and magnetisation
# ----------------------------------------------------------------------------------------------


def test_energy_magnetisation_brute_force():
    rng = np.random.default_rng(5)
    for L in (2, 4, 6):
        spins, bh, bv = random_problem(rng, 3, L)
        E, M = K.ising_energy_magnetisation(spins, bh, bv, 0.7, -0.3)
        assert E.dtype == np.float64 and M.dtype == np.int64
        np.testing.assert_allclose(E, brute_energy(spins, bh, bv, 0.7, -0.3), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(M, spins.astype(np.int64).sum(axis=(1, 2)))
    # ground state of the ferromagnet: E = -2 J N - h N
    up = np.ones((1, 4, 4), np.int8)
    E, M = K.ising_energy_magnetisation(up, np.ones((4, 4), np.int8), np.ones((4, 4), np.int8), 1.0, 0.5)
    assert E[0] == -2 * 16 - 0.5 * 16 and M[0] == 16


# ----------------------------------------------------------------------------------------------
# the sampled distribution against exact enumeration of a 4x4 lattice
# ----------------------------------------------------------------------------------------------


def _exact_moments(bh, bv, J_abs, h, beta):
    """Exact <E> and <|M|> on a 4x4 periodic lattice by enumerating all 2**16 states."""
    n = np.arange(2**16, dtype=np.int64)
    bits = (n[:, None] >> np.arange(16)) & 1
    s = (2 * bits - 1).reshape(-1, 4, 4).astype(np.int64)  # [65536, 4, 4]
    bond = (bh * s * np.roll(s, -1, axis=2)).sum(axis=(1, 2)) + (bv * s * np.roll(s, -1, axis=1)).sum(axis=(1, 2))
    M = s.sum(axis=(1, 2))
    E = -J_abs * bond - h * M
    w = np.exp(-beta * (E - E.min()))
    w /= w.sum()
    return float(w @ E), float(w @ np.abs(M))


def _exact_draws(bh, bv, J_abs, h, beta, n, rng):
    """n states of a 4x4 periodic lattice drawn from the exact Boltzmann distribution (int8 [n, 4, 4])."""
    states = np.arange(2**16, dtype=np.int64)
    s = (2 * ((states[:, None] >> np.arange(16)) & 1) - 1).reshape(-1, 4, 4).astype(np.int64)
    bond = (bh * s * np.roll(s, -1, axis=2)).sum(axis=(1, 2)) + (bv * s * np.roll(s, -1, axis=1)).sum(axis=(1, 2))
    E = -J_abs * bond - h * s.sum(axis=(1, 2))
    w = np.exp(-beta * (E - E.min()))
    return s[rng.choice(states.size, size=n, p=w / w.sum())].astype(np.int8)


def _batch_means(x, n_batches):
    """x: [T, R] samples of R independent chains -> (mean, standard error) from batch means."""
    T, R = x.shape
    b = T // n_batches
    means = x[: b * n_batches].reshape(n_batches, b, R).mean(axis=1).ravel()  # [n_batches * R]
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(means.size))


@pytest.mark.parametrize("glass", [False, True])
@pytest.mark.slow
def test_kernel_samples_the_boltzmann_distribution(glass):
    L, J = 4, 1.0
    rng = np.random.default_rng(17 + glass)
    bh = rng.choice(PM1, size=(L, L)) if glass else np.ones((L, L), np.int8)
    bv = rng.choice(PM1, size=(L, L)) if glass else np.ones((L, L), np.int8)
    betas, fields, per = (0.2, 0.44, 0.7), (0.0, 0.3), 16
    configs = [(m, h, b) for m in K.METHODS for h in fields for b in betas]
    R = len(configs) * per
    # one call sweeps every configuration: tables are per replica, so h and the method are too
    thr = np.concatenate([K.ising_thresholds(np.full(per, b), J, h, m) for m, h, b in configs])
    # Each chain starts from an exact draw: at beta 0.7 with a field a chain started in the minority
    # phase stays there for ~10**4 sweeps (two domain walls to cross), which is slow mixing, not a
    # wrong stationary distribution; started in equilibrium, any bias is the kernel's.
    spins = np.concatenate(
        [_exact_draws(bh.astype(np.int64), bv.astype(np.int64), J, h, b, per, rng) for _, h, b in configs]
    )
    rids = np.arange(R)
    burn, T = 100, 1500
    K.ising_sweep(spins, bh, bv, thr, KEY, rids, 0, 0, burn)
    E = np.empty((T, R))
    A = np.empty((T, R))
    for t in range(T):
        K.ising_sweep(spins, bh, bv, thr, KEY, rids, 0, burn + t, 1)
        e, m = K.ising_energy_magnetisation(spins, bh, bv, J, 0.0)  # bond energy; field term below
        E[t], A[t] = e, np.abs(m)
        E[t] -= np.repeat([h for _, h, _ in configs], per) * m
    failures = []
    for k, (method, h, beta) in enumerate(configs):
        cols = slice(k * per, (k + 1) * per)
        e_exact, a_exact = _exact_moments(bh.astype(np.int64), bv.astype(np.int64), J, h, beta)
        for name, x, exact in (("E", E[:, cols], e_exact), ("|M|", A[:, cols], a_exact)):
            mean, se = _batch_means(x, 10)
            assert se > 0
            if abs(mean - exact) > 4 * se:
                failures.append(f"{method} h={h} beta={beta} {name}: {mean:.4f} vs exact {exact:.4f} (se {se:.4f})")
    assert not failures, "\n".join(failures)


def test_numpy_peer_samples_the_boltzmann_distribution():
    """The benchmark's NumPy peer is a correct sampler too (else the comparison means nothing)."""
    L, J, h, beta, R = 4, 1.0, 0.3, 0.44, 64
    rng = np.random.default_rng(99)
    spins = rng.choice(PM1, size=(R, L, L))
    ones = np.ones((L, L), np.int8)
    K.numpy_checkerboard_sweep(spins, J, h, beta, rng, 100)
    T = 600
    E = np.empty((T, R))
    for t in range(T):
        K.numpy_checkerboard_sweep(spins, J, h, beta, rng, 1)
        E[t] = K.ising_energy_magnetisation(spins, ones, ones, J, h)[0]
    mean, se = _batch_means(E, 10)
    exact = _exact_moments(ones.astype(np.int64), ones.astype(np.int64), J, h, beta)[0]
    assert abs(mean - exact) < 4 * se, (mean, exact, se)


# ----------------------------------------------------------------------------------------------
# the CUDA kernel
# ----------------------------------------------------------------------------------------------

_HOST_PRELUDE = r"""
#include <cstdint>
#include <pthread.h>
struct pgm_dim3 { unsigned int x, y, z; };
static pgm_dim3 blockIdx, blockDim, gridDim;
static thread_local pgm_dim3 threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static  /* one block at a time: a function-local static is the block's shared memory */
static inline unsigned int __umulhi(unsigned int a, unsigned int b)
{ return (unsigned int)(((unsigned long long)a * (unsigned long long)b) >> 32); }
static pthread_barrier_t pgm_barrier;  /* a block's threads (pgm_ising_sites) */
static int pgm_count;
#define __syncthreads() pthread_barrier_wait(&pgm_barrier)
static int __syncthreads_count(int pred)
{
    __syncthreads();
    if (threadIdx.x == 0) pgm_count = 0;
    __syncthreads();
    if (pred) __atomic_fetch_add(&pgm_count, 1, __ATOMIC_SEQ_CST);
    __syncthreads();
    const int c = pgm_count;
    __syncthreads();
    return c;
}
"""

_HOST_DRIVER = r"""
extern "C" void pgm_launch(unsigned int gx, unsigned int gy, unsigned int bx,
    signed char* spins, const signed char* bh, const signed char* bv, const long long* thr,
    const unsigned int* rid32, unsigned int* counts, int r0, int L, int colour,
    unsigned int ctr1, unsigned int chain32, unsigned int key0, unsigned int key1)
{
    blockDim.x = bx; blockDim.y = 1;
    for (unsigned int y = 0; y < gy; ++y) {
        blockIdx.y = y;
        for (unsigned int b = 0; b < gx; ++b) {
            blockIdx.x = b;
            for (unsigned int t = 0; t < bx; ++t) {
                threadIdx.x = t;
                pgm_ising_colour(spins, bh, bv, thr, rid32, counts, r0, L, colour, ctr1, chain32, key0, key1);
            }
        }
    }
}
/* pgm_ising_sites: the blocks one after another, each block's threads as POSIX threads meeting at its barriers. */
struct pgm_sites_args {
    unsigned int t; signed char* spins; const signed char *bh, *bv; const long long* thr; const unsigned int* rid32;
    unsigned int* counts; int r0, L, colour; unsigned int ctr1, chain32, key0, key1;
};
static void* pgm_sites_thread(void* p)
{
    const pgm_sites_args* q = (const pgm_sites_args*)p;
    threadIdx.x = q->t; threadIdx.y = 0; threadIdx.z = 0;
    pgm_ising_sites(q->spins, q->bh, q->bv, q->thr, q->rid32, q->counts, q->r0, q->L, q->colour, q->ctr1, q->chain32,
                    q->key0, q->key1);
    return 0;
}
extern "C" void pgm_launch_sites(unsigned int gx, unsigned int gy, unsigned int bx,
    signed char* spins, const signed char* bh, const signed char* bv, const long long* thr,
    const unsigned int* rid32, unsigned int* counts, int r0, int L, int colour,
    unsigned int ctr1, unsigned int chain32, unsigned int key0, unsigned int key1)
{
    blockDim.x = bx; blockDim.y = 1; blockDim.z = 1;
    gridDim.x = gx; gridDim.y = gy; gridDim.z = 1;
    pthread_t th[1024];
    pgm_sites_args q[1024];
    for (unsigned int y = 0; y < gy; ++y) {
        for (unsigned int b = 0; b < gx; ++b) {
            blockIdx.x = b; blockIdx.y = y;
            pthread_barrier_init(&pgm_barrier, 0, bx);
            for (unsigned int t = 0; t < bx; ++t) {
                q[t] = pgm_sites_args{t, spins, bh, bv, thr, rid32, counts, r0, L, colour, ctr1, chain32, key0, key1};
                pthread_create(&th[t], 0, pgm_sites_thread, &q[t]);
            }
            for (unsigned int t = 0; t < bx; ++t) pthread_join(th[t], 0);
            pthread_barrier_destroy(&pgm_barrier);
        }
    }
}
"""


@pytest.fixture(scope="module")
def cuda_source_on_cpu(tmp_path_factory):
    """The kernel's CUDA C source compiled for the host (threads run one after another, which is
    one of the orders a GPU may use; same-colour sites do not interact)."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CUDA source for the CPU")
    d = tmp_path_factory.mktemp("cuda_on_cpu")
    src = d / "kernel.cpp"
    src.write_text(_HOST_PRELUDE + ising_cuda._CUDA_SOURCE + _HOST_DRIVER)
    lib = d / "kernel.so"
    flags = ["-O1", "-std=c++11", "-shared", "-fPIC", "-pthread", "-w"]
    subprocess.run([cxx, *flags, str(src), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))
    P, U, I = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
    for fn in (so.pgm_launch, so.pgm_launch_sites):
        fn.argtypes = [U, U, U, P, P, P, P, P, P, I, I, I, U, U, U, U]
        fn.restype = None

    def launcher(fn, per_block):
        def launch(grid, block, args):
            assert len(grid) == 2 and block[1:] == (1,)
            assert not per_block or (block[0] % 64 == 0 and block[0] <= 64 * 16)
            arrays, scalars = args[:6], args[6:]
            dtypes = [np.int8, np.int8, np.int8, np.int64, np.uint32, np.uint32]
            for a, dt in zip(arrays, dtypes):
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == dt
            if per_block:  # counts [R, grid x]
                assert arrays[5].shape == (arrays[0].shape[0] * grid[0],)
            assert [type(x) for x in scalars] == [np.int32] * 3 + [np.uint32] * 4
            fn(grid[0], grid[1], block[0], *[a.ctypes.data for a in arrays], *[int(x) for x in scalars])

        return launch

    launch = launcher(so.pgm_launch, False)
    launch.sites = launcher(so.pgm_launch_sites, True)
    return launch


@pytest.mark.parametrize("L", [2, 6, 8, 18])
def test_cuda_source_on_cpu_matches_numba(cuda_source_on_cpu, L, monkeypatch):
    monkeypatch.setattr(ising_cuda, "_CUDA_MAX_GRID_Y", 2)  # replicas in two launches: offsets matter
    rng = np.random.default_rng(L)
    R = 3
    spins, bh, bv = random_problem(rng, R, L)
    for method in K.METHODS:
        thr = K.ising_thresholds(np.array([0.0, 0.5, 40.0]), 1.0, 0.2, method)
        rids = np.array([3, 2**32 + 1, 77])
        a, b = spins.copy(), spins.copy()
        ca = ising_cuda._sweep_cuda(a, bh, bv, thr, KEY, rids, 6, 2**31 + 3, 3, np, cuda_source_on_cpu)
        cb = K.ising_sweep(b, bh, bv, thr, KEY, rids, 6, 2**31 + 3, 3)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ca, cb)
        if L <= 6:
            c = spins.copy()
            np.testing.assert_array_equal(reference_sweep(c, bh, bv, thr, KEY, rids, 6, 2**31 + 3, 3), cb)


@pytest.mark.parametrize("L", [2, 6, 18, 130])
def test_cuda_sites_kernel_on_cpu_matches_numba(cuda_source_on_cpu, L, monkeypatch):
    """pgm_ising_sites (a thread per site, a word's Philox planes drawn into shared memory): the numba kernel's bits
    with 1, 2 and the shipped 4 words per block, and 16 (the most) on L = 130, whose rows have words of 64 and 1 sites
    (partial last blocks and words); sweeps past 2**31, replicas in two launches; and its change counts."""
    monkeypatch.setattr(ising_cuda, "_CUDA_MAX_GRID_Y", 2)  # replicas in two launches: offsets matter
    rng = np.random.default_rng(L + 1)
    big = L > 64  # each emulated block is 64 words POSIX threads: the big lattice in fewer launches
    R, sweeps = (2, 1) if big else (3, 2)
    spins, bh, bv = random_problem(rng, R, L)
    for method in K.METHODS[:1] if big else K.METHODS:
        thr = K.ising_thresholds(np.array([0.0, 0.5, 40.0][:R]), 1.0, 0.2, method)
        rids = np.array([3, 2**32 + 1, 77][:R])
        b = spins.copy()
        cb = K.ising_sweep(b, bh, bv, thr, KEY, rids, 6, 2**31 + 3, sweeps)
        for words in (16,) if big else (1, 2, None):
            a = spins.copy()
            ca = ising_cuda._sweep_cuda(
                a, bh, bv, thr, KEY, rids, 6, 2**31 + 3, sweeps, np, cuda_source_on_cpu, cuda_source_on_cpu.sites, words
            )
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(ca, cb)


def test_cuda_sites_kernel_refuses_a_bad_block():
    spins = np.ones((1, 4, 4), np.int8)
    thr = K.ising_thresholds(np.array([0.5]), 1.0, 0.0, "heatbath")
    with pytest.raises(ValueError, match="words per block"):
        ising_cuda._sweep_cuda(spins, spins[0], spins[0], thr, KEY, [0], 0, 0, 1, np, None, lambda *a: None, 17)
    with pytest.raises(ValueError, match="kernel must be one of"):
        ising_cuda._sweep_cupy(spins, spins[0], spins[0], thr, KEY, [0], 0, 0, 1, kernel="x")


@pytest.mark.gpu
def test_cupy_kernel_matches_numba():
    if not backend.gpu_status()[0]:
        pytest.skip(backend.gpu_status()[1])
    cp = backend.cupy()
    rng = np.random.default_rng(42)
    for R, L in [(3, 2), (4, 6), (5, 64), (2, 130)]:
        spins, bh, bv = random_problem(rng, R, L)
        for method in K.METHODS:
            thr = K.ising_thresholds(np.linspace(0.0, 1.5, R), 1.0, 0.15, method)
            rids = np.arange(R) * 7 + 1
            host = spins.copy()
            c_host = K.ising_sweep(host, bh, bv, thr, KEY, rids, 2, 9, 4)
            dev = cp.asarray(spins)
            c_dev = K.ising_sweep(dev, bh, bv, thr, KEY, rids, 2, 9, 4)
            assert isinstance(c_dev, np.ndarray) and c_dev.dtype == np.int64
            np.testing.assert_array_equal(cp.asnumpy(dev), host)
            np.testing.assert_array_equal(c_dev, c_host)
            E_d, M_d = K.ising_energy_magnetisation(dev, cp.asarray(bh), cp.asarray(bv), 1.0, 0.15)
            E_h, M_h = K.ising_energy_magnetisation(host, bh, bv, 1.0, 0.15)
            np.testing.assert_allclose(E_d, E_h, rtol=0, atol=1e-9)
            np.testing.assert_array_equal(M_d, M_h)
            for kernel, words in (("words", None), ("sites", 1), ("sites", 16)):  # the other kernel; other blocks
                dev = cp.asarray(spins)
                sites = ising_cuda._cupy_sites_kernel() if kernel == "sites" else None
                key = np.asarray(KEY, dtype=np.uint64)
                c_dev = ising_cuda._sweep_cuda(
                    dev, cp.asarray(bh), cp.asarray(bv), thr, key, rids, 2, 9, 4, cp, ising_cuda._cupy_kernel(), sites,
                    words,
                )  # fmt: skip
                np.testing.assert_array_equal(cp.asnumpy(dev), host)
                np.testing.assert_array_equal(c_dev, c_host)
