"""The CPU sweep of :mod:`~pgmflow.tasks.tempering.mrf_kernels` (the spec is that module's docstring): replicas as
vector lanes, spins as bits, one Philox group of four nodes per lane loop.

Replicas are independent, so the kernel sweeps them in blocks of at most 64 replicas: threads over blocks
(``_sweeps``: the replicas shared evenly between the threads) when every thread gets a block of 64 lanes, else
one block after another with each colour's Philox groups shared between the threads (``_sweep_nodes``: a colour's
nodes do not neighbour each other, so the shares are independent; 64 lanes in one thread vectorise better than 32
in each of two: up to 1.2x on two cores, not in every run, ``benchmarks/tempering_mrf_plans.py``). A block's
spins are held as bits: ``xw[i]`` (uint64) has bit ``q`` set iff lane ``q``'s spin at node ``i`` is +1 (row
``n``: all ones, the padding neighbour). Each Philox group
(the four nodes ``4 g .. 4 g + 3`` of a colour, which share one Philox block per replica) is one loop over the
lanes (``_lanes``) that draws the block once and updates its four nodes: per node the local field's last one to
four neighbours (from the neighbours' words, loop-invariant, tested against the lane's bit; ``J x`` as the
select ``J`` or ``-J``; padded with zero couplings on row ``n``), ``z``, the certified fast path
(``_fast_decision``) and the new spin, collected as a bit in a word, so the loop stores nothing: no runtime
alias checks, one set-up per group, and the lanes vectorise. The neighbours before the last one to four (a node
of degree above 4) are summed first, four a loop in CSR order, into a field row (``_presum``); a node without
them starts the row at ``h_i``. No node of a colour neighbours another, so a group's words do not change while
it is updated. A lane the fast path cannot certify (``|D| <= margin``, its bit set in a second word) is decided
again by the spec itself (``_fixup``: the field in CSR order and ``_threshold``). Spins changed are counted from
each node's word of changes, per colour (``_count``). Each lane's field and ``z`` are the spec's, in the spec's
order, so a replica's bits do not depend on the block it is swept in.
"""

from __future__ import annotations

import numpy as np

from pgmflow.tasks import backend, philox

# bound by mrf_kernels._kernels() (numba.prange, Philox's dispatcher and mrf_kernels' decision kernels)
prange = range
_philox = philox._philox4x32
_fast_decision = None
_threshold = None

_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)


