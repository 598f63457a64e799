"""The process environment is written before a run's threads start, never while they run (docs/reliability.md,
"The process environment"). glibc's setenv/unsetenv race its getenv in threads that read the environment without
the GIL (``localtime``'s TZ, the resolver in ``getaddrinfo``): a network test's driver died of SIGSEGV in getenv
2.6 s into its run, where it wrote the environment with the Dask client connected (the tracker's MLflow HTTP
variables, and MLflow's telemetry thread unsetting its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pgmflow.core import tracking

HTTP_VARS = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


def _spy_writes(monkeypatch) -> list:
    """Every putenv/unsetenv from here on (os.environ's writes go through these two)."""
    writes: list = []
    real_put, real_unset = os.putenv, os.unsetenv
    monkeypatch.setattr(os, "putenv", lambda k, v: (writes.append(("put", k)), real_put(k, v)))
    monkeypatch.setattr(os, "unsetenv", lambda k: (writes.append(("unset", k)), real_unset(k)))
    return writes


def test_a_prepared_process_writes_nothing_when_its_tracker_is_made(tmp_path, monkeypatch):
    for k in (*HTTP_VARS, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", tracking.ATTEMPT_ENV):
        monkeypatch.delenv(k, raising=False)
    tracking.prepare_process("http://127.0.0.1:9")  # what runner.execute does first, before any cluster
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "60"
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    attempt = os.environ[tracking.ATTEMPT_ENV]
    writes = _spy_writes(monkeypatch)
    tracking.prepare_process("http://127.0.0.1:9")
    tr = tracking.Tracker(f"sqlite:///{tmp_path / 'm.db'}", "e")  # a real store: the tracker is made as in a run
    assert tr.client is not None
    assert writes == [] and os.environ[tracking.ATTEMPT_ENV] == attempt


def test_a_sqlite_store_or_a_bad_value_leaves_the_http_variables_alone(monkeypatch):
    """A bad tracking.uri (5, None) is refused later with its own message (tests/bad_input): preparing the
    process must not fail on it first."""
    for k in HTTP_VARS:
        monkeypatch.delenv(k, raising=False)
    for uri in ("sqlite:///mlflow.db", 5, None):
        tracking.prepare_process(uri)
        assert not any(k in os.environ for k in HTTP_VARS)


def _fresh(code: str, **env_extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


TELEMETRY_PROBE = (
    "import json, os, threading, pgmflow, mlflow\n"
    "from mlflow.telemetry.client import get_telemetry_client\n"
    "print(json.dumps({'var': os.environ.get('MLFLOW_DISABLE_TELEMETRY'), 'client': get_telemetry_client() is not None,"
    " 'threads': threading.active_count()}))\n"
)


def test_mlflow_telemetry_is_off_unless_the_user_says_otherwise():
    """MLflow 3's telemetry starts, at import, a thread that fetches its settings over the internet and then unsets
    an environment variable from that thread. pgmflow turns it off before MLflow is imported (a fresh process,
    the real import order); a user's own choice, either variable, is left as it is."""
    off = _fresh(TELEMETRY_PROBE)
    assert off == {"var": "true", "client": False, "threads": 1}
    mine = _fresh(TELEMETRY_PROBE, MLFLOW_DISABLE_TELEMETRY="false")
    assert mine["var"] == "false"
    dnt = _fresh(TELEMETRY_PROBE, DO_NOT_TRACK="false")
    assert dnt["var"] is None


def test_importing_pgmflow_with_threads_running_writes_no_environment():
    """A Dask worker imports pgmflow to run its first task with its event loop running: the import must not write
    the environment then (the workers a pgmflow driver starts inherit the variable instead)."""
    code = (
        "import json, os, threading, time\n"
        "stop = threading.Event(); t = threading.Thread(target=stop.wait); t.start()\n"
        "import pgmflow\n"
        "stop.set(); t.join()\n"
        "print(json.dumps({'var': os.environ.get('MLFLOW_DISABLE_TELEMETRY')}))\n"
    )
    assert _fresh(code) == {"var": None}


def test_the_sweep_runner_writes_only_the_variables_that_differ(monkeypatch):
    from hydra_plugins.pgmflow_dask_launcher._job import apply_env

    monkeypatch.setenv("PGMFLOW_TEST_KEEP", "same")
    monkeypatch.setenv("PGMFLOW_TEST_GONE", "x")
    monkeypatch.delenv("PGMFLOW_TEST_NEW", raising=False)
    target = {k: v for k, v in os.environ.items() if k != "PGMFLOW_TEST_GONE"}
    target["PGMFLOW_TEST_NEW"] = "1"
    writes = _spy_writes(monkeypatch)
    apply_env(target)
    assert dict(os.environ) == target
    assert sorted(writes) == [("put", b"PGMFLOW_TEST_NEW"), ("unset", b"PGMFLOW_TEST_GONE")]
    writes.clear()
    apply_env(target)
    assert writes == []
