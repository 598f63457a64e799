"""SVI for LDA interrupted (driver and workers killed with SIGKILL) and resumed with resume=<run id>
finishes with the same lambda, bit for bit, as an uninterrupted run."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.pipelines.helpers import assert_one_value_per_step, assert_same_metric_histories, run
from tests.pipelines.tempering.test_resume import _wait_for

REPO = Path(__file__).resolve().parents[3]


def _failure_text(tmp_path) -> str:
    """What the run printed, and the traceback its MLflow run kept (``error.txt``) when it failed."""
    kept = [p.read_text() for p in sorted(tmp_path.rglob("error.txt"))]
    return "\n".join([(tmp_path / "out.txt").read_text(), *kept])


@pytest.mark.slow
def test_killed_svi_run_resumes_to_identical_lambda(tmp_path):
    from pgmflow.tasks.lda import synthetic

    synthetic.generate_corpus(
        str(tmp_path / "corpus"), n_docs=3000, n_words=300, n_topics=6, seed=1, mean_length=60, docs_per_shard=500
    )
    ov = [
        "pipeline=svi",
        "corpus=sharded",
        f"corpus.path={tmp_path / 'corpus'}",
        "model.K=6",
        "svi.batch_size=60",
        "svi.n_epochs=4",
        "svi.checkpoint_every=5",
        "svi.eval_every=25",
        "svi.figures=false",
        "progress=false",
    ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pgmflow", *ov, f"tracking.uri={uri}", "cluster.n_workers=2"]
    log = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def checkpoint(n):
        d = tmp_path / "mlartifacts"
        return d.exists() and any(p.name == f"step_{n:07d}.npz" for p in d.rglob("step_*.npz"))

    try:
        assert _wait_for(lambda: checkpoint(20), 240, proc), _failure_text(tmp_path)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "out.txt").read_text()
    run_id = out.split("svi run ")[1].split()[0]
    assert "finished" not in out and not checkpoint(190), "the run ended before it was killed"

    resumed, tr_resumed = run(ov + [f"resume={run_id}"], uri)  # synchronous scheduler this time
    assert resumed["run_id"] == run_id
    full, tr_full = run(ov, uri)
    with np.load(tr_full.download("lambda.npz")) as a, np.load(tr_resumed.download("lambda.npz")) as b:
        np.testing.assert_array_equal(a["lam"], b["lam"])
        assert int(a["count"]) == int(b["count"]) > 150  # 4 epochs of ~48 steps
    assert resumed["heldout_perplexity"] == full["heldout_perplexity"]
    assert tr_resumed.client.get_run(run_id).info.status == "FINISHED"
    assert_one_value_per_step(tr_resumed.client, run_id)
    assert_same_metric_histories(tr_resumed.client, run_id, tr_full.run_id)
