"""A worker process killed (SIGKILL) mid-run does not change the result: Dask recomputes the lost
tasks from their lineage, and every task is a pure function of its identity."""

import pytest

from tests.faults.helpers import artifact_exists, assert_killed_mid_run, killing_cluster
from tests.pipelines.helpers import assert_same_results, run

OVERRIDES = [
    "model.L=32",
    "model.T=2.3",
    "tempering.n_replicas=16",
    "tempering.n_rounds=10",
    "tempering.sweeps_per_scan=4",
    "tempering.scans_per_task=64",
    "progress=false",
    "tempering.figures=false",
]


@pytest.mark.slow
def test_worker_killed_mid_run_gives_identical_result(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    with killing_cluster(
        lambda cl: artifact_exists(art, "round_006.npz"), lambda cl: artifact_exists(art, "final_state.npz")
    ) as (cl, kill):
        _, tr_killed = run(OVERRIDES, uri, cl)
    assert_killed_mid_run(kill)
    _, tr_ref = run(OVERRIDES, uri)  # synchronous scheduler, undisturbed
    assert_same_results(tr_ref, tr_killed)
