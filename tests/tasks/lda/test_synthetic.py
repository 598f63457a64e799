"""pgmflow.tasks.lda.synthetic: the LDA generative process, its determinism and its statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.lda import corpus as C
from pgmflow.tasks.lda import synthetic as S


def _same(a, b):
    assert np.array_equal(a.indptr, b.indptr)
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.counts, b.counts)
    assert (a.n_words, a.doc_offset) == (b.n_words, b.doc_offset)


def test_true_model():
    m = S.true_model(6, 300, eta=0.05, seed=4, alpha=0.2)
    assert m.topics.shape == (6, 300) and m.alpha.tolist() == [0.2] * 6
    assert np.allclose(m.topics.sum(axis=1), 1.0) and np.all(m.topics >= 0)
    m2 = S.true_model(6, 300, eta=0.05, seed=4, alpha=0.2)
    assert np.array_equal(m.topics, m2.topics)
    assert not np.allclose(S.true_model(6, 300, seed=5).topics, m.topics)
    # sparse and distinct: each topic puts most of its mass on few words, and topics overlap little
    top = np.sort(m.topics, axis=1)[:, ::-1]
    assert np.all(top[:, :30].sum(axis=1) > 0.8)
    overlap = np.minimum(m.topics[:, None, :], m.topics[None, :, :]).sum(axis=2)
    assert overlap[~np.eye(6, dtype=bool)].max() < 0.3
    # tiny concentrations stay finite (log-space Dirichlet)
    tiny = S.true_model(3, 50, eta=1e-4, seed=0)
    assert np.all(np.isfinite(tiny.topics)) and np.allclose(tiny.topics.sum(axis=1), 1.0)
    assert S.true_model(3, 50, alpha=[0.1, 0.2, 0.3]).alpha.tolist() == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError):
        S.true_model(3, 50, alpha=-1.0)


def test_generate_shard_is_valid_and_deterministic():
    m = S.true_model(5, 200, seed=1)
    a = S.generate_shard(m, 300, 600, 2, seed=7, mean_length=40)
    b = S.generate_shard(m, 300, 600, 2, seed=7, mean_length=40)
    _same(a, b)
    assert a.doc_offset == 600 and a.n_words == 200 and C.n_docs(a) == 300
    assert a.indptr.dtype == np.int64 and a.indices.dtype == np.int32 and a.counts.dtype == np.float64
    _same(a, C.make_shard(a.indptr, a.indices, a.counts, a.n_words, a.doc_offset))  # already canonical
    assert C.doc_lengths(a).min() >= 1
    # another shard index or seed gives other documents
    assert not np.array_equal(
        C.shard_to_scipy(a).toarray(),
        C.shard_to_scipy(S.generate_shard(m, 300, 600, 3, seed=7, mean_length=40)).toarray(),
    )
    assert not np.array_equal(
        C.shard_to_scipy(a).toarray(),
        C.shard_to_scipy(S.generate_shard(m, 300, 600, 2, seed=8, mean_length=40)).toarray(),
    )
    # numba kernel == the NumPy oracle, bit for bit
    _same(a, S._generate_shard_numpy(m, 300, 600, 2, seed=7, mean_length=40))
    tiny = S.true_model(5, 200, seed=1, alpha=0.01)  # theta drawn in log space
    t = S.generate_shard(tiny, 200, 0, 0, seed=2, mean_length=20)
    _same(t, S._generate_shard_numpy(tiny, 200, 0, 0, seed=2, mean_length=20))
    assert np.isfinite(S._draw(tiny, 200, 0, 2, 20)[0]).all()
    # short documents: at least one token each
    short = S.generate_shard(m, 500, 0, 0, seed=1, mean_length=0.3)
    assert C.doc_lengths(short).min() == 1
    assert C.n_docs(S.generate_shard(m, 0, 0, 0, seed=1)) == 0


def test_corpus_shards_do_not_depend_on_the_others(tmp_path):
    info = S.generate_corpus(
        tmp_path / "c",
        n_docs=250,
        n_words=120,
        n_topics=4,
        seed=11,
        alpha=0.3,
        eta=0.1,
        mean_length=30,
        docs_per_shard=100,
    )
    assert info.shard_docs == (100, 100, 50) and info.n_words == 120 and info.vocab is None
    m = S.true_model(4, 120, eta=0.1, seed=11, alpha=0.3)
    # each shard alone, in any order, equals the shard in the corpus
    for i in (2, 0, 1):
        alone = S.generate_shard(m, info.shard_docs[i], info.shard_offsets[i], i, seed=11, mean_length=30)
        _same(alone, C.load_shard(info, i))
    topics, alpha = C.load_true_model(info)
    assert np.array_equal(topics, m.topics) and np.array_equal(alpha, m.alpha)
    assert info.true_topics == str(tmp_path / "c" / "true_topics.npy")
    syn = json.loads((tmp_path / "c" / "meta.json").read_text())["synthetic"]
    assert syn == info.meta["synthetic"]
    assert (
        syn["n_docs"],
        syn["n_words"],
        syn["n_topics"],
        syn["seed"],
        syn["alpha"],
        syn["eta"],
        syn["mean_length"],
        syn["docs_per_shard"],
    ) == (250, 120, 4, 11, 0.3, 0.1, 30.0, 100)
    # in memory == a one-shard corpus
    shard, model = S.generate_in_memory(250, 120, 4, seed=11, alpha=0.3, eta=0.1, mean_length=30)
    one = S.generate_corpus(
        tmp_path / "one", 250, 120, 4, seed=11, alpha=0.3, eta=0.1, mean_length=30, docs_per_shard=1000
    )
    _same(shard, C.load_shard(one, 0))
    assert np.array_equal(model.topics, m.topics)


def test_statistics_match_the_generative_process():
    K, V, D, L, seed, idx = 6, 80, 20000, 60, 3, 5
    m = S.true_model(K, V, eta=0.1, seed=seed, alpha=0.2)
    s = S.generate_shard(m, D, 0, idx, seed=seed, mean_length=L)
    lengths = C.doc_lengths(s)
    assert abs(lengths.mean() - L) < 4 * np.sqrt(L / D)
    assert abs(lengths.var() - L) < 0.1 * L  # Poisson
    # the documents' proportions theta_d are the first draws of the shard's generator
    theta = S._draw(m, D, idx, seed, L)[0]
    g = _rng.generator(seed, _rng.STAGE_LDA_SYNTH_DOCS, idx)
    assert np.array_equal(theta, S._dirichlet(g, m.alpha, (D, K)))
    assert np.allclose(theta.mean(axis=0), m.alpha / m.alpha.sum(), atol=0.01)
    expected = (lengths[:, None] * theta).sum(axis=0) @ m.topics  # sum_d N_d theta_d . topics
    observed = np.bincount(s.indices, weights=s.counts, minlength=V)
    # multinomial noise only (given theta): a few standard deviations per word
    z = (observed - expected) / np.sqrt(expected + 1.0)
    assert np.abs(z).max() < 6 and abs(z.mean()) < 0.5
    # per-document: the words of documents dominated by topic k follow topic k
    for k in range(K):
        docs = np.flatnonzero(theta[:, k] > 0.95)
        assert docs.size > 100
        sub = C.slice_docs(s, docs)
        freq = np.bincount(sub.indices, weights=sub.counts, minlength=V)
        freq /= freq.sum()
        assert 0.5 * np.abs(freq - m.topics[k]).sum() < 0.08
