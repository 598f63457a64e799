"""SVI for LDA with a worker process killed (SIGKILL) mid-run ends with the same lambda, bit for bit:
the shards it held are reloaded elsewhere from their prepare tasks, and the lost E-step tasks are
recomputed from their identity (seed, shard, epoch, step)."""

import numpy as np
import pytest

from tests.faults.helpers import artifact_exists, assert_killed_mid_run, killing_cluster
from tests.pipelines.helpers import run


@pytest.mark.slow
def test_worker_killed_mid_svi_run_gives_identical_lambda(tmp_path):
    from pgmflow.tasks.lda import synthetic

    synthetic.generate_corpus(
        str(tmp_path / "corpus"), n_docs=3000, n_words=300, n_topics=6, seed=2, mean_length=60, docs_per_shard=500
    )
    ov = [
        "pipeline=svi",
        "corpus=sharded",
        f"corpus.path={tmp_path / 'corpus'}",
        "model.K=6",
        "svi.batch_size=60",
        "svi.n_epochs=3",
        "svi.checkpoint_every=10",
        "svi.eval_every=50",
        "svi.figures=false",
        "progress=false",
    ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    with killing_cluster(
        lambda cl: artifact_exists(art, "step_0000040.npz"), lambda cl: artifact_exists(art, "lambda.npz")
    ) as (cl, kill):
        res_k, tr_killed = run(ov, uri, cl)
    assert_killed_mid_run(kill)
    res_ref, tr_ref = run(ov, uri)  # synchronous scheduler, undisturbed
    with np.load(tr_ref.download("lambda.npz")) as a, np.load(tr_killed.download("lambda.npz")) as b:
        np.testing.assert_array_equal(a["lam"], b["lam"])
    assert res_k["heldout_perplexity"] == res_ref["heldout_perplexity"]
