"""The Python API (pgmflow.run / load / compose): the CLI's composition and errors, a run on a client the
user owns, a run read back, and the progress bar in a real Jupyter kernel."""

from __future__ import annotations

import json

import pytest

import pgmflow
from tests.conftest import compose as cli_compose

SGP = ["pipeline=sparse_gp", "debug=default"]


def test_compose_is_the_cli_composition():
    assert pgmflow.compose(*SGP, "seed=3") == cli_compose([*SGP, "seed=3"])


def _cli_error(args, cwd) -> str:
    """The error line of the ``pgmflow`` command (tests/bad_input's harness: the CLI's main in this process, or a
    subprocess with PGMFLOW_BAD_INPUT_SUBPROCESS=1)."""
    from tests.bad_input.helpers import pgmflow as pgmflow_command

    r = pgmflow_command(args, cwd)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("pgmflow: error: ")]
    assert len(lines) == 1, r.stderr
    return lines[0][len("pgmflow: error: ") :]


@pytest.mark.parametrize(
    "bad, field",
    [
        (["model.LL=3"], "model.LL"),  # unknown key (Hydra composition)
        (["pipeline=svii"], "pipeline"),  # unknown option of a group
        (["model.L=abc"], "model.L"),  # wrong type (preflight)
        (["pipeline=sparse_gp", "sparse_gp.m=-3"], "sparse_gp.m"),  # out of range (the workload's rule table)
    ],
)
def test_bad_input_raises_the_line_the_cli_prints(bad, field, tmp_path, mlflow_uri):
    with pytest.raises(pgmflow.ConfigError) as info:
        pgmflow.run(*bad, tracking_uri=mlflow_uri, cluster="synchronous")
    err = info.value
    assert err.field == field and err.fix
    assert str(err) == err.message == _cli_error([*bad, f"tracking.uri={mlflow_uri}"], tmp_path)
    from mlflow.tracking import MlflowClient

    assert MlflowClient(mlflow_uri).search_runs(experiment_ids=["0", "1"]) == []  # refused before any run


def test_overrides_must_be_strings():
    with pytest.raises(TypeError, match="overrides are strings"):
        pgmflow.run({"model.L": 8})


def test_run_on_the_users_client_and_load(cluster2, mlflow_uri, tmp_path, monkeypatch):
    from distributed import Client

    monkeypatch.chdir(tmp_path)
    with Client(cluster2.scheduler_address) as client:
        res = pgmflow.run(*SGP, "sparse_gp.in_process=false", cluster=client, tracking_uri=mlflow_uri, progress=False)
        assert client.status == "running"  # ours: left open
        tasks_run = client.run_on_scheduler(
            lambda dask_scheduler: sorted({str(k) for k in dask_scheduler.task_prefixes})
        )
    assert any("gp" in t for t in tasks_run), tasks_run  # the chunk statistics ran on the user's cluster
    assert res.pipeline == "sparse_gp" and len(res.run_id) == 32
    assert res.objective == pytest.approx(res.metrics["objective"])
    assert res.config == pgmflow.compose(
        *SGP, "sparse_gp.in_process=false", f"tracking.uri={mlflow_uri}", "progress=false"
    )
    results = json.loads(res.artifact("results.json").read_text())
    assert results["test_rmse"] == pytest.approx(res.result["test_rmse"])

    loaded = pgmflow.load(res.run_id, tracking_uri=mlflow_uri)
    assert loaded.status == "FINISHED" and loaded.pipeline == "sparse_gp"
    assert loaded.config == res.config
    assert loaded.results == results
    assert loaded.metrics == res.metrics
    assert "model" in loaded.arrays
    hist = loaded.metric_history("objective")
    assert hist == [(0, res.metrics["objective"])]


def test_load_unknown_run_is_one_line(mlflow_uri):
    with pytest.raises(pgmflow.ConfigError, match="no such MLflow run") as info:
        pgmflow.load("0" * 32, tracking_uri=mlflow_uri)
    assert info.value.field == "run_id" and "\n" not in str(info.value)


KERNEL_CODE = """
import os
os.chdir({cwd!r})
import pgmflow
r = pgmflow.run("pipeline=sparse_gp", "debug=default", cluster="synchronous", tracking_uri={uri!r}, progress=True)
print("RUN", r.run_id)
"""


