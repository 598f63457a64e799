"""What a user meets in the MLflow UI, for every pipeline: the experiment opens as model training
(``mlflow.experimentKind``), the run's description is the summary the terminal printed, and no
metric holds two values at one step, also after the run was stopped and resumed."""

from __future__ import annotations

import io

import pytest

from tests.conftest import compose


def _names():
    from pgmflow.core import registry

    return registry.names()


def _no_metric_twice_at_one_step(client, run_id):
    run = client.get_run(run_id)
    assert run.data.metrics
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        twice = sorted({s for s in steps if steps.count(s) > 1})
        assert not twice, f"metric {key!r} has more than one value at step(s) {twice}"


@pytest.mark.slow
@pytest.mark.parametrize("name", _names())
def test_the_mlflow_view_of_a_finished_run(name, tmp_path, cluster2):
    from mlflow.tracking import MlflowClient

    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import DESCRIPTION_TAG, EXPERIMENT_KIND_TAG

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = ["cluster.profile=address", f"cluster.address={cluster2.scheduler_address}", f"tracking.uri={uri}"]
    cfg = compose([f"pipeline={name}", "debug=default", "progress=false", *where])
    out = io.StringIO()
    res = execute(cfg, stream=out)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(res["run_id"])
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags.get(EXPERIMENT_KIND_TAG) == "custom_model_development"
    # the description is the summary the terminal printed, line for line
    description = run.data.tags.get(DESCRIPTION_TAG, "")
    assert description.strip(), "the run has no description"
    printed = out.getvalue().splitlines()
    for line in description.splitlines():
        assert line in printed or f"pgmflow: {line}" in printed, (line, out.getvalue())
    _no_metric_twice_at_one_step(client, res["run_id"])
    # stopped before its end and resumed: still each metric once per step
    client.set_terminated(res["run_id"], "KILLED")
    execute(compose([f"resume={res['run_id']}", "progress=false", *where]), stream=io.StringIO())
    _no_metric_twice_at_one_step(client, res["run_id"])


def test_an_existing_experiment_is_tagged_as_model_training(tmp_path):
    from mlflow.tracking import MlflowClient

    from pgmflow.core.tracking import EXPERIMENT_KIND_TAG, Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment("older", artifact_location=(tmp_path / "a").as_uri())
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(exp_id).tags
    tr = Tracker(uri, "older")
    assert tr._experiment_id() == exp_id
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    # a kind the user chose is left alone
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, "genai_development")
    tr._experiment_id()
    assert client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == "genai_development"
