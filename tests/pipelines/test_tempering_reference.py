"""tempering.reference=variational|stabilized: bit-identical on the synchronous scheduler and on a real
LocalCluster in the other graph layout, and after a resume from a mid-run checkpoint (the fitted
reference is in the checkpoint); per-leg diagnostics in the results and figures; model=bayes recovers
the closed-form evidence of the conjugate linear regression on the diabetes data."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.conftest import compose
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_results, run

SMALL = ["model=gaussian", "model.dim=4", "tempering.n_replicas=6", "tempering.n_rounds=5", "tempering.n_chains=1",
         "tempering.explorer=hmc", "tempering.sweeps_per_scan=1", "tempering.n_leapfrog=4",
         "tempering.variational_from_round=3", "tempering.variational_family=full", "progress=false"]


@pytest.mark.parametrize("reference", ["variational", "stabilized"])
def test_identical_across_workers_and_layouts(reference, mlflow_uri, cluster_factory):
    ov = SMALL + [f"tempering.reference={reference}"]
    res, ref = run(ov + ["tempering.layout=chain", "tempering.scans_per_task=3", "tempering.figures=false"], mlflow_uri)
    _, tr = run(ov + ["tempering.layout=blocks", "tempering.figures=false"], mlflow_uri, cluster_factory(2))
    assert_same_results(ref, tr)
    assert res["swap_accept_mean"] > 0 and "log_z_exact" in res
    if reference == "stabilized":
        for key in ("barrier_fixed", "barrier_variational", "round_trips_fixed", "round_trips_variational",
                    "swap_accept_fixed", "swap_accept_variational", "log_z_ss_fixed", "log_z_ss_variational"):
            assert key in res, key


def test_stabilized_figures_show_both_legs(mlflow_uri):
    res, tr = run(SMALL + ["tempering.reference=stabilized"], mlflow_uri)
    arts = set(tr.list_artifacts("figures"))
    assert {"figures/swap_acceptance.png", "figures/legs.png"} <= arts, arts
    assert res["barrier"] == pytest.approx(res["barrier_fixed"] + res["barrier_variational"])


def _drop_checkpoints_after(tracker, run_id, keep: int):
    """As if the driver had died after the checkpoint of round ``keep``: later checkpoints removed."""
    uri = tracker.client.get_run(run_id).info.artifact_uri
    folder = Path(urlparse(uri).path) / "checkpoints"
    for p in folder.glob("round_*.npz"):
        if int(p.stem.split("_")[-1]) > keep:
            p.unlink()
    tracker.client.set_terminated(run_id, "KILLED")


@pytest.mark.parametrize("reference", ["variational", "stabilized"])
def test_resume_after_a_fit_is_identical(reference, mlflow_uri):
    from pgmflow.pipelines.core.runner import execute

    ov = SMALL + [f"tempering.reference={reference}", "tempering.figures=false", "tempering.checkpoint_every=1"]
    full, tr_full = run(ov, mlflow_uri)
    cut, tr_cut = run(ov, mlflow_uri)
    _drop_checkpoints_after(tr_cut, cut["run_id"], keep=3)  # round 4 runs with the reference fitted on round 3
    execute(compose(ov + [f"resume={cut['run_id']}", f"tracking.uri={mlflow_uri}", "cluster.profile=synchronous"]),
            stream=io.StringIO())
    assert_same_results(tr_full, tr_cut)
    assert_one_value_per_step(tr_cut.client, cut["run_id"])


@pytest.mark.slow
def test_bayes_linear_regression_evidence_d10(mlflow_uri):
    """Conjugate Bayesian linear regression on the diabetes data (d = 10): log evidence within 3 SE of
    the closed form."""
    res, _ = run(["experiment=bayes_diabetes", "tempering.n_rounds=8", "tempering.n_chains=1", "progress=false",
                  "tempering.figures=false"], mlflow_uri)
    assert res["exact_log_z_source"] == "analytic"
    assert abs(res["log_z_ss_error_sigmas"]) < 3, res
    assert res["log_z_ss_se"] < 0.1
