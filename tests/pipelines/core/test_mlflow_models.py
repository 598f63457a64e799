"""MLflow-native models of sparse_gp (``model``) and svi (``lda_model``), end to end on a real MLflow
store and real Hydra composition (the synchronous scheduler: the models do not depend on placement):

- the GP pyfunc, loaded with ``mlflow.pyfunc.load_model``, reproduces the run's logged test RMSE and
  NLPD from the held-out rows in original units, for every method (sgpr, dtc, fitc, svgp, exact),
  and agrees with ``GPPredictor`` (``load_predictor``);
- ``tracking.register_model`` registers a version that loads from ``models:/NAME/VERSION``; a bad
  name is refused in one line with exit code 2;
- the GP model served with ``mlflow models serve --env-manager local`` answers the same predictions
  over HTTP;
- the LDA pyfunc's topic proportions of the held-out documents' observed halves reproduce the run's
  held-out perplexity; raw text gives the same proportions as the equivalent counts.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import yaml

from tests.bad_input.helpers import assert_refused, pgmflow
from tests.conftest import free_port
from tests.pipelines.helpers import run

GP = ["pipeline=sparse_gp", "debug=default", "progress=false", "sparse_gp.figures=false"]
LDA = ["pipeline=svi", "debug=default", "progress=false", "svi.figures=false"]
REGISTERED = "pgmflow_test_gp"


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_template):
    """One store for the module, a copy of the pre-migrated empty store (tests/conftest.py)."""
    import shutil

    d = tmp_path_factory.mktemp("mlflow_models")
    shutil.copyfile(mlflow_template, d / "mlflow.db")
    return f"sqlite:///{d / 'mlflow.db'}"


@pytest.fixture(scope="module")
def gp_run(store):
    return run(GP + [f"tracking.register_model={REGISTERED}"], store)


@pytest.fixture(scope="module")
def lda_run(store):
    return run(LDA, store)


def _pyfunc(store, uri):
    import mlflow
    import mlflow.pyfunc

    mlflow.set_tracking_uri(store)
    return mlflow.pyfunc.load_model(uri)


def _heldout(tr):
    """The run's held-out rows (X [t, d], y [t]) in original units, from its recorded config."""
    from pgmflow.sparse_gp import data as gp_data

    cfg = yaml.safe_load(tr.read_text("config.yaml"))
    data = gp_data.resolve(cfg)
    test = gp_data.heldout_rows(
        gp_data.split_key(int(cfg["seed"])), 0, data.n, float(cfg["sparse_gp"]["test_fraction"])
    )
    return data.X[test], data.y[test], list(data.input_names)


def _scores(mean, var, y):
    r = y - mean
    return math.sqrt(float(r @ r) / y.size), float(np.mean(0.5 * (np.log(2 * np.pi * var) + r * r / var)))


def _check_gp(store, tr, res):
    import pandas as pd

    from pgmflow.sparse_gp.model import load_predictor

    X, y, names = _heldout(tr)
    model = _pyfunc(store, f"runs:/{tr.run_id}/model")
    assert model.metadata.get_input_schema().input_names() == names
    assert model.metadata.get_output_schema().input_names() == ["mean", "variance"]
    out = model.predict(pd.DataFrame(X, columns=names))
    rmse, nlpd = _scores(out["mean"].to_numpy(), out["variance"].to_numpy(), y)
    assert rmse == pytest.approx(res["test_rmse"], rel=1e-9) and nlpd == pytest.approx(res["test_nlpd"], rel=1e-9)
    pred = load_predictor(tr.download(""))  # the plain object (what pgmflow.load returns)
    mean, var = pred.predict(X)  # an array in original units
    np.testing.assert_allclose(mean, out["mean"], rtol=1e-12)
    np.testing.assert_allclose(var, out["variance"], rtol=1e-12)
    return model, X, names, out


def test_gp_pyfunc_reproduces_the_logged_test_scores_and_registers(store, gp_run):
    res, tr = gp_run
    model, X, names, out = _check_gp(store, tr, res)
    example = json.loads(tr.download("model/serving_input_example.json").read_text())
    assert example["dataframe_split"]["columns"] == names  # the input example is stored with the model
    client = tr.client
    (version,) = client.search_model_versions(f"name='{REGISTERED}'")
    assert (
        version.run_id == tr.run_id
        and client.get_run(tr.run_id).data.tags["pgmflow.registered_model"] == f"{REGISTERED}/{version.version}"
    )
    import pandas as pd

    again = _pyfunc(store, f"models:/{REGISTERED}/{version.version}").predict(pd.DataFrame(X, columns=names))
    np.testing.assert_array_equal(again.to_numpy(), out.to_numpy())


@pytest.mark.parametrize("method", ["dtc", "fitc", "svgp", "exact"])
def test_gp_pyfunc_of_every_method(store, method):
    res, tr = run(GP + [f"sparse_gp.method={method}", "gp_data.n=200"], store)
    _check_gp(store, tr, res)