@backend.kernel(cache=True, nogil=True, inline="always")
def _lane(bit, f0, W, w, J, ai, bq, cq, metro, uf):
    """D of node slot w at the lane with bit ``bit`` (see _lanes): W [4, 5] the neighbours' and its own word,
    J [4, 6] the last four couplings (and the two reference fields); f0 the field before them, ai the lane's
    reference field."""
    fq = (
        f0
        + (J[w, 0] if (W[w, 0] & bit) != _ZERO else -J[w, 0])
        + (J[w, 1] if (W[w, 1] & bit) != _ZERO else -J[w, 1])
        + (J[w, 2] if (W[w, 2] & bit) != _ZERO else -J[w, 2])
        + (J[w, 3] if (W[w, 3] & bit) != _ZERO else -J[w, 3])
    )
    s = 1.0 if (W[w, 4] & bit) != _ZERO else -1.0
    return _fast_decision(bq * fq + cq * ai, s, bq, metro, uf)


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _lanes(Rp, g, ctr1, ridb, chain32, key0, key1, bb, cb, legb, f, W, J, metro, margin, res):
    """One Philox group over the lanes: res[:4] its four node slots' new-spin words, res[4:] their uncertain-lane
    words. The loop stores nothing (no runtime alias checks); the reference fields are read before it (a select
    between two loads inside it would become a gather)."""
    a00, a01, a02, a03 = J[0, 4], J[1, 4], J[2, 4], J[3, 4]
    a10, a11, a12, a13 = J[0, 5], J[1, 5], J[2, 5], J[3, 5]
    n0 = n1 = n2 = n3 = _ZERO
    m0 = m1 = m2 = m3 = _ZERO
    for q in range(Rp):
        w0, w1, w2, w3 = _philox(np.uint64(g), ctr1, ridb[q], chain32, key0, key1)
        bit = _ONE << np.uint64(q)
        bq = bb[q]
        cq = cb[q]
        lg = legb[q] != 0
        D0 = _lane(bit, f[0, q], W, 0, J, a10 if lg else a00, bq, cq, metro, np.float64(w0))
        D1 = _lane(bit, f[1, q], W, 1, J, a11 if lg else a01, bq, cq, metro, np.float64(w1))
        D2 = _lane(bit, f[2, q], W, 2, J, a12 if lg else a02, bq, cq, metro, np.float64(w2))
        D3 = _lane(bit, f[3, q], W, 3, J, a13 if lg else a03, bq, cq, metro, np.float64(w3))
        n0 |= bit if D0 < 0.0 else _ZERO
        n1 |= bit if D1 < 0.0 else _ZERO
        n2 |= bit if D2 < 0.0 else _ZERO
        n3 |= bit if D3 < 0.0 else _ZERO
        m0 |= bit if abs(D0) <= margin else _ZERO
        m1 |= bit if abs(D1) <= margin else _ZERO
        m2 |= bit if abs(D2) <= margin else _ZERO
        m3 |= bit if abs(D3) <= margin else _ZERO
    res[0], res[1], res[2], res[3] = n0, n1, n2, n3
    res[4], res[5], res[6], res[7] = m0, m1, m2, m3


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _lanes1(Rp, g, w, ctr1, ridb, chain32, key0, key1, bb, cb, legb, f, W, J, metro, margin, res):
    """_lanes for node slot w alone (a colour's last group when it has fewer than four nodes): res[w], res[4 + w]."""
    a0 = J[w, 4]
    a1 = J[w, 5]
    nw = _ZERO
    mw = _ZERO
    for q in range(Rp):
        u4 = _philox(np.uint64(g), ctr1, ridb[q], chain32, key0, key1)
        u = u4[0] if w == 0 else (u4[1] if w == 1 else u4[2])  # w < 3
        bit = _ONE << np.uint64(q)
        D = _lane(bit, f[w, q], W, w, J, a1 if legb[q] != 0 else a0, bb[q], cb[q], metro, np.float64(u))
        nw |= bit if D < 0.0 else _ZERO
        mw |= bit if abs(D) <= margin else _ZERO
    res[w] = nw
    res[4 + w] = mw


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _presum(xw, i, w, Rp, h, indptr, nbr, Jn, f, W, J, a, G1):
    """Node i in slot w: f[w] = h_i plus its neighbours before the last one to four (four a loop, CSR order);
    W[w], J[w]: the last ones' words and couplings (padded: row n, J = 0), its own word, its reference fields."""
    n = xw.shape[0] - 1
    e0 = indptr[i]
    e1 = indptr[i + 1]
    full = e0 + (e1 - e0 - 1) // 4 * 4 if e1 > e0 else e0  # groups of 4 before the last one
    hi_ = h[i]
    for q in range(Rp):
        f[w, q] = hi_
    for e in range(e0, full, 4):
        x0, x1, x2, x3 = xw[nbr[e]], xw[nbr[e + 1]], xw[nbr[e + 2]], xw[nbr[e + 3]]
        J0, J1, J2, J3 = Jn[e], Jn[e + 1], Jn[e + 2], Jn[e + 3]
        for q in range(Rp):
            bit = _ONE << np.uint64(q)
            f[w, q] = (
                f[w, q]
                + (J0 if (x0 & bit) != _ZERO else -J0)
                + (J1 if (x1 & bit) != _ZERO else -J1)
                + (J2 if (x2 & bit) != _ZERO else -J2)
                + (J3 if (x3 & bit) != _ZERO else -J3)
            )
    m = e1 - full
    for k in range(4):
        W[w, k] = xw[nbr[full + k]] if m > k else xw[n]
        J[w, k] = Jn[full + k] if m > k else 0.0
    W[w, 4] = xw[i]
    J[w, 4] = a[0, i]
    J[w, 5] = a[G1, i]


@backend.kernel(cache=True, nogil=True, inline="always")
def _fixup(xw, i, q, uq, new, bq, legq, a, h, indptr, nbr, Jn, metro):
    """Lane q of node i decided by the spec itself (its field in CSR order, ``_threshold``): the new word."""
    bit = _ONE << np.uint64(q)
    f = h[i]
    for e in range(indptr[i], indptr[i + 1]):
        f += Jn[e] * (1.0 if (xw[nbr[e]] & bit) != _ZERO else -1.0)
    zq = bq * f + (1.0 - bq) * a[legq, i]
    s = 1.0 if (xw[i] & bit) != _ZERO else -1.0
    return (new | bit) if uq < _threshold(zq, s, bq, metro) else (new & ~bit)


