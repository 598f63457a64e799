"""Two attempts of the same work writing one MLflow run at once (a batch job SLURM requeued while the first
still runs on a node slurmctld lost, a sweep job Dask gave to a second worker): the newest claim wins and
the older attempt writes nothing more (``Tracker.claim``/``fence``, docs/reliability.md). The same with
real processes on a 2-node SLURM: tests/network/test_slurm_partition.py."""

from __future__ import annotations

import pytest

from pgmflow.core import tracking


@pytest.fixture
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _history(tracker, key):
    return [(m.step, m.value) for m in tracker.client.get_metric_history(tracker.run_id, key)]


def test_the_newest_claim_wins_and_the_older_attempt_writes_nothing_more(uri, monkeypatch):
    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt A")
    first = tracking.Tracker(uri, "attempts")
    run_id = first.start("run", {"x": 1}, {})
    first.log_metrics({"loss": 1.0}, step=0, flush=True)
    first.log_metrics({"loss": 0.5}, step=1)  # buffered when the second attempt arrives

    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt B")
    second = tracking.Tracker(uri, "attempts")
    second.resume(run_id)  # the second attempt claims the run; it knows step 0 only
    assert ("loss", 0) in second._seen and ("loss", 1) not in second._seen

    with pytest.raises(tracking.Superseded, match="taken over by another attempt"):
        first.flush()  # the older attempt's buffered step 1 is dropped, not written
    with pytest.raises(tracking.Superseded):
        first.log_text("late", "late.txt")
    with pytest.raises(tracking.Superseded):
        first.end("FAILED", "it must not end the newer attempt's run")

    second.log_metrics({"loss": 0.5}, step=1, flush=True)
    assert _history(second, "loss") == [(0, 1.0), (1, 0.5)]  # one value per step
    run = second.client.get_run(run_id)
    assert run.info.status == "RUNNING" and "pgmflow.error" not in run.data.tags
    assert "late.txt" not in second.list_artifacts()
    assert run.data.tags[tracking.LAUNCH_TAG] == "attempt B"
    second.end("FINISHED")
    assert second.client.get_run(run_id).info.status == "FINISHED"


def test_a_job_of_a_replaced_sweep_launcher_does_not_take_its_child_run_back(uri, monkeypatch):
    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt B")
    parent = tracking.Tracker(uri, "attempts")
    parent_id = parent.start("sweep", {}, {})  # the newer attempt's launcher claims the sweep's parent run
    child = parent.client.create_run(parent._experiment_id(), run_name="job 0").info.run_id

    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt A")  # a job the older launcher had not yet started
    job = tracking.Tracker(uri, "attempts")
    with pytest.raises(tracking.Superseded, match="does not start its job"):
        job.attach(child, {"x": 1}, {}, parent_id=parent_id)
    assert tracking.OWNER_TAG not in job.client.get_run(child).data.tags

    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt B")  # the same job of the owning launcher
    job = tracking.Tracker(uri, "attempts")
    job.attach(child, {"x": 1}, {}, parent_id=parent_id)
    assert job.client.get_run(child).data.tags[tracking.LAUNCH_TAG] == "attempt B"


def test_an_unclaimed_tracker_and_a_store_away_are_not_fenced(uri, monkeypatch):
    """A tracker that never claimed (the launcher's bookkeeping) writes as before; a non-blocking flush
    whose fence read finds the store away keeps its metrics buffered (the outage path)."""
    monkeypatch.setenv(tracking.ATTEMPT_ENV, "attempt A")
    t = tracking.Tracker(uri, "attempts")
    run_id = t.start("run", {}, {})
    other = tracking.Tracker(uri, "attempts")
    other.run_id = run_id
    other.set_tags({"note": "bookkeeping"})  # no claim: no fence

    def away(*args, **kwargs):
        raise tracking.TrackingUnavailable("away")

    t.log_metrics({"loss": 1.0}, step=0)
    monkeypatch.setattr(t.client, "call", away)
    t.flush(block=False)
    assert len(t._pending) == 1
