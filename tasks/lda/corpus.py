"""Document-term corpora for LDA: in-memory CSR shards, the on-disk sharded format, and loaders.

In memory
---------
A corpus is processed as *shards*: :class:`DocTermShard` holds the bag-of-words counts of a
contiguous block of documents as CSR arrays (``indptr`` int64, ``indices`` int32 word ids, strictly
increasing within a document, ``counts`` float64 > 0), plus the vocabulary size of the whole
corpus and the global index of its first document. :func:`make_shard` validates and canonicalises
raw arrays (duplicate word ids in a document are summed, ids sorted, zero counts dropped).

On disk ("pgmflow-corpus/1")
----------------------------
A corpus directory holds::

    meta.json          {"format": "pgmflow-corpus/1", "n_docs", "n_words", "nnz", "n_tokens",
                        "shards": [{"file": "shard_00000.npz", "n_docs", "doc_offset", "nnz",
                                    "n_tokens"}, ...],
                        "vocab": "vocab.txt" or null, "source": "<free text>",
                        optional "doc_names": "doc_names.txt", "true_topics": "true_topics.npy",
                        "true_alpha": "true_alpha.npy", and anything extra (e.g. "synthetic": {...})}
    shard_NNNNN.npz    arrays indptr (int64), indices (int32), counts (float32 or float64)
    vocab.txt          one word per line (optional)
    doc_names.txt      one document name per line (optional)
    true_topics.npy, true_alpha.npy   (synthetic corpora only)

Shards hold consecutive documents: shard ``i`` starts at ``doc_offset = sum of the n_docs of
shards 0..i-1``. :func:`write_corpus` writes ``meta.json`` last (through a temporary file and a
rename), so a directory whose write crashed has no ``meta.json`` and :func:`open_corpus` rejects
it. :func:`open_corpus` is cheap (it reads ``meta.json`` and ``vocab.txt``); :func:`load_shard`
reads and validates one shard.

Loaders
-------
:func:`from_uci` (UCI bag-of-words ``docword.txt[.gz]`` + ``vocab.txt``; NYTimes, PubMed, KOS, NIPS,
Enron), :func:`from_text_folder` (one plain-text document per file; tokenised, stop words removed,
vocabulary pruned by document frequency), :func:`from_documents` (the same for strings you supply),
:func:`from_matrix_market` and :func:`from_npz` (a sparse document-term matrix). The UCI and text
loaders stream: their memory is bounded by one shard plus the vocabulary.

Every problem with the input raises :class:`CorpusError`, whose message names the file or folder,
says what is wrong, and how to fix it.
"""

from __future__ import annotations

import gzip
import json
import operator
import os
import re
import struct
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "FORMAT",
    "SHIPPED_ALIASES",
    "SHIPPED_CORPUS",
    "CorpusError",
    "CorpusInfo",
    "DocTermShard",
    "doc_lengths",
    "from_documents",
    "from_matrix_market",
    "from_npz",
    "from_text_folder",
    "from_uci",
    "iter_shards",
    "load_doc_names",
    "load_shard",
    "load_true_model",
    "make_shard",
    "n_docs",
    "n_tokens",
    "open_corpus",
    "prune_vocabulary",
    "shard_file",
    "shard_from_dense",
    "shard_from_scipy",
    "shard_to_scipy",
    "shipped_corpus_path",
    "slice_docs",
    "tokenize",
    "write_corpus",
]

FORMAT = "pgmflow-corpus/1"
SHIPPED_CORPUS = "numpy_scipy_docstrings"
SHIPPED_ALIASES = {"docstrings": SHIPPED_CORPUS}  # short names accepted by shipped_corpus_path
_DATA_DIR = Path(__file__).resolve().parent / "data"
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


def make_shard(indptr, indices, counts, n_words, doc_offset=0, path="<memory>", *,
               fix=_FIX_ARRAYS) -> DocTermShard:
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
        raise CorpusError(path, f"indices and counts must be 1-D arrays of equal length (got shapes "
                                f"{indices.shape} and {counts.shape})", fix)
    if indptr.dtype.kind not in "iu" or (indices.size and indices.dtype.kind not in "iu"):
        raise CorpusError(path, f"indptr and indices must be integer arrays (got {indptr.dtype} and "
                                f"{indices.dtype})", fix)
    if counts.size and counts.dtype.kind not in "iufb":
        raise CorpusError(path, f"counts must be a real numeric array (got {counts.dtype})", fix)
    indptr = indptr.astype(np.int64, copy=False)
    nnz = indices.size
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise CorpusError(path, f"indptr must start at 0 and end at len(indices) = {nnz} (it runs from "
                                f"{int(indptr[0])} to {int(indptr[-1])})", fix)
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
            raise CorpusError(path, f"document {doc_offset + d} has a negative count ({counts[j]} for word "
                                    f"{int(indices[j])})", fix)
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n_words:
            j = int(np.flatnonzero((indices < 0) | (indices >= n_words))[0])
            d = int(np.searchsorted(indptr, j, side="right") - 1)
            raise CorpusError(path, f"document {doc_offset + d} has word id {int(indices[j])} outside "
                                    f"[0, n_words = {n_words})", fix)
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
        raise CorpusError("<memory>", f"X must be a 2-D [n_docs, n_words] array (got shape {X.shape})",
                          "pass a matrix with one row per document and one column per word")
    nz = X != 0
    rows, cols = np.nonzero(nz)
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(nz.sum(axis=1), out=indptr[1:])
    return make_shard(indptr, cols, X[rows, cols], X.shape[1], doc_offset)


