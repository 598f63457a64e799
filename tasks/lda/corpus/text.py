"""Plain-text loaders: one document per file (or per string you supply); tokenised, stop words removed,
vocabulary pruned by document frequency."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pgmflow.tasks.lda.corpus.shards import CorpusError, make_shard
from pgmflow.tasks.lda.corpus.store import CorpusInfo, _check_dps, write_corpus

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
        from pgmflow.tasks.lda.stopwords import ENGLISH_STOP_WORDS

        return ENGLISH_STOP_WORDS
    return frozenset(str(w).lower() for w in stop_words)


def tokenize(text: str, min_word_len=2, stop_words="english") -> list[str]:
    """Lower-case ``text`` and split it into words.

    A word is a run of ``[a-z][a-z0-9_']*`` (ASCII letters, digits, ``_`` and inner apostrophes;
    a trailing ``'s`` and trailing ``'``/``_`` are removed); words shorter than ``min_word_len`` and
    stop words (``"english"``: :data:`pgmflow.tasks.lda.stopwords.ENGLISH_STOP_WORDS`, None, or your
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


def prune_vocabulary(
    doc_freq: dict, term_freq: dict, total_docs: int, min_df=2, max_df=0.5, max_vocab=None
) -> list[str]:
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
        kept = kept[: int(max_vocab)]
    return sorted(kept)


def _reiterable(documents, path):
    if callable(documents):
        return documents
    if iter(documents) is documents:
        raise CorpusError(
            path,
            "documents is a one-shot iterator but two passes are needed",
            "pass a list, or a zero-argument function returning a fresh iterable",
        )
    return lambda: documents


def from_documents(
    documents,
    out_dir,
    min_df=2,
    max_df=0.5,
    max_vocab=None,
    stop_words="english",
    docs_per_shard=10000,
    min_word_len=2,
    *,
    doc_names: Sequence[str] | None = None,
    source="documents",
    extra_meta=None,
    compress=False,
    path="<documents>",
) -> CorpusInfo:
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
        raise CorpusError(
            path,
            f"no word survives the pruning ({len(df)} distinct words in {n} documents, "
            f"min_df={min_df}, max_df={max_df}, max_vocab={max_vocab})",
            "lower min_df, raise max_df or max_vocab, or add documents",
        )
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
            raise CorpusError(
                path,
                f"the second pass saw {m} documents, the first {n}",
                "do not change the documents while the corpus is being built",
            )
        if len(ptr) > 1:
            yield make_shard(np.array(ptr, np.int64), np.concatenate(idx), np.concatenate(cnt), V, offset, path)

    meta = {
        "tokenizer": {
            "pattern": _TOKEN_RE.pattern,
            "min_word_len": min_word_len,
            "min_df": min_df,
            "max_df": max_df,
            "max_vocab": max_vocab,
            "stop_words": stop_words
            if isinstance(stop_words, str) or stop_words is None
            else f"{len(stop)} custom words",
        }
    }
    meta.update(extra_meta or {})
    return write_corpus(
        out_dir, shards(), V, vocab=words, source=source, extra_meta=meta, doc_names=doc_names, compress=compress
    )


def from_text_folder(
    folder,
    out_dir,
    min_df=2,
    max_df=0.5,
    max_vocab=None,
    stop_words="english",
    docs_per_shard=10000,
    min_word_len=2,
    pattern="*.txt",
) -> CorpusInfo:
    """One document per file under ``folder`` matching ``pattern`` (recursive, sorted by relative path).

    Files are read as UTF-8 (undecodable bytes replaced); see :func:`from_documents` for the
    tokenisation and pruning. The relative file paths are stored as the document names.
    """
    root = Path(os.path.abspath(folder))
    if not root.is_dir():
        raise CorpusError(root, "no such folder", "pass the folder that holds the text files")
    files = sorted((p for p in root.rglob(pattern) if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise CorpusError(
            root, f"no files match {pattern!r} (empty corpus)", "check the folder, or pass pattern= matching your files"
        )

    def texts():
        for p in files:
            with open(p, encoding="utf-8", errors="replace") as f:
                yield f.read()

    names = [p.relative_to(root).as_posix().replace("\n", " ") for p in files]
    return from_documents(
        texts,
        out_dir,
        min_df,
        max_df,
        max_vocab,
        stop_words,
        docs_per_shard,
        min_word_len,
        doc_names=names,
        source=f"text folder: {root} ({pattern})",
        path=str(root),
    )
