"""Sweeps under faults: a worker SIGKILLed while it runs a sweep job.

The sweep runs from the command line (``pgmflow -m``, tempering jobs in debug size) on a 2-worker
LocalCluster that this test process owns (``cluster.profile=address``), so the test sees the
scheduler. A scheduler plugin records every task that reaches memory; once a job's own pipeline tasks
(their keys carry the job's run token) have started finishing while the job's task is still
``processing`` on a worker, the test SIGKILLs that worker's process (the nanny starts a new one).

- ``test_worker_killed_under_a_sweep_job_is_retried``: Dask's default (``allowed-failures`` 3)
  gives the job to another worker; the job runs again into the same child run (``pgmflow.attempt``
  2), every job FINISHES, exit code 0, each objective equals the same config run undisturbed on the
  synchronous scheduler (bit for bit), no metric has two values at a step.
- ``test_worker_killed_past_its_retries_fails_the_job_then_a_rerun_completes``: the scheduler
  allows no failure (``allowed_failures = 0``), so the kill is a ``KilledWorker``: the job's child run
  ends FAILED with one line naming the lost worker, the other jobs FINISH, the exit code is 1 (the
  failed count); the same command again runs only that job (the finished ones are SKIPPED: same run
  ids, same end times) and its objective equals the undisturbed run's. One job at a time here
  (``max_concurrent_jobs=1``): with no failure allowed, another job's pipeline tasks on the killed
  worker would fail too.

Both check that the job-runner processes of the killed worker do not outlive it (their watchdog).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO
from tests.pipelines.core.test_sweeps import runs, summary_rows
from tests.pipelines.helpers import assert_one_value_per_step

JOB = ["debug=default", "model.L=12", "tempering.n_rounds=8", "tempering.figures=false", "progress=false"]
SEEDS = "seed=0,1,2"
JOB_KEY = "pgmflow-sweep-job-"  # pgmflow-sweep-job-<parent[:8]>-<index>-<ns> (hydra_plugins/pgmflow_dask_launcher)
MIN_DONE = 3  # the job's pipeline tasks finished before the kill: the job is under way, far from its end


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def cluster():
    """2 worker processes (1 thread each) whose scheduler and nannies live in this process. At the end,
    the job runners the workers kept (idle, for later jobs) exit with them."""
    from distributed import LocalCluster

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.CRITICAL,
        env=env,
    ) as cl:
        yield cl
        runners = [
            r
            for n in list(cl.workers.values())
            if n.process is not None and n.process.pid
            for r in _job_runners_of(n.process.pid)
        ]
    _assert_no_orphaned_runner(runners)


def _memory_watch(cl):
    """A scheduler plugin (run in the scheduler's event loop) that records each key reaching memory;
    results are released once consumed, so polling the scheduler's tasks would miss some."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Watch(SchedulerPlugin):
        name = "pgmflow-test-memory-watch"

        def __init__(self):
            self.keys = set()

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "memory":
                self.keys.add(str(key))

    w = Watch()
    cl.loop.add_callback(cl.scheduler.add_plugin, w, name=w.name, idempotent=False)
    deadline = time.monotonic() + 10
    while cl.scheduler.plugins.get(w.name) is not w and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cl.scheduler.plugins.get(w.name) is w
    return w


def _remove(cl, watch):
    cl.loop.add_callback(cl.scheduler.remove_plugin, name=watch.name)


def _wait_for_workers(cl, n=2, timeout=60):
    deadline = time.monotonic() + timeout
    while len(cl.scheduler.workers) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(cl.scheduler.workers) >= n, f"{len(cl.scheduler.workers)} workers"


def _job_runners_of(pid: int) -> list:
    try:
        return [
            p
            for p in psutil.Process(pid).children(recursive=True)
            if "pgmflow_dask_launcher._job" in " ".join(p.cmdline())
        ]
    except psutil.Error:
        return []


def _alive(procs) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_mid_job(cl, proc, uri, watch, log_path, timeout=150):
    """SIGKILL the worker process holding a sweep job whose own pipeline tasks have started finishing
    (at least MIN_DONE of them) while the job's task is still processing there. Returns what was hit.
    Nothing slow stands between the check and the kill; whether the job had in fact ended first is
    checked afterwards from what MLflow holds (an objective logged before ``kill_ms``)."""
    from mlflow.tracking import MlflowClient

    client, jobs_of_token = None, {}
    earlier = {k for k in list(cl.scheduler.tasks) if str(k).startswith(JOB_KEY)}  # another sweep's, if any
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the sweep ended before a job was seen under way\n{log_path.read_text()[-3000:]}"
        time.sleep(0.02)
        jobs = [ts for k, ts in list(cl.scheduler.tasks.items()) if str(k).startswith(JOB_KEY) and k not in earlier]
        if not jobs:
            continue
        if client is None:  # the launcher created the store and every child run before it submitted a job
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name("pgmflow")
            children = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
            jobs_of_token = {c.info.run_id[:12]: (c.data.tags["pgmflow.sweep.job"], c.info.run_id) for c in children}
            assert len(jobs_of_token) == 3, jobs_of_token
        done = list(watch.keys)
        for token, (idx, run_id) in jobs_of_token.items():
            if sum(token in k for k in done) < MIN_DONE:
                continue  # the job's pipeline (its task keys carry the run's token) is not under way yet
            on = [
                ts.processing_on
                for ts in jobs
                if str(ts.key).split("-")[-2] == idx and ts.state == "processing" and ts.processing_on is not None
            ]
            if not on:
                continue
            address = on[0].address
            nanny = next(n for n in cl.workers.values() if n.worker_address == address)
            pid = nanny.process.pid
            runners = _job_runners_of(pid)
            assert runners, f"no job-runner process under the worker that runs job {idx}"
            kill_ms = int(time.time() * 1000)
            os.kill(pid, signal.SIGKILL)
            return {
                "job": idx,
                "run_id": run_id,
                "address": address,
                "pid": pid,
                "runners": runners,
                "kill_ms": kill_ms,
            }
    pytest.fail(f"no sweep job was seen under way within {timeout} s\n{log_path.read_text()[-3000:]}")


def _start_sweep(tmp_path, uri, address, extra=(), name="first"):
    cmd = [
        sys.executable,
        "-m",
        "pgmflow",
        "-m",
        *JOB,
        SEEDS,
        f"tracking.uri={uri}",
        "cluster.profile=address",
        f"cluster.address={address}",
        *extra,
    ]
    log_path = tmp_path / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    return cmd, proc, log_path


def _assert_no_orphaned_runner(runners):
    """These job runners exit on their own once their worker is gone (their watchdog sees the parent go)."""
    deadline = time.monotonic() + 15
    while _alive(runners) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(runners), f"orphaned job runner(s): {[p.pid for p in _alive(runners)]}"


_UNDISTURBED = r"""
import json, sys
from tests.pipelines.helpers import run
job, seeds, uri = json.loads(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
print(json.dumps({s: run(job + ["seed=" + s], uri)[0]["objective"] for s in seeds}))
"""


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, mlflow_template):
    """seed -> objective of JOB run alone on the synchronous scheduler. Computed in a separate process
    started now, beside the sweeps (most of a sweep's first seconds are one process importing), and
    read when a test first needs it; json keeps the floats' bits."""
    import json
    import shutil

    d = tmp_path_factory.mktemp("undisturbed")
    shutil.copyfile(mlflow_template, d / "mlflow.db")  # a migrated empty store (tests/conftest.py)
    proc = subprocess.Popen(
        [sys.executable, "-c", _UNDISTURBED, json.dumps(JOB), SEEDS.split("=")[1], f"sqlite:///{d / 'mlflow.db'}"],
        cwd=d,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    got = {}

    def get():
        if not got:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            got.update(json.loads(out.strip().splitlines()[-1]))
        return got

    yield get
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _assert_undisturbed_objectives(children, undisturbed):
    """Each job's objective equals the same config run alone on the synchronous scheduler, bit for bit."""
    ref = undisturbed()
    for c in children:
        seed = c.data.tags["pgmflow.sweep.overrides"].split("seed=")[1].split()[0]
        assert c.data.metrics["objective"] == ref[seed], (seed, c.data.metrics["objective"], ref[seed])


@pytest.mark.slow
def test_worker_killed_under_a_sweep_job_is_retried(undisturbed, cluster, tmp_path):
    _wait_for_workers(cluster)
    watch = _memory_watch(cluster)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    try:
        cmd, proc, log_path = _start_sweep(tmp_path, uri, cluster.scheduler_address)
        try:
            hit = _kill_mid_job(cluster, proc, uri, watch, log_path)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        _remove(cluster, watch)
    out = log_path.read_text()
    _assert_no_orphaned_runner(hit["runners"])

    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 3
    assert [c.info.status for c in children] == ["FINISHED"] * 3, out[-3000:]
    assert proc.returncode == 0, out[-3000:]  # = the number of failed jobs
    by_id = {c.info.run_id: c for c in children}
    hit_run = by_id[hit["run_id"]]
    # the job ran again after the kill, into the same child run; the others ran once
    assert hit_run.data.tags["pgmflow.attempt"] == "2", hit_run.data.tags.get("pgmflow.attempt")
    assert all(c.data.tags["pgmflow.attempt"] == "1" for c in children if c is not hit_run)
    objective = tr.client.get_metric_history(hit["run_id"], "objective")
    assert objective and all(m.timestamp >= hit["kill_ms"] for m in objective), "killed too late: proves nothing"
    assert_one_value_per_step(tr.client, hit["run_id"])  # a retried job logs no step twice
    rows = summary_rows(tr, parents[0].info.run_id)
    assert sorted(r["status"] for r in rows) == ["FINISHED"] * 3
    _assert_undisturbed_objectives(children, undisturbed)


@pytest.mark.slow
def test_worker_killed_past_its_retries_fails_the_job_then_a_rerun_completes(undisturbed, cluster, tmp_path):
    _wait_for_workers(cluster)
    watch = _memory_watch(cluster)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    allowed = cluster.scheduler.allowed_failures
    cluster.scheduler.allowed_failures = 0  # the first worker death under a task is a KilledWorker
    try:
        cmd, proc, log_path = _start_sweep(
            tmp_path, uri, cluster.scheduler_address, ["hydra.launcher.max_concurrent_jobs=1"]
        )
        try:
            hit = _kill_mid_job(cluster, proc, uri, watch, log_path)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        cluster.scheduler.allowed_failures = allowed
        _remove(cluster, watch)
    out = log_path.read_text()
    _assert_no_orphaned_runner(hit["runners"])

    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 3
    by_id = {c.info.run_id: c for c in children}
    hit_run = by_id.pop(hit["run_id"])
    assert hit_run.info.status == "FAILED", (hit_run.info.status, out[-3000:])
    assert "objective" not in hit_run.data.metrics, "killed too late: proves nothing"
    reason = hit_run.data.tags.get("pgmflow.error", "")
    assert "\n" not in reason and "KilledWorker" in reason and hit["address"] in reason, reason
    assert [c.info.status for c in by_id.values()] == ["FINISHED"] * 2  # the jobs the kill did not touch
    assert proc.returncode == 1, out[-3000:]  # = the number of failed jobs
    rows = summary_rows(tr, parents[0].info.run_id)
    failed = [r for r in rows if r["status"] == "FAILED"]
    assert [r["run_id"] for r in failed] == [hit["run_id"]] and hit["address"] in failed[0]["error"]

    # the same command again completes the sweep, running only the failed job
    before = {rid: c.info.end_time for rid, c in by_id.items()}
    r2 = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert r2.returncode == 0, (r2.stdout[-2000:], r2.stderr[-2000:])
    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    assert {c.info.run_id: c.info.end_time for c in children if c.info.run_id in before} == before
    rows = summary_rows(tr, parents[0].info.run_id)
    assert {r["run_id"] for r in rows if r["status"] == "SKIPPED"} == set(before)
    assert [r["run_id"] for r in rows if r["status"] == "FINISHED"] == [hit["run_id"]]
    rerun = tr.client.get_run(hit["run_id"])
    assert rerun.data.tags["pgmflow.attempt"] == "2" and "pgmflow.error" not in rerun.data.tags
    assert_one_value_per_step(tr.client, hit["run_id"])
    _assert_undisturbed_objectives(children, undisturbed)
