"""log Z from the tempering pipeline against exact answers (done-means 2 of the PT issue):
exact enumeration / transfer matrix on small lattices (fields and spin glasses included),
Kaufman's finite-lattice partition function on 16 x 16 and 32 x 32 tori above, at and below
the critical temperature, and the Gaussian mixture's analytic normaliser. Each within 3 SE."""

import pytest

from tests.pipelines.helpers import run

TC = 2.269185314213022


def _check(res, k=3.0):
    assert res["exact_log_z_source"] != "none"
    err = res["log_z_ss"] - res["log_z_exact"]
    assert abs(err) < k * res["log_z_ss_se"], (res["log_z_ss"], res["log_z_exact"], res["log_z_ss_se"])
    assert res["log_z_ss_se"] < 0.05 * max(1.0, abs(res["log_z_exact"]))  # a real estimate, not a huge error bar
    return err


@pytest.mark.parametrize(
    "extra",
    [
        ["model.T=2.0"],
        ["model.T=1.5", "model.h=0.3"],
        ["model.T=1.0", "model.couplings=spin_glass", "model.disorder_seed=3"],
        ["model.T=2.5", "model.J=-1.0", "model.h=0.5"],
    ],
    ids=["ferro", "field", "spin_glass", "antiferro_field"],
)
def test_small_lattices_against_transfer_matrix(mlflow_uri, cluster2, extra):
    res, _ = run(
        [
            "model.L=4",
            "tempering.n_replicas=8",
            "tempering.n_rounds=10",
            "tempering.n_chains=2",
            "tempering.sweeps_per_scan=2",
            "tempering.figures=false",
            "progress=false",
            *extra,
        ],
        mlflow_uri,
        cluster2,
    )
    assert res["exact_log_z_source"] in ("transfer_matrix", "kaufman")
    _check(res)


@pytest.mark.slow
@pytest.mark.parametrize(
    "L,T,K", [(16, 1.8, 20), (16, TC, 20), (16, 3.0, 16), (32, 1.8, 32), (32, TC, 32), (32, 3.0, 28)]
)
@pytest.mark.slow
def test_kaufman_lattices(mlflow_uri, cluster2, L, T, K):
    res, _ = run(
        [
            f"model.L={L}",
            f"model.T={T}",
            f"tempering.n_replicas={K}",
            "tempering.n_rounds=11",
            "tempering.n_chains=2",
            "tempering.sweeps_per_scan=8",
            "tempering.figures=false",
            "progress=false",
        ],
        mlflow_uri,
        cluster2,
    )
    assert res["exact_log_z_source"] == "kaufman"
    _check(res)
    assert res["round_trips"] > 10  # the chains actually crossed the ladder


@pytest.mark.slow
@pytest.mark.parametrize("T,K,rounds", [(1.8, 96, 12), (TC, 64, 12), (3.0, 64, 11)])
def test_kaufman_64x64(mlflow_uri, cluster2, T, K, rounds):
    res, _ = run(
        [
            "model.L=64",
            f"model.T={T}",
            f"tempering.n_replicas={K}",
            f"tempering.n_rounds={rounds}",
            "tempering.n_chains=2",
            "tempering.sweeps_per_scan=4",
            "tempering.figures=false",
            "progress=false",
        ],
        mlflow_uri,
        cluster2,
    )
    assert res["exact_log_z_source"] == "kaufman"
    _check(res)
    assert res["round_trips"] >= 2


@pytest.mark.slow
def test_gaussian_mixture_log_z(mlflow_uri, cluster2):
    res, _ = run(
        ["experiment=gaussian_mixture", "tempering.n_chains=2", "tempering.figures=false", "progress=false"],
        mlflow_uri,
        cluster2,
    )
    assert res["exact_log_z_source"] == "analytic"
    _check(res)
    assert res["round_trips"] > 50
