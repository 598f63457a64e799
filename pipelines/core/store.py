"""A new local SQLite MLflow store without MLflow's migrations each time.

MLflow builds a new SQLite store by running its ~70 alembic migrations: about 5-7 s on a 2-core machine, paid by
every first run in a new folder. pgmflow makes an empty store once per MLflow version (with MLflow itself:
``MlflowClient(...).search_experiments()``), keeps it in ``$XDG_CACHE_HOME/pgmflow/`` (``~/.cache`` by
default), and copies it where a new store is wanted. The copy is what MLflow would have made there: the same
schema and alembic revision (MLflow checks the revision when it opens a store and refuses an out-of-date one:
then the kept store is rebuilt), the same default rows, with the Default experiment's artifact location set as
MLflow sets it for a store made in the current directory (``<cwd>/mlruns/0``).
``tests/pipelines/core/test_store.py`` compares a copy with a store MLflow made, and runs ``mlflow gc`` and
``mlflow ui`` on one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path


def template_path() -> Path:
    import mlflow

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgmflow" / f"mlflow-{mlflow.__version__}-empty.db"


def _build(target: Path):
    from mlflow import MlflowClient

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as d:
        db = Path(d) / "empty.db"
        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
        os.replace(db, target)


def _default_artifacts(db: Path):
    """The Default experiment's artifact location, as MLflow sets it for a store made in the current folder."""
    with sqlite3.connect(db) as con:
        con.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
            (str(Path(os.getcwd()).resolve() / "mlruns" / "0"),),
        )


def prepare(uri: str) -> bool:
    """For ``sqlite:///<absolute path>`` whose file does not exist: copy the kept empty store there (made first
    if needed) and return True; False for anything else (an existing store, a server, another database)."""
    if not uri.startswith("sqlite:////"):
        return False
    db = Path(uri[len("sqlite:///") :])
    if db.exists() or not db.parent.is_dir():
        return False
    try:
        tmpl = template_path()
        if not tmpl.exists():
            _build(tmpl)
        shutil.copyfile(tmpl, db)
        _default_artifacts(db)
        _check(uri, tmpl)
        return True
    except OSError:
        return False  # a read-only cache: MLflow makes the store itself


def _check(uri: str, tmpl: Path):
    """Open the copy with MLflow (which refuses a schema older than its head); a refused copy is replaced by a
    store MLflow makes, and the kept template is rebuilt next time."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except MlflowException:
        db = Path(uri[len("sqlite:///") :])
        db.unlink(missing_ok=True)
        tmpl.unlink(missing_ok=True)
