"""Variational bounds end to end: real Hydra composition, a real LocalCluster, a real MLflow store.

- ``pipeline=bounds`` on an Ising lattice: MF <= exact <= TRW at every temperature;
- ``pipeline=bounds`` on a frustrated MRF from a file: the marginal bounds contain the exact marginals;
- ``pipeline=tempering bounds=true``: MF <= tempering estimate <= TRW along the ladder, logged as a
  table, a figure and metrics.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from tests.pipelines.helpers import run


def _rows(tr, name):
    return list(csv.DictReader(io.StringIO(tr.read_text(name))))


def test_bounds_pipeline_on_an_ising_lattice(mlflow_uri, cluster2):
    res, tr = run(
        ["pipeline=bounds", "model.L=6", "variational.temperatures=[1.5,2.269185314213022,3.5]", "progress=false"],
        mlflow_uri,
        cluster2,
    )
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    assert res["all_converged"], res
    rows = _rows(tr, "tables/bounds.csv")
    assert len(rows) == 3
    for r in rows:
        mf, bethe, trw, exact = (float(r[k]) for k in ("mf", "bethe", "trw", "exact"))
        assert mf <= exact + 1e-9 and exact <= trw + 1e-9, r
        assert abs(bethe - exact) < abs(trw - mf), r  # Bethe sits between, closer than the bound gap
    assert "figures/log_z_bounds.png" in set(tr.list_artifacts("figures"))


def _frustrated(tmp_path):
    rng = np.random.default_rng(7)
    n = 9
    J = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < 0.45:
                J[i, j] = J[j, i] = rng.uniform(-1.2, 1.2)
    h = rng.uniform(-0.5, 0.5, n)
    np.savez(tmp_path / "frustrated.npz", J=J, h=h)
    return tmp_path / "frustrated.npz"


def test_bounds_pipeline_on_an_mrf_file_with_marginal_bounds(tmp_path, mlflow_uri, cluster2):
    path = _frustrated(tmp_path)
    res, tr = run(
        ["pipeline=bounds", "model=mrf", f"model.path={path}", "variational.marginals=true", "progress=false"],
        mlflow_uri,
        cluster2,
    )
    assert res["marginal_bounds_contain_exact"] is True, res
    assert res["log_z_mf"] <= res["log_z_exact"] + 1e-9 <= res["log_z_trw"] + 2e-9, res
    rows = _rows(tr, "tables/marginal_bounds.csv")
    assert len(rows) == 9
    for r in rows:
        assert float(r["lower"]) <= float(r["exact"]) + 1e-9 <= float(r["upper"]) + 2e-9, r
        assert float(r["upper"]) - float(r["lower"]) < 1.0  # informative, not just [0, 1]


def test_tempering_with_bounds(mlflow_uri, cluster2):
    res, tr = run(
        [
            "model.L=8",
            "model.T=2.0",
            "bounds=true",
            "tempering.n_replicas=10",
            "tempering.n_rounds=7",
            "tempering.n_chains=2",
            "tempering.figures=false",
            "progress=false",
        ],
        mlflow_uri,
        cluster2,
    )
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    rows = _rows(tr, "tables/bounds.csv")
    assert len(rows) == 10 and float(rows[0]["b"]) == 0.0
    for r in rows:
        mf, t, se, trw = (
            float(r[k]) for k in ("mf_per_site", "tempering_per_site", "tempering_se_per_site", "trw_per_site")
        )
        assert mf <= t + 3 * se + 1e-12 and t - 3 * se - 1e-12 <= trw, r
    assert res["bounds_order_holds"] and res["bounds_all_converged"], res
    assert res["bounds_mf_per_site"] <= res["bounds_trw_per_site"]
    assert "figures/log_z_bounds.png" in set(tr.list_artifacts("figures"))
    # at b = 0 every method is exact: log Z = n log 2
    assert abs(float(rows[0]["mf_per_site"]) - np.log(2)) < 1e-9  # the table keeps 10 digits
    assert abs(float(rows[0]["trw_per_site"]) - np.log(2)) < 1e-9  # the table keeps 10 digits
