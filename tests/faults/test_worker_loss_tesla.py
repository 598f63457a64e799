"""TESLA with a worker process killed (SIGKILL) mid-run ends with the same estimates, bit for bit:
the lost path and selection tasks are recomputed from their inputs (designs are task results with
lineage, every solve is a pure function)."""

import pytest

from tests.faults.helpers import artifact_exists, assert_killed_mid_run, assert_same_npz, killing_cluster, tasks_done
from tests.pipelines.helpers import run

OVERRIDES = [
    "pipeline=tesla",
    "network.p=14",
    "network.T=60",
    "network.samples_per_time=4",
    "network.n_edges=14",
    "tesla.lambda1=[0.16,0.08,0.04]",
    "tesla.lambda2=[1.0,0.25]",
    "tesla.bandwidth=[3.0]",
    "tesla.figures=false",
    "progress=false",
]


@pytest.mark.slow
def test_worker_killed_mid_tesla_run_gives_identical_estimates(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    # 14 nodes x (2 lambda2 + 1 bandwidth + 1 static) = 56 path tasks, then 42 selection tasks;
    # the estimates artifact is written once all of them are done
    with killing_cluster(
        lambda cl: tasks_done(cl, "tesla-fit-") >= 12, lambda cl: artifact_exists(art, "estimates.npz")
    ) as (cl, kill):
        res_k, tr_killed = run(OVERRIDES, uri, cl)
    assert_killed_mid_run(kill)
    res_ref, tr_ref = run(OVERRIDES, uri)  # synchronous scheduler, undisturbed
    assert_same_npz(tr_ref, tr_killed, "estimates.npz")
    assert res_k["tesla_f1"] == res_ref["tesla_f1"]
