"""pgmflow from Python: compose a config, run it, load a finished run.

    import pgmflow

    cfg = pgmflow.compose("pipeline=sparse_gp", "debug=default")      # the resolved config, as a dict
    result = pgmflow.run("pipeline=sparse_gp", "debug=default")       # a RunResult
    result.objective, result.metrics["final_test_rmse"], result.artifact_dir
    fitted = pgmflow.load(result.run_id)                              # a LoadedRun
    mean, var = fitted.model.predict(x_new)                            # sparse_gp; svi: fitted.model.transform(docs)

:func:`run` composes the config exactly as the ``pgmflow`` command does (the same Hydra composition, the
same preflight checks) and raises :class:`~pgmflow.core.errors.ConfigError` with the line the
command would print (``err.field``, ``err.value``, ``err.fix``). It can run on a ``distributed.Client`` you
already have (``cluster=client``): pgmflow submits its tasks there and leaves the client open.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from pgmflow.core.errors import ConfigError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


class RunFailed(RuntimeError):
    """A run that started and then failed. ``run_id`` names its MLflow run (ended FAILED with the message);
    the original exception is ``__cause__``."""

    def __init__(self, message: str, run_id: str | None = None):
        super().__init__(message)
        self.run_id = run_id


@contextlib.contextmanager
def _launch_dir():
    """Relative paths in a config (data files, the SQLite store) are taken from the working directory, as on
    the command line (``PGMFLOW_ORIG_CWD``)."""
    old = os.environ.get("PGMFLOW_ORIG_CWD")
    if old == os.getcwd():  # written only when it changes: no putenv while a kept cluster's threads run
        yield
        return
    os.environ["PGMFLOW_ORIG_CWD"] = os.getcwd()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PGMFLOW_ORIG_CWD", None)
        else:
            os.environ["PGMFLOW_ORIG_CWD"] = old


def _check_overrides(overrides) -> list[str]:
    out = []
    for o in overrides:
        if not isinstance(o, str):
            raise TypeError(
                f"pgmflow: overrides are strings such as 'model.L=32' or 'pipeline=svi', not {o!r} ({type(o).__name__})"
            )
        out.append(o)
    return out


def compose(*overrides: str) -> dict:
    """The resolved config for ``overrides``, as the ``pgmflow`` command composes it (a plain dict).

    A bad override (unknown key, unknown option of a group, bad syntax, an unresolvable ``${...}``) raises
    :class:`ConfigError` with the one line the command prints. The values are not checked here: that is
    :func:`run`'s preflight.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from pgmflow.core.cli import override_error
    from pgmflow.core.config import check_install, conf_dir, resolved

    argv = _check_overrides(overrides)
    check_install()
    if GlobalHydra.instance().is_initialized():  # called from inside a Hydra app (a notebook's own, a job)
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = hydra_compose("config", overrides=argv)
    except Exception as exc:
        raise override_error(argv, exc) from None
    return resolved(cfg)


@dataclass
class RunResult:
    """What :func:`run` returns.

    run_id: the MLflow run; objective: the pipeline's objective (what a sweep optimises; its name in
    ``objective_name``); metrics: the run's metrics, last value of each; config: the resolved config;
    result: the pipeline's own result dict (every figure it reports); tracking_uri; artifact_uri and
    artifact_dir (a local folder for local stores, else None: use :meth:`artifact`).
    """

    run_id: str
    pipeline: str
    objective: float | None
    objective_name: str | None
    metrics: dict
    config: dict
    result: dict
    tracking_uri: str
    artifact_uri: str
    artifact_dir: Path | None = None

    def artifact(self, path: str) -> Path:
        """A local path to the artifact ``path`` (e.g. ``"results.json"``, ``"figures/trace.png"``), downloaded
        first when the store is remote."""
        return _artifact(self.tracking_uri, self.run_id, self.artifact_dir, path)

    def load(self) -> LoadedRun:
        """The run as :func:`load` gives it (its arrays and, for sparse_gp and svi, its fitted model)."""
        return load(self.run_id, tracking_uri=self.tracking_uri)

    def __repr__(self):
        obj = f"{self.objective:.6g}" if isinstance(self.objective, float) else self.objective
        return (
            f"RunResult(pipeline={self.pipeline!r}, run_id={self.run_id!r}, objective={obj}, "
            f"{len(self.metrics)} metrics)"
        )


def _client_handle(client):
    """A ClusterHandle over a client the caller owns (it stays open when the run ends)."""
    from pgmflow.core.cluster import ClusterHandle

    n = len(client.scheduler_info().get("workers", {}))
    return ClusterHandle(
        client=client,
        profile="client",
        type="client",
        n_workers=max(n, 1),
        address=getattr(client.scheduler, "address", None),
    )