@backend.kernel(cache=True, nogil=True, inline="always")
def _count(chg, m, Rp, cnt):
    """cnt[q] += how many of the words chg[:m] have bit q set (the longer loop inside)."""
    if m < Rp:
        for k in range(m):
            c = chg[k]
            for q in range(Rp):
                cnt[q] += np.int64((c >> np.uint64(q)) & _ONE)
        return
    for q in range(Rp):
        sh = np.uint64(q)
        s = 0
        for k in range(m):
            s += np.int64((chg[k] >> sh) & _ONE)
        cnt[q] += s


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _settle(xw, p0, k, nw, Rp, sites, ctx, res, chg, bb, ridb, legb, h, a, indptr, nbr, Jn, metro):
    """Group k's first nw nodes: lanes left uncertain decided by the spec (``_fixup``), the new words in xw,
    the change words in chg. Returns how many lanes the fallback decided."""
    ctr1 = np.uint64(ctx[1] & 0xFFFFFFFF)
    nfb = 0
    for w in range(nw):
        i = sites[p0 + 4 * k + w]
        new = res[w]
        if res[4 + w] != _ZERO:  # rare (at most 3.6e-4 of the lanes): those lanes by the spec itself
            for q in range(Rp):
                if (res[4 + w] >> np.uint64(q)) & _ONE:
                    nfb += 1
                    u4 = _philox(np.uint64(k), ctr1, ridb[q], ctx[4], ctx[2], ctx[3])
                    uq = u4[0] if w == 0 else (u4[1] if w == 1 else (u4[2] if w == 2 else u4[3]))
                    new = _fixup(xw, i, q, np.int64(uq), new, bb[q], legb[q], a, h, indptr, nbr, Jn, metro)
        chg[4 * k + w] = xw[i] ^ new
        xw[i] = new
    return nfb


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _group(xw, p0, k, Rp, sites, ctx, f, W, J, res, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin):
    """Philox group k (four nodes) of the colour whose nodes start at sites[p0] (ctx: its nodes' count,
    t * C + c, key, chain): its nodes updated in xw, their change words in chg; returns the lanes left to the
    fallback. Inlined into the sweep's loop, with no other call in that loop: the arrays' reference counts are
    then left alone (a call there, even one not taken, brings NRT_incref/decref calls into every group)."""
    cnt_c, ctr, key0, key1, chain32 = ctx
    G1 = a.shape[0] - 1
    for w in range(4):
        _presum(xw, sites[p0 + 4 * k + w], w, Rp, h, indptr, nbr, Jn, f, W, J, a, G1)
    ctr1 = np.uint64(ctr & 0xFFFFFFFF)
    if metro:  # a constant in each copy of the loop: the heat bath's has no Metropolis selects
        _lanes(Rp, k, ctr1, ridb, chain32, key0, key1, bb, cb, legb, f, W, J, True, margin, res)
    else:
        _lanes(Rp, k, ctr1, ridb, chain32, key0, key1, bb, cb, legb, f, W, J, False, margin, res)
    return _settle(xw, p0, k, 4, Rp, sites, ctx, res, chg, bb, ridb, legb, h, a, indptr, nbr, Jn, metro)


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _partial(xw, p0, k, Rp, sites, ctx, f, W, J, res, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin):
    """_group for a colour's last group when it has one to three nodes (a dense graph's every group): its nodes
    one by one (``_lanes1``)."""
    cnt_c, ctr, key0, key1, chain32 = ctx
    nw = cnt_c - 4 * k
    G1 = a.shape[0] - 1
    ctr1 = np.uint64(ctr & 0xFFFFFFFF)
    for w in range(nw):
        _presum(xw, sites[p0 + 4 * k + w], w, Rp, h, indptr, nbr, Jn, f, W, J, a, G1)
        _lanes1(Rp, k, w, ctr1, ridb, chain32, key0, key1, bb, cb, legb, f, W, J, metro, margin, res)
    return _settle(xw, p0, k, nw, Rp, sites, ctx, res, chg, bb, ridb, legb, h, a, indptr, nbr, Jn, metro)


