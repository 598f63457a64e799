"""Synthetic LDA corpora with known topics (for checking that inference recovers them).

Generative process (Blei, Ng & Jordan 2003), for a model with ``K`` topics over ``V`` words::

    beta_k  ~ Dirichlet(eta * 1_V)            k = 1..K      (true_model; stage STAGE_LDA_SYNTH_TOPICS)
    theta_d ~ Dirichlet(alpha)                one per document
    N_d     ~ max(1, Poisson(mean_length))
    z_dn    ~ Categorical(theta_d),  w_dn ~ Categorical(beta_{z_dn})      n = 1..N_d

and only the counts of ``w`` per document are kept. The documents of shard ``i`` are drawn from
``rng.generator(seed, STAGE_LDA_SYNTH_DOCS, i)`` and nothing else, so a shard is the same whether
it is generated alone, on any worker, or after any other shards; it does depend on the shard's
``n_docs`` (so ``docs_per_shard`` is part of a synthetic corpus's identity).

Speed: NumPy draws ``theta`` (normalised Gamma variates), the lengths and two uniforms per token
(one for its topic, one for its word), all from the shard's generator in that order. A numba
kernel, parallel over documents, then maps each token's uniforms through inverse CDFs: its topic by
binary search in the cumulative ``theta_d`` (giving the document's topic counts ``n_dk``), then,
topic by topic (tokens are exchangeable, and each topic's table stays in cache), the words by
inverse CDF in the topic's cumulative table, started from a guide table (Chen & Asau 1974) so a
lookup takes O(1) expected steps; it sorts each document's words and sums them into CSR counts.
The lookups equal ``np.searchsorted(..., side="right")`` exactly (``_generate_shard_numpy`` is the NumPy
oracle the tests compare with, bit for bit). No
dense ``[n_docs, V]`` array is ever formed. The topics, and ``theta`` for ``alpha < 0.05``, use
``log Gamma(a) = log Gamma(a + 1) + log(U) / a``, which stays finite for tiny concentrations.
About 1e8 tokens (1e6 documents of 100 words) take ~20 s on 2 cores, including writing the files.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks import rng as _rng
from pgmflow.tasks.lda import corpus as _corpus
from pgmflow.tasks.lda.corpus import CorpusInfo, DocTermShard

__all__ = ["SyntheticLDA", "generate_corpus", "generate_in_memory", "generate_shard", "true_model"]


class SyntheticLDA(NamedTuple):
    topics: np.ndarray  # [K, V] true topic-word distributions (rows sum to 1)
    alpha: np.ndarray  # [K] Dirichlet prior of the documents' topic proportions


_DIRECT_MIN = 0.05  # below this concentration, Gamma draws can underflow: use log space


def _dirichlet_log(g: np.random.Generator, conc, size: tuple) -> np.ndarray:
    """Rows of Dirichlet(conc) draws (conc broadcast over the last axis of ``size``), in log space:
    ``log Gamma(a) = log Gamma(a + 1) + log(U) / a`` never underflows, however small ``a`` is."""
    x = np.log(g.standard_gamma(conc + 1.0, size)) + np.log1p(-g.random(size)) / conc
    x -= x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    return p


def _dirichlet(g: np.random.Generator, conc, size: tuple) -> np.ndarray:
    """Rows of Dirichlet(conc) draws: normalised Gamma draws (fast), or :func:`_dirichlet_log` for
    concentrations below 0.05. A row whose Gamma draws all underflow (never seen in practice) is
    redrawn in log space from the same generator, so the result still depends on it alone."""
    conc = np.asarray(conc, dtype=np.float64)
    if conc.min() < _DIRECT_MIN:
        return _dirichlet_log(g, conc, size)
    x = g.standard_gamma(conc, size)
    tot = x.sum(axis=-1, keepdims=True)
    bad = ~(tot[..., 0] > 0)
    x /= tot
    if bad.any():
        x[bad] = _dirichlet_log(g, conc, (int(bad.sum()), size[-1]))
    return x


def true_model(n_topics, n_words, eta=0.05, seed=0, alpha=0.1) -> SyntheticLDA:
    """The true topics ``beta_k ~ Dirichlet(eta)`` [K, V] and ``alpha`` [K] (a scalar is symmetric).

    Drawn from ``rng.generator(seed, STAGE_LDA_SYNTH_TOPICS)``; a small ``eta`` (0.05 over a few
    hundred words or more) makes the topics sparse and clearly distinct.
    """
    K, V = int(n_topics), int(n_words)
    if K < 1 or V < 2:
        raise ValueError(f"need n_topics >= 1 and n_words >= 2 (got {n_topics}, {n_words})")
    if not (np.isfinite(eta) and eta > 0):
        raise ValueError(f"eta must be positive (got {eta})")
    a = np.array(np.broadcast_to(np.asarray(alpha, dtype=np.float64), (K,)))
    if not np.all(np.isfinite(a) & (a > 0)):
        raise ValueError(f"alpha must be positive (got {alpha})")
    g = _rng.generator(seed, _rng.STAGE_LDA_SYNTH_TOPICS)
    return SyntheticLDA(_dirichlet_log(g, float(eta), (K, V)), a)


def _cdf(topics: np.ndarray) -> np.ndarray:
    """Per-topic cumulative tables; the last entry is exactly 1 so every uniform in [0, 1) lands."""
    c = np.cumsum(np.asarray(topics, dtype=np.float64), axis=1)
    c /= c[:, -1:]
    c[:, -1] = 1.0
    return np.ascontiguousarray(c)


def _tables(topics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(cdf [K, V], guide [K, V])``: the cumulative tables and their guide tables (Chen & Asau
    1974): ``guide[k, m]`` is the first word whose cumulative probability exceeds ``m / V``, so a
    lookup starts next to its answer and takes O(1) expected steps instead of a binary search."""
    cdf = _cdf(topics)
    guide = np.empty(cdf.shape, dtype=np.int32)
    _kernels()["_guide_table"](cdf, guide)
    return cdf, guide


# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers, prange to numba.prange (as plain Python, range).
prange = range


@backend.kernel(cache=True, nogil=True, parallel=True)
def _guide_table(cdf, guide):
    # guide[k, m] = first j with cdf[k, j] > m / M  (cdf[k, -1] == 1 > m / M)
    K, M = guide.shape
    for k in prange(K):
        j = 0
        for m in range(M):
            x = m / M
            while cdf[k, j] <= x:
                j += 1
            guide[k, m] = j


@backend.kernel(cache=True, nogil=True)
def _search(row, grow, u):  # == np.searchsorted(row, u, side="right") given row[-1] > u
    M = grow.size
    m = min(int(u * M), M - 1)
    j = grow[m]
    while j > 0 and row[j - 1] > u:  # guards the rounding of u * M
        j -= 1
    while row[j] <= u:
        j += 1
    return j


@backend.kernel(cache=True, nogil=True)
def _bsearch(row, u):  # == np.searchsorted(row, u, side="right") given row[-1] > u
    lo, hi = 0, row.size - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if row[mid] > u:
            hi = mid
        else:
            lo = mid + 1
    return lo


@backend.kernel(cache=True, nogil=True, parallel=True)
def _draw_words(theta_cdf, cdf, guide, u_topic, u_word, tok_ptr, words, nuniq):
    D, K = theta_cdf.shape
    for d in prange(D):
        a, b = tok_ptr[d], tok_ptr[d + 1]
        trow = theta_cdf[d]
        ndk = np.zeros(K, dtype=np.int64)  # topic counts of the document
        for t in range(a, b):
            ndk[_bsearch(trow, u_topic[t])] += 1
        t = a  # words topic by topic (tokens are exchangeable), so each table stays in cache
        for k in range(K):
            row = cdf[k]
            grow = guide[k]
            for _ in range(ndk[k]):
                words[t] = _search(row, grow, u_word[t])
                t += 1
        seg = words[a:b]
        seg.sort()
        m = 0
        for j in range(b - a):
            if j == 0 or seg[j] != seg[j - 1]:
                m += 1
        nuniq[d] = m


