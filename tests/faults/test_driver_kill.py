"""The driver (the ``pgmflow`` process, with its LocalCluster) killed with SIGKILL mid-run, then
``resume=<run id>``: the run ends FINISHED with results bit-identical to an undisturbed run.

Tempering and SVI resume from their last checkpoint (tests/pipelines/test_resume.py and
test_svi_resume.py). TESLA, the variational bounds and the sparse GPs keep no checkpoints: their
resume re-runs the computation into the same MLflow run, from the recorded config, which gives the same bits because
every random stream comes from the seed and the identity of the work. These tests show it for both.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO
from tests.pipelines.helpers import run

CASES = {
    "tesla": (["pipeline=tesla", "debug=default", "progress=false", "tesla.figures=false"], "estimates.npz"),
    "bounds": (["pipeline=bounds", "model=ising", "model.L=12", "variational.temperatures=[2.0,2.269185314213022,2.6]",
                "variational.figures=false", "progress=false"], None),
    "sparse_gp": (["pipeline=sparse_gp", "gp_data=diabetes", "sparse_gp.m=16", "sparse_gp.max_iter=15",
                   "sparse_gp.chunk_size=100", "sparse_gp.figures=false", "progress=false"], "model.npz"),
}


def _kill_mid_run(args, tmp_path, uri, name):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pipelines", *args, f"tracking.uri={uri}", "cluster.n_workers=2"]
    log_path = tmp_path / f"{name}.txt"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                if f"{name} run " in log_path.read_text():
                    break
                time.sleep(0.05)
            time.sleep(0.5)  # the run is recorded and its tasks are running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out = log_path.read_text()
    assert f"{name} run " in out, out[-3000:]
    assert "finished" not in out, "the run finished before it was killed; the test proves nothing"
    return out.split(f"{name} run ")[1].split()[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_killed_driver_resumes_to_identical_result(tmp_path, name):
    args, npz = CASES[name]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = _kill_mid_run(args, tmp_path, uri, name)

    from pipelines.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).info.status == "RUNNING"  # killed: nobody could end it

    resumed, tr_resumed = run(args + [f"resume={run_id}"], uri)
    assert resumed["run_id"] == run_id
    assert tr.client.get_run(run_id).info.status == "FINISHED"
    _, tr_full = run(args, uri)

    def results(t):
        d = json.loads(t.read_text("results.json"))
        return {k: v for k, v in d.items() if "seconds" not in k}

    assert results(tr_resumed) == results(tr_full)
    if npz:
        with np.load(tr_resumed.download(npz)) as a, np.load(tr_full.download(npz)) as b:
            assert a.files == b.files
            for k in a.files:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