def _cluster_arg(cfg: dict, cluster) -> object | None:
    """Apply ``cluster=``: None (the config's profile), a profile name, a scheduler address, or a
    ``distributed.Client`` / Dask cluster object (returned: the run uses it and leaves it open)."""
    if cluster is None:
        return None
    if isinstance(cluster, str):
        if "://" in cluster:
            cfg["cluster"]["profile"] = "address"
            cfg["cluster"]["address"] = cluster
        else:
            cfg["cluster"]["profile"] = cluster
        return None
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - distributed is a core dependency
        Client = ()
    if isinstance(cluster, Client):
        return cluster
    if hasattr(cluster, "scheduler_address"):  # a LocalCluster, SLURMCluster, KubeCluster...
        return cluster
    raise TypeError(
        f"pgmflow.run: cluster={cluster!r} ({type(cluster).__name__}) is not a profile name, a "
        f"scheduler address, a distributed.Client or a Dask cluster"
    )


@contextlib.contextmanager
def _as_client(obj):
    from distributed import Client

    if isinstance(obj, Client):
        yield obj
    else:  # a cluster object: a client of ours over it, closed afterwards (the cluster stays)
        with Client(obj) as client:
            yield client


def run(
    *overrides: str, cluster=None, tracking_uri: str | None = None, progress: bool | None = None, stream=None
) -> RunResult:
    """Run one experiment, as ``pgmflow <overrides...>`` does, and return a :class:`RunResult`.

    overrides: Hydra overrides, e.g. ``"pipeline=svi", "model.K=10", "seed=3"``.
    cluster: None (``cluster.profile`` of the config: a local cluster by default), a profile name of
        ``dask_cluster.yaml`` (``"synchronous"``, ``"slurm"``...), a scheduler address (``"tcp://host:8786"``),
        or a ``distributed.Client`` / Dask cluster you already have, which pgmflow uses and leaves open.
    tracking_uri: the MLflow store (default: the config's ``tracking.uri``, ``sqlite:///mlflow.db`` in the
        working directory).
    progress: show the progress bar (a terminal line, or a bar that updates in place in Jupyter);
        None: the config's ``progress``.
    stream: where the run's lines go (default ``sys.stdout``).

    Raises :class:`ConfigError` for bad input (the line the command prints, before any task runs) and
    :class:`RunFailed` when the run fails later (its MLflow run ended FAILED; the cause is chained).
    KeyboardInterrupt ends the run KILLED and propagates; continue it with ``run(f"resume={run_id}")``.
    """
    from pgmflow.core import runner

    with _launch_dir():
        cfg = compose(*overrides)
        if tracking_uri is not None:
            cfg["tracking"]["uri"] = tracking_uri
        if progress is not None:
            cfg["progress"] = bool(progress)
        own = _cluster_arg(cfg, cluster)
        if own is None:
            from pgmflow.core import mainguard

            mainguard.check(cfg)  # an unguarded script would start worker processes that run it again
        record = runner.RunRecord()
        try:
            if own is None:
                result = runner.execute(cfg, stream=stream, record=record)
            else:
                with _as_client(own) as client:
                    result = runner.execute(cfg, stream=stream, cluster=_client_handle(client), record=record)
        except (ConfigError, KeyboardInterrupt):
            raise
        except Exception as exc:
            run_id = record.run_id if record.ended else None
            where = f" (MLflow run {run_id} ended FAILED)" if run_id else ""
            raise RunFailed(f"{type(exc).__name__}: {' '.join(str(exc).split())}{where}", run_id) from exc
        return _result(result, cfg)


def _result(result: dict, cfg: dict) -> RunResult:
    from pgmflow.core.tracking import _absolute_uri

    uri = _absolute_uri(cfg["tracking"]["uri"])
    client = _mlflow_client(uri)
    run = client.get_run(result["run_id"])
    objective = result.get("objective")
    return RunResult(
        run_id=result["run_id"],
        pipeline=cfg["pipeline"]["name"],
        objective=float(objective) if isinstance(objective, (int, float)) else None,
        objective_name=result.get("objective_name"),
        metrics=dict(run.data.metrics),
        config=cfg,
        result=result,
        tracking_uri=uri,
        artifact_uri=run.info.artifact_uri,
        artifact_dir=_local_dir(run.info.artifact_uri),
    )


