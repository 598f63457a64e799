"""``sparse_gp.restarts``: a bound with two optima (a fast oscillation under small noise, or all of it
as noise) that a single start from the default lengthscale misses and 8 seeded restarts find; every
restart's bound is logged, and the result is the same bits on the workers as in the driver. On the shipped
Mauna Loa CO2 record, 8 restarts reach the short-lengthscale optimum (bound >= 3500) that starts drawn only
from 5 % of the input's range upwards missed (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipelines.helpers import run


def _wiggle(path):
    g = np.random.default_rng(0)
    x = g.uniform(0, 10, 400)
    y = np.sin(2 * np.pi * x / 0.5) + 0.1 * g.standard_normal(400)
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header="x,y", comments="")
    return [
        "pipeline=sparse_gp",
        "gp_data=csv",
        f"gp_data.path={path}",
        "sparse_gp.m=80",
        "sparse_gp.figures=false",
        "progress=false",
    ]


@pytest.mark.slow
def test_restarts_find_the_higher_optimum_the_single_start_misses(tmp_path, mlflow_uri, cluster2):
    base = _wiggle(tmp_path / "wiggle.csv")
    single, _ = run(base, mlflow_uri)
    multi, tr = run(base + ["sparse_gp.restarts=8"], mlflow_uri)
    # one start explains the oscillation as noise; a restart with a short lengthscale finds it
    assert single["noise_variance"] > 0.3 and single["test_rmse"] > 0.5
    assert multi["bound"] > single["bound"] + 100 and multi["test_rmse"] < 0.2 and multi["noise_variance"] < 0.05
    assert len(multi["restart_bounds"]) == 9 and multi["restart_bounds"][0] == single["bound"]
    assert multi["bound"] == max(multi["restart_bounds"]) and multi["best_restart"] > 0
    hist = tr.client.get_metric_history(multi["run_id"], "restart_bound")
    assert sorted(m.step for m in hist) == list(range(9))
    assert [m.value for m in sorted(hist, key=lambda m: m.step)] == multi["restart_bounds"]
    # the same bits on the workers (fewer, shorter fits: each evaluation there is two round trips)
    short = base + ["sparse_gp.restarts=3", "sparse_gp.max_iter=20"]
    in_driver, _ = run(short, mlflow_uri)
    on_workers, _ = run(short + ["sparse_gp.in_process=false"], mlflow_uri, cluster2)
    assert on_workers["restart_bounds"] == in_driver["restart_bounds"] and len(in_driver["restart_bounds"]) == 4
    assert on_workers["test_rmse"] == in_driver["test_rmse"]


@pytest.mark.slow
def test_restarts_reach_the_short_lengthscale_optimum_of_the_co2_record(mlflow_uri):
    """gp_data=co2, m=256, RBF, the seeded 80/20 split: the configured start ends near bound 1131 (a 6.5 year
    lengthscale), 8 restarts at >= 3500 (about 0.29 years; test RMSE about 0.37 ppm). About 15-25 s on 2 cores."""
    res, _ = run(
        ["pipeline=sparse_gp", "gp_data=co2", "sparse_gp.m=256", "sparse_gp.restarts=8"]
        + ["sparse_gp.figures=false", "progress=false"],
        mlflow_uri,
    )
    assert res["restart_bounds"][0] < 1500 < 3500 <= res["bound"]
    assert res["test_rmse"] < 0.5 and res["lengthscales"][0] < 0.5 and res["best_restart"] > 0
    assert res["all_fits_count"] == 9 and res["all_fits_iterations"] > res["iterations"]
