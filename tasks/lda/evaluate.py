"""Evaluation of topic models: held-out perplexity by document completion, UMass topic coherence,
and recovery of known topics by the Hungarian method.

Held-out perplexity (document completion, Wallach et al. 2009; the protocol of Hoffman et al.
2010). Each held-out document's word counts are split at random into an *observed* part and a
*test* part (binomial thinning of each count with probability ``observed_fraction``, keyed by
the seed and the document's shard, so every run and every peer sees the same split). The
document's topic proportions are inferred from the observed part alone with the topics fixed (the
LDA E-step, ``theta_hat = gamma / sum(gamma)``), and the test words are scored under the
predictive ``p(w) = sum_k theta_hat_k beta_hat_kw`` with ``beta_hat = lambda / rowsum(lambda)``::

    perplexity = exp( - sum_{test tokens} log p(w) / number of test tokens )

The same function scores any model that has a topic-word matrix, so one evaluator serves pgmflow,
scikit-learn and gensim. Lower is better.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.lda import estep as _estep

__all__ = [
    "CSR",
    "completion_split",
    "completion_log_likelihood",
    "perplexity",
    "heldout_mask",
    "top_words",
    "cooccurrence",
    "umass_coherence",
    "match_topics",
]


class CSR(NamedTuple):
    indptr: np.ndarray  # int64 [n+1]
    indices: np.ndarray  # int word ids [nnz]
    counts: np.ndarray  # float64 [nnz]


def heldout_mask(n_docs: int, seed: int, shard_index: int, fraction: float) -> np.ndarray:
    """Which documents of a shard are held out: Bernoulli(fraction), keyed by (seed, shard)."""
    if fraction <= 0:
        return np.zeros(n_docs, bool)
    g = _rng.generator(seed, _rng.STAGE_LDA_SPLIT, shard_index, 0)
    return g.random(n_docs) < fraction


def _compact(indptr, indices, counts, keep) -> CSR:
    row = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    kept_rows = np.bincount(row[keep], minlength=indptr.size - 1)
    ptr = np.zeros(indptr.size, np.int64)
    np.cumsum(kept_rows, out=ptr[1:])
    return CSR(ptr, np.asarray(indices)[keep], np.asarray(counts, dtype=np.float64)[keep])


def completion_split(
    indptr, indices, counts, seed: int, identity: tuple = (0,), observed_fraction: float = 0.5
) -> tuple[CSR, CSR]:
    """Split every count into observed and test parts by binomial thinning (integer counts;
    non-integer counts are split proportionally). Returns (observed, test) CSR sets of the same rows."""
    indptr = np.asarray(indptr, np.int64)
    c = np.asarray(counts, dtype=np.float64)
    g = _rng.generator(seed, _rng.STAGE_LDA_SPLIT, *identity, 1)
    integer = np.all(c == np.round(c))
    if integer:
        obs = g.binomial(np.round(c).astype(np.int64), observed_fraction).astype(np.float64)
    else:
        obs = c * observed_fraction
    test = c - obs
    return _compact(indptr, indices, obs, obs > 0), _compact(indptr, indices, test, test > 0)


def completion_log_likelihood(
    observed: CSR,
    test: CSR,
    alpha,
    lam=None,
    topics=None,
    max_iter: int = 100,
    tol: float = 1e-3,
    cols=None,
    lam_rowsum=None,
) -> tuple[float, float]:
    """Sum of ``log p(test word)`` and the number of test tokens (see the module docstring).

    Give either ``lam`` [K, V] (variational Dirichlet parameters: E[log beta] for the E-step and
    lambda normalised as the point estimate) or ``topics`` [K, V] (rows are distributions, e.g. the
    true topics of a synthetic corpus). With ``cols`` (sorted word ids) and ``lam_rowsum`` [K],
    ``lam`` holds only those columns [K, len(cols)] of a larger lambda whose row sums are ``lam_rowsum``
    (what a worker receives).
    """
    if (lam is None) == (topics is None):
        raise ValueError("give exactly one of lam and topics")
    n = observed.indptr.size - 1
    if test.counts.size == 0:
        return 0.0, 0.0
    need = np.unique(np.concatenate([observed.indices, test.indices])).astype(np.int64)
    if lam is not None:
        lam = np.asarray(lam, dtype=np.float64)
        if cols is None:
            cols, sub, rowsum = need, lam[:, need], lam.sum(axis=1)
        else:
            cols = np.asarray(cols, np.int64)
            pos = np.searchsorted(cols, need)
            if np.any(pos >= cols.size) or np.any(cols[np.minimum(pos, cols.size - 1)] != need):
                raise ValueError("cols does not cover the held-out words")
            cols, sub, rowsum = need, lam[:, pos], np.asarray(lam_rowsum, dtype=np.float64)
        dg = _estep.digamma
        eeb = np.ascontiguousarray(np.exp(dg(sub) - dg(rowsum)[:, None]).T)  # [C, K]
        beta_hat = np.ascontiguousarray((sub / rowsum[:, None]).T)  # [C, K]
    else:
        cols = need
        topics = np.asarray(topics, dtype=np.float64)
        beta_hat = np.ascontiguousarray((topics[:, cols] / topics.sum(axis=1)[:, None]).T)
        eeb = beta_hat
    K = eeb.shape[1]
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (K,))
    res = _estep.estep(
        observed.indptr, observed.indices, observed.counts, np.arange(n), cols, eeb, alpha, max_iter=max_iter, tol=tol
    )
    theta = res.gamma / res.gamma.sum(axis=1, keepdims=True)  # [n, K]
    rows = np.repeat(np.arange(n), np.diff(test.indptr))
    loc = np.searchsorted(cols, test.indices)
    p = np.einsum("ik,ik->i", theta[rows], beta_hat[loc])
    return float(np.sum(test.counts * np.log(np.maximum(p, 1e-300)))), float(test.counts.sum())


def perplexity(log_likelihood: float, n_tokens: float) -> float:
    return float(np.exp(-log_likelihood / n_tokens)) if n_tokens > 0 else float("nan")


def top_words(lam: np.ndarray, n: int = 10) -> np.ndarray:
    """[K, n] word ids of each topic's largest entries, largest first (ties by word id)."""
    lam = np.asarray(lam)
    order = np.lexsort((np.broadcast_to(np.arange(lam.shape[1]), lam.shape), -lam), axis=1)
    return order[:, :n]


