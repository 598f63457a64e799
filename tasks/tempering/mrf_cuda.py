"""The GPU (CuPy ``RawKernel``) path of the MRF per-colour sweep: the CUDA source, which implements the spec
of :mod:`pgmflow.tasks.tempering.mrf_kernels` bit for bit, and its host side.

Two kernels, the same bits. ``pgm_mrf_colour``: one thread per (replica, group of four nodes of the colour being
updated), one launch per colour of each sweep. ``pgm_mrf_sweeps``: one launch per call, a block of threads per
replica that share each colour's groups and meet at a barrier between colours; it saves the launches (a call of 4
sweeps of a 100-colour graph is 400 of the first kind), keeps a replica's spins and a small colour's field terms
in shared memory (:func:`sweeps_shared`) and decides a colour of a few high-degree nodes with the whole block
(``pgm_mrf_wide_group``: certified tree sums); ``backend=cupy`` picks one by :func:`auto_kernel`
(``benchmarks/tempering_mrf_gpu.py`` times both). Compiled with ``--fmad=false`` (no fused multiply-add), so the
thresholds are the numba kernel's. The tests compile the same source as C++ for the host CPU (a block's threads as
POSIX threads meeting at a barrier) and drive :func:`sweep_cuda` with NumPy arrays.
"""

from __future__ import annotations

import functools

import numpy as np

from pgmflow.tasks import backend

_MASK32 = 0xFFFFFFFF

