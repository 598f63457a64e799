"""MLflow pyfunc models of a run, written once for every workload that logs one: save a pyfunc
model folder from an ``.npz`` of arrays and a wrapper class, log it as an MLflow 3 logged model of the run
(``LoggedModel`` named after its artifact path, with the run as its source and among the run's outputs; its
artifacts in the model's own location; through the run's own client: no fluent MLflow state), and register it
in the model registry. ``runs:/<run>/<name>`` resolves to it (MLflow looks up the run's logged model of that
name), and ``client.search_logged_models`` finds it.

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


def save_pyfunc(path, npz_path, wrapper: type, signature, input_example, mlflow_model=None) -> None:
    """Write an MLflow pyfunc model folder at ``path``: ``wrapper`` (a ``PythonModel`` subclass in a
    pgmflow module) over the arrays ``npz_path`` (artifact key :data:`NPZ_KEY`); ``mlflow_model``: the
    ``mlflow.models.Model`` to fill in (the logged model's ids), or None."""
    import mlflow.pyfunc

    from pgmflow.core import internals

    with tempfile.TemporaryDirectory() as d, internals.mlflow_requirements_unchecked():
        mlflow.pyfunc.save_model(
            str(path),
            python_model=str(_code_file(Path(d), wrapper)),
            artifacts={NPZ_KEY: str(npz_path)},
            signature=signature,
            input_example=input_example,
            pip_requirements=requirements(),
            mlflow_model=mlflow_model,
        )


def log_pyfunc(ctx, arrays: dict, artifact_path: str, wrapper: type, signature, input_example, npz_name: str) -> str:
    """Save ``arrays`` as ``npz_name``, wrap them as a pyfunc model and log it as the run's logged model
    ``artifact_path`` (READY once its artifacts are written, FAILED if that fails); with
    ``tracking.register_model``, register it as a new version. Returns the logged model's id."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    tracker = ctx.tracker
    client, run_id = tracker.client, tracker.run_id
    run = client.get_run(run_id)
    # (experiment, name, source run, tags, params) by position: the retrying client's own first parameter is "name"
    logged = client.create_logged_model(run.info.experiment_id, artifact_path, run_id, None, dict(run.data.params))
    try:
        with tempfile.TemporaryDirectory() as d:
            npz = Path(d) / npz_name
            np.savez_compressed(npz, **arrays)
            out = Path(d) / artifact_path
            spec = Model(
                artifact_path=logged.artifact_location,
                run_id=run_id,
                model_uuid=logged.model_id,
                model_id=logged.model_id,
            )
            save_pyfunc(out, npz, wrapper, signature, input_example, spec)
            client.log_model_artifacts(logged.model_id, str(out))
    except BaseException:
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    name = (ctx.cfg.get("tracking") or {}).get("register_model")
    if name:
        version = register_model(tracker, logged, name)
        tracker.set_tags({"pgmflow.registered_model": f"{name}/{version}"})
        ctx.say(
            f"registered the model runs:/{run_id}/{artifact_path} (models:/{logged.model_id}) as '{name}' version "
            f"{version} (models:/{name}/{version})"
        )
    return logged.model_id


def register_model(tracker, logged, name: str) -> str:
    """Register the run's logged model ``logged`` (an ``mlflow.entities.LoggedModel``) as a new version of the
    registered model ``name`` (created when missing); returns the version."""
    client = tracker.client
    try:
        client.create_registered_model(name)
    except Exception as exc:  # it exists already (another run registered it): add a version
        if "already exists" not in str(exc).lower() and "resource_already_exists" not in str(exc).lower():
            raise
    # the source is the model's artifact location, not models:/<id>: MLflow's SQL registry resolves that
    # through the process-wide tracking URI, which pgmflow leaves alone
    mv = client.create_model_version(
        name,
        logged.artifact_location,
        run_id=tracker.run_id,
        description=f"pgmflow run {tracker.run_id}, logged model {logged.model_id}",
        model_id=logged.model_id,
    )
    return str(mv.version)