def cooccurrence(indptr, indices, word_ids) -> tuple[np.ndarray, np.ndarray]:
    """Document frequencies of ``word_ids`` [M] and their co-document frequencies [M, M] in a CSR set.

    Sum-able across shards: the coherence of the whole corpus uses the summed counts.
    """
    word_ids = np.asarray(word_ids, np.int64)
    M = word_ids.size
    uniq, inv = np.unique(word_ids, return_inverse=True)
    indices = np.asarray(indices)
    pos = np.searchsorted(uniq, indices)
    pos_c = np.minimum(pos, uniq.size - 1)
    hit = uniq[pos_c] == indices
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    import scipy.sparse as sp

    P = sp.csr_matrix((np.ones(int(hit.sum())), (rows[hit], pos_c[hit])), shape=(len(indptr) - 1, uniq.size))
    P.data[:] = 1.0  # presence, not counts (duplicates cannot occur: word ids are unique within a document)
    co_u = np.asarray((P.T @ P).todense())
    co = co_u[np.ix_(inv, inv)]
    return np.diag(co).copy(), co if M else np.zeros((0, 0))


def umass_coherence(top: np.ndarray, word_ids: np.ndarray, df: np.ndarray, co: np.ndarray) -> np.ndarray:
    """UMass coherence of each topic (Mimno et al. 2011): ``sum_{i<j} log((D(w_i, w_j) + 1) / D(w_j))``
    over its top words ordered by weight (w_j ranked above w_i). ``df``/``co`` from :func:`cooccurrence`
    over ``word_ids``. Higher (closer to 0) is better."""
    index = {int(w): i for i, w in enumerate(np.asarray(word_ids))}
    out = np.zeros(len(top))
    for k, words in enumerate(np.asarray(top)):
        s = 0.0
        for i in range(1, len(words)):
            for j in range(i):
                a, b = index[int(words[i])], index[int(words[j])]
                s += np.log((co[a, b] + 1.0) / max(df[b], 1.0))
        out[k] = s
    return out


def match_topics(estimated: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Match estimated topics to true ones by the Hungarian method on cosine similarity.

    Returns (assignment [K_true]: the estimated topic matched to each true topic, cosine [K_true]).
    """
    from scipy.optimize import linear_sum_assignment

    e = np.asarray(estimated, dtype=np.float64)
    t = np.asarray(true, dtype=np.float64)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    t = t / np.linalg.norm(t, axis=1, keepdims=True)
    sim = t @ e.T  # [K_true, K_est]
    r, c = linear_sum_assignment(-sim)
    assign = np.full(t.shape[0], -1)
    assign[r] = c
    cos = np.full(t.shape[0], 0.0)
    cos[r] = sim[r, c]
    return assign, cos
