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

Modules: ``shards`` (in-memory shards, :class:`CorpusError`), ``store`` (the on-disk format, the
shipped corpora), ``uci``, ``text`` and ``matrix`` (the loaders). Everything public is importable
from here: ``from pgmflow.tasks.lda import corpus; corpus.open_corpus(...)``.
"""

from pgmflow.tasks.lda.corpus.matrix import from_matrix_market, from_npz
from pgmflow.tasks.lda.corpus.shards import (
    FORMAT,
    SHIPPED_ALIASES,
    SHIPPED_CORPUS,
    CorpusError,
    DocTermShard,
    doc_lengths,
    make_shard,
    n_docs,
    n_tokens,
    shard_from_dense,
    shard_from_scipy,
    shard_to_scipy,
    slice_docs,
)
from pgmflow.tasks.lda.corpus.store import (
    CorpusInfo,
    iter_shards,
    load_doc_names,
    load_shard,
    load_true_model,
    open_corpus,
    shard_file,
    shipped_corpus_path,
    write_corpus,
)
from pgmflow.tasks.lda.corpus.text import from_documents, from_text_folder, prune_vocabulary, tokenize
from pgmflow.tasks.lda.corpus.uci import from_uci

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