@backend.kernel(cache=True, nogil=True, error_model="numpy")
def _groups(xw, lo, k0, k1, Rp, sites, ctx, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin):
    """Philox groups k0 .. k1 - 1 of the colour whose nodes start at sites[lo] (``_group`` each); returns the
    lanes left to the fallback. Not inlined: called once per colour (or per thread's share of a colour), so
    its call's reference counting is paid there, not per group. Its scratch is its own (threads sharing a
    colour write no common cache line but at the edges of their shares)."""
    f = np.empty((4, Rp))
    W = np.empty((4, 5), dtype=np.uint64)
    J = np.empty((4, 6))
    res = np.empty(8, dtype=np.uint64)
    unc = 0
    for k in range(k0, k1):
        unc += _group(
            xw, lo, k, Rp, sites, ctx, f, W, J, res, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin
        )
    return unc


@backend.kernel(cache=True, nogil=True, error_model="numpy")
def _tail(xw, lo, m, Rp, sites, ctx, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin):
    """A colour of m nodes: its last group when it has one to three nodes (``_partial``, with its own scratch);
    returns the lanes left to the fallback (0 without one). Not inlined: one compiled copy serves both sweeps
    (and keeps the parallel one quick to compile)."""
    if m % 4 == 0:
        return 0
    f = np.empty((4, Rp))
    W = np.empty((4, 5), dtype=np.uint64)
    J = np.empty((4, 6))
    res = np.empty(8, dtype=np.uint64)
    return _partial(
        xw, lo, m // 4, Rp, sites, ctx, f, W, J, res, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin
    )


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _block_start(x, r0, r1, b, rid, leg):
    """A block's state (module docstring): its spins as words ``xw`` (row n: all ones; padding lanes +1) and the
    lanes' levels, ``1 - b``, replica ids and legs, padded to whole groups of 8 lanes (padding lanes are swept,
    never read)."""
    n = x.shape[1]
    Rb = r1 - r0
    Rp = (Rb + 7) // 8 * 8
    xw = np.zeros(n + 1, dtype=np.uint64)
    xw[n] = _ALL
    for q in range(Rp):
        bit = _ONE << np.uint64(q)
        if q < Rb:
            for i in range(n):
                xw[i] |= bit if x[r0 + q, i] > 0 else _ZERO
        else:
            for i in range(n):
                xw[i] |= bit
    bb = np.ones(Rp)
    ridb = np.zeros(Rp, dtype=np.uint64)
    legb = np.zeros(Rp, dtype=np.int64)
    for q in range(Rb):
        bb[q] = b[r0 + q]
        ridb[q] = rid[r0 + q]
        legb[q] = leg[r0 + q]
    return xw, bb, 1.0 - bb, ridb, legb


@backend.kernel(cache=True, nogil=True, inline="always", error_model="numpy")
def _block_end(x, r0, r1, xw, cnt, out):
    """The block's words back into x (int8 +-1), its change counts added to out."""
    n = x.shape[1]
    for q in range(r1 - r0):
        out[r0 + q] += cnt[q]
        sh = np.uint64(q)
        for i in range(n):
            x[r0 + q, i] = np.int8(1) if (xw[i] >> sh) & _ONE else np.int8(-1)


@backend.kernel(cache=True, nogil=True, error_model="numpy")  # not inlined: parfors' array analysis fails on it
def _sweep_block(x, r0, r1, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb):
    """run = (chain32, sweep0, n_sweeps) sweeps of replicas r0 .. r1 - 1 of x, in place (module docstring);
    out[r] += spins changed, nfb[r0] += lane updates that the fast path left to the exact threshold."""
    chain32, sweep0, n_sweeps = run
    n = x.shape[1]
    xw, bb, cb, ridb, legb = _block_start(x, r0, r1, b, rid, leg)
    Rp = bb.shape[0]
    C = colptr.shape[0] - 1
    chg = np.empty(n + 4, dtype=np.uint64)
    cnt = np.zeros(Rp, dtype=np.int64)
    unc_total = 0
    for t in range(sweep0, sweep0 + n_sweeps):
        for c in range(C):
            lo = colptr[c]
            m = colptr[c + 1] - lo
            ctx = (m, t * C + c, key[0], key[1], chain32)
            unc_total += _share(  # the whole colour as one share (_sweep_nodes's, with one thread)
                xw,
                lo,
                m,
                np.int64(0),
                np.int64(1),
                Rp,
                sites,
                ctx,
                chg,
                cnt,
                bb,
                cb,
                ridb,
                legb,
                h,
                a,
                indptr,
                nbr,
                Jn,
                metro,
                margin,
            )
    nfb[r0] += unc_total
    _block_end(x, r0, r1, xw, cnt, out)


