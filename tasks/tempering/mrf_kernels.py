"""Per-colour sweeps of a pairwise binary MRF on any graph (heat bath or Metropolis), CPU and GPU.

The explorer kernel of parallel tempering on ``model=mrf`` targets (``pgmflow.tasks.tempering.mrf_target``):
``R`` replicas of one graph, each at its own level ``b``, swept in one call. A numba kernel (CPU) and a CUDA
source (GPU, :mod:`~pgmflow.tasks.tempering.mrf_cuda`) sit behind the one function :func:`mrf_sweep` and
produce the same bits: every random number comes from Philox4x32-10 keyed by the update's identity, and the
acceptance thresholds are computed from the local field with plain IEEE operations only.

The update (the spec both kernels implement)
--------------------------------------------
Sweep ``t`` updates colour ``c = 0, 1, ..., C - 1`` in turn. Colour ``c``'s nodes ``sites[colptr[c]:...]``
(ascending) are taken in groups of four: group ``g`` (its nodes at positions ``4 g .. 4 g + 3`` of the
colour) draws one Philox block

    philox4x32_10(counter = (g, (t * C + c) mod 2**32, replica_id mod 2**32, chain mod 2**32), key)

and the node at position ``4 g + w`` takes its output word ``w`` as its uniform ``u`` (a uint32). Its local
field, summed in the CSR order of its neighbours from ``h_i``, is

    f = h_i + sum_k Jn[k] * x[nbr[k]],    z = b * f + (1 - b) * a_i        (a: the reference fields)

where ``a`` is the replica's reference: ``ref_fields[leg[r]]`` when a per-replica reference is given (the two
legs of ``tempering.reference=stabilized``: uniform spins and the mean-field/fitted product), else the
target's own ``ref_field`` (one reference: a select between two loaded values, so the bits are the same),

and its new spin is ``+1`` iff ``u < thr`` with the integer threshold ``thr`` in ``[0, 2**32]``:

* heat bath (and every method at ``b == 0``: an exact draw from the reference):
  ``p = 1 / (1 + e)`` if ``z >= 0`` else ``e / (1 + e)``, ``e = dexp(-2 |z|)``; ``thr = rint(p * 2**32)``;
* Metropolis: ``acc = dexp(min(0, -2 s z))`` for the current spin ``s``; ``thr = 2**32 - rint(acc * 2**32)``
  when ``s = +1`` (stay up unless flipped) and ``rint(acc * 2**32)`` when ``s = -1``.

``dexp(x)`` (``x <= 0``) is ``exp`` by Cody and Waite's reduction and a degree-13 Taylor polynomial in
Horner form (the arithmetic of ``pgmflow.tasks.fastexp``) times the exact power of two, and 0 below
-40 (there ``exp(x) < 4.3e-18``: every threshold is then 0 or ``2**32`` whatever its value, since
``1 + e == 1`` and ``e * 2**32 < 0.5``): only correctly rounded IEEE operations, and no fused
multiply-add (numba without fast-math; the CUDA source is compiled with ``--fmad=false``), so both kernels
compute the same thresholds bit for bit.

How the CPU kernel computes it
------------------------------
Replicas are independent, so the numba kernel sweeps them in blocks (``_sweep_block``, at most
``BLOCK_MAX`` replicas, the replicas shared evenly between the threads) with the block's spins transposed
to ``[n, lanes]``: every step of a node update (the Philox blocks, the local field's neighbour sum, the
threshold, the update) is a loop over the block's replicas as vector lanes, without a branch that depends on
data (``_thresholds`` is ``_threshold`` written with selects; numba's ``error_model="numpy"`` drops the
division's zero check, which would otherwise stop the loop from vectorising). Each lane's arithmetic is the
spec's, in the spec's order, so a replica's bits do not depend on the block it is swept in. The scalar
``_threshold`` stays as the spec the lanes are tested against.

The NumPy peer :func:`numpy_colour_sweep` (heat bath, the obvious way) is what ``benchmarks/tempering_mrf.py``
measures the kernel against.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from pgmflow.tasks import backend, philox
from pgmflow.tasks.tempering.mrf_target import reference_rows

__all__ = ["METHODS", "mrf_sweep", "mrf_statistics", "numpy_colour_sweep", "reference_rows"]

METHODS = ("heatbath", "metropolis")
_MASK32 = 0xFFFFFFFF
_TWO32 = 4294967296.0
PARALLEL_MIN_WORK = 1 << 20  # node and neighbour visits of one call above which threads run over replicas
BLOCK_MAX = 64  # replicas swept together as vector lanes (see _sweep_block); more lanes hide more latency
BLOCK_MIN = 8  # ... and at least this many (the lanes come in groups of 8): fewer threads rather than idle lanes

# dexp's constants (see pgmflow.tasks.fastexp); module globals, frozen into the compiled code
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0
_C = (
    1.0,
    1.0,
    0.5,
    0.16666666666666666,
    0.041666666666666664,
    0.008333333333333333,
    0.001388888888888889,
    0.0001984126984126984,
    2.48015873015873e-05,
    2.7557319223985893e-06,
    2.755731922398589e-07,
    2.505210838544172e-08,
    2.08767569878681e-09,
    1.6059043836821613e-10,
)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = _C

# numba kernels: plain module-level functions; _kernels() compiles them and binds these names
prange = range
_philox = philox._philox4x32


@backend.kernel(cache=True, nogil=True, inline="always")
def _dexp(x):
    """exp(x) for -40 <= x <= 0 from IEEE + - * only (see the module docstring); 0 below -40. Written without a
    branch on data (the argument clamped to -40 so that the power of two stays normal, 0 selected below), so
    that it vectorises inside a loop over lanes."""
    xc = x if x >= -40.0 else -40.0
    kf = xc * _LOG2E + _SHIFT
    k = kf - _SHIFT
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    p = _C13
    p = p * r + _C12
    p = p * r + _C11
    p = p * r + _C10
    p = p * r + _C9
    p = p * r + _C8
    p = p * r + _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + _C1
    p = p * r + _C0
    e = p * np.int64((np.int64(k) + 1023) << 52).view(np.float64)  # p * 2**k exactly: k in [-58, 0]
    return e if x >= -40.0 else 0.0


@backend.kernel(cache=True, nogil=True, inline="always")
def _threshold(z, s, b, metropolis):
    """The integer threshold of one update (int64 in [0, 2**32]); see the module docstring."""
    if metropolis and b != 0.0:
        d = -2.0 * s * z
        acc = _dexp(d if d < 0.0 else 0.0)
        t = np.int64(np.rint(acc * 4294967296.0))
        return np.int64(4294967296) - t if s > 0 else t
    az = z if z >= 0.0 else -z
    e = _dexp(-2.0 * az)
    p = 1.0 / (1.0 + e) if z >= 0.0 else e / (1.0 + e)
    return np.int64(np.rint(p * 4294967296.0))


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _thresholds(z, sp, bb, n_lanes, metro, thr):
    """thr[l] = _threshold(z[l], sp[l], bb[l], metro) for lanes l < n_lanes, without a data-dependent branch
    (the selects below compute exactly what ``_threshold`` computes, with one ``_dexp`` per lane and one division
    whose numerator is selected), so that the lanes vectorise."""
    for q in range(n_lanes):
        zq = z[q]
        s = np.float64(sp[q])
        mq = metro & (bb[q] != 0.0)
        az = zq if zq >= 0.0 else -zq
        d = -2.0 * s * zq
        d = d if d < 0.0 else 0.0
        arg = d if mq else -2.0 * az
        e = _dexp(arg)
        hb = (1.0 if zq >= 0.0 else e) / (1.0 + e)
        t = np.int64(np.rint((e if mq else hb) * 4294967296.0))
        t = (np.int64(4294967296) - t if s > 0.0 else t) if mq else t
        thr[q] = t


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _sweep_block(
    x, r0, r1, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key0, key1, rid, chain32, sweep0, n_sweeps, metro, out
):
    """n_sweeps per-colour sweeps of replicas r0 .. r1 - 1 of x, in place; out[r] += spins changed.

    The block's spins are transposed into xt [n, Rb] (replicas contiguous), so that every per-node step (the
    local field's sum over neighbours, the thresholds, the Philox blocks and the updates) is a loop over the
    block's replicas without branches that depend on data: independent lanes the compiler vectorises and the
    CPU overlaps. Each replica's arithmetic is the spec's, in the spec's order, so the bits are those of one
    replica swept alone. a: reference fields [G, n] (G = 1 or 2); leg: each replica's row of a (int64 [R])."""
    n = x.shape[1]
    Rb = r1 - r0
    Rp = (Rb + 7) // 8 * 8  # lanes: the block padded to whole groups of 8 (padding lanes are swept, never read)
    C = colptr.shape[0] - 1
    xt = np.ones((n, Rp), dtype=np.int8)
    for q in range(Rb):
        for i in range(n):
            xt[i, q] = x[r0 + q, i]
    bb = np.ones(Rp)
    ridb = np.zeros(Rp, dtype=np.uint64)
    legb = np.zeros(Rp, dtype=np.int64)
    for q in range(Rb):
        bb[q] = b[r0 + q]
        ridb[q] = rid[r0 + q]
        legb[q] = leg[r0 + q]
    G1 = a.shape[0] - 1
    cb = 1.0 - bb
    f = np.empty(Rp)
    z = np.empty(Rp)
    sp = np.empty(Rp, dtype=np.int8)
    thr = np.empty(Rp, dtype=np.int64)
    u = np.empty((4, Rp), dtype=np.int64)
    cnt = np.zeros(Rp, dtype=np.int64)
    for t in range(sweep0, sweep0 + n_sweeps):
        for c in range(C):
            ctr1 = np.uint64((t * C + c) & 0xFFFFFFFF)
            lo = colptr[c]
            hi = colptr[c + 1]
            for g in range((hi - lo + 3) // 4):
                for q in range(Rp):
                    w0, w1, w2, w3 = _philox(np.uint64(g), ctr1, ridb[q], chain32, key0, key1)
                    u[0, q] = np.int64(w0)
                    u[1, q] = np.int64(w1)
                    u[2, q] = np.int64(w2)
                    u[3, q] = np.int64(w3)
                for w in range(min(4, hi - lo - 4 * g)):
                    i = sites[lo + 4 * g + w]
                    hi_ = h[i]
                    for q in range(Rp):
                        f[q] = hi_
                    for e in range(indptr[i], indptr[i + 1]):  # each lane summed in the spec's (CSR) order
                        j = nbr[e]
                        Je = Jn[e]
                        for q in range(Rp):
                            f[q] += Je * np.float64(xt[j, q])
                    a0 = a[0, i]
                    a1 = a[G1, i]
                    for q in range(Rp):
                        ai = a1 if legb[q] != 0 else a0  # the replica's reference (a select: vectorises)
                        z[q] = bb[q] * f[q] + cb[q] * ai
                        sp[q] = xt[i, q]
                    _thresholds(z, sp, bb, Rp, metro, thr)
                    for q in range(Rp):
                        s = sp[q]
                        ns = np.int8(1) if u[w, q] < thr[q] else np.int8(-1)
                        cnt[q] += ns != s
                        xt[i, q] = ns
    for q in range(Rb):
        out[r0 + q] += cnt[q]
        for i in range(n):
            x[r0 + q, i] = xt[i, q]


@backend.kernel(cache=True, nogil=True, parallel=True, error_model="numpy")
def _sweeps(
    x, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key0, key1, rid32, chain32, sweep0, n_sweeps, metro, out, block
):
    """_sweep_block over blocks of ``block`` replicas, threads over blocks; out[r] += spins changed."""
    R = x.shape[0]
    nb = (R + block - 1) // block
    for ib in prange(nb):
        r0 = ib * block
        r1 = min(R, r0 + block)
        _sweep_block(
            x,
            r0,
            r1,
            b,
            h,
            a,
            leg,
            indptr,
            nbr,
            Jn,
            colptr,
            sites,
            key0,
            key1,
            rid32,
            chain32,
            sweep0,
            n_sweeps,
            metro,
            out,
        )


@backend.kernel(cache=True, nogil=True, error_model="numpy")
def _sweeps_serial(
    x, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key0, key1, rid32, chain32, sweep0, n_sweeps, metro, out, block
):
    """_sweeps on the calling thread (small problems: no thread wake-ups)."""
    R = x.shape[0]
    for r0 in range(0, R, block):
        _sweep_block(
            x,
            r0,
            min(R, r0 + block),
            b,
            h,
            a,
            leg,
            indptr,
            nbr,
            Jn,
            colptr,
            sites,
            key0,
            key1,
            rid32,
            chain32,
            sweep0,
            n_sweeps,
            metro,
            out,
        )


@backend.kernel(cache=True, nogil=True)
def _statistics(x, h, a, ea, eb, J, out):
    """out[r] = (h.x, sum_e J_e x_i x_j, a.x, sum_i x_i) of replica r, summed in index order."""
    R, n = x.shape
    for r in range(R):
        hx = 0.0
        ax = 0.0
        m = 0.0
        for i in range(n):
            xi = np.float64(x[r, i])
            hx += h[i] * xi
            ax += a[i] * xi
            m += xi
        jx = 0.0
        for e in range(J.shape[0]):
            jx += J[e] * np.float64(x[r, ea[e]] * x[r, eb[e]])
        out[r, 0] = hx
        out[r, 1] = jx
        out[r, 2] = ax
        out[r, 3] = m


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes)."""
    return backend.compile_kernels(
        sys.modules[__name__], bind={"prange": backend.numba().prange, "_philox": philox.numba_philox4x32()}
    )


def _check(x, b, key, replica_ids, sweep0, n_sweeps, method, n):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if x.ndim != 2 or x.shape[1] != n or x.dtype != np.int8:
        raise ValueError(f"spins must be int8 [R, {n}], got {x.dtype} {x.shape}")
    R = x.shape[0]
    b = np.ascontiguousarray(backend.to_numpy(b), dtype=np.float64)
    if b.shape != (R,) or not np.all((b >= 0) & (b <= 1)):
        raise ValueError(f"b must be [R] = [{R}] values in [0, 1], got {b}")
    key = np.asarray(backend.to_numpy(key))
    if key.shape != (2,) or key.dtype.kind not in "iu" or key.min() < 0 or key.max() > _MASK32:
        raise ValueError(f"key must be two 32-bit words, got {key!r}")
    rid = np.asarray(backend.to_numpy(replica_ids))
    if rid.shape != (R,) or rid.dtype.kind not in "iu":
        raise ValueError(f"replica_ids must be an integer array [R] = [{R}], got {rid.shape}")
    if int(sweep0) < 0 or int(n_sweeps) < 0:
        raise ValueError(f"sweep0 and n_sweeps must be >= 0, got {sweep0}, {n_sweeps}")
    return b, key, (rid.astype(np.int64) & _MASK32).astype(np.uint64)


def _block_size(R: int, threads: int) -> int:
    """Replicas per block: the replicas shared evenly between the threads, at least BLOCK_MIN (or all R) and at
    most BLOCK_MAX per block (the block's transposed spins and buffers stay in cache). Results do not depend on
    it."""
    per = -(-R // max(1, threads))
    return max(1, min(BLOCK_MAX, max(per, min(BLOCK_MIN, R))))


def mrf_sweep(
    x,
    target,
    b,
    key,
    replica_ids,
    chain: int,
    sweep0: int,
    n_sweeps: int,
    method: str,
    ref_fields=None,
    leg=None,
) -> np.ndarray:
    """``n_sweeps`` per-colour sweeps of every replica, IN PLACE (see the module docstring for the rule).

    x: int8 [R, n] spins, numpy (numba kernel, CPU) or cupy (CUDA kernel); target: an
    :class:`~pgmflow.tasks.tempering.mrf_target.MRFTarget`; b: float64 [R] levels in [0, 1]; key: uint32 [2]
    Philox key; replica_ids: int [R] (counter word 2, mod 2**32); chain: counter word 3 (mod 2**32);
    sweep0: global index of the first sweep; ref_fields: None (every replica at the target's own reference
    ``target.ref_field``) or float64 [G, n], the reference fields of G <= 2 references (a two-leg path), with
    leg: int [R] the row of each replica. Returns int64 [R] (host): spins changed per replica.
    The result depends only on the arguments, not on the backend, thread count or how replicas are batched.
    """
    b, key, rid = _check(x, b, key, replica_ids, sweep0, n_sweeps, method, target.n_sites)
    R = x.shape[0]
    a, lg = reference_rows(target, R, ref_fields, leg)
    if R == 0 or int(n_sweeps) == 0:
        return np.zeros(R, dtype=np.int64)
    if type(x).__module__.startswith("cupy"):
        from pgmflow.tasks.tempering.mrf_cuda import sweep_cupy

        return sweep_cupy(x, target, b, key, rid, chain, sweep0, int(n_sweeps), method, a, lg)
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError("spins must be a writeable C-contiguous numpy (or cupy) array")
    out = np.zeros(R, dtype=np.int64)
    work = R * int(n_sweeps) * (target.n_sites + target.nbr.shape[0])
    threaded = R > 1 and work > PARALLEL_MIN_WORK
    block = _block_size(R, backend.numba().get_num_threads() if threaded else 1)
    _kernels()["_sweeps" if threaded else "_sweeps_serial"](
        x,
        b,
        target.h,
        a,
        lg,
        target.indptr,
        target.nbr,
        target.Jn,
        target.colptr,
        target.sites,
        np.uint64(int(key[0])),
        np.uint64(int(key[1])),
        rid,
        np.uint64(int(chain) & _MASK32),
        np.int64(sweep0),
        np.int64(n_sweeps),
        method == "metropolis",
        out,
        np.int64(block),
    )
    return out


def mrf_statistics(x, target, ref_field=None) -> np.ndarray:
    """float64 [R, 4] of spins ``x`` [R, n] (numpy or cupy): ``(h.x, sum_e J_e x_i x_j, a.x, sum_i x_i)``,
    each summed in index order per replica, so a replica's values do not depend on the others in ``x``
    (``a``: ``ref_field`` [n], None: the target's own)."""
    xh = np.ascontiguousarray(backend.to_numpy(x), dtype=np.int8)
    out = np.empty((xh.shape[0], 4))
    ea = np.ascontiguousarray(target.edges[:, 0])
    eb = np.ascontiguousarray(target.edges[:, 1])
    a = target.ref_field if ref_field is None else np.ascontiguousarray(ref_field, dtype=np.float64)
    _kernels()["_statistics"](xh, target.h, a, ea, eb, target.J, out)
    return out


def numpy_colour_sweep(x, target, b: float, rng, n_sweeps: int, colour_rows=None):
    """Heat-bath per-colour sweeps written the obvious NumPy way (the benchmark's peer): per colour, the
    local fields of its nodes in every replica by one sparse product, ``rng.random`` per node, a logistic and
    ``np.where``. Same distribution as :func:`mrf_sweep` at level ``b``, not the same bits.

    x: int8 [R, n], updated in place; colour_rows: per colour, (nodes, CSR matrix of their rows of J), made
    once by :func:`colour_rows` and passed in to keep the set-up out of the timing."""
    rows = colour_rows if colour_rows is not None else colour_rows_of(target)
    for _ in range(n_sweeps):
        for nodes, A in rows:
            f = (A @ x.T).T + target.h[nodes]  # [R, |c|]
            z = b * f + (1.0 - b) * target.ref_field[nodes]
            p = 1.0 / (1.0 + np.exp(-2.0 * z))
            x[:, nodes] = np.where(rng.random(f.shape) < p, 1, -1)
    return x


def colour_rows_of(target):
    """Per colour: (its nodes, the CSR matrix [|c|, n] of their rows of the coupling matrix)."""
    import scipy.sparse as sp

    n = target.n_sites
    A = sp.csr_matrix((target.Jn, target.nbr, target.indptr), shape=(n, n))
    out = []
    for c in range(target.n_colours):
        nodes = target.sites[target.colptr[c] : target.colptr[c + 1]]
        out.append((nodes, A[nodes]))
    return out
