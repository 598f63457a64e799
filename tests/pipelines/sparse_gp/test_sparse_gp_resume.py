"""sparse_gp interrupted in-process (KeyboardInterrupt right after a checkpoint, the run left KILLED)
and continued with ``resume=<run id>`` on the synchronous scheduler: L-BFGS-B goes on from its
checkpointed state, makes only the evaluations that were not made, and ends bit-identical to an
undisturbed fit, every metric once per step. Also: ``checkpoint_every`` > 1, a newest checkpoint cut
short (the older slot is used), and the fallback where this scipy's L-BFGS-B cannot be continued
(fresh memory from the checkpointed point, said on the terminal). The SIGKILL of a real driver
process is tests/faults/test_driver_kill_sparse_gp.py."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest

from pgmflow.core import artifacts
from pgmflow.core.runner import execute
from pgmflow.sparse_gp import lbfgsb
from pgmflow.sparse_gp.evaluations import Evaluations
from tests.conftest import compose
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_metric_histories, run

ARGS = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=8",
    "sparse_gp.max_iter=25",
    "sparse_gp.checkpoint_every_seconds=0",  # every checkpoint_every iterations: the kill points are by count
    "sparse_gp.figures=false",
    "progress=false",
]


def _results(tr) -> dict:
    return {k: v for k, v in json.loads(tr.read_text("results.json")).items() if "seconds" not in k}


def _same_model(tr_a, tr_b):
    with np.load(tr_a.download("model.npz")) as a, np.load(tr_b.download("model.npz")) as b:
        assert a.files == b.files
        for k in a.files:
            assert a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture
def evaluations(monkeypatch):
    """How many evaluations made new passes over the chunks (the records answer the others)."""
    made = []
    passes = Evaluations.passes

    def counted(self, params, Z):
        made.append(1)
        return passes(self, params, Z)

    monkeypatch.setattr(Evaluations, "passes", counted)
    return made


def _interrupted(monkeypatch, uri, args, after: int, spoil_newest: bool = False) -> str:
    """Run ``args`` and raise KeyboardInterrupt right after the ``after``-th checkpoint is saved
    (with ``spoil_newest``: that checkpoint is then overwritten with bytes that are no .npz)."""
    saves = []
    save = artifacts.save_checkpoint

    def save_then_stop(tracker, name, arrays):
        save(tracker, name, arrays)
        saves.append(name)
        if len(saves) == after:
            if spoil_newest:
                _spoil(tracker, name)
            raise KeyboardInterrupt

    monkeypatch.setattr(artifacts, "save_checkpoint", save_then_stop)
    out = io.StringIO()
    cfg = compose(args + [f"tracking.uri={uri}", "cluster.profile=synchronous"])
    with pytest.raises(KeyboardInterrupt):
        execute(cfg, stream=out)
    monkeypatch.setattr(artifacts, "save_checkpoint", save)
    text = out.getvalue()
    return text.split("sparse_gp run ")[1].split()[0]


def _spoil(tracker, name):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"{name}.npz"
        p.write_bytes(b"PK\x03\x04 cut short")
        tracker.log_artifact(p, artifacts.CHECKPOINT_DIR)


@pytest.mark.parametrize("every,after,spoil,expect_from", [(1, 7, False, 7), (3, 3, False, 9), (1, 7, True, 6)])
def test_resume_continues_the_optimiser_exactly(monkeypatch, tmp_path, evaluations, every, after, spoil, expect_from):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ARGS + [f"sparse_gp.checkpoint_every={every}"]
    run_id = _interrupted(monkeypatch, uri, args, after, spoil_newest=spoil)
    at_kill = _newest_readable(uri, run_id)
    before = len(evaluations)
    resumed, tr_resumed = run(args + [f"resume={run_id}"], uri)
    made_on_resume = len(evaluations) - before
    del evaluations[:]
    full, tr_full = run(args, uri)
    assert full["iterations"] > expect_from, "the fit ended before the interruption: the test proves nothing"
    tags = tr_resumed.client.get_run(run_id).data.tags
    assert tags["pgmflow.gp.resumed_from_iteration"] == str(expect_from)
    # only the evaluations after the checkpoint were made again, and they were the undisturbed run's
    assert at_kill["nit"] == expect_from
    assert made_on_resume == resumed["evaluations"] - at_kill["evaluations"] > 0, (made_on_resume, at_kill)
    assert len(evaluations) == full["evaluations"] == resumed["evaluations"]
    assert resumed["iterations"] == full["iterations"]
    assert _results(tr_resumed) == _results(tr_full)
    _same_model(tr_resumed, tr_full)
    assert_one_value_per_step(tr_resumed.client, run_id)
    assert_same_metric_histories(tr_resumed.client, run_id, tr_full.run_id)


def _newest_readable(uri, run_id) -> dict:
    """The iteration and evaluation count of the newest readable checkpoint of the run."""
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    tr.run_id = run_id
    best = {"nit": -1}
    for name in tr.list_artifacts(artifacts.CHECKPOINT_DIR):
        try:
            with np.load(tr.download(name)) as z:
                if int(z["nit"]) > best["nit"]:
                    best = {"nit": int(z["nit"]), "evaluations": int(z["ev_count"])}
        except Exception:
            continue
    return best


def test_resume_without_exact_continuation_restarts_from_the_checkpointed_point(monkeypatch, tmp_path):
    """Another scipy (the private routine unusable): the checkpointed point, with a fresh memory, for the
    iterations left; said on the terminal; every metric still once per step."""
    monkeypatch.setattr(lbfgsb, "available", lambda: False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = _interrupted(monkeypatch, uri, ARGS, 5)
    out = io.StringIO()
    cfg = compose(ARGS + [f"resume={run_id}", f"tracking.uri={uri}", "cluster.profile=synchronous"])
    res = execute(cfg, stream=out)
    assert "cannot be continued exactly; restarting it from iteration 5's point with a fresh memory" in out.getvalue()
    assert 5 < res["iterations"] <= 25 and np.isfinite(res["test_rmse"])
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    assert tr.client.get_run(run_id).data.tags["pgmflow.gp.resume_exact"] == "false"
    assert_one_value_per_step(tr.client, run_id)
    steps = [m.step for m in tr.client.get_metric_history(run_id, "bound")]
    assert sorted(steps) == list(range(res["iterations"] + 1))


def test_checkpoints_are_throttled_by_time_and_the_last_is_always_written(monkeypatch, tmp_path):
    """By default (``sparse_gp.checkpoint_every_seconds=5``) a fit of a few hundred rows that ends within
    seconds writes one checkpoint, its last iteration's, and never two within 5 s; with 0 every iteration
    writes one. Either way the last checkpoint holds the fit's last iteration, so a resume after the fit
    makes no evaluation again."""
    saves = []
    save = artifacts.save_checkpoint

    def counted(tracker, name, arrays):
        saves.append((time.monotonic(), int(arrays["nit"])))
        save(tracker, name, arrays)

    monkeypatch.setattr(artifacts, "save_checkpoint", counted)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    default = [a for a in ARGS if not a.startswith("sparse_gp.checkpoint_every_seconds=")]
    res, _ = run(default, uri)
    assert res["iterations"] > 5 and saves and saves[-1][1] == res["iterations"]
    assert len(saves) <= 1 + res["fit_seconds"] / 5.0, (saves, res["fit_seconds"])
    assert all(b[0] - a[0] >= 5.0 for a, b in zip(saves[:-2], saves[1:-1]))  # the last one is not held back
    del saves[:]
    every, _ = run(default + ["sparse_gp.checkpoint_every_seconds=0"], uri)
    assert [nit for _, nit in saves] == list(range(1, every["iterations"] + 1))
    assert every["iterations"] == res["iterations"] and every["bound"] == res["bound"]