@backend.kernel(cache=True, nogil=True, parallel=True, error_model="numpy")
def _sweep_nodes(x, r0, r1, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb, nch):
    """_sweep_block with each colour's groups shared between nch threads (contiguous shares, the last one with
    the colour's partial group; a colour's nodes do not neighbour each other, so the shares are independent and
    the bits are _sweep_block's), each counting its own share's changes: for fewer blocks than threads, where
    splitting the replicas would leave too few lanes to vectorise well."""
    chain32, sweep0, n_sweeps = run
    n = x.shape[1]
    xw, bb, cb, ridb, legb = _block_start(x, r0, r1, b, rid, leg)
    Rp = bb.shape[0]
    C = colptr.shape[0] - 1
    chg = np.empty(n + 4, dtype=np.uint64)
    cnts = np.zeros((nch, Rp + 8), dtype=np.int64)  # a row per share, 64 bytes apart at least
    unc = np.zeros((nch, 8), dtype=np.int64)
    for t in range(sweep0, sweep0 + n_sweeps):
        for c in range(C):
            lo = colptr[c]
            m = colptr[c + 1] - lo
            ctx = (m, t * C + c, key[0], key[1], chain32)
            for ch in prange(nch):
                unc[ch, 0] += _share(  # ch as int64: parfors types the index both ways, two compiles of _share
                    xw,
                    lo,
                    m,
                    np.int64(ch),
                    nch,
                    Rp,
                    sites,
                    ctx,
                    chg,
                    cnts[ch],
                    bb,
                    cb,
                    ridb,
                    legb,
                    h,
                    a,
                    indptr,
                    nbr,
                    Jn,
                    metro,
                    margin,
                )
    cnt = np.zeros(Rp, dtype=np.int64)
    for ch in range(nch):
        cnt += cnts[ch, :Rp]
    nfb[r0] += unc[:, 0].sum()
    _block_end(x, r0, r1, xw, cnt, out)


@backend.kernel(cache=True, nogil=True, error_model="numpy")
def _share(xw, lo, m, ch, nch, Rp, sites, ctx, chg, cnt, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin):
    """Share ch of nch of a colour of m nodes (see _sweep_nodes): its groups, the partial group if it is the last
    share, its changes counted into cnt; returns the lanes left to the fallback."""
    ng = m // 4
    k0 = ng * ch // nch
    k1 = ng * (ch + 1) // nch
    unc = _groups(xw, lo, k0, k1, Rp, sites, ctx, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin)
    e = 4 * k1
    if ch == nch - 1:
        unc += _tail(xw, lo, m, Rp, sites, ctx, chg, bb, cb, ridb, legb, h, a, indptr, nbr, Jn, metro, margin)
        e = m
    _count(chg[4 * k0 : e], e - 4 * k0, Rp, cnt)
    return unc


@backend.kernel(cache=True, nogil=True, parallel=True, error_model="numpy")
def _sweeps(x, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb, block):
    """_sweep_block over blocks of ``block`` replicas, threads over blocks; out[r] += spins changed."""
    R = x.shape[0]
    nb = (R + block - 1) // block
    for ib in prange(nb):
        r0 = ib * block
        r1 = min(R, r0 + block)
        _sweep_block(x, r0, r1, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb)


@backend.kernel(cache=True, nogil=True, error_model="numpy")
def _sweeps_serial(x, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb, block):
    """_sweeps on the calling thread (small problems: no thread wake-ups)."""
    R = x.shape[0]
    for r0 in range(0, R, block):
        r1 = min(R, r0 + block)
        _sweep_block(x, r0, r1, b, h, a, leg, indptr, nbr, Jn, colptr, sites, key, rid, run, metro, margin, out, nfb)
