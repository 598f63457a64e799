"""Evaluation of topic models: document completion, UMass coherence, Hungarian topic matching."""

import numpy as np
import pytest

from pgmflow.tasks.lda import evaluate, synthetic


@pytest.fixture(scope="module")
def data():
    shard, model = synthetic.generate_in_memory(400, 200, 5, seed=2, alpha=0.1, eta=0.05, mean_length=80)
    return shard, model


def test_completion_split_partitions_counts_deterministically(data):
    shard, _ = data
    obs, test = evaluate.completion_split(shard.indptr, shard.indices, shard.counts, seed=1, identity=(3,))
    obs2, test2 = evaluate.completion_split(shard.indptr, shard.indices, shard.counts, seed=1, identity=(3,))
    for a, b in ((obs, obs2), (test, test2)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert obs.counts.sum() + test.counts.sum() == shard.counts.sum()
    assert abs(obs.counts.sum() / shard.counts.sum() - 0.5) < 0.02
    # per document, the halves add up to the original counts
    n = shard.indptr.size - 1
    for d in (0, 7, n - 1):
        full = dict(
            zip(
                shard.indices[shard.indptr[d] : shard.indptr[d + 1]],
                shard.counts[shard.indptr[d] : shard.indptr[d + 1]],
            )
        )
        got = {}
        for part in (obs, test):
            for w, c in zip(
                part.indices[part.indptr[d] : part.indptr[d + 1]], part.counts[part.indptr[d] : part.indptr[d + 1]]
            ):
                got[w] = got.get(w, 0) + c
        assert got == full
    other, _ = evaluate.completion_split(shard.indptr, shard.indices, shard.counts, seed=2, identity=(3,))
    assert not np.array_equal(other.counts, obs.counts)


def test_true_topics_score_better_than_wrong_ones(data):
    shard, model = data
    obs, test = evaluate.completion_split(shard.indptr, shard.indices, shard.counts, seed=0)
    ppl_true = evaluate.perplexity(*evaluate.completion_log_likelihood(obs, test, model.alpha, topics=model.topics))
    flat = np.full_like(model.topics, 1.0 / model.topics.shape[1])
    ppl_flat = evaluate.perplexity(*evaluate.completion_log_likelihood(obs, test, model.alpha, topics=flat))
    assert ppl_flat == pytest.approx(model.topics.shape[1], rel=1e-9)  # uniform words: perplexity = V
    assert ppl_true < 0.7 * ppl_flat
    # lambda proportional to the topics (a sharp posterior) scores like the topics themselves
    ppl_lam = evaluate.perplexity(
        *evaluate.completion_log_likelihood(obs, test, model.alpha, lam=model.topics * 1e6 + 1e-3)
    )
    assert ppl_lam == pytest.approx(ppl_true, rel=0.02)


def test_column_subset_gives_the_same_likelihood(data):
    shard, model = data
    obs, test = evaluate.completion_split(shard.indptr, shard.indices, shard.counts, seed=0)
    lam = model.topics * 500 + 0.1
    full = evaluate.completion_log_likelihood(obs, test, model.alpha, lam=lam)
    cols = np.unique(np.concatenate([obs.indices, test.indices, [0, 5]])).astype(np.int64)
    sub = evaluate.completion_log_likelihood(
        obs, test, model.alpha, lam=lam[:, cols], cols=cols, lam_rowsum=lam.sum(axis=1)
    )
    assert sub[0] == pytest.approx(full[0], rel=1e-12) and sub[1] == full[1]


def test_match_topics_finds_a_permutation():
    rng = np.random.default_rng(0)
    true = rng.dirichlet(np.full(50, 0.1), 6)
    perm = rng.permutation(6)
    est = true[perm] + 1e-4
    assign, cos = evaluate.match_topics(est, true)
    np.testing.assert_array_equal(perm[assign], np.arange(6))
    assert cos.min() > 0.999


def test_umass_coherence_known_answer():
    # 4 documents over words 0..3; top words of the topic: [0, 1, 2]
    docs = [[0, 1], [0, 1, 2], [0], [2, 3]]
    indptr = np.cumsum([0] + [len(d) for d in docs])
    indices = np.concatenate(docs)
    ids = np.array([0, 1, 2])
    df, co = evaluate.cooccurrence(indptr, indices, ids)
    np.testing.assert_array_equal(df, [3, 2, 2])
    assert co[0, 1] == 2 and co[0, 2] == 1 and co[1, 2] == 1
    c = evaluate.umass_coherence(np.array([[0, 1, 2]]), ids, df, co)
    expect = np.log((2 + 1) / 3) + np.log((1 + 1) / 3) + np.log((1 + 1) / 2)
    assert c[0] == pytest.approx(expect)


def test_heldout_mask_fraction_and_determinism():
    m = evaluate.heldout_mask(100000, 0, 3, 0.05)
    assert abs(m.mean() - 0.05) < 0.003
    np.testing.assert_array_equal(m, evaluate.heldout_mask(100000, 0, 3, 0.05))
    assert not evaluate.heldout_mask(10, 0, 3, 0.0).any()