def _mlflow_client(uri: str):
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def _local_dir(artifact_uri: str) -> Path | None:
    """The folder of a file-based artifact URI (``file:///...`` or a plain path), else None."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and artifact_uri:
        return Path(artifact_uri)
    return None


def _artifact(uri: str, run_id: str, local: Path | None, path: str) -> Path:
    if local is not None:
        p = local / path
        if not p.exists():
            raise FileNotFoundError(f"pgmflow: run {run_id} has no artifact {path!r} (in {local})")
        return p
    import mlflow.artifacts

    dst = tempfile.mkdtemp(prefix=f"pgmflow-{run_id[:8]}-")
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=dst, tracking_uri=uri))


# --- load ---------------------------------------------------------------------------------------------
@dataclass
class LoadedRun:
    """A finished (or failed) run read back from MLflow.

    config: the resolved config the run used (``config.yaml``); results: its ``results.json``; metrics: the
    last value of every metric; params, tags, status; arrays: ``{name: {array name: ndarray}}`` from every
    ``.npz`` the run logged at its top level (``model``, ``lambda``, ``estimates``, ``final_state``...);
    model: for sparse_gp a GP predictor (``model.predict(X) -> (mean, var)`` in original units), for svi an
    LDA transformer (``model.transform(docs) -> theta``); None for the other pipelines.
    """

    run_id: str
    pipeline: str | None
    status: str
    config: dict
    results: dict
    metrics: dict
    params: dict
    tags: dict
    tracking_uri: str
    artifact_uri: str
    artifact_dir: Path | None
    arrays: dict = field(default_factory=dict)
    model: object = None

    def artifact(self, path: str) -> Path:
        """A local path to the artifact ``path``, downloaded first when the store is remote."""
        return _artifact(self.tracking_uri, self.run_id, self.artifact_dir, path)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of one metric, in step order."""
        hist = _mlflow_client(self.tracking_uri).get_metric_history(self.run_id, key)
        return sorted((m.step, m.value) for m in hist)

    def __repr__(self):
        model = f", model={type(self.model).__name__}" if self.model is not None else ""
        return (
            f"LoadedRun(pipeline={self.pipeline!r}, run_id={self.run_id!r}, status={self.status!r}, "
            f"arrays={sorted(self.arrays)}{model})"
        )


def load(run_id: str, tracking_uri: str | None = None) -> LoadedRun:
    """Read a run back from MLflow: its config, results, metrics, arrays and (sparse_gp, svi) fitted model.

    tracking_uri: the store (default ``sqlite:///mlflow.db`` in the working directory, as the command's).
    An unknown run id raises :class:`ConfigError` naming the store.
    """
    import numpy as np
    import yaml

    from pgmflow.core.tracking import _absolute_uri

    if not isinstance(run_id, str) or not run_id.strip():
        raise ConfigError(
            "run_id", run_id, "is not an MLflow run id", "pass the run id a run printed (or RunResult.run_id)"
        )
    with _launch_dir():
        uri = _absolute_uri(tracking_uri or DEFAULT_TRACKING_URI)
    client = _mlflow_client(uri)
    try:
        run = client.get_run(run_id)
    except Exception:
        raise ConfigError(
            "run_id",
            run_id,
            f"no such MLflow run in {uri}",
            "pass a run id from that store, or the store it was logged to (tracking_uri=...)",
        ) from None
    local = _local_dir(run.info.artifact_uri)
    folder = local if local is not None else Path(_artifact(uri, run_id, None, ""))

    def read(name):
        p = folder / name
        return p.read_text() if p.is_file() else None

    config = yaml.safe_load(read("config.yaml") or "{}") or {}
    results = json.loads(read("results.json") or "{}")
    arrays = {}
    for p in sorted(folder.glob("*.npz")):
        with np.load(p, allow_pickle=False) as z:
            arrays[p.stem] = {k: z[k] for k in z.files}
    pipeline = run.data.tags.get("pgmflow.pipeline") or (config.get("pipeline") or {}).get("name")
    loaded = LoadedRun(
        run_id=run_id,
        pipeline=pipeline,
        status=run.info.status,
        config=config,
        results=results,
        metrics=dict(run.data.metrics),
        params=dict(run.data.params),
        tags=dict(run.data.tags),
        tracking_uri=uri,
        artifact_uri=run.info.artifact_uri,
        artifact_dir=folder,
        arrays=arrays,
    )
    loaded.model = _fitted_model(pipeline, folder)
    return loaded


def _fitted_model(pipeline: str | None, folder: Path):
    """The workload's fitted model read from the run's artifacts (its ``Workload.load_model``; None where the
    workload declares none, is not installed here, or the run logged no model)."""
    from pgmflow.core import registry

    try:
        workload = registry.get(pipeline) if pipeline else None
    except Exception:
        return None
    reader = workload.load_model_reader() if workload is not None else None
    if reader is None:
        return None
    try:
        return reader(folder)
    except FileNotFoundError:  # a run that logged no model (it failed first, or predates pyfunc models)
        return None
