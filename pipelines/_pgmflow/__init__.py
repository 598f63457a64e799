"""pgmflow: distributed experiment pipelines for probabilistic inference.

Hydra configs describe an experiment, pgmflow runs it as a Dask graph and records it in MLflow. From Python::

    import pgmflow

    result = pgmflow.run("pipeline=sparse_gp", "debug=default")   # the same overrides as the CLI
    print(result.objective, result.run_id)
    fitted = pgmflow.load(result.run_id)                           # config, results, arrays, model
    mean, var = fitted.model.predict(x_new)

The sub-packages: ``pgmflow.pipelines`` (orchestration: the CLI, the runner, one package per workload),
``pgmflow.tasks`` (the numerics that run inside Dask tasks), ``pgmflow.conf`` (the Hydra configs).
See docs/python_api.md.

Importing ``pgmflow`` is cheap: the API's modules (and dask, mlflow) load on first use.
"""

from __future__ import annotations

__version__ = "0.2.0"

__all__ = ["run", "load", "compose", "RunResult", "LoadedRun", "ConfigError", "RunFailed", "__version__"]

_API = {
    name: "pgmflow.pipelines.core.api" for name in ("run", "load", "compose", "RunResult", "LoadedRun", "RunFailed")
}
_API["ConfigError"] = "pgmflow.pipelines.core.errors"


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pgmflow' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))
