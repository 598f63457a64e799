"""The numba kernels of posterior regularization's KL projection (see :mod:`pgmflow.tasks.lda.regularization`
for the maths and the NumPy reference, :func:`pgmflow.tasks.lda.regularization.project_kernel` for the entry
point). Plain module-level functions marked with :func:`pgmflow.tasks.backend.kernel`; compiled on first use
by :func:`pgmflow.tasks.backend.compile_kernels`, which binds each to its module global so kernels call
compiled callees.

- :func:`_wf_upper`, :func:`_wf_lower`, :func:`_wf_general`: water-filling of one row (caps, floors, both);
- :func:`_evaluate_nb`: the rows' projections and the dual's value and gradient at the levels ``t``;
- :func:`_direction_nb`, :func:`_path_nb`: the Newton direction and the projected path of the levels;
- :func:`_project_nb`: the whole projection of one document (the kernel the E-step calls).
"""

from __future__ import annotations

import math

import numpy as np

from pgmflow.tasks import backend

_TINY = 1e-300  # floor of p (an underflowed p_n(k) = 0 would make a seed on k infeasible)
_SUM_TOL = 1e-12  # tolerance of the feasibility checks on sums of masses
_T_FLOOR = 1e-200  # smallest level t_k the Newton path produces (below it q is 0 for all purposes)


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _wf_upper(prow, u, K, qrow, s0):
    """KL projection of one row onto ``{q <= u, sum q = 1}``: ``q = min(p s, u)``.

    ``h(s) = sum_k min(p_k s, u_k)`` is concave, increasing and piecewise linear, so Newton's
    method on ``h(s) = 1`` (the step ``s = (1 - sum_capped u) / sum_free p``) rises
    monotonically to the root from any point left of it, and one step from a point right of
    it lands left of it. Warm start ``s0`` (the row's previous scale; <= 0: cold start
    ``1 / sum p``). Returns s."""
    psum = 0.0
    for k in range(K):
        psum += prow[k]
    cold = not (s0 > 0.0 and s0 < np.inf)
    s = 1.0 / psum if cold else s0
    first = True
    for _ in range(K + 4):
        fixed = 0.0
        fp = 0.0
        for k in range(K):
            if prow[k] * s >= u[k]:
                fixed += u[k]
            else:
                fp += prow[k]
        if fp <= 0.0 or fixed >= 1.0:
            if not cold:  # warm start far right of the root: start again from the left
                s = 1.0 / psum
                cold = True
                first = True
                continue
            if fp <= 0.0:  # every entry on its cap (a pinned row)
                s = 0.0
                for k in range(K):
                    s = max(s, u[k] / prow[k])
                break
        s_new = (1.0 - fixed) / fp
        if s_new == s:
            break
        if s_new < s:
            if first:  # from the right of the root: one step lands left of it
                s = s_new
                first = False
                continue
            break  # stable classification (s_new < s only by rounding or a tie p s == u)
        s = s_new
        first = False
    for k in range(K):
        qrow[k] = min(prow[k] * s, u[k])
    return s


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _wf_lower(prow, lrow, K, qrow):
    """KL projection of one row onto ``{q >= l, sum q = 1}``: ``q = max(p s, l)``; the set on
    its bound only grows as ``s`` falls. Returns s."""
    fp = 0.0
    for k in range(K):
        fp += prow[k]
    s = 1.0 / fp
    for _ in range(K + 2):
        fixed = 0.0
        fp = 0.0
        for k in range(K):
            if lrow[k] > 0.0 and prow[k] * s <= lrow[k]:
                fixed += lrow[k]
            else:
                fp += prow[k]
        if fp <= 0.0:
            s = 0.0
            break
        s_new = (1.0 - fixed) / fp
        if s_new >= s:  # stable classification (s_new > s only by rounding or a tie p s == l)
            break
        s = s_new
    for k in range(K):
        qrow[k] = max(prow[k] * s, lrow[k])
    return s


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _wf_general(prow, lrow, u, K, qrow, X):
    """KL projection of one row onto ``{l <= q <= u, sum q = 1}`` (``X``: work [2K]); the
    breakpoint search of ``_waterfill_np``. Returns s."""
    m = 2 * K
    for k in range(K):
        X[k] = lrow[k] / prow[k]
        X[K + k] = u[k] / prow[k]
    for i in range(1, m):  # insertion sort (K is small)
        v = X[i]
        j = i - 1
        while j >= 0 and X[j] > v:
            X[j + 1] = X[j]
            j -= 1
        X[j + 1] = v
    jj = m - 1
    hj = 0.0
    for j in range(m):
        h = 0.0
        for k in range(K):
            v = prow[k] * X[j]
            v = max(v, lrow[k])
            v = min(v, u[k])
            h += v
        hj = h
        if h >= 1.0:
            jj = j
            break
    hi = X[jj]
    lo_x = X[jj - 1] if jj > 0 else 0.0
    mid = 0.5 * (lo_x + hi)
    fixed = 0.0
    fp = 0.0
    for k in range(K):
        pm = prow[k] * mid
        if pm <= lrow[k]:
            fixed += lrow[k]
        elif pm >= u[k]:
            fixed += u[k]
        else:
            fp += prow[k]
    s = (1.0 - fixed) / fp if fp > 0.0 else hi
    if hj == 1.0:
        s = hi
    s = max(s, lo_x)
    s = min(s, hi)
    for k in range(K):
        v = prow[k] * s
        v = max(v, lrow[k])
        v = min(v, u[k])
        qrow[k] = v
    return s


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _evaluate_nb(p, c, t, logt, sidx, lo_s, q, s, cap8, S, D, cF, M, X, s_warm):
    """Water-fill every row for levels t; fills q, s, cap8 (1: on the level), S, D, c/F~, M
    and returns G (inf for an invalid t). Mirrors ``_evaluate_np``."""
    N, K = p.shape
    tot = 0.0
    for k in range(K):
        if not math.isfinite(t[k]) or t[k] <= 0.0:
            return np.inf
        tot += min(t[k], 1.0)
    if tot < 1.0 - 1e-12:
        return np.inf
    for k in range(K):
        S[k] = 0.0
        D[k] = 0.0
        M[k] = 0.0
        logt[k] = math.log(t[k])
    G = 0.0
    for n in range(N):
        si = sidx[n]
        if si >= 0:
            sn = _wf_general(p[n], lo_s[si], t, K, q[n], X)
        else:
            sn = _wf_upper(p[n], t, K, q[n], s_warm[n])
        if not math.isfinite(sn):
            return np.inf
        s[n] = sn
        ls = math.log(sn) if sn > 0.0 else -np.inf  # s = 0: a row fixed by its seeds
        Ft = 0.0
        kl = 0.0
        for k in range(K):
            qk = q[n, k]
            lk = lo_s[si, k] if si >= 0 else 0.0
            lp = 0.0
            if p[n, k] * sn >= t[k] * (1 - 1e-12):
                cap8[n, k] = 1
                lp = math.log(p[n, k])  # logs only where needed (capped or seeded entries)
                b = lp + ls - logt[k]
                b = max(b, 0.0)
                S[k] += c[n] * b
                D[k] += c[n]
            else:
                cap8[n, k] = 0
                if not (lk > 0.0 and qk <= lk):
                    Ft += qk - lk
            if qk > 0.0:
                if cap8[n, k] == 1:
                    kl += qk * ((logt[k] if qk == t[k] else math.log(qk)) - lp)
                elif si >= 0:
                    kl += qk * math.log(qk / p[n, k])
                else:
                    kl += qk * ls
            M[k] = max(M[k], qk)
        cF[n] = c[n] / max(Ft, 1e-12)
        G += c[n] * kl
    return G


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _direction_nb(t, S, D, cap8, cF, L, fixed, M, H, Hs, idx, rows_c, sc, va, vb, pinned, at_bound, no_release, d):
    """Newton direction (mirrors ``_newton_direction_np``); writes d, returns (theta, n_free)."""
    N, K = cap8.shape
    for i in range(K):
        for j in range(K):
            H[i, j] = 0.0
    for n in range(N):
        m = 0
        for k in range(K):
            if cap8[n, k] == 1:
                rows_c[m] = k
                m += 1
        w = cF[n]
        for i in range(m):
            ki = rows_c[i]
            for j in range(m):
                H[ki, rows_c[j]] += w
    for k in range(K):
        H[k, k] += D[k] / t[k]
    r = 0.0
    for k in range(K):
        d[k] = 0.0
        if fixed[k]:
            d[k] = M[k] - t[k]
            r -= d[k]
        at_bound[k] = (not fixed[k]) and L[k] > 0.0 and t[k] <= L[k] * (1 + 1e-12)
        pinned[k] = at_bound[k]
        no_release[k] = False
    theta = 0.0
    for _ in range(2 * K + 2):
        m = 0
        for k in range(K):
            if not fixed[k]:
                d[k] = 0.0
                if not pinned[k]:
                    idx[m] = k
                    m += 1
        if m == 0:
            any_rel = False
            for k in range(K):
                if pinned[k] and not no_release[k] and S[k] > 0.0:
                    any_rel = True
            if r > 0.0 and any_rel:
                for k in range(K):
                    if pinned[k] and not no_release[k] and S[k] > 0.0:
                        pinned[k] = False
                continue
            return theta, 0
        for i in range(m):
            sc[i] = 1.0 / math.sqrt(max(H[idx[i], idx[i]], 1e-300))
        ok = False
        ridge = 1e-14
        while not ok:
            for i in range(m):
                for j in range(m):
                    Hs[i, j] = H[idx[i], idx[j]] * sc[i] * sc[j]
                Hs[i, i] += ridge
                va[i] = sc[i] * S[idx[i]]
                vb[i] = sc[i]
            # Cholesky factorisation of Hs (in place) and two triangular solves (va, vb)
            ok = True
            for j in range(m):
                v = Hs[j, j]
                for k in range(j):
                    v -= Hs[j, k] * Hs[j, k]
                if not v > 0.0:
                    ok = False
                    break
                v = math.sqrt(v)
                Hs[j, j] = v
                for i in range(j + 1, m):
                    w = Hs[i, j]
                    for k in range(j):
                        w -= Hs[i, k] * Hs[j, k]
                    Hs[i, j] = w / v
            if ok:
                for i in range(m):
                    w1 = va[i]
                    w2 = vb[i]
                    for k in range(i):
                        w1 -= Hs[i, k] * va[k]
                        w2 -= Hs[i, k] * vb[k]
                    va[i] = w1 / Hs[i, i]
                    vb[i] = w2 / Hs[i, i]
                for i in range(m - 1, -1, -1):
                    w1 = va[i]
                    w2 = vb[i]
                    for k in range(i + 1, m):
                        w1 -= Hs[k, i] * va[k]
                        w2 -= Hs[k, i] * vb[k]
                    va[i] = w1 / Hs[i, i]
                    vb[i] = w2 / Hs[i, i]
            ridge *= 100.0
            if ridge > 1.0:
                break
        if not ok:
            for k in range(K):
                d[k] = np.nan
            return np.nan, m
        sa = 0.0
        sb = 0.0
        for i in range(m):
            va[i] *= sc[i]
            vb[i] *= sc[i]
            sa += va[i]
            sb += vb[i]
        theta = (sa - r) / sb
        for i in range(m):
            d[idx[i]] = va[i] - theta * vb[i]
        changed = False
        for k in range(K):
            if at_bound[k] and not pinned[k] and d[k] < 0.0:
                pinned[k] = True
                no_release[k] = True
                changed = True
        if changed:
            continue
        for k in range(K):
            if pinned[k] and not no_release[k] and S[k] > theta * (1 + 1e-12) + 1e-300:
                pinned[k] = False
                changed = True
        if changed:
            continue
        break
    nf = 0
    for k in range(K):
        if not fixed[k] and not pinned[k]:
            nf += 1
    return theta, nf


