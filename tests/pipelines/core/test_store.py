"""A new local store made the fast way (pgmflow.core.store: a copy of an empty store MLflow made once) is the
store MLflow would have made: the same tables, indexes and alembic revision, the same default rows; ``mlflow gc``
and ``mlflow ui`` work on it."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.fresh_store


def _schema(db: Path) -> tuple:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        # MLflow itself writes a table's constraints in no fixed order (two stores it makes differ): compare the
        # lines of each statement as a set
        tables = sorted(
            (k, n, tuple(sorted(ln.strip().rstrip(",") for ln in (sql or "").splitlines()))) for k, n, sql in rows
        )
        rev = con.execute("SELECT version_num FROM alembic_version").fetchall()
        exps = con.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments").fetchall()
    return tables, rev, exps


def test_a_copied_store_equals_one_mlflow_made(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from pgmflow.core import store
    from pgmflow.core.tracking import Tracker

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "mlflow").mkdir()
    (tmp_path / "fast").mkdir()
    monkeypatch.chdir(tmp_path / "mlflow")
    MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}").search_experiments()
    monkeypatch.chdir(tmp_path / "fast")
    assert store.prepare(f"sqlite:///{tmp_path / 'fast' / 'mlflow.db'}")
    assert store.template_path().exists()
    made, fast = _schema(tmp_path / "mlflow" / "mlflow.db"), _schema(tmp_path / "fast" / "mlflow.db")
    assert made[0] == fast[0] and made[1] == fast[1]  # tables, indexes, alembic revision
    assert made[2][0][:2] == fast[2][0][:2] == ("0", "Default") or made[2][0][:2] == fast[2][0][:2]
    assert made[2][0][2].replace(str(tmp_path / "mlflow"), "") == fast[2][0][2].replace(str(tmp_path / "fast"), "")
    assert not store.prepare(f"sqlite:///{tmp_path / 'fast' / 'mlflow.db'}")  # an existing store is left alone

    # a second new store is a copy of the kept one (no migrations): and a run in it, then deleted, is purged by gc
    (tmp_path / "other").mkdir()
    uri = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    t = time.perf_counter()
    tr = Tracker(uri, "pgmflow")
    tr.start("x", {"a": 1}, {})
    assert time.perf_counter() - t < 30
    tr.end("FINISHED")
    tr.client.delete_run(tr.run_id)
    gc = subprocess.run(
        [Path(sys.executable).parent / "mlflow", "gc", "--backend-store-uri", uri],
        capture_output=True,
        text=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},  # mlflow gc of MLflow 3 reads it for the artifact side
    )
    assert gc.returncode == 0, gc.stderr[-2000:]
    with sqlite3.connect(tmp_path / "other" / "mlflow.db") as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_ui_serves_a_copied_store(tmp_path, monkeypatch):
    from pgmflow.core.tracking import Tracker

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tr = Tracker(uri, "pgmflow")
    tr.start("seen in the ui", {"a": 1}, {})
    tr.end("FINISHED")
    port = _free_port()
    ui = subprocess.Popen(
        [
            Path(sys.executable).parent / "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search?max_results=10"
        deadline, body = time.time() + 120, ""
        while time.time() < deadline and not body:
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert '"name": "pgmflow"' in body or '"name":"pgmflow"' in body, body[:500]
    finally:
        ui.terminate()
        ui.wait(30)
