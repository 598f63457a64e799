"""A real ``mlflow server`` on 127.0.0.1 goes away in the middle of two runs.

- Run A (``tracking.max_wait=120``): the server is back within the wait. The run goes on, its
  metrics wait in memory, and when the server answers again everything is delivered: the run ends
  FINISHED with every round's metrics and its checkpoint.
- Run B (``tracking.max_wait=3``): the server stays away longer than that. The run fails after the
  bounded wait with one clear line naming the store, the wait and the setting to change (exit
  code 1), and is never recorded as FINISHED.

Both runs share one outage, so the server is stopped and started once.
"""

import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

N_ROUNDS = 10
RUN = [
    "pipeline=tempering",
    "debug=default",
    "model.L=8",
    "tempering.n_replicas=6",
    f"tempering.n_rounds={N_ROUNDS}",
    "tempering.figures=false",
    "progress=false",
    "cluster.profile=synchronous",
    "tracking.experiment=outage",
]


def _start(args, cwd):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(cwd), "PGMFLOW_ALLOWED_MODULES": "tests"}
    return subprocess.Popen(
        [sys.executable, "-m", "pgmflow", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_run_id(proc) -> str:
    for line in proc.stdout:
        if line.startswith("pgmflow: tempering run "):
            return line.split(" run ")[1].split()[0]
    raise AssertionError(f"the run did not start: {proc.stderr.read()[-3000:]}")


@pytest.mark.slow
def test_tracking_server_outage_mid_run(tmp_path, mlflow_server):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _start([*RUN, f"tracking.uri={mlflow_server.uri}", "tracking.max_wait=120"], tmp_path / "a")
    b = _start([*RUN, f"tracking.uri={mlflow_server.uri}", "tracking.max_wait=3"], tmp_path / "b")
    run_a, run_b = _wait_for_run_id(a), _wait_for_run_id(b)
    mlflow_server.stop()  # the server goes away while both runs compute
    t_down = time.monotonic()
    out_b, err_b = b.communicate(timeout=120)
    waited_b = time.monotonic() - t_down
    assert a.poll() is None, "run A should wait for the server, not end"
    mlflow_server.start()
    out_a, err_a = a.communicate(timeout=300)

    # A: everything delivered once the server came back.
    assert a.returncode == 0, err_a[-3000:]
    from pgmflow.core.tracking import Tracker

    tr = Tracker(mlflow_server.uri, "outage")
    run = tr.client.get_run(run_a)
    assert run.info.status == "FINISHED"
    for metric in ("swap_accept_mean", "round_trips", "barrier"):
        steps = sorted(m.step for m in tr.client.get_metric_history(run_a, metric))
        assert steps == list(range(1, N_ROUNDS + 1)), (metric, steps)  # rounds are numbered from 1
    assert "objective" in run.data.metrics
    tr.run_id = run_a
    assert "final_state.npz" in tr.list_artifacts()

    # B: a bounded wait, then one clear line and exit code 1; never FINISHED.
    assert b.returncode == 1, (out_b[-2000:], err_b[-2000:])
    lines = [ln for ln in err_b.splitlines() if ln.strip()]
    assert len(lines) == 1, err_b
    assert lines[0].startswith("pgmflow: error: TrackingUnavailable")
    assert mlflow_server.uri in lines[0] and "did not answer for 3 s" in lines[0] and "tracking.max_wait" in lines[0]
    assert "Traceback" not in err_b
    assert waited_b < 60  # bounded by max_wait per call, not MLflow's minutes of retries
    assert tr.client.get_run(run_b).info.status != "FINISHED"
