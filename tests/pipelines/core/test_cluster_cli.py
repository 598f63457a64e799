"""``pgmflow cluster start|status|stop`` (pgmflow.core.cluster_cli): a local cluster kept between runs, used by
two runs through the address profile with the same results as a run on a fresh cluster, and stopped with
nothing left behind; bad commands refused in one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.pipelines.helpers import assert_same_results

RUN = ["pipeline=tempering", "debug=default", "progress=false", "tempering.figures=false"]


def cli(cwd, *args, timeout=300):
    env = {**os.environ, "PGMFLOW_ORIG_CWD": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "pgmflow", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def latest(uri):
    """A Tracker bound to the newest run of the store."""
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow").experiment_id
    tr.run_id = tr.client.search_runs([exp], order_by=["attributes.start_time DESC"])[0].info.run_id
    return tr


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_kept_cluster_serves_two_runs_and_stops(tmp_path, mlflow_uri):
    start = cli(tmp_path, "cluster", "start", "--workers", "2")
    state_file = tmp_path / ".pgmflow" / "cluster.json"
    try:
        assert start.returncode == 0, start.stderr
        state = json.loads(state_file.read_text())
        assert state["workers"] == 2 and state["address"].startswith("tcp://127.0.0.1:")
        assert f"cluster.address={state['address']}" in start.stdout
        again = cli(tmp_path, "cluster", "start")  # a second start finds the first
        assert again.returncode == 0 and "already running" in again.stdout
        status = cli(tmp_path, "cluster", "status")
        assert status.returncode == 0 and state["address"] in status.stdout
        use = ["cluster.profile=address", f"cluster.address={state['address']}", f"tracking.uri={mlflow_uri}"]
        runs = []
        for _ in range(2):
            r = cli(tmp_path, *RUN, *use)
            assert r.returncode == 0, r.stderr[-2000:]
            runs.append(latest(mlflow_uri))
            assert runs[-1].client.get_run(runs[-1].run_id).data.tags["pgmflow.cluster.type"] == "address"
        local = cli(tmp_path, *RUN, "cluster.profile=synchronous", f"tracking.uri={mlflow_uri}")
        assert local.returncode == 0, local.stderr[-2000:]
        assert_same_results(runs[0], runs[1])
        assert_same_results(runs[1], latest(mlflow_uri))  # the same bits as a run in this process
    finally:
        stop = cli(tmp_path, "cluster", "stop")
    assert stop.returncode == 0 and "stopped" in stop.stdout
    assert not state_file.exists() and not alive(state["pid"])
    gone = cli(tmp_path, "cluster", "status")
    assert gone.returncode == 1 and "no cluster running" in gone.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (["cluster", "frob"], ["'frob' is not a command"]),
        (["cluster", "start", "--workers", "0"], ["is not --workers N"]),
        (["cluster", "status", "now"], ["takes no arguments"]),
    ],
)
def test_bad_cluster_commands_are_one_line(tmp_path, args, words):
    r = cli(tmp_path, *args, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgmflow: error: cluster"), r.stderr
    assert all(w in lines[0] for w in words)
