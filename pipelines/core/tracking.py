"""MLflow tracking: the only module that talks to MLflow.

A :class:`Tracker` wraps one MLflow run through ``MlflowClient`` (no global fluent state, so
several runs can live in one process). It logs the resolved config (YAML artifact and flattened
params), provenance tags, metrics with steps (batched), figures, tables and checkpoints, and ends
the run FINISHED, FAILED (with the error message) or KILLED.

Every call to the store goes through :class:`RetryingClient`: an unreachable tracking server or a
SQLite store locked by another process ("database is locked") is retried with backoff for up to
``max_wait`` seconds, and then fails with :class:`TrackingUnavailable`, one clear line. Metrics are
buffered: while the store is away the run goes on computing and keeps its metrics in memory; they
are delivered when the store answers again (or the run fails once ``max_wait`` has passed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import yaml

from pgmflow.core import interrupts

# the run's provenance (git, library versions, BLAS, CPU) lives in runenv; named here as before
from pgmflow.core.runenv import cpu_model, git_info, versions  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
IGNORED_FOR_HASH = ("resume", "progress", "verbose", "cluster", "tracking")
DEFAULT_MAX_WAIT = 300.0
# MLflow 3's UI opens an experiment by this tag: pgmflow's runs are model-training runs, not GenAI ones.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the run's description on its MLflow page
# Error texts that mean "the store is busy or away for now", not "the request is wrong".
TRANSIENT = (
    "database is locked",
    "database table is locked",
    "connection refused",
    "connectionerror",
    "max retries exceeded",
    "remote end closed",
    "connection aborted",
    "connection reset",
    "temporarily unavailable",
    "timed out",
    "read timeout",
    "502",
    "503",
    "504",
    "failed to establish a new connection",
    "api request to endpoint",
)


class TrackingUnavailable(RuntimeError):
    """The tracking store did not answer within ``tracking.max_wait`` seconds."""


# Attempts (docs/reliability.md, "a job that runs twice at once"): a process that writes a run first claims
# it, and every later write checks that the claim is still its own. The newest claim wins: a second
# attempt of the same work (a batch job SLURM requeued while the first still runs on a node slurmctld lost,
# a sweep job Dask gave to another worker) takes the run over, and the older attempt stops at its next write.
OWNER_TAG = "pgmflow.attempt.owner"  # the one Tracker that may write the run
LAUNCH_TAG = "pgmflow.attempt.launch"  # the attempt (process tree) that owns it: a sweep's launcher and its jobs
ATTEMPT_ENV = "PGMFLOW_ATTEMPT"


class Superseded(RuntimeError):
    """Another attempt of the same work has claimed the run: this one must write nothing more."""

    @property
    def message(self) -> str:
        return str(self)


def attempt_id() -> str:
    """This attempt's identity, made once per process tree (children inherit it through ``PGMFLOW_ATTEMPT``):
    the SLURM job id and restart count when run by SLURM, the host, the pid and a random part."""
    if not os.environ.get(ATTEMPT_ENV):
        import uuid

        job = os.environ.get("SLURM_JOB_ID")
        where = f"{platform.node()} pid {os.getpid()} {uuid.uuid4().hex[:6]}"
        if job:
            where = f"slurm job {job} restart {os.environ.get('SLURM_RESTART_COUNT', '0')} on {where}"
        os.environ[ATTEMPT_ENV] = where
    return os.environ[ATTEMPT_ENV]


def prepare_process(uri) -> None:
    """Every environment variable a run of this process sets, set at once: call it before the run starts a
    thread (a Dask client's event loop). Setting one later (``putenv``) races glibc's ``getenv`` in a thread that
    reads the environment without the GIL (``localtime``'s ``TZ``, the resolver's options in ``getaddrinfo``) and
    can crash the process: a network test's driver died of SIGSEGV in ``getenv`` in the window where the tracker
    set these with the client connected (docs/reliability.md). Only missing variables are set, so later calls
    write nothing."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if isinstance(uri, str) and uri.startswith(("http://", "https://")):  # a bad value is refused later, exit 2
        # pgmflow retries itself, within tracking.max_wait; MLflow's own retries would add minutes.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    attempt_id()


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from MLflow means "try again later" (locked SQLite, server away)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if "resource_does_not_exist" in text or "invalid_parameter_value" in text:
        return False
    return any(t in text for t in TRANSIENT)


class RetryingClient:
    """An ``MlflowClient`` whose calls are retried with backoff while the store is busy or away.

    ``max_wait`` bounds the total time one call may spend retrying; after it the call raises
    :class:`TrackingUnavailable` naming the store, the wait and the setting to change.
    """

    def __init__(self, client, uri: str, max_wait: float = DEFAULT_MAX_WAIT):
        self._client = client
        self._uri = uri
        self.max_wait = float(max_wait)

    def call(self, name: str, *args, max_wait: float | None = None, **kwargs):
        fn = getattr(self._client, name)
        wait = self.max_wait if max_wait is None else float(max_wait)
        deadline = time.monotonic() + wait
        delay = 0.05
        while True:
            try:
                with interrupts.shielded():  # a Ctrl-C lets the store write finish, then stops the run
                    return fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    first = " ".join(str(exc).split())[:200]
                    raise TrackingUnavailable(
                        f"the MLflow tracking store {self._uri} did not answer for {wait:g} s ({first}); fix: "
                        f"start or repair the tracking server, or raise tracking.max_wait"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def retrying(*args, **kwargs):
            return self.call(name, *args, **kwargs)

        return retrying


def config_hash(cfg: dict) -> str:
    """Hash of the parts of a resolved config that determine the results."""
    core = {k: v for k, v in cfg.items() if k not in IGNORED_FOR_HASH}
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finite_json(d: dict) -> dict:
    """``d`` with every NaN or infinite float (at any depth) made null; a top-level key so changed gets a
    ``<key>_note`` beside it saying what it was, and deeper ones are listed under ``nonfinite_fields``. JSON has
    no NaN: a strict parser refuses the token, and a NaN objective would be ranked by a sweep."""
    import math

    found: list[tuple[str, str]] = []

    def clean(v, path):
        if isinstance(v, float) and not math.isfinite(v):
            found.append((path, "nan" if v != v else ("inf" if v > 0 else "-inf")))
            return None
        if isinstance(v, dict):
            return {k: clean(x, f"{path}.{k}" if path else str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, f"{path}[{i}]") for i, x in enumerate(v)]
        return v

    out = clean(d, "")
    if found and isinstance(out, dict):
        deep = {}
        for path, what in found:
            if path in out and f"{path}_note" not in out:
                out[f"{path}_note"] = f"not a finite number ({what})"
            else:
                deep[path] = what
        if deep:
            out["nonfinite_fields"] = deep
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def default_artifact_location(uri: str) -> str | None:
    """For a local SQLite store, artifacts go to ./mlartifacts beside the database file."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        if not db.is_absolute():
            db = Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd())) / db
        return (db.parent / "mlartifacts").resolve().as_uri()
    return None


def _absolute_uri(uri: str) -> str:
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        base = Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd()))
        return "sqlite:///" + str((base / rel).resolve())
    return uri


@contextlib.contextmanager
def _store_lock(uri: str):
    """Serialise the opening of a SQLite store across processes: MLflow creates and migrates the
    schema on first open, and two processes doing it at once can fail ("table already exists")."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///") :])
    try:
        import fcntl

        db.parent.mkdir(parents=True, exist_ok=True)
        fh = open(str(db) + ".lock", "a")
    except (ImportError, OSError):  # no fcntl (Windows) or a read-only directory
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Tracker:
    """One MLflow run. Use :meth:`start` (new run) or :meth:`resume` (continue a run)."""

    def __init__(
        self, uri: str, experiment: str, artifact_location: str | None = None, max_wait: float = DEFAULT_MAX_WAIT
    ):
        import logging

        prepare_process(uri)  # a no-op when the run prepared the process before its threads started
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.uri = _absolute_uri(uri)
        with _store_lock(self.uri):
            from pgmflow.core import store

            store.prepare(self.uri)  # a new local store: a copy of an empty one, not MLflow's migrations again
            self.client = RetryingClient(MlflowClient(tracking_uri=self.uri), self.uri, max_wait)
        self.experiment_name = experiment
        self.artifact_location = artifact_location or default_artifact_location(self.uri)
        self.run_id: str | None = None
        self._pending: list = []
        self._seen: set = set()  # (key, step) already logged: each metric once per step
        self._last_flush = time.monotonic()
        self._owner: str | None = None  # this tracker's claim on the run (OWNER_TAG), once claimed
        self._superseded: str | None = None  # the claim that replaced it

    # --- attempts ----------------------------------------------------------------------------
    def claim(self):
        """Make this tracker the run's only writer (the newest claim wins; see :meth:`fence`)."""
        import uuid

        self._owner = f"{attempt_id()} tracker {uuid.uuid4().hex[:8]}"
        self._superseded = None
        self.set_tags({OWNER_TAG: self._owner, LAUNCH_TAG: attempt_id()})

    def fence(self, max_wait: float | None = None):
        """Raise :class:`Superseded` when another tracker has claimed the run since this one did (one read of
        the run's tags; nothing when this tracker never claimed). Every write of a claimed run passes here
        first, so an attempt that lost its run writes nothing more: its buffered metrics are dropped."""
        if self._owner is None:
            return
        if self._superseded is None:
            run = self.client.call("get_run", self.run_id, max_wait=max_wait)
            owner = run.data.tags.get(OWNER_TAG)
            if owner is None or owner == self._owner:
                return
            self._superseded = owner
            self._pending.clear()
        raise Superseded(
            f"run {self.run_id} was taken over by another attempt ({self._superseded}); this attempt "
            f"({self._owner.rsplit(' tracker ', 1)[0]}) stops without writing to it again"
        )

    # --- lifecycle ---------------------------------------------------------------------------
    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        if exp is None:
            try:
                return self.client.create_experiment(
                    self.experiment_name,
                    artifact_location=self.artifact_location,
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                )
            except Exception:  # created concurrently by another run
                exp = self.client.get_experiment_by_name(self.experiment_name)
                if exp is None:
                    raise
        if EXPERIMENT_KIND_TAG not in (exp.tags or {}):  # an experiment made before pgmflow tagged it
            self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id

    def _load_seen(self):
        """The (key, step) pairs the run already holds, so that a resumed or retried run does not log
        a metric a second time at one step."""
        for key in self.client.get_run(self.run_id).data.metrics:
            history = self.client.get_metric_history(self.run_id, key)
            self._seen.update((key, m.step) for m in history)

    def start(self, run_name: str, cfg: dict, tags: dict) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(
            self._experiment_id(), run_name=run_name, tags={k: str(v) for k, v in tags.items()}
        )
        self.run_id = run.info.run_id
        self.claim()
        flat = flatten(cfg)
        params = [Param(k, str(v)[:6000]) for k, v in flat.items() if k != "resume"]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.log_text(yaml.safe_dump(cfg, sort_keys=False), "config.yaml")
        self.set_tags({"pgmflow.config_hash": config_hash(cfg)})
        return self.run_id

    def attach(self, run_id: str, cfg: dict, tags: dict, parent_id: str | None = None) -> str:
        """Log into a run that already exists (a sweep's child run, created by the launching
        process): RUNNING again, with this config's params, config.yaml and tags.

        The run is claimed (:meth:`claim`); with ``parent_id`` (the sweep's parent run) only when this
        attempt's launcher still owns the parent: a job of a launcher that another attempt of the sweep
        has replaced raises :class:`Superseded` instead of taking the child back."""
        from mlflow.entities import Param

        if parent_id:
            launch = self.client.get_run(parent_id).data.tags.get(LAUNCH_TAG)
            if launch is not None and launch != attempt_id():
                raise Superseded(
                    f"sweep run {parent_id} was taken over by another attempt ({launch}); this attempt "
                    f"({attempt_id()}) does not start its job in run {run_id}"
                )
        self.run_id = run_id
        self.claim()
        self.client.update_run(run_id, status="RUNNING")
        run = self.client.get_run(run_id)
        have = run.data.params
        params = [Param(k, str(v)[:6000]) for k, v in flatten(cfg).items() if k != "resume" and k not in have]
        for i in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[i : i + 100])
        attempt = int(run.data.tags.get("pgmflow.attempt", "0")) + 1
        self.log_text(yaml.safe_dump(cfg, sort_keys=False), "config.yaml")
        self.set_tags({**tags, "pgmflow.config_hash": config_hash(cfg), "pgmflow.attempt": attempt})
        if "pgmflow.error" in run.data.tags:
            self.client.delete_tag(run_id, "pgmflow.error")
        self._load_seen()
        return run_id

    def resume(self, run_id: str) -> dict:
        """Reopen an existing run (status RUNNING again); returns its recorded config."""
        self.client.get_run(run_id)  # raises if unknown
        self.run_id = run_id
        self.claim()
        cfg = yaml.safe_load(self.read_text("config.yaml"))
        self.client.update_run(run_id, status="RUNNING")
        self.set_tags({"pgmflow.resumed": "true"})
        self._load_seen()
        return cfg

    def end(self, status: str = "FINISHED", message: str | None = None, detail: str | None = None):
        """End the run with ``status``; a ``message`` becomes the tag ``pgmflow.error`` and the artifact
        ``error.txt``, followed there by ``detail`` (the traceback of an unexpected error)."""
        if self.run_id is None:
            return
        self.fence()  # an attempt that lost its run does not end it: the run is the newer attempt's
        try:
            self.flush()
        except Exception as exc:
            if status == "FINISHED":  # never FINISHED with metrics missing
                status, message = "FAILED", f"metrics could not be delivered: {exc}"
        if message:
            self.set_tags({"pgmflow.error": message[:5000]})
            self.log_text(message + (f"\n\n{detail}" if detail else ""), "error.txt")
        self.client.set_terminated(self.run_id, status=status)

    @property
    def ui_hint(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment_name)
        store = self.uri
        return (
            f"MLflow run {self.run_id} (experiment '{self.experiment_name}', id {exp.experiment_id}) in {store}; "
            f"open the UI with: mlflow ui --backend-store-uri {store}"
        )

    # --- logging -----------------------------------------------------------------------------
    def set_description(self, text: str):
        """The run's description on its MLflow page (the tag ``mlflow.note.content``)."""
        self.set_tags({DESCRIPTION_TAG: text[:5000]})

    def set_tags(self, tags: dict):
        from mlflow.entities import RunTag

        if OWNER_TAG not in tags:
            self.fence()
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics: dict, step: int, flush: bool = False):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is None:
                continue
            v = float(v)
            if v != v or v in (float("inf"), float("-inf")):
                continue  # MLflow stores NaN poorly; absent means undefined
            if (k, int(step)) in self._seen:
                continue  # logged already (a resumed run repeats its last steps): once per step
            self._seen.add((k, int(step)))
            self._pending.append(Metric(k, v, ts, int(step)))
        if flush:
            self.flush()
        elif len(self._pending) > 500 or time.monotonic() - self._last_flush > 5:
            self.flush(block=False)

    def flush(self, block: bool = True):
        """Deliver the buffered metrics. With ``block=False`` (the periodic flush) a store that is
        away keeps them buffered and the run goes on; they are retried at the next flush, and the
        run fails once the store has been away for ``max_wait`` seconds."""
        while self._pending:
            batch = self._pending[:1000]
            try:
                self.fence(max_wait=None if block else 0)
                self.client.call("log_batch", self.run_id, metrics=batch, max_wait=None if block else 0)
            except TrackingUnavailable:
                if block:
                    raise
                now = time.monotonic()
                self._away_since = getattr(self, "_away_since", None) or now
                if now - self._away_since > self.client.max_wait:
                    raise TrackingUnavailable(
                        f"the MLflow tracking store {self.uri} has not answered for {now - self._away_since:.0f} s; "
                        f"{len(self._pending)} metric values are undelivered; fix: start or repair the tracking "
                        f"server, or raise tracking.max_wait"
                    ) from None
                self._last_flush = now
                return
            self._pending = self._pending[1000:]
            self._away_since = None
        self._last_flush = time.monotonic()

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None):
        self.fence()
        self.client.log_artifact(self.run_id, str(local_path), artifact_path)

    def log_text(self, text: str, artifact_file: str):
        self.fence()
        self.client.log_text(self.run_id, text, artifact_file)

    def log_dict(self, d: dict, artifact_file: str):
        """``d`` as strict JSON (no NaN or infinity: :func:`finite_json`)."""
        text = json.dumps(finite_json(d), indent=2, sort_keys=True, default=str, allow_nan=False)
        self.fence()
        self.client.log_text(self.run_id, text, artifact_file)

    def log_figure(self, fig, artifact_file: str):
        self.fence()
        self.client.log_figure(self.run_id, fig, artifact_file)

    def list_artifacts(self, path: str | None = None) -> list[str]:
        return [a.path for a in self.client.list_artifacts(self.run_id, path)]

    def download(self, artifact_path: str) -> Path:
        d = tempfile.mkdtemp(prefix="pgmflow-")
        return Path(self.client.download_artifacts(self.run_id, artifact_path, d))

    def read_text(self, artifact_path: str) -> str:
        return self.download(artifact_path).read_text()


class QuietTracker:
    """A run's tracker for work whose per-step metrics are not logged (an optimiser restart): metrics
    are dropped, everything else goes to ``tracker``. ``run_id`` carries ``tag`` so that task keys
    built from it (``RunContext.token``) differ from the main fit's."""

    def __init__(self, tracker, tag: str):
        self._tracker, self._tag = tracker, str(tag)

    @property
    def run_id(self) -> str:
        return f"{self._tracker.run_id[: 12 - len(self._tag)]}{self._tag}"

    def log_metrics(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return getattr(self._tracker, name)
