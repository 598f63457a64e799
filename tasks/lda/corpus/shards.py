"""In-memory shards of a document-term corpus (CSR blocks of documents) and the corpus error type."""

from __future__ import annotations

import operator
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

FORMAT = "pgmflow-corpus/1"
SHIPPED_CORPUS = "numpy_scipy_docstrings"
SHIPPED_ALIASES = {"docstrings": SHIPPED_CORPUS}  # short names accepted by shipped_corpus_path
_DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # tasks/lda/data
_SHARD_RE = re.compile(r"^shard_\d{5,}\.npz$")
_RESERVED_META = ("format", "n_docs", "n_words", "nnz", "n_tokens", "shards", "vocab", "source")
_MAX_WORDS = np.iinfo(np.int32).max


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------


class CorpusError(ValueError):
    """Bad corpus input.

    Attributes: ``path`` (str, the file or folder), ``problem`` (str), ``fix`` (str).
    ``str(exc) == f"{path}: {problem}; fix: {fix}"``.
    """

    def __init__(self, path, problem, fix):
        self.path = str(path)
        self.problem = str(problem)
        self.fix = str(fix)
        super().__init__(f"{self.path}: {self.problem}; fix: {self.fix}")

    def __reduce__(self):  # picklable (Dask moves exceptions between processes)
        return (type(self), (self.path, self.problem, self.fix))


# ------------------------------------------------------------------------------------------------
# In-memory shards
# ------------------------------------------------------------------------------------------------


class DocTermShard(NamedTuple):
    """Bag-of-words counts of a block of documents, as CSR arrays (picklable, cheap to move)."""

    indptr: np.ndarray  # int64 [n_docs+1], CSR row pointer
    indices: np.ndarray  # int32 [nnz], word ids, strictly increasing within each document
    counts: np.ndarray  # float64 [nnz], > 0, finite (word counts)
    n_words: int  # vocabulary size V of the whole corpus
    doc_offset: int  # global index of this shard's first document


_FIX_ARRAYS = "pass nonnegative finite counts with word ids in [0, n_words) and a nondecreasing indptr"


def make_shard(indptr, indices, counts, n_words, doc_offset=0, path="<memory>", *, fix=_FIX_ARRAYS) -> DocTermShard:
    """Validate and canonicalise CSR arrays into a :class:`DocTermShard`.

    Within each document duplicate word ids are summed, ids are sorted and zero counts dropped.
    Raises :class:`CorpusError` (naming ``path``; ``fix`` is the advice it gives) for negative,
    NaN or infinite counts, word ids outside ``[0, n_words)``, an ``indptr`` that does not start at
    0, decreases, or does not end at ``len(indices)``, and arrays of the wrong shape or type.
    Arrays already canonical and of the right dtype are used without a copy.
    """
    try:
        n_words = operator.index(n_words)
        doc_offset = operator.index(doc_offset)
    except TypeError as exc:
        raise CorpusError(path, f"n_words and doc_offset must be integers ({exc})", fix) from None
    if not 1 <= n_words <= _MAX_WORDS:
        raise CorpusError(path, f"n_words = {n_words} is not in [1, 2**31 - 1]", fix)
    if doc_offset < 0:
        raise CorpusError(path, f"doc_offset = {doc_offset} is negative", fix)
    indptr = np.asarray(indptr)
    indices = np.asarray(indices)
    counts = np.asarray(counts)
    if indptr.ndim != 1 or indptr.size < 1:
        raise CorpusError(path, f"indptr must be a 1-D array of length n_docs + 1 (got shape {indptr.shape})", fix)
    if indices.ndim != 1 or counts.ndim != 1 or indices.shape != counts.shape:
        raise CorpusError(
            path,
            f"indices and counts must be 1-D arrays of equal length (got shapes {indices.shape} and {counts.shape})",
            fix,
        )
    if indptr.dtype.kind not in "iu" or (indices.size and indices.dtype.kind not in "iu"):
        raise CorpusError(
            path, f"indptr and indices must be integer arrays (got {indptr.dtype} and {indices.dtype})", fix
        )
    if counts.size and counts.dtype.kind not in "iufb":
        raise CorpusError(path, f"counts must be a real numeric array (got {counts.dtype})", fix)
    indptr = indptr.astype(np.int64, copy=False)
    nnz = indices.size
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise CorpusError(
            path,
            f"indptr must start at 0 and end at len(indices) = {nnz} (it runs from "
            f"{int(indptr[0])} to {int(indptr[-1])})",
            fix,
        )
    lens = np.diff(indptr)
    if lens.size and lens.min() < 0:
        d = int(np.flatnonzero(lens < 0)[0])
        raise CorpusError(path, f"indptr is not monotone (it decreases at document {doc_offset + d})", fix)
    counts = counts.astype(np.float64, copy=False)
    if nnz:
        bad = ~np.isfinite(counts)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            d = int(np.searchsorted(indptr, j, side="right") - 1)
            raise CorpusError(path, f"document {doc_offset + d} has a non-finite count ({counts[j]})", fix)
        if counts.min() < 0:
            j = int(np.flatnonzero(counts < 0)[0])
            d = int(np.searchsorted(indptr, j, side="right") - 1)
            raise CorpusError(
                path, f"document {doc_offset + d} has a negative count ({counts[j]} for word {int(indices[j])})", fix
            )
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_words:
            j = int(np.flatnonzero((indices < 0) | (indices >= n_words))[0])
            d = int(np.searchsorted(indptr, j, side="right") - 1)
            raise CorpusError(
                path, f"document {doc_offset + d} has word id {int(indices[j])} outside [0, n_words = {n_words})", fix
            )
    indices = indices.astype(np.int32, copy=False)
    if not _is_canonical(indptr, indices, counts):
        indptr, indices, counts = _canonicalise(indptr, indices, counts, n_words)
    return DocTermShard(indptr, indices, counts, int(n_words), int(doc_offset))


