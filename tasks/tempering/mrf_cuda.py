"""The GPU (CuPy ``RawKernel``) path of the MRF per-colour sweep: the CUDA source, which implements the spec
of :mod:`pgmflow.tasks.tempering.mrf_kernels` bit for bit, and its host side.

One thread per (replica, group of four nodes of the colour being updated); one launch per colour of each
sweep. Compiled with ``--fmad=false`` (no fused multiply-add), so the thresholds are the numba kernel's.
The tests compile the same source as C++ for the host CPU and drive :func:`sweep_cuda` with NumPy arrays.
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

/* One colour of one sweep: thread (blockIdx.y + r0, g) updates the nodes at positions 4g .. 4g+3 of the
   colour, sites[lo + 4g + w] with Philox word w of counter (g, ctr1, rid32[r], chain32).
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
    pgm_u32 u[4];
    u[0] = (pgm_u32)g; u[1] = ctr1; u[2] = rid32[r]; u[3] = chain32;
    pgm_mrf_philox(u, key0, key1);
    signed char* X = x + (pgm_i64)r * n;
    const double br = b[r];
    const double* ar = a + (pgm_i64)leg[r] * n;
    pgm_u64 cnt = 0;
    for (int w = 0; w < 4; ++w) {
        const int k = lo + 4 * g + w;
        if (k >= hi) break;
        const pgm_i64 i = sites[k];
        double f = h[i];
        for (pgm_i64 e = indptr[i]; e < indptr[i + 1]; ++e) f += Jn[e] * (double)X[nbr[e]];
        const double z = br * f + (1.0 - br) * ar[i];
        const int s = X[i];
        const int ns = ((pgm_i64)u[w] < pgm_mrf_threshold(z, (double)s, br, metropolis)) ? 1 : -1;
        if (ns != s) { X[i] = (signed char)ns; ++cnt; }
    }
    if (cnt) atomicAdd(&counts[r], cnt);
}
"""

_CUDA_KERNEL_NAME = "pgm_mrf_colour"
_CUDA_BLOCK = 128
_CUDA_MAX_GRID_Y = 65535  # replicas per launch (CUDA's limit on gridDim.y)


@functools.lru_cache(maxsize=None)
def _cupy_kernel():
    """Compile (lazily, once per process; CuPy caches the binary on disk) the GPU kernel."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_KERNEL_NAME, options=("-std=c++11", "--fmad=false"))


def sweep_cuda(x, target, b, key, rid, chain, sweep0, n_sweeps, method, xp, launch, ref_fields=None, leg=None):
    """Host side of the GPU path: the target's arrays on the device, one launch of ``pgm_mrf_colour`` per
    colour of each sweep, the change counts back. ``xp`` is the array module of ``x`` and
    ``launch(grid, block, args)`` runs the kernel (a CuPy ``RawKernel``; the tests pass NumPy and the same
    source compiled for the host CPU). ``ref_fields`` [G, n] and ``leg`` [R]: the reference of each replica
    (None: the target's own, :func:`pgmflow.tasks.tempering.mrf_target.reference_rows`). Returns int64 [R]
    on the host."""
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


def sweep_cupy(x, target, b, key, rid, chain, sweep0, n_sweeps, method, ref_fields=None, leg=None):
    """GPU path of :func:`pgmflow.tasks.tempering.mrf_kernels.mrf_sweep` (``x`` a CuPy array)."""
    cp = backend.cupy()
    with cp.cuda.Device(x.device.id):
        return sweep_cuda(x, target, b, key, rid, chain, sweep0, n_sweeps, method, cp, _cupy_kernel(), ref_fields, leg)
