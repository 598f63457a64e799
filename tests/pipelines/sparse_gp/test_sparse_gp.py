"""Sparse GPs end to end: real Hydra composition, a real LocalCluster, a real MLflow store.

- SGPR on the shipped diabetes data logs the bound per iteration, test RMSE / NLPD, the figures
  and the model (parameters, inducing inputs, summed statistics, standardisation);
- the model and the metrics are bit-identical on 1, 2 and 4 workers;
- the exact GP fits the same small data at least as well as SGPR;
- SVGP's full-data ELBO improves over a few minibatch steps;
- .npy data is read by path inside the chunk tasks (a few hundred bytes per task), and gives the
  same model, bit for bit, as the same data from an .npz (scattered chunks);
- a Cholesky that fails at the requested jitter is retried with more, and the jitter used is reported;
- DTC and FITC run end to end; with a GPU (``-m gpu``), backend=cupy gives the NumPy answer.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.pipelines.helpers import run

BASE = ["pipeline=sparse_gp", "progress=false"]
DIABETES = BASE + ["gp_data=diabetes", "sparse_gp.m=16", "sparse_gp.max_iter=15", "sparse_gp.chunk_size=200"]
NO_FIGS = ["sparse_gp.figures=false"]


def _model(tr) -> dict:
    with np.load(tr.download("model.npz")) as z:
        return {k: z[k] for k in z.files}


def _history(tr, name):
    return [(m.step, m.value) for m in sorted(tr.client.get_metric_history(tr.run_id, name), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One MLflow store for the module (a new SQLite store costs seconds of schema migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('sparse_gp') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def diabetes_sgpr(cluster2, store):
    return run(DIABETES, store, cluster2)


def test_sgpr_on_diabetes_logs_metrics_figures_and_model(diabetes_sgpr):
    res, tr = diabetes_sgpr
    run_ = tr.client.get_run(tr.run_id)
    assert run_.info.status == "FINISHED"
    assert run_.data.tags["pgmflow.gp.method"] == "sgpr" and run_.data.tags["pgmflow.model"] == "sgpr"
    assert run_.data.tags["pgmflow.gp.data_access"].startswith("scattered")
    assert {f"figures/{n}.png" for n in ("bound", "slice", "lengthscales")} <= set(tr.list_artifacts("figures"))
    assert res["train_rows"] + res["test_rows"] == 442 and 50 < res["test_rows"] < 140
    assert res["objective"] == res["test_nlpd"] and "lower is better" in res["objective_name"]
    # a real fit: better than predicting the training mean (the target's standard deviation is ~77)
    assert 40 < res["test_rmse"] < 65, res["test_rmse"]
    assert 4.5 < res["test_nlpd"] < 6.0, res["test_nlpd"]
    bound = _history(tr, "bound")
    assert [s for s, _ in bound] == list(range(res["iterations"] + 1))
    assert bound[-1][1] > bound[0][1] + 100 and bound[-1][1] == pytest.approx(res["bound"])
    m = _model(tr)
    assert m["Z"].shape == (16, 10) and m["stats_AAT"].shape == (16, 16) and int(m["stats_n"]) == res["train_rows"]
    assert m["log_lengthscale"].shape == (10,) and str(m["method"]) == "sgpr"
    assert 140 < float(m["y_mean"]) < 165 and m["x_mean"].shape == (10,)  # the standardisation of the training rows
    np.testing.assert_allclose(np.exp(m["log_lengthscale"]) * m["x_std"], res["lengthscales"])
    assert tr.client.get_metric_history(tr.run_id, "final_test_rmse")[0].value == res["test_rmse"]


@pytest.mark.slow
def test_results_are_bit_identical_on_1_2_and_4_workers(store, cluster_factory):
    ov = (
        BASE
        + NO_FIGS
        + [
            "gp_data.n=500",
            "sparse_gp.m=12",
            "sparse_gp.max_iter=5",
            "sparse_gp.chunk_size=128",
            "sparse_gp.in_process=false",
        ]
    )
    outs = []
    for n in (1, 2, 4):
        res, tr = run(ov, store, cluster_factory(n))
        outs.append(
            (_model(tr), _history(tr, "bound"), {k: v for k, v in res.items() if "seconds" not in k and k != "run_id"})
        )
    for model, hist, res in outs[1:]:
        assert model.keys() == outs[0][0].keys()
        for k in model:
            np.testing.assert_array_equal(model[k], outs[0][0][k], err_msg=k)
        assert hist == outs[0][1]
        assert res == outs[0][2]


def test_sparse_gp_evaluate_direct_and_graph_are_both_one_graph_per_evaluation(store, cluster2):
    """``sparse_gp.evaluate`` stays accepted (recorded configs reproduce); ``direct`` is the graph path now, so
    both values give the same model, bit for bit, and neither tags direct evaluations."""
    ov = (
        BASE
        + NO_FIGS
        + [
            "gp_data.n=500",
            "sparse_gp.m=12",
            "sparse_gp.max_iter=5",
            "sparse_gp.chunk_size=128",
            "sparse_gp.in_process=false",
        ]
    )
    (_, tr_d), (_, tr_g) = (run(ov + [f"sparse_gp.evaluate={e}"], store, cluster2) for e in ("direct", "graph"))
    tags_d, tags_g = (t.client.get_run(t.run_id).data.tags for t in (tr_d, tr_g))
    assert "pgmflow.gp.direct_evaluations" not in tags_d and "pgmflow.gp.direct_evaluations" not in tags_g
    a, b = _model(tr_d), _model(tr_g)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert _history(tr_d, "bound") == _history(tr_g, "bound")


def test_a_config_recorded_before_sparse_gp_evaluate_still_passes_preflight():
    from pgmflow.core.preflight import preflight_checks
    from tests.conftest import compose

    cfg = compose(["pipeline=sparse_gp", "gp_data=diabetes"])
    assert cfg["sparse_gp"].pop("evaluate") == "direct"
    plan = preflight_checks(cfg)  # what `pgmflow reproduce` of an older run composes: the default applies
    assert plan.fit.evaluate == "direct"


def test_exact_gp_fits_at_least_as_well_as_sgpr(diabetes_sgpr, store, cluster2):
    res_s, _ = diabetes_sgpr
    res_e, tr = run(DIABETES + NO_FIGS + ["sparse_gp.method=exact"], store, cluster2)
    assert res_e["method"] == "exact" and res_e["test_rows"] == res_s["test_rows"]
    assert res_e["test_nlpd"] <= res_s["test_nlpd"] + 0.02, (res_e["test_nlpd"], res_s["test_nlpd"])
    assert res_e["bound"] >= res_s["bound"]  # the log marginal likelihood is above SGPR's lower bound
    assert _model(tr)["X_train"].shape == (res_e["train_rows"], 10)


def test_svgp_minibatches_improve_the_elbo(store, cluster2):
    ov = (
        BASE
        + NO_FIGS
        + [
            "gp_data.function=sine_1d",
            "gp_data.n=800",
            "gp_data.noise_std=0.1",
            "sparse_gp.method=svgp",
            "sparse_gp.m=12",
            "sparse_gp.chunk_size=400",
            "sparse_gp.svgp_steps=60",
            "sparse_gp.svgp_batch_size=64",
            "sparse_gp.svgp_eval_every=20",
            "sparse_gp.svgp_lr=0.05",
            "sparse_gp.svgp_rho=0.2",
        ]
    )
    res, tr = run(ov, store, cluster2)
    bound = _history(tr, "bound")
    assert [s for s, _ in bound] == [0, 20, 40, 60]
    assert bound[-1][1] > bound[0][1] + 100, bound
    assert len(_history(tr, "elbo_minibatch")) == 60
    assert res["test_rmse"] < 0.5  # the sine's amplitude is ~1.3; the noise 0.1
    m = _model(tr)
    assert m["svgp_theta1"].shape == (12,) and m["svgp_theta2"].shape == (12, 12)


def test_npy_data_is_read_by_path_in_the_chunk_tasks(tmp_path, store, cluster2):
    from pgmflow.core.graph import Executor
    from pgmflow.sparse_gp import data as gp_data
    from pgmflow.sparse_gp import evaluations as sparse_gp
    from pgmflow.tasks.gp import data as gdata
    from pgmflow.tasks.gp.chunks import FileRows
    from tests.conftest import compose

    X, y = gdata.friedman1(5, 500, d=6)
    np.save(tmp_path / "data.npy", np.column_stack([X[:, :2], y, X[:, 2:]]))  # the target in the middle
    np.savez(tmp_path / "data.npz", X=X, y=y)
    common = BASE + NO_FIGS + ["sparse_gp.m=12", "sparse_gp.max_iter=4", "sparse_gp.chunk_size=128"]
    npy = common + ["gp_data=npy", f"gp_data.path={tmp_path / 'data.npy'}", "gp_data.target=2"]
    cfg = compose(npy)
    data = gp_data.resolve(cfg)
    assert data.memmap and data.X is None and data.d == 6
    refs, counts = sparse_gp.chunk_refs(Executor(None), data, 128, 0, 0.2)
    assert len(refs) == 4 and counts.sum() == data.n_train
    assert all(isinstance(r, FileRows) and r.path == str(tmp_path / "data.npy") for r in refs)
    assert max(len(pickle.dumps(r)) for r in refs) < 1000  # a path and a row range, not the rows
    res, tr = run(npy, store, cluster2)
    tags = tr.client.get_run(tr.run_id).data.tags
    assert tags["pgmflow.gp.data_access"].startswith("memmap: each chunk task reads its rows of")
    assert _history(tr, "chunk_ref_bytes")[0][1] < 1000
    res_z, tr_z = run(common + ["gp_data=npz", f"gp_data.path={tmp_path / 'data.npz'}"], store, cluster2)
    a, b = _model(tr), _model(tr_z)
    for k in ("Z", "log_lengthscale", "log_noise", "stats_AAT", "x_mean", "y_std"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert res["test_nlpd"] == res_z["test_nlpd"]


def test_a_failing_cholesky_is_retried_with_a_larger_jitter(store, cluster2):
    """Lengthscales of 1e5 (standardised units) make K(Z, Z) rank one in rounding: with a jitter of 1e-16 x s
    (below the rounding of s) Kuu's Cholesky fails, and succeeds after the jitter has grown. (Lengthscales of
    1000 did this before issue 37 through B = I + L^-1 Kuf Kfu L^-T / sigma^2; B = I + A A' / sigma^2 now
    factors whenever Kuu does, and Kuu with those lengthscales factors at 1e-16 x s.)"""
    ov = (
        DIABETES
        + NO_FIGS
        + [
            "sparse_gp.m=32",
            "sparse_gp.lengthscale=100000",
            "sparse_gp.jitter=1e-16",
            "sparse_gp.max_iter=3",
            "sparse_gp.chunk_size=500",
        ]
    )
    res, tr = run(ov, store, cluster2)
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    assert res["jitter_max"] >= 1e-15 and res["jitter_requested"] == 1e-16
    jit = _history(tr, "jitter")
    assert jit[0][0] == 0 and jit[0][1] == pytest.approx(res["jitter_max"], rel=1e-12)  # abs / s, rounded
    assert np.isfinite(res["test_nlpd"])


@pytest.mark.parametrize("method", ["dtc", "fitc"])
def test_dtc_and_fitc_run_end_to_end(method, store, cluster2):
    ov = DIABETES + NO_FIGS + [f"sparse_gp.method={method}", "sparse_gp.max_iter=5", "sparse_gp.kernel=matern32"]
    res, tr = run(ov, store, cluster2)
    assert res["method"] == method and np.isfinite(res["test_nlpd"]) and res["test_rmse"] < 70
    m = _model(tr)
    assert ("stats_log_lambda" in m) == (method == "fitc") and str(m["kernel"]) == "matern32"


@pytest.mark.gpu
def test_cupy_backend_matches_numpy(diabetes_sgpr, store, cluster2):
    """backend=cupy: the chunk statistics and gradients are computed on the GPU (float64)."""
    res_np, _ = diabetes_sgpr
    res, tr = run(DIABETES + NO_FIGS + ["backend=cupy"], store, cluster2)
    assert tr.client.get_run(tr.run_id).data.tags["pgmflow.gp.backend"] == "cupy"
    assert res["test_nlpd"] == pytest.approx(res_np["test_nlpd"], rel=1e-3)