@backend.kernel(cache=True, nogil=True, parallel=True)
def _aggregate(words, tok_ptr, indptr, indices, counts):
    D = tok_ptr.size - 1
    for d in prange(D):
        p = indptr[d] - 1
        for t in range(tok_ptr[d], tok_ptr[d + 1]):
            if t == tok_ptr[d] or words[t] != words[t - 1]:
                p += 1
                indices[p] = words[t]
                counts[p] = 0.0
            counts[p] += 1.0


@functools.lru_cache(maxsize=None)  # noqa: UP033  (the project's cached-builder pattern)
def _kernels():
    """Compile (once per process; numba's on-disk cache serves later processes) the numba kernels above that
    turn topic counts and uniforms into CSR word counts."""
    return backend.compile_kernels(sys.modules[__name__], bind={"prange": backend.numba().prange})


def _draw(model: SyntheticLDA, n_docs: int, shard_index: int, seed: int, mean_length: float):
    """The shard's random numbers, drawn in this order: ``theta`` [D, K], the document lengths
    (returned as the token pointer ``tok_ptr`` [D+1]), then one uniform per token for its topic and
    one per token for its word."""
    if not (np.isfinite(mean_length) and mean_length > 0):
        raise ValueError(f"mean_length must be positive (got {mean_length})")
    if n_docs < 0:
        raise ValueError(f"n_docs must be >= 0 (got {n_docs})")
    g = _rng.generator(seed, _rng.STAGE_LDA_SYNTH_DOCS, shard_index)
    K = model.topics.shape[0]
    theta = _dirichlet(g, np.asarray(model.alpha, dtype=np.float64), (n_docs, K))
    lengths = np.maximum(g.poisson(mean_length, n_docs), 1).astype(np.int64)
    tok_ptr = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=tok_ptr[1:])
    u_topic = g.random(int(tok_ptr[-1]))
    u_word = g.random(int(tok_ptr[-1]))
    return theta, tok_ptr, u_topic, u_word


def _generate(model, tables, n_docs, doc_offset, shard_index, seed, mean_length) -> DocTermShard:
    theta, tok_ptr, u_topic, u_word = _draw(model, int(n_docs), int(shard_index), seed, mean_length)
    k = _kernels()
    words = np.empty(u_word.size, dtype=np.int32)
    nuniq = np.zeros(int(n_docs), dtype=np.int64)
    k["_draw_words"](_cdf(theta), tables[0], tables[1], u_topic, u_word, tok_ptr, words, nuniq)
    indptr = np.zeros(int(n_docs) + 1, dtype=np.int64)
    np.cumsum(nuniq, out=indptr[1:])
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    counts = np.empty(int(indptr[-1]), dtype=np.float64)
    k["_aggregate"](words, tok_ptr, indptr, indices, counts)
    return DocTermShard(indptr, indices, counts, int(model.topics.shape[1]), int(doc_offset))


def generate_shard(model: SyntheticLDA, n_docs, doc_offset, shard_index, seed, mean_length=100) -> DocTermShard:
    """``n_docs`` documents of the LDA generative process, as shard ``shard_index`` (starting at ``doc_offset``).

    Random numbers: ``rng.generator(seed, STAGE_LDA_SYNTH_DOCS, shard_index)`` only.
    """
    return _generate(model, _tables(model.topics), n_docs, doc_offset, shard_index, seed, mean_length)


