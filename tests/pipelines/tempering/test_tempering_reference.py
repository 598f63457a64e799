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

SMALL = [
    "model=gaussian",
    "model.dim=4",
    "tempering.n_replicas=6",
    "tempering.n_rounds=5",
    "tempering.n_chains=1",
    "tempering.explorer=hmc",
    "tempering.sweeps_per_scan=1",
    "tempering.n_leapfrog=4",
    "tempering.variational_from_round=3",
    "tempering.variational_family=full",
    "progress=false",
]


@pytest.mark.parametrize("reference", ["variational", "stabilized"])
@pytest.mark.slow
def test_identical_across_workers_and_layouts(reference, mlflow_uri, cluster_factory):
    ov = SMALL + [f"tempering.reference={reference}"]
    res, ref = run(ov + ["tempering.layout=chain", "tempering.scans_per_task=3", "tempering.figures=false"], mlflow_uri)
    _, tr = run(ov + ["tempering.layout=blocks", "tempering.figures=false"], mlflow_uri, cluster_factory(2))
    assert_same_results(ref, tr)
    assert res["swap_accept_mean"] > 0 and "log_z_exact" in res
    assert res["round_trips"] <= res["restarts"] <= res["round_trips"] + plan_levels(res)
    if reference == "stabilized":
        for key in (
            "barrier_fixed",
            "barrier_variational",
            "round_trips_fixed",
            "round_trips_variational",
            "restarts_fixed",
            "restarts_variational",
            "n_levels_fixed",
            "n_levels_variational",
            "swap_accept_fixed",
            "swap_accept_variational",
            "log_z_ss_fixed",
            "log_z_ss_variational",
        ):
            assert key in res, key
        assert res["n_levels_fixed"] + res["n_levels_variational"] == 6


def plan_levels(res):
    """Replicas of the run (each may hold one restart not yet followed by its round trip)."""
    return res["n_levels"] * res["n_chains"]


def test_stabilized_split_follows_the_barriers(mlflow_uri):
    """On the far-off Gaussian the fixed leg's barrier dwarfs the fitted leg's: the adaptive split gives
    the fixed leg most levels (equal rejection along the chain), the variational leg keeps >= 2, and
    the whole-chain round trips (either reference -> target -> either reference, as Pigeons.jl counts)
    come through the variational leg even though no replica crosses the fixed leg."""
    ov = [
        "model=gaussian",
        "model.dim=8",
        "model.shift=3.0",
        "model.scale_min=0.1",
        "model.scale_max=0.5",
        "tempering.n_replicas=10",
        "tempering.n_rounds=7",
        "tempering.n_chains=1",
        "tempering.explorer=hmc",
        "tempering.sweeps_per_scan=1",
        "tempering.n_leapfrog=6",
        "tempering.variational_from_round=3",
        "tempering.variational_family=full",
        "tempering.reference=stabilized",
        "tempering.figures=false",
        "progress=false",
    ]
    res, _ = run(ov, mlflow_uri)
    assert res["barrier_fixed"] > 5 * res["barrier_variational"], res
    assert res["n_levels_fixed"] >= 7 and res["n_levels_variational"] >= 2, res
    assert res["round_trips_fixed"] == 0 and res["round_trips"] > 10, res
    half, _ = run(ov + ["tempering.stabilized_split=half"], mlflow_uri)
    assert half["n_levels_fixed"] == 5 and half["n_levels_variational"] == 5


@pytest.mark.slow
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
    from pgmflow.core.runner import execute

    ov = SMALL + [f"tempering.reference={reference}", "tempering.figures=false", "tempering.checkpoint_every=1"]
    full, tr_full = run(ov, mlflow_uri)
    cut, tr_cut = run(ov, mlflow_uri)
    _drop_checkpoints_after(tr_cut, cut["run_id"], keep=3)  # round 4 runs with the reference fitted on round 3
    execute(
        compose(ov + [f"resume={cut['run_id']}", f"tracking.uri={mlflow_uri}", "cluster.profile=synchronous"]),
        stream=io.StringIO(),
    )
    assert_same_results(tr_full, tr_cut)
    assert_one_value_per_step(tr_cut.client, cut["run_id"])


def test_variational_with_a_custom_model_and_with_chain_overrides(mlflow_uri):
    """model=custom (a user log-density, random-walk moves) under a variational reference estimates the
    same log Z as the fixed reference; chain_overrides farms several targets, each chain fitting its own
    reference (the fixed leg of each uses its own target's reference)."""
    custom = [
        "model=custom",
        "tempering.explorer=rwm",
        "tempering.n_replicas=6",
        "tempering.n_rounds=6",
        "tempering.n_chains=1",
        "tempering.sweeps_per_scan=2",
        "tempering.variational_from_round=3",
        "tempering.figures=false",
        "progress=false",
    ]
    fixed, _ = run(custom, mlflow_uri)
    var, _ = run(custom + ["tempering.reference=variational"], mlflow_uri)
    se = (fixed["log_z_ss_se"] ** 2 + var["log_z_ss_se"] ** 2) ** 0.5
    assert abs(fixed["log_z_ss"] - var["log_z_ss"]) < 4 * se, (fixed["log_z_ss"], var["log_z_ss"], se)
    farmed, _ = run(
        SMALL
        + [
            "tempering.reference=stabilized",
            "tempering.figures=false",
            "tempering.n_rounds=7",
            "tempering.chain_overrides=[{shift:1.0},{shift:3.0}]",
        ],
        mlflow_uri,
    )
    assert farmed["n_targets"] == 2
    for g in range(2):  # the shift moves the mass, not the normaliser: both targets share the exact log Z
        assert abs(farmed[f"log_z_ss_error_sigmas_target{g}"]) < 4, farmed
        assert farmed["targets"][g]["n_levels_fixed"] + farmed["targets"][g]["n_levels_variational"] == 6


@pytest.mark.slow
def test_bayes_linear_regression_evidence_d10(mlflow_uri):
    """Conjugate Bayesian linear regression on the diabetes data (d = 10): log evidence within 3 SE of
    the closed form."""
    res, _ = run(
        [
            "experiment=bayes_diabetes",
            "tempering.n_rounds=8",
            "tempering.n_chains=1",
            "progress=false",
            "tempering.figures=false",
        ],
        mlflow_uri,
    )
    assert res["exact_log_z_source"] == "analytic"
    assert abs(res["log_z_ss_error_sigmas"]) < 3, res
    assert res["log_z_ss_se"] < 0.1


@pytest.mark.slow
def test_bayes_linear_regression_evidence_d64(mlflow_uri):
    """d = 64 (the diabetes inputs and their products): log evidence within 3 SE of the closed form.

    A shortened experiment=bayes_diabetes_poly: 9 rounds, one chain, no checkpoints, and the diagonal
    variational family (measured: 12-14 s of CPU, 27 s wall at load average 10; within 0.5, 0.6 and 1.3
    SE for seeds 1-3, SE 0.27-0.47). Not the full family here: at 9 rounds its first full-covariance fit
    uses 256 = 4 d draws, and that run ended 23 SE off (see docs/tempering.md)."""
    res, _ = run(
        [
            "experiment=bayes_diabetes_poly",
            "tempering.n_rounds=9",
            "tempering.n_chains=1",
            "tempering.variational_family=diagonal",
            "tempering.checkpoint_every=0",
            "tempering.figures=false",
            "progress=false",
        ],
        mlflow_uri,
    )
    assert res["exact_log_z_source"] == "analytic"
    assert abs(res["log_z_ss_error_sigmas"]) < 3, res
    assert res["log_z_ss_se"] < 0.6, res
