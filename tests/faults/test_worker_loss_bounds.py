"""The variational bounds with a worker process killed (SIGKILL) mid-run give the same values, bit
for bit: the lost temperature tasks are recomputed (each is a pure function of the model)."""

import pytest

from tests.faults.helpers import artifact_exists, assert_killed_mid_run, killing_cluster, tasks_done
from tests.pipelines.helpers import run

OVERRIDES = [
    "pipeline=bounds",
    "model.L=24",
    "variational.temperatures=[1.8,2.0,2.2,2.269185314213022,2.35,2.5,2.7,3.0]",
    "variational.figures=false",
    "progress=false",
]


@pytest.mark.slow
def test_worker_killed_mid_bounds_run_gives_identical_bounds(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    with killing_cluster(lambda cl: tasks_done(cl, "bounds-") >= 2, lambda cl: artifact_exists(art, "bounds.csv")) as (
        cl,
        kill,
    ):
        res_k, _ = run(OVERRIDES, uri, cl)
    assert_killed_mid_run(kill)
    res_ref, _ = run(OVERRIDES, uri)  # synchronous scheduler, undisturbed
    keys = [k for k in res_ref if k.startswith("log_z_")]
    assert keys and all(res_k[k] == res_ref[k] for k in keys), {k: (res_k[k], res_ref[k]) for k in keys}
