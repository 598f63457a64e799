"""What an MLflow run records: config, params, provenance tags, metrics with steps, figures,
tables, checkpoints; and a run that fails ends FAILED with the error message."""

import pytest
import yaml

from tests.pipelines.helpers import SMALL_ISING, run


@pytest.mark.slow
def test_run_records_everything(mlflow_uri, cluster2):
    res, tr = run(SMALL_ISING + ["tempering.n_chains=2"], mlflow_uri, cluster2)
    r = tr.client.get_run(tr.run_id)
    assert r.info.status == "FINISHED"
    tags = r.data.tags
    for key in (
        "git.commit",
        "git.dirty",
        "version.pgmflow",
        "version.numpy",
        "version.dask",
        "pgmflow.backend",
        "pgmflow.device",
        "pgmflow.cluster.profile",
        "pgmflow.cluster.workers",
        "pgmflow.config_hash",
    ):
        assert key in tags, key
    assert tags["pgmflow.backend"] == "numpy"
    assert tags["pgmflow.cluster.profile"] == "address"
    assert tags["pgmflow.cluster.workers"] == "2"
    params = r.data.params
    assert params["model.L"] == "8" and params["tempering.n_replicas"] == "6" and params["seed"] == "0"
    cfg = yaml.safe_load(tr.read_text("config.yaml"))
    assert cfg["model"]["L"] == 8 and cfg["tempering"]["n_chains"] == 2
    hist = tr.client.get_metric_history(tr.run_id, "swap_accept_mean")
    assert sorted(m.step for m in hist) == [1, 2, 3, 4, 5]
    assert all(0 <= m.value <= 1 for m in hist)
    arts = (
        set(tr.list_artifacts())
        | set(tr.list_artifacts("figures"))
        | set(tr.list_artifacts("checkpoints"))
        | set(tr.list_artifacts("tables"))
    )
    for name in (
        "config.yaml",
        "results.json",
        "final_state.npz",
        "figures/energy_traces.png",
        "figures/swap_acceptance.png",
        "figures/round_trips.png",
        "figures/log_z.png",
        "checkpoints/round_005.npz",
        "tables/log_z.csv",
        "tables/per_temperature_chain1.csv",
    ):
        assert name in arts, name
    assert "rhat_max" in r.data.metrics and r.data.metrics["rhat_max"] > 0.9
    assert res["objective"] == pytest.approx(abs(res["log_z_ss"] - res["log_z_exact"]))


def test_failure_mid_run_ends_failed_with_message(mlflow_uri):
    """A log-density that is fine at preflight but NaN far out fails during the run: FAILED + message."""
    from pgmflow.core.tracking import Tracker

    with pytest.raises(FloatingPointError):
        run(
            [
                "model=custom",
                "model.log_density=tests.pipelines.densities:nan_far_out",
                "model.grad_log_density=",
                "tempering.explorer=rwm",
                "tempering.n_replicas=4",
                "tempering.n_rounds=4",
                "tempering.step_size=50",
                "model.reference_scale=1",
                "progress=false",
            ],
            mlflow_uri,
        )
    tr = Tracker(mlflow_uri, "pgmflow")
    runs = tr.client.search_runs([tr.client.get_experiment_by_name("pgmflow").experiment_id])
    assert len(runs) == 1
    assert runs[0].info.status == "FAILED"
    assert "returned NaN" in runs[0].data.tags["pgmflow.error"]
