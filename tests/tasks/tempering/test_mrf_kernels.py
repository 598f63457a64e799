"""The MRF per-colour sweep: the numba kernel against a literal Python transcription of its spec, the CUDA
source (compiled as C++ for the host) against the numba kernel bit for bit, the CuPy kernel on a GPU, the
colouring, and the sampled distribution against exact enumeration."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest

from pgmflow.tasks import backend
from pgmflow.tasks.bounds import exact
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.philox import philox4x32_numpy
from pgmflow.tasks.tempering import mrf_cuda
from pgmflow.tasks.tempering import mrf_kernels as K
from pgmflow.tasks.tempering import mrf_target as T

KEY = np.array([0x1234ABCD, 0x9E3779B9], dtype=np.uint32)


def random_model(rng, n, density, scale, field=0.3) -> M.PairwiseMRF:
    J = np.triu(rng.normal(0.0, scale, (n, n)) * (rng.random((n, n)) < density), 1)
    return M.from_dense(J + J.T, rng.normal(0.0, field, n))


def dexp_py(x):
    if x < -40.0:
        return 0.0
    kf = x * K._LOG2E + K._SHIFT
    k = kf - K._SHIFT
    r = (x - k * K._LN2_HI) - k * K._LN2_LO
    p = K._C13
    for c in reversed(K._C[:13]):
        p = p * r + c
    return math.ldexp(p, int(k))


def threshold_py(z, s, b, metropolis):
    if metropolis and b != 0.0:
        d = -2.0 * s * z
        t = int(np.rint(dexp_py(min(d, 0.0)) * 2.0**32))
        return 2**32 - t if s > 0 else t
    e = dexp_py(-2.0 * abs(z))
    p = 1.0 / (1.0 + e) if z >= 0.0 else e / (1.0 + e)
    return int(np.rint(p * 2.0**32))


def reference_sweep(x, t, b, key, rids, chain, sweep0, n_sweeps, method, ref_fields=None, leg=None):
    """The module docstring's rule, one node at a time (slow; small graphs); ``ref_fields`` [G, n] and
    ``leg`` [R]: each replica's reference (None: the target's own)."""
    a_of = [t.ref_field] * x.shape[0] if ref_fields is None else [ref_fields[g] for g in leg]
    C = t.n_colours
    changed = np.zeros(x.shape[0], dtype=np.int64)
    for r in range(x.shape[0]):
        for s in range(sweep0, sweep0 + n_sweeps):
            for c in range(C):
                nodes = t.sites[t.colptr[c] : t.colptr[c + 1]]
                for k, i in enumerate(nodes):
                    ctr = np.array([k // 4, (s * C + c) % 2**32, int(rids[r]) % 2**32, chain % 2**32], dtype=np.uint64)
                    u = int(philox4x32_numpy(ctr, key.astype(np.uint64))[k % 4])
                    f = t.h[i]
                    for e in range(t.indptr[i], t.indptr[i + 1]):
                        f += t.Jn[e] * float(x[r, t.nbr[e]])
                    z = b[r] * f + (1.0 - b[r]) * a_of[r][i]
                    new = 1 if u < threshold_py(z, float(x[r, i]), b[r], method == "metropolis") else -1
                    changed[r] += new != x[r, i]
                    x[r, i] = new
    return changed


def test_colouring_is_proper_and_deterministic():
    rng = np.random.default_rng(1)
    for n, d in [(1, 0.0), (7, 1.0), (30, 0.2), (60, 0.05)]:
        t = T.make_mrf_target(random_model(rng, n, d, 1.0))
        colour = np.empty(n, dtype=np.int64)
        for c in range(t.n_colours):
            colour[t.sites[t.colptr[c] : t.colptr[c + 1]]] = c
        assert np.all(colour[t.edges[:, 0]] != colour[t.edges[:, 1]])
        assert t.n_colours <= np.diff(t.indptr).max(initial=0) + 1
        assert sorted(t.sites.tolist()) == list(range(n))
        again = T.make_mrf_target(t.model)
        np.testing.assert_array_equal(again.sites, t.sites)
    assert T.make_mrf_target(random_model(rng, 7, 1.0, 1.0)).n_colours == 7  # complete graph


def test_dexp_is_exp_to_a_few_ulp():
    xs = np.concatenate([-np.logspace(-12, np.log10(40.0), 2000), [0.0, -40.0]])
    ours = np.array([dexp_py(float(v)) for v in xs])
    np.testing.assert_allclose(ours, np.exp(xs), rtol=4e-16, atol=0)
    assert dexp_py(-40.0000001) == 0.0
    compiled = K._kernels()["_dexp"]
    assert [compiled(float(v)) for v in xs[::50]] == [dexp_py(float(v)) for v in xs[::50]]


def test_thresholds_are_saturated_beyond_the_cut():
    """Below -40 dexp is 0; the thresholds there are those exp itself would give (0 or 2**32)."""
    for z in (20.0001, 35.0, 400.0):
        for s in (-1.0, 1.0):
            assert threshold_py(z, s, 1.0, False) == 2**32 and threshold_py(-z, s, 1.0, False) == 0
            p = 1.0 / (1.0 + math.exp(-2.0 * z))
            assert int(np.rint(p * 2.0**32)) == 2**32
    assert threshold_py(25.0, 1.0, 1.0, True) == 2**32  # +1 in a field of +25 never flips down
    assert threshold_py(-25.0, -1.0, 1.0, True) == 0  # -1 in a field of -25 never flips up
    assert threshold_py(25.0, -1.0, 1.0, True) == 2**32  # a downhill flip is always taken


def exact_d(z, s, b, metro, u):
    """D of the module docstring ("The certified fast path") from the spec's own dexp value, in exact rational
    arithmetic: the new spin is +1 iff D < 0 when |D| > 1 + 2**-19."""
    from fractions import Fraction

    mq = metro and b != 0.0
    arg = min(0.0, -2.0 * s * z) if mq else -2.0 * abs(z)
    e = Fraction(dexp_py(arg))
    two32, uu = Fraction(2**32), Fraction(int(u))
    v = two32 - uu
    pos = s > 0 if mq else z >= 0.0
    if mq:
        return two32 * e - v if pos else uu - two32 * e
    return uu * e - v if pos else uu - v * e


def near_boundary_cases(rng, n):
    """(z, s, b) of every kind (both signs, levels 0, 1 and between, fields up to saturation and beyond the
    -40 cut) and, per case, uniforms at the exact threshold, within a few thousand of it and within the margin
    (where the fast path cannot decide), just beyond MARGIN + ERR_BOUND (where it must) as well as uniform ones."""
    z = np.concatenate(
        [
            rng.normal(0.0, 3.0, n),
            rng.uniform(-21.0, 21.0, n // 4),
            [0.0, -0.0, 1e-300, -1e-300, 20.0, -20.0, 20.0001, -20.0001, 35.0, -400.0, 8.0, -8.0],
        ]
    )
    s = np.where(rng.random(z.size) < 0.5, 1.0, -1.0)
    b = np.where(rng.random(z.size) < 0.2, 0.0, np.where(rng.random(z.size) < 0.2, 1.0, rng.random(z.size)))
    edge = int(K.MARGIN + K.ERR_BOUND) + 2
    offsets = np.array([-2 * edge, -edge, -3000, -800, -2, -1, 0, 1, 2, 800, 3000, edge, 2 * edge])
    return z, s, b, offsets


def test_fast_decision_is_certified_near_the_threshold():
    """The fast path's D is within ERR_BOUND of the exact D (the proven bound, checked), decides every lane with
    |D| > MARGIN as the spec's ``u < thr`` does, and leaves every lane whose u is within 2 of thr (where no
    approximation could decide) to the exact threshold; with no margin it would decide some of them wrongly."""
    ks = K._kernels()
    fast, thr_of = ks["_fast_decision"], ks["_threshold"]
    rng = np.random.default_rng(11)
    z, s, b, offsets = near_boundary_cases(rng, 400)
    worst, flagged, wrong_without_margin = 0.0, 0, 0
    for metro in (False, True):
        for q in range(z.size):
            zq, sq, bq = float(z[q]), float(s[q]), float(b[q])
            thr = thr_of(zq, sq, bq, metro)
            if q < 40:
                assert thr == threshold_py(zq, sq, bq, metro)
            us = np.concatenate([thr + offsets, rng.integers(0, 2**32, 3)])
            for u in us[(us >= 0) & (us < 2**32)]:
                d = fast(zq, sq, bq, metro, float(u))
                worst = max(worst, abs(float(exact_d(zq, sq, bq, metro, u)) - d))
                if abs(d) > K.MARGIN:
                    assert (d < 0.0) == (u < thr), (zq, sq, bq, metro, u, thr, d)
                else:
                    flagged += 1
                    assert abs(u - thr) <= K.MARGIN + K.ERR_BOUND + 1
                if abs(u - thr) <= 2:
                    assert abs(d) <= K.MARGIN
                    wrong_without_margin += (d < 0.0) != (u < thr)
    assert worst <= K.ERR_BOUND and worst > 1.0  # the bound holds, and an approximation is being checked
    assert K.MARGIN >= K.ERR_BOUND + 1 + 2**-19
    assert flagged > 0 and wrong_without_margin > 0


def test_fast_exp_is_within_its_bound():
    """_fexp against dexp on [-41, 0]: within 5.8927e-5 absolute (the docstring's bound), identical (0) below -40."""
    fexp, dexp = K._kernels()["_fexp"], K._kernels()["_dexp"]
    xs = np.concatenate([-np.logspace(-12, np.log10(41.0), 3000), -np.linspace(0.0, 1.0, 2001), [-40.0, -40.5]])
    err = max(abs(fexp(float(v)) - dexp(float(v))) for v in xs)
    assert 1e-6 < err <= 5.8927e-5
    assert fexp(-40.0000001) == 0.0 and fexp(float("nan")) == 0.0 and fexp(0.0) == 1.0


def strong_model(rng, n, density):
    """Couplings and fields strong enough that most lanes sit at p near 0 or 1, some saturated (|z| > 20)."""
    J = np.triu(rng.normal(0.0, 4.0, (n, n)) * (rng.random((n, n)) < density), 1)
    return M.from_dense(J + J.T, rng.normal(0.0, 6.0, n))


@pytest.mark.parametrize("method", K.METHODS)
def test_fast_path_bits_equal_the_exact_path(method):
    """Many sweeps of the kernel as shipped (margin MARGIN) against the exact path (margin inf: every lane by the
    spec's ``_threshold``) and a wide margin (many lanes by the fallback, counted): spins and change counts
    identical, on weak and strong models (lanes near 0 and 1, saturated ones), levels 0 to 1, two references,
    nodes of degree 0 to 40 (the neighbour loops' padding)."""
    rng = np.random.default_rng(7 if method == "heatbath" else 8)
    cases = [
        (T.make_mrf_target(random_model(rng, 300, 0.02, 0.8)), 40),
        (T.make_mrf_target(strong_model(rng, 200, 0.03)), 40),
        (T.make_mrf_target(strong_model(rng, 60, 0.6)), 30),
        (T.make_mrf_target(random_model(rng, 40, 0.05, 0.5)), 40),  # isolated nodes
    ]
    assert np.diff(cases[3][0].indptr).min() == 0 and np.diff(cases[2][0].indptr).max() > 30
    assert all(np.abs(t.h).max() > 10.0 for t, _ in cases[1:3])  # saturated lanes (|z| > 10) in the strong ones
    for t, sweeps in cases:
        n = t.n_sites
        R = 37
        x0 = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.concatenate([[0.0, 1.0, 1.0], rng.random(R - 3)])
        rid = np.arange(R, dtype=np.uint64) * 5 + 3
        rows, leg = np.stack([np.zeros(n), rng.normal(0.0, 2.0, n)]), np.arange(R) % 2
        got = []
        for margin in (K.MARGIN, math.inf, 2.0**22):
            x = x0.copy()
            c, nfb = K._sweep_cpu(x, t, b, KEY, rid, 9, 2**32 - 3, sweeps, method, rows, leg, margin)
            got.append((x, c, nfb))
        for x, c, _ in got[1:]:
            np.testing.assert_array_equal(x, got[0][0])
            np.testing.assert_array_equal(c, got[0][1])
        assert got[1][2] >= R * n * sweeps  # the exact path: every lane by the fallback
        assert got[2][2] > 0  # the wide margin: the fallback ran


@pytest.mark.parametrize("method", K.METHODS)
@pytest.mark.parametrize("n,density", [(5, 1.0), (13, 0.3), (21, 0.15)])
def test_numba_matches_reference(method, n, density):
    rng = np.random.default_rng(n)
    t = T.make_mrf_target(random_model(rng, n, density, 0.8), ref_field=rng.normal(0, 0.5, n))
    x = np.where(rng.random((3, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.37, 1.0])
    rids = np.array([5, 2**32 + 3, 1])
    a, ref = x.copy(), x.copy()
    ca = K.mrf_sweep(a, t, b, KEY, rids, 7, 2**31 + 1, 3, method)
    cr = reference_sweep(ref, t, b, KEY, rids, 7, 2**31 + 1, 3, method)
    np.testing.assert_array_equal(a, ref)
    np.testing.assert_array_equal(ca, cr)


def test_result_independent_of_batching_threads_and_sweep_split():
    nb = pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    t = T.make_mrf_target(random_model(rng, 200, 0.03, 0.6))
    x0 = np.where(rng.random((6, 200)) < 0.5, 1, -1).astype(np.int8)
    b = np.linspace(0.0, 1.0, 6)
    rids = np.arange(6) + 10
    whole = x0.copy()
    c_whole = K.mrf_sweep(whole, t, b, KEY, rids, 1, 4, 6, "heatbath")
    parts = x0.copy()
    c_parts = np.zeros(6, dtype=np.int64)
    for sl in (slice(0, 1), slice(1, 4), slice(4, 6)):
        p = parts[sl].copy()
        c_parts[sl] += K.mrf_sweep(p, t, b[sl], KEY, rids[sl], 1, 4, 2, "heatbath")
        c_parts[sl] += K.mrf_sweep(p, t, b[sl], KEY, rids[sl], 1, 6, 4, "heatbath")
        parts[sl] = p
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_array_equal(c_whole, c_parts)
    old = nb.get_num_threads()
    try:
        nb.set_num_threads(1)
        one = x0.copy()
        K.mrf_sweep(one, t, b, KEY, rids, 1, 4, 6, "heatbath")
    finally:
        nb.set_num_threads(old)
    np.testing.assert_array_equal(one, whole)


def test_sweep_rejects_bad_input():
    t = T.make_mrf_target(random_model(np.random.default_rng(0), 4, 1.0, 1.0))
    x = np.ones((2, 4), dtype=np.int8)
    with pytest.raises(ValueError, match="method"):
        K.mrf_sweep(x, t, np.zeros(2), KEY, np.arange(2), 0, 0, 1, "gibbs")
    with pytest.raises(ValueError, match=r"int8 \[R, 4\]"):
        K.mrf_sweep(x.astype(np.int16), t, np.zeros(2), KEY, np.arange(2), 0, 0, 1, "heatbath")
    with pytest.raises(ValueError, match="b must be"):
        K.mrf_sweep(x, t, np.array([0.0, 1.5]), KEY, np.arange(2), 0, 0, 1, "heatbath")
    with pytest.raises(ValueError, match="replica_ids"):
        K.mrf_sweep(x, t, np.zeros(2), KEY, np.arange(3), 0, 0, 1, "heatbath")
    zero = x.copy()
    zero[1, 2] = 0
    with pytest.raises(ValueError, match=r"only -1 and \+1"):
        K.mrf_sweep(zero, t, np.zeros(2), KEY, np.arange(2), 0, 0, 1, "heatbath")
    np.testing.assert_array_equal(zero[0], 1)  # rejected before any sweep


@pytest.mark.parametrize("method", K.METHODS)
def test_kernel_samples_the_exact_marginals(method):
    """Means and edge correlations of a frustrated 10-node model at b = 0.8 with a reference field, from
    many replicas after burn-in, within 5 standard errors of enumeration."""
    rng = np.random.default_rng(11)
    model = random_model(rng, 10, 0.5, 0.9, field=0.4)
    a = rng.normal(0.0, 0.4, 10)
    t = T.make_mrf_target(model, ref_field=a)
    b = 0.8
    level = M.PairwiseMRF(b * model.h + (1 - b) * a, model.edges, b * model.J)
    ex = exact.exact_marginals(level)
    R = 4000
    x = np.ones((R, 10), dtype=np.int8)
    K.mrf_sweep(x, t, np.full(R, b), KEY, np.arange(R), 0, 0, 30, method)
    xs = x.astype(np.float64)
    se = np.sqrt(np.maximum(1 - ex.mean**2, 1e-3) / R)
    assert np.all(np.abs(xs.mean(0) - ex.mean) < 5 * se)
    pair = xs[:, model.edges[:, 0]] * xs[:, model.edges[:, 1]]
    se_p = np.sqrt(np.maximum(1 - ex.pair_mean**2, 1e-3) / R)
    assert np.all(np.abs(pair.mean(0) - ex.pair_mean) < 5 * se_p)


def test_numpy_peer_samples_the_exact_marginals():
    """The benchmark's NumPy peer is a correct sampler too (else the comparison means nothing)."""
    rng = np.random.default_rng(12)
    model = random_model(rng, 9, 0.6, 0.7)
    t = T.make_mrf_target(model)
    ex = exact.exact_marginals(model)
    R = 4000
    x = np.ones((R, 9), dtype=np.int8)
    K.numpy_colour_sweep(x, t, 1.0, np.random.default_rng(0), 30)
    se = np.sqrt(np.maximum(1 - ex.mean**2, 1e-3) / R)
    assert np.all(np.abs(x.mean(0) - ex.mean) < 5 * se)


def test_statistics_are_the_log_potential():
    rng = np.random.default_rng(5)
    model = random_model(rng, 15, 0.3, 1.0)
    t = T.make_mrf_target(model, ref_field=rng.normal(size=15))
    x = np.where(rng.random((4, 15)) < 0.5, 1, -1).astype(np.int8)
    st = K.mrf_statistics(x, t)
    np.testing.assert_allclose(st[:, 0] + st[:, 1], M.energy_terms(model, x), atol=1e-12)
    np.testing.assert_allclose(st[:, 2], x @ t.ref_field, atol=1e-12)
    np.testing.assert_array_equal(st[:, 3], x.sum(1))
    np.testing.assert_array_equal(K.mrf_statistics(x[2:3], t), st[2:3])


# ----------------------------------------------------------------------------------------------
# The CUDA source, compiled as C++ for the host, against the numba kernel
# ----------------------------------------------------------------------------------------------

_HOST_PRELUDE = r"""
#include <cmath>
#include <cstdint>
using std::ldexp; using std::rint; using std::fabs;
#include <pthread.h>
struct pgm_dim3 { unsigned int x, y, z; };
static pgm_dim3 blockIdx, blockDim;
static thread_local pgm_dim3 threadIdx;
static pthread_barrier_t pgm_barrier;  /* a block's threads: __syncthreads() */
#define __syncthreads() pthread_barrier_wait(&pgm_barrier)
#define __shared__
double pgm_smem[48 * 1024 / 8];  /* a block's dynamic shared memory (blocks run one after another) */
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
static inline unsigned int __umulhi(unsigned int a, unsigned int b)
{ return (unsigned int)(((unsigned long long)a * (unsigned long long)b) >> 32); }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v)
{ return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
"""

_HOST_DRIVER = r"""
extern "C" void pgm_launch(unsigned int gx, unsigned int gy, unsigned int bx,
    signed char* x, const double* b, const double* h, const double* a, const int* leg, const long long* indptr,
    const long long* nbr, const double* Jn, const long long* sites, const unsigned int* rid32,
    unsigned long long* counts, int r0, int n, int lo, int hi, unsigned int ctr1, unsigned int chain32,
    unsigned int key0, unsigned int key1, int metropolis)
{
    blockDim.x = bx; blockDim.y = 1;
    for (unsigned int y = 0; y < gy; ++y) {
        blockIdx.y = y;
        for (unsigned int bb = 0; bb < gx; ++bb) {
            blockIdx.x = bb;
            for (unsigned int t = 0; t < bx; ++t) {
                threadIdx.x = t;
                pgm_mrf_colour(x, b, h, a, leg, indptr, nbr, Jn, sites, rid32, counts, r0, n, lo, hi, ctr1, chain32,
                               key0, key1, metropolis);
            }
        }
    }
}
/* pgm_mrf_sweeps: the blocks one after another, each block's threads as POSIX threads that meet at
   __syncthreads() (a barrier), as a GPU runs them. */
struct pgm_sweeps_args {
    unsigned int t; signed char* x; const double *b, *h, *a; const int* leg; const long long *indptr, *nbr;
    const double* Jn; const long long *sites, *colptr, *tptr, *tnbr; const double* tJ; const unsigned int* rid32;
    unsigned long long* counts; int r0, n, C; unsigned long long t0; int n_sweeps, term_cap, shared_x;
    long long slack; unsigned int chain32, key0, key1; int metropolis;
};
static void* pgm_sweeps_thread(void* p)
{
    const pgm_sweeps_args* q = (const pgm_sweeps_args*)p;
    threadIdx.x = q->t; threadIdx.y = 0; threadIdx.z = 0;
    pgm_mrf_sweeps(q->x, q->b, q->h, q->a, q->leg, q->indptr, q->nbr, q->Jn, q->sites, q->colptr, q->tptr, q->tnbr,
                   q->tJ, q->rid32, q->counts, q->r0, q->n, q->C, q->t0, q->n_sweeps, q->term_cap, q->shared_x,
                   q->slack, q->chain32, q->key0, q->key1, q->metropolis);
    return 0;
}
extern "C" void pgm_launch_sweeps(unsigned int gx, unsigned int bx,
    signed char* x, const double* b, const double* h, const double* a, const int* leg, const long long* indptr,
    const long long* nbr, const double* Jn, const long long* sites, const long long* colptr, const long long* tptr,
    const long long* tnbr, const double* tJ, const unsigned int* rid32, unsigned long long* counts, int r0, int n,
    int C, unsigned long long t0, int n_sweeps, int term_cap, int shared_x, long long slack, unsigned int chain32,
    unsigned int key0, unsigned int key1, int metropolis)
{
    blockDim.x = bx; blockDim.y = 1; blockDim.z = 1;
    pthread_t th[1024];
    pgm_sweeps_args q[1024];
    for (unsigned int bb = 0; bb < gx; ++bb) {
        blockIdx.x = bb; blockIdx.y = 0;
        pthread_barrier_init(&pgm_barrier, 0, bx);
        for (unsigned int t = 0; t < bx; ++t) {
            q[t] = pgm_sweeps_args{t, x, b, h, a, leg, indptr, nbr, Jn, sites, colptr, tptr, tnbr, tJ, rid32, counts,
                                   r0, n, C, t0, n_sweeps, term_cap, shared_x, slack, chain32, key0, key1, metropolis};
            pthread_create(&th[t], 0, pgm_sweeps_thread, &q[t]);
        }
        for (unsigned int t = 0; t < bx; ++t) pthread_join(th[t], 0);
        pthread_barrier_destroy(&pgm_barrier);
    }
}
"""


@pytest.fixture(scope="module")
def cuda_source_on_cpu(tmp_path_factory):
    """The kernel's CUDA C source compiled for the host without FMA contraction (threads run one after
    another, one of the orders a GPU may use; nodes of one colour do not interact)."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CUDA source for the CPU")
    d = tmp_path_factory.mktemp("mrf_cuda_on_cpu")
    src = d / "kernel.cpp"
    src.write_text(_HOST_PRELUDE + mrf_cuda._CUDA_SOURCE + _HOST_DRIVER)
    lib = d / "kernel.so"
    flags = ["-O1", "-std=c++11", "-ffp-contract=off", "-shared", "-fPIC", "-pthread", "-w"]
    subprocess.run([cxx, *flags, str(src), "-o", str(lib)], check=True)
    lib = ctypes.CDLL(str(lib))
    fn, fs = lib.pgm_launch, lib.pgm_launch_sweeps
    P, U, I, U64 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulonglong
    fn.argtypes = [U, U, U] + [P] * 11 + [I] * 4 + [U] * 4 + [I]
    fs.argtypes = [U, U] + [P] * 15 + [I] * 3 + [U64, I, I, I, ctypes.c_longlong] + [U] * 3 + [I]
    fn.restype = fs.restype = None
    dtypes = [np.int8, np.float64, np.float64, np.float64, np.int32, np.int64, np.int64, np.float64, np.int64]

    def pointers(arrays, types):
        for arr, dt in zip(arrays, types, strict=True):
            assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous and arr.dtype == dt
        return [arr.ctypes.data for arr in arrays]

    def launch(grid, block, args):
        arrays, scalars = args[:11], args[11:]
        assert [type(v) for v in scalars] == [np.int32] * 4 + [np.uint32] * 4 + [np.int32]
        fn(grid[0], grid[1], block[0], *pointers(arrays, dtypes + [np.uint32, np.uint64]), *[int(v) for v in scalars])

    def launch_sweeps(grid, block, args, shared_mem=0):
        arrays, scalars = args[:15], args[15:]
        assert grid[1] == 1 and block[1] == 1 and 1 <= block[0] <= 1024
        types = [np.int32] * 3 + [np.uint64] + [np.int32] * 3 + [np.int64] + [np.uint32] * 3 + [np.int32]
        assert [type(v) for v in scalars] == types
        term_cap, shared_x = int(scalars[5]), int(scalars[6])
        used = 8 * term_cap + (16 * block[0] if term_cap else 0) + shared_x * int(scalars[1])
        assert shared_mem == used <= 48 * 1024  # what the kernel uses, within the host buffer
        launch_sweeps.used.append((term_cap, shared_x))
        ptrs = pointers(arrays, dtypes + [np.int64] * 3 + [np.float64, np.uint32, np.uint64])
        fs(grid[0], block[0], *ptrs, *[int(v) for v in scalars])

    launch_sweeps.used = []  # (term_cap, shared_x) of each launch
    launch.sweeps = launch_sweeps
    return launch


def assert_sweeps_kernel_matches_numba(
    launch, t, x, b, rids, chain, sweep0, n_sweeps, method, threads, ref=(None, None)
):
    """pgm_mrf_sweeps (the emulated ``launch.sweeps``, ``threads`` per replica) and the numba kernel from the same
    spins ``x``: the same spins and change counts."""
    a, c = x.copy(), x.copy()
    ca = mrf_cuda.sweep_cuda(
        a, t, b, KEY, rids, chain, sweep0, n_sweeps, method, np, launch, *ref, launch.sweeps, threads
    )
    cc = K.mrf_sweep(c, t, b, KEY, rids.astype(np.int64), chain, sweep0, n_sweeps, method, *ref)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(ca, cc)


@pytest.mark.parametrize("n,density", [(6, 1.0), (40, 0.1), (700, 0.01)])
def test_cuda_source_on_cpu_matches_numba(cuda_source_on_cpu, n, density, monkeypatch):
    monkeypatch.setattr(mrf_cuda, "_CUDA_MAX_GRID_Y", 2)  # replicas in two launches: offsets matter
    rng = np.random.default_rng(n)
    t = T.make_mrf_target(random_model(rng, n, density, 1.2), ref_field=rng.normal(0, 0.3, n))
    x = np.where(rng.random((3, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.5, 1.0])
    rids = np.array([3, 2**32 + 1, 77], dtype=np.uint64)
    for method in K.METHODS:
        a, c = x.copy(), x.copy()
        ca = mrf_cuda.sweep_cuda(a, t, b, KEY, rids, 6, 2**31 + 3, 3, method, np, cuda_source_on_cpu)
        cc = K.mrf_sweep(c, t, b, KEY, rids.astype(np.int64), 6, 2**31 + 3, 3, method)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(ca, cc)


@pytest.mark.parametrize("n,density", [(6, 1.0), (40, 0.1), (700, 0.01)])
def test_cuda_sweeps_kernel_on_cpu_matches_numba(cuda_source_on_cpu, n, density, monkeypatch):
    """pgm_mrf_sweeps (a call's sweeps in one launch, a block of threads per replica sharing each colour's
    groups): the bits of the numba kernel for 1, 3 and 32 threads per block, with the shipped block size too,
    with one reference and with a reference per replica; sweep numbers past 2**32 (the counter word wraps)."""
    monkeypatch.setattr(mrf_cuda, "_CUDA_MAX_GRID_Y", 2)  # replicas in two launches: offsets matter
    rng = np.random.default_rng(n + 5)
    t = T.make_mrf_target(random_model(rng, n, density, 1.2), ref_field=rng.normal(0, 0.3, n))
    x = np.where(rng.random((3, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.5, 1.0])
    rids = np.array([3, 2**32 + 1, 77], dtype=np.uint64)
    rows, leg = np.stack([np.zeros(n), rng.normal(0, 0.6, n)]), np.array([1, 0, 1])
    assert mrf_cuda.sweeps_block(t) == min(256, 32 * math.ceil(max(np.diff(t.colptr) + 3) // 4 / 32))
    for method in K.METHODS:
        for threads in (1, 3, 32, None):
            for ref in ((None, None), (rows, leg)):
                sweep0 = 2**32 // t.n_colours - 1  # (sweep0 + 2) * C passes 2**32
                assert_sweeps_kernel_matches_numba(
                    cuda_source_on_cpu, t, x, b, rids, 6, sweep0, 3, method, threads, ref
                )


@pytest.mark.parametrize("n,density", [(30, 0.7), (300, 0.03)])
def test_cuda_sweeps_kernel_on_cpu_stages_terms_and_spins_in_shared_memory(cuda_source_on_cpu, n, density, monkeypatch):
    """pgm_mrf_sweeps' shared memory: a colour's field terms staged by the whole block (every colour, none, or some
    but not others) and the replica's spins in shared memory or not: the numba kernel's bits each way."""
    rng = np.random.default_rng(n + 11)
    t = T.make_mrf_target(random_model(rng, n, density, 1.2), ref_field=rng.normal(0, 0.3, n))
    x = np.where(rng.random((3, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.5, 1.0])
    rids = np.array([3, 2**32 + 1, 77], dtype=np.uint64)
    tptr, tnbr, tJ = mrf_cuda.colour_terms(t)
    per_colour = np.diff(tptr[t.colptr])
    assert tptr[-1] == t.nbr.shape[0]
    for k in range(n):  # node sites[k]'s neighbours and couplings, in CSR order
        i = t.sites[k]
        np.testing.assert_array_equal(tnbr[tptr[k] : tptr[k + 1]], t.nbr[t.indptr[i] : t.indptr[i + 1]])
        np.testing.assert_array_equal(tJ[tptr[k] : tptr[k + 1]], t.Jn[t.indptr[i] : t.indptr[i + 1]])
    mid = int(np.median(per_colour))
    configs = [(1024, True), (0, False), (mid, True), (mid, False)]  # (_TERM_CAP, _SHARED_SPINS)
    seen = []
    for cap, spins in configs:
        monkeypatch.setattr(mrf_cuda, "_TERM_CAP", cap)
        monkeypatch.setattr(mrf_cuda, "_SHARED_SPINS", spins)
        for method in K.METHODS:
            for threads in (3, 32):
                cuda_source_on_cpu.sweeps.used.clear()
                assert_sweeps_kernel_matches_numba(cuda_source_on_cpu, t, x, b, rids, 6, 5, 3, method, threads)
                seen += cuda_source_on_cpu.sweeps.used
    room = {cap: int(per_colour[per_colour <= cap].max(initial=0)) for cap, _ in configs}  # the kernel's term_cap
    assert set(seen) == {(room[1024], 1), (0, 0), (room[mid], 1), (room[mid], 0)}
    assert 0 < (per_colour <= room[mid]).sum() < t.n_colours  # some colours staged and some not


@pytest.mark.parametrize("slack", [0, 2**31, 2**33])
def test_cuda_wide_colours_on_cpu_match_numba(cuda_source_on_cpu, slack, monkeypatch):
    """pgm_mrf_wide_group (colours of at most four nodes and at least 8 terms a node, decided by the whole block
    from tree sums): the numba kernel's bits with the shipped slack (the tree's field decides almost every node),
    2**31 (about half the nodes take the spec's sum) and 2**33 (all do); strong couplings too, where the tree's
    field and the spec's sum differ in their last bits."""
    monkeypatch.setattr(mrf_cuda, "_TREE_SLACK", slack)
    rng = np.random.default_rng(slack % 1000 + 3)
    for n, density, scale in [(40, 1.0, 0.3), (24, 0.8, 3.0), (9, 1.0, 1.0)]:
        t = T.make_mrf_target(random_model(rng, n, density, scale), ref_field=rng.normal(0, 0.3, n))
        tptr = mrf_cuda.colour_terms(t)[0]
        m = np.diff(t.colptr)
        wide = (m <= 4) & (np.diff(tptr[t.colptr]) >= 8 * m)
        assert wide.sum() >= t.n_colours // 2  # the path under test runs
        x = np.where(rng.random((4, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.array([0.0, 0.3, 0.7, 1.0])
        rids = np.array([5, 2**32 + 9, 1, 12], dtype=np.uint64)
        for method in K.METHODS:
            for threads in (1, 3, 32, 100) if slack == 0 else (3, 32):  # each emulated thread is a POSIX thread
                assert_sweeps_kernel_matches_numba(cuda_source_on_cpu, t, x, b, rids, 1, 7, 4, method, threads)


def test_the_gpu_kernel_choice():
    """One launch per call unless the replicas are fewer than the multiprocessors and a colour has more groups than
    a block has threads (then a block per replica would leave multiprocessors idle)."""
    sparse = T.make_mrf_target(M.make_mrf(np.zeros(4000), np.array([(i, i + 1) for i in range(3999)]), np.ones(3999)))
    dense = T.make_mrf_target(random_model(np.random.default_rng(0), 30, 1.0, 1.0))
    assert mrf_cuda.sweeps_block(sparse) == 256 and mrf_cuda.sweeps_block(dense) == 32
    assert mrf_cuda.auto_kernel(sparse, 16, 132) == "colour"
    assert mrf_cuda.auto_kernel(sparse, 132, 132) == "sweeps"
    assert mrf_cuda.auto_kernel(dense, 1, 132) == "sweeps"


def test_an_unknown_gpu_kernel_is_refused_before_the_gpu_is_touched():
    t = T.make_mrf_target(random_model(np.random.default_rng(0), 4, 1.0, 1.0))
    with pytest.raises(ValueError, match="kernel must be one of"):
        mrf_cuda.sweep_cupy(np.ones((2, 4), np.int8), t, np.ones(2), KEY, np.arange(2), 0, 0, 1, "heatbath", kernel="x")


@pytest.mark.gpu
def test_cupy_kernel_matches_numba():
    if not backend.gpu_status()[0]:
        pytest.skip(backend.gpu_status()[1])
    cp = backend.cupy()
    rng = np.random.default_rng(42)
    for R, n, d in [(3, 8, 1.0), (5, 300, 0.02), (2, 2000, 0.002)]:
        t = T.make_mrf_target(random_model(rng, n, d, 1.0), ref_field=rng.normal(0, 0.3, n))
        x = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.linspace(0.0, 1.0, R)
        rids = np.arange(R) * 7 + 1
        for method in K.METHODS:
            host = x.copy()
            c_host = K.mrf_sweep(host, t, b, KEY, rids, 2, 9, 4, method)
            dev = cp.asarray(x)
            c_dev = K.mrf_sweep(dev, t, b, KEY, rids, 2, 9, 4, method)
            assert isinstance(c_dev, np.ndarray) and c_dev.dtype == np.int64
            np.testing.assert_array_equal(cp.asnumpy(dev), host)
            np.testing.assert_array_equal(c_dev, c_host)
            rows, leg = np.stack([np.zeros(n), rng.normal(0, 0.5, n)]), np.arange(R) % 2  # two references
            host = x.copy()
            c_host = K.mrf_sweep(host, t, b, KEY, rids, 2, 9, 4, method, ref_fields=rows, leg=leg)
            dev = cp.asarray(x)
            c_dev = K.mrf_sweep(dev, t, b, KEY, rids, 2, 9, 4, method, ref_fields=rows, leg=leg)
            np.testing.assert_array_equal(cp.asnumpy(dev), host)
            np.testing.assert_array_equal(c_dev, c_host)


@pytest.mark.gpu
def test_cupy_sweeps_kernel_matches_numba(monkeypatch):
    """pgm_mrf_sweeps on the GPU: the numba kernel's bits at 1, 32 and 256 threads per replica and at the shipped
    block size, on graphs whose colours have one group and more groups than a block has threads; with the shipped
    shared memory, with none (no staged terms, spins in global memory), with only the smaller colours staged, and
    with every node of a wide colour (the dense graph's) sent to the spec's sum (slack 2**33)."""
    if not backend.gpu_status()[0]:
        pytest.skip(backend.gpu_status()[1])
    cp = backend.cupy()
    rng = np.random.default_rng(43)
    for R, n, d in [(3, 24, 1.0), (5, 300, 0.02), (4, 6000, 0.0007)]:  # 24 nodes: wide colours
        t = T.make_mrf_target(random_model(rng, n, d, 1.0), ref_field=rng.normal(0, 0.3, n))
        x = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.linspace(0.0, 1.0, R)
        rids = np.arange(R) * 7 + 1
        for method in K.METHODS:
            host = x.copy()
            c_host = K.mrf_sweep(host, t, b, KEY, rids, 2, 2**32 - 1, 4, method)
            mid = int(np.median(np.diff(mrf_cuda.colour_terms(t)[0][t.colptr])))
            for cap, spins, slack in [(1024, True, 0), (0, False, 0), (mid, False, 0), (1024, True, 2**33)]:
                monkeypatch.setattr(mrf_cuda, "_TERM_CAP", cap)
                monkeypatch.setattr(mrf_cuda, "_SHARED_SPINS", spins)
                monkeypatch.setattr(mrf_cuda, "_TREE_SLACK", slack)
                for threads in (1, 32, 256, None):
                    dev = cp.asarray(x)
                    c_dev = mrf_cuda.sweep_cuda(
                        dev, t, b, KEY, rids, 2, 2**32 - 1, 4, method, cp, mrf_cuda._cupy_kernel(), None, None,
                        mrf_cuda._cupy_sweeps_kernel(), threads,
                    )  # fmt: skip
                    np.testing.assert_array_equal(cp.asnumpy(dev), host)
                    np.testing.assert_array_equal(c_dev, c_host)
                monkeypatch.undo()
            for kernel in mrf_cuda.KERNELS:
                dev = cp.asarray(x)
                c_dev = mrf_cuda.sweep_cupy(dev, t, b, KEY, rids, 2, 2**32 - 1, 4, method, kernel=kernel)
                np.testing.assert_array_equal(cp.asnumpy(dev), host)
                np.testing.assert_array_equal(c_dev, c_host)


# ----------------------------------------------------------------------------------------------
# A reference per replica (the two legs of tempering.reference=stabilized)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", K.METHODS)
@pytest.mark.parametrize("n,density", [(5, 1.0), (21, 0.15)])
def test_per_replica_reference_matches_the_spec(method, n, density):
    """Two reference rows (uniform and a product of independent spins), each replica on its own row: the numba
    kernel equals the spec transcribed node by node, at b = 0 (exact draws from the replica's reference) too."""
    rng = np.random.default_rng(100 + n)
    t = T.make_mrf_target(random_model(rng, n, density, 0.8))
    rows = np.stack([np.zeros(n), rng.normal(0, 0.7, n)])
    leg = np.array([0, 1, 1, 0, 1])
    x = np.where(rng.random((5, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.0, 0.37, 1.0, 1.0])
    rids = np.array([5, 2**32 + 3, 1, 8, 9])
    a, ref = x.copy(), x.copy()
    ca = K.mrf_sweep(a, t, b, KEY, rids, 7, 2**31 + 1, 3, method, ref_fields=rows, leg=leg)
    cr = reference_sweep(ref, t, b, KEY, rids, 7, 2**31 + 1, 3, method, ref_fields=rows, leg=leg)
    np.testing.assert_array_equal(a, ref)
    np.testing.assert_array_equal(ca, cr)
    one = x.copy()  # one row equal to the target's own reference: the same bits as no rows at all
    K.mrf_sweep(one, t, b, KEY, rids, 7, 2**31 + 1, 3, method, ref_fields=t.ref_field[None], leg=np.zeros(5, int))
    own = x.copy()
    K.mrf_sweep(own, t, b, KEY, rids, 7, 2**31 + 1, 3, method)
    np.testing.assert_array_equal(one, own)


def test_per_replica_reference_bits_do_not_depend_on_batching():
    """A replica's bits with two reference rows depend on its own row only, not on which replicas share its
    call (blocks of one replica against the whole set, threaded)."""
    rng = np.random.default_rng(4)
    t = T.make_mrf_target(random_model(rng, 150, 0.04, 0.7))
    rows = np.stack([np.zeros(150), rng.normal(0, 0.5, 150)])
    R = 20
    leg = (np.arange(R) % 3 == 0).astype(np.int64)
    x0 = np.where(rng.random((R, 150)) < 0.5, 1, -1).astype(np.int8)
    b = rng.random(R)
    whole = x0.copy()
    K.mrf_sweep(whole, t, b, KEY, np.arange(R), 2, 0, 5, "heatbath", ref_fields=rows, leg=leg)
    for r in range(R):
        one = x0[r : r + 1].copy()
        K.mrf_sweep(one, t, b[r : r + 1], KEY, np.array([r]), 2, 0, 5, "heatbath", ref_fields=rows, leg=leg[r : r + 1])
        np.testing.assert_array_equal(one[0], whole[r])


def test_per_replica_reference_rejects_bad_rows():
    t = T.make_mrf_target(random_model(np.random.default_rng(0), 4, 1.0, 1.0))
    x = np.ones((2, 4), dtype=np.int8)
    with pytest.raises(ValueError, match="ref_fields"):
        K.mrf_sweep(x, t, np.zeros(2), KEY, np.arange(2), 0, 0, 1, "heatbath", ref_fields=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="leg"):
        K.mrf_sweep(x, t, np.zeros(2), KEY, np.arange(2), 0, 0, 1, "heatbath", np.zeros((2, 4)), np.array([0, 2]))


@pytest.mark.parametrize("n,density", [(6, 1.0), (200, 0.02)])
def test_cuda_source_on_cpu_matches_numba_per_replica_reference(cuda_source_on_cpu, n, density, monkeypatch):
    monkeypatch.setattr(mrf_cuda, "_CUDA_MAX_GRID_Y", 2)
    rng = np.random.default_rng(n + 1)
    t = T.make_mrf_target(random_model(rng, n, density, 1.2))
    rows = np.stack([np.zeros(n), rng.normal(0, 0.6, n)])
    leg = np.array([1, 0, 1, 1])
    x = np.where(rng.random((4, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.array([0.0, 0.5, 1.0, 0.25])
    rids = np.array([3, 2**32 + 1, 77, 4], dtype=np.uint64)
    for method in K.METHODS:
        a, c = x.copy(), x.copy()
        ca = mrf_cuda.sweep_cuda(a, t, b, KEY, rids, 6, 9, 3, method, np, cuda_source_on_cpu, rows, leg)
        cc = K.mrf_sweep(c, t, b, KEY, rids.astype(np.int64), 6, 9, 3, method, ref_fields=rows, leg=leg)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(ca, cc)


# Digests of the kernel's output (spins, change counts, statistics) for the single-reference paths, saved before
# the per-replica reference was added: reference=fixed (uniform) and reference=variational (the mean-field
# product), both methods, three graphs, 3 and 70 replicas. A change here changes every fixed/variational run.
SAVED_BITS = {
    "fixed-heatbath-n7-R3": "8daf0d15946833f8",
    "fixed-heatbath-n7-R70": "c93734ce4934e3fc",
    "fixed-metropolis-n7-R3": "83256804b784d684",
    "fixed-metropolis-n7-R70": "9366ae3f896e0734",
    "variational-heatbath-n7-R3": "25873b85f2b51f87",
    "variational-heatbath-n7-R70": "320b51e0af0d6c70",
    "variational-metropolis-n7-R3": "125cc99d7bd800f8",
    "variational-metropolis-n7-R70": "779b4b9436a964c4",
    "fixed-heatbath-n40-R3": "26988d73ee66be5e",
    "fixed-heatbath-n40-R70": "2f417fd5e6febe9e",
    "fixed-metropolis-n40-R3": "1ba7ba5950504096",
    "fixed-metropolis-n40-R70": "41188056488c4006",
    "variational-heatbath-n40-R3": "749b3946406b939f",
    "variational-heatbath-n40-R70": "0267fdcce20c71ab",
    "variational-metropolis-n40-R3": "b4d78e29a866ec3c",
    "variational-metropolis-n40-R70": "4fa5716a264146c8",
    "fixed-heatbath-n300-R3": "9109e039eec6ea4a",
    "fixed-heatbath-n300-R70": "7adff78c55700f91",
    "fixed-metropolis-n300-R3": "0b579cad7056095a",
    "fixed-metropolis-n300-R70": "f3f85d51cc2d02a6",
    "variational-heatbath-n300-R3": "1f98c2af37d4203e",
    "variational-heatbath-n300-R70": "96e0301f22c775bd",
    "variational-metropolis-n300-R3": "ab225828687e524b",
    "variational-metropolis-n300-R70": "2dac04d50c66b5e4",
}


def test_single_reference_bits_are_the_saved_ones():
    import hashlib

    got = {}
    for n, d in [(7, 1.0), (40, 0.2), (300, 0.02)]:
        rng = np.random.default_rng(1000 + n)
        model = random_model(rng, n, d, 1.0)
        for ref in ("fixed", "variational"):
            if ref == "fixed":
                t = T.make_mrf_target(model)
            else:
                t = T.make_mrf_target(model, T.mean_field_reference(model)[0], "mean_field")
            for method in K.METHODS:
                for R in (3, 70):
                    x = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
                    c = K.mrf_sweep(x, t, np.linspace(0.0, 1.0, R), KEY, np.arange(R) * 3 + 1, 5, 11, 4, method)
                    st = K.mrf_statistics(x, t)
                    got[f"{ref}-{method}-n{n}-R{R}"] = hashlib.sha256(
                        x.tobytes() + c.tobytes() + st.tobytes()
                    ).hexdigest()[:16]
    assert got == SAVED_BITS


@pytest.mark.parametrize("method", K.METHODS)
def test_threads_sharing_a_colour_give_the_same_bits_as_one_thread(method):
    """The node-sharing plan (each colour's Philox groups split between threads, ``_sweep_nodes``) against one
    block on one thread and against blocks of replicas: spins, change counts and fallback counts identical, with
    two references, padding lanes (13 replicas), colours whose last group is partial, 2 and 3 shares, the
    shipped margin and a wide one (the fallback inside the shares)."""
    import networkx as nx

    rng = np.random.default_rng(11 if method == "heatbath" else 12)
    g = nx.random_regular_graph(3, 1002, seed=5)
    edges = np.array(sorted(tuple(sorted(e)) for e in g.edges()), dtype=np.int64)
    t = T.make_mrf_target(M.make_mrf(rng.normal(0.0, 0.3, 1002), edges, rng.normal(0.0, 0.8, len(edges))))
    assert any((t.colptr[c + 1] - t.colptr[c]) % 4 for c in range(t.n_colours))  # a partial group somewhere
    R, n = 13, t.n_sites
    x0 = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.concatenate([[0.0, 1.0], rng.random(R - 2)])
    rid = np.arange(R, dtype=np.uint64) * 7 + 1
    rows, leg = np.stack([np.zeros(n), rng.normal(0.0, 1.0, n)]), np.arange(R) % 2
    for margin in (K.MARGIN, 2.0**24):
        got = []
        for plan in (("replicas", R, 1), ("nodes", R, 2), ("nodes", R, 3), ("replicas", 8, 2), ("nodes", 7, 2)):
            x = x0.copy()
            c, nfb = K._sweep_cpu(x, t, b, KEY, rid, 4, 17, 5, method, rows, leg, margin, plan=plan)
            got.append((x, c, nfb))
        for x, c, nfb in got[1:]:
            np.testing.assert_array_equal(x, got[0][0])
            np.testing.assert_array_equal(c, got[0][1])
            assert nfb == got[0][2]
        assert (got[0][0] != x0).any()
        if margin > K.MARGIN:
            assert got[0][2] > 0


def test_a_measured_plan_keeps_the_bits_and_settles_on_the_fastest(monkeypatch):
    """PGMFLOW_MRF_PLAN=tune: the first calls time each candidate plan TUNE_SAMPLES times, in order, then the call
    shape keeps the one with the best timing; every call gives the static plan's bits."""
    import networkx as nx

    monkeypatch.setattr(K, "_tuning", {})
    used = []
    record = K._record
    monkeypatch.setattr(K, "_record", lambda key, plan, ns: (used.append((key, plan)), record(key, plan, ns)))
    rng = np.random.default_rng(21)
    g = nx.random_regular_graph(4, 2000, seed=2)
    edges = np.array(sorted(tuple(sorted(e)) for e in g.edges()), dtype=np.int64)
    t = T.make_mrf_target(M.make_mrf(rng.normal(0.0, 0.1, 2000), edges, rng.normal(0.0, 0.5, len(edges))))
    R, sweeps = 16, 8  # R * sweeps * (n + 2E) > PARALLEL_MIN_WORK: the threaded path, whose plan is chosen
    assert R * sweeps * (t.n_sites + t.nbr.shape[0]) > K.PARALLEL_MIN_WORK
    x_tuned = np.where(rng.random((R, t.n_sites)) < 0.5, 1, -1).astype(np.int8)
    x_static = x_tuned.copy()
    b, rid = np.linspace(0.2, 1.0, R), np.arange(R)
    threads = backend.numba().get_num_threads()
    cands = K._candidates(R, threads, t.n_sites, t.n_colours)
    calls = K.TUNE_SAMPLES * len(cands) + 2
    for call in range(calls):
        if call == calls - 2:  # after the exploration: make the last candidate the fastest on record
            key = used[-1][0]
            for c in cands:
                K._tuning[key][c] = [1.0 if c == cands[-1] else 2.0] * K.TUNE_SAMPLES
        monkeypatch.setenv("PGMFLOW_MRF_PLAN", "tune")
        c_tuned = K.mrf_sweep(x_tuned, t, b, KEY, rid, 0, sweeps * call, sweeps, "heatbath")
        monkeypatch.setenv("PGMFLOW_MRF_PLAN", "static")
        c_static = K.mrf_sweep(x_static, t, b, KEY, rid, 0, sweeps * call, sweeps, "heatbath")
        np.testing.assert_array_equal(x_tuned, x_static)
        np.testing.assert_array_equal(c_tuned, c_static)
    if threads < 2:
        assert used == []  # one thread: nothing to plan
        return
    explored = [plan for _, plan in used[: K.TUNE_SAMPLES * len(cands)]]
    assert explored == [c for c in cands for _ in range(K.TUNE_SAMPLES)]
    assert [plan for _, plan in used[-2:]] == [cands[-1]] * 2


def test_when_the_plan_is_measured_and_what_it_chooses_among(monkeypatch):
    monkeypatch.delenv("PGMFLOW_MRF_PLAN", raising=False)
    assert not K._tuning_mode(2) and K._tuning_mode(K.TUNE_MIN_THREADS)
    monkeypatch.setenv("PGMFLOW_MRF_PLAN", "static")
    assert not K._tuning_mode(64)
    monkeypatch.setenv("PGMFLOW_MRF_PLAN", "tune")
    assert K._tuning_mode(2)
    monkeypatch.setenv("PGMFLOW_MRF_PLAN", "fast")
    with pytest.raises(ValueError, match="PGMFLOW_MRF_PLAN must be auto, static or tune"):
        K._tuning_mode(2)
    # a dense network on 16 threads (colours of one node: nothing to share): blocks of 8 (the static plan) to 64
    assert K._candidates(64, 16, 100, 100) == [("replicas", 8), ("replicas", 16), ("replicas", 32), ("replicas", 64)]
    # a sparse graph on 2 threads: the static plan (its colours shared), then the replica blocks
    assert K._candidates(16, 2, 10_000, 5) == [("nodes", 16), ("replicas", 8), ("replicas", 16)]
    assert K._candidates(100, 4, 10_000, 5)[0] == K._plan(100, 4, 10_000, 5)
    assert ("nodes", 50) in K._candidates(100, 4, 10_000, 5)


def test_the_plan_shares_nodes_only_where_replicas_would_leave_lanes_idle():
    """Threads over blocks of replicas while every thread gets 64 lanes or the colours are too small to share;
    else one block at a time (at most 64 replicas each) with the colours' groups shared."""
    assert K._plan(64, 2, 10_000, 5) == ("nodes", 64)
    assert K._plan(16, 2, 10_000, 5) == ("nodes", 16)
    assert K._plan(100, 2, 10_000, 5) == ("replicas", 50)  # two blocks: one per thread
    assert K._plan(80, 4, 10_000, 5) == ("nodes", 40)  # two blocks of 40, four threads on each
    assert K._plan(64, 1, 10_000, 5) == ("replicas", 64)
    assert K._plan(64, 2, 100, 100) == ("replicas", 32)  # one node per colour: nothing to share
    assert K._plan(256, 2, 10_000, 5) == ("replicas", 64)
