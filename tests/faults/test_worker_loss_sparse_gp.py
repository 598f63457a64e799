"""Sparse GP (SGPR) with a worker process killed (SIGKILL) mid-fit ends with the same model, bit for
bit: the lost chunk-statistics and chunk-gradient tasks are recomputed from their inputs (the chunks
are scattered with lineage, every chunk function is pure, and the sums run in chunk order). Every evaluation
is one Dask graph (``sparse_gp.evaluate`` direct, the default, and graph are the same path)."""

import pytest

from tests.faults.helpers import artifact_exists, assert_killed_mid_run, assert_same_npz, killing_cluster, tasks_done
from tests.pipelines.helpers import run

OVERRIDES = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=16",
    "sparse_gp.max_iter=15",
    "sparse_gp.in_process=false",
    "sparse_gp.chunk_size=100",
    "sparse_gp.figures=false",
    "progress=false",
]


@pytest.mark.slow
def test_worker_killed_mid_sparse_gp_fit_gives_identical_model(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    # one statistics and one objective-and-gradient task per worker and evaluation; kill after a few
    # evaluations, long before the model is written
    when = lambda cl: tasks_done(cl, "gp-objgrad-") >= 12  # noqa: E731
    with killing_cluster(when, lambda cl: artifact_exists(art, "model.npz")) as (cl, kill):
        res_k, tr_killed = run(OVERRIDES, uri, cl)
    assert_killed_mid_run(kill)
    res_ref, tr_ref = run(OVERRIDES, uri)  # synchronous scheduler, undisturbed
    assert_same_npz(tr_ref, tr_killed, "model.npz")
    assert res_k["test_nlpd"] == res_ref["test_nlpd"] and res_k["test_rmse"] == res_ref["test_rmse"]
