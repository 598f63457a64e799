"""pgmflow: distributed experiment pipelines for probabilistic inference.

Hydra configs describe an experiment, pgmflow runs it as a Dask graph and records it in MLflow. From Python::

    import pgmflow

    result = pgmflow.run("pipeline=sparse_gp", "debug=default")   # the same overrides as the CLI
    print(result.objective, result.run_id)
    fitted = pgmflow.load(result.run_id)                           # config, results, arrays, model
    mean, var = fitted.model.predict(x_new)

The package is the repository's ``pipelines/`` folder (orchestration): ``pgmflow.core`` (the CLI, the runner,
registry, preflight, cluster, tracking, graph executor, artifacts, sweeps) and one package per workload beside it
(``pgmflow.svi``, ``pgmflow.tesla``, ...; each declares itself with a ``WORKLOAD`` value, and the core knows no
workload by name); ``pgmflow.tasks`` is ``tasks/`` (the numerics that run inside Dask tasks) and ``pgmflow.conf``
is ``conf/`` (the Hydra configs). See docs/python_api.md and docs/architecture.md.

Importing ``pgmflow`` is cheap: the API's modules (and dask, mlflow) load on first use.
"""

from __future__ import annotations

__version__ = "0.3.0"

import os as _os  # noqa: E402

# MLflow 3 sends usage telemetry by default: at `import mlflow` it starts a thread that fetches its settings from
# the internet and then edits the process environment (it unsets its session variable) while other threads may be
# reading it (a glibc getenv/unsetenv race that can crash the process), on cluster nodes that are often offline.
# pgmflow turns it off before MLflow is imported, unless the user has set MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK
# (docs/reliability.md, "The process environment"); and only while this process has no other thread, since this
# write is itself a putenv (a Dask worker that first imports pgmflow to run a task has its event loop running; the
# workers a pgmflow driver starts inherit the variable).
if "DO_NOT_TRACK" not in _os.environ and "MLFLOW_DISABLE_TELEMETRY" not in _os.environ:
    import threading as _threading  # noqa: E402

    if _threading.active_count() == 1:
        _os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

from pgmflow.core import legacy_names as _legacy_names  # noqa: E402  (old import names, pgmflow.pipelines.*)

_legacy_names.install()

__all__ = ["run", "load", "compose", "RunResult", "LoadedRun", "ConfigError", "RunFailed", "__version__"]

_API = {name: "pgmflow.core.api" for name in ("run", "load", "compose", "RunResult", "LoadedRun", "RunFailed")}
_API["ConfigError"] = "pgmflow.core.errors"


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pgmflow' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
