"""The local E-step of LDA for a batch of documents (Hoffman, Blei, Wang and Paisley 2013, Alg. 2;
the mean-field updates of Blei, Ng and Jordan 2003, "Latent Dirichlet allocation", JMLR 3, eqs. 6-7).

For a document with unique words ``w_n`` and counts ``c_n`` the mean-field updates are::

    phi_nk   ∝ exp(E[log theta_k] + E[log beta_{k,w_n}])          (token posteriors)
    gamma_k  = alpha_k + sum_n c_n phi_nk                         (q(theta) = Dir(gamma))

iterated from ``gamma = alpha + N_d / K`` until the mean absolute change of gamma falls below
``tol`` (or ``max_iter``). With ``A = exp(E[log theta])`` and ``B = exp(E[log beta])`` the
normaliser of ``phi_n`` is ``phinorm_n = sum_k A_k B_{k,w_n}``, so an iteration needs only
products (the phi matrix is never formed). The sufficient statistics of the batch are
``sstats_{k,w} = sum_d sum_{n: w_n = w} c_n phi_nk`` and the per-document bound is::

    sum_n c_n log phinorm_n + sum_k (alpha_k - gamma_k) E[log theta_k]
      + sum_k (lgamma(gamma_k) - lgamma(alpha_k)) + lgamma(sum alpha) - lgamma(sum gamma)

(``E_q[log p(w, z | theta, beta) + log p(theta) - log q(z) - log q(theta)]`` with phi at its
optimum). With posterior regularization the token posteriors are replaced each iteration by
their KL projection onto the constraint set (``pgmflow.tasks.lda.regularization``), and the bound uses
``log phinorm_n - KL(q_n || p_n)`` instead of ``log phinorm_n``.

Layout: topic-word arrays passed here are *word-major* ``[n_cols, K]`` over a sorted set of word
ids ``cols`` (only the columns the batch uses travel to a worker). Everything is float64, and a
document's result does not depend on which other documents share the batch, so statistics of
shards can be summed in any fixed order to the same bits.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.lda import pr_kernels as _pr_kernels
from pgmflow.tasks.lda import regularization as _regularization

__all__ = ["EStepResult", "digamma", "estep", "estep_numpy", "estep_xp"]
# exp(E[log beta]), the topic columns an E-step takes: pgmflow.tasks.lda.svi.exp_elog_beta (the driver computes it).


class EStepResult(NamedTuple):
    """What the E-step of one batch of documents returns."""

    sstats: np.ndarray  # [n_cols, K] sum over the batch of c_n phi_nk, word-major over ``cols``
    gamma: np.ndarray  # [n_docs, K] variational Dirichlet parameters of each document
    doc_bound: float  # sum over the batch of the per-document ELBO terms (see module docstring)
    n_tokens: float  # total word count of the batch
    iterations: int  # sum over documents of E-step iterations


def digamma(x: np.ndarray) -> np.ndarray:
    """The digamma function (the same series as the numba kernel), for x > 0."""
    return _kernels()["digamma_vec"](np.ascontiguousarray(x, dtype=np.float64).ravel()).reshape(np.shape(x))


def _local_ids(indices: np.ndarray, cols: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(cols, indices)
    if indices.size and (pos.max() >= cols.size or np.any(cols[np.minimum(pos, cols.size - 1)] != indices)):
        raise ValueError("the batch uses word ids that are not in cols")
    return pos.astype(np.int64)


def estep(
    indptr,
    indices,
    counts,
    docs,
    cols,
    exp_elog_beta,
    alpha,
    max_iter=100,
    tol=1e-3,
    pr=None,
    return_gamma=True,
    array_backend="numpy",
) -> EStepResult:
    """E-step of the documents ``docs`` (local row ids of the CSR arrays) against topic columns ``cols``.

    indptr [n+1], indices [nnz] (word ids), counts [nnz]: a CSR document-term shard.
    cols [C]: sorted word ids covering every word of the documents; exp_elog_beta [C, K].
    alpha [K]: the Dirichlet prior of theta. pr: a ``regularization.PRConfig`` or None.
    array_backend: ``numpy`` (the numba kernel) or ``cupy`` (:func:`estep_xp` on the GPU; with posterior
    regularization the numba kernel runs, as the projection has no GPU version).
    """
    docs = np.ascontiguousarray(docs, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    eeb = np.ascontiguousarray(exp_elog_beta, dtype=np.float64)
    alpha = np.ascontiguousarray(np.broadcast_to(alpha, (eeb.shape[1],)), dtype=np.float64)
    # gather the batch into a compact CSR with local column ids
    starts, ends = indptr[docs], indptr[docs + 1]
    lens = (ends - starts).astype(np.int64)
    bptr = np.zeros(docs.size + 1, np.int64)
    np.cumsum(lens, out=bptr[1:])
    take = np.repeat(starts - bptr[:-1], lens) + np.arange(bptr[-1]) if bptr[-1] else np.zeros(0, np.int64)
    words = np.asarray(indices)[take]
    cts = np.ascontiguousarray(np.asarray(counts)[take], dtype=np.float64)
    loc = _local_ids(words, cols)
    if array_backend == "cupy" and not (pr is not None and _pr_active(pr)):
        return estep_xp(bptr, loc, cts, eeb, alpha, max_iter, tol, _cupy(), return_gamma=return_gamma)
    k = _kernels()
    if pr is not None and _pr_active(pr):
        gamma, sstats, bound, iters = _pr_kernel()(
            bptr,
            loc,
            cts,
            words.astype(np.int64),
            eeb,
            alpha,
            int(max_iter),
            float(tol),
            pr.seed_word_ids,
            pr.seed_topics,
            pr.seed_mass,
            float(pr.cap),
            int(pr.max_iter),
            float(pr.tol),
        )
    else:
        # one numba thread (a Dask worker per core): the serial kernel, which loads faster
        name = "estep_parallel" if backend.numba().get_num_threads() > 1 else "estep_serial"
        gamma, sstats, bound, iters = k[name](bptr, loc, cts, eeb, alpha, int(max_iter), float(tol))
    return EStepResult(
        sstats, gamma if return_gamma else np.zeros((0, eeb.shape[1])), float(bound), float(cts.sum()), int(iters)
    )


def _cupy():
    from pgmflow.tasks import backend as _backend

    return _backend.cupy()


def estep_xp(bptr, loc, cts, eeb, alpha, max_iter, tol, xp, return_gamma=True, chunk_elements=1 << 24) -> EStepResult:
    """The same E-step written with array operations of ``xp`` (numpy or cupy): the GPU path.

    Documents are padded to the longest one of a chunk (``B`` [D, N, K], at most ``chunk_elements``
    entries at a time) and iterated together; a document whose gamma has converged is frozen, so
    each document runs exactly the iterations the per-document loop would. The sums run in another
    order than the numba kernel's, so results agree to rounding (~1e-12), not bit for bit.
    Inputs are host arrays in the compact layout of :func:`estep`; results come back on the host.
    """
    if xp is np:
        from scipy.special import digamma as dg
        from scipy.special import gammaln
    else:
        cx = backend.cupyx()
        dg, gammaln = cx.scipy.special.digamma, cx.scipy.special.gammaln

    K = eeb.shape[1]
    n_docs = bptr.size - 1
    lens = np.diff(bptr)
    eeb_d = xp.asarray(eeb)
    alpha_d = xp.asarray(alpha)
    sstats = xp.zeros(eeb.shape)
    gammas = np.zeros((n_docs, K))
    bound, iters = 0.0, 0
    start = 0
    while start < n_docs:
        # a chunk of documents whose padded block fits the budget
        stop = start + 1
        while stop < n_docs and (stop + 1 - start) * max(int(lens[start : stop + 1].max()), 1) * K <= chunk_elements:
            stop += 1
        D = stop - start
        N = max(int(lens[start:stop].max()), 1)
        pos = np.arange(N)[None, :] < lens[start:stop, None]  # [D, N] real (not padding) entries
        flat = bptr[start:stop, None] + np.arange(N)[None, :]
        rows = np.where(pos, loc[np.minimum(flat, loc.size - 1)] if loc.size else 0, 0)
        c_h = np.where(pos, cts[np.minimum(flat, max(cts.size - 1, 0))] if cts.size else 0.0, 0.0)
        B = eeb_d[xp.asarray(rows)] * xp.asarray(pos)[:, :, None]  # [D, N, K], zero rows for padding
        c = xp.asarray(c_h)  # [D, N]
        gamma = alpha_d[None, :] + xp.asarray(c_h.sum(axis=1))[:, None] / K  # [D, K]
        ea = xp.exp(dg(gamma) - dg(gamma.sum(axis=1, keepdims=True)))
        active = xp.ones(D, dtype=bool)
        n_it = xp.zeros(D, dtype=xp.int64)
        for _ in range(int(max_iter)):
            norm = xp.einsum("dnk,dk->dn", B, ea) + 1e-100  # [D, N]
            new = alpha_d[None, :] + ea * xp.einsum("dn,dnk->dk", c / norm, B)
            change = xp.abs(new - gamma).mean(axis=1)
            gamma = xp.where(active[:, None], new, gamma)
            ea = xp.where(active[:, None], xp.exp(dg(gamma) - dg(gamma.sum(axis=1, keepdims=True))), ea)
            n_it += active
            active = active & (change >= tol)
            if not bool(active.any()):
                break
        norm = xp.einsum("dnk,dk->dn", B, ea) + 1e-100
        contrib = (c / norm)[:, :, None] * ea[:, None, :] * B  # [D, N, K]
        r = xp.asarray(rows[pos])
        if xp is np:
            np.add.at(sstats, r, contrib[pos])
        else:
            backend.cupyx().scatter_add(sstats, r, contrib[xp.asarray(pos)])
        el = dg(gamma) - dg(gamma.sum(axis=1, keepdims=True))
        b = (
            xp.sum(c * xp.log(norm))
            + xp.sum((alpha_d[None, :] - gamma) * el)
            + xp.sum(gammaln(gamma) - gammaln(alpha_d)[None, :])
            + D * gammaln(alpha_d.sum())
            - xp.sum(gammaln(gamma.sum(axis=1)))
        )
        bound += float(b)
        iters += int(n_it.sum())
        gammas[start:stop] = gamma.get() if xp is not np else gamma
        start = stop
    out = sstats.get() if xp is not np else sstats
    return EStepResult(out, gammas if return_gamma else np.zeros((0, K)), bound, float(cts.sum()), iters)


def _pr_active(pr) -> bool:
    from pgmflow.tasks.lda import regularization

    return regularization.is_active(pr)


# --- reference implementation (NumPy, one document at a time) -------------------------------------


def estep_numpy(indptr, indices, counts, docs, cols, exp_elog_beta, alpha, max_iter=100, tol=1e-3) -> EStepResult:
    """Plain NumPy/SciPy version of :func:`estep` without constraints (the test oracle)."""
    from scipy.special import digamma as dg
    from scipy.special import gammaln

    eeb = np.asarray(exp_elog_beta, dtype=np.float64)
    K = eeb.shape[1]
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (K,))
    sstats = np.zeros_like(eeb)
    gammas = np.zeros((len(docs), K))
    bound, iters, ntok = 0.0, 0, 0.0
    for j, d in enumerate(docs):
        w = np.asarray(indices[indptr[d] : indptr[d + 1]])
        c = np.asarray(counts[indptr[d] : indptr[d + 1]], dtype=np.float64)
        loc = np.searchsorted(cols, w)
        B = eeb[loc]  # [N, K]
        gamma = alpha + c.sum() / K
        ea = np.exp(dg(gamma) - dg(gamma.sum()))
        norm = B @ ea + 1e-100
        for _ in range(max_iter):
            iters += 1
            new = alpha + ea * ((c / norm) @ B)
            ea = np.exp(dg(new) - dg(new.sum()))
            norm = B @ ea + 1e-100
            change = np.mean(np.abs(new - gamma))
            gamma = new
            if change < tol:
                break
        gammas[j] = gamma
        sstats[loc] += np.outer(c / norm, ea) * B
        elog = dg(gamma) - dg(gamma.sum())
        bound += (
            c @ np.log(norm)
            + np.sum((alpha - gamma) * elog)
            + np.sum(gammaln(gamma) - gammaln(alpha))
            + gammaln(alpha.sum())
            - gammaln(gamma.sum())
        )
        ntok += c.sum()
    return EStepResult(sstats, gammas, float(bound), float(ntok), int(iters))


# --- numba kernels ----------------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers, prange to numba.prange and _project to the compiled projection of
# pgmflow.tasks.lda.regularization (as plain Python: range and pr_kernels' function).
prange = range
_project = _pr_kernels._project_nb


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _digamma(x):
    # below 6: psi(x) = psi(x + m) - sum_{i<m} 1/(x + i), the sum as one fraction P'/P with
    # P = prod (x + i) (one division instead of m; the recurrence is the hot spot of the E-step)
    r = 0.0
    if x < 6.0:
        p = 1.0
        dp = 0.0
        while x < 6.0:
            dp = dp * x + p
            p = p * x
            x += 1.0
        r = -dp / p
    f = 1.0 / (x * x)
    return (
        r
        + math.log(x)
        - 0.5 / x
        - f * (1.0 / 12 - f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f * (1.0 / 132)))))
    )


@backend.kernel(cache=True, nogil=True)
def digamma_vec(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = _digamma(x[i])
    return out


@backend.kernel(cache=True, nogil=True)
def _exp_elog(gamma, out):
    s = 0.0
    for k in range(gamma.size):
        s += gamma[k]
    ds = _digamma(s)
    for k in range(gamma.size):
        out[k] = math.exp(_digamma(gamma[k]) - ds)


@backend.kernel(cache=True, nogil=True)
def _dirichlet_terms(alpha, gamma):
    K = gamma.size
    sg, sa = 0.0, 0.0
    for k in range(K):
        sg += gamma[k]
        sa += alpha[k]
    ds = _digamma(sg)
    t = 0.0
    for k in range(K):
        t += (alpha[k] - gamma[k]) * (_digamma(gamma[k]) - ds) + math.lgamma(gamma[k]) - math.lgamma(alpha[k])
    return t + math.lgamma(sa) - math.lgamma(sg)


@backend.kernel(cache=True, nogil=True)
def _norms(ea, BT, norm):
    """norm[n] = sum_k ea[k] BT[k, n], each sum in k order (vectorised across n, not reordered)."""
    K, N = BT.shape
    for i in range(N):
        norm[i] = 1e-100
    for k in range(K):
        a = ea[k]
        for i in range(N):
            norm[i] += a * BT[k, i]


@backend.kernel(cache=True, nogil=True)
def _one_doc(lo, hi, loc, cts, eeb, alpha, max_iter, tol, gamma, ea, norm, new):
    K = alpha.size
    N = hi - lo
    # this document's rows of exp(E[log beta]), contiguous in both layouts
    Bd = np.empty((N, K))
    BT = np.empty((K, N))
    c = np.empty(N)
    tot = 0.0
    for i in range(N):
        c[i] = cts[lo + i]
        tot += c[i]
        row = loc[lo + i]
        for k in range(K):
            Bd[i, k] = eeb[row, k]
            BT[k, i] = eeb[row, k]
    for k in range(K):
        gamma[k] = alpha[k] + tot / K
    _exp_elog(gamma, ea)
    _norms(ea, BT, norm)
    it = 0
    while it < max_iter:
        it += 1
        for k in range(K):
            new[k] = 0.0
        for i in range(N):
            r = c[i] / norm[i]
            for k in range(K):
                new[k] += r * Bd[i, k]
        change = 0.0
        for k in range(K):
            v = alpha[k] + ea[k] * new[k]
            change += abs(v - gamma[k])
            gamma[k] = v
        _exp_elog(gamma, ea)
        _norms(ea, BT, norm)
        if change / K < tol:
            break
    return it


@backend.kernel(cache=True, nogil=True)
def _run_doc(d, bptr, loc, cts, eeb, alpha, max_iter, tol, gamma, ea_all, norm_all, bounds, iters):
    lo, hi = bptr[d], bptr[d + 1]
    new = np.empty(alpha.size)
    iters[d] = _one_doc(lo, hi, loc, cts, eeb, alpha, max_iter, tol, gamma[d], ea_all[d], norm_all[lo:hi], new)
    b = 0.0
    for n in range(lo, hi):
        b += cts[n] * math.log(norm_all[n])
    bounds[d] = b + _dirichlet_terms(alpha, gamma[d])


@backend.kernel(cache=True, nogil=True)
def _accumulate(bptr, loc, cts, eeb, ea_all, norm_all, bounds, iters):
    """Sufficient statistics, accumulated in document order (the same for any thread count)."""
    K = ea_all.shape[1]
    sstats = np.zeros(eeb.shape)
    total, it = 0.0, 0
    for d in range(bptr.size - 1):
        for n in range(bptr[d], bptr[d + 1]):
            r = cts[n] / norm_all[n]
            row = loc[n]
            for k in range(K):
                sstats[row, k] += r * ea_all[d, k] * eeb[row, k]
        total += bounds[d]
        it += iters[d]
    return sstats, total, it


@backend.kernel(cache=True, nogil=True, parallel=True)
def estep_parallel(bptr, loc, cts, eeb, alpha, max_iter, tol):
    n_docs = bptr.size - 1
    gamma, ea_all = np.empty((n_docs, alpha.size)), np.empty((n_docs, alpha.size))
    norm_all, bounds, iters = np.empty(loc.size), np.zeros(n_docs), np.zeros(n_docs, np.int64)
    for d in prange(n_docs):
        _run_doc(d, bptr, loc, cts, eeb, alpha, max_iter, tol, gamma, ea_all, norm_all, bounds, iters)
    sstats, total, it = _accumulate(bptr, loc, cts, eeb, ea_all, norm_all, bounds, iters)
    return gamma, sstats, total, it


@backend.kernel(cache=True, nogil=True)
def estep_serial(bptr, loc, cts, eeb, alpha, max_iter, tol):
    n_docs = bptr.size - 1
    gamma, ea_all = np.empty((n_docs, alpha.size)), np.empty((n_docs, alpha.size))
    norm_all, bounds, iters = np.empty(loc.size), np.zeros(n_docs), np.zeros(n_docs, np.int64)
    for d in range(n_docs):
        _run_doc(d, bptr, loc, cts, eeb, alpha, max_iter, tol, gamma, ea_all, norm_all, bounds, iters)
    sstats, total, it = _accumulate(bptr, loc, cts, eeb, ea_all, norm_all, bounds, iters)
    return gamma, sstats, total, it


@backend.kernel(cache=True, nogil=True)
def _token_posteriors(ea, eeb, loc, lo, p, norm):
    """p[i] = the unconstrained token posterior of word i (ea * B row, normalised); norm[i] its normaliser."""
    N, K = p.shape
    for i in range(N):
        row = loc[lo + i]
        s = 0.0
        for k in range(K):
            p[i, k] = ea[k] * eeb[row, k]
            s += p[i, k]
        norm[i] = s + 1e-100
        for k in range(K):
            p[i, k] /= norm[i]


@backend.kernel(cache=True, nogil=True)
def estep_pr_kernel(
    bptr, loc, cts, words, eeb, alpha, max_iter, tol, seed_ids, seed_topics, seed_mass, cap, pr_iter, pr_tol
):
    n_docs = bptr.size - 1
    K = alpha.size
    gamma = np.empty((n_docs, K))
    sstats = np.zeros(eeb.shape)
    ea = np.empty(K)
    total, it_total = 0.0, 0
    for d in range(n_docs):
        lo, hi = bptr[d], bptr[d + 1]
        N = hi - lo
        p = np.empty((N, K))
        q = np.empty((N, K))
        norm = np.empty(N)
        g = gamma[d]
        tot = 0.0
        for n in range(lo, hi):
            tot += cts[n]
        for k in range(K):
            g[k] = alpha[k] + tot / K
        c = cts[lo:hi]
        w = words[lo:hi]
        for _ in range(max_iter):
            it_total += 1
            _exp_elog(g, ea)
            _token_posteriors(ea, eeb, loc, lo, p, norm)
            _project(p, c, w, seed_ids, seed_topics, seed_mass, cap, pr_iter, pr_tol, q)
            change = 0.0
            for k in range(K):
                v = alpha[k]
                for i in range(N):
                    v += c[i] * q[i, k]
                change += abs(v - g[k])
                g[k] = v
            if change / K < tol:
                break
        # final posteriors at the final gamma, then statistics and the bound
        _exp_elog(g, ea)
        b = 0.0
        _token_posteriors(ea, eeb, loc, lo, p, norm)
        _project(p, c, w, seed_ids, seed_topics, seed_mass, cap, pr_iter, pr_tol, q)
        for i in range(N):
            row = loc[lo + i]
            kl = 0.0
            for k in range(K):
                sstats[row, k] += c[i] * q[i, k]
                if q[i, k] > 0.0:
                    kl += q[i, k] * math.log(q[i, k] / max(p[i, k], 1e-300))
            b += c[i] * (math.log(norm[i]) - kl)
        total += b + _dirichlet_terms(alpha, g)
    return gamma, sstats, total, it_total


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes), binding
    prange and the posterior-regularization projection (:func:`pgmflow.tasks.lda.regularization.project_kernel`,
    whose dispatcher the PR E-step calls)."""
    return backend.compile_kernels(
        sys.modules[__name__], bind={"prange": backend.numba().prange, "_project": _regularization.project_kernel()}
    )


def _pr_kernel():
    """The E-step with posterior regularization (:func:`estep_pr_kernel`, compiled)."""
    return _kernels()["estep_pr_kernel"]


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the E-step kernels in this process."""
    indptr = np.array([0, 2], np.int64)
    estep(
        indptr,
        np.array([0, 1]),
        np.array([1.0, 2.0]),
        np.array([0]),
        np.array([0, 1]),
        np.full((2, 2), 0.5),
        np.full(2, 0.5),
        max_iter=2,
    )
