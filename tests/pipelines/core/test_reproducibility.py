"""Randomness from identity: the same config and seed give bit-identical results on the
synchronous scheduler and on real LocalClusters with 1, 2 and 4 worker processes, in both graph
layouts, for any number of blocks or scans per task."""

import numpy as np
import pytest

from tests.pipelines.helpers import SMALL_GMM, SMALL_ISING, assert_same_results, final_state, results_json, run


@pytest.mark.slow
def test_ising_identical_across_workers_schedulers_and_layouts(mlflow_uri, cluster_factory):
    _, ref = run(SMALL_ISING + ["tempering.layout=chain", "tempering.scans_per_task=3"], mlflow_uri)
    runs = [
        run(SMALL_ISING + ["tempering.layout=blocks"], mlflow_uri),  # synchronous, 1 block
        run(SMALL_ISING + ["tempering.layout=blocks", "tempering.n_blocks=3"], mlflow_uri),
        run(SMALL_ISING + ["tempering.layout=chain"], mlflow_uri, cluster_factory(1)),
        run(SMALL_ISING + ["tempering.layout=blocks"], mlflow_uri, cluster_factory(2)),  # 2 blocks
        run(SMALL_ISING + ["tempering.layout=blocks"], mlflow_uri, cluster_factory(4)),  # 4 blocks
        run(SMALL_ISING + ["tempering.layout=chain", "tempering.scans_per_task=5"], mlflow_uri, cluster_factory(4)),
    ]
    for _, tr in runs:
        res = assert_same_results(ref, tr)
    # and the run did real work: the states moved away from the initial draws, swaps happened
    assert res["round_trips"] >= 0 and 0 < res["swap_accept_mean"] < 1
    assert res["scans_total"] == sum(2**r for r in range(1, 6))


@pytest.mark.slow
def test_different_seeds_differ(mlflow_uri):
    _, a = run(SMALL_ISING + ["seed=1"], mlflow_uri)
    _, b = run(SMALL_ISING + ["seed=2"], mlflow_uri)
    assert not np.array_equal(final_state(a)["x"], final_state(b)["x"])
    assert results_json(a)["log_z_ss"] != results_json(b)["log_z_ss"]


@pytest.mark.slow
def test_continuous_identical_across_workers_and_layouts(mlflow_uri, cluster_factory):
    _, ref = run(SMALL_GMM + ["tempering.n_chains=2"], mlflow_uri)
    _, tr = run(SMALL_GMM + ["tempering.n_chains=2", "tempering.layout=blocks"], mlflow_uri, cluster_factory(2))
    assert_same_results(ref, tr)


@pytest.mark.slow
def test_farming_several_targets_matches_single_runs(mlflow_uri):
    """Targets farmed in one run: the first target's chain is bit-identical to running it alone
    (same chain identity), and each target is compared with its own exact log Z."""
    res, tr = run(SMALL_ISING + ["tempering.chain_overrides=[{T:2.5},{T:3.5,h:0.2}]"], mlflow_uri)
    alone, _ = run(SMALL_ISING, mlflow_uri)  # model.T=2.5
    assert res["n_targets"] == 2
    t0, t1 = res["targets"]
    assert t0["log_z_ss"] == alone["log_z_ss"] and t0["log_z_exact"] == alone["log_z_exact"]
    assert t1["exact_log_z_source"] == "transfer_matrix" and t1["log_z_exact"] != t0["log_z_exact"]
    assert t1["chains"] == [2, 3] and t1["model_overrides"] == {"T": 3.5, "h": 0.2}
    arts = set(tr.list_artifacts("figures"))
    assert "figures/log_z_target1.png" in arts
