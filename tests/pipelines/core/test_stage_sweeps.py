"""The stage cache under sweeps, end to end in subprocesses (``pgmflow -m`` on a real LocalCluster, a real SQLite
store): a re-run sweep skips a job only when its stage key (code included) is equal, so a code edit re-runs it
and a comment does not; a 2 x 2 sweep over an upstream and a downstream setting of a study runs the upstream
stage twice, not four times (counted by a scheduler plugin); a study whose driver was SIGKILLed mid-study
resumes to the bits of an undisturbed run with its first stage run once in all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOY_SRC = REPO / "tests" / "fixtures" / "toy_workload"

# A scheduler preload (``distributed.scheduler.preload``): a SchedulerPlugin that records every task key the
# scheduler is given, written out when the scheduler closes.
PRELOAD = """
import json, os
from distributed.diagnostics.plugin import SchedulerPlugin

class Count(SchedulerPlugin):
    def __init__(self):
        self.keys = set()
    def update_graph(self, scheduler, *, keys, **kwargs):
        self.keys.update(str(k) for k in keys)
    async def close(self):
        with open(os.environ["PGMFLOW_TEST_KEYS"], "a") as f:
            f.write(json.dumps(sorted(self.keys)) + "\\n")

def dask_setup(scheduler):
    scheduler.add_plugin(Count(), name="pgmflow-test-count")
