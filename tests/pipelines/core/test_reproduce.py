"""``pgmflow reproduce <run id>``: re-runs a logged run, compares every metric exactly, and when one
differs says whether the environment it records (library versions, BLAS, CPU model, commit) differs."""

from __future__ import annotations

import io

from pgmflow.core.reproduce import TIMING, reproduce
from tests.pipelines.helpers import SMALL_ISING, run


def _result_metric(client, run_id) -> tuple[str, float]:
    metrics = client.get_run(run_id).data.metrics
    name = next(k for k in sorted(metrics) if k != "objective" and not TIMING.search(k))
    return name, metrics[name]


def test_reproduce_matches_then_names_what_differs(mlflow_uri):
    res, tr = run(SMALL_ISING + ["tempering.figures=false"], mlflow_uri)
    run_id = res["run_id"]
    tags = tr.client.get_run(run_id).data.tags
    for key in ("version.numpy", "version.scipy", "version.numba", "env.blas", "env.cpu", "git.commit"):
        assert tags.get(key), f"the run does not record {key}"
    assert "openblas" in tags["env.blas"].lower() or tags["env.blas"] != "none found"

    out = io.StringIO()
    code, report = reproduce(run_id, {"tracking.uri": mlflow_uri}, stream=out)
    assert code == 0, out.getvalue()
    assert report["differences"] == [] and report["environment"] == [] and len(report["matching"]) > 5
    assert "match exactly" in out.getvalue()

    # a metric that differs in the same environment: a bug, said so
    name, value = _result_metric(tr.client, run_id)
    tr.client.log_metric(run_id, name, value + 1.0, step=10**6)
    out = io.StringIO()
    code, report = reproduce(run_id, {"tracking.uri": mlflow_uri}, stream=out)
    assert code == 1
    assert len(report["differences"]) == 1 and report["differences"][0].startswith(f"{name}:")
    assert report["environment"] == [] and "a difference here is a bug" in out.getvalue()

    # the same difference with another numpy recorded: the environment is named as the reason
    tr.client.set_tag(run_id, "version.numpy", "0.0.0-elsewhere")
    out = io.StringIO()
    code, report = reproduce(run_id, {"tracking.uri": mlflow_uri}, stream=out)
    assert code == 1
    assert any(e.startswith("version.numpy: '0.0.0-elsewhere' -> ") for e in report["environment"]), report
    text = out.getvalue()
    assert "the environment differs" in text and "version.numpy" in text and "bug" not in text
