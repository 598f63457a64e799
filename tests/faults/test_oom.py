"""A task too big for its worker: a real LocalCluster whose worker may use 400 MB runs a real
pipeline whose first task needs more (parallel tempering of 2048 replicas of a 10,000-dimensional
target in one task: 160 MB per state array, several of them). The nanny restarts the worker each
time it passes 95% of its memory_limit; when every try has killed its worker, pgmflow ends with one
line that names the task, the memory and the settings to change, exit code 1, and the MLflow run
ends FAILED with that line. Nothing is presented as a finished result."""

from __future__ import annotations

import logging
import re

import dask
import pytest

from tests.bad_input.helpers import pgmflow, run_statuses
from tests.conftest import REPO

OVERSIZED = [
    "model=gaussian_mixture",
    "model.dim=10000",
    "tempering.n_replicas=2048",
    "tempering.n_rounds=1",
    "tempering.sweeps_per_scan=1",
    "tempering.figures=false",
    "progress=false",
]


@pytest.mark.slow
def test_a_worker_out_of_memory_names_the_setting_to_change(tmp_path):
    from distributed import Client, LocalCluster

    env = {"PYTHONPATH": str(REPO), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    # one retry instead of Dask's three keeps the test short; the report does not depend on the count
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        with LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            memory_limit="400MB",
            env=env,
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        ) as cl:
            uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
            r = pgmflow(
                [
                    *OVERSIZED,
                    "cluster.profile=address",
                    f"cluster.address={cl.scheduler_address}",
                    f"tracking.uri={uri}",
                ],
                tmp_path,
            )
            with Client(cl) as c:
                restarts = [e for _, e in c.get_events("worker-restart-memory")]

    assert len(restarts) == 2, restarts  # the nanny really restarted the worker for memory, on both tries
    assert all(e["rss"] > 0.95 * 400e6 for e in restarts), restarts
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert "Traceback" not in r.stderr
    assert re.match(
        r"pgmflow: error: WorkerMemoryError: task 'pt-(init|scans|explore)-\S+' ran its worker out of "
        r"memory: the worker reached \d[\d.]* MiB of its memory_limit 381\.47 MiB and was restarted; "
        r"all 2 workers that tried the task died; fix: ",
        line,
    ), line
    fix = line.split("; fix: ", 1)[1]
    for setting in ("tempering.n_blocks", "memory_limit", "dask_cluster.yaml", "cluster.n_workers"):
        assert setting in fix, (setting, line)
    # the MLflow run ends FAILED with the same message; no result was written
    ((status, error),) = run_statuses(tmp_path, uri)
    assert status == "FAILED" and error and error.startswith("WorkerMemoryError: task 'pt-"), (status, error)
    assert error in line
    assert "tempering run " in r.stdout and "finished" not in r.stdout
    for name in ("results.json", "final_state.npz"):
        assert not list(tmp_path.rglob(name)), name
