"""The CPU (numba) kernels of the Ising checkerboard sweep (the spec is in
:mod:`pgmflow.tasks.tempering.ising_kernels`, whose :func:`~pgmflow.tasks.tempering.ising_kernels.ising_sweep` calls
:func:`_sweep_numba` here).

Per chunk of rows, a loop over Philox counters that vectorises writes the high 16 bits of every
word (all four words of each block: one block serves four sites) to a small buffer, then a site
loop that vectorises 16 sites per AVX2 register compares them with the high 16 bits of the integer
thresholds: that decides every site except one whose high bits equal its threshold's (about one
site in 2**16), and a row holding such a tie is restored and redone with the full 32-bit words
and the int64 thresholds. The result is the spec's, bit for bit, with twice as many sites per
register as a comparison of 32-bit words (and half the buffer traffic).

Internal layout: spins live in padded planes ``S[r, c, i, 1 + q]`` (int8 [R, 2, L, H + 2],
H = L // 2) with halo columns ``S[..., 0] = S[..., H]`` and ``S[..., H + 1] = S[..., 1]`` so that the
horizontal neighbour that wraps around needs no special case; bonds in ``B[c, i, k, q]`` (int8
[2, L, 4, H], see :func:`plane_bonds`).

The kernels are plain module-level functions marked with :func:`pgmflow.tasks.backend.kernel`;
:func:`kernels` binds ``prange`` and the Philox device function, then compiles them all
(:func:`pgmflow.tasks.backend.compile_kernels`) on first use. They are bound to module globals, not closure
cells: numba's on-disk cache key hashes a function's closure variables, and a jitted callee pickles
differently in every process, which would make every process miss the cache.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.philox import numba_philox4x32

_MASK32 = 0xFFFFFFFF
_SHIFT = 16  # the update compares u >> _SHIFT with the thresholds' high bits (see _update_rows_high)
_CHUNK_GROUPS = 1024  # Philox groups per chunk of rows: 8 KiB of high halves, stays in L1

# Bound by kernels() before anything compiles: numba's prange, and the Philox-4x32-10 device
# function. As plain Python (before kernels()), prange is range.
prange = range
_philox = None


@functools.lru_cache(maxsize=None)
def kernels() -> dict:
    """Compile (lazily, once per process; numba's on-disk cache is shared between processes) the
    CPU kernels. Returns a dict of njit dispatchers."""
    global prange, _philox
    nb = backend.numba()
    prange = nb.prange
    _philox = numba_philox4x32()
    k = backend.compile_kernels(sys.modules[__name__])
    return {"to_planes": k["to_planes"], "plane_bonds": k["plane_bonds"], "from_planes": k["from_planes"],
            "sweep_by_replica": k["sweep_by_replica"], "sweep_by_rows": k["sweep_by_rows"],
            "fill_uniforms": k["_fill_uniforms"], "fill_high": k["_fill_high"],
            "update_rows_high": k["_update_rows_high"], "update_row_exact": k["_update_row_exact"]}


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def to_planes(spins, S):
    """spins int8 [R, L, L] -> S int8 [R, 2, L, H+2] (with halos); returns the number of
    (row, q) pairs holding a value other than -1/+1."""
    R = spins.shape[0]
    L = spins.shape[1]
    H = L // 2
    bad = 0
    for ri in prange(R * L):
        r = ri // L
        i = ri - r * L
        row = spins[r, i]
        # colour 0 sits at j = 2q + (i & 1), colour 1 at the other parity
        ev = S[r, 0, i] if (i & 1) == 0 else S[r, 1, i]  # the colour at even j
        od = S[r, 1, i] if (i & 1) == 0 else S[r, 0, i]
        nbad = np.int32(0)
        for q in range(H):  # constant offsets: an interleaved load the vectoriser handles
            a = row[2 * q]
            b = row[2 * q + 1]
            ev[q + 1] = a
            od[q + 1] = b
            nbad = np.int32(nbad + (((a != 1) & (a != -1)) | ((b != 1) & (b != -1))))
        ev[0] = ev[H]
        ev[H + 1] = ev[1]
        od[0] = od[H]
        od[H + 1] = od[1]
        bad += nbad
    return bad

@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def from_planes(S, spins):
    """Inverse of to_planes: S int8 [R, 2, L, H+2] -> spins int8 [R, L, L]."""
    R = spins.shape[0]
    L = spins.shape[1]
    H = L // 2
    for ri in prange(R * L):
        r = ri // L
        i = ri - r * L
        row = spins[r, i]
        ev = S[r, 0, i] if (i & 1) == 0 else S[r, 1, i]
        od = S[r, 1, i] if (i & 1) == 0 else S[r, 0, i]
        for q in range(H):
            row[2 * q] = ev[q + 1]
            row[2 * q + 1] = od[q + 1]

@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def plane_bonds(bonds_h, bonds_v, B):
    """Bonds in the plane layout: bonds_h, bonds_v int8 [L, L] -> B int8 [2, L, 4, H];
    returns the number of bonds that are not -1/+1.

    ``B[c, i, k, q]`` is bond k of site ``(i, j = 2q + p)``, ``p = (i + c) & 1``, with k = 0:
    up (to ``(i-1, j)``), 1: down (to ``(i+1, j)``), 2: the horizontal neighbour found at the
    same ``q`` in the other colour's row (``(i, j+1)`` if ``p == 0`` else ``(i, j-1)``), 3:
    the one at the "side" index (``q-1`` if ``p == 0`` else ``q+1``). Four bytes per site
    rather than four bits: the kernel's equality tests then stay in byte lanes, which
    measured faster than unpacking bits.
    """
    L = bonds_h.shape[0]
    H = L // 2
    bad = 0
    for ci in prange(2 * L):
        c = ci // L
        i = ci - c * L
        p = (i + c) & 1
        im = i - 1 if i > 0 else L - 1
        nbad = 0
        for q in range(H):
            j = 2 * q + p
            jm = j - 1 if j > 0 else L - 1
            right = bonds_h[i, j]
            left = bonds_h[i, jm]
            B[c, i, 0, q] = bonds_v[im, j]
            B[c, i, 1, q] = bonds_v[i, j]
            B[c, i, 2, q] = right if p == 0 else left
            B[c, i, 3, q] = left if p == 0 else right
            nbad += (right * right != 1) + (bonds_v[i, j] * bonds_v[i, j] != 1)
        bad += nbad
    return bad

@backend.kernel(cache=True, fastmath=False, nogil=True)
def _fill_uniforms(ubuf, m0, m1, ctr1, ctr2, ctr3, k0, k1):
    """Philox words of counters (m, ctr1, ctr2, ctr3), m in [m0, m1), into ubuf (uint32
    [>= 4 (m1 - m0)]): ``ubuf[4 (m - m0) + w]`` = word w. Vectorises over m."""
    for m in range(m0, m1):
        x0, x1, x2, x3 = _philox(m, ctr1, ctr2, ctr3, k0, k1)
        o = 4 * (m - m0)
        ubuf[o] = np.uint32(x0)
        ubuf[o + 1] = np.uint32(x1)
        ubuf[o + 2] = np.uint32(x2)
        ubuf[o + 3] = np.uint32(x3)

@backend.kernel(cache=True, fastmath=False, nogil=True)
def _fill_high(hbuf, m0, m1, ctr1, ctr2, ctr3, k0, k1, shift):
    """As _fill_uniforms, but keeps only the high bits of each word, order-preserving as int16:
    ``hbuf[4 (m - m0) + w] = (word_w >> shift) - 2**15`` (shift in [16, 32); int16 [>= 4 (m1 - m0)]).
    Vectorises over m."""
    sh = np.uint64(shift)
    bias = np.uint64(0x8000)  # (v ^ 2**15) read as int16 is v - 2**15 for v in [0, 2**16)
    for m in range(m0, m1):
        x0, x1, x2, x3 = _philox(m, ctr1, ctr2, ctr3, k0, k1)
        o = 4 * (m - m0)
        hbuf[o] = np.int16((x0 >> sh) ^ bias)
        hbuf[o + 1] = np.int16((x1 >> sh) ^ bias)
        hbuf[o + 2] = np.int16((x2 >> sh) ^ bias)
        hbuf[o + 3] = np.int16((x3 >> sh) ^ bias)

@backend.kernel(cache=True, fastmath=False, nogil=True)
def _update_rows_high(Sm, So, Bc, hbuf, X, tie, acc, c, i0, i1):
    """Update rows i0..i1-1 of colour c from the high bits of their uniforms.

    Sm, So int8 [L, H+2]: padded planes of colour c (updated) and 1-c; Bc int8 [L, 4, H];
    hbuf int16 [(i1-i0) 4G]: ``(u >> shift) - 2**15`` (from _fill_high); X int16 [10]:
    ``min(T >> shift, 2**16 - 1) - 2**15``; tie int8 [(i1-i0) H] (out): ``2 [uh == xh] +
    [spin changed]`` per site (the change bit lets the caller restore a row); acc int16 [H]
    (in/out): per-column counts of changed spins, incremented here. (Slices are taken here, not
    by the caller: slicing for a call costs reference counting per row.)

    With xh = X[2n + (s+1)//2]: ``uh < xh`` implies ``u < T`` and ``uh > xh`` implies ``u >= T``
    (as u >> shift < 2**16 and T < ((T >> shift) + 1) << shift); a tie decides nothing, so the
    caller redoes a row with a tie exactly. A pure map, written for the auto-vectoriser (16
    sites per AVX2 register; a reduction in the loop would halve that, so changes are counted
    per site in acc and summed once per chunk of rows): n = e0 + e1 + e2 + e3 is
    built from the four equality bits with adder logic, the threshold is picked by a tree of
    selects on (s, n bits).
    """
    L = Sm.shape[0]
    H = Sm.shape[1] - 2
    G4 = 4 * ((H + 3) >> 2)
    x0 = X[0]
    x1 = X[1]
    x2 = X[2]
    x3 = X[3]
    x4 = X[4]
    x5 = X[5]
    x6 = X[6]
    x7 = X[7]
    x8 = X[8]
    x9 = X[9]
    for i in range(i0, i1):
        o = 0 if ((i + c) & 1) == 0 else 2  # side neighbour: q-1 (p == 0) or q+1 (p == 1)
        im = i - 1 if i > 0 else L - 1
        ip = i + 1 if i < L - 1 else 0
        k = i - i0
        uh = hbuf[k * G4:k * G4 + H]
        tr = tie[k * H:(k + 1) * H]
        me = Sm[i, 1:H + 1]
        oth = So[i, 1:H + 1]
        side = So[i, o:o + H]
        up = So[im, 1:H + 1]
        dn = So[ip, 1:H + 1]
        bu = Bc[i, 0]
        bd = Bc[i, 1]
        bs = Bc[i, 2]
        bx = Bc[i, 3]
        for q in range(H):
            s = me[q]
            e0 = bu[q] == up[q]  # bond satisfied: bond_k * s_k > 0
            e1 = bd[q] == dn[q]
            e2 = bs[q] == oth[q]
            e3 = bx[q] == side[q]
            # n = e0 + e1 + e2 + e3 = n0 + 2 n1 + 4 n2
            a01 = e0 ^ e1
            b01 = e0 & e1
            a23 = e2 ^ e3
            b23 = e2 & e3
            n0 = a01 ^ a23
            n1 = (a01 & a23) ^ b01 ^ b23
            n2 = b01 & b23
            sp = s > 0
            t0 = x1 if sp else x0
            t1 = x3 if sp else x2
            t2 = x5 if sp else x4
            t3 = x7 if sp else x6
            t4 = x9 if sp else x8
            t01 = t1 if n0 else t0
            t23 = t3 if n0 else t2
            t03 = t23 if n1 else t01
            t = t4 if n2 else t03
            u = uh[q]
            new = np.int8(1) if u < t else np.int8(-1)
            me[q] = new
            ch = new != s
            tr[q] = np.int8(((u == t) << 1) | ch)
            acc[q] = np.int16(acc[q] + ch)
        Sm[i, 0] = Sm[i, H]
        Sm[i, H + 1] = Sm[i, 1]

@backend.kernel(cache=True, fastmath=False, nogil=True)
def _update_row_exact(me, oth, side, up, dn, bu, bd, bs, bx, u32, T):
    """Same as _update_rows_high (one row) with the spec's int64 comparison ``u < T[2n + (s+1)//2]``
    (u32 uint32 [>= H]: the full words, T int64 [10]); a plain loop, for rows with a tie.
    Returns #changed."""
    cnt = 0
    for q in range(me.shape[0]):
        s = me[q]
        n = (bu[q] == up[q]) + (bd[q] == dn[q]) + (bs[q] == oth[q]) + (bx[q] == side[q])
        new = np.int8(1) if np.int64(u32[q]) < T[2 * n + (1 if s > 0 else 0)] else np.int8(-1)
        cnt += new != s
        me[q] = new
    return cnt

@backend.kernel(cache=True, fastmath=False, nogil=True)
def _sweep_chunk(S, B, X, T, r, c, i0, i1, hbuf, ubuf, tie, acc, ctr1, rid, chain, k0, k1, shift):
    """Rows i0..i1-1 of colour c of replica r: the high bits of their Philox words, then their
    updates; a row where the high bits tie with a site's threshold (probability about
    H 2**(shift - 32)) is restored and redone exactly from its full words. Returns #changed.

    X int16 [10], T int64 [10]: replica r's thresholds. Scratch: hbuf int16 [>= (i1-i0) 4G],
    ubuf uint32 [4G], tie int8 [>= (i1-i0) H], acc int16 [H] (zero on entry and on return).
    """
    L = S.shape[2]
    H = S.shape[3] - 2
    G = (H + 3) >> 2
    Sm = S[r, c]
    So = S[r, 1 - c]
    Bc = B[c]
    _fill_high(hbuf, i0 * G, i1 * G, ctr1, rid, chain, k0, k1, shift)
    _update_rows_high(Sm, So, Bc, hbuf, X, tie, acc, c, i0, i1)
    cnt = 0
    for q in range(H):
        cnt += acc[q]
        acc[q] = 0
    nt = (i1 - i0) * H
    any_tie = np.uint64(0)
    tw = tie.view(np.uint64)  # 8 flags per word
    for w in range(nt >> 3):
        any_tie |= tw[w]
    for q in range(nt & ~7, nt):
        any_tie |= np.uint64(tie[q])
    if any_tie & np.uint64(0x0202020202020202) == 0:
        return cnt
    for i in range(i0, i1):  # rare: redo the rows with a tie from their full words
        k = i - i0
        fl = tie[k * H:(k + 1) * H]
        if np.any(fl & 2):
            me = Sm[i, 1:H + 1]
            for q in range(H):
                if fl[q] & 1:  # changed: restore
                    me[q] = -me[q]
                    cnt -= 1
            o = 0 if ((i + c) & 1) == 0 else 2
            im = i - 1 if i > 0 else L - 1
            ip = i + 1 if i < L - 1 else 0
            _fill_uniforms(ubuf, i * G, (i + 1) * G, ctr1, rid, chain, k0, k1)
            cnt += _update_row_exact(me, So[i, 1:H + 1], So[i, o:o + H], So[im, 1:H + 1], So[ip, 1:H + 1],
                                     Bc[i, 0], Bc[i, 1], Bc[i, 2], Bc[i, 3], ubuf, T)
            Sm[i, 0] = Sm[i, H]
            Sm[i, H + 1] = Sm[i, 1]
    return cnt

@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def sweep_by_replica(S, B, X, T, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, shift, changed):
    """Parallel over replicas; each replica runs all its sweeps (no barrier needed)."""
    R = S.shape[0]
    L = S.shape[2]
    H = S.shape[3] - 2
    G = (H + 3) >> 2
    for r in prange(R):
        hbuf = np.empty(4 * G * rows_per_chunk, np.int16)
        ubuf = np.empty(4 * G, np.uint32)
        tie = np.empty(8 * ((H * rows_per_chunk + 7) // 8), np.int8)
        acc = np.zeros(H, np.int16)
        rid = rids[r]
        cnt = 0
        for t in range(n_sweeps):
            for c in range(2):
                ctr1 = 2 * (sweep0 + t) + c
                for i0 in range(0, L, rows_per_chunk):
                    i1 = min(i0 + rows_per_chunk, L)
                    cnt += _sweep_chunk(S, B, X[r], T[r], r, c, i0, i1, hbuf, ubuf, tie, acc, ctr1, rid, chain,
                                        k0, k1, shift)
        changed[r] = cnt

@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def sweep_by_rows(S, B, X, T, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, shift, changed_blk):
    """Parallel over chunks of rows within each colour (for few, large replicas); one
    parallel region per colour of each sweep."""
    R = S.shape[0]
    L = S.shape[2]
    H = S.shape[3] - 2
    G = (H + 3) >> 2
    nbpr = (L + rows_per_chunk - 1) // rows_per_chunk
    for t in range(n_sweeps):
        for c in range(2):
            ctr1 = 2 * (sweep0 + t) + c
            for b in prange(R * nbpr):
                r = b // nbpr
                i0 = (b - r * nbpr) * rows_per_chunk
                i1 = min(i0 + rows_per_chunk, L)
                hbuf = np.empty(4 * G * rows_per_chunk, np.int16)
                ubuf = np.empty(4 * G, np.uint32)
                tie = np.empty(8 * ((H * rows_per_chunk + 7) // 8), np.int8)
                acc = np.zeros(H, np.int16)
                changed_blk[b] += _sweep_chunk(S, B, X[r], T[r], r, c, i0, i1, hbuf, ubuf, tie, acc, ctr1,
                                               rids[r], chain, k0, k1, shift)


def _choose_by_replica(R: int, n_threads: int) -> bool:
    """Parallelise over replicas when that keeps all threads busy (<= 25% idle), else over rows."""
    if n_threads <= 1:
        return True
    if R < n_threads:
        return False
    waves = -(-R // n_threads)
    return (waves * n_threads - R) <= 0.25 * R


def _sweep_numba(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps,
                 mode=None, shift=_SHIFT):
    """numba path of :func:`ising_sweep` (arguments already validated, host arrays).

    ``mode`` ("replica" | "rows" | None = automatic) and ``shift`` (the fast path compares
    ``u >> shift`` with the thresholds' high bits and redoes a row exactly where they tie; 16,
    the default, ties in one site in 2**16, larger values in most rows) are for tests: every
    choice gives the same bits.
    """
    nb = backend.numba()
    k = kernels()
    R, L, _ = spins.shape
    H = L // 2
    G = (H + 3) // 4
    work = spins if spins.flags.c_contiguous else np.ascontiguousarray(spins)
    S = np.empty((R, 2, L, H + 2), dtype=np.int8)
    bad = k["to_planes"](work, S)
    if bad:
        raise ValueError(f"spins must contain only -1 and +1; {bad} pairs of sites hold other values")
    B = np.empty((2, L, 4, H), dtype=np.int8)
    if k["plane_bonds"](bonds_h, bonds_v, B):
        raise ValueError("bonds_h and bonds_v must contain only -1 and +1")
    T = np.ascontiguousarray(thr.reshape(R, 10), dtype=np.int64)
    X = (np.minimum(T >> shift, 0xFFFF) - 0x8000).astype(np.int16)  # [R, 10], see _update_rows_high
    k0, k1 = int(key[0]), int(key[1])
    chain32 = int(chain) & _MASK32
    rids = np.ascontiguousarray(replica_ids, dtype=np.int64) & _MASK32
    rows_per_chunk = max(1, min(L, _CHUNK_GROUPS // G))
    if mode is None:
        mode = "replica" if _choose_by_replica(R, nb.get_num_threads()) else "rows"
    if mode == "replica":
        changed = np.zeros(R, dtype=np.int64)
        k["sweep_by_replica"](S, B, X, T, k0, k1, rids, chain32, int(sweep0), int(n_sweeps),
                              rows_per_chunk, int(shift), changed)
    elif mode == "rows":
        # enough chunks for every thread: at least ~4 per thread in total
        want = 4 * nb.get_num_threads()
        per_rep = -(-want // R)
        rows_per_chunk = max(1, min(rows_per_chunk, L // per_rep if per_rep <= L else 1))
        nbpr = -(-L // rows_per_chunk)
        changed_blk = np.zeros(R * nbpr, dtype=np.int64)
        k["sweep_by_rows"](S, B, X, T, k0, k1, rids, chain32, int(sweep0), int(n_sweeps),
                           rows_per_chunk, int(shift), changed_blk)
        changed = changed_blk.reshape(R, nbpr).sum(axis=1)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    k["from_planes"](S, work)
    if work is not spins:
        spins[...] = work
    return changed
