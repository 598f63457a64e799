"""An interrupted run (driver killed with SIGKILL, workers with it) resumed with resume=<run id>
finishes with bit-identical results to an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipelines.helpers import assert_one_value_per_step, assert_same_metric_histories, assert_same_results, run

REPO = Path(__file__).resolve().parents[3]
OVERRIDES = [
    "model.L=8",
    "model.T=2.3",
    "tempering.n_replicas=6",
    "tempering.n_rounds=10",
    "tempering.sweeps_per_scan=2",
    "tempering.scans_per_task=16",
    "tempering.checkpoint_every=1",
    "progress=false",
    "tempering.figures=false",
]


def _wait_for(predicate, timeout, proc):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_killed_driver_resumes_to_identical_result(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pgmflow", *OVERRIDES, f"tracking.uri={uri}", "cluster.n_workers=2"]
    log = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ckpt_dir = tmp_path / "mlartifacts"

        def checkpoint_of_round(n):
            return (
                any(p.name == f"round_{n:03d}.npz" for p in ckpt_dir.rglob("round_*.npz"))
                if ckpt_dir.exists()
                else False
            )

        assert _wait_for(lambda: checkpoint_of_round(5), 240, proc), (tmp_path / "out.txt").read_text()
        os.killpg(proc.pid, signal.SIGKILL)  # driver and its worker processes, mid-run
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "out.txt").read_text()
    run_id = out.split("tempering run ")[1].split()[0]
    assert "finished" not in out
    assert not checkpoint_of_round(10), "the run finished before it was killed; the test proves nothing"

    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).info.status == "RUNNING"  # killed: nobody could end it

    resumed, tr_resumed = run(OVERRIDES + [f"resume={run_id}"], uri)  # synchronous scheduler this time
    assert resumed["run_id"] == run_id
    assert tr.client.get_run(run_id).info.status == "FINISHED"
    _, tr_full = run(OVERRIDES, uri)
    assert_same_results(tr_full, tr_resumed)
    assert_one_value_per_step(tr.client, run_id)
    assert_same_metric_histories(tr.client, run_id, tr_full.run_id)

    from pgmflow.core.errors import ConfigError

    with pytest.raises(ConfigError, match="already finished"):
        run(OVERRIDES + [f"resume={run_id}"], uri)
