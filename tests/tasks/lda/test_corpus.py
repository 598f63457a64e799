"""pgmflow.tasks.lda.corpus: shards, the on-disk format, its errors, the loaders and the shipped corpus."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from pgmflow.tasks.lda import corpus as C
from pgmflow.tasks.lda.corpus import uci as uci_loader


def _dense(seed=0, n=7, V=11, density=0.4):
    r = np.random.default_rng(seed)
    X = r.integers(1, 5, size=(n, V)) * (r.random((n, V)) < density)
    X[2] = 0  # an empty document
    return X.astype(np.float64)


def _assert_error(exc_info, path, *words):
    e = exc_info.value
    msg = str(e)
    assert msg == f"{e.path}: {e.problem}; fix: {e.fix}"
    assert str(path) in msg, msg
    assert e.fix and "; fix: " in msg
    for w in words:
        assert w in msg, msg


def _same(a: C.DocTermShard, b: C.DocTermShard):
    assert np.array_equal(a.indptr, b.indptr)
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.counts, b.counts)
    assert a.n_words == b.n_words and a.doc_offset == b.doc_offset


# --- CorpusError and in-memory shards ---------------------------------------------------------------


def test_corpus_error_format_attributes_and_pickle():
    e = C.CorpusError("/x/y", "broken", "mend it")
    assert isinstance(e, ValueError)
    assert str(e) == "/x/y: broken; fix: mend it"
    assert (e.path, e.problem, e.fix) == ("/x/y", "broken", "mend it")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is C.CorpusError and str(e2) == str(e) and e2.fix == "mend it"


def test_make_shard_canonicalises():
    # doc 0: words 3, 1, 3 (duplicate), 2 with count 0; doc 1 empty; doc 2: word 0
    s = C.make_shard([0, 4, 4, 5], [3, 1, 3, 2, 0], [1, 2, 5, 0, 7], n_words=4, doc_offset=10)
    assert s.indptr.dtype == np.int64 and s.indices.dtype == np.int32 and s.counts.dtype == np.float64
    assert s.indptr.tolist() == [0, 2, 2, 3]
    assert s.indices.tolist() == [1, 3, 0]
    assert s.counts.tolist() == [2.0, 6.0, 7.0]
    assert (s.n_words, s.doc_offset) == (4, 10)
    assert C.n_docs(s) == 3 and C.n_tokens(s) == 15.0
    assert C.doc_lengths(s).tolist() == [8.0, 0.0, 7.0]


def test_make_shard_keeps_canonical_arrays_without_copy():
    indptr = np.array([0, 2, 3], np.int64)
    indices = np.array([0, 5, 1], np.int32)
    counts = np.array([1.0, 2.0, 3.0])
    s = C.make_shard(indptr, indices, counts, 6)
    assert s.indptr is indptr and s.indices is indices and s.counts is counts


@pytest.mark.parametrize(
    "indptr,indices,counts,words",
    [
        ([0, 2], [0, 1], [1.0, -2.0], ["negative count", "document 5"]),
        ([0, 2], [0, 1], [1.0, np.nan], ["non-finite"]),
        ([0, 2], [0, 1], [np.inf, 1.0], ["non-finite"]),
        ([0, 2], [0, 9], [1.0, 1.0], ["word id 9", "n_words = 4"]),
        ([0, 2], [-1, 1], [1.0, 1.0], ["word id -1"]),
        ([0, 2, 1, 2], [0, 1], [1.0, 1.0], ["not monotone"]),
        ([0, 3], [0, 1], [1.0, 1.0], ["end at len(indices)"]),
        ([1, 2], [0, 1], [1.0, 1.0], ["start at 0"]),
        ([0, 2], [0.0, 1.0], [1.0, 1.0], ["integer"]),
    ],
)
def test_make_shard_errors(indptr, indices, counts, words):
    with pytest.raises(C.CorpusError) as ei:
        C.make_shard(np.array(indptr), np.array(indices), np.array(counts), 4, doc_offset=5, path="/data/x.npz")
    _assert_error(ei, "/data/x.npz", *words)


def test_dense_scipy_round_trip_and_slice():
    X = _dense()
    s = C.shard_from_dense(X, doc_offset=3)
    assert s.doc_offset == 3 and s.n_words == X.shape[1]
    assert np.array_equal(C.shard_to_scipy(s).toarray(), X)
    s2 = C.shard_from_scipy(sp.csr_matrix(X), doc_offset=3)
    _same(s, s2)
    # any sparse format, unsorted/duplicate entries
    coo = sp.coo_matrix((np.array([1.0, 2.0, 3.0]), (np.array([1, 0, 1]), np.array([2, 0, 2]))), shape=(2, 3))
    s3 = C.shard_from_scipy(coo)
    assert s3.indices.tolist() == [0, 2] and s3.counts.tolist() == [2.0, 4.0]
    sub = C.slice_docs(s, [4, 0, 2])
    assert sub.doc_offset == 3
    assert np.array_equal(C.shard_to_scipy(sub).toarray(), X[[4, 0, 2]])
    mask = np.zeros(X.shape[0], bool)
    mask[[1, 5]] = True
    assert np.array_equal(C.shard_to_scipy(C.slice_docs(s, mask)).toarray(), X[[1, 5]])
    assert C.n_docs(C.slice_docs(s, [])) == 0
    assert np.array_equal(C.shard_to_scipy(C.slice_docs(s, [-1])).toarray(), X[[-1]])
    with pytest.raises(IndexError):
        C.slice_docs(s, [X.shape[0]])
    with pytest.raises(C.CorpusError):
        C.shard_from_dense(-X)


def test_shard_pickles():
    s = C.shard_from_dense(_dense())
    _same(s, pickle.loads(pickle.dumps(s)))


# --- write / open / load ---------------------------------------------------------------------------


def _shards(X, sizes, V=None):
    lo = 0
    for n in sizes:
        yield C.shard_from_dense(X[lo : lo + n], doc_offset=999)  # offsets are renumbered by write_corpus
        lo += n


def test_write_open_load_round_trip(tmp_path):
    X = _dense(n=10)
    X[4, 3] = 2.1  # not exact in float32: that shard keeps float64 on disk
    vocab = [f"w{i}" for i in range(X.shape[1])]
    names = [f"doc {i}" for i in range(10)]
    empty = C.shard_from_dense(np.zeros((0, X.shape[1])))
    shards = [*_shards(X, [3, 4]), empty, *_shards(X[7:], [3])]
    info = C.write_corpus(
        tmp_path / "c",
        iter(shards),
        X.shape[1],
        vocab=vocab,
        source="test",
        extra_meta={"note": {"a": 1}},
        doc_names=names,
    )
    assert info.path == str((tmp_path / "c").absolute())
    assert (info.n_docs, info.n_words, info.nnz) == (10, X.shape[1], int((X != 0).sum()))
    assert info.n_tokens == pytest.approx(X.sum())
    assert info.shard_docs == (3, 4, 3) and info.shard_offsets == (0, 3, 7)
    assert info.vocab == tuple(vocab) and info.true_topics is None
    assert info.meta["note"] == {"a": 1} and info.meta["source"] == "test" and info.meta["format"] == C.FORMAT
    assert C.open_corpus(tmp_path / "c") == info
    assert C.load_doc_names(info) == names
    assert C.load_true_model(info) is None
    with np.load(tmp_path / "c" / "shard_00000.npz") as z:
        assert z["counts"].dtype == np.float32 and z["indices"].dtype == np.int32 and z["indptr"].dtype == np.int64
    with np.load(tmp_path / "c" / "shard_00001.npz") as z:
        assert z["counts"].dtype == np.float64
    got = []
    for i, s in enumerate(C.iter_shards(str(tmp_path / "c"))):
        assert s.counts.dtype == np.float64 and s.doc_offset == info.shard_offsets[i]
        m = C.load_shard(info, i, mmap=True)
        _same(s, m)
        got.append(C.shard_to_scipy(s).toarray())
    assert np.array_equal(np.vstack(got), X)
    assert C.shard_file(info, 2).endswith("shard_00002.npz")
    with pytest.raises(IndexError):
        C.load_shard(info, 3)


def test_compressed_corpus_and_rewrite_removes_stale_shards(tmp_path):
    X = _dense(n=9)
    C.write_corpus(tmp_path, _shards(X, [3, 3, 3]), X.shape[1])
    info = C.write_corpus(tmp_path, _shards(X, [9]), X.shape[1], compress=True)
    assert sorted(p.name for p in tmp_path.glob("shard_*")) == ["shard_00000.npz"]
    assert info.vocab is None and info.shard_docs == (9,)
    for mmap in (False, True):
        assert np.array_equal(C.shard_to_scipy(C.load_shard(tmp_path, 0, mmap=mmap)).toarray(), X)


def test_write_corpus_errors(tmp_path):
    X = _dense()
    with pytest.raises(C.CorpusError) as ei:
        C.write_corpus(tmp_path / "a", _shards(X, [7]), X.shape[1] + 1)
    _assert_error(ei, tmp_path / "a", "n_words")
    with pytest.raises(C.CorpusError) as ei:
        C.write_corpus(tmp_path / "b", [], 5)
    _assert_error(ei, tmp_path / "b", "empty corpus")
    with pytest.raises(C.CorpusError) as ei:
        C.write_corpus(tmp_path / "c", _shards(X, [7]), X.shape[1], vocab=["a", "b"])
    _assert_error(ei, tmp_path / "c", "vocab has 2 words")
    with pytest.raises(C.CorpusError) as ei:
        C.write_corpus(tmp_path / "d", _shards(X, [7]), X.shape[1], extra_meta={"n_docs": 3})
    _assert_error(ei, tmp_path / "d", "reserved")
    with pytest.raises(C.CorpusError) as ei:
        C.write_corpus(tmp_path / "e", _shards(X, [7]), X.shape[1], vocab=["a\nb"] + ["c"] * (X.shape[1] - 1))
    _assert_error(ei, tmp_path / "e", "line breaks")


def test_crashed_write_leaves_no_meta(tmp_path):
    X = _dense()

    def bad():
        yield C.shard_from_dense(X[:3])
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError):
        C.write_corpus(tmp_path, bad(), X.shape[1])
    assert not (tmp_path / "meta.json").exists()
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(tmp_path)
    _assert_error(ei, tmp_path / "meta.json", "missing meta.json")


@pytest.fixture
def corpus_dir(tmp_path):
    X = _dense(n=10)
    C.write_corpus(tmp_path / "c", _shards(X, [4, 6]), X.shape[1], vocab=[f"w{i}" for i in range(X.shape[1])])
    return tmp_path / "c"


def _edit_meta(d, fn):
    m = json.loads((d / "meta.json").read_text())
    fn(m)
    (d / "meta.json").write_text(json.dumps(m))


def test_open_corpus_errors(tmp_path, corpus_dir):
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(tmp_path / "nowhere")
    _assert_error(ei, tmp_path / "nowhere", "no such corpus directory")
    (tmp_path / "empty").mkdir()
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(tmp_path / "empty")
    _assert_error(ei, tmp_path / "empty" / "meta.json", "missing meta.json")

    meta = corpus_dir / "meta.json"
    good = meta.read_text()

    def check(edit, path, *words):
        meta.write_text(good)
        edit()
        with pytest.raises(C.CorpusError) as ei:
            C.open_corpus(corpus_dir)
        _assert_error(ei, path, *words)
        meta.write_text(good)

    check(lambda: meta.write_text("{not json"), meta, "malformed JSON")
    check(lambda: _edit_meta(corpus_dir, lambda m: m.update(format="other/2")), meta, "format tag")
    check(lambda: _edit_meta(corpus_dir, lambda m: m.pop("n_words")), meta, "n_words")
    check(
        lambda: _edit_meta(corpus_dir, lambda m: m["shards"][1].update(doc_offset=5)),
        meta,
        "inconsistent shard offsets",
    )
    check(lambda: _edit_meta(corpus_dir, lambda m: m.update(n_docs=11)), meta, "inconsistent shard doc counts")
    check(lambda: _edit_meta(corpus_dir, lambda m: m["shards"][0].update(n_docs=5)), meta, "inconsistent shard offsets")
    check(lambda: _edit_meta(corpus_dir, lambda m: m.update(n_docs=0)), meta, "empty corpus")
    check(lambda: _edit_meta(corpus_dir, lambda m: m["shards"][0].update(file="../x.npz")), meta, "not a file inside")

    shard1 = corpus_dir / "shard_00001.npz"
    shard1.rename(corpus_dir / "moved.npz")
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(corpus_dir)
    _assert_error(ei, shard1, "missing")
    (corpus_dir / "moved.npz").rename(shard1)

    vocab = corpus_dir / "vocab.txt"
    words = vocab.read_text()
    vocab.write_text(words + "extra\n")
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(corpus_dir)
    _assert_error(ei, vocab, "vocab.txt has 12 lines but n_words = 11")
    vocab.unlink()
    with pytest.raises(C.CorpusError) as ei:
        C.open_corpus(corpus_dir)
    _assert_error(ei, vocab, "missing")
    vocab.write_text(words)
    C.open_corpus(corpus_dir)  # all good again


def _rewrite_shard(path, **arrays):
    with np.load(path) as z:
        d = {k: z[k] for k in z.files}
    d.update(arrays)
    for k in [k for k, v in d.items() if v is None]:
        del d[k]
    np.savez(path, **d)


@pytest.mark.parametrize(
    "edit,words",
    [
        (lambda c: {"counts": np.where(np.arange(c.size) == 1, -1.0, c)}, ["negative count"]),
        (lambda c: {"counts": np.where(np.arange(c.size) == 0, np.nan, c)}, ["non-finite"]),
        (lambda c: {"indices": np.full(c.size, 11, np.int32)}, ["word id 11", "n_words = 11"]),
        (lambda c: {"counts": None}, ["lacks"]),
        (lambda c: {"counts": c[:-1], "indices": None}, ["lacks"]),
    ],
)
def test_load_shard_errors(corpus_dir, edit, words):
    f = corpus_dir / "shard_00001.npz"
    with np.load(f) as z:
        counts = z["counts"].astype(np.float64)
    _rewrite_shard(f, **edit(counts))
    info = C.open_corpus(corpus_dir)
    C.load_shard(info, 0)  # the other shard is fine
    for mmap in (False, True):
        with pytest.raises(C.CorpusError) as ei:
            C.load_shard(info, 1, mmap=mmap)
        _assert_error(ei, f, *words)


def test_load_shard_corrupt_or_resized(corpus_dir):
    f = corpus_dir / "shard_00000.npz"
    with np.load(f) as z:
        d = {k: z[k] for k in z.files}
    np.savez(f, indptr=d["indptr"][:-1], indices=d["indices"][:0], counts=d["counts"][:0])
    with pytest.raises(C.CorpusError) as ei:
        C.load_shard(corpus_dir, 0)
    _assert_error(ei, f, "meta.json says")
    f.write_bytes(b"this is not a zip file")
    with pytest.raises(C.CorpusError) as ei:
        C.load_shard(corpus_dir, 0)
    _assert_error(ei, f, "not a readable .npz")


# --- UCI bag of words -------------------------------------------------------------------------------


UCI_BODY = [(1, 2, 3), (1, 5, 1), (2, 1, 4), (4, 3, 2), (4, 2, 1), (4, 5, 7), (5, 4, 1)]  # doc 3, 6, 7 empty


def _write_uci(path: Path, D=7, W=5, body=UCI_BODY, nnz=None, gz=False):
    lines = [str(D), str(W), str(len(body) if nnz is None else nnz)] + [" ".join(map(str, t)) for t in body]
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def _uci_dense(D=7, W=5, body=UCI_BODY):
    X = np.zeros((D, W))
    for d, w, c in body:
        X[d - 1, w - 1] += c
    return X


@pytest.mark.parametrize("gz", [False, True])
def test_from_uci(tmp_path, gz, monkeypatch):
    monkeypatch.setattr(uci_loader, "_UCI_CHUNK", 9)  # many chunk boundaries inside lines
    dw = _write_uci(tmp_path / ("docword.txt.gz" if gz else "docword.txt"), gz=gz)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("alpha\nbeta\ngamma\ndelta\nepsilon\n")
    info = C.from_uci(dw, vocab, tmp_path / "out", docs_per_shard=2)
    assert info.n_docs == 7 and info.n_words == 5 and info.shard_docs == (2, 2, 2, 1)
    assert info.vocab == ("alpha", "beta", "gamma", "delta", "epsilon")
    X = np.vstack([C.shard_to_scipy(s).toarray() for s in C.iter_shards(info)])
    assert np.array_equal(X, _uci_dense())
    assert X[2].sum() == 0 and X[5:].sum() == 0  # skipped and trailing docIDs are empty documents
    info2 = C.from_uci(dw, None, tmp_path / "out2")
    assert info2.vocab is None and info2.shard_docs == (7,)


@pytest.mark.parametrize(
    "kwargs,vocab_lines,words",
    [
        ({}, 4, ["vocabulary-size mismatch"]),
        ({"body": UCI_BODY[:2] + [(2, 6, 1)]}, 5, ["wordID 6"]),
        ({"body": UCI_BODY[:5] + [(17 - 10, 1, -2)]}, 5, ["document 7 has a negative count"]),
        ({"nnz": 9}, 5, ["NNZ mismatch"]),
        ({"body": [(2, 1, 1), (1, 1, 1)]}, 5, ["not sorted"]),
        ({"body": [(1, 1, 1), (9, 1, 1)]}, 5, ["docID 9"]),
        ({"body": [(1, 1, 1), (2, 1, "x")]}, 5, ["line 5"]),
        ({"D": 0, "body": []}, 5, ["empty corpus"]),
    ],
)
def test_from_uci_errors(tmp_path, kwargs, vocab_lines, words):
    dw = _write_uci(tmp_path / "docword.txt", **kwargs)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(vocab_lines)))
    with pytest.raises(C.CorpusError) as ei:
        C.from_uci(dw, vocab, tmp_path / "out")
    _assert_error(ei, vocab if vocab_lines != 5 else dw, *words)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_from_uci_negative_count_message(tmp_path):
    body = [(d, 1, 1) for d in range(1, 17)] + [(17, 3, -1)]
    dw = _write_uci(tmp_path / "docword.txt", D=20, W=3, body=body)
    with pytest.raises(C.CorpusError) as ei:
        C.from_uci(dw, None, tmp_path / "out")
    _assert_error(ei, dw, "document 17 has a negative count")


# --- plain text -------------------------------------------------------------------------------------


def test_tokenize():
    t = C.tokenize("The Matrix's EIGENVALUES don't converge; x2 y_1 3d a_b_ 'quoted' I am.")
    assert t == ["matrix", "eigenvalues", "converge", "x2", "y_1", "a_b", "quoted"]
    assert C.tokenize("the cat", stop_words=None) == ["the", "cat"]
    assert C.tokenize("big cat a", min_word_len=1, stop_words={"cat"}) == ["big", "a"]
    with pytest.raises(ValueError):
        C.tokenize("x", stop_words="klingon")


def test_prune_vocabulary():
    df = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 2}
    tf = {"a": 10, "b": 5, "c": 9, "d": 20, "e": 7}
    assert C.prune_vocabulary(df, tf, 4, min_df=2, max_df=0.75) == ["b", "c", "e"]
    assert C.prune_vocabulary(df, tf, 4, min_df=2, max_df=3) == ["b", "c", "e"]
    assert C.prune_vocabulary(df, tf, 4, min_df=1, max_df=1.0, max_vocab=2) == ["a", "d"]
    with pytest.raises(ValueError):
        C.prune_vocabulary(df, tf, 4, max_df=1.5)


def test_from_text_folder(tmp_path):
    src = tmp_path / "docs"
    (src / "sub").mkdir(parents=True)
    texts = {
        "b.txt": "Sparse matrices store sparse data. The matrix is sparse.",
        "a.txt": "Eigenvalues of a matrix; eigenvalues and eigenvectors.",
        "sub/c.txt": "Fourier transform of a signal. Signal filter.",
        "d.txt": "Filter the signal with a window; matrix window.",
        "e.txt": "Rare words only: zebra quokka.",
        "ignored.md": "matrix matrix signal",
    }
    for name, text in texts.items():
        (src / name).write_text(text)
    info = C.from_text_folder(src, tmp_path / "out", min_df=2, max_df=0.5, docs_per_shard=2)
    assert info.n_docs == 5 and info.shard_docs == (2, 2, 1)
    assert C.load_doc_names(info) == ["a.txt", "b.txt", "d.txt", "e.txt", "sub/c.txt"]
    # df: matrix 3 (> 0.5 * 5: pruned), signal 2, filter 2, window 1, eigenvalues 1, sparse 1 ...
    assert info.vocab == ("filter", "signal")
    X = np.vstack([C.shard_to_scipy(s).toarray() for s in C.iter_shards(info)])
    assert X.tolist() == [[0, 0], [0, 0], [1, 1], [0, 0], [1, 2]]  # the empty documents stay
    assert info.meta["tokenizer"]["min_df"] == 2
    info2 = C.from_text_folder(src, tmp_path / "out2", min_df=1, max_df=1.0, max_vocab=3, stop_words=None)
    assert info2.vocab == ("matrix", "signal", "sparse")  # the 3 most frequent (ties alphabetical)


def test_from_text_errors(tmp_path):
    with pytest.raises(C.CorpusError) as ei:
        C.from_text_folder(tmp_path / "none", tmp_path / "out")
    _assert_error(ei, tmp_path / "none", "no such folder")
    (tmp_path / "empty").mkdir()
    with pytest.raises(C.CorpusError) as ei:
        C.from_text_folder(tmp_path / "empty", tmp_path / "out")
    _assert_error(ei, tmp_path / "empty", "no files match", "empty corpus")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x.txt").write_text("lonely words here")
    with pytest.raises(C.CorpusError) as ei:
        C.from_text_folder(tmp_path / "one", tmp_path / "out")
    _assert_error(ei, tmp_path / "one", "no word survives", "lower min_df")
    with pytest.raises(C.CorpusError) as ei:
        C.from_documents(iter(["a b", "c d"]), tmp_path / "out")
    _assert_error(ei, "<documents>", "one-shot iterator")


def test_from_documents_callable(tmp_path):
    docs = ["gamma beta", "gamma delta", "beta gamma gamma", "delta"]
    info = C.from_documents(lambda: iter(docs), tmp_path / "o", min_df=2, max_df=1.0, doc_names=list("abcd"))
    assert info.vocab == ("beta", "delta", "gamma")
    X = C.shard_to_scipy(C.load_shard(info, 0)).toarray()
    assert X.tolist() == [[1, 0, 1], [0, 1, 1], [1, 0, 2], [0, 1, 0]]


# --- sparse matrices --------------------------------------------------------------------------------


def test_from_matrix_market_and_npz(tmp_path):
    X = _dense(n=9, V=6)
    scipy.io.mmwrite(str(tmp_path / "m.mtx"), sp.coo_matrix(X))
    vocab = tmp_path / "v.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(6)))
    info = C.from_matrix_market(tmp_path / "m.mtx", tmp_path / "o1", docs_per_shard=4, vocab_path=vocab)
    assert info.shard_docs == (4, 4, 1) and info.vocab == tuple(f"w{i}" for i in range(6))
    assert np.array_equal(np.vstack([C.shard_to_scipy(s).toarray() for s in C.iter_shards(info)]), X)
    scipy.io.mmwrite(str(tmp_path / "t.mtx"), sp.coo_matrix(X.T))
    info = C.from_matrix_market(tmp_path / "t.mtx", tmp_path / "o2", transpose=True)
    assert np.array_equal(C.shard_to_scipy(C.load_shard(info, 0)).toarray(), X)
    sp.save_npz(tmp_path / "m.npz", sp.csr_matrix(X))
    info = C.from_npz(tmp_path / "m.npz", tmp_path / "o3", docs_per_shard=5)
    assert info.shard_docs == (5, 4)
    assert np.array_equal(np.vstack([C.shard_to_scipy(s).toarray() for s in C.iter_shards(info)]), X)


def test_matrix_errors(tmp_path):
    X = _dense(n=4, V=3)
    X[2, 1] = -1
    scipy.io.mmwrite(str(tmp_path / "neg.mtx"), sp.coo_matrix(X))
    with pytest.raises(C.CorpusError) as ei:
        C.from_matrix_market(tmp_path / "neg.mtx", tmp_path / "o")
    _assert_error(ei, tmp_path / "neg.mtx", "document 2 has a negative", "transpose")
    (tmp_path / "bad.mtx").write_text("not a matrix market file\n")
    with pytest.raises(C.CorpusError) as ei:
        C.from_matrix_market(tmp_path / "bad.mtx", tmp_path / "o")
    _assert_error(ei, tmp_path / "bad.mtx", "not a readable Matrix Market file")
    scipy.io.mmwrite(str(tmp_path / "ok.mtx"), sp.coo_matrix(np.abs(X)))
    vocab = tmp_path / "v.txt"
    vocab.write_text("a\nb\n")
    with pytest.raises(C.CorpusError) as ei:
        C.from_matrix_market(tmp_path / "ok.mtx", tmp_path / "o", vocab_path=vocab)
    _assert_error(ei, vocab, "vocabulary-size mismatch")
    with pytest.raises(C.CorpusError) as ei:
        C.from_npz(tmp_path / "missing.npz", tmp_path / "o")
    _assert_error(ei, tmp_path / "missing.npz", "not found")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(C.CorpusError) as ei:
        C.from_npz(tmp_path / "plain.npz", tmp_path / "o")
    _assert_error(ei, tmp_path / "plain.npz", "not a scipy.sparse .npz file")


# --- the shipped corpus -----------------------------------------------------------------------------


def test_shipped_corpus():
    path = C.shipped_corpus_path()
    assert C.shipped_corpus_path("docstrings") == path
    info = C.open_corpus(path)
    assert 3000 <= info.n_docs <= 10000
    assert 2000 <= info.n_words <= 10000 and len(info.vocab) == info.n_words
    assert info.n_tokens > 100_000
    assert {"matrix", "eigenvalues", "sparse", "fourier", "distribution", "filter"} <= set(info.vocab)
    names = C.load_doc_names(info)
    assert len(names) == info.n_docs and "scipy.linalg.svd" in names
    nnz, tokens = 0, 0.0
    for s in C.iter_shards(info):
        nnz += s.indices.size
        tokens += C.n_tokens(s)
        assert s.counts.min() >= 1 and np.all(s.counts == np.round(s.counts))
    assert (nnz, tokens) == (info.nnz, info.n_tokens)
    # the document of scipy.linalg.svd speaks of singular values
    d = names.index("scipy.linalg.svd")
    j = max(i for i, off in enumerate(info.shard_offsets) if off <= d)
    s = C.load_shard(info, j)
    words = {info.vocab[w] for w in s.indices[s.indptr[d - s.doc_offset] : s.indptr[d - s.doc_offset + 1]]}
    assert {"singular", "decomposition"} <= words
    readme = (Path(path) / "README.md").read_text()
    licence = (Path(path) / "LICENSE.txt").read_text()
    for text in (readme, licence):
        assert "NumPy Developers" in text and "SciPy Developers" in text and "Redistribution and use" in text
    assert str(info.n_docs) in readme
    with pytest.raises(C.CorpusError) as ei:
        C.shipped_corpus_path("nope")
    _assert_error(ei, "nope", "no shipped corpus")
