"""MLflow pyfunc models of a run, written once for every workload that logs one: save a pyfunc
model folder from an ``.npz`` of arrays and a wrapper class, log it under an artifact path of the
run (through the run's own client: no fluent MLflow state), and register it in the model registry.

The model is written as MLflow "models from code": the folder holds a three-line Python file that
imports the wrapper class from pgmflow and calls ``mlflow.models.set_model``, and the arrays as the
artifact ``model_npz``; nothing is pickled, so the model loads in any process that has pgmflow and
MLflow installed (``mlflow.pyfunc.load_model``, ``mlflow models serve --env-manager local``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

NPZ_KEY = "model_npz"  # the pyfunc's artifact key of the arrays


def python_model_base() -> type:
    """``mlflow.pyfunc.PythonModel`` (imported before a subclass is defined under a warnings filter:
    importing MLflow adds filters of its own)."""
    import mlflow.pyfunc

    return mlflow.pyfunc.PythonModel


def pgmflow_version() -> str:
    """The installed pgmflow distribution's version (the package's own when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("pgmflow")
    except metadata.PackageNotFoundError:
        from pgmflow import __version__

        return __version__


def requirements() -> list[str]:
    """The pyfunc's pip requirements: pgmflow (which brings its own dependencies) and the libraries
    the wrappers call, at this process's versions (not a ``pip freeze``)."""
    import mlflow
    import pandas
    import scipy

    return [
        f"pgmflow=={pgmflow_version()}",
        f"mlflow=={mlflow.__version__}",
        f"numpy=={np.__version__}",
        f"scipy=={scipy.__version__}",
        f"pandas=={pandas.__version__}",
    ]


def _code_file(directory: Path, wrapper: type) -> Path:
    """The model's code (models from code): import ``wrapper`` from its pgmflow module, set it as the model."""
    p = directory / f"{wrapper.__name__.lower()}.py"
    p.write_text(
        f'"""pgmflow pyfunc model (MLflow models from code): {wrapper.__module__}.{wrapper.__name__}."""\n'
        "import mlflow.models\n\n"
        f"from {wrapper.__module__} import {wrapper.__name__}\n\n"
        f"mlflow.models.set_model({wrapper.__name__}())\n"
    )
    return p


def save_pyfunc(path, npz_path, wrapper: type, signature, input_example) -> None:
    """Write an MLflow pyfunc model folder at ``path``: ``wrapper`` (a ``PythonModel`` subclass in a
    pgmflow module) over the arrays ``npz_path`` (artifact key :data:`NPZ_KEY`)."""
    import mlflow.pyfunc

    with tempfile.TemporaryDirectory() as d:
        mlflow.pyfunc.save_model(
            str(path),
            python_model=str(_code_file(Path(d), wrapper)),
            artifacts={NPZ_KEY: str(npz_path)},
            signature=signature,
            input_example=input_example,
            pip_requirements=requirements(),
        )


def log_pyfunc(ctx, arrays: dict, artifact_path: str, wrapper: type, signature, input_example, npz_name: str) -> None:
    """Save ``arrays`` as ``npz_name``, wrap them as a pyfunc model and log the folder under
    ``artifact_path`` of the run; with ``tracking.register_model``, register it as a new version."""
    tracker = ctx.tracker
    with tempfile.TemporaryDirectory() as d:
        npz = Path(d) / npz_name
        np.savez_compressed(npz, **arrays)
        out = Path(d) / artifact_path
        save_pyfunc(out, npz, wrapper, signature, input_example)
        tracker.client.log_artifacts(tracker.run_id, str(out), artifact_path)
    name = (ctx.cfg.get("tracking") or {}).get("register_model")
    if name:
        version = register_model(tracker, artifact_path, name)
        tracker.set_tags({"pgmflow.registered_model": f"{name}/{version}"})
        ctx.say(
            f"registered the model runs:/{tracker.run_id}/{artifact_path} as '{name}' version {version} "
            f"(models:/{name}/{version})"
        )


def register_model(tracker, artifact_path: str, name: str) -> str:
    """Register ``runs:/<run>/<artifact_path>`` as a new version of the registered model ``name``
    (created when missing); returns the version."""
    client = tracker.client
    try:
        client.create_registered_model(name)
    except Exception as exc:  # it exists already (another run registered it): add a version
        if "already exists" not in str(exc).lower() and "resource_already_exists" not in str(exc).lower():
            raise
    source = f"{client.get_run(tracker.run_id).info.artifact_uri}/{artifact_path}"
    mv = client.create_model_version(
        name, source, run_id=tracker.run_id, description=f"pgmflow run {tracker.run_id}, artifact {artifact_path}"
    )
    return str(mv.version)
