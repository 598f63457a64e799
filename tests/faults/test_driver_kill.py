"""The driver (the ``pgmflow`` process, with its LocalCluster) killed with SIGKILL mid-run, then
``resume=<run id>``: the run ends FINISHED with results bit-identical to an undisturbed run, and
recomputes only the work that had not been saved.

TESLA saves each node's selection (its whole grid of path solves) and bounds each temperature's
result as it completes (``partial/*.npz``, pipelines/core/partial.py); the test reads what the
killed run saved, resumes on a LocalCluster whose scheduler counts the tasks that run, and checks
that exactly the unsaved units ran. Tempering and SVI resume from their round checkpoints
(tests/pipelines/tempering/test_resume.py, test_svi_resume.py); sparse_gp continues L-BFGS-B from its last
iteration (test_driver_kill_sparse_gp.py).
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from tests.conftest import REPO
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_metric_histories, run

CASES = {
    # 30 nodes, one selection task per node over a 5 x 3 grid: about 4 s of work on 2 workers
    "tesla": (
        [
            "pipeline=tesla",
            "network.p=30",
            "network.samples_per_time=3",
            "tesla.methods=[tesla]",
            "tesla.lambda2=[1.0,0.25,0.0625]",
            "tesla.figures=false",
            "tesla.checkpoint_seconds=0",
            "progress=false",
        ],
        "estimates.npz",
        "tesla-select-",
        "tesla-fit-",
        30,
        3,
    ),
    # 8 temperatures of a 48 x 48 lattice: about 3 s of work on 2 workers
    "bounds": (
        [
            "pipeline=bounds",
            "model=ising",
            "model.L=48",
            "variational.temperatures=[1.8,2.0,2.1,2.2,2.269185314213022,2.35,2.5,2.8]",
            "variational.figures=false",
            "variational.checkpoint_seconds=0",
            "progress=false",
        ],
        "tables/bounds.csv",
        "bounds-",
        None,
        8,
        0,
    ),
}


def _saved_units(root, run_id) -> int:
    units = set()
    for f in sorted((root / "mlartifacts" / run_id / "artifacts" / "partial").glob("*.npz")):
        with np.load(f) as z:
            units.update(k.rpartition("::")[0] for k in z.files)
    return len(units)


def _kill_after_saves(args, tmp_path, uri, name, min_files=2, subdir="partial", ready=None):
    """Start the CLI, SIGKILL its process group once ``min_files`` artifacts are in the run's ``subdir``
    (and ``ready(path)`` holds for one of them, when given)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pgmflow", *args, f"tracking.uri={uri}", "cluster.n_workers=2"]
    log_path = tmp_path / f"{name}.txt"
    run_id = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and proc.poll() is None:
                text = log_path.read_text()
                if run_id is None and f"{name} run " in text:
                    run_id = text.split(f"{name} run ")[1].split()[0]
                if run_id is not None:
                    part = tmp_path / "mlartifacts" / run_id / "artifacts" / subdir
                    files = list(part.glob("*.npz")) if part.exists() else []
                    if len(files) >= min_files and (ready is None or any(ready(f) for f in files)):
                        break
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out = log_path.read_text()
    assert run_id is not None, out[-3000:]
    assert "finished" not in out, "the run finished before it was killed; the test proves nothing"
    return run_id


class _TaskCounter:
    """A scheduler plugin counting, by key prefix, the tasks that completed (reached memory)."""

    def __init__(self, prefixes):
        self.prefixes = [p for p in prefixes if p]
        self.counts = Counter()

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory":
            for p in self.prefixes:
                if str(key).startswith(p):
                    self.counts[p] += 1