def shard_from_scipy(csr, doc_offset=0, path="<memory>") -> DocTermShard:
    """A shard from any SciPy sparse matrix/array with documents as rows."""
    import scipy.sparse as sp

    if not sp.issparse(csr):
        raise CorpusError(path, f"expected a scipy.sparse matrix, got {type(csr).__name__}",
                          "convert the data with scipy.sparse.csr_matrix")
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


# ------------------------------------------------------------------------------------------------
# The on-disk format
# ------------------------------------------------------------------------------------------------


class CorpusInfo(NamedTuple):
    """What :func:`open_corpus` learns from ``meta.json`` (and ``vocab.txt``)."""

    path: str  # the corpus directory (absolute)
    n_docs: int
    n_words: int
    nnz: int
    n_tokens: float
    shard_docs: tuple  # number of docs in each shard, in order
    shard_offsets: tuple  # global index of each shard's first doc
    vocab: tuple | None  # the words, if the corpus has a vocabulary (vocab.txt), else None
    true_topics: str | None  # path of true_topics.npy (synthetic corpora) or None
    meta: dict  # the whole meta.json


_FIX_REWRITE = "re-create the corpus directory with tasks.lda.corpus.write_corpus or one of the from_* loaders"


def _clean_name(s, what, path):
    if not isinstance(s, str) or "\n" in s or "\r" in s:
        raise CorpusError(path, f"{what} {s!r} is not a one-line string",
                          f"make every {what} a string without line breaks")
    return s


