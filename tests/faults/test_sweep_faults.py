"""Sweeps under faults: a worker SIGKILLed while it runs a sweep job, and a sweep over TLS.

The sweep runs from the command line (``pgmflow -m``) on a LocalCluster that this test process owns
(``cluster.profile=address``), so the test sees the scheduler: it waits until a sweep job is
running on a worker and its child run has started, then kills that worker's process. Dask gives the
job to another worker (or, past its retries, the launcher marks it FAILED with the reason); the other
jobs finish; running the command again completes the sweep without re-running a finished job; and
the job hit by the kill gets the same objective as the same config run undisturbed.
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
from tests.pipelines.helpers import assert_one_value_per_step, run
from tests.pipelines.test_sweeps import runs, summary_rows

JOB = ["debug=default", "model.L=12", "tempering.n_rounds=10", "tempering.figures=false", "progress=false"]
SEEDS = "seed=0,1,2"


def _sweep_cmd(uri, address, extra=()):
    return [sys.executable, "-m", "pipelines", "-m", *JOB, SEEDS, f"tracking.uri={uri}", "cluster.profile=address",
            f"cluster.address={address}", *extra]


def _job_runners_of(pid: int) -> list:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True)
                if "pgmflow_dask_launcher._job" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


@pytest.mark.slow
def test_worker_killed_under_a_sweep_job(tmp_path):
    from distributed import LocalCluster

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.ERROR, env=env) as cl:
        cmd = _sweep_cmd(uri, cl.scheduler_address)
        log = open(tmp_path / "first.log", "w")
        proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                stderr=subprocess.STDOUT)
        killed_pid, runners, killed_job = None, [], None
        deadline = time.monotonic() + 240
        while killed_pid is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            jobs = [ts for k, ts in list(cl.scheduler.tasks.items())
                    if str(k).startswith("pgmflow-sweep-job-") and ts.state == "processing" and ts.processing_on]
            if not jobs:
                continue
            _, _, children = runs(uri)
            started = [c for c in children if c.info.status == "RUNNING" and "objective" not in c.data.metrics
                       and c.data.metrics]  # a job mid-way: its run has metrics, not yet its objective
            if not started:
                continue
            address = jobs[0].processing_on.address
            killed_job = str(jobs[0].key).split("-")[-2]  # pgmflow-sweep-job-<parent>-<index>-<ns>
            nanny = next(n for n in cl.workers.values() if n.worker_address == address)
            killed_pid = nanny.process.pid
            runners = _job_runners_of(killed_pid)
            os.kill(killed_pid, signal.SIGKILL)
        proc.wait(timeout=300)
        log.close()
        out = (tmp_path / "first.log").read_text()
        assert killed_pid is not None, f"no sweep job was seen running: the test proves nothing\n{out[-3000:]}"

        # the job runner of the killed worker does not outlive it (its watchdog)
        deadline = time.monotonic() + 15
        while any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in runners) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in runners), "orphaned job runner"

        tr, parents, children = runs(uri)
        assert len(parents) == 1 and len(children) == 3
        failed = [c for c in children if c.info.status == "FAILED"]
        finished = [c for c in children if c.info.status == "FINISHED"]
        assert proc.returncode == len(failed), out[-3000:]
        assert len(finished) >= 2, [c.info.status for c in children]  # the jobs the kill did not touch
        for c in failed:  # past its retries: marked FAILED with a reason naming the lost worker
            reason = c.data.tags.get("pgmflow.error", "")
            assert "\n" not in reason and ("Killed" in reason or "worker" in reason.lower()), reason

        # the same command again completes the sweep; finished jobs are not run again
        before = {c.info.run_id: c.info.end_time for c in finished}
        r2 = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=300)
        assert r2.returncode == 0, (r2.stdout[-2000:], r2.stderr[-2000:])
    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    assert {c.info.run_id: c.info.end_time for c in children if c.info.run_id in before} == before
    rows = summary_rows(tr, parents[0].info.run_id)
    assert {r["run_id"] for r in rows if r["status"] == "SKIPPED"} == set(before)

    # the job the kill hit ends with the objective of the same config run undisturbed (synchronous)
    row = next(r for r in rows if r["job"] == killed_job)
    hit = next(c for c in children if c.info.run_id == row["run_id"])
    seed = row["overrides"].split("seed=")[1].split()[0]
    ref, _ = run(JOB + [f"seed={seed}"], f"sqlite:///{tmp_path / 'ref.db'}")
    assert hit.data.metrics["objective"] == ref["objective"], (seed, hit.data.metrics["objective"], ref["objective"])
    assert_one_value_per_step(tr.client, hit.info.run_id)  # a retried job logs no step twice
    print(f"worker killed under job {killed_job}: {'retried' if not failed else 'FAILED, then re-run'}")
