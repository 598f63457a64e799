"""Helpers for pipeline tests: run an experiment in-process and read back what MLflow recorded."""

from __future__ import annotations

import io
import json

import numpy as np

from tests.conftest import compose

SMALL_ISING = [
    "model.L=8",
    "model.T=2.5",
    "tempering.n_replicas=6",
    "tempering.n_rounds=5",
    "tempering.sweeps_per_scan=2",
    "progress=false",
]
SMALL_GMM = [
    "model=gaussian_mixture",
    "tempering.n_replicas=5",
    "tempering.n_rounds=5",
    "tempering.explorer=hmc",
    "tempering.sweeps_per_scan=1",
    "tempering.n_leapfrog=5",
    "progress=false",
]


def run(overrides, mlflow_uri, cluster=None, n_workers=None):
    """Execute one experiment in this process; ``cluster`` is a LocalCluster to connect to (or None:
    the synchronous scheduler). Returns (result dict, Tracker bound to the run)."""
    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import Tracker

    ov = list(overrides) + [f"tracking.uri={mlflow_uri}"]
    if cluster is None:
        ov.append("cluster.profile=synchronous")
    else:
        ov += ["cluster.profile=address", f"cluster.address={cluster.scheduler_address}"]
    cfg = compose(ov)
    res = execute(cfg, stream=io.StringIO())
    tr = Tracker(mlflow_uri, cfg["tracking"]["experiment"])
    tr.run_id = res["run_id"]
    return res, tr


def final_state(tracker) -> dict:
    with np.load(tracker.download("final_state.npz")) as z:
        return {k: z[k] for k in z.files}


def results_json(tracker) -> dict:
    d = json.loads(tracker.read_text("results.json"))
    d.pop("wall_seconds", None)
    return d


def assert_same_results(tr_a, tr_b):
    """Bit-identical final states and estimates (timings excluded)."""
    a, b = final_state(tr_a), final_state(tr_b)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    ra, rb = results_json(tr_a), results_json(tr_b)
    assert ra == rb
    return ra


def assert_one_value_per_step(client, run_id):
    """No metric of the run has two values at one step (what MLflow would draw as duplicate points)."""
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"metric {key} has two values at one step: {sorted(steps)}"


def assert_same_metric_histories(client, run_a, run_b):
    """Every metric (timings and memory measurements excluded) has the same values at the same steps in
    both runs."""
    from pgmflow.core.reproduce import TIMING

    def results(run_id):
        return {k for k in client.get_run(run_id).data.metrics if not TIMING.search(k) and "rss" not in k}

    keys_a, keys_b = results(run_a), results(run_b)
    assert keys_a == keys_b, keys_a ^ keys_b
    for key in sorted(keys_a):
        ha = sorted((m.step, m.value) for m in client.get_metric_history(run_a, key))
        hb = sorted((m.step, m.value) for m in client.get_metric_history(run_b, key))
        assert ha == hb, f"metric {key} differs: {ha[:5]}... vs {hb[:5]}..."
