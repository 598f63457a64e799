"""The CPU (numba) kernels of the Ising checkerboard sweep (the spec is in
:mod:`pgmflow.tasks.tempering.ising_kernels`, whose :func:`~pgmflow.tasks.tempering.ising_kernels.ising_sweep` calls
:func:`_sweep_numba` here).

Multi-spin coding: the spins of one colour live as bits, 64 sites per ``uint64`` word, and every
step of the site update is a bitwise operation on 64 sites at once:

* the four "bond satisfied" bits ``e_k = NOT(bond_k XOR s_k)`` of every site of a word;
* their count ``n = e0 + e1 + e2 + e3`` as three bit planes (a bit-sliced adder);
* ten one-hot class masks, one per ``(n, s)``, the row of the threshold table a site uses;
* the exact comparison ``u < T`` of each site's 32-bit uniform with its class's threshold, done
  bit-serially from the most significant bit: random plane ``k`` holds bit ``31 - k`` of the 64
  sites' uniforms (the spec's layout, see :mod:`~pgmflow.tasks.tempering.ising_kernels`), the
  threshold plane is the OR of the class masks whose threshold has that bit set, and a site is
  decided at the first plane where the two bits differ (0 against 1: ``u < T``, +1; 1 against 0:
  ``u > T``, -1). Classes with ``T = 2**32`` (always +1) and ``T = 0`` (always -1) are decided
  before any plane.

A site is undecided after ``k`` planes with probability ``2**-k`` (where its threshold is not 0 or
``2**32``), so the vectorised pass draws the first eight planes of every word (four Philox blocks
per 64 sites: sixteen sites per block, where the kernel before issue 18 used one 32-bit word per
site, four per block), and a second pass finishes the words that still hold an undecided site
(about one in six at the critical point), gathered into a compact buffer so that it vectorises too,
one block (two planes) at a time. The result is the spec's ``u < T`` bit for bit: a site undecided
after all 32 planes has ``u == T``, which is ``-1``.

Internal layout: spins in ``P[r, c, (1 + i) * W + w]`` (uint64, flat [R, 2, (L + 2) W],
W = ceil(H / 64), H = L // 2): bit b is site ``(i, j = 2 (64 w + b) + p)``, ``p = (i + c) & 1``,
set for +1; lanes past H are 0; rows 0 and L + 1 are halos (copies of rows L and 1) so that the
rows above and below are plain loads. Bonds in ``BB[c, k, i * W + w]`` (uint64 [2, 4, L W], bit
set for bond +1; k as in :func:`plane_bonds`).

The kernels are plain module-level functions marked with :func:`pgmflow.tasks.backend.kernel`;
:func:`kernels` compiles them all (:func:`pgmflow.tasks.backend.compile_kernels`) on first use,
binding ``prange`` and the Philox device function (:func:`pgmflow.tasks.philox.numba_philox4x32`).
They are bound to module globals, not closure cells: numba's on-disk cache key hashes a function's
closure variables, and a jitted callee pickles differently in every process, which would make every
process miss the cache.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks import philox as _philox_mod

_MASK32 = 0xFFFFFFFF
_TWO32 = 1 << 32
_FAST_BLOCKS = 4  # Philox blocks (two planes each) drawn for every word in the vectorised pass
_CHUNK_WORDS = 256  # words (64 sites each) per chunk of rows: the chunk's scratch stays in L1
BLOCKS_PER_WORD = 16  # the spec's counter stride: a word's blocks are (i W + w) * 16 + g, g < 16

_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U32 = np.uint64(32)
_U63 = np.uint64(63)

# Bound by kernels() before anything compiles (compile_kernels' bind): numba's prange, and the
# Philox-4x32-10 device function's dispatcher. As plain Python (before kernels()), range and its function.
prange = range
_philox = _philox_mod._philox4x32


@functools.lru_cache(maxsize=None)
def kernels() -> dict:
    """Compile (lazily, once per process; numba's on-disk cache is shared between processes) the
    CPU kernels. Returns a dict of njit dispatchers."""
    k = backend.compile_kernels(
        sys.modules[__name__], bind={"prange": backend.numba().prange, "_philox": _philox_mod.numba_philox4x32()}
    )
    return {
        "pack_planes": k["pack_planes"],
        "plane_bonds": k["plane_bonds"],
        "unpack_planes": k["unpack_planes"],
        "sweep_by_replica": k["sweep_by_replica"],
        "sweep_by_rows": k["sweep_by_rows"],
        "fill_planes": k["_fill_planes"],
    }


@backend.kernel(cache=True, fastmath=False, nogil=True)
def _refresh_halos(pl, L, W):
    """Halo rows of one plane (flat [(L + 2) W]): row 0 = row L, row L + 1 = row 1."""
    for w in range(W):
        pl[w] = pl[L * W + w]
        pl[(L + 1) * W + w] = pl[W + w]


_GATHER4 = np.uint64((1 << 45) | (1 << 30) | (1 << 15) | 1)  # bits 0, 16, 32, 48 -> bits 45..48
_EVEN_SIGNS = np.uint64(0x0001000100010001)
_BYTE_ONES = np.uint64(0x0101010101010101)
_BYTE_INNER = np.uint64(0x7E7E7E7E7E7E7E7E)


def _unpack_table() -> np.ndarray:
    """uint64 [256]: entry ``e | o << 4`` is the 8 int8 spins (+1/-1, little-endian) of four pairs of
    sites whose even-j bits are the nibble e and odd-j bits the nibble o."""
    out = np.empty(256, dtype=np.uint64)
    for idx in range(256):
        v = 0
        for t in range(4):
            v |= (0x01 if (idx >> t) & 1 else 0xFF) << (16 * t)
            v |= (0x01 if (idx >> (4 + t)) & 1 else 0xFF) << (16 * t + 8)
        out[idx] = v
    return out


UNPACK_TABLE = _unpack_table()


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def pack_planes(spins, P):
    """spins int8 [R, L, L] -> P uint64 [R, 2, (L + 2) W] (bit planes with halo rows, see the module
    docstring); returns the number of sites holding a value other than -1/+1.

    When L % 8 == 0 a row is read 8 bytes (four pairs of sites) at a time: the sign bits of its even
    and odd bytes are gathered into two nibbles by one multiplication each (the positions 0, 16, 32,
    48 times ``2**45 + 2**30 + 2**15 + 1`` land on bits 45..48 without carries)."""
    R = spins.shape[0]
    L = spins.shape[1]
    H = L // 2
    W = (H + 63) >> 6
    bad = 0
    for ri in prange(R * L):
        r = ri // L
        i = ri - r * L
        row = spins[r, i]
        nbad = 0
        ce = i & 1  # the colour of the sites at even j
        pe = P[r, ce, (i + 1) * W : (i + 2) * W]
        po = P[r, 1 - ce, (i + 1) * W : (i + 2) * W]
        if (L & 7) == 0:
            row64 = row.view(np.uint64)
            n8 = L >> 3
            chk = np.uint64(0)
            for w in range(W):
                ev = np.uint64(0)
                od = np.uint64(0)
                for t in range(min(16, n8 - 16 * w)):
                    x = row64[16 * w + t]
                    # bytes 0x01 / 0xFF become 0x00 / 0xFE: bit 0 clear and bits 1..7 all equal
                    y = x ^ _BYTE_ONES
                    chk |= (y & _BYTE_ONES) | (((y >> np.uint64(1)) ^ y) & _BYTE_INNER)
                    sh = np.uint64(4 * t)
                    e4 = ((((x >> np.uint64(7)) & _EVEN_SIGNS) * _GATHER4) >> np.uint64(45)) & np.uint64(15)
                    o4 = ((((x >> np.uint64(15)) & _EVEN_SIGNS) * _GATHER4) >> np.uint64(45)) & np.uint64(15)
                    ev |= (e4 ^ np.uint64(15)) << sh  # sign bit set: -1, bit 0
                    od |= (o4 ^ np.uint64(15)) << sh
                pe[w] = ev
                po[w] = od
            if chk != np.uint64(0):  # some byte is not +-1: count them
                for j in range(L):
                    nbad += (row[j] != 1) & (row[j] != -1)
        else:
            for j in range(L):
                nbad += (row[j] != 1) & (row[j] != -1)
            for w in range(W):
                ev = np.uint64(0)
                od = np.uint64(0)
                for b in range(min(64, H - 64 * w)):
                    ev |= np.uint64(row[2 * (64 * w + b)] > 0) << np.uint64(b)
                    od |= np.uint64(row[2 * (64 * w + b) + 1] > 0) << np.uint64(b)
                pe[w] = ev
                po[w] = od
        bad += nbad
    for rc in prange(2 * R):
        _refresh_halos(P[rc >> 1, rc & 1], L, W)
    return bad


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def unpack_planes(P, spins, table):
    """Inverse of pack_planes: P uint64 [R, 2, (L + 2) W] -> spins int8 [R, L, L] (``table``:
    :data:`UNPACK_TABLE`, 8 bytes of spins per pair of nibbles, when L % 8 == 0)."""
    R = spins.shape[0]
    L = spins.shape[1]
    H = L // 2
    W = (H + 63) >> 6
    for ri in prange(R * L):
        r = ri // L
        i = ri - r * L
        row = spins[r, i]
        ce = i & 1
        pe = P[r, ce, (i + 1) * W : (i + 2) * W]
        po = P[r, 1 - ce, (i + 1) * W : (i + 2) * W]
        if (L & 7) == 0:
            row64 = row.view(np.uint64)
            for m in range(L >> 3):
                w = m >> 4
                sh = np.uint64(4 * (m & 15))
                row64[m] = table[((pe[w] >> sh) & np.uint64(15)) | (((po[w] >> sh) & np.uint64(15)) << np.uint64(4))]
        else:
            for q in range(H):
                w = q >> 6
                b = np.uint64(q & 63)
                row[2 * q] = np.int8(2 * np.int64((pe[w] >> b) & np.uint64(1)) - 1)
                row[2 * q + 1] = np.int8(2 * np.int64((po[w] >> b) & np.uint64(1)) - 1)


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def plane_bonds(PH, PV, BB):
    """Bonds as bit planes, from the bond lattices packed like spins (``PH``, ``PV`` uint64
    [1, 2, (L + 2) W]: :func:`pack_planes` of ``bonds_h[None]`` and ``bonds_v[None]``, bit set for
    +1) -> BB uint64 [2, 4, L W].

    Bit b of ``BB[c, k, i W + w]`` is bond k of site ``(i, j = 2 q + p)``, ``q = 64 w + b``,
    ``p = (i + c) & 1``, set for +1, with k = 0: up (to ``(i-1, j)``: bonds_v[i-1, j], a site of
    colour 1 - c in row i - 1), 1: down (to ``(i+1, j)``: bonds_v[i, j]), 2: the horizontal
    neighbour found at the same ``q`` in the other colour's row (``(i, j+1)`` if ``p == 0``:
    bonds_h[i, j], colour c; else ``(i, j-1)``: bonds_h[i, j-1], colour 1 - c, index q), 3: the one
    at the "side" index (``q-1`` if ``p == 0``: bonds_h[i, j-1], colour 1 - c, index q - 1 around
    the row; else ``q+1``: bonds_h[i, j], colour c). Lanes past H may hold any bits (no site
    reads them).
    """
    W = (PH.shape[2] - BB.shape[2]) // 2  # (L + 2) W - L W
    L = BB.shape[2] // W
    H = L // 2
    hb = np.uint64((H - 1) & 63)
    for ci in prange(2 * L):
        c = ci // L
        i = ci - c * L
        p = (i + c) & 1
        own_h = PH[0, c]
        oth_h = PH[0, 1 - c]
        o = (i + 1) * W
        for w in range(W):
            f = i * W + w
            BB[c, 0, f] = PV[0, 1 - c, i * W + w]
            BB[c, 1, f] = PV[0, c, o + w]
            if p == 0:
                BB[c, 2, f] = own_h[o + w]
                if w == 0:
                    BB[c, 3, f] = (oth_h[o] << _U1) | ((oth_h[o + W - 1] >> hb) & _U1)
                else:
                    BB[c, 3, f] = (oth_h[o + w] << _U1) | (oth_h[o + w - 1] >> _U63)
            else:
                BB[c, 2, f] = oth_h[o + w]
                BB[c, 3, f] = own_h[o + w]


@backend.kernel(cache=True, fastmath=False, nogil=True)
def _fill_planes(IN, row0, f0, nf, nblk, ctr1, ctr2, ctr3, k0, k1):
    """The first ``nblk`` Philox blocks of the words f0 .. f0 + nf - 1 (flat word index ``i W + w``)
    as planes: ``IN[row0 + 2 g + h, f - f0] = word 2h | word (2h + 1) << 32`` of block ``g``
    (counter ``16 f + g``), plane ``2 g + h`` of word f. Vectorises over the words."""
    for g in range(nblk):
        pa = IN[row0 + 2 * g]
        pb = IN[row0 + 2 * g + 1]
        for k in range(nf):
            x0, x1, x2, x3 = _philox(np.uint64(16) * np.uint64(f0 + k) + np.uint64(g), ctr1, ctr2, ctr3, k0, k1)
            pa[k] = x0 | (x1 << _U32)
            pb[k] = x2 | (x3 << _U32)


@backend.kernel(cache=True, fastmath=False, nogil=True, inline="always")
def _classes(s, up, dn, ot, sd, bu, bd, bs, bx):
    """The ten one-hot class masks of a word (class ``2 n + b``: n satisfied bonds, b = 1 for +1)."""
    e0 = ~(bu ^ up)  # bond satisfied: bond_k * s_k > 0, i.e. equal bits
    e1 = ~(bd ^ dn)
    e2 = ~(bs ^ ot)
    e3 = ~(bx ^ sd)
    a01 = e0 ^ e1  # n = e0 + e1 + e2 + e3 = n0 + 2 n1 + 4 n2
    b01 = e0 & e1
    a23 = e2 ^ e3
    b23 = e2 & e3
    n0 = a01 ^ a23
    n1 = (a01 & a23) ^ b01 ^ b23
    n2 = b01 & b23  # n == 4 (then n0 = n1 = 0)
    m0 = ~(n0 | n1 | n2)
    m1 = n0 & ~n1
    m2 = n1 & ~n0
    m3 = n0 & n1
    ns = ~s
    return (m0 & ns, m0 & s, m1 & ns, m1 & s, m2 & ns, m2 & s, m3 & ns, m3 & s, n2 & ns, n2 & s)


@backend.kernel(cache=True, fastmath=False, nogil=True, inline="always")
def _bit(t, k):
    """All ones if bit ``31 - k`` of the threshold ``t`` (uint64, < 2**32 where it matters) is set."""
    return _U0 - ((t >> np.uint64(31 - k)) & _U1)


@backend.kernel(cache=True, fastmath=False, nogil=True, inline="always")
def _tplane(cl, T, k):
    """Plane k of the sites' thresholds: the OR of the class masks ``cl`` whose threshold (``T``, a
    10-tuple of uint64) has bit ``31 - k`` set."""
    return (
        (cl[0] & _bit(T[0], k))
        | (cl[1] & _bit(T[1], k))
        | (cl[2] & _bit(T[2], k))
        | (cl[3] & _bit(T[3], k))
        | (cl[4] & _bit(T[4], k))
        | (cl[5] & _bit(T[5], k))
        | (cl[6] & _bit(T[6], k))
        | (cl[7] & _bit(T[7], k))
        | (cl[8] & _bit(T[8], k))
        | (cl[9] & _bit(T[9], k))
    )


@backend.kernel(cache=True, fastmath=False, nogil=True, inline="always")
def _select(cl, M):
    """The OR of the class masks ``cl`` where the 10-tuple ``M`` of all-ones/zero words is all ones."""
    return (
        (cl[0] & M[0])
        | (cl[1] & M[1])
        | (cl[2] & M[2])
        | (cl[3] & M[3])
        | (cl[4] & M[4])
        | (cl[5] & M[5])
        | (cl[6] & M[6])
        | (cl[7] & M[7])
        | (cl[8] & M[8])
        | (cl[9] & M[9])
    )


@backend.kernel(cache=True, fastmath=False, nogil=True, inline="always")
def _step(acc, D, pk, tp):
    """One plane of the bit-serial comparison: where an undecided site's uniform bit is 0 and its
    threshold bit 1, ``u < T`` (+1); where they differ the other way, ``u > T`` (-1); where they are
    equal it stays undecided."""
    return acc | (D & ~pk & tp), D & ~(pk ^ tp)


@backend.kernel(cache=True, fastmath=False, nogil=True)
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@backend.kernel(cache=True, fastmath=False, nogil=True)
def _sweep_chunk(Pm, Po, Bc, Tr, L, H, W, c, i0, i1, IN, OUT, G, IDX, ctr1, rid, chain, k0, k1, nfast):
    """Rows i0..i1-1 of colour c of one replica. Pm, Po uint64 [(L + 2) W]: its planes of colour c
    (updated) and 1 - c; Bc uint64 [4, L W]; Tr int64 [10]: its thresholds. Scratch: IN uint64
    [17, >= (i1 - i0) W], OUT uint64 [2, >= (i1 - i0) W], G uint64 [11, >= (i1 - i0) W], IDX int64
    [>= (i1 - i0) W]. ``nfast`` (0, 1, 2 or 4): Philox blocks
    per word drawn in the vectorised pass (4; the tests use fewer, so that the scalar pass decides
    more sites). Returns #changed.

    The main loop reads four arrays (Pm, Po, Bc and IN: the side neighbours and the first planes)
    and writes one (OUT): with more, LLVM's run-time alias checks exceed its limit and the loop
    stays scalar. The halo rows of Pm are left
    stale (the caller refreshes them when every row of colour c is done; colour c's own update never
    reads them).
    """
    f0 = i0 * W
    nf = (i1 - i0) * W
    T = (
        np.uint64(Tr[0]),
        np.uint64(Tr[1]),
        np.uint64(Tr[2]),
        np.uint64(Tr[3]),
        np.uint64(Tr[4]),
        np.uint64(Tr[5]),
        np.uint64(Tr[6]),
        np.uint64(Tr[7]),
        np.uint64(Tr[8]),
        np.uint64(Tr[9]),
    )
    A = (
        _U0 - (T[0] >> _U32),
        _U0 - (T[1] >> _U32),
        _U0 - (T[2] >> _U32),
        _U0 - (T[3] >> _U32),
        _U0 - (T[4] >> _U32),
        _U0 - (T[5] >> _U32),
        _U0 - (T[6] >> _U32),
        _U0 - (T[7] >> _U32),
        _U0 - (T[8] >> _U32),
        _U0 - (T[9] >> _U32),
    )  # T == 2**32: always +1
    Z = (
        _U0 - np.uint64(T[0] == _U0),
        _U0 - np.uint64(T[1] == _U0),
        _U0 - np.uint64(T[2] == _U0),
        _U0 - np.uint64(T[3] == _U0),
        _U0 - np.uint64(T[4] == _U0),
        _U0 - np.uint64(T[5] == _U0),
        _U0 - np.uint64(T[6] == _U0),
        _U0 - np.uint64(T[7] == _U0),
        _U0 - np.uint64(T[8] == _U0),
        _U0 - np.uint64(T[9] == _U0),
    )  # T == 0: always -1
    hb = np.uint64((H - 1) & 63)
    # the "side" neighbour words: q - 1 (p == 0) or q + 1 (p == 1) of the other colour, around the row
    SD = IN[4]
    for i in range(i0, i1):
        o = (i + 1) * W  # row i of Po
        d = (i - i0) * W  # row i of SD
        if ((i + c) & 1) == 0:
            SD[d] = (Po[o] << _U1) | ((Po[o + W - 1] >> hb) & _U1)
            for w in range(1, W):
                SD[d + w] = (Po[o + w] << _U1) | (Po[o + w - 1] >> _U63)
        else:
            for w in range(W - 1):
                SD[d + w] = (Po[o + w] >> _U1) | (Po[o + w + 1] << _U63)
            SD[d + W - 1] = (Po[o + W - 1] >> _U1) | ((Po[o] & _U1) << hb)
    if nfast > 0:
        _fill_planes(IN, 9, f0, nf, nfast, ctr1, rid, chain, k0, k1)
    if nfast == 4:
        for k in range(nf):  # vectorised: four words (256 sites) per AVX2 register
            f = f0 + k
            cl = _classes(Pm[f + W], Po[f], Po[f + 2 * W], Po[f + W], IN[4, k], Bc[0, f], Bc[1, f], Bc[2, f], Bc[3, f])
            acc = _select(cl, A)
            D = ~(acc | _select(cl, Z))
            acc, D = _step(acc, D, IN[9, k], _tplane(cl, T, 0))
            acc, D = _step(acc, D, IN[10, k], _tplane(cl, T, 1))
            acc, D = _step(acc, D, IN[11, k], _tplane(cl, T, 2))
            acc, D = _step(acc, D, IN[12, k], _tplane(cl, T, 3))
            acc, D = _step(acc, D, IN[13, k], _tplane(cl, T, 4))
            acc, D = _step(acc, D, IN[14, k], _tplane(cl, T, 5))
            acc, D = _step(acc, D, IN[15, k], _tplane(cl, T, 6))
            acc, D = _step(acc, D, IN[16, k], _tplane(cl, T, 7))
            OUT[0, k] = acc
            OUT[1, k] = D
    else:
        for k in range(nf):
            f = f0 + k
            cl = _classes(Pm[f + W], Po[f], Po[f + 2 * W], Po[f + W], IN[4, k], Bc[0, f], Bc[1, f], Bc[2, f], Bc[3, f])
            acc = _select(cl, A)
            D = ~(acc | _select(cl, Z))
            for pl in range(2 * nfast):
                acc, D = _step(acc, D, IN[9 + pl, k], _tplane(cl, T, pl))
            OUT[0, k] = acc
            OUT[1, k] = D
    # lanes past H: never undecided, always 0
    last = _ONES if (H & 63) == 0 else (_U1 << np.uint64(H & 63)) - _U1
    for i in range(i1 - i0):
        OUT[0, i * W + W - 1] &= last
        OUT[1, i * W + W - 1] &= last
    # The words with an undecided site (about one in six at 64 sites): gathered into the columns of G
    # (their inputs, acc, D), then one more Philox block (two planes) each in a loop that
    # vectorises, and again for the few still undecided, up to the 16th block.
    nt = 0
    for k in range(nf):
        if OUT[1, k] != _U0:
            f = f0 + k
            IDX[nt] = k
            G[0, nt] = Pm[f + W]
            G[1, nt] = Po[f]
            G[2, nt] = Po[f + 2 * W]
            G[3, nt] = Po[f + W]
            G[4, nt] = SD[k]
            G[5, nt] = Bc[0, f]
            G[6, nt] = Bc[1, f]
            G[7, nt] = Bc[2, f]
            G[8, nt] = Bc[3, f]
            G[9, nt] = OUT[0, k]
            G[10, nt] = OUT[1, k]
            nt += 1
    g = nfast
    while nt > 0 and g < 16:
        for m in range(nt):
            cl = _classes(G[0, m], G[1, m], G[2, m], G[3, m], G[4, m], G[5, m], G[6, m], G[7, m], G[8, m])
            x0, x1, x2, x3 = _philox(np.uint64(16) * np.uint64(f0 + IDX[m]) + np.uint64(g), ctr1, rid, chain, k0, k1)
            acc, D = _step(G[9, m], G[10, m], x0 | (x1 << _U32), _tplane(cl, T, 2 * g))
            acc, D = _step(acc, D, x2 | (x3 << _U32), _tplane(cl, T, 2 * g + 1))
            G[9, m] = acc
            G[10, m] = D
        g += 1
        n2 = 0
        for m in range(nt):
            OUT[0, IDX[m]] = G[9, m]  # a site still undecided after 32 planes has u == T: -1 (bit 0)
            if G[10, m] != _U0:
                if n2 != m:
                    for row in range(11):
                        G[row, n2] = G[row, m]
                    IDX[n2] = IDX[m]
                n2 += 1
        nt = n2
    cnt = np.int64(0)
    for k in range(nf):
        new = OUT[0, k]
        cnt += np.int64(_popcount(new ^ Pm[f0 + W + k]))
        Pm[f0 + W + k] = new
    return cnt


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def sweep_by_replica(P, BB, T, L, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, nfast, changed):
    """Parallel over replicas; each replica runs all its sweeps (no barrier needed)."""
    R = P.shape[0]
    H = L // 2
    W = (H + 63) >> 6
    nw = rows_per_chunk * W
    for r in prange(R):
        IN = np.empty((17, nw), np.uint64)
        OUT = np.empty((2, nw), np.uint64)
        G = np.empty((11, nw), np.uint64)
        IDX = np.empty(nw, np.int64)
        rid = rids[r]
        cnt = 0
        for t in range(n_sweeps):
            for c in range(2):
                ctr1 = (2 * (sweep0 + t) + c) & _MASK32
                for i0 in range(0, L, rows_per_chunk):
                    i1 = min(i0 + rows_per_chunk, L)
                    cnt += _sweep_chunk(
                        P[r, c],
                        P[r, 1 - c],
                        BB[c],
                        T[r],
                        L,
                        H,
                        W,
                        c,
                        i0,
                        i1,
                        IN,
                        OUT,
                        G,
                        IDX,
                        ctr1,
                        rid,
                        chain,
                        k0,
                        k1,
                        nfast,
                    )
                _refresh_halos(P[r, c], L, W)
        changed[r] = cnt


@backend.kernel(cache=True, parallel=True, fastmath=False, nogil=True)
def sweep_by_rows(P, BB, T, L, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, nfast, changed_blk):
    """Parallel over chunks of rows within each colour (for few, large replicas); one
    parallel region per colour of each sweep."""
    R = P.shape[0]
    H = L // 2
    W = (H + 63) >> 6
    nw = rows_per_chunk * W
    nbpr = (L + rows_per_chunk - 1) // rows_per_chunk
    for t in range(n_sweeps):
        for c in range(2):
            ctr1 = (2 * (sweep0 + t) + c) & _MASK32
            for b in prange(R * nbpr):
                r = b // nbpr
                i0 = (b - r * nbpr) * rows_per_chunk
                i1 = min(i0 + rows_per_chunk, L)
                IN = np.empty((17, nw), np.uint64)
                OUT = np.empty((2, nw), np.uint64)
                G = np.empty((11, nw), np.uint64)
                IDX = np.empty(nw, np.int64)
                changed_blk[b] += _sweep_chunk(
                    P[r, c],
                    P[r, 1 - c],
                    BB[c],
                    T[r],
                    L,
                    H,
                    W,
                    c,
                    i0,
                    i1,
                    IN,
                    OUT,
                    G,
                    IDX,
                    ctr1,
                    rids[r],
                    chain,
                    k0,
                    k1,
                    nfast,
                )
            for r in range(R):
                _refresh_halos(P[r, c], L, W)


def _choose_by_replica(R: int, n_threads: int) -> bool:
    """Parallelise over replicas when that keeps all threads busy (<= 25% idle), else over rows."""
    if n_threads <= 1:
        return True
    if R < n_threads:
        return False
    waves = -(-R // n_threads)
    return (waves * n_threads - R) <= 0.25 * R


def _sweep_numba(
    spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps, mode=None, nfast=_FAST_BLOCKS
):
    """numba path of :func:`ising_sweep` (arguments already validated, host arrays).

    ``mode`` ("replica" | "rows" | None = automatic) and ``nfast`` (Philox blocks per 64-site word
    drawn in the vectorised pass: 4, the default, or 0, 1, 2, which leave more sites to the scalar
    pass that draws further blocks only for words still holding an undecided site) are for tests:
    every choice gives the same bits.
    """
    if nfast not in (0, 1, 2, 4):
        raise ValueError(f"nfast must be 0, 1, 2 or 4, got {nfast}")
    nb = backend.numba()
    k = kernels()
    R, L, _ = spins.shape
    H = L // 2
    W = (H + 63) // 64
    work = spins if spins.flags.c_contiguous else np.ascontiguousarray(spins)
    P = np.zeros((R, 2, (L + 2) * W), dtype=np.uint64)
    bad = k["pack_planes"](work, P)
    if bad:
        raise ValueError(f"spins must contain only -1 and +1; {bad} sites hold other values")
    PH = np.zeros((1, 2, (L + 2) * W), dtype=np.uint64)
    PV = np.zeros((1, 2, (L + 2) * W), dtype=np.uint64)
    if k["pack_planes"](bonds_h.reshape(1, L, L), PH) or k["pack_planes"](bonds_v.reshape(1, L, L), PV):
        raise ValueError("bonds_h and bonds_v must contain only -1 and +1")
    BB = np.empty((2, 4, L * W), dtype=np.uint64)
    k["plane_bonds"](PH, PV, BB)
    T = np.ascontiguousarray(np.reshape(thr, (R, 10)), dtype=np.int64)
    k0, k1 = int(key[0]), int(key[1])
    chain32 = int(chain) & _MASK32
    rids = np.ascontiguousarray(replica_ids, dtype=np.int64) & _MASK32
    rows_per_chunk = max(1, min(L, _CHUNK_WORDS // W))
    if mode is None:
        mode = "replica" if _choose_by_replica(R, nb.get_num_threads()) else "rows"
    if mode == "replica":
        changed = np.zeros(R, dtype=np.int64)
        k["sweep_by_replica"](
            P, BB, T, L, k0, k1, rids, chain32, int(sweep0), int(n_sweeps), rows_per_chunk, int(nfast), changed
        )
    elif mode == "rows":
        # enough chunks for every thread: at least ~4 per thread in total
        want = 4 * nb.get_num_threads()
        per_rep = -(-want // R)
        rows_per_chunk = max(1, min(rows_per_chunk, L // per_rep if per_rep <= L else 1))
        nbpr = -(-L // rows_per_chunk)
        changed_blk = np.zeros(R * nbpr, dtype=np.int64)
        k["sweep_by_rows"](
            P, BB, T, L, k0, k1, rids, chain32, int(sweep0), int(n_sweeps), rows_per_chunk, int(nfast), changed_blk
        )
        changed = changed_blk.reshape(R, nbpr).sum(axis=1)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    k["unpack_planes"](P, work, UNPACK_TABLE)
    if work is not spins:
        spins[...] = work
    return changed