def _write_lines(path: Path, lines: Iterable[str], what: str) -> int:
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for s in lines:
            f.write(_clean_name(s, what, path) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    while lines and lines[-1].strip() == "":  # trailing newline / blank lines
        lines.pop()
    return [s.removesuffix("\r") for s in lines]


def _counts_for_disk(counts: np.ndarray, counts_dtype) -> np.ndarray:
    if counts_dtype == "auto":
        c32 = counts.astype(np.float32)
        return c32 if np.array_equal(c32, counts) else counts
    return counts.astype(counts_dtype)


def write_corpus(out_dir, shards: Iterable[DocTermShard], n_words, vocab=None, source="", extra_meta=None, *,
                 doc_names: Iterable[str] | None = None, compress=False, counts_dtype="auto") -> CorpusInfo:
    """Write shards (consumed one at a time) to the corpus directory ``out_dir``; return its info.

    Shards are written in order and numbered contiguously: shard ``i`` gets ``doc_offset`` = the
    number of documents before it (a shard's own ``doc_offset`` is ignored) and shards with no
    documents are skipped. ``vocab``: ``n_words`` strings (written to vocab.txt) or None.
    ``extra_meta``: more keys for meta.json (not the reserved ones). ``doc_names``: one name per
    document (doc_names.txt). ``compress``: zlib-compress the shard files (smaller; then
    ``load_shard(mmap=True)`` reads them into memory). ``counts_dtype``: "auto" stores float32 when
    that is exact (integer counts below 2**24), else float64; or a dtype.

    ``out_dir`` is created if needed; an existing corpus there is replaced (its meta.json is
    removed first and its shard files are deleted, other files are left alone). meta.json is
    written last, so a failed write leaves no valid corpus.
    """
    out = Path(os.path.abspath(out_dir))
    try:
        n_words = operator.index(n_words)
    except TypeError:
        raise CorpusError(out, f"n_words = {n_words!r} is not an integer", "pass the vocabulary size") from None
    if not 1 <= n_words <= _MAX_WORDS:
        raise CorpusError(out, f"n_words = {n_words} is not in [1, 2**31 - 1]", "pass the vocabulary size")
    extra_meta = dict(extra_meta or {})
    clash = sorted(set(extra_meta) & set(_RESERVED_META))
    if clash:
        raise CorpusError(out, f"extra_meta sets reserved keys {clash}", "rename those keys")
    if counts_dtype != "auto" and np.dtype(counts_dtype) not in (np.float32, np.float64):
        raise CorpusError(out, f"counts_dtype {counts_dtype!r} is not float32 or float64",
                          "use 'auto', 'float32' or 'float64'")
    if out.exists() and not out.is_dir():
        raise CorpusError(out, "exists and is not a directory", "choose another out_dir or remove the file")
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta_path.unlink()
    for f in out.iterdir():
        if _SHARD_RE.match(f.name) and f.is_file():
            f.unlink()

    meta_vocab = None
    if vocab is not None:
        vocab = list(vocab)
        if len(vocab) != n_words:
            raise CorpusError(out, f"vocab has {len(vocab)} words but n_words = {n_words}",
                              "pass exactly one word per word id")
        _write_lines(out / "vocab.txt", vocab, "vocabulary word")
        meta_vocab = "vocab.txt"

    entries = []
    total_docs, total_nnz, total_tokens = 0, 0, 0.0
    for shard in shards:
        if not isinstance(shard, DocTermShard):
            raise CorpusError(out, f"shard {len(entries)} is a {type(shard).__name__}, not a DocTermShard",
                              "build shards with make_shard / shard_from_scipy / shard_from_dense")
        if shard.n_words != n_words:
            raise CorpusError(out, f"a shard has n_words = {shard.n_words} but the corpus has n_words = {n_words}",
                              "give every shard the vocabulary size of the whole corpus")
        nd = n_docs(shard)
        if nd == 0:
            continue
        name = f"shard_{len(entries):05d}.npz"
        tmp = out / (name + ".tmp")
        arrays = {"indptr": np.asarray(shard.indptr, dtype=np.int64),
                  "indices": np.asarray(shard.indices, dtype=np.int32),
                  "counts": _counts_for_disk(np.asarray(shard.counts, dtype=np.float64), counts_dtype)}
        with open(tmp, "wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **arrays)
        os.replace(tmp, out / name)
        nnz, tok = int(shard.indices.size), n_tokens(shard)
        entries.append({"file": name, "n_docs": nd, "doc_offset": total_docs, "nnz": nnz, "n_tokens": tok})
        total_docs += nd
        total_nnz += nnz
        total_tokens += tok
    if total_docs == 0:
        raise CorpusError(out, "no documents were written (empty corpus)", "pass at least one non-empty shard")

    meta = {"format": FORMAT, "n_docs": total_docs, "n_words": n_words, "nnz": total_nnz,
            "n_tokens": total_tokens, "shards": entries, "vocab": meta_vocab, "source": str(source)}
    if doc_names is not None:
        n = _write_lines(out / "doc_names.txt", doc_names, "document name")
        if n != total_docs:
            raise CorpusError(out, f"{n} document names for {total_docs} documents",
                              "pass one name per document")
        meta["doc_names"] = "doc_names.txt"
    meta.update(extra_meta)
    tmp = out / "meta.json.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, meta_path)
    return open_corpus(out)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def open_corpus(path) -> CorpusInfo:
    """Open a corpus directory: read and validate meta.json (and vocab.txt). Cheap.

    Raises :class:`CorpusError` for a missing directory or meta.json, malformed JSON, a wrong format
    tag, missing or ill-typed fields, missing shard files, shard document counts or offsets that do
    not add up, an empty corpus, and a vocab.txt whose line count is not n_words.
    """
    d = Path(os.path.abspath(path))
    if not d.is_dir():
        raise CorpusError(d, "no such corpus directory",
                          "check the path, or build the corpus with one of the tasks.lda.corpus.from_* loaders")
    mp = d / "meta.json"
    if not mp.is_file():
        raise CorpusError(mp, "missing meta.json (not a pgmflow corpus, or its write did not finish)",
                          _FIX_REWRITE)
    try:
        with open(mp, encoding="utf-8") as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(mp, f"malformed JSON ({exc})", _FIX_REWRITE) from None
    if not isinstance(meta, dict):
        raise CorpusError(mp, "malformed meta.json (the top level is not an object)", _FIX_REWRITE)
    if meta.get("format") != FORMAT:
        raise CorpusError(mp, f"format tag is {meta.get('format')!r}, expected {FORMAT!r}",
                          "convert the corpus with one of the tasks.lda.corpus.from_* loaders")
    for key in ("n_docs", "n_words", "nnz"):
        if not _is_int(meta.get(key)) or meta[key] < 0:
            raise CorpusError(mp, f"field {key!r} is missing or not a nonnegative integer", _FIX_REWRITE)
    if not isinstance(meta.get("n_tokens"), (int, float)) or isinstance(meta.get("n_tokens"), bool):
        raise CorpusError(mp, "field 'n_tokens' is missing or not a number", _FIX_REWRITE)
    if meta["n_docs"] == 0:
        raise CorpusError(mp, "the corpus has no documents (n_docs = 0: empty corpus)",
                          "build it from a source with at least one document")
    if not 1 <= meta["n_words"] <= _MAX_WORDS:
        raise CorpusError(mp, f"n_words = {meta['n_words']} is not in [1, 2**31 - 1]", _FIX_REWRITE)
    shards = meta.get("shards")
    if not isinstance(shards, list) or not shards:
        raise CorpusError(mp, "field 'shards' is missing, empty or not a list", _FIX_REWRITE)
    docs, offs, total_nnz = [], [], 0
    expect = 0
    for i, s in enumerate(shards):
        if not isinstance(s, dict) or not isinstance(s.get("file"), str) or not all(
                _is_int(s.get(k)) and s[k] >= 0 for k in ("n_docs", "doc_offset", "nnz")):
            raise CorpusError(mp, f"shard entry {i} is malformed (needs file, n_docs, doc_offset, nnz)",
                              _FIX_REWRITE)
        if os.path.basename(s["file"]) != s["file"] or s["file"] in ("", ".", ".."):
            raise CorpusError(mp, f"shard entry {i} names {s['file']!r}, not a file inside the corpus directory",
                              _FIX_REWRITE)
        if s["doc_offset"] != expect:
            raise CorpusError(mp, f"shard {i} ({s['file']}) has doc_offset {s['doc_offset']} but the shards "
                                  f"before it hold {expect} documents (inconsistent shard offsets)", _FIX_REWRITE)
        if not (d / s["file"]).is_file():
            raise CorpusError(d / s["file"], f"shard file {i} listed in meta.json is missing",
                              "restore the file (copy the whole corpus directory) or " + _FIX_REWRITE)
        docs.append(s["n_docs"])
        offs.append(s["doc_offset"])
        expect += s["n_docs"]
        total_nnz += s["nnz"]
    if expect != meta["n_docs"]:
        raise CorpusError(mp, f"the shards hold {expect} documents but n_docs = {meta['n_docs']} "
                              "(inconsistent shard doc counts)", _FIX_REWRITE)
    if total_nnz != meta["nnz"]:
        raise CorpusError(mp, f"the shards hold {total_nnz} nonzeros but nnz = {meta['nnz']}", _FIX_REWRITE)
    vocab = None
    if meta.get("vocab") is not None:
        vname = meta["vocab"]
        vp = d / str(vname)
        if not isinstance(vname, str) or os.path.basename(vname) != vname or not vp.is_file():
            raise CorpusError(vp, "the vocabulary file named in meta.json is missing",
                              "restore vocab.txt, or set \"vocab\": null in meta.json")
        vocab = tuple(_read_lines(vp))
        if len(vocab) != meta["n_words"]:
            raise CorpusError(vp, f"vocab.txt has {len(vocab)} lines but n_words = {meta['n_words']}",
                              "write exactly one word per line, one line per word id")
    true_topics = None
    for key in ("true_topics", "true_alpha", "doc_names"):
        name = meta.get(key)
        if name is None:
            continue
        p = d / str(name)
        if not isinstance(name, str) or os.path.basename(name) != name or not p.is_file():
            raise CorpusError(p, f"the file named by {key!r} in meta.json is missing",
                              f"restore it, or remove {key!r} from meta.json")
        if key == "true_topics":
            true_topics = str(p)
    return CorpusInfo(str(d), int(meta["n_docs"]), int(meta["n_words"]), int(meta["nnz"]),
                      float(meta["n_tokens"]), tuple(docs), tuple(offs), vocab, true_topics, meta)


def _as_info(info_or_path) -> CorpusInfo:
    return info_or_path if isinstance(info_or_path, CorpusInfo) else open_corpus(info_or_path)


def shard_file(info_or_path, i) -> str:
    """Path of shard ``i``'s file."""
    info = _as_info(info_or_path)
    i = operator.index(i)
    n = len(info.shard_docs)
    if not 0 <= i < n:
        raise IndexError(f"shard index {i} out of range: {info.path} has {n} shards")
    return os.path.join(info.path, info.meta["shards"][i]["file"])


def _npz_memmaps(path, names):
    """Memory-map the members of an uncompressed .npz; None if one is compressed."""
    out = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for name in names:
            zi = zf.getinfo(name + ".npy")
            if zi.compress_type != zipfile.ZIP_STORED:
                return None
            fh.seek(zi.header_offset)
            hdr = fh.read(30)
            if hdr[:4] != b"PK\x03\x04":
                return None
            nlen, elen = struct.unpack("<HH", hdr[26:30])
            fh.seek(zi.header_offset + 30 + nlen + elen)
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            if dtype.hasobject or len(shape) != 1:
                return None
            if shape[0] == 0:
                out[name] = np.zeros(0, dtype=dtype)
            else:
                out[name] = np.memmap(path, dtype=dtype, mode="r", offset=fh.tell(), shape=shape)
    return out


def load_shard(info_or_path, i, mmap=False) -> DocTermShard:
    """Load and validate shard ``i`` of a corpus (a :class:`CorpusInfo` or a corpus directory).

    Counts come back as float64. ``mmap=True`` memory-maps the arrays of an uncompressed shard file
    (indices and float64 counts are then read-only views of the file; float32 counts are copied).
    Raises :class:`CorpusError` naming the shard file for an unreadable file, missing arrays,
    sizes that disagree with meta.json, negative or NaN counts, and word ids >= n_words.
    """
    info = _as_info(info_or_path)
    f = shard_file(info, i)
    entry = info.meta["shards"][operator.index(i)]
    names = ("indptr", "indices", "counts")
    fix = "the shard file is corrupt or was not written by write_corpus: " + _FIX_REWRITE
    try:
        arrays = _npz_memmaps(f, names) if mmap else None
        if arrays is None:
            with np.load(f, allow_pickle=False) as z:
                missing = [n for n in names if n not in z.files]
                if missing:
                    raise CorpusError(f, f"the shard file lacks the arrays {missing}", fix)
                arrays = {n: z[n] for n in names}
    except CorpusError:
        raise
    except FileNotFoundError:
        raise CorpusError(f, "the shard file is missing", "restore the file or " + _FIX_REWRITE) from None
    except KeyError as exc:
        raise CorpusError(f, f"the shard file lacks an array ({exc})", fix) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CorpusError(f, f"not a readable .npz file ({type(exc).__name__}: {exc})", fix) from None
    indptr, indices, counts = (arrays[n] for n in names)
    if indptr.ndim != 1 or indptr.size != entry["n_docs"] + 1:
        raise CorpusError(f, f"the shard has {indptr.size - 1} documents but meta.json says {entry['n_docs']}", fix)
    if indices.ndim != 1 or indices.size != entry["nnz"]:
        raise CorpusError(f, f"the shard has {indices.size} nonzeros but meta.json says {entry['nnz']}", fix)
    return make_shard(indptr, indices, counts, info.n_words, info.shard_offsets[operator.index(i)], f, fix=fix)


def iter_shards(info_or_path) -> Iterator[DocTermShard]:
    """Load the shards of a corpus one after the other."""
    info = _as_info(info_or_path)
    for i in range(len(info.shard_docs)):
        yield load_shard(info, i)


def load_doc_names(info_or_path) -> list[str] | None:
    """The document names (doc_names.txt) if the corpus has them, else None."""
    info = _as_info(info_or_path)
    name = info.meta.get("doc_names")
    if name is None:
        return None
    p = Path(info.path) / name
    names = _read_lines(p)
    if len(names) != info.n_docs:
        raise CorpusError(p, f"{len(names)} document names for {info.n_docs} documents",
                          "write one name per line, one line per document")
    return names


def load_true_model(info_or_path):
    """``(topics [K, V], alpha [K])`` of a synthetic corpus, or None for a corpus without them."""
    info = _as_info(info_or_path)
    if info.true_topics is None:
        return None
    topics = np.load(info.true_topics, allow_pickle=False)
    alpha_name = info.meta.get("true_alpha")
    alpha = np.load(os.path.join(info.path, alpha_name), allow_pickle=False) if alpha_name else None
    if topics.ndim != 2 or topics.shape[1] != info.n_words:
        raise CorpusError(info.true_topics, f"true topics have shape {topics.shape}, expected [K, {info.n_words}]",
                          "regenerate the synthetic corpus")
    return topics, alpha


# ------------------------------------------------------------------------------------------------
# Loaders
# ------------------------------------------------------------------------------------------------


def _check_dps(docs_per_shard, path):
    try:
        dps = operator.index(docs_per_shard)
    except TypeError:
        dps = 0
    if dps < 1:
        raise CorpusError(path, f"docs_per_shard = {docs_per_shard!r} is not a positive integer",
                          "pass docs_per_shard >= 1")
    return dps


def _read_vocab_file(vocab_path, n_words=None, source=None) -> list[str]:
    vp = Path(vocab_path)
    if not vp.is_file():
        raise CorpusError(vp, "vocabulary file not found", "pass the path of the vocabulary file (one word per line)")
    words = _read_lines(vp)
    if n_words is not None and len(words) != n_words:
        raise CorpusError(vp, f"vocabulary-size mismatch: {len(words)} lines but {source} has {n_words} words",
                          "pass the vocabulary file that belongs to this data set (one word per line)")
    return words


def _open_maybe_gzip(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


_UCI_CHUNK = 1 << 24


def from_uci(docword_path, vocab_path, out_dir, docs_per_shard=10000) -> CorpusInfo:
    """Convert a UCI bag-of-words data set into a corpus directory (streaming).

    ``docword_path``: ``docword.*.txt`` or ``.txt.gz`` -- three header lines D, W, NNZ, then
    ``docID wordID count`` lines with 1-based ids sorted by docID (NYTimes, PubMed, KOS, NIPS,
    Enron). ``vocab_path``: its vocabulary (one word per line, W lines), or None for none. Documents
    with no lines are kept as empty documents. Word ids become 0-based. Memory: one shard.
    """
    src = Path(os.path.abspath(docword_path))
    dps = _check_dps(docs_per_shard, src)
    if not src.is_file():
        raise CorpusError(src, "docword file not found", "pass the path of docword.<name>.txt(.gz)")
    fix_fmt = ("the file must start with three lines D, W, NNZ followed by 'docID wordID count' lines "
               "(UCI bag-of-words format)")
    with _open_maybe_gzip(src) as fh:
        header = []
        try:
            while len(header) < 3:
                line = fh.readline()
                if not line:
                    raise CorpusError(src, f"the header ends after {len(header)} lines", fix_fmt)
                if line.strip():
                    header.append(int(line.strip()))
        except (ValueError, UnicodeDecodeError, OSError, EOFError) as exc:
            raise CorpusError(src, f"unreadable header ({type(exc).__name__}: {exc})", fix_fmt) from None
    D, W, NNZ = header
    if D < 1:
        raise CorpusError(src, f"the header says D = {D} documents (empty corpus)", "use a data set with documents")
    if W < 1 or W > _MAX_WORDS or NNZ < 0:
        raise CorpusError(src, f"invalid header W = {W}, NNZ = {NNZ}", fix_fmt)
    vocab = None if vocab_path is None else _read_vocab_file(vocab_path, W, f"the header of {src}")
    return write_corpus(out_dir, _uci_shards(src, D, W, NNZ, dps, fix_fmt), W, vocab=vocab,
                        source=f"UCI bag-of-words: {src}")


def _uci_parse_slow(block: bytes, first_line: int, src, fix_fmt) -> np.ndarray:
    rows = []
    for k, line in enumerate(block.split(b"\n")):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 3:
                raise ValueError
            rows.append([int(p) for p in parts])
        except ValueError:
            raise CorpusError(src, f"line {first_line + k} is not three integers 'docID wordID count': "
                                   f"{line[:80].decode('utf-8', 'replace')!r}", fix_fmt) from None
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _uci_blocks(src: Path, fix_fmt):
    """Yield ``(first_line_number, int64 [n, 3])`` blocks of the body."""
    with _open_maybe_gzip(src) as fh:
        seen, line_no = 0, 1
        while seen < 3:  # skip the header (already parsed)
            line = fh.readline()
            line_no += 1
            if line.strip():
                seen += 1
        buf = b""
        while True:
            data = fh.read(_UCI_CHUNK)
            if data:
                buf += data
                cut = buf.rfind(b"\n")
                if cut < 0:
                    continue
                block, buf = buf[:cut + 1], buf[cut + 1:]
            else:
                block, buf = buf, b""
                if not block.strip():
                    return
            nl = block.count(b"\n")
            try:
                arr = np.fromstring(block.decode("ascii"), dtype=np.int64, sep=" ")
                ok = arr.size == 3 * (nl + (0 if block.endswith(b"\n") else 1))
            except (ValueError, UnicodeDecodeError):
                ok = False
            arr = arr.reshape(-1, 3) if ok else _uci_parse_slow(block, line_no, src, fix_fmt)
            yield line_no, arr
            line_no += nl
            if not data:
                return


def _uci_shards(src, D, W, NNZ, dps, fix_fmt) -> Iterator[DocTermShard]:
    n_shards = -(-D // dps)
    cur = 0  # shard being filled
    pending: list[np.ndarray] = []
    last_doc = 0
    total = 0

    def build(s):
        lo = s * dps
        hi = min(D, lo + dps)
        a = np.concatenate(pending) if pending else np.zeros((0, 3), np.int64)
        rows = a[:, 0] - 1 - lo
        indptr = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=hi - lo), out=indptr[1:])
        return make_shard(indptr, a[:, 1] - 1, a[:, 2], W, lo, src, fix=fix_fmt)

    for first_line, a in _uci_blocks(src, fix_fmt):
        if a.size == 0:
            continue
        doc, word, cnt = a[:, 0], a[:, 1], a[:, 2]
        total += a.shape[0]

        def where(mask, first_line=first_line):
            j = int(np.flatnonzero(mask)[0])
            return j, f"line {first_line + j}"

        if doc.min() < 1 or doc.max() > D:
            j, at = where((doc < 1) | (doc > D))
            raise CorpusError(src, f"{at}: docID {int(doc[j])} is outside 1..D = {D}", fix_fmt)
        if word.min() < 1 or word.max() > W:
            j, at = where((word < 1) | (word > W))
            raise CorpusError(src, f"{at}: wordID {int(word[j])} is outside 1..W = {W} (document {int(doc[j])})",
                              "check that the vocabulary and the docword file belong together")
        if cnt.min() < 0:
            j, at = where(cnt < 0)
            raise CorpusError(src, f"document {int(doc[j])} has a negative count ({int(cnt[j])} for wordID "
                                   f"{int(word[j])}, {at})",
                              "correct or remove that line: counts must be nonnegative integers")
        if doc[0] < last_doc or (doc.size > 1 and np.any(np.diff(doc) < 0)):
            prev = np.concatenate([[last_doc], doc[:-1]])
            j, at = where(doc < prev)
            raise CorpusError(src, f"docIDs are not sorted ({at}: document {int(doc[j])} after {int(prev[j])})",
                              "sort the lines by docID (e.g. sort -n -k1,1 on the body)")
        last_doc = int(doc[-1])
        shard_of = (doc - 1) // dps
        while doc.size:
            s = int(shard_of[0])
            while s > cur:
                yield build(cur)
                pending = []
                cur += 1
            end = int(np.searchsorted(shard_of, s, side="right"))
            pending.append(a[:end])
            a, doc, shard_of = a[end:], doc[end:], shard_of[end:]
    if total != NNZ:
        raise CorpusError(src, f"NNZ mismatch: the header says {NNZ} lines but the file has {total}",
                          "fix the header's third line, or re-download the file (it may be truncated)")
    while cur < n_shards:
        yield build(cur)
        pending = []
        cur += 1


# --- plain text ---------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[a-z][a-z0-9_']*")


def _stop_set(stop_words) -> frozenset:
    if stop_words is None:
        return frozenset()
    if isinstance(stop_words, frozenset):
        return stop_words
    if isinstance(stop_words, str):
        if stop_words != "english":
            raise ValueError(f"unknown stop word list {stop_words!r}; use 'english', None or a collection of words")
        from tasks.lda.stopwords import ENGLISH_STOP_WORDS

        return ENGLISH_STOP_WORDS
    return frozenset(str(w).lower() for w in stop_words)


def tokenize(text: str, min_word_len=2, stop_words="english") -> list[str]:
    """Lower-case ``text`` and split it into words.

    A word is a run of ``[a-z][a-z0-9_']*`` (ASCII letters, digits, ``_`` and inner apostrophes;
    a trailing ``'s`` and trailing ``'``/``_`` are removed); words shorter than ``min_word_len`` and
    stop words (``"english"``: :data:`tasks.lda.stopwords.ENGLISH_STOP_WORDS`, None, or your
    collection) are dropped.
    """
    stop = _stop_set(stop_words)
    out = []
    for tok in _TOKEN_RE.findall(text.lower()):
        tok = tok.rstrip("'_")
        if tok.endswith("'s"):
            tok = tok[:-2].rstrip("'_")
        if len(tok) >= min_word_len and tok not in stop:
            out.append(tok)
    return out


def prune_vocabulary(doc_freq: dict, term_freq: dict, total_docs: int, min_df=2, max_df=0.5,
                     max_vocab=None) -> list[str]:
    """The kept words, sorted alphabetically.

    A word is kept if its document frequency is at least ``min_df`` and at most ``max_df``
    (each: an int is a number of documents, a float a fraction of ``total_docs``); of those, at most
    ``max_vocab`` with the largest total count ``term_freq`` (ties: alphabetical order).
    """
    def bound(x, name):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be an int (documents) or a float (fraction)")
        if isinstance(x, (float, np.floating)):
            if not 0.0 <= x <= 1.0:
                raise ValueError(f"{name} = {x} as a fraction must be in [0, 1]")
            return x * total_docs
        return int(x)

    lo, hi = bound(min_df, "min_df"), bound(max_df, "max_df")
    kept = [w for w, df in doc_freq.items() if lo <= df <= hi]
    if max_vocab is not None and len(kept) > max_vocab:
        kept.sort(key=lambda w: (-term_freq.get(w, 0), w))
        kept = kept[:int(max_vocab)]
    return sorted(kept)


def _reiterable(documents, path):
    if callable(documents):
        return documents
    if iter(documents) is documents:
        raise CorpusError(path, "documents is a one-shot iterator but two passes are needed",
                          "pass a list, or a zero-argument function returning a fresh iterable")
    return lambda: documents


def from_documents(documents, out_dir, min_df=2, max_df=0.5, max_vocab=None, stop_words="english",
                   docs_per_shard=10000, min_word_len=2, *, doc_names: Sequence[str] | None = None,
                   source="documents", extra_meta=None, compress=False, path="<documents>") -> CorpusInfo:
    """Tokenise texts into a corpus directory, in two passes (count words, then encode).

    ``documents``: a re-iterable of strings (a list) or a zero-argument callable returning a fresh
    iterable each time. Pruning as :func:`prune_vocabulary`, tokens as :func:`tokenize`. Documents
    left with no words are kept as empty documents. Memory: the vocabulary plus one shard.
    """
    dps = _check_dps(docs_per_shard, path)
    docs = _reiterable(documents, path)
    stop = _stop_set(stop_words)
    df, tf = Counter(), Counter()
    n = 0
    for text in docs():
        toks = tokenize(text, min_word_len, stop)
        tf.update(toks)
        df.update(set(toks))
        n += 1
    if n == 0:
        raise CorpusError(path, "there are no documents (empty corpus)", "supply at least one document")
    try:
        words = prune_vocabulary(df, tf, n, min_df, max_df, max_vocab)
    except (TypeError, ValueError) as exc:
        raise CorpusError(path, str(exc), "pass valid min_df / max_df / max_vocab") from None
    if not words:
        raise CorpusError(path, f"no word survives the pruning ({len(df)} distinct words in {n} documents, "
                                f"min_df={min_df}, max_df={max_df}, max_vocab={max_vocab})",
                          "lower min_df, raise max_df or max_vocab, or add documents")
    ids = {w: i for i, w in enumerate(words)}
    V = len(words)

    def shards():
        ptr, idx, cnt = [0], [], []
        offset = 0
        m = 0
        for text in docs():
            c = Counter(ids[t] for t in tokenize(text, min_word_len, stop) if t in ids)
            k = np.fromiter(sorted(c), dtype=np.int32, count=len(c))
            idx.append(k)
            cnt.append(np.array([c[j] for j in k.tolist()], dtype=np.float64))
            ptr.append(ptr[-1] + k.size)
            m += 1
            if len(ptr) - 1 == dps:
                yield make_shard(np.array(ptr, np.int64), np.concatenate(idx), np.concatenate(cnt), V, offset, path)
                offset += dps
                ptr, idx, cnt = [0], [], []
        if m != n:
            raise CorpusError(path, f"the second pass saw {m} documents, the first {n}",
                              "do not change the documents while the corpus is being built")
        if len(ptr) > 1:
            yield make_shard(np.array(ptr, np.int64), np.concatenate(idx), np.concatenate(cnt), V, offset, path)

    meta = {"tokenizer": {"pattern": _TOKEN_RE.pattern, "min_word_len": min_word_len, "min_df": min_df,
                          "max_df": max_df, "max_vocab": max_vocab,
                          "stop_words": stop_words if isinstance(stop_words, str) or stop_words is None
                          else f"{len(stop)} custom words"}}
    meta.update(extra_meta or {})
    return write_corpus(out_dir, shards(), V, vocab=words, source=source, extra_meta=meta,
                        doc_names=doc_names, compress=compress)


def from_text_folder(folder, out_dir, min_df=2, max_df=0.5, max_vocab=None, stop_words="english",
                     docs_per_shard=10000, min_word_len=2, pattern="*.txt") -> CorpusInfo:
    """One document per file under ``folder`` matching ``pattern`` (recursive, sorted by relative path).

    Files are read as UTF-8 (undecodable bytes replaced); see :func:`from_documents` for the
    tokenisation and pruning. The relative file paths are stored as the document names.
    """
    root = Path(os.path.abspath(folder))
    if not root.is_dir():
        raise CorpusError(root, "no such folder", "pass the folder that holds the text files")
    files = sorted((p for p in root.rglob(pattern) if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise CorpusError(root, f"no files match {pattern!r} (empty corpus)",
                          "check the folder, or pass pattern= matching your files")

    def texts():
        for p in files:
            with open(p, encoding="utf-8", errors="replace") as f:
                yield f.read()

    names = [p.relative_to(root).as_posix().replace("\n", " ") for p in files]
    return from_documents(texts, out_dir, min_df, max_df, max_vocab, stop_words, docs_per_shard, min_word_len,
                          doc_names=names, source=f"text folder: {root} ({pattern})", path=str(root))


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
            raise CorpusError(src, f"document {r} has a negative or non-finite count ({m.data[j]} for word "
                                   f"{int(m.indices[j])}; {what})",
                              "counts must be nonnegative (check transpose= if words are rows)")
    vocab = None if vocab_path is None else _read_vocab_file(vocab_path, m.shape[1], f"the matrix {src}")
    V = m.shape[1]

    def shards():
        for lo in range(0, m.shape[0], dps):
            yield shard_from_scipy(m[lo:lo + dps], lo, path=src)

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
        raise CorpusError(src, f"not a readable Matrix Market file ({type(exc).__name__}: {exc})",
                          "pass a valid .mtx file (coordinate or array format)") from None
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
        raise CorpusError(src, f"not a scipy.sparse .npz file ({type(exc).__name__}: {exc})",
                          "write the matrix with scipy.sparse.save_npz") from None
    return _write_matrix(m, src, out_dir, docs_per_shard, transpose, vocab_path, f"scipy.sparse npz: {src}")


# --- shipped data ---------------------------------------------------------------------------------


def shipped_corpus_path(name=SHIPPED_CORPUS) -> str:
    """Directory of a corpus shipped with pgmflow (``tasks/lda/data/<name>``).

    ``numpy_scipy_docstrings`` (alias ``docstrings``): the docstrings of the public functions and
    classes of NumPy and SciPy (BSD-3-Clause), see its README.md.
    """
    p = _DATA_DIR / SHIPPED_ALIASES.get(name, name)
    if not (p / "meta.json").is_file():
        have = sorted(q.name for q in _DATA_DIR.iterdir() if (q / "meta.json").is_file()) if _DATA_DIR.is_dir() else []
        raise CorpusError(p, f"no shipped corpus named {name!r} (shipped: {have})",
                          "use one of the shipped names, or reinstall pgmflow (its package data is missing)")
    return str(p)

