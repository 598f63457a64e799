"""A sparse-GP (SGPR) fit whose driver is SIGKILLed mid-run, then ``resume=<run id>``: L-BFGS-B
continues from its last checkpointed iteration (its whole state: point, gradient, limited memory,
line-search and counters; pipelines/sparse_gp/lbfgsb.py), runs only the evaluations that were not
done, and ends with the same model, bit for bit, as an undisturbed fit."""

import json
import logging

import numpy as np
import pytest

from tests.conftest import REPO
from tests.faults.test_driver_kill import _kill_after_saves, _TaskCounter
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_metric_histories, run

ARGS = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=16",
    "sparse_gp.max_iter=40",
    "sparse_gp.chunk_size=100",
    "sparse_gp.in_process=false",
    "sparse_gp.checkpoint_every_seconds=0",  # a checkpoint every iteration: killed after iteration 5's
    "sparse_gp.figures=false",
    "progress=false",
]
N_CHUNKS = 5  # 442 rows in chunks of 100


def _checkpointed(root, run_id) -> dict:
    best = None
    for f in (root / "mlartifacts" / run_id / "artifacts" / "checkpoints").glob("lbfgs_*.npz"):
        with np.load(f) as z:
            if best is None or int(z["nit"]) > best["nit"]:
                best = {"nit": int(z["nit"]), "evaluations": int(z["ev_count"])}
    return best


@pytest.mark.slow
def test_killed_sparse_gp_fit_continues_from_its_last_iteration(tmp_path):
    from distributed import LocalCluster
    from distributed.diagnostics.plugin import SchedulerPlugin

    from pgmflow.core.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ARGS  # every evaluation one graph (sparse_gp.evaluate direct, the default, and graph alike)
    # killed once a checkpoint of iteration 5 or later is in the run's artifacts
    run_id = _kill_after_saves(args, tmp_path, uri, "sparse_gp", min_files=1, subdir="checkpoints", ready=_enough)
    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).info.status == "RUNNING"
    at_kill = _checkpointed(tmp_path, run_id)
    assert at_kill is not None and at_kill["nit"] >= 5, at_kill

    counter = type("Counter", (_TaskCounter, SchedulerPlugin), {})(["gp-stats-", "gp-objgrad-"])
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    ) as cl:
        cl.scheduler.add_plugin(counter)
        resumed, tr_resumed = run(args + [f"resume={run_id}"], uri, cl)
        stats_tasks, objectives = counter.counts["gp-stats-"], counter.counts["gp-objgrad-"]
        full, tr_full = run(args, uri, cl)  # undisturbed
    assert resumed["iterations"] > at_kill["nit"], "the fit had ended before the kill: the test proves nothing"
    # only the evaluations after the checkpoint ran again: one statistics task and one objective-and-gradient
    # task per worker holding chunks (the 5 chunks are spread over both workers)
    again = resumed["evaluations"] - at_kill["evaluations"]
    per_evaluation = min(N_CHUNKS, 2)
    assert objectives == again * per_evaluation, (objectives, at_kill, resumed)
    assert stats_tasks == again * per_evaluation, (stats_tasks, at_kill, resumed)
    assert resumed["evaluations"] == full["evaluations"] and resumed["iterations"] == full["iterations"]
    assert tr.client.get_run(run_id).data.tags["pgmflow.gp.resumed_from_iteration"] == str(at_kill["nit"])

    def results(t):
        return {k: v for k, v in json.loads(t.read_text("results.json")).items() if "seconds" not in k}

    assert results(tr_resumed) == results(tr_full)
    with np.load(tr_resumed.download("model.npz")) as a, np.load(tr_full.download("model.npz")) as b:
        assert a.files == b.files
        for k in a.files:
            assert a[k].tobytes() == b[k].tobytes(), k
    assert_one_value_per_step(tr.client, run_id)
    assert_same_metric_histories(tr.client, run_id, tr_full.run_id)


def _enough(path) -> bool:
    """A checkpoint of iteration 5 or later is readable (the driver is still going)."""
    try:
        with np.load(path) as z:
            return int(z["nit"]) >= 5
    except Exception:
        return False
