"""The workload registry: a sixth workload plugs in from outside pgmflow, and every registered
workload keeps the same contract (its debug run finishes, its results.json is valid JSON, and a
resumed run ends with the results of an uninterrupted one)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, compose

TOY = "tests.fixtures.toy_workload"
CORE_FILES = sorted((REPO / "pipelines" / "core").glob("*.py")) + [REPO / "conf" / "config.yaml"]


@pytest.fixture
def toy_env(monkeypatch):
    monkeypatch.setenv("PGMFLOW_WORKLOADS", TOY)
    yield


def _cli(args, cwd, env_extra=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "pgmflow", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_core_names_no_workload():
    """No core file and not conf/config.yaml knows a workload by name (the toy included)."""
    names = ["tempering", "svi", "tesla", "sparse_gp", "toy", "corpora", "gp_data", "networks"]
    for f in CORE_FILES:
        text = f.read_text()
        for line_no, line in enumerate(text.splitlines(), 1):
            code = line.split("#")[0]
            for n in names:
                assert f"pipelines.{n}" not in code and f"import {n}" not in code, f"{f}:{line_no}: {line}"
    assert "toy" not in "".join(f.read_text() for f in CORE_FILES)


def test_builtin_workloads_are_found():
    from pgmflow.core import registry

    assert {"tempering", "svi", "tesla", "bounds", "sparse_gp"} <= set(registry.names())
    for w in registry.workloads():
        assert callable(w.load_run()) and callable(w.load_validate())


def test_a_workload_module_without_workload_is_refused(monkeypatch):
    from pgmflow.core import registry

    monkeypatch.setenv("PGMFLOW_WORKLOADS", "tests.fixtures")
    with pytest.raises(registry.WorkloadError, match="defines no WORKLOAD"):
        registry.workloads()
    monkeypatch.setenv("PGMFLOW_WORKLOADS", "tests.fixtures.no_such_module")
    with pytest.raises(registry.WorkloadError, match="cannot be imported"):
        registry.workloads()


@pytest.mark.slow
def test_toy_workload_runs_end_to_end_from_the_command_line(tmp_path):
    """pgmflow pipeline=toy: composed from the toy's own conf/ (its data group and debug shrinking), validated
    by the toy's rules, run on a real LocalCluster, logged to MLflow -- no pgmflow file edited."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"PGMFLOW_WORKLOADS": TOY}
    r = _cli(
        [
            "pipeline=toy",
            "toy_data=normal",
            "debug=default",
            "progress=false",
            "cluster.n_workers=2",
            f"tracking.uri={uri}",
        ],
        tmp_path,
        env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the debug shrinking and the config group (toy_data/) of the toy's own conf/
    assert "toy: 4 chunks of 20000 samples (normal proposal)" in r.stdout
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    run = tr.client.search_runs([tr.client.get_experiment_by_name("pgmflow").experiment_id])[0]
    tr.run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.tags["pgmflow.pipeline"] == "toy"
    res = json.loads(tr.read_text("results.json"))
    assert abs(res["error_sigmas"]) < 5 and abs(res["estimate"] - math.sqrt(math.pi) * math.erf(2.0)) < 0.05
    assert run.data.metrics["objective"] == res["objective"]
    # its bad input is refused like any other: one line, exit code 2, before anything runs
    bad = _cli(["pipeline=toy", "toy.n_chunks=0", f"tracking.uri={uri}"], tmp_path, env)
    assert bad.returncode == 2 and "toy.n_chunks=0" in bad.stderr and "must be >= 1" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # and without the environment variable there is no such pipeline
    gone = _cli(["pipeline=toy", f"tracking.uri={uri}"], tmp_path)
    assert gone.returncode == 2 and "pipeline='toy'" in gone.stderr


def test_an_unexpected_error_says_where_it_was_raised_and_the_run_keeps_its_traceback(tmp_path):
    """An error that is not bad input (a task's IndexError): one line that names the file, line and function
    it came from, exit 1; the failed MLflow run's error.txt holds the message and the whole traceback."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"PGMFLOW_WORKLOADS": TOY, "PGMFLOW_TOY_FAIL_CHUNK": "3"}
    args = ["pipeline=toy", "debug=default", "progress=false", "cluster.profile=synchronous", f"tracking.uri={uri}"]
    r = _cli(args, tmp_path, env)
    assert r.returncode == 1, r.stderr[-3000:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("pgmflow: error: IndexError: chunk 3 fails on purpose at ")
    assert "toy_workload/run.py:" in line and " in chunk_sums (run with verbose=true for the traceback)" in line
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    run = tr.client.search_runs([tr.client.get_experiment_by_name("pgmflow").experiment_id])[0]
    tr.run_id = run.info.run_id
    assert run.info.status == "FAILED" and run.data.tags["pgmflow.error"] == "IndexError: chunk 3 fails on purpose"
    kept = tr.read_text("error.txt")
    assert kept.startswith("IndexError: chunk 3 fails on purpose\n\nTraceback (most recent call last):")
    assert 'in chunk_sums\n    raise IndexError(f"chunk {chunk} fails on purpose")' in kept


def _contract_cases():
    from pgmflow.core import registry

    return [*registry.names(), "toy"]


# Timings differ between runs and are never compared (as pgmflow reproduce does).
def _estimates(result: dict) -> dict:
    from pgmflow.core.reproduce import TIMING

    return {k: v for k, v in result.items() if not TIMING.search(k) and k not in ("driver_peak_rss_mb",)}


@pytest.mark.slow
@pytest.mark.parametrize("name", _contract_cases())
def test_workload_contract(name, tmp_path, cluster2, monkeypatch):
    """Every workload the registry finds: its debug run finishes with a valid results.json, and a run
    stopped before its end and resumed (``resume=<run id>``) ends with the same results."""
    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import Tracker

    if name == "toy":
        monkeypatch.setenv("PGMFLOW_WORKLOADS", TOY)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    where = ["cluster.profile=address", f"cluster.address={cluster2.scheduler_address}", f"tracking.uri={uri}"]
    cfg = compose([f"pipeline={name}", "debug=default", "progress=false", *where])
    import io

    out = io.StringIO()
    res = execute(cfg, stream=out)
    assert f"pgmflow: {name} run {res['run_id']}" in out.getvalue()  # the workload printed to the run's stream
    tr = Tracker(uri, cfg["tracking"]["experiment"])
    tr.run_id = res["run_id"]
    first = json.loads(tr.read_text("results.json"))
    assert isinstance(first["objective"], float) and math.isfinite(first["objective"])
    # as if the driver had died before the end: the run is left KILLED, then resumed
    tr.client.set_terminated(tr.run_id, "KILLED")
    again = compose([f"resume={tr.run_id}", "progress=false", *where])
    out2 = io.StringIO()
    res2 = execute(again, stream=out2)
    assert res2["run_id"] == tr.run_id
    if tr.list_artifacts("checkpoints"):  # tempering, svi: continued from the newest checkpoint
        assert "resuming" in out2.getvalue(), out2.getvalue()
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    assert _estimates(json.loads(tr.read_text("results.json"))) == _estimates(first)