"""


def _env(tmp_path, **extra):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), **extra}


def _pgmflow(args, cwd, env, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "pgmflow", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _runs(uri):
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow")
    return tr, [] if exp is None else tr.client.search_runs([exp.experiment_id], max_results=10000)


@pytest.mark.slow
def test_a_sweep_reruns_its_jobs_after_a_code_edit_and_not_after_a_comment(tmp_path):
    pkg = tmp_path / "toyedit"
    shutil.copytree(TOY_SRC, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for f in (pkg / "__init__.py", pkg / "run.py"):
        f.write_text(f.read_text().replace("tests.fixtures.toy_workload", "toyedit"))
    env = _env(tmp_path, PGMFLOW_WORKLOADS="toyedit")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["-m", "pipeline=toy", "debug=default", "toy.n_chunks=2,3", "progress=false", "cluster.n_workers=2"]
    args.append(f"tracking.uri={uri}")

    def children():
        return [r for r in _runs(uri)[1] if "mlflow.parentRunId" in r.data.tags]

    r = _pgmflow(args, tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(children()) == 2
    r = _pgmflow(args, tmp_path, env)
    assert r.returncode == 0 and (r.stdout + r.stderr).count("FINISHED before") == 2, r.stderr[-3000:]
    run_py = pkg / "run.py"
    text = run_py.read_text()
    run_py.write_text(
        text.replace('"""The toy workload', '"""A comment-only edit.\n\nThe toy workload') + "\n# a comment\n"
    )
    r = _pgmflow(args, tmp_path, env)
    assert r.returncode == 0 and (r.stdout + r.stderr).count("FINISHED before") == 2, r.stderr[-3000:]
    assert len(children()) == 2
    run_py.write_text(text.replace("STAGE = 9001", "STAGE = 9002"))  # a code edit: another random stream
    r = _pgmflow(args, tmp_path, env)
    assert r.returncode == 0 and "FINISHED before" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert len(children()) == 4 and all(c.info.status == "FINISHED" for c in children())


STUDY = ["experiment=tesla_bounds_study", "progress=false", "cluster.n_workers=2"]


@pytest.mark.slow
def test_a_2x2_sweep_of_a_study_runs_the_upstream_stage_twice(tmp_path):
    (tmp_path / "count_preload.py").write_text(PRELOAD)
    keys_file = tmp_path / "keys.jsonl"
    env = _env(tmp_path, DASK_DISTRIBUTED__SCHEDULER__PRELOAD='["count_preload"]', PGMFLOW_TEST_KEYS=str(keys_file))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = ["-m", *STUDY, "stages.learn.config.network.T=16,20", "+stages.bounds.config.variational.damping=0.5,0.4"]
    r = _pgmflow([*sweep, f"tracking.uri={uri}"], tmp_path, env, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    keys = set().union(*(json.loads(line) for line in keys_file.read_text().splitlines()))
    tesla_runs = {k.split("-")[2] for k in keys if k.startswith("tesla-select-")}  # tesla-select-<run token>-...
    assert len(tesla_runs) == 2, sorted(tesla_runs)
    tr, runs = _runs(uri)
    learn = [
        x for x in runs if x.data.tags.get("pgmflow.stage") == "learn" and "pgmflow.cache.hit_of" not in x.data.tags
    ]
    assert len(learn) == 2
    jobs = {
        x.data.tags["pgmflow.sweep.overrides"]: x.data.metrics["objective"]
        for x in runs
        if "pgmflow.sweep.job" in x.data.tags
    }
    assert len(jobs) == 4
    # every job's objective is the objective of the same study run alone (a fresh store)
    alone_uri = f"sqlite:///{tmp_path / 'alone.db'}"
    one = ["stages.learn.config.network.T=16", "+stages.bounds.config.variational.damping=0.4"]
    r = _pgmflow([*STUDY, *one, f"tracking.uri={alone_uri}"], tmp_path, _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    alone = [x for x in _runs(alone_uri)[1] if x.data.tags.get("pgmflow.pipeline") == "study"][0]
    job = [o for o in jobs if "network.T=16" in o and "damping=0.4" in o]
    assert len(job) == 1, sorted(jobs)
    assert jobs[job[0]] == alone.data.metrics["objective"]


@pytest.mark.slow
def test_a_study_killed_mid_study_resumes_to_the_same_bits(tmp_path, cluster2):
    where = ["cluster.profile=address", f"cluster.address={cluster2.scheduler_address}"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "run").mkdir()
    args = [*STUDY, *where, f"tracking.uri={uri}", "stages.mrf.config.network_mrf.every=2"]  # 10 bounds units
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgmflow", *args],
        cwd=tmp_path / "run",
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # kill the driver once the study is past its first stage and into the others
        time.sleep(0.2)
        if Path(tmp_path / "mlflow.db").exists():
            runs = _runs(uri)[1]
            if any(x.data.tags.get("pgmflow.stage") == "bounds" for x in runs):
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    r = _pgmflow(args, tmp_path / "run", _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stage learn: cached" in r.stdout
    tr, runs = _runs(uri)
    learn = [
        x for x in runs if x.data.tags.get("pgmflow.stage") == "learn" and "pgmflow.cache.hit_of" not in x.data.tags
    ]
    assert len(learn) == 1
    stale = [
        (x.info.run_name, x.data.tags.get("pgmflow.stage.unit"))
        for x in runs
        if x.info.status == "RUNNING" and "pgmflow.stage" in x.data.tags
    ]
    assert not stale  # every stage run the kill interrupted was resumed (or closed, if it had recorded nothing)
    studies = sorted(
        (x for x in runs if x.data.tags.get("pgmflow.pipeline") == "study"), key=lambda x: x.info.start_time
    )
    resumed = studies[-1]
    # the same study undisturbed, in another store: the same objective and the same output digests
    (tmp_path / "clean").mkdir()
    clean_uri = f"sqlite:///{tmp_path / 'clean.db'}"
    r = _pgmflow([*args[:-2], f"tracking.uri={clean_uri}", args[-1]], tmp_path / "clean", _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    clean = [x for x in _runs(clean_uri)[1] if x.data.tags.get("pgmflow.pipeline") == "study"][0]
    assert resumed.data.metrics["objective"] == clean.data.metrics["objective"]

    def digests(u, parent):
        t, rs = _runs(u)
        out = {}
        for x in rs:
            if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id:
                t.run_id = x.info.run_id
                out[x.info.run_name.replace(" (cached)", "")] = json.loads(t.read_text("stage_outputs.json"))["digests"]
        return out

    assert digests(uri, resumed) == digests(clean_uri, clean)
