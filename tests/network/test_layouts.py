"""Done-means 1 of issue 35: runs over the ``address`` profile (dask_cluster.yaml) across three worker
hosts, the driver on its own host and the MLflow server on another, give the same bits as a local run
on the synchronous scheduler: a tempering run, a sparse GP run, and a 4-job sweep."""

from __future__ import annotations

import pytest

from tests.network.helpers import DriverRun, Store, digest_dir, local_reference

pytestmark = pytest.mark.network

TEMPERING = ["pipeline=tempering", "debug=default", "tempering.figures=false", "progress=false"]
SPARSE_GP = ["pipeline=sparse_gp", "debug=default", "progress=false"]


def _address(hosts) -> list[str]:
    return ["cluster.profile=address", f"cluster.address={hosts.net.scheduler_address}"]


def _server_store(hosts) -> Store:
    return Store(f"sqlite:///{hosts.store / 'server.db'}", hosts.store / "artifacts")


@pytest.mark.parametrize("case", [TEMPERING, SPARSE_GP], ids=["tempering", "sparse_gp"])
def test_a_run_across_three_worker_hosts_equals_a_local_run(cluster_up, tmp_path, case):
    want_files, want_metrics = local_reference(case, tmp_path / "local")
    run = DriverRun(cluster_up, [*case, *_address(cluster_up)], tmp_path / "net")
    rc = run.wait(600)
    assert rc == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert "(3 workers)" in run.stdout, run.stdout[:500]
    store = _server_store(cluster_up)
    run_id = run.run_id()
    got = digest_dir(store.artifact_dir(run_id))
    assert got and got == want_files
    assert store.results(run_id) == want_metrics
    store.assert_one_value_per_step(run_id)


SWEEP_JOB = ["pipeline=tempering", "debug=default", "model.L=8", "tempering.n_rounds=4", "tempering.figures=false"]
SEEDS = (0, 1, 2, 3)


def test_a_four_job_sweep_across_three_worker_hosts_equals_local_runs(cluster_up, tmp_path):
    """``pgmflow -m``: the Dask launcher runs the 4 jobs on the worker hosts, each job's tasks on the same
    cluster; every child run's artifacts and metrics equal the job's config run locally, one child per job."""
    run = DriverRun(
        cluster_up,
        ["-m", *SWEEP_JOB, "progress=false", f"seed={','.join(map(str, SEEDS))}", *_address(cluster_up)],
        tmp_path / "net",
    )
    rc = run.wait(600)
    assert rc == 0, (run.stdout[-3000:], run.stderr[-3000:])
    store = _server_store(cluster_up)
    runs = store.runs()
    parents = [r for r in runs if r.data.tags.get("pgmflow.sweep") == "true"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    by_seed = {}
    for c in children:
        by_seed.setdefault(int(float(c.data.params["seed"])), []).append(c)
    assert sorted(by_seed) == list(SEEDS) and all(len(v) == 1 for v in by_seed.values()), {
        k: len(v) for k, v in by_seed.items()
    }
    for seed, (child,) in sorted(by_seed.items()):
        assert child.info.status == "FINISHED"
        want_files, want_metrics = local_reference([*SWEEP_JOB, f"seed={seed}"], tmp_path / f"local{seed}")
        got = digest_dir(store.artifact_dir(child.info.run_id))
        got.pop("sweep_job.log")  # the job's own output, which a run outside a sweep has not
        assert got and got == want_files, seed
        assert store.results(child.info.run_id) == want_metrics, seed
        store.assert_one_value_per_step(child.info.run_id)
