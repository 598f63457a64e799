"""SVI for LDA end to end: real Hydra composition, a real LocalCluster, a real MLflow store.

- the true topics of a synthetic corpus are recovered and held-out perplexity approaches the true model's;
- lambda is bit-identical on 1, 2 and 4 workers and on the synchronous scheduler;
- posterior-regularization constraints move the posterior as intended;
- the shipped corpus runs with figures and tables logged.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipelines.helpers import run


def _lambda(tr):
    with np.load(tr.download("lambda.npz")) as z:
        return z["lam"]


@pytest.fixture(scope="module")
def synth_corpus(tmp_path_factory):
    """4,000 documents from 8 known topics over 400 words, in 8 shards."""
    from pgmflow.tasks.lda import synthetic

    out = tmp_path_factory.mktemp("corpus") / "synth"
    synthetic.generate_corpus(
        str(out), n_docs=4000, n_words=400, n_topics=8, seed=3, alpha=0.1, eta=0.05, mean_length=80, docs_per_shard=500
    )
    return str(out)


def _synth(path, *extra):
    return [
        "pipeline=svi",
        "corpus=sharded",
        f"corpus.path={path}",
        "model.K=8",
        "progress=false",
        "svi.batch_size=200",
        "svi.tau0=8",
        "svi.kappa=0.6",
        *extra,
    ]


@pytest.mark.slow
def test_synthetic_topics_are_recovered(synth_corpus, mlflow_uri, cluster2):
    res, tr = run(
        _synth(synth_corpus, "svi.n_epochs=6", "svi.eval_every=40", "svi.figures=false"), mlflow_uri, cluster2
    )
    assert res["topic_recovery_mean_cosine"] > 0.9, res
    # held-out perplexity approaches the true model's (within 5 %)
    assert res["heldout_perplexity"] < 1.05 * res["true_model_perplexity"], res
    assert res["heldout_perplexity"] > 0.95 * res["true_model_perplexity"], res  # not better than the truth
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_lambda_is_bit_identical_across_worker_counts(synth_corpus, mlflow_uri, cluster_factory):
    ov = _synth(synth_corpus, "svi.max_steps=12", "svi.eval_every=6", "svi.figures=false")
    lams, results = [], []
    for n in (1, 2, 4):
        res, tr = run(ov, mlflow_uri, cluster_factory(n))
        lams.append(_lambda(tr))
        results.append(res)
    res_s, tr_s = run(ov, mlflow_uri, None)  # the synchronous scheduler, no cluster at all
    lams.append(_lambda(tr_s))
    for lam in lams[1:]:
        np.testing.assert_array_equal(lams[0], lam)
    assert len({r["heldout_perplexity"] for r in results + [res_s]}) == 1


def test_seed_words_move_their_topic(synth_corpus, mlflow_uri, cluster2):
    """Seeding the top words of true topic 5 into model topic 0 makes topic 0 that topic."""
    from pgmflow.tasks.lda import corpus, evaluate

    true = np.load(corpus.open_corpus(synth_corpus).true_topics)
    seeds = [int(w) for w in np.argsort(-true[5])[:5]]
    ov = _synth(
        synth_corpus,
        "svi.n_epochs=2",
        "svi.eval_every=0",
        "svi.figures=false",
        f"+pr.seed_words={{0: {seeds}}}".replace("+pr", "pr"),
        "pr.seed_mass=0.9",
    )
    res, tr = run(ov, mlflow_uri, cluster2)
    lam = _lambda(tr)
    beta0 = lam[0] / lam[0].sum()
    cos = beta0 @ true[5] / np.linalg.norm(beta0) / np.linalg.norm(true[5])
    assert cos > 0.8, cos
    assert res["pr_seed_topic_mass_with"] > res["pr_seed_topic_mass_without"]
    assign, _ = evaluate.match_topics(lam, true)
    assert assign[5] == 0


@pytest.mark.slow
def test_topic_cap_makes_documents_use_fewer_topics(synth_corpus, mlflow_uri, cluster2):
    ov = _synth(synth_corpus, "svi.max_steps=10", "svi.eval_every=0", "svi.figures=false", "pr.topic_cap=1.5")
    res, _ = run(ov, mlflow_uri, cluster2)
    assert res["pr_topics_over_5pct_with"] < res["pr_topics_over_5pct_without"], res


def test_shipped_corpus_logs_tables_and_figures(mlflow_uri, cluster2):
    res, tr = run(["pipeline=svi", "debug=default", "progress=false"], mlflow_uri, cluster2)
    arts = set(tr.list_artifacts()) | set(tr.list_artifacts("figures")) | set(tr.list_artifacts("tables"))
    for name in (
        "lambda.npz",
        "results.json",
        "figures/perplexity.png",
        "figures/top_words.png",
        "figures/topic_word_heatmap.png",
        "tables/top_words.csv",
        "tables/top_words.md",
    ):
        assert name in arts, arts
    table = tr.read_text("tables/top_words.csv").splitlines()
    assert len(table) == 1 + 8 and table[0].startswith("topic,coherence_umass,word_1")
    assert all(w.isalpha() or "_" in w for w in table[1].split(",")[2:])  # real words from the vocabulary
    hist = tr.client.get_metric_history(tr.run_id, "heldout_perplexity")
    assert len(hist) == 2 and all(np.isfinite(m.value) for m in hist)
    for key in ("rho", "batch_bound_per_word", "docs_per_second"):
        assert len(tr.client.get_metric_history(tr.run_id, key)) == 10
    assert res["objective"] == res["heldout_perplexity"]
