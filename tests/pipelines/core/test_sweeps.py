"""Sweeps through the Dask launcher (``pgmflow -m``), end to end in subprocesses: a real
LocalCluster with worker processes, a real SQLite MLflow store, real Hydra sweepers (basic and
Optuna). What is counted: child runs under one parent, their status and errors, the summary
artifacts, resumption after the sweep was killed, and the exit code."""

import contextlib
import csv
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
JOB = [
    "debug=default",
    "model.L=6",
    "tempering.n_rounds=3",
    "tempering.figures=false",
    "progress=false",
    "cluster.n_workers=2",
]


def _cmd(args, uri):
    return [sys.executable, "-m", "pgmflow", "-m", *args, f"tracking.uri={uri}"]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


def sweep(args, cwd, uri, timeout=400):
    return subprocess.run(_cmd(args, uri), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def runs(uri):
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow")
    if exp is None:
        return tr, [], []
    all_runs = tr.client.search_runs([exp.experiment_id], max_results=10000)
    parents = [r for r in all_runs if r.data.tags.get("pgmflow.sweep") == "true"]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    return tr, parents, children


def summary_rows(tr, parent_id):
    tr.run_id = parent_id
    return list(csv.DictReader(io.StringIO(tr.read_text("sweep_summary.csv"))))


@pytest.mark.slow
def test_failed_jobs_do_not_stop_the_sweep(tmp_path):
    """Criterion 2: 8 jobs, 2 with a bad config: 6 FINISHED and 2 FAILED child runs under one
    parent, each FAILED run holding its error, exit code 2 (= the failed count); the summary CSV
    and the objective figure are on the parent. A second identical command skips the 6."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*JOB, "model.T=2.0,2.5,3.0,-1.0", "seed=0,1"]
    r = sweep(args, tmp_path, uri)
    assert r.returncode == 2, (r.stdout[-3000:], r.stderr[-3000:])
    tr, parents, children = runs(uri)
    assert len(parents) == 1
    parent = parents[0]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert len(children) == 8
    status = sorted(c.info.status for c in children)
    assert status == ["FAILED"] * 2 + ["FINISHED"] * 6
    for c in children:
        assert c.data.tags["pgmflow.stage_key"]
        if c.info.status == "FAILED":
            assert "model.T=-1.0" in c.data.tags["pgmflow.sweep.overrides"]
            assert "model.T" in c.data.tags["pgmflow.error"] and "fix:" in c.data.tags["pgmflow.error"]
            tr.run_id = c.info.run_id
            assert "model.T" in tr.read_text("error.txt")
        else:
            assert "objective" in c.data.metrics
    assert len({c.data.tags["pgmflow.stage_key"] for c in children}) == 8
    assert parent.info.status == "FAILED" or tr.client.get_run(parent.info.run_id).info.status == "FAILED"
    rows = summary_rows(tr, parent.info.run_id)
    assert len(rows) == 8 and sum(r["status"] == "FAILED" for r in rows) == 2
    assert all(r["run_id"] for r in rows)
    assert all(r["objective"] for r in rows if r["status"] == "FINISHED")
    tr.run_id = parent.info.run_id
    assert "figures/objective_vs_parameters.png" in tr.list_artifacts("figures")
    assert "2 FAILED" in r.stdout and "best: job" in r.stdout
    for line in ("model.T=2.5", "FINISHED", "FAILED"):
        assert line in r.stdout

    # The same command again: the 6 finished jobs are skipped, the 2 bad ones fail again.
    r2 = sweep(args, tmp_path, uri)
    assert r2.returncode == 2
    _, parents2, children2 = runs(uri)
    assert len(parents2) == 1 and len(children2) == 8  # same parent, no new child runs
    rows = summary_rows(tr, parent.info.run_id)
    assert sum(r["status"] == "SKIPPED" for r in rows) == 6
    assert "resuming" in r2.stdout


@pytest.mark.slow
def test_killed_sweep_resumes_only_missing_jobs(tmp_path):
    """Criteria 1 and 3: a 12-job sweep on a 2-worker LocalCluster is killed (SIGKILL to the whole
    process group) once a few jobs have finished; the same command again runs only the missing
    jobs (never more than max_concurrent_jobs at once) and ends with 12 FINISHED child runs under
    one parent, one per config."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [*JOB, "seed=0,1,2,3,4,5,6,7,8,9,10,11"]
    log = open(tmp_path / "first.log", "w")
    p = subprocess.Popen(
        _cmd(args, uri), cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 300
    done = 0
    try:
        while time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
            if "sweep started" not in (tmp_path / "first.log").read_text():
                continue
            try:
                _, _, children = runs(uri)
            except Exception:
                continue
            done = sum(c.info.status == "FINISHED" for c in children)
            if done >= 3:
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
    assert 3 <= done < 12, (
        f"the sweep should be killed half way (finished before the kill: {done})",
        (tmp_path / "first.log").read_text()[-3000:],
    )
    _, _, children = runs(uri)
    finished_before = {c.info.run_id for c in children if c.info.status == "FINISHED"}
    assert len(finished_before) < 12

    r = sweep(args, tmp_path, uri)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    tr, parents, children = runs(uri)
    assert len(parents) == 1
    assert len(children) == 12 and all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["pgmflow.stage_key"] for c in children}) == 12
    rows = summary_rows(tr, parents[0].info.run_id)
    skipped = {row["run_id"] for row in rows if row["status"] == "SKIPPED"}
    ran = {row["run_id"] for row in rows if row["status"] == "FINISHED"}
    assert skipped == finished_before  # exactly the jobs that had finished were not run again
    assert len(ran) == 12 - len(finished_before)
    # at most max_concurrent_jobs (default: one per worker, 2) jobs ran at any moment
    spans = [(float(row["started"]), float(row["finished"])) for row in rows if row["status"] == "FINISHED"]
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) <= 2
    assert "12 FINISHED, 0 FAILED" in r.stdout


@pytest.mark.slow
def test_optuna_sweeper_through_the_dask_launcher(tmp_path):
    """Criterion 4: 10 Optuna trials through the Dask launcher finish; the best trial is reported
    and its objective is the smallest of the 10 child runs."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=10",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.sampler.seed=3",
        "model.T=interval(2.0,3.5)",
        *JOB,
    ]
    r = sweep(args, tmp_path, uri)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout + r.stderr
    assert "Best value:" in out and "Best parameters:" in out
    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 10
    assert all(c.info.status == "FINISHED" for c in children)
    objectives = [c.data.metrics["objective"] for c in children]
    best_line = [ln for ln in out.splitlines() if "Best value:" in ln][0]
    assert float(best_line.split("Best value:")[1]) == min(objectives)
    assert "best: job" in r.stdout


def test_plugin_import_loads_neither_dask_nor_mlflow():
    """Hydra imports every plugin at start-up: the launcher's module must stay light."""
    code = (
        "import sys, hydra_plugins.pgmflow_dask_launcher.dask_launcher as d; "
        "print(sorted(m for m in ('dask', 'distributed', 'mlflow', 'pgmflow.core') if m in sys.modules)); "
        "print(d.DaskLauncher.__name__)"
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "DaskLauncher"]


def test_dask_launcher_is_the_default_for_multirun(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pgmflow", "--cfg", "hydra"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "hydra_plugins.pgmflow_dask_launcher.dask_launcher.DaskLauncher" in r.stdout
    assert "max_concurrent_jobs: null" in r.stdout