def _is_canonical(indptr, indices, counts) -> bool:
    if counts.size == 0:
        return True
    if not counts.min() > 0:
        return False
    inc = np.diff(indices) > 0  # between entry j and j+1
    starts = indptr[1:-1]
    starts = starts[(starts > 0) & (starts < indices.size)]
    inc[starts - 1] = True  # a new document may start lower
    return bool(inc.all())


def _canonicalise(indptr, indices, counts, n_words):
    n = indptr.size - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    key = rows * np.int64(n_words) + indices.astype(np.int64)
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    summed = np.add.reduceat(counts[order], starts) if starts.size else np.zeros(0)
    ukey = key[starts]
    keep = summed > 0
    ukey, summed = ukey[keep], summed[keep]
    urows = ukey // n_words
    new_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(urows, minlength=n), out=new_ptr[1:])
    return new_ptr, (ukey - urows * n_words).astype(np.int32), np.ascontiguousarray(summed, dtype=np.float64)


def shard_from_dense(X, doc_offset=0) -> DocTermShard:
    """A shard from a dense count matrix ``X`` [n_docs, V] (tests, small data)."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] < 1:
        raise CorpusError(
            "<memory>",
            f"X must be a 2-D [n_docs, n_words] array (got shape {X.shape})",
            "pass a matrix with one row per document and one column per word",
        )
    nz = X != 0
    rows, cols = np.nonzero(nz)
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(nz.sum(axis=1), out=indptr[1:])
    return make_shard(indptr, cols, X[rows, cols], X.shape[1], doc_offset)


def shard_from_scipy(csr, doc_offset=0, path="<memory>") -> DocTermShard:
    """A shard from any SciPy sparse matrix/array with documents as rows."""
    import scipy.sparse as sp

    if not sp.issparse(csr):
        raise CorpusError(
            path,
            f"expected a scipy.sparse matrix, got {type(csr).__name__}",
            "convert the data with scipy.sparse.csr_matrix",
        )
    m = sp.csr_matrix(csr)
    if np.iscomplexobj(m.data):
        raise CorpusError(path, "the matrix is complex", "pass real nonnegative word counts")
    return make_shard(m.indptr, m.indices, m.data, m.shape[1], doc_offset, path)


def shard_to_scipy(shard: DocTermShard):
    """The shard as a ``scipy.sparse.csr_matrix`` [n_docs, n_words] (float64, no copy of the arrays)."""
    import scipy.sparse as sp

    return sp.csr_matrix((shard.counts, shard.indices, shard.indptr), shape=(n_docs(shard), shard.n_words))


def slice_docs(shard: DocTermShard, local_ids) -> DocTermShard:
    """The sub-shard of the documents ``local_ids`` (local row indices, any order; a boolean mask works).

    The result keeps ``doc_offset = shard.doc_offset``: its rows are the selected documents in the
    order given, so after a non-contiguous selection ``doc_offset + row`` is *not* the global id of a
    row; keep ``shard.doc_offset + local_ids`` yourself when you need global ids.
    """
    ids = np.asarray(local_ids)
    n = n_docs(shard)
    if ids.dtype == bool:
        if ids.shape != (n,):
            raise IndexError(f"boolean mask of shape {ids.shape} for a shard of {n} documents")
        ids = np.flatnonzero(ids)
    ids = ids.astype(np.int64, copy=False).reshape(-1)
    if ids.size and (ids.min() < -n or ids.max() >= n):
        raise IndexError(f"document ids out of range for a shard of {n} documents")
    ids = np.where(ids < 0, ids + n, ids)
    starts = shard.indptr[ids]
    lens = shard.indptr[ids + 1] - starts
    ptr = np.zeros(ids.size + 1, dtype=np.int64)
    np.cumsum(lens, out=ptr[1:])
    take = np.repeat(starts - ptr[:-1], lens) + np.arange(ptr[-1], dtype=np.int64)
    return DocTermShard(ptr, shard.indices[take], shard.counts[take], shard.n_words, shard.doc_offset)


def n_docs(shard: DocTermShard) -> int:
    """Number of documents in the shard."""
    return int(shard.indptr.size - 1)


def n_tokens(shard: DocTermShard) -> float:
    """Total word count of the shard."""
    return float(np.sum(shard.counts))


def doc_lengths(shard: DocTermShard) -> np.ndarray:
    """Token count of each document, float64 [n_docs]."""
    csum = np.concatenate([[0.0], np.cumsum(shard.counts, dtype=np.float64)])
    return csum[shard.indptr[1:]] - csum[shard.indptr[:-1]]