_CUDA_SOURCE = r"""
typedef unsigned int pgm_u32;
typedef unsigned long long pgm_u64;
typedef long long pgm_i64;

#define PGM_PHILOX_M0 0xD2511F53u
#define PGM_PHILOX_M1 0xCD9E8D57u
#define PGM_PHILOX_W0 0x9E3779B9u
#define PGM_PHILOX_W1 0xBB67AE85u

/* Philox4x32-10 (Random123); c[4] in: counter, out: the four random words. */
__device__ __forceinline__ void pgm_mrf_philox(pgm_u32 c[4], pgm_u32 k0, pgm_u32 k1)
{
    for (int rnd = 0; rnd < 10; ++rnd) {
        if (rnd > 0) { k0 += PGM_PHILOX_W0; k1 += PGM_PHILOX_W1; }
        const pgm_u32 hi0 = __umulhi(PGM_PHILOX_M0, c[0]);
        const pgm_u32 lo0 = PGM_PHILOX_M0 * c[0];
        const pgm_u32 hi1 = __umulhi(PGM_PHILOX_M1, c[2]);
        const pgm_u32 lo1 = PGM_PHILOX_M1 * c[2];
        const pgm_u32 n0 = hi1 ^ c[1] ^ k0;
        const pgm_u32 n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

/* exp(x), -40 <= x <= 0 (0 below), from IEEE + - * and an exact ldexp: the numba kernel's _dexp. */
__device__ __forceinline__ double pgm_dexp(double x)
{
    if (x < -40.0) return 0.0;
    const double kf = x * 1.4426950408889634 + 6755399441055744.0;
    const double k = kf - 6755399441055744.0;
    const double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double p = 1.6059043836821613e-10;
    p = p * r + 2.08767569878681e-09;
    p = p * r + 2.505210838544172e-08;
    p = p * r + 2.755731922398589e-07;
    p = p * r + 2.7557319223985893e-06;
    p = p * r + 2.48015873015873e-05;
    p = p * r + 0.0001984126984126984;
    p = p * r + 0.001388888888888889;
    p = p * r + 0.008333333333333333;
    p = p * r + 0.041666666666666664;
    p = p * r + 0.16666666666666666;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return ldexp(p, (int)k);
}

__device__ __forceinline__ pgm_i64 pgm_mrf_threshold(double z, double s, double b, int metropolis)
{
    if (metropolis && b != 0.0) {
        const double d = -2.0 * s * z;
        const double acc = pgm_dexp(d < 0.0 ? d : 0.0);
        const pgm_i64 t = (pgm_i64)rint(acc * 4294967296.0);
        return s > 0.0 ? 4294967296LL - t : t;
    }
    const double az = z >= 0.0 ? z : -z;
    const double e = pgm_dexp(-2.0 * az);
    const double p = z >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    return (pgm_i64)rint(p * 4294967296.0);
}

/* The nodes at positions 4g .. 4g+3 of the colour [lo, hi) of replica row X: node sites[lo + 4g + w] with Philox
   word w of counter (g, ctr1, rid, chain32). Returns the number of spins it changed. terms: null, or the colour's
   field terms Jn[e] * X[nbr[e]] staged by pgm_mrf_sweeps (the node at position k has terms[tptr[k] - tptr[lo] ..
   tptr[k + 1] - tptr[lo]), its edges in CSR order). */
__device__ __forceinline__ pgm_u64 pgm_mrf_group(
    signed char* X, const double br, const double* ar, const double* h, const pgm_i64* indptr, const pgm_i64* nbr,
    const double* Jn, const pgm_i64* sites, const int lo, const int hi, const int g, const pgm_u32 ctr1,
    const pgm_u32 rid, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1, const int metropolis,
    const double* terms, const pgm_i64* tptr)
{
    pgm_u32 u[4];
    u[0] = (pgm_u32)g; u[1] = ctr1; u[2] = rid; u[3] = chain32;
    pgm_mrf_philox(u, key0, key1);
    pgm_u64 cnt = 0;
    for (int w = 0; w < 4; ++w) {
        const int k = lo + 4 * g + w;
        if (k >= hi) break;
        const pgm_i64 i = sites[k];
        double f = h[i];
        if (terms) {  /* the colour's terms, staged in CSR order: the same values added in the same order */
            const pgm_i64 t_lo = tptr[lo];
            for (pgm_i64 t = tptr[k]; t < tptr[k + 1]; ++t) f += terms[t - t_lo];
        } else {
            for (pgm_i64 e = indptr[i]; e < indptr[i + 1]; ++e) f += Jn[e] * (double)X[nbr[e]];
        }
        const double z = br * f + (1.0 - br) * ar[i];
        const int s = X[i];
        const int ns = ((pgm_i64)u[w] < pgm_mrf_threshold(z, (double)s, br, metropolis)) ? 1 : -1;
        if (ns != s) { X[i] = (signed char)ns; ++cnt; }
    }
    return cnt;
}

/* A colour of at most four nodes (one group, g = 0) whose terms are staged (pgm_mrf_sweeps), by the whole block: each
   node's field as a tree sum (thread t adds the terms t, t + B, ..., then the partial sums pairwise in shared
   memory, red [2B]) and, beside it, the sum of the terms' magnitudes S. Thread 0 decides with the tree's field when
   that is certified to give the spec's decision, else with the spec's sum (h_i, then the terms in CSR order):
   both sums are within gamma_{m+11} S of the exact one (m terms; the tree's paths have at most ceil(m/B) + 11
   additions, B <= 1024), so |df| <= 2.01 (m + 12) 2**-53 S bounds their difference; z's then differ by at most dz =
   1.01 b df + 2**-50 (|b f| + |z|), and a threshold, within 0.5001 of the real one (2**32 sigma(2z) or 2**32
   exp(min(0, -2sz)), whose slope in z is at most 2**33), by at most 1.0002 + 2**33 dz: below 2 when 2**33 dz <=
   0.99, so the two integer thresholds differ by at most one, and u <= thr - 2 (+1) or u >= thr + 1 (-1) decide as
   the spec's threshold would. Only a u of the two values in between (or a node with 2**33 dz > 0.99) takes the
   spec's sum. slack (tests: 0 as shipped; 2**33 makes every node take the spec's sum) widens that band. Every
   thread of the block calls it (its barriers); thread 0's count is returned. */
__device__ __forceinline__ pgm_u64 pgm_mrf_wide_group(
    signed char* X, const double br, const double* ar, const double* h, const pgm_i64* sites, const pgm_i64* tptr,
    const int lo, const int hi, const pgm_u32 ctr1, const pgm_u32 rid, const pgm_u32 chain32, const pgm_u32 key0,
    const pgm_u32 key1, const int metropolis, const double* terms, double* red, const pgm_i64 slack)
{
    const int t = (int)threadIdx.x;
    const int B = (int)blockDim.x;
    const pgm_i64 t_lo = tptr[lo];
    pgm_u32 u[4];
    u[0] = 0u; u[1] = ctr1; u[2] = rid; u[3] = chain32;
    if (t == 0) pgm_mrf_philox(u, key0, key1);
    pgm_u64 cnt = 0;
    for (int k = lo; k < hi; ++k) {  /* hi - lo <= 4: the same for every thread */
        const pgm_i64 e0 = tptr[k] - t_lo;
        const pgm_i64 e1 = tptr[k + 1] - t_lo;
        double p = 0.0, q = 0.0;
        for (pgm_i64 j = e0 + t; j < e1; j += B) { p += terms[j]; q += fabs(terms[j]); }
        red[t] = p;
        red[B + t] = q;
        for (int d = 1; d < B; d *= 2) {
            __syncthreads();
            if (t % (2 * d) == 0 && t + d < B) { red[t] += red[t + d]; red[B + t] += red[B + t + d]; }
        }
        __syncthreads();  /* the last level's reads are done before any thread writes the next node's partials */
        if (t == 0) {  /* thread 0 wrote red[0] and red[B] last */
            const pgm_i64 i = sites[k];
            const int s = X[i];
            const double ft = h[i] + red[0];
            const double zt = br * ft + (1.0 - br) * ar[i];
            const double df = 2.01 * (double)(e1 - e0 + 12) * 1.1102230246251565e-16 * (fabs(h[i]) + red[B]);
            const double dz = 1.01 * br * df + 8.8817841970012523e-16 * (fabs(br * ft) + fabs(zt));
            const pgm_i64 uw = (pgm_i64)u[k - lo];
            pgm_i64 thr = pgm_mrf_threshold(zt, (double)s, br, metropolis);
            if (!(dz * 8589934592.0 <= 0.99 && (uw + 2 + slack <= thr || uw >= thr + 1 + slack))) {
                double f = h[i];  /* the spec's sum */
                for (pgm_i64 j = e0; j < e1; ++j) f += terms[j];
                thr = pgm_mrf_threshold(br * f + (1.0 - br) * ar[i], (double)s, br, metropolis);
            }
            const int ns = uw < thr ? 1 : -1;
            if (ns != s) { X[i] = (signed char)ns; ++cnt; }
        }
    }
    return cnt;
}

/* One colour of one sweep: thread (blockIdx.y + r0, g) updates group g of the colour (pgm_mrf_group).
   x int8 [R, n] (in place); b float64 [R]; h float64 [n]; a float64 [G, n], the reference fields of G <= 2
   references, and leg int32 [R], each replica's row of a (its leg of a two-leg path; 0 with one reference);
   indptr int64 [n+1]; nbr int64 [2E]; Jn float64 [2E]; sites int64 [n]; counts uint64 [R] (changed spins,
   accumulated). */
extern "C" __global__ void pgm_mrf_colour(
    signed char* __restrict__ x,
    const double* __restrict__ b,
    const double* __restrict__ h,
    const double* __restrict__ a,
    const int* __restrict__ leg,
    const pgm_i64* __restrict__ indptr,
    const pgm_i64* __restrict__ nbr,
    const double* __restrict__ Jn,
    const pgm_i64* __restrict__ sites,
    const pgm_u32* __restrict__ rid32,
    pgm_u64* __restrict__ counts,
    const int r0, const int n, const int lo, const int hi,
    const pgm_u32 ctr1, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1, const int metropolis)
{
    const int g = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (lo + 4 * g >= hi) return;
    const int r = r0 + (int)blockIdx.y;
    const pgm_u64 cnt = pgm_mrf_group(x + (pgm_i64)r * n, b[r], a + (pgm_i64)leg[r] * n, h, indptr, nbr, Jn, sites,
                                      lo, hi, g, ctr1, rid32[r], chain32, key0, key1, metropolis, 0, 0);
    if (cnt) atomicAdd(&counts[r], cnt);
}

/* Sweeps t0 .. t0 + n_sweeps - 1, every colour, in one launch: block blockIdx.x + r0 is replica r, its threads
   take the colour's groups in turn (thread k: groups k, k + blockDim.x, ...) and wait for each other between
   colours. The nodes of a colour do not neighbour each other, so the bits are pgm_mrf_colour's, for any
   blockDim.x. colptr int64 [C+1]: colour c is sites[colptr[c] .. colptr[c+1]); its counter word ctr1 is
   (t C + c) mod 2**32 in sweep t. Other arguments as pgm_mrf_colour's.
   Dynamic shared memory (the launch's shared_mem): term_cap doubles, 2 blockDim.x doubles when term_cap > 0, then
   n bytes when shared_x.
   * shared_x: the replica's spins are copied into shared memory at the start and back at the end, so that every
     neighbour read in between is a shared-memory load.
   * A colour with at most term_cap field terms (tptr int64 [n+1]: the cumulative degree of sites[0 .. k); tnbr
     int64 and tJ float64 [2E]: the neighbours and couplings of sites[0], sites[1], ... in CSR order) has its
     terms tJ[e] * X[tnbr[e]] computed by all the block's threads at once into shared memory, and each node's
     thread then adds its own in CSR order: the same values in the same order, so the same bits; a node of high
     degree no longer makes one thread load its neighbours one after another.
   * Such a colour of at most four nodes with at least 8 terms a node (a dense network's colours are single nodes)
     is decided by the whole block (pgm_mrf_wide_group: tree sums, certified; slack as there). */
extern "C" __global__ void pgm_mrf_sweeps(
    signed char* __restrict__ x,
    const double* __restrict__ b,
    const double* __restrict__ h,
    const double* __restrict__ a,
    const int* __restrict__ leg,
    const pgm_i64* __restrict__ indptr,
    const pgm_i64* __restrict__ nbr,
    const double* __restrict__ Jn,
    const pgm_i64* __restrict__ sites,
    const pgm_i64* __restrict__ colptr,
    const pgm_i64* __restrict__ tptr,
    const pgm_i64* __restrict__ tnbr,
    const double* __restrict__ tJ,
    const pgm_u32* __restrict__ rid32,
    pgm_u64* __restrict__ counts,
    const int r0, const int n, const int C, const pgm_u64 t0, const int n_sweeps, const int term_cap,
    const int shared_x, const pgm_i64 slack, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1,
    const int metropolis)
{
    extern __shared__ double pgm_smem[];
    double* const red = pgm_smem + term_cap;
    const int r = r0 + (int)blockIdx.x;
    signed char* const Xg = x + (pgm_i64)r * n;
    signed char* const X = shared_x ? (signed char*)(red + (term_cap ? 2 * (int)blockDim.x : 0)) : Xg;
    if (shared_x) {
        for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) X[i] = Xg[i];
        __syncthreads();
    }
    const double br = b[r];
    const double* ar = a + (pgm_i64)leg[r] * n;
    const pgm_u32 rid = rid32[r];
    pgm_u64 cnt = 0;
    for (int s = 0; s < n_sweeps; ++s) {
        for (int c = 0; c < C; ++c) {
            const pgm_u32 ctr1 = (pgm_u32)((t0 + (pgm_u64)s) * (pgm_u64)C + (pgm_u64)c);
            const int lo = (int)colptr[c];
            const int hi = (int)colptr[c + 1];
            const pgm_i64 t_lo = tptr[lo];
            const int nt = (int)(tptr[hi] - t_lo);
            const double* terms = 0;
            if (nt <= term_cap) {  /* the same for every thread of the block */
                for (int k = (int)threadIdx.x; k < nt; k += (int)blockDim.x)
                    pgm_smem[k] = tJ[t_lo + k] * (double)X[tnbr[t_lo + k]];
                __syncthreads();
                terms = pgm_smem;
            }
            if (terms && hi - lo <= 4 && nt >= 8 * (hi - lo))
                cnt += pgm_mrf_wide_group(X, br, ar, h, sites, tptr, lo, hi, ctr1, rid, chain32, key0, key1,
                                          metropolis, terms, red, slack);
            else
                for (int g = (int)threadIdx.x; lo + 4 * g < hi; g += (int)blockDim.x)
                    cnt += pgm_mrf_group(X, br, ar, h, indptr, nbr, Jn, sites, lo, hi, g, ctr1, rid, chain32, key0,
                                         key1, metropolis, terms, tptr);
            __syncthreads();
        }
    }
    if (shared_x)
        for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) Xg[i] = X[i];
    if (cnt) atomicAdd(&counts[r], cnt);
}
"""

