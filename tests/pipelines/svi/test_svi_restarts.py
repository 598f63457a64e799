"""``svi.restarts``: more fits from seeded initial topics over the same minibatches; the lowest held-out
perplexity is kept, every restart's perplexity is logged, and the result is the same bits on any
number of workers."""

from __future__ import annotations

import pytest

from tests.pipelines.helpers import run

BASE = ["pipeline=svi", "debug=default", "svi.figures=false", "progress=false"]


@pytest.mark.slow
def test_restarts_keep_the_lowest_heldout_perplexity(mlflow_uri, cluster2):
    single, _ = run(BASE, mlflow_uri)
    multi, tr = run(BASE + ["svi.restarts=2"], mlflow_uri)
    hist = sorted(tr.client.get_metric_history(multi["run_id"], "restart_heldout_perplexity"), key=lambda m: m.step)
    assert [m.step for m in hist] == [0, 1, 2]
    values = [m.value for m in hist]
    assert values[0] == single["heldout_perplexity"]  # restart 0 is the plain fit
    assert len(set(values)) == 3  # other initial topics, other fits
    assert multi["heldout_perplexity"] == min(values)
    best = int(tr.client.get_run(multi["run_id"]).data.tags["pgmflow.svi.best_restart"])
    assert values[best] == min(values)
    on_workers, _ = run(BASE + ["svi.restarts=2"], mlflow_uri, cluster2)
    assert on_workers["heldout_perplexity"] == multi["heldout_perplexity"]
