"""Sparse document-term matrices: Matrix Market and scipy ``.npz``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pgmflow.tasks.lda.corpus.shards import CorpusError, shard_from_scipy
from pgmflow.tasks.lda.corpus.store import CorpusInfo, _check_dps, _read_vocab_file, write_corpus

# --- sparse matrices ------------------------------------------------------------------------------


def _write_matrix(m, src, out_dir, docs_per_shard, transpose, vocab_path, source) -> CorpusInfo:
    import scipy.sparse as sp

    dps = _check_dps(docs_per_shard, src)
    if not sp.issparse(m):
        m = np.asarray(m)
        if m.ndim != 2:
            raise CorpusError(src, f"expected a 2-D matrix, got shape {m.shape}", "store a documents x words matrix")
    if np.iscomplexobj(m.data if sp.issparse(m) else m):
        raise CorpusError(src, "the matrix is complex", "store real nonnegative word counts")
    m = sp.csr_matrix(m.T if transpose else m)
    m.sum_duplicates()
    if m.shape[0] < 1:
        raise CorpusError(src, "the matrix has no documents (empty corpus)", "store at least one document")
    if m.shape[1] < 1:
        raise CorpusError(src, "the matrix has no words (zero columns)", "store at least one word column")
    if m.nnz:
        bad = ~np.isfinite(m.data) | (m.data < 0)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            r = int(np.searchsorted(m.indptr, j, side="right") - 1)
            what = "documents are columns" if transpose else "documents are rows"
            raise CorpusError(
                src,
                f"document {r} has a negative or non-finite count ({m.data[j]} for word {int(m.indices[j])}; {what})",
                "counts must be nonnegative (check transpose= if words are rows)",
            )
    vocab = None if vocab_path is None else _read_vocab_file(vocab_path, m.shape[1], f"the matrix {src}")
    V = m.shape[1]

    def shards():
        for lo in range(0, m.shape[0], dps):
            yield shard_from_scipy(m[lo : lo + dps], lo, path=src)

    return write_corpus(out_dir, shards(), V, vocab=vocab, source=source)


def from_matrix_market(path, out_dir, docs_per_shard=10000, transpose=False, vocab_path=None) -> CorpusInfo:
    """A Matrix Market file (``scipy.io.mmread``) with documents as rows (``transpose=True``: columns).

    Counts must be nonnegative and finite. The whole matrix is read into memory once.
    """
    import scipy.io

    src = Path(os.path.abspath(path))
    if not src.is_file():
        raise CorpusError(src, "Matrix Market file not found", "pass the path of the .mtx file")
    try:
        m = scipy.io.mmread(str(src))
    except Exception as exc:  # noqa: BLE001  (mmread raises ValueError, OSError, its own errors)
        raise CorpusError(
            src,
            f"not a readable Matrix Market file ({type(exc).__name__}: {exc})",
            "pass a valid .mtx file (coordinate or array format)",
        ) from None
    return _write_matrix(m, src, out_dir, docs_per_shard, transpose, vocab_path, f"Matrix Market: {src}")


def from_npz(path, out_dir, docs_per_shard=10000, transpose=False, vocab_path=None) -> CorpusInfo:
    """A ``scipy.sparse.save_npz`` file with documents as rows (``transpose=True``: columns)."""
    import scipy.sparse as sp

    src = Path(os.path.abspath(path))
    if not src.is_file():
        raise CorpusError(src, "npz file not found", "pass the path of a scipy.sparse.save_npz file")
    try:
        m = sp.load_npz(str(src))
    except Exception as exc:  # noqa: BLE001  (zip, pickle and format errors alike)
        raise CorpusError(
            src,
            f"not a scipy.sparse .npz file ({type(exc).__name__}: {exc})",
            "write the matrix with scipy.sparse.save_npz",
        ) from None
    return _write_matrix(m, src, out_dir, docs_per_shard, transpose, vocab_path, f"scipy.sparse npz: {src}")
