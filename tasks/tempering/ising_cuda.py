"""The GPU (CuPy ``RawKernel``) path of the Ising checkerboard sweep: the CUDA source, which
implements the spec of :mod:`pgmflow.tasks.tempering.ising_kernels` bit for bit, and its host side.

Two kernels, the same bits: ``pgm_ising_sites`` (a thread per site; what ``backend=cupy`` runs) and
``pgm_ising_colour`` (a thread per word of 64 sites, which it updates one after another: on an H200 it ran at
14-20 flips/ns, 32K threads for 4 lattices of 1024x1024; ``benchmarks/tempering.py --gpu-only`` times both).

The tests compile the same CUDA source as C++ for the host CPU and drive :func:`_sweep_cuda` with
NumPy arrays, so this code runs without a GPU too.
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

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Philox4x32-10 (Random123); c[4] in: counter, out: the four random words. */
__device__ __forceinline__ void pgm_philox4x32_10(pgm_u32 c[4], pgm_u32 k0, pgm_u32 k1)
{
    #pragma unroll
    for (int rnd = 0; rnd < 10; ++rnd) {
        if (rnd > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        const pgm_u32 hi0 = __umulhi(PHILOX_M0, c[0]);
        const pgm_u32 lo0 = PHILOX_M0 * c[0];
        const pgm_u32 hi1 = __umulhi(PHILOX_M1, c[2]);
        const pgm_u32 lo1 = PHILOX_M1 * c[2];
        const pgm_u32 n0 = hi1 ^ c[1] ^ k0;
        const pgm_u32 n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

/* One colour of one checkerboard sweep. One thread per (replica r, row i, word w of 64 sites of
   this colour in row i): grid.y runs over replicas r0 .. r0 + gridDim.y - 1, grid.x * block.x
   over the L * W (row, word) pairs of a replica, W = (L/2 + 63) / 64.
   spins  int8  [R, L, L]  (in place)
   bonds_h, bonds_v int8 [L, L]
   thr    int64 [R, 10]    (index 2n + (s+1)/2)
   rid32  uint32 [R]       (replica_id & 0xffffffff)
   counts uint32 [R, L, W] (per-thread count of changed spins, accumulated over launches)

   The uniform u of site q = 64 w + b is the 32-bit integer whose bit 31 - k is bit b of plane k,
   plane k being words 2 (k & 1) (lanes 0..31) and 2 (k & 1) + 1 (lanes 32..63) of the Philox block
   with counter ((i W + w) 16 + (k >> 1), ctr1, rid32[r], chain32); the new spin is +1 iff u < thr.
   The first four blocks give the eight top bits of every u, which decide a site unless they equal
   its threshold's; the other blocks are drawn only when some site of the word needs them. */
__device__ __forceinline__ void pgm_block(pgm_u32 f, pgm_u32 g, pgm_u32 ctr1, pgm_u32 rid, pgm_u32 chain32,
                                          pgm_u32 key0, pgm_u32 key1, pgm_u64* pa, pgm_u64* pb)
{
    pgm_u32 u[4];
    u[0] = f * 16u + g;
    u[1] = ctr1;
    u[2] = rid;
    u[3] = chain32;
    pgm_philox4x32_10(u, key0, key1);
    *pa = (pgm_u64)u[0] | ((pgm_u64)u[1] << 32);
    *pb = (pgm_u64)u[2] | ((pgm_u64)u[3] << 32);
}

/* The threshold of site j of a row: thr[2n + (s+1)/2] with n the satisfied bonds (as a local field
   f = 2n - 4 of the bond-weighted neighbour spins). Recomputed for the rare undecided sites rather
   than kept per lane (64 int64 per thread would live in local memory). */
__device__ __forceinline__ pgm_i64 pgm_site_threshold(const signed char* row, const signed char* rowm,
                                                      const signed char* rowp, const signed char* bh,
                                                      const signed char* bvd, const signed char* bvu,
                                                      const pgm_i64* T, const int L, const int j)
{
    const int jm = (j == 0) ? L - 1 : j - 1;
    const int jp = (j == L - 1) ? 0 : j + 1;
    const int s = row[j];
    const int f = bh[j] * row[jp] + bh[jm] * row[jm] + bvd[j] * rowp[j] + bvu[j] * rowm[j];
    return T[f + 4 + ((s + 1) >> 1)];
}

extern "C" __global__ void pgm_ising_colour(
    signed char* __restrict__ spins,
    const signed char* __restrict__ bonds_h,
    const signed char* __restrict__ bonds_v,
    const pgm_i64* __restrict__ thr,
    const pgm_u32* __restrict__ rid32,
    pgm_u32* __restrict__ counts,
    const int r0, const int L, const int colour,
    const pgm_u32 ctr1, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1)
{
    const int H = L >> 1;
    const int W = (H + 63) >> 6;
    const int tx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (tx >= L * W) return;
    const int r = r0 + (int)blockIdx.y;
    const int w = tx % W;
    const int i = tx / W;
    const pgm_i64 tid = (pgm_i64)r * (pgm_i64)(L * W) + tx;
    const pgm_u32 rid = rid32[r];

    pgm_u64 pl[8];
    for (int g = 0; g < 4; ++g)
        pgm_block((pgm_u32)tx, (pgm_u32)g, ctr1, rid, chain32, key0, key1, &pl[2 * g], &pl[2 * g + 1]);

    signed char* S = spins + (pgm_i64)r * L * L;
    const pgm_i64* T = thr + (pgm_i64)r * 10;
    const int p = (i + colour) & 1;
    const int im = (i == 0) ? L - 1 : i - 1;
    const int ip = (i == L - 1) ? 0 : i + 1;
    const signed char* row = S + (pgm_i64)i * L;
    const signed char* rowm = S + (pgm_i64)im * L;
    const signed char* rowp = S + (pgm_i64)ip * L;
    const signed char* bh = bonds_h + (pgm_i64)i * L;
    const signed char* bvd = bonds_v + (pgm_i64)i * L;
    const signed char* bvu = bonds_v + (pgm_i64)im * L;

    const int nl = (H - 64 * w < 64) ? H - 64 * w : 64;
    pgm_u64 plus = 0, und = 0;
    for (int b = 0; b < nl; ++b) {
        const pgm_i64 t = pgm_site_threshold(row, rowm, rowp, bh, bvd, bvu, T, L, 2 * (64 * w + b) + p);
        pgm_u32 hi = 0;  /* the top 8 bits of u */
        for (int k = 0; k < 8; ++k) hi = (hi << 1) | (pgm_u32)((pl[k] >> b) & 1ull);
        const pgm_i64 th = t >> 24;  /* 256 for t = 2**32 */
        if ((pgm_i64)hi < th) plus |= 1ull << b;
        else if ((pgm_i64)hi == th) und |= 1ull << b;
    }
    if (und) {  /* rare: the remaining 24 bits of u for the undecided sites */
        pgm_u64 lo[24];
        for (int g = 4; g < 16; ++g)
            pgm_block((pgm_u32)tx, (pgm_u32)g, ctr1, rid, chain32, key0, key1, &lo[2 * g - 8], &lo[2 * g - 7]);
        for (int b = 0; b < nl; ++b) {
            if ((und >> b) & 1ull) {
                pgm_u32 u = 0;
                for (int k = 0; k < 8; ++k) u = (u << 1) | (pgm_u32)((pl[k] >> b) & 1ull);
                for (int k = 0; k < 24; ++k) u = (u << 1) | (pgm_u32)((lo[k] >> b) & 1ull);
                if ((pgm_i64)u < pgm_site_threshold(row, rowm, rowp, bh, bvd, bvu, T, L, 2 * (64 * w + b) + p))
                    plus |= 1ull << b;
            }
        }
    }
    pgm_u32 cnt = 0;
    for (int b = 0; b < nl; ++b) {
        const int j = 2 * (64 * w + b) + p;
        const int ns = ((plus >> b) & 1ull) ? 1 : -1;
        cnt += (ns != row[j]);
        S[(pgm_i64)i * L + j] = (signed char)ns;
    }
    if (cnt) counts[tid] += cnt;
}

/* The same colour update with one thread per site (pgm_ising_colour has one per word of 64 sites, whose sites it
   updates one after another): a block of 64 WB threads is WB words (word tx = blockIdx.x WB + threadIdx.x / 64,
   site b = threadIdx.x % 64 of it). The word's 16 Philox blocks (all 32 planes of its u's) are drawn by 16 of its
   64 threads into shared memory, while the others wait at the barrier (a warp takes as long for 4 of them as for
   16, so drawing the rare low planes too costs nothing); then each thread decides its own site as
   pgm_ising_colour does (the top 8 bits first, all 32 only where they tie with the threshold's), so the bits are
   the same. Neighbouring threads read neighbouring bytes of the rows. counts uint32 [R, gridDim.x]: changed
   spins per block, accumulated over launches. WB <= PGM_ISING_WB_MAX. */
#define PGM_ISING_WB_MAX 16
extern "C" __global__ void pgm_ising_sites(
    signed char* __restrict__ spins,
    const signed char* __restrict__ bonds_h,
    const signed char* __restrict__ bonds_v,
    const pgm_i64* __restrict__ thr,
    const pgm_u32* __restrict__ rid32,
    pgm_u32* __restrict__ counts,
    const int r0, const int L, const int colour,
    const pgm_u32 ctr1, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1)
{
    __shared__ pgm_u64 planes[PGM_ISING_WB_MAX][32];
    const int H = L >> 1;
    const int W = (H + 63) >> 6;
    const int slot = (int)threadIdx.x >> 6;
    const int b = (int)threadIdx.x & 63;
    const int tx = (int)blockIdx.x * ((int)blockDim.x >> 6) + slot;
    const int r = r0 + (int)blockIdx.y;
    const int live = tx < L * W;
    if (live && b < 16)
        pgm_block((pgm_u32)tx, (pgm_u32)b, ctr1, rid32[r], chain32, key0, key1, &planes[slot][2 * b],
                  &planes[slot][2 * b + 1]);
    __syncthreads();
    int changed = 0;
    const int w = live ? tx % W : 0;
    const int nl = (H - 64 * w < 64) ? H - 64 * w : 64;
    if (live && b < nl) {
        const int i = tx / W;
        signed char* S = spins + (pgm_i64)r * L * L;
        const int im = (i == 0) ? L - 1 : i - 1;
        const int ip = (i == L - 1) ? 0 : i + 1;
        const signed char* row = S + (pgm_i64)i * L;
        const int j = 2 * (64 * w + b) + ((i + colour) & 1);
        const pgm_i64 t = pgm_site_threshold(row, S + (pgm_i64)im * L, S + (pgm_i64)ip * L, bonds_h + (pgm_i64)i * L,
                                             bonds_v + (pgm_i64)i * L, bonds_v + (pgm_i64)im * L,
                                             thr + (pgm_i64)r * 10, L, j);
        const pgm_u64* pl = planes[slot];
        pgm_u32 hi = 0;  /* the top 8 bits of u */
        for (int k = 0; k < 8; ++k) hi = (hi << 1) | (pgm_u32)((pl[k] >> b) & 1ull);
        const pgm_i64 th = t >> 24;  /* 256 for t = 2**32 */
        int plus = (pgm_i64)hi < th;
        if ((pgm_i64)hi == th) {  /* rare: the other 24 bits */
            pgm_u32 u = hi;
            for (int k = 8; k < 32; ++k) u = (u << 1) | (pgm_u32)((pl[k] >> b) & 1ull);
            plus = (pgm_i64)u < t;
        }
        const int s = row[j];
        const int ns = plus ? 1 : -1;
        changed = ns != s;
        if (changed) S[(pgm_i64)i * L + j] = (signed char)ns;
    }
    const int cnt = __syncthreads_count(changed);
    if (threadIdx.x == 0 && cnt) counts[(pgm_i64)r * gridDim.x + blockIdx.x] += (pgm_u32)cnt;
}
"""

