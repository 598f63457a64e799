"""A worker process killed (SIGKILL) mid-run does not change the result: Dask recomputes the lost
tasks from their lineage, and every task is a pure function of its identity."""

import os
import signal
import threading
import time

import pytest

from tests.pipelines.helpers import assert_same_results, run

OVERRIDES = ["model.L=32", "model.T=2.3", "tempering.n_replicas=16", "tempering.n_rounds=10",
             "tempering.sweeps_per_scan=4", "tempering.scans_per_task=64", "progress=false", "tempering.figures=false"]


@pytest.mark.slow
def test_worker_killed_mid_run_gives_identical_result(tmp_path):
    import logging

    from distributed import LocalCluster

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = tmp_path / "mlartifacts"
    killed = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, silence_logs=logging.ERROR,
                      dashboard_address=":0", env={"NUMBA_NUM_THREADS": "1"}) as cl:
        def killer():
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                if art.exists() and any(art.rglob("round_006.npz")):
                    pid = next(iter(cl.workers.values())).process.pid
                    killed["final_state_existed"] = any(art.rglob("final_state.npz"))
                    os.kill(pid, signal.SIGKILL)
                    killed["pid"] = pid
                    return
                time.sleep(0.02)

        th = threading.Thread(target=killer, daemon=True)
        th.start()
        _, tr_killed = run(OVERRIDES, uri, cl)
        th.join(5)
    assert "pid" in killed, "the worker was never killed"
    assert killed["final_state_existed"] is False, "killed after the run ended: the test proves nothing"
    _, tr_ref = run(OVERRIDES, uri)  # synchronous scheduler, undisturbed
    assert_same_results(tr_ref, tr_killed)