def _results(tr):
    d = json.loads(tr.read_text("results.json"))
    return {k: v for k, v in d.items() if "seconds" not in k}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_killed_driver_resumes_running_only_unsaved_work(tmp_path, name):
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    from pgmflow.core.tracking import Tracker

    args, artifact, unit_prefix, sub_prefix, n_units, subs_per_unit = CASES[name]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = _kill_after_saves(args, tmp_path, uri, name)
    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).info.status == "RUNNING"  # killed: nobody could end it
    saved = _saved_units(tmp_path, run_id)
    assert 0 < saved < n_units, f"{saved} of {n_units} units saved before the kill: the test proves nothing"

    counter = type("Counter", (_TaskCounter, SchedulerPlugin), {})([unit_prefix, sub_prefix])
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    ) as cl:
        cl.scheduler.add_plugin(counter)
        resumed, tr_resumed = run(args + [f"resume={run_id}"], uri, cl)
        ran = dict(counter.counts)
        _, tr_full = run(args, uri, cl)  # undisturbed (the same bits as on any scheduler: test_bit_reproducibility)
    assert resumed["run_id"] == run_id
    assert tr.client.get_run(run_id).info.status == "FINISHED"
    assert ran.get(unit_prefix, 0) == n_units - saved, (ran, saved)
    if sub_prefix:
        assert ran.get(sub_prefix, 0) == (n_units - saved) * subs_per_unit, (ran, saved)
    tags = tr.client.get_run(run_id).data.tags
    assert f"{saved}" in tags.values() and f"{n_units - saved}" in tags.values()

    assert_one_value_per_step(tr.client, run_id)
    assert_same_metric_histories(tr.client, run_id, tr_full.run_id)
    assert _results(tr_resumed) == _results(tr_full)
    if artifact.endswith(".npz"):
        with np.load(tr_resumed.download(artifact)) as a, np.load(tr_full.download(artifact)) as b:
            assert a.files == b.files
            for k in a.files:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    else:
        cols = lambda t: [ln.split(",")[:-1] for ln in t.read_text(artifact).splitlines()]  # noqa: E731 (seconds last)
        assert cols(tr_resumed) == cols(tr_full)


@pytest.mark.slow
def test_killed_driver_resumes_stabilized_tempering(tmp_path):
    """tempering.reference=stabilized killed after the round checkpoints that hold a fitted reference
    and a re-shared split between the legs: the resumed run is bit-identical to an undisturbed one
    (the fitted reference, the legs and the per-leg round-trip counters come from the checkpoint).
    The killed run used a LocalCluster; the resume and the undisturbed run use the synchronous
    scheduler (the same bits on any scheduler: test_tempering_reference.py). 79 s measured at load
    average 10 on a shared 2-core machine (an idle one: an estimated ~20 s, much of it the CLI's start
    and its LocalCluster); worth it as the only check that a *killed* process (not a checkpoint
    removed by hand) resumes the two-leg state."""
    from pgmflow.core.tracking import Tracker

    args = [
        "pipeline=tempering",
        "model=gaussian",
        "model.dim=4",
        "tempering.n_replicas=6",
        "tempering.n_rounds=8",
        "tempering.n_chains=1",
        "tempering.explorer=hmc",
        "tempering.sweeps_per_scan=1",
        "tempering.n_leapfrog=4",
        "tempering.reference=stabilized",
        "tempering.variational_from_round=3",
        "tempering.variational_family=full",
        "tempering.figures=false",
        "progress=false",
    ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = _kill_after_saves(args, tmp_path, uri, "tempering", min_files=4, subdir="checkpoints")
    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).info.status == "RUNNING"
    resumed, tr_resumed = run(args + [f"resume={run_id}"], uri)
    _, tr_full = run(args, uri)
    assert resumed["run_id"] == run_id and tr.client.get_run(run_id).info.status == "FINISHED"
    assert "n_levels_fixed" in resumed and resumed["restarts"] >= resumed["round_trips"] > 0
    assert_one_value_per_step(tr.client, run_id)
    assert_same_metric_histories(tr.client, run_id, tr_full.run_id)
    assert _results(tr_resumed) == _results(tr_full)