@pytest.mark.slow
def test_progress_bar_renders_in_a_jupyter_kernel(tmp_path, mlflow_uri):
    """A real IPython kernel runs pgmflow.run: the bar is one HTML display updated in place (display id),
    with no terminal control characters on its streams."""
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        msgs = []
        reply = kc.execute_interactive(
            KERNEL_CODE.format(cwd=str(tmp_path), uri=mlflow_uri), timeout=240, output_hook=msgs.append
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok", reply["content"]
    shown = [m for m in msgs if m["msg_type"] == "display_data"]
    updates = [m for m in msgs if m["msg_type"] == "update_display_data"]
    bars = [m for m in shown if "<progress" in m["content"]["data"].get("text/html", "")]
    assert len(bars) == 1, [m["content"]["data"].get("text/plain") for m in shown]
    display_id = bars[0]["content"]["transient"]["display_id"]
    assert updates and all(m["content"]["transient"]["display_id"] == display_id for m in updates)
    last = updates[-1]["content"]["data"]
    assert "value='" in last["text/html"] and "iterations" in last["text/plain"]
    value = int(last["text/html"].split("value='")[1].split("'")[0])
    maximum = int(last["text/html"].split("max='")[1].split("'")[0])
    assert 0 < value <= maximum
    streams = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")
    assert "\r" not in streams and "\033[" not in streams
    assert "RUN " in streams and "pgmflow: finished." in streams


def _tracker(res):
    from pgmflow.core.tracking import Tracker

    tr = Tracker(res.tracking_uri, res.config["tracking"]["experiment"])
    tr.run_id = res.run_id
    return tr


def test_run_then_load_give_the_logged_predictions_and_topic_proportions(cluster2, mlflow_uri, tmp_path, monkeypatch):
    """pgmflow.run of sparse_gp and svi (debug sizes) on a LocalCluster, pgmflow.load of both: the loaded GP's
    predictions of the held-out rows give the test RMSE and NLPD the pipeline logged, and the loaded LDA model's
    topic proportions of the held-out documents' observed halves give the logged held-out perplexity."""
    import math

    import numpy as np

    from tests.pipelines.core.test_mlflow_models import _csr, _heldout, _heldout_halves, _scores

    monkeypatch.chdir(tmp_path)
    gp = pgmflow.run(
        "pipeline=sparse_gp",
        "debug=default",
        cluster=cluster2.scheduler_address,
        tracking_uri=mlflow_uri,
        progress=False,
    )
    fitted = pgmflow.load(gp.run_id, tracking_uri=mlflow_uri)
    X, y, _ = _heldout(_tracker(gp))
    mean, var = fitted.model.predict(X)
    rmse, nlpd = _scores(mean, var, y)
    assert rmse == pytest.approx(gp.result["test_rmse"], rel=1e-9)
    assert nlpd == pytest.approx(gp.result["test_nlpd"], rel=1e-9)
    assert fitted.results["test_rmse"] == gp.result["test_rmse"]

    lda_run = pgmflow.run(
        "pipeline=svi", "debug=default", cluster=cluster2.scheduler_address, tracking_uri=mlflow_uri, progress=False
    )
    lda = pgmflow.load(lda_run.run_id, tracking_uri=mlflow_uri)
    lam = lda.arrays["lambda"]["lam"]
    beta_hat = lam / lam.sum(axis=1, keepdims=True)  # [K, V]
    ll, n_tok = [], []
    for obs, test in _heldout_halves(_tracker(lda_run))[0]:
        if test.counts.size == 0:
            continue
        theta = lda.model.transform(_csr(obs, lam.shape[1]))  # [D, K]
        rows = np.repeat(np.arange(theta.shape[0]), np.diff(test.indptr))
        p = np.einsum("ik,ki->i", theta[rows], beta_hat[:, test.indices])
        ll.append(float(np.sum(test.counts * np.log(p))))
        n_tok.append(float(test.counts.sum()))
    assert math.exp(-math.fsum(ll) / math.fsum(n_tok)) == pytest.approx(lda_run.result["heldout_perplexity"], rel=1e-9)
