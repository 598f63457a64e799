"""Criterion 5 of the sweeps issue: 32 jobs logging at once lose no run, no param and no metric,
to the default SQLite store and to a real ``mlflow server`` on 127.0.0.1.

As in a sweep, the launching process creates the store, the parent run and the 32 child runs
(``pgmflow.core.sweep.SweepSession.child_run``); then 32 tasks on a real LocalCluster (4 worker
processes x 8 threads, so writers contend both across processes and within one) take over their
child run by id (``Tracker.attach``) and log params, tags and metric histories through pgmflow's
retrying client. Everything is counted afterwards."""

import logging

import pytest

from tests.conftest import REPO

N_JOBS, N_PARAMS, N_STEPS, METRICS = 32, 24, 20, ("loss", "accuracy")


def _job(uri: str, experiment: str, run_id: str, job: int) -> str:
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, experiment, max_wait=120)
    cfg = {"job": job, "model": {f"p{i}": job * 100 + i for i in range(N_PARAMS)}}
    tr.attach(run_id, cfg, {"pgmflow.pipeline": "logging-test"})
    for step in range(N_STEPS):
        tr.log_metrics({m: job + step / 1000 + k for k, m in enumerate(METRICS)}, step=step, flush=step % 10 == 9)
    tr.end("FINISHED")
    return run_id


@pytest.fixture(scope="module")
def busy_cluster():
    from distributed import LocalCluster

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(
        n_workers=4, threads_per_worker=8, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    ) as c:
        yield c


def _log_32_jobs_and_count(uri: str, cluster, experiment="concurrent-logging"):
    from distributed import Client

    from pgmflow.core.sweep import SweepSession
    from pgmflow.core.tracking import Tracker, config_hash

    tr = Tracker(uri, experiment)
    exp = tr._experiment_id()
    parent = tr.client.create_run(exp, run_name="sweep", tags={"pgmflow.sweep": "true"})
    session = SweepSession(tracker=tr, parent_id=parent.info.run_id, key="test")
    ids = []
    for j in range(N_JOBS):
        h = config_hash({"job": j})
        run_id, finished, _ = session.child_run(j, [f"job={j}"], h)
        assert not finished
        assert session.child_run(j, [f"job={j}"], h)[0] == run_id  # idempotent per config hash
        ids.append(run_id)
    with Client(cluster) as client:
        futs = [client.submit(_job, uri, experiment, rid, j, pure=False) for j, rid in enumerate(ids)]
        assert client.gather(futs) == ids

    runs = tr.client.search_runs(
        [exp], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=1000
    )
    assert len(runs) == N_JOBS and {r.info.run_id for r in runs} == set(ids)
    assert all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        job = int(r.data.params["job"])
        params = {k: v for k, v in r.data.params.items() if k.startswith("model.")}
        assert params == {f"model.p{i}": str(job * 100 + i) for i in range(N_PARAMS)}
        assert r.data.tags["pgmflow.pipeline"] == "logging-test"
        for k, m in enumerate(METRICS):
            hist = tr.client.get_metric_history(r.info.run_id, m)
            assert sorted(h.step for h in hist) == list(range(N_STEPS)), (r.info.run_id, m)
            assert {h.step: h.value for h in hist} == {s: job + s / 1000 + k for s in range(N_STEPS)}


@pytest.mark.slow
def test_32_jobs_log_concurrently_to_sqlite(tmp_path, busy_cluster):
    _log_32_jobs_and_count(f"sqlite:///{tmp_path / 'mlflow.db'}", busy_cluster)


@pytest.mark.slow
def test_32_jobs_log_concurrently_to_a_tracking_server(mlflow_server, busy_cluster):
    _log_32_jobs_and_count(mlflow_server.uri, busy_cluster)
