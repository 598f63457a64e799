"""SVGP with non-Gaussian likelihoods end to end (issue 37): real Hydra composition, a real LocalCluster,
a real MLflow store.

- ``experiment=gp_breast_cancer`` at debug size: a Bernoulli SVGP on the shipped data logs accuracy, log
  loss and Brier score, the reliability figure and a model that ``pgmflow.load`` and the MLflow pyfunc
  predict class probabilities with, reproducing the run's held-out scores;
- a Bernoulli SVGP gives the same model and metrics, bit for bit, on 1 and 3 workers;
- Poisson (counts) and Student-t (outliers) SVGP runs score what fits them.
"""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.gp.data import heldout_rows, split_key
from tests.pipelines.helpers import run

BREAST = ["experiment=gp_breast_cancer", "debug=default", "progress=false"]


def _model(tr) -> dict:
    with np.load(tr.download("model.npz")) as z:
        return {k: z[k] for k in z.files}


def _history(tr, name):
    return [(m.step, m.value) for m in sorted(tr.client.get_metric_history(tr.run_id, name), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('sparse_gp_lik') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def breast(cluster2, store):
    return run(BREAST, store, cluster2)


def _heldout(seed=0, fraction=0.2):
    from pgmflow.sparse_gp.data import BREAST_CANCER

    A = np.loadtxt(BREAST_CANCER, delimiter=",", skiprows=1)
    test = heldout_rows(split_key(seed), 0, A.shape[0], fraction)
    return A[test, :-1], A[test, -1]


def test_gp_breast_cancer_logs_classification_scores_figure_and_model(breast):
    res, tr = breast
    run_ = tr.client.get_run(tr.run_id)
    assert run_.info.status == "FINISHED"
    assert res["likelihood"] == "bernoulli" and res["link"] == "probit" and res["method"] == "svgp"
    assert res["train_rows"] + res["test_rows"] == 569
    # a real classifier after 20 debug steps (the majority class is 63 % of the rows)
    assert res["test_accuracy"] > 0.85, res
    assert res["test_log_loss"] < 0.45 and res["test_log_loss"] == res["test_nlpd"] == res["objective"]
    assert 0 < res["test_brier"] < 0.15
    assert "noise_variance" not in res  # Bernoulli has no noise
    for k in ("test_accuracy", "test_log_loss", "test_brier"):
        assert tr.client.get_metric_history(tr.run_id, f"final_{k}")[0].value == pytest.approx(res[k], rel=1e-12)
    assert {"figures/reliability.png", "figures/slice.png"} <= set(tr.list_artifacts("figures"))
    bound = _history(tr, "bound")
    assert bound[-1][1] > bound[0][1]
    m = _model(tr)
    assert str(m["likelihood"]) == "bernoulli" and str(m["link"]) == "probit"
    assert float(m["y_mean"]) == 0.0 and float(m["y_std"]) == 1.0  # labels are not standardised


def test_gp_breast_cancer_model_predicts_probabilities_with_the_runs_scores(breast, tmp_path):
    import mlflow
    import pandas as pd

    from pgmflow.sparse_gp.model import load_predictor

    res, tr = breast
    X, y = _heldout()
    assert X.shape[0] == res["test_rows"]
    gp = load_predictor(tr.client.download_artifacts(tr.run_id, "", str(tmp_path)))
    P = gp.predict_proba(X)
    p = P[:, 1]
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    assert np.mean((p > 0.5) == (y == 1)) == pytest.approx(res["test_accuracy"], rel=1e-12)
    assert -np.mean(np.log(np.where(y == 1, p, 1 - p))) == pytest.approx(res["test_log_loss"], rel=1e-9)
    assert np.mean((p - y) ** 2) == pytest.approx(res["test_brier"], rel=1e-9)
    mlflow.set_tracking_uri(tr.client.tracking_uri)
    py = mlflow.pyfunc.load_model(f"runs:/{tr.run_id}/model")
    names = py.metadata.get_input_schema().input_names()
    out = py.predict(pd.DataFrame(X, columns=names))
    np.testing.assert_allclose(out["mean"].to_numpy(), p, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(out["variance"].to_numpy(), p * (1 - p), rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_bernoulli_svgp_is_bit_identical_on_1_and_3_workers(store, cluster_factory):
    ov = BREAST + ["sparse_gp.figures=false", "sparse_gp.in_process=false", "sparse_gp.chunk_size=100"]
    outs = []
    for n in (1, 3):
        res, tr = run(ov, store, cluster_factory(n))
        outs.append(
            (_model(tr), _history(tr, "bound"), {k: v for k, v in res.items() if "seconds" not in k and k != "run_id"})
        )
    model, hist, res = outs[1]
    assert model.keys() == outs[0][0].keys()
    for k in model:
        np.testing.assert_array_equal(model[k], outs[0][0][k], err_msg=k)
    assert hist == outs[0][1]
    assert res == outs[0][2]
    assert res["test_accuracy"] > 0.85


def _counts(tmp_path, n=600, seed=3):
    g = np.random.default_rng(seed)
    X = g.random((n, 2))
    rate = np.exp(1.0 + np.sin(6 * X[:, 0]) - X[:, 1])
    np.savez(tmp_path / "counts.npz", X=X, y=g.poisson(rate).astype(float))
    return rate


def test_poisson_svgp_on_counts(tmp_path, store, cluster2):
    _counts(tmp_path)
    ov = [
        "pipeline=sparse_gp",
        "progress=false",
        "gp_data=npz",
        f"gp_data.path={tmp_path / 'counts.npz'}",
        "sparse_gp.method=svgp",
        "sparse_gp.likelihood=poisson",
        "sparse_gp.m=12",
        "sparse_gp.svgp_steps=300",
        "sparse_gp.svgp_batch_size=100",
        "sparse_gp.svgp_lr=0.03",
        "sparse_gp.svgp_rho=0.2",
        "sparse_gp.svgp_eval_every=100",
        "sparse_gp.chunk_size=300",
    ]
    res, tr = run(ov, store, cluster2)
    assert res["likelihood"] == "poisson"
    # the true rate's mean deviance on such data is ~1.1; a constant rate's ~3
    assert res["test_deviance"] < 1.5, res
    assert res["test_nlpd"] < 2.3, res
    assert "figures/slice.png" in set(tr.list_artifacts("figures"))


def test_student_t_svgp_shrugs_off_outliers(tmp_path, store, cluster2):
    g = np.random.default_rng(7)
    n = 500
    X = g.random((n, 1))
    y = np.sin(6 * X[:, 0]) + 0.1 * g.standard_normal(n)
    out = g.random(n) < 0.05
    y[out] += g.choice([-1, 1], out.sum()) * (5 + 5 * g.random(out.sum()))
    np.savez(tmp_path / "outliers.npz", X=X, y=y)
    common = [
        "pipeline=sparse_gp",
        "progress=false",
        "sparse_gp.figures=false",
        "gp_data=npz",
        f"gp_data.path={tmp_path / 'outliers.npz'}",
        "sparse_gp.method=svgp",
        "sparse_gp.m=12",
        "sparse_gp.svgp_steps=400",
        "sparse_gp.svgp_batch_size=100",
        "sparse_gp.svgp_lr=0.03",
        "sparse_gp.svgp_rho=0.2",
        "sparse_gp.svgp_eval_every=200",
        "sparse_gp.chunk_size=250",
    ]
    t, tr = run(common + ["sparse_gp.likelihood=student_t", "sparse_gp.student_t_dof=3"], store, cluster2)
    gauss, _ = run(common, store, cluster2)
    assert t["likelihood"] == "student_t" and t["student_t_dof"] == 3.0
    assert t["test_nlpd"] < gauss["test_nlpd"] - 0.3, (t["test_nlpd"], gauss["test_nlpd"])
    assert 0.8 < t["test_coverage_90"] <= 1.0
    assert t["student_t_scale"] < 0.3  # the inliers' noise (0.1), not the outliers'
    m = _model(tr)
    assert str(m["likelihood"]) == "student_t" and float(m["student_t_dof"]) == 3.0
