"""A multi-process cluster started with the Dask command line (``dask scheduler`` and two
``dask worker`` processes, as on machines without a job scheduler), used through
``cluster.profile=address``: a run and a sweep finish there, and the run gives the same bits as on a
LocalCluster. No mock: real processes, a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, compose
from tests.pipelines.helpers import run

RUN = ["pipeline=sparse_gp", "debug=default", "sparse_gp.in_process=false", "sparse_gp.figures=false", "progress=false"]


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory):
    """``dask scheduler`` on 127.0.0.1 and two ``dask worker`` processes (1 thread each), started
    from the command line and stopped at the end; yields the scheduler's address."""
    root = tmp_path_factory.mktemp("cli-cluster")
    dask = str(Path(sys.executable).with_name("dask"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    sched_file = root / "scheduler.json"
    log = open(root / "cluster.log", "w")
    procs = [
        subprocess.Popen(
            [
                dask,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(sched_file),
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sched_file.exists(), (root / "cluster.log").read_text()[-2000:]
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        dask,
                        "worker",
                        "--scheduler-file",
                        str(sched_file),
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--dashboard-address",
                        ":0",
                        "--local-directory",
                        str(root),
                    ],
                    cwd=root,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        from distributed import Client

        address = json.loads(sched_file.read_text())["address"]
        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=90)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def _run_at(address, uri):
    import io

    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import Tracker

    cfg = compose([*RUN, "cluster.profile=address", f"cluster.address={address}", f"tracking.uri={uri}"])
    res = execute(cfg, stream=io.StringIO())
    tr = Tracker(uri, cfg["tracking"]["experiment"])
    tr.run_id = res["run_id"]
    return res, tr


def _npz(tracker, name):
    with np.load(tracker.download(name)) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_run_on_a_cli_started_cluster_equals_a_local_cluster(cli_cluster, cluster2, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res_cli, tr_cli = _run_at(cli_cluster, uri)
    res_loc, tr_loc = run(RUN, uri, cluster2)
    tags = tr_cli.client.get_run(tr_cli.run_id).data.tags
    assert tags["pgmflow.cluster.type"] == "address" and tags["pgmflow.cluster.workers"] == "2"
    a, b = _npz(tr_cli, "model.npz"), _npz(tr_loc, "model.npz")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert res_cli["test_rmse"] == res_loc["test_rmse"] and res_cli["bound"] == res_loc["bound"]


@pytest.mark.slow
def test_sweep_on_a_cli_started_cluster(cli_cluster, tmp_path):
    """``pgmflow -m`` with cluster.profile=address: the jobs run on the CLI-started workers."""
    from tests.pipelines.core.test_sweeps import runs, sweep

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [
        "debug=default",
        "model.L=6",
        "tempering.n_rounds=3",
        "tempering.figures=false",
        "progress=false",
        "cluster.profile=address",
        f"cluster.address={cli_cluster}",
        "seed=0,1,2",
    ]
    r = sweep(args, tmp_path, uri)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    _, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 3
    assert all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["pgmflow.cluster.type"] for c in children} == {"sweep"}
    assert {c.data.tags["pgmflow.cluster.profile"] for c in children} == {"sweep:address"}