def _generate_shard_numpy(model: SyntheticLDA, n_docs, doc_offset, shard_index, seed, mean_length=100):
    """Plain NumPy version of :func:`generate_shard` (the test oracle: identical output, slower)."""
    theta, tok_ptr, u_topic, u_word = _draw(model, int(n_docs), int(shard_index), seed, mean_length)
    K, V = model.topics.shape
    cdf, theta_cdf = _cdf(model.topics), _cdf(theta)
    doc = np.repeat(np.arange(int(n_docs)), np.diff(tok_ptr))
    topic = np.empty(u_topic.size, dtype=np.int64)
    for d in range(int(n_docs)):  # the document's topic counts, then its tokens sorted by topic
        sl = slice(tok_ptr[d], tok_ptr[d + 1])
        topic[sl] = np.sort(np.searchsorted(theta_cdf[d], u_topic[sl], side="right"))
    words = np.empty(u_word.size, dtype=np.int64)
    for k in range(K):
        m = topic == k
        words[m] = np.searchsorted(cdf[k], u_word[m], side="right")
    key, cnt = np.unique(doc * V + words, return_counts=True)
    rows = key // V
    indptr = np.zeros(int(n_docs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=int(n_docs)), out=indptr[1:])
    return DocTermShard(indptr, (key - rows * V).astype(np.int32), cnt.astype(np.float64), int(V), int(doc_offset))


def generate_corpus(
    out_dir, n_docs, n_words, n_topics, seed=0, alpha=0.1, eta=0.05, mean_length=100, docs_per_shard=10000
) -> CorpusInfo:
    """Write a synthetic corpus directory: shards one at a time, ``true_topics.npy``, ``true_alpha.npy``.

    Shard ``i`` holds documents ``[i * docs_per_shard, ...)`` drawn by
    ``generate_shard(model, ..., shard_index=i, seed)``; ``meta["synthetic"]`` records the
    parameters. Memory: the model plus one shard.
    """
    n_docs, dps = int(n_docs), int(docs_per_shard)
    if n_docs < 1 or dps < 1:
        raise ValueError(f"need n_docs >= 1 and docs_per_shard >= 1 (got {n_docs}, {docs_per_shard})")
    model = true_model(n_topics, n_words, eta=eta, seed=seed, alpha=alpha)
    tables = _tables(model.topics)
    out = os.path.abspath(out_dir)
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "true_topics.npy"), model.topics)
    np.save(os.path.join(out, "true_alpha.npy"), model.alpha)

    def shards():
        for i, lo in enumerate(range(0, n_docs, dps)):
            yield _generate(model, tables, min(dps, n_docs - lo), lo, i, seed, mean_length)

    a = np.asarray(alpha, dtype=np.float64)
    params = {
        "n_docs": n_docs,
        "n_words": int(n_words),
        "n_topics": int(n_topics),
        "seed": int(seed),
        "alpha": float(a) if a.ndim == 0 else a.tolist(),
        "eta": float(eta),
        "mean_length": float(mean_length),
        "docs_per_shard": dps,
        "generator": "pgmflow.tasks.lda.synthetic",
    }
    return _corpus.write_corpus(
        out,
        shards(),
        int(n_words),
        source="synthetic LDA (pgmflow.tasks.lda.synthetic)",
        extra_meta={"synthetic": params, "true_topics": "true_topics.npy", "true_alpha": "true_alpha.npy"},
    )


def generate_in_memory(
    n_docs, n_words, n_topics, seed=0, alpha=0.1, eta=0.05, mean_length=100
) -> tuple[DocTermShard, SyntheticLDA]:
    """One shard of ``n_docs`` documents (shard index 0, doc_offset 0) and its true model.

    Identical to the corpus of :func:`generate_corpus` with ``docs_per_shard >= n_docs``.
    """
    model = true_model(n_topics, n_words, eta=eta, seed=seed, alpha=alpha)
    return generate_shard(model, n_docs, 0, 0, seed, mean_length), model