_CUDA_KERNEL_NAME = "pgm_mrf_colour"
_CUDA_SWEEPS_NAME = "pgm_mrf_sweeps"
_CUDA_BLOCK = 128  # threads per block of pgm_mrf_colour
_CUDA_SWEEPS_MAX_BLOCK = 256  # threads per replica of pgm_mrf_sweeps, at most (fewer when the colours are small)
_SHARED_BYTES = 48 * 1024  # pgm_mrf_sweeps' dynamic shared memory, at most (what a launch gets without an opt-in)
_SHARED_SPINS = True  # pgm_mrf_sweeps keeps a replica's spins in shared memory when they fit (tests: False too)
_TERM_CAP = 1024  # field terms of a colour that pgm_mrf_sweeps stages in shared memory, at most
_TREE_SLACK = 0  # pgm_mrf_wide_group's slack (tests: 2**33 sends every node of a wide colour to the spec's sum)
_CUDA_MAX_GRID_Y = 65535  # replicas per launch (CUDA's limit on gridDim.y)
_OPTIONS = ("-std=c++11", "--fmad=false")
KERNELS = ("auto", "colour", "sweeps")


@functools.lru_cache(maxsize=None)
def _cupy_kernel():
    """Compile (lazily, once per process; CuPy caches the binary on disk) the per-colour kernel."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_KERNEL_NAME, options=_OPTIONS)


@functools.lru_cache(maxsize=None)
def _cupy_sweeps_kernel():
    """Compile (lazily, once per process) the kernel that runs a call's sweeps in one launch."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_SWEEPS_NAME, options=_OPTIONS)


