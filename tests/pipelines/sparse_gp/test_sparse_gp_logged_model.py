"""The GP pyfunc is an MLflow 3 logged model of its run: ``MlflowClient.search_logged_models`` finds it by the
run (and only the run's own: a second run in the same experiment has its own), READY, named ``model``, among
the run's outputs, with the signature and the input example; loaded as ``models:/<model id>`` and as
``runs:/<run id>/model`` it predicts the held-out rows with the run's own test RMSE, and a registered version
points at it. A real SQLite MLflow store, the synchronous scheduler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.pipelines.helpers import run

GP = ["pipeline=sparse_gp", "debug=default", "progress=false", "sparse_gp.figures=false"]


def logged_models(tr, run_id) -> list:
    """The logged models whose source is the run ``run_id`` (MLflow's own search, every page)."""
    client = tr.client
    exp = client.get_run(run_id).info.experiment_id
    out, token = [], None
    while True:
        page = client.search_logged_models(
            experiment_ids=[exp], filter_string=f"source_run_id = '{run_id}'", page_token=token
        )
        out += list(page)
        token = page.token
        if not token:
            return out


def check_logged(tr, run_id, name):
    """The one logged model of the run: READY, named ``name``, among the run's outputs; its MLmodel records
    the run, its own id, a signature and an input example. Returns it."""
    from mlflow.entities import LoggedModelStatus

    (found,) = logged_models(tr, run_id)
    assert found.name == name and found.source_run_id == run_id and found.status == LoggedModelStatus.READY
    outputs = tr.client.get_run(run_id).outputs.model_outputs
    assert [o.model_id for o in outputs] == [found.model_id]
    return found


def _pyfunc(uri, model_uri):
    import mlflow
    import mlflow.pyfunc

    mlflow.set_tracking_uri(uri)
    return mlflow.pyfunc.load_model(model_uri)


def test_gp_model_is_found_by_mlflows_logged_model_search_and_predicts(tmp_path):
    import pandas as pd

    from pgmflow.sparse_gp import data as gp_data

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res, tr = run(GP + ["tracking.register_model=pgmflow_logged_gp"], uri)
    other, _ = run(GP + ["seed=1"], uri)
    found = check_logged(tr, res["run_id"], "model")
    assert check_logged(tr, other["run_id"], "model").model_id != found.model_id
    model = _pyfunc(uri, f"models:/{found.model_id}")
    meta = model.metadata
    assert meta.model_id == found.model_id and meta.run_id == res["run_id"]
    assert meta.get_output_schema().input_names() == ["mean", "variance"]
    assert meta.saved_input_example_info is not None and meta.get_input_schema().input_names()[0] == "x0"
    # the held-out rows, predicted in original units: the run's test RMSE
    cfg = pgmflow_config(tr)
    data = gp_data.resolve(cfg)
    test = gp_data.heldout_rows(
        gp_data.split_key(int(cfg["seed"])), 0, data.n, float(cfg["sparse_gp"]["test_fraction"])
    )
    frame = pd.DataFrame(data.X[test], columns=list(data.input_names))
    mean = model.predict(frame)["mean"].to_numpy()
    r = data.y[test] - mean
    assert math.sqrt(float(r @ r) / r.size) == pytest.approx(res["test_rmse"], rel=1e-9)
    by_run = _pyfunc(uri, f"runs:/{res['run_id']}/model").predict(frame)
    np.testing.assert_array_equal(by_run["mean"].to_numpy(), mean)
    (version,) = tr.client.search_model_versions("name='pgmflow_logged_gp'")
    assert version.run_id == res["run_id"]
    again = _pyfunc(uri, f"models:/pgmflow_logged_gp/{version.version}").predict(frame)
    np.testing.assert_array_equal(again["mean"].to_numpy(), mean)


def pgmflow_config(tr) -> dict:
    import yaml

    return yaml.safe_load(tr.read_text("config.yaml"))
