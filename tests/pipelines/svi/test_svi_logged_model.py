"""The LDA pyfunc is an MLflow 3 logged model of its run: ``MlflowClient.search_logged_models`` finds it by
the run, READY, named ``lda_model``, among the run's outputs; loaded as ``models:/<model id>`` and as
``runs:/<run id>/lda_model`` it gives the topic proportions of the run's own transformer (``pgmflow.load``).
A real SQLite MLflow store, the synchronous scheduler."""

from __future__ import annotations

import numpy as np

from tests.pipelines.helpers import run
from tests.pipelines.sparse_gp.test_sparse_gp_logged_model import _pyfunc, check_logged

LDA = ["pipeline=svi", "debug=default", "progress=false", "svi.figures=false"]


def test_lda_model_is_found_by_mlflows_logged_model_search_and_predicts(tmp_path):
    import pandas as pd

    import pgmflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res, tr = run(LDA, uri)
    found = check_logged(tr, res["run_id"], "lda_model")
    model = _pyfunc(uri, f"models:/{found.model_id}")
    assert model.metadata.model_id == found.model_id and model.metadata.saved_input_example_info is not None
    assert model.metadata.get_output_schema().input_names()[0] == "topic_0"
    lda = pgmflow.load(res["run_id"], tracking_uri=uri).model  # read from the run's artifacts
    texts = [" ".join(lda.vocab[:12]), " ".join(lda.vocab[-7:]), lda.vocab[3]]
    theta = model.predict(pd.DataFrame({"text": texts})).to_numpy()
    assert theta.shape == (3, lda.n_topics) and np.allclose(theta.sum(axis=1), 1.0)
    np.testing.assert_array_equal(theta, lda.transform(texts))
    by_run = _pyfunc(uri, f"runs:/{res['run_id']}/lda_model").predict(pd.DataFrame({"text": texts}))
    np.testing.assert_array_equal(by_run.to_numpy(), theta)