def _largest_colour_groups(target) -> int:
    """Groups of four nodes in the target's largest colour (at least 1)."""
    return int(((np.diff(np.asarray(target.colptr, dtype=np.int64)) + 3) // 4).max(initial=1))


def sweeps_block(target) -> int:
    """Threads per replica of ``pgm_mrf_sweeps``: enough for the largest colour's groups of four nodes, in whole
    warps, at most ``_CUDA_SWEEPS_MAX_BLOCK``."""
    return min(_CUDA_SWEEPS_MAX_BLOCK, 32 * ((_largest_colour_groups(target) + 31) // 32))


def colour_terms(target) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tptr, tnbr, tJ)`` for ``pgm_mrf_sweeps``: tptr int64 [n+1], the cumulative degree of ``sites[0 .. k)``;
    tnbr int64 and tJ float64 [2E], the neighbours and couplings of ``sites[0]``, ``sites[1]``, ... each in CSR
    order (colour c's field terms are entries ``tptr[colptr[c]] .. tptr[colptr[c+1]]``)."""
    indptr = np.asarray(target.indptr, dtype=np.int64)
    sites = np.asarray(target.sites, dtype=np.int64)
    deg = indptr[sites + 1] - indptr[sites]
    tptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    edge = np.repeat(indptr[sites] - tptr[:-1], deg) + np.arange(int(tptr[-1]), dtype=np.int64)
    return tptr, np.asarray(target.nbr, dtype=np.int64)[edge], np.asarray(target.Jn, dtype=np.float64)[edge]


def sweeps_shared(target, tptr, block_threads: int) -> tuple[int, int, int]:
    """``(term_cap, shared_x, bytes)`` of ``pgm_mrf_sweeps``' dynamic shared memory (at most ``_SHARED_BYTES``): room
    for the most field terms of a colour that has at most ``_TERM_CAP`` of them and two doubles a thread (the tree
    sums; neither when no colour is staged), then the replica's spins when they fit too (and ``_SHARED_SPINS``)."""
    colptr = np.asarray(target.colptr, dtype=np.int64)
    per_colour = tptr[colptr[1:]] - tptr[colptr[:-1]]
    limit = min(_TERM_CAP, (_SHARED_BYTES - 16 * int(block_threads)) // 8)
    term_cap = int(per_colour[per_colour <= limit].max(initial=0))
    fixed = 8 * term_cap + (16 * int(block_threads) if term_cap else 0)
    shared_x = int(_SHARED_SPINS and fixed + target.n_sites <= _SHARED_BYTES)
    return term_cap, shared_x, fixed + shared_x * target.n_sites


def sweep_cuda(
    x,
    target,
    b,
    key,
    rid,
    chain,
    sweep0,
    n_sweeps,
    method,
    xp,
    launch,
    ref_fields=None,
    leg=None,
    launch_sweeps=None,
    block_threads=None,
):
    """Host side of the GPU path: the target's arrays on the device, then either one launch of
    ``pgm_mrf_colour`` per colour of each sweep (``launch``), or, when ``launch_sweeps`` is given, one launch of
    ``pgm_mrf_sweeps`` for all of the call's sweeps (``block_threads`` threads per replica; default
    :func:`sweeps_block`). Both give the same bits. ``xp`` is the array module of ``x`` and
    ``launch(grid, block, args)`` runs a kernel (a CuPy ``RawKernel``; the tests pass NumPy and the same source
    compiled for the host CPU). ``ref_fields`` [G, n] and ``leg`` [R]: the reference of each replica (None: the
    target's own, :func:`pgmflow.tasks.tempering.mrf_target.reference_rows`). Returns int64 [R] on the host."""
    from pgmflow.tasks.tempering.mrf_target import reference_rows

    R, n = x.shape
    ref_h, leg_h = reference_rows(target, R, ref_fields, leg)
    work = x if x.flags.c_contiguous else xp.ascontiguousarray(x)
    if bool(((work != 1) & (work != -1)).any()):
        raise ValueError("spins must contain only -1 and +1")
    b_d = xp.asarray(b, dtype=xp.float64)
    h = xp.asarray(target.h, dtype=xp.float64)
    a = xp.asarray(ref_h, dtype=xp.float64)
    leg_d = xp.asarray(leg_h.astype(np.int32), dtype=xp.int32)
    indptr = xp.asarray(target.indptr, dtype=xp.int64)
    nbr = xp.asarray(target.nbr, dtype=xp.int64)
    Jn = xp.asarray(target.Jn, dtype=xp.float64)
    sites = xp.asarray(target.sites, dtype=xp.int64)
    rid32 = xp.asarray(np.asarray(rid, dtype=np.uint64).astype(np.uint32), dtype=xp.uint32)
    counts = xp.zeros(R, dtype=xp.uint64)
    colptr = np.asarray(target.colptr, dtype=np.int64)
    C = colptr.shape[0] - 1
    k0, k1 = np.uint32(int(key[0])), np.uint32(int(key[1]))
    chain32 = np.uint32(int(chain) & _MASK32)
    metro = np.int32(1 if method == "metropolis" else 0)
    batches = [(r0, min(R - r0, _CUDA_MAX_GRID_Y)) for r0 in range(0, R, _CUDA_MAX_GRID_Y)]
    if launch_sweeps is not None:
        colptr_d = xp.asarray(colptr, dtype=xp.int64)
        tptr_h, tnbr_h, tJ_h = colour_terms(target)
        bt = int(block_threads or sweeps_block(target))
        term_cap, shared_x, shared_bytes = sweeps_shared(target, tptr_h, bt)
        tptr = xp.asarray(tptr_h, dtype=xp.int64)
        tnbr = xp.asarray(tnbr_h, dtype=xp.int64)
        tJ = xp.asarray(tJ_h, dtype=xp.float64)
        t0 = np.uint64(int(sweep0) & 0xFFFFFFFFFFFFFFFF)
        for r0, nr in batches:
            launch_sweeps(
                (nr, 1),
                (bt, 1),
                (
                    work,
                    b_d,
                    h,
                    a,
                    leg_d,
                    indptr,
                    nbr,
                    Jn,
                    sites,
                    colptr_d,
                    tptr,
                    tnbr,
                    tJ,
                    rid32,
                    counts,
                    np.int32(r0),
                    np.int32(n),
                    np.int32(C),
                    t0,
                    np.int32(n_sweeps),
                    np.int32(term_cap),
                    np.int32(shared_x),
                    np.int64(_TREE_SLACK),
                    chain32,
                    k0,
                    k1,
                    metro,
                ),
                shared_mem=shared_bytes,
            )
    else:  # one launch per colour of each sweep
        block = (_CUDA_BLOCK, 1)
        for t in range(int(sweep0), int(sweep0) + int(n_sweeps)):
            for c in range(C):
                lo, hi = int(colptr[c]), int(colptr[c + 1])
                gx = ((hi - lo + 3) // 4 + _CUDA_BLOCK - 1) // _CUDA_BLOCK
                ctr1 = np.uint32((t * C + c) & _MASK32)
                for r0, nr in batches:
                    launch(
                        (gx, nr),
                        block,
                        (
                            work,
                            b_d,
                            h,
                            a,
                            leg_d,
                            indptr,
                            nbr,
                            Jn,
                            sites,
                            rid32,
                            counts,
                            np.int32(r0),
                            np.int32(n),
                            np.int32(lo),
                            np.int32(hi),
                            ctr1,
                            chain32,
                            k0,
                            k1,
                            metro,
                        ),
                    )
    if work is not x:
        x[...] = work
    return backend.to_numpy(counts).astype(np.int64)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device_id: int) -> int:
    """The GPU's multiprocessor count (the query ``backend.gpu_info`` makes)."""
    return int(backend.cupy().cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"])


def auto_kernel(target, R: int, multiprocessors: int) -> str:
    """The kernel ``backend=cupy`` runs: ``pgm_mrf_sweeps`` saves a launch per colour of each sweep, but it gives
    each replica one block, so with fewer replicas than the GPU has multiprocessors and colours of more groups
    than a block has threads, it leaves multiprocessors idle while ``pgm_mrf_colour`` spreads each colour over all
    of them. Measured on an H200 (132 multiprocessors; benchmarks/results/tempering_mrf-gpu-nvidia-h200-sweeps.md):
    4-regular graph of 10,000 nodes (5 colours of ~500 groups), one call of 20 sweeps: per colour 1.90 and 5.93
    updates/ns at 16 and 64 replicas against 1.44 and 5.75 in one launch; at 256 and 2048 replicas 12.0 and 15.5
    against 19.8 and 29.2; dense 100-node network (100 colours of one node), 64-8192 replicas: one launch 1.7-4x
    faster."""
    return "colour" if R < multiprocessors and _largest_colour_groups(target) > sweeps_block(target) else "sweeps"


def sweep_cupy(x, target, b, key, rid, chain, sweep0, n_sweeps, method, ref_fields=None, leg=None, kernel="auto"):
    """GPU path of :func:`pgmflow.tasks.tempering.mrf_kernels.mrf_sweep` (``x`` a CuPy array). ``kernel``:
    ``colour`` (one launch per colour of each sweep), ``sweeps`` (one launch per call) or ``auto``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    cp = backend.cupy()
    with cp.cuda.Device(x.device.id):
        if kernel == "auto":
            kernel = auto_kernel(target, x.shape[0], _multiprocessors(int(x.device.id)))
        sweeps = _cupy_sweeps_kernel() if kernel == "sweeps" else None
        return sweep_cuda(
            x, target, b, key, rid, chain, sweep0, n_sweeps, method, cp, _cupy_kernel(), ref_fields, leg, sweeps
        )
