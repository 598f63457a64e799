"""The driver loses its Dask scheduler mid-run (pipelines/core/runner.py, ``_run_reconnecting``).

A real ``dask scheduler`` and ``dask worker`` on 127.0.0.1 (subprocesses of the test) and a real ``pgmflow``
CLI run over the ``address`` profile. Once the run has written its second checkpoint, the scheduler and the
worker are SIGKILLed: every pending result of the driver is cancelled (``scheduler-connection-lost``).

- back within ``cluster.reconnect_limit``: the scheduler and a worker are started again on the same port
  after a few seconds; the run reconnects, continues from its newest checkpoint with the same graphs, and
  ends FINISHED with the same final state and estimates as an undisturbed run, no metric twice at a step;
- gone for good (``cluster.reconnect_limit=4``): the run ends FAILED with one line that names the limit and
  ``resume=<run id>``, exit code 1; started again, that ``resume=`` completes the run to the same bits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port
from tests.faults.helpers import artifact_exists
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_results, run

OVERRIDES = [
    "pipeline=tempering",
    "debug=default",
    "model.L=16",
    "tempering.n_replicas=8",
    "tempering.n_rounds=8",
    "tempering.figures=false",
    "progress=false",
]
BIN = Path(sys.executable).parent
DASK_ENV = {
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "12s",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s",
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path), **DASK_ENV}


class Daemons:
    def __init__(self, tmp_path, port):
        self.tmp, self.port, self.procs = tmp_path, port, []

    def start(self):
        addr = f"tcp://127.0.0.1:{self.port}"
        log = open(self.tmp / "daemons.log", "ab")
        common = dict(env=_env(self.tmp), cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        sched = [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard"]
        self.procs.append(subprocess.Popen(sched, **common))
        worker = [str(BIN / "dask"), "worker", addr, "--nthreads", "1", "--no-dashboard", "--memory-limit", "2GB"]
        self.procs.append(subprocess.Popen(worker, **common))

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        self.procs = []


@pytest.fixture
def daemons(tmp_path):
    d = Daemons(tmp_path, free_port())
    d.start()
    yield d
    d.kill()


def _pgmflow(args, tmp_path):
    return subprocess.Popen(
        [sys.executable, "-m", "pgmflow", *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tracker(uri, run_id):
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    tr.run_id = run_id
    return tr


def _kill_after_second_checkpoint(proc, daemons, tmp_path, timeout=240):
    deadline = time.monotonic() + timeout
    while not artifact_exists(tmp_path, "round_002.npz"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no second checkpoint in time"
        time.sleep(0.2)
    assert not artifact_exists(tmp_path, "final_state.npz"), "the run had ended before the fault"
    daemons.kill()


def _run_id(stdout: str) -> str:
    return next(line.split(" run ")[1].split()[0] for line in stdout.splitlines() if " run " in line)


@pytest.mark.slow
def test_a_driver_that_loses_its_scheduler_reconnects_and_ends_with_the_same_bits(daemons, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        *OVERRIDES,
        "cluster.profile=address",
        f"cluster.address=tcp://127.0.0.1:{daemons.port}",
        "+cluster.options.timeout=3",  # the client's own reconnect window: shorter than the outage
        "cluster.reconnect_limit=120",
        f"tracking.uri={uri}",
    ]
    proc = _pgmflow(args, tmp_path)
    _kill_after_second_checkpoint(proc, daemons, tmp_path)
    time.sleep(6)  # longer than the client's own reconnect window: it closes, pgmflow opens a new client
    daemons.start()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    assert "lost the Dask scheduler" in out and "reconnected to the scheduler" in out, out
    run_id = _run_id(out)
    tr = _tracker(uri, run_id)
    assert tr.client.get_run(run_id).info.status == "FINISHED"
    assert tr.client.get_run(run_id).data.tags["pgmflow.reconnects"] == "1"
    assert_one_value_per_step(tr.client, run_id)
    _, ref = run(OVERRIDES, f"sqlite:///{tmp_path / 'ref.db'}")
    assert_same_results(ref, tr)


@pytest.mark.slow
def test_a_scheduler_gone_for_good_fails_the_run_with_one_line_and_resume_completes_it(daemons, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    address = [
        "cluster.profile=address",
        f"cluster.address=tcp://127.0.0.1:{daemons.port}",
        "+cluster.options.timeout=3",
        f"tracking.uri={uri}",
    ]
    proc = _pgmflow([*OVERRIDES, *address, "cluster.reconnect_limit=4"], tmp_path)
    _kill_after_second_checkpoint(proc, daemons, tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out[-2000:], err[-3000:])
    run_id = _run_id(out)
    line = [ln for ln in err.strip().splitlines() if ln.startswith("pgmflow: error")]
    assert len(line) == 1 and "Traceback" not in err, err
    assert "cluster.reconnect_limit=4" in line[0] and f"resume={run_id}" in line[0], line[0]
    tr = _tracker(uri, run_id)
    info = tr.client.get_run(run_id)
    assert info.info.status == "FAILED"
    daemons.start()
    r = subprocess.run(
        [sys.executable, "-m", "pgmflow", f"resume={run_id}", *address],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert tr.client.get_run(run_id).info.status == "FINISHED"
    assert_one_value_per_step(tr.client, run_id)
    _, ref = run(OVERRIDES, f"sqlite:///{tmp_path / 'ref.db'}")
    assert_same_results(ref, tr)


def test_reconnect_limit_is_checked_before_anything_starts():
    from pgmflow.core.cluster import check_cluster_config
    from pgmflow.core.errors import ConfigError

    for bad in (-1, "soon", True, float("inf")):
        with pytest.raises(ConfigError) as e:
            check_cluster_config({"profile": "synchronous", "reconnect_limit": bad})
        assert e.value.field == "cluster.reconnect_limit"
    check_cluster_config({"profile": "synchronous", "reconnect_limit": 0})


def test_the_network_timeouts_are_set_for_the_run_and_a_profile_or_the_user_wins():
    import dask

    from pgmflow.core.cluster import NETWORK_DASK_CONFIG, network_timeouts

    with network_timeouts():
        for k, v in NETWORK_DASK_CONFIG.items():
            assert dask.config.get(k) == v, k
    with (
        dask.config.set({"distributed.scheduler.worker-ttl": "7s"}),
        network_timeouts({"distributed.comm.timeouts.tcp": "45s"}),
    ):
        assert dask.config.get("distributed.scheduler.worker-ttl") == "7s"  # the user's own value is kept
        assert dask.config.get("distributed.comm.timeouts.tcp") == "45s"  # the profile's dask_config wins