_CUDA_KERNEL_NAME = "pgm_ising_colour"
_CUDA_SITES_NAME = "pgm_ising_sites"
_CUDA_BLOCK = 256
_SITES_WORDS = 4  # words of 64 sites per block of pgm_ising_sites (256 threads; at most 16)
KERNELS = ("sites", "words")
_CUDA_MAX_GRID_Y = 65535  # replicas per launch (CUDA's limit on gridDim.y)
# counts are uint32 and grow by at most 64 per launch (two per sweep); flush them to int64 well before
# overflow
_CUDA_MAX_SWEEPS_PER_FLUSH = 1 << 24


@functools.lru_cache(maxsize=None)
def _cupy_kernel():
    """Compile (lazily, once per process; CuPy caches the binary on disk) the kernel with a thread per word."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_KERNEL_NAME, options=("-std=c++11",))


@functools.lru_cache(maxsize=None)
def _cupy_sites_kernel():
    """Compile (lazily, once per process) the kernel with a thread per site."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_SITES_NAME, options=("-std=c++11",))


def _sweep_cuda(
    spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps, xp, launch, launch_sites=None, words=None
):
    """Host side of the GPU path: prepare device arrays, launch ``pgm_ising_colour`` (``launch``) or, when
    ``launch_sites`` is given, ``pgm_ising_sites`` (``words`` words of 64 sites per block, default
    ``_SITES_WORDS``) once per colour of each sweep, reduce the change counts. Both give the same bits.

    ``xp`` is the array module of ``spins`` and ``launch(grid, block, args)`` runs the kernel
    (a CuPy ``RawKernel``; the tests pass NumPy and the same CUDA source compiled for the host
    CPU, so this code is exercised without a GPU too). Returns int64 [R] on the host.
    """
    R, L, _ = spins.shape
    W = (L // 2 + 63) // 64
    work = spins if spins.flags.c_contiguous else xp.ascontiguousarray(spins)
    if bool(((work != 1) & (work != -1)).any()):
        raise ValueError("spins must contain only -1 and +1")
    bh = xp.ascontiguousarray(xp.asarray(bonds_h, dtype=xp.int8))
    bv = xp.ascontiguousarray(xp.asarray(bonds_v, dtype=xp.int8))
    if bool((((bh != 1) & (bh != -1)) | ((bv != 1) & (bv != -1))).any()):
        raise ValueError("bonds_h and bonds_v must contain only -1 and +1")
    thr_d = xp.ascontiguousarray(xp.asarray(thr, dtype=xp.int64).reshape(R, 10))
    rid32 = xp.asarray((np.asarray(backend.to_numpy(replica_ids), dtype=np.int64) & _MASK32).astype(np.uint32))
    if launch_sites is None:
        counts = xp.zeros(R * L * W, dtype=xp.uint32)  # [R, L, W] per-thread counts
        block = (_CUDA_BLOCK, 1)
        gx = (L * W + _CUDA_BLOCK - 1) // _CUDA_BLOCK
        flush = _CUDA_MAX_SWEEPS_PER_FLUSH
    else:
        wb = int(words or _SITES_WORDS)
        if not 1 <= wb <= 16:
            raise ValueError(f"words per block must be in 1..16, got {wb}")
        block = (64 * wb, 1)
        gx = (L * W + wb - 1) // wb
        counts = xp.zeros(R * gx, dtype=xp.uint32)  # [R, gx] per-block counts: at most 128 wb a sweep
        flush = min(_CUDA_MAX_SWEEPS_PER_FLUSH, (1 << 31) // (128 * wb))
        launch = launch_sites
    changed = np.zeros(R, dtype=np.int64)
    batches = [(r0, min(R - r0, _CUDA_MAX_GRID_Y)) for r0 in range(0, R, _CUDA_MAX_GRID_Y)]
    k0, k1 = np.uint32(int(key[0])), np.uint32(int(key[1]))
    chain32 = np.uint32(int(chain) & _MASK32)
    pending = 0
    for t_local in range(n_sweeps):
        t = int(sweep0) + t_local
        for c in (0, 1):
            ctr1 = np.uint32((2 * t + c) & _MASK32)
            for r0, nr in batches:
                launch(
                    (gx, nr),
                    block,
                    (work, bh, bv, thr_d, rid32, counts, np.int32(r0), np.int32(L), np.int32(c), ctr1, chain32, k0, k1),
                )
        pending += 1
        if pending == flush:
            changed += backend.to_numpy(counts.reshape(R, -1).sum(axis=1, dtype=xp.int64))
            counts.fill(0)
            pending = 0
    changed += backend.to_numpy(counts.reshape(R, -1).sum(axis=1, dtype=xp.int64))
    if work is not spins:
        spins[...] = work
    return changed


def _sweep_cupy(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps, kernel="sites"):
    """GPU path of :func:`ising_sweep` (``spins`` a CuPy array); ``kernel``: ``sites`` (a thread per site, the
    default) or ``words`` (a thread per word of 64 sites)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    cp = backend.cupy()
    with cp.cuda.Device(spins.device.id):
        sites = _cupy_sites_kernel() if kernel == "sites" else None
        return _sweep_cuda(
            spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps, cp, _cupy_kernel(), sites
        )
