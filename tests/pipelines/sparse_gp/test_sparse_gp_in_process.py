"""Small in-memory data is fitted in the driver (no round trip to the workers per evaluation), with
the same bits as on the workers; ``sparse_gp.in_process`` chooses either way."""

from __future__ import annotations

import io

import numpy as np

from pgmflow.core.runner import execute
from tests.conftest import compose
from tests.pipelines.helpers import run

BASE = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=16",
    "sparse_gp.max_iter=20",
    "sparse_gp.figures=false",
    "progress=false",
]


def test_small_data_is_fitted_in_the_driver_with_the_same_bits(mlflow_uri, cluster2):
    from distributed.diagnostics.plugin import SchedulerPlugin

    from tests.faults.test_driver_kill import _TaskCounter

    counter = type("Counter", (_TaskCounter, SchedulerPlugin), {"name": "gp-task-counter"})(
        ["gp-stats-", "gp-grad-", "gp-objgrad-"]
    )
    cluster2.scheduler.add_plugin(counter)
    out = io.StringIO()
    auto = execute(
        compose(
            BASE
            + [f"tracking.uri={mlflow_uri}", "cluster.profile=address", f"cluster.address={cluster2.scheduler_address}"]
        ),
        stream=out,
    )
    assert "fitted in this process" in out.getvalue()
    assert sum(counter.counts.values()) == 0, f"the small fit sent tasks to the workers: {counter.counts}"
    # through graphs, whose tasks the counter sees (direct calls to the workers, the default, give the same bits:
    # tests/pipelines/sparse_gp/test_sparse_gp.py)
    workers, tr_w = run(BASE + ["sparse_gp.in_process=false", "sparse_gp.evaluate=graph"], mlflow_uri, cluster2)
    cluster2.scheduler.remove_plugin(name="gp-task-counter")
    n_chunks = 1  # 442 rows, chunk_size 10000
    assert counter.counts["gp-stats-"] >= workers["evaluations"] * n_chunks
    for k in ("test_rmse", "test_nlpd", "iterations", "evaluations"):
        assert auto[k] == workers[k], k
    with (
        np.load(tr_w.client.download_artifacts(auto["run_id"], "model.npz")) as a,
        np.load(tr_w.download("model.npz")) as b,
    ):
        assert a.files == b.files and all(a[k].tobytes() == b[k].tobytes() for k in a.files)