@pytest.mark.slow
def test_gp_model_served_over_http(store, gp_run):
    """``mlflow models serve --env-manager local`` on 127.0.0.1: the same predictions over HTTP."""
    import pandas as pd

    res, tr = gp_run
    X, _, names = _heldout(tr)
    X = X[:7]
    expected = _pyfunc(store, f"runs:/{tr.run_id}/model").predict(pd.DataFrame(X, columns=names))
    port = free_port()
    bindir = os.path.dirname(sys.executable)  # uvicorn, which the server starts, is beside this Python
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    cmd = [
        os.path.join(bindir, "mlflow"),
        "models",
        "serve",
        "-m",
        f"runs:/{tr.run_id}/model",
        "--env-manager",
        "local",
        "--host",
        "127.0.0.1",
        "-p",
        str(port),
        "-w",
        "1",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = json.dumps({"dataframe_split": {"columns": names, "data": X.tolist()}}).encode()
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"mlflow models serve did not start: {proc.communicate()[0][-3000:]}")
            time.sleep(0.3)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            got = pd.DataFrame(json.loads(r.read())["predictions"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    np.testing.assert_allclose(got[["mean", "variance"]].to_numpy(), expected.to_numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    "value,needles",
    [
        ("''", ["tracking.register_model=''", "non-empty string"]),
        ("5", ["tracking.register_model=5", "non-empty string"]),
        ("a/b", ["tracking.register_model='a/b'", "plain name"]),
    ],
)
def test_register_model_bad_value_is_refused(tmp_path, value, needles):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(GP + [f"tracking.register_model={value}", f"tracking.uri={uri}"], tmp_path)
    assert_refused(r, needles, tmp_path, uri, "sparse_gp")


def _heldout_halves(tr):
    """Per shard (in order): the observed and test halves of the held-out documents, as the run made them."""
    from pgmflow.svi import validate
    from pgmflow.tasks.lda import shard_tasks

    cfg = yaml.safe_load(tr.read_text("config.yaml"))
    info = validate.recorded_corpus(cfg)
    f = validate.recorded_heldout_fraction(cfg["svi"], info.n_docs)
    states = [shard_tasks.prepare_shard(info.path, j, int(cfg["seed"]), f) for j in range(len(info.shard_docs))]
    return [(s.heldout_obs, s.heldout_test) for s in states], info


def _csr(c, V):
    import scipy.sparse as sp

    return sp.csr_matrix((c.counts, c.indices, c.indptr), shape=(c.indptr.size - 1, V))


def test_lda_pyfunc_reproduces_the_heldout_perplexity(store, lda_run):
    """theta of each held-out document's observed half (the pyfunc, on counts), then the test half
    scored under sum_k theta_k beta_hat_kw: the run's held-out perplexity."""
    res, tr = lda_run
    model = _pyfunc(store, f"runs:/{tr.run_id}/lda_model")
    with np.load(tr.download("lambda.npz")) as z:
        lam = z["lam"]
    beta_hat = lam / lam.sum(axis=1, keepdims=True)  # [K, V]
    ll, n_tok = [], []
    for obs, test in _heldout_halves(tr)[0]:
        if test.counts.size == 0:
            continue
        theta = model.predict(_csr(obs, lam.shape[1]).toarray()).to_numpy()  # [D, K]
        rows = np.repeat(np.arange(theta.shape[0]), np.diff(test.indptr))
        p = np.einsum("ik,ki->i", theta[rows], beta_hat[:, test.indices])
        ll.append(float(np.sum(test.counts * np.log(p))))
        n_tok.append(float(test.counts.sum()))
    assert math.exp(-math.fsum(ll) / math.fsum(n_tok)) == pytest.approx(res["heldout_perplexity"], rel=1e-9)
    assert theta.shape[1] == 8 and np.allclose(theta.sum(axis=1), 1.0)


def test_lda_raw_text_gives_the_theta_of_its_counts(store, lda_run):
    import pandas as pd
    import scipy.sparse as sp

    from pgmflow.svi.model import load_transformer

    res, tr = lda_run
    model = _pyfunc(store, f"runs:/{tr.run_id}/lda_model")
    lda = load_transformer(tr.download(""))
    V = lda.n_words
    rng = np.random.default_rng(3)
    docs = [rng.choice(V, size=n, replace=True) for n in (5, 12, 1, 30)]
    # the words in upper and mixed case, with punctuation, stop words and words outside the vocabulary
    texts = [
        " , ".join(lda.vocab[w].upper() if k % 2 else lda.vocab[w] for k, w in enumerate(d)) + ". The zzqxj of it!"
        for d in docs
    ]
    counts = sp.csr_matrix(
        (np.ones(sum(map(len, docs))), (np.repeat(np.arange(len(docs)), [len(d) for d in docs]), np.concatenate(docs))),
        shape=(len(docs), V),
    )
    from_text = model.predict(pd.DataFrame({"text": texts})).to_numpy()
    np.testing.assert_array_equal(from_text, model.predict(counts.toarray()).to_numpy())
    np.testing.assert_array_equal(from_text, lda.transform(counts))  # scipy.sparse, the plain object
    np.testing.assert_array_equal(from_text, lda.transform(texts))
    assert not np.allclose(from_text[0], from_text[1])  # different documents, different proportions


def test_saved_requirements_are_the_installed_versions_and_mlflows_check_comes_back(store, lda_run):
    """pgmflow skips MLflow's environment check while it saves a model (issue 38: 0.7 s of a debug run;
    pgmflow.core.internals),
    because the model's requirements are this environment's own versions: read them back from the logged
    model and check each against the installed distribution, and that the check is MLflow's again after."""
    from importlib import metadata

    import mlflow.utils.environment as env
    from mlflow.utils.requirements_utils import warn_dependency_requirement_mismatches

    assert env.warn_dependency_requirement_mismatches is warn_dependency_requirement_mismatches
    import mlflow
    import mlflow.pyfunc

    mlflow.set_tracking_uri(store)
    path = mlflow.pyfunc.get_model_dependencies(f"runs:/{lda_run[1].run_id}/lda_model")
    with open(path) as f:
        reqs = [r.strip() for r in f if "==" in r]
    assert {r.split("==")[0] for r in reqs} >= {"pgmflow", "mlflow", "numpy", "scipy", "pandas"}
    for r in reqs:
        name, version = r.split("==")
        assert metadata.version(name) == version, r