@backend.kernel(cache=True, nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _path_nb(t, d, a, L, slack, cap, tn, lm):
    """Point at step a along d (mirrors ``_path_np``), written to tn."""
    K = t.shape[0]
    lmax = -np.inf
    n_mult = 0
    sum_add = 0.0
    sum_Lm = 0.0
    for k in range(K):
        add = slack[k] or (L[k] > 0.0 and d[k] < 0.0)
        if add:
            f = min(a, 1.0) if slack[k] else a
            v = t[k] + f * d[k]
            tn[k] = max(v, max(L[k], _T_FLOOR))
            sum_add += tn[k]
            lm[k] = np.nan
        else:
            e = a * d[k] / t[k]
            e = min(max(e, -700.0), 700.0)
            lm[k] = math.log(t[k]) + e
            lmax = max(lmax, lm[k])
            n_mult += 1
            sum_Lm += L[k]
    if n_mult > 0:
        room = cap - sum_add - sum_Lm
        scaleL = math.exp(min(-lmax, 700.0))
        tot = 0.0
        for k in range(K):
            if not math.isnan(lm[k]):
                ex = math.exp(lm[k] - lmax) - L[k] * scaleL
                ex = max(ex, 0.0)
                lm[k] = ex  # reuse as storage of ex
                tot += ex
        for k in range(K):
            add = slack[k] or (L[k] > 0.0 and d[k] < 0.0)
            if not add:
                v = L[k] + (lm[k] * (room / tot) if tot > 0.0 else 0.0)
                tn[k] = max(v, max(L[k], _T_FLOOR))


@backend.kernel(cache=True, nogil=True)
def _project_nb(p, counts, word_ids, seed_word_ids, seed_topics, seed_mass, cap, max_iter, tol, q_out):
    N, K = p.shape
    if N == 0 or K == 0:
        return 0
    cap_on = cap > 0.0 and math.isfinite(cap)
    # seeds of the document: sidx[n] = row of lo_s for word n (-1 if unseeded), lo_s [., K]
    S_n = seed_word_ids.shape[0]
    # seeded rows: binary search of each word id in the sorted seed ids
    n_seeded = 0
    sidx = np.empty(N, np.int64)
    for n in range(N):
        sidx[n] = -1
    j0s = np.zeros(N, np.int64)
    j1s = np.zeros(N, np.int64)
    if S_n > 0:
        for n in range(N):
            w = word_ids[n]
            lo_i = 0
            hi_i = S_n
            while lo_i < hi_i:
                mid = (lo_i + hi_i) >> 1
                if seed_word_ids[mid] < w:
                    lo_i = mid + 1
                else:
                    hi_i = mid
            j0 = lo_i
            j1 = j0
            while j1 < S_n and seed_word_ids[j1] == w:
                j1 += 1
            if j1 > j0:
                sidx[n] = n_seeded
                j0s[n] = j0
                j1s[n] = j1
                n_seeded += 1
    lo_s = np.zeros((max(n_seeded, 1), K))
    for n in range(N):
        si = sidx[n]
        if si >= 0:
            for j in range(j0s[n], j1s[n]):
                k = seed_topics[j]
                if 0 <= k < K and seed_mass[j] > lo_s[si, k]:
                    lo_s[si, k] = seed_mass[j]

    # fast path: p satisfies everything -> q = p
    viol = False
    for n in range(N):
        si = sidx[n]
        if si >= 0:
            for k in range(K):
                if p[n, k] < lo_s[si, k]:
                    viol = True
    used = 0.0
    if cap_on:
        for k in range(K):
            mx = 0.0
            for n in range(N):
                mx = max(mx, p[n, k])
            used += mx
    if not viol and (not cap_on or used <= cap):
        for n in range(N):
            for k in range(K):
                q_out[n, k] = p[n, k]
        return 0

    # seeds only: rows are independent
    pf = np.empty((N, K))
    for n in range(N):
        for k in range(K):
            pf[n, k] = max(p[n, k], _TINY)
    for n in range(N):
        si = sidx[n]
        rv = False
        if si >= 0:
            for k in range(K):
                if p[n, k] < lo_s[si, k]:
                    rv = True
        if rv:
            _wf_lower(pf[n], lo_s[si], K, q_out[n])
        else:
            for k in range(K):
                q_out[n, k] = p[n, k]
    if not cap_on:
        return 0
    L = np.zeros(K)
    M0 = np.zeros(K)
    for n in range(N):
        si = sidx[n]
        for k in range(K):
            M0[k] = max(M0[k], q_out[n, k])
            if si >= 0 and lo_s[si, k] > L[k]:
                L[k] = lo_s[si, k]
    sumM = 0.0
    sumL = 0.0
    for k in range(K):
        sumM += M0[k]
        sumL += L[k]
    if sumM <= cap:
        return 0

    # the cap binds
    capE = max(cap, 1.0)
    capE = max(capE, sumL)
    X = np.empty(2 * K)
    if capE - sumL <= _SUM_TOL * capE:  # levels forced: t = L
        zero_k = np.zeros(K)
        for n in range(N):
            si = sidx[n]
            if si >= 0:
                _wf_general(pf[n], lo_s[si], L, K, q_out[n], X)
            else:
                # rows without seeds: q <= L (unseeded topics get 0)
                _wf_general(pf[n], zero_k, L, K, q_out[n], X)
        return 0
    if capE <= 1.0 + _SUM_TOL:  # cap == 1: every row equals t, the projected geometric mean
        g = np.zeros(K)
        csum = 0.0
        for n in range(N):
            csum += counts[n]
            for k in range(K):
                g[k] += counts[n] * math.log(pf[n, k])
        gm = -np.inf
        for k in range(K):
            g[k] /= csum
            gm = max(gm, g[k])
        gs = 0.0
        for k in range(K):
            g[k] = math.exp(g[k] - gm)
            gs += g[k]
        for k in range(K):
            g[k] /= gs
        trow = np.empty(K)
        ones = np.ones(K)
        _wf_general(g, L, ones, K, trow, X)
        for n in range(N):
            for k in range(K):
                q_out[n, k] = trow[k]
        return 0

    # Newton on the levels t (mirrors _newton_np; a state machine with a single call of
    # _evaluate_nb, which keeps the compiled code small)
    qb = np.empty((3, N, K))
    sb = np.empty((3, N))
    cb = np.empty((3, N, K), np.int8)
    Sb = np.empty((3, K))
    Db = np.empty((3, K))
    Mb = np.empty((3, K))
    cFb = np.empty((3, N))
    kw = np.empty((6, K))  # logt, sc, va, vb, d, lm
    logt = kw[0]
    sc = kw[1]
    va = kw[2]
    vb = kw[3]
    d = kw[4]
    lm = kw[5]
    tt = np.empty((3, K))  # t (accepted), tn (trial), tb (best trial)
    t = tt[0]
    tn = tt[1]
    tb = tt[2]
    HH = np.empty((2, K, K))
    ii = np.empty((2, K), np.int64)
    bb = np.zeros((5, K), np.bool_)  # pinned, at_bound, no_release, fixed, slack
    pinned = bb[0]
    at_bound = bb[1]
    no_release = bb[2]
    fixed = bb[3]
    slack = bb[4]
    csum = 0.0
    for n in range(N):
        csum += counts[n]
    frac = (capE - sumL) / (sumM - sumL)
    for k in range(K):
        tn[k] = max(L[k] + (M0[k] - L[k]) * frac, max(L[k], _T_FLOOR))
    for i in range(3):
        for n in range(N):
            sb[i, n] = 0.0  # cold start of the first water filling
    tol_t = max(1e-2 * tol, 1e-14)
    converged = False
    it = 0
    G = np.inf
    G_prev = np.inf
    n_stag = 0
    cur = 0
    tri = 1
    best = 2
    G_best = np.inf
    al = 1.0
    amax = 1.0
    a_lim = np.inf
    slope = 0.0
    resid = 0.0
    step = 0.0
    n_try = 0
    # phases: 0 first point, 1 final small step, 2 backtracking, 3 extension
    phase = 0
    while True:
        Gt = _evaluate_nb(
            pf, counts, tn, logt, sidx, lo_s, qb[tri], sb[tri], cb[tri], Sb[tri], Db[tri], cFb[tri], Mb[tri], X, sb[cur]
        )
        accept = False
        if phase == 0:
            accept = True
            G_best = Gt
            best = tri
            for k in range(K):
                tb[k] = tn[k]
        elif phase == 1:
            if Gt <= G:
                cur, tri = tri, cur
                G = Gt
                for k in range(K):
                    t[k] = tn[k]
            break
        elif phase == 2:
            if Gt <= G + 1e-4 * al * slope:
                slope_n = 0.0
                for k in range(K):
                    slope_n -= Sb[tri, k] * d[k]
                best, tri = tri, best
                G_best = Gt
                for k in range(K):
                    tb[k] = tn[k]
                if al == 1.0 and slope_n <= 0.5 * slope and 2.0 * al <= a_lim:
                    # the quadratic model overestimates the curvature: extend the step
                    phase = 3
                    n_try = 0
                    _path_nb(t, d, 2.0 * al, L, fixed, capE, tn, lm)
                    continue
                accept = True
            else:
                al *= 0.5
                n_try += 1
                if n_try >= 60:
                    converged = resid <= 1e-6
                    break
                _path_nb(t, d, al, L, fixed, capE, tn, lm)
                continue
        else:  # phase == 3
            if Gt < G_best:
                al *= 2.0
                best, tri = tri, best
                G_best = Gt
                for k in range(K):
                    tb[k] = tn[k]
                n_try += 1
                if n_try < 60 and 2.0 * al <= a_lim:
                    _path_nb(t, d, 2.0 * al, L, fixed, capE, tn, lm)
                    continue
            accept = True
        if accept:
            G_prev = G
            moved = 0.0
            for k in range(K):
                moved = max(moved, abs(tb[k] - t[k]))
            for k in range(K):
                t[k] = tb[k]
            cur, best = best, cur
            G = G_best
            if phase != 0:
                if G_prev - G <= 2e-15 * (abs(G) + csum):
                    n_stag += 1
                else:
                    n_stag = 0
                if n_stag >= 3:
                    converged = moved <= tol_t
                    break
            if cur == tri:
                tri = best
        # new Newton direction at the accepted point
        if it >= max_iter:
            break
        it += 1
        any_slack = False
        for k in range(K):
            fixed[k] = Db[cur, k] == 0.0
            slack[k] = fixed[k] and Mb[cur, k] < t[k] * (1 - 1e-12)
            any_slack = any_slack or slack[k]
        theta, nfree = _direction_nb(
            t,
            Sb[cur],
            Db[cur],
            cb[cur],
            cFb[cur],
            L,
            fixed,
            Mb[cur],
            HH[0],
            HH[1],
            ii[0],
            ii[1],
            sc,
            va,
            vb,
            pinned,
            at_bound,
            no_release,
            d,
        )
        if nfree == 0 and not any_slack:
            converged = True
            break
        finite = True
        step = 0.0
        slope = 0.0
        a_lim = np.inf
        for k in range(K):
            finite = finite and math.isfinite(d[k])
            step = max(step, abs(d[k]))
            slope -= Sb[cur, k] * d[k]
            if d[k] < 0.0 and not fixed[k] and L[k] > 0.0:
                a_lim = min(a_lim, (t[k] - L[k]) / -d[k])
        if not finite:
            break
        amax = min(1.0, a_lim)
        resid = 0.0
        for k in range(K):
            if not fixed[k] and (L[k] == 0.0 or t[k] > L[k] * (1 + 1e-12) or d[k] != 0.0):
                resid = max(resid, abs(Sb[cur, k] - theta))
        resid /= abs(theta) + csum
        stagnant = G_prev - G <= 2e-15 * (abs(G) + csum)
        # the three buffers: cur (accepted), tri (next trial), best (best trial so far)
        tri = (cur + 1) % 3
        best = (cur + 2) % 3
        if slope >= 0.0 or (step <= tol_t and not any_slack and (resid <= 1e-6 or stagnant)):
            converged = step <= tol_t or resid <= 1e-6
            if slope < 0.0:
                phase = 1
                _path_nb(t, d, amax, L, fixed, capE, tn, lm)
                continue
            break
        phase = 2
        al = amax
        n_try = 0
        _path_nb(t, d, al, L, fixed, capE, tn, lm)
    for n in range(N):
        for k in range(K):
            q_out[n, k] = qb[cur, n, k]
    return it if converged else max_iter
