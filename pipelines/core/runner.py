"""The one-way flow of a run (docs/architecture.md):

conf -> preflight_checks(cfg) -> plan -> open cluster -> start MLflow run -> run(ctx, plan): graph ->
tasks on workers -> ordered reduce -> metrics, figures, checkpoints -> end run.

The config dict is read once, by the workload's ``validate`` (called from the preflight checks), which
returns the run's plan; the runner hands that plan to the workload's ``run``. ``RunContext.cfg`` stays
for the core's own sections (tracking, progress) and for recording the config with the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field

from pgmflow.core import registry
from pgmflow.core.errors import ConfigError
from pgmflow.core.graph import Executor

# Fields a resumed run may change: where and how it runs, not what it computes.
RESUME_MAY_CHANGE = ("cluster", "progress", "verbose", "tracking", "backend", "resume", "cache")


@dataclass
class RunContext:
    """What a workload's ``run`` receives: the config, the tracker, the cluster, the backend, and the
    stream every line for the user goes to (:meth:`say`)."""

    cfg: dict
    tracker: object
    cluster: object
    executor: Executor
    backend: str
    device: str
    resumed: bool
    stream: object = field(default=None)
    summary: list = field(default_factory=list)  # the lines said with summary=True: the run's description

    @property
    def progress(self) -> bool:
        return bool(self.cfg.get("progress", True))

    @property
    def token(self) -> str:
        """The run's short token in task keys."""
        return self.tracker.run_id[:12]

    def say(self, text: str, prefix: str = "pgmflow: ", summary: bool = False):
        """Print a line (or lines) for the user on the run's stream. ``summary=True`` marks the run's
        closing summary: those lines, as printed (less the ``pgmflow: `` they start with), become the
        run's description on its MLflow page."""
        print(f"{prefix}{text}", file=self.stream if self.stream is not None else sys.stdout, flush=True)
        if summary:
            line = f"{prefix}{text}"
            self.summary.append(line[len("pgmflow: ") :] if line.startswith("pgmflow: ") else line)


def load_recorded_config(cfg: dict) -> dict:
    """For ``resume=<run id>``: the run's recorded config, with where/how-to-run fields from ``cfg``."""
    run_id = cfg["resume"]
    tr = _tracker(cfg)
    try:
        tr.client.get_run(run_id)
    except Exception:
        raise ConfigError(
            "resume",
            run_id,
            f"no such MLflow run in {tr.uri}",
            "pass the run id printed by the interrupted run (and the same tracking.uri)",
        ) from None
    tr.run_id = run_id
    status = tr.client.get_run(run_id).info.status
    if status == "FINISHED":
        raise ConfigError(
            "resume",
            run_id,
            "this run already finished; there is nothing to continue",
            "start a new run (drop resume=...)",
        )
    try:
        import yaml

        recorded = yaml.safe_load(tr.read_text("config.yaml"))
    except Exception:
        raise ConfigError("resume", run_id, "the run has no recorded config.yaml", "start a new run instead") from None
    for key in RESUME_MAY_CHANGE:
        if key in cfg:
            recorded[key] = cfg[key]
    return recorded


# Set by the sweep launcher (hydra_plugins/pgmflow_dask_launcher) in each job's process.
SWEEP_RUN_ID = "PGMFLOW_SWEEP_RUN_ID"  # the child run, created by the launching process, to log into
SWEEP_SCHEDULER = "PGMFLOW_SWEEP_SCHEDULER"  # the sweep's cluster: the job's own tasks go there


def _tracker(cfg: dict):
    from pgmflow.core import tracking

    tcfg = cfg["tracking"]
    return tracking.Tracker(
        tcfg["uri"],
        tcfg["experiment"],
        tcfg.get("artifact_location"),
        max_wait=tcfg.get("max_wait", tracking.DEFAULT_MAX_WAIT),
    )


@contextlib.contextmanager
def _sweep_cluster(ccfg: dict, address: str):
    """A sweep job's cluster: the scheduler its launcher opened (no new cluster per job)."""
    from distributed import Client

    from pgmflow.core import cluster as cluster_mod

    security = None
    make_security = getattr(cluster_mod, "security_for", None)
    if make_security is not None:
        security = make_security(ccfg)
    kwargs = {"security": security} if security is not None else {}
    with Client(address, timeout=30, **kwargs) as client:
        n = len(client.scheduler_info().get("workers", {}))
        yield cluster_mod.ClusterHandle(
            client=client,
            profile=f"sweep:{ccfg.get('profile') or 'local'}",
            type="sweep",
            n_workers=max(n, 1),
            address=address,
        )


@dataclass
class RunRecord:
    """What the caller of :func:`execute` may want to know after a failure: the MLflow run that was started
    (None when the config was refused before one was), and whether it was ended (FAILED or KILLED)."""

    run_id: str | None = None
    ended: bool = False


def execute(cfg: dict, stream=None, cluster=None, record: RunRecord | None = None, under: dict | None = None) -> dict:
    """Run one experiment from a resolved config (plain dict). Returns the pipeline's result dict.

    ``cluster``: a :class:`~pgmflow.core.cluster.ClusterHandle` over a client the caller owns (the
    Python API's ``cluster=client``); None opens the config's profile.

    In a sweep job (``PGMFLOW_SWEEP_RUN_ID`` set by the launcher) the run already exists: it is
    taken over, and ends FAILED with the message if the config is refused before any task runs.

    ``record``: filled in as the run goes (its run id once started, whether it was ended), for a caller that
    reports a failure with the run's id (the Python API).

    ``under``: more tags for a new run, and its name under ``"run_name"`` (a study's stage: the parent run's
    id in ``mlflow.parentRunId``, the stage's name; docs/stages.md).
    """
    from pgmflow.core import tracking

    tcfg = cfg.get("tracking")  # checked later (exit 2 on a bad value); the environment first, before any thread
    tracking.prepare_process(tcfg.get("uri") if isinstance(tcfg, dict) else None)
    if cfg.get("stages") and not under:  # a study: its stages run through here, each with its parent in `under`
        from pgmflow.core.study import run_study

        return run_study(cfg, sys.modules[__name__], stream=stream, cluster=cluster)
    sweep_run = None if under else os.environ.get(SWEEP_RUN_ID)  # a study's stage is never the sweep's run
    stream = sys.stdout if stream is None else stream  # looked up per call (tests swap sys.stdout)
    record = RunRecord() if record is None else record
    try:
        return _execute(cfg, stream, sweep_run, cluster, record, dict(under or {}))
    except BaseException as exc:
        from pgmflow.core.tracking import Superseded

        if isinstance(exc, Superseded):  # the run is another attempt's now: neither end it nor write to it
            raise
        if sweep_run and not record.ended:
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                tr = _tracker(cfg)
                tr.run_id = sweep_run
                # the child or the sweep is another attempt's now: its run is not this job's to end
                if not _another_attempts(tr, sweep_run, os.environ.get("PGMFLOW_SWEEP_PARENT_ID")):
                    tr.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED", message)
        raise


def _where(cfg: dict, plan, given, address: str | None):
    """Where the run's tasks go: ``(context manager yielding a ClusterHandle, the in-process line or None)``.
    A cluster given by the caller (a study), a sweep's scheduler, this process for small work on a local
    profile (:mod:`pgmflow.core.smallwork`), else the configured profile's cluster."""
    from pgmflow.core import cluster as cluster_mod
    from pgmflow.core import smallwork

    if given is not None:
        return contextlib.nullcontext(given), None
    if address:
        return _sweep_cluster(cfg["cluster"], address), None
    small = smallwork.in_process_reason(cfg, plan, cluster_mod.check_cluster_config(cfg["cluster"])["type"])
    if small:
        return contextlib.nullcontext(cluster_mod.in_process_handle(cfg["cluster"])), small
    return cluster_mod.open_cluster(cfg["cluster"]), None


def _pin_worker_blas(client, threads):
    """Register the worker plugin that pins the workers' BLAS threads (tasks/threads.py), when configured."""
    if threads.configured_threads() is not None:
        from pgmflow.core.worker_plugin import PinBlasThreads

        client.register_plugin(PinBlasThreads(threads.configured_threads()), name=PinBlasThreads.name)


def _another_attempts(tr, run_id: str, parent_id: str | None) -> bool:
    """Whether another attempt (docs/reliability.md) has claimed the sweep job's child run or its sweep."""
    from pgmflow.core.tracking import LAUNCH_TAG, attempt_id

    for rid in (run_id, parent_id):
        if rid and tr.client.get_run(rid).data.tags.get(LAUNCH_TAG) not in (None, attempt_id()):
            return True
    return False


def _execute(cfg: dict, stream, sweep_run: str | None, given, record: RunRecord, under: dict) -> dict:
    from pgmflow.core import batchjob, preflight, stagekey, tracking
    from pgmflow.tasks import backend as backend_mod
    from pgmflow.tasks import threads

    if not (cfg.get("resume") or sweep_run):  # a requeued SLURM job continues its earlier attempt's run
        cfg = batchjob.resume_requeued(cfg, lambda c: stagekey.for_run(c)[0], _tracker, stream)
    if cfg.get("resume"):
        cfg = load_recorded_config(cfg)
    plan = preflight.preflight_checks(cfg)
    key, material = stagekey.for_run(cfg)
    backend = backend_mod.resolve_backend(cfg["backend"])
    device = backend_mod.gpu_status()[1] if backend == "cupy" else "cpu"

    opened, small = _where(cfg, plan, given, os.environ.get(SWEEP_SCHEDULER) if sweep_run else None)
    with opened as ch:
        if ch.client is not None:
            _pin_worker_blas(ch.client, threads)
        tcfg = cfg["tracking"]
        tracker = _tracker(cfg)
        tags = {
            "pgmflow.pipeline": cfg["pipeline"]["name"],
            "pgmflow.model": cfg.get("model", {}).get("name"),
            "pgmflow.backend": backend,
            "pgmflow.device": device,
            "pgmflow.cluster.profile": ch.profile,
            "pgmflow.cluster.type": ch.type,
            "pgmflow.cluster.workers": ch.n_workers,
            **getattr(ch, "tags", {}),
            **tracking.git_info(),
            **tracking.versions(),
            stagekey.KEY_TAG: key,
            **batchjob.tags(key),
        }
        name = under.pop("run_name", None)
        tags.update(under)
        if sweep_run:
            tracker.attach(sweep_run, cfg, tags, parent_id=os.environ.get("PGMFLOW_SWEEP_PARENT_ID"))
        elif cfg.get("resume"):
            tracker.resume(cfg["resume"])
            tracker.set_tags({**tags, "pgmflow.resumed_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        else:
            name = (
                name
                or tcfg.get("run_name")
                or f"{cfg['pipeline']['name']}-{cfg.get('model', {}).get('name')}-{time.strftime('%Y%m%d-%H%M%S')}"
            )
            tracker.start(name, cfg, tags)
        record.run_id = tracker.run_id
        tracker.log_text(stagekey.canonical(material), "stage_key.json")
        gpu_note = (
            f" on {device}"
            if backend == "cupy"
            else (f" (auto: {backend_mod.gpu_status()[1]})" if cfg["backend"] == "auto" else "")
        )
        print(
            f"pgmflow: {cfg['pipeline']['name']} run {tracker.run_id} on {ch.profile} ({ch.n_workers} worker"
            f"{'s' if ch.n_workers != 1 else ''}), backend {backend}{gpu_note}",
            file=stream,
            flush=True,
        )
        if small:
            print(f"pgmflow: {small}", file=stream, flush=True)
        ctx = RunContext(
            cfg=cfg,
            tracker=tracker,
            cluster=ch,
            executor=Executor(ch.client),
            backend=backend,
            device=device,
            resumed=bool(cfg.get("resume")),
            stream=stream,
        )
        try:
            result = _run_reconnecting(ctx, plan, threads)
            objective = result.get("objective")
            if isinstance(objective, (int, float)) and objective == objective:
                tracker.log_metrics({"objective": objective}, step=0, flush=True)
            if result.get("objective_name"):
                tracker.set_tags(
                    {
                        "pgmflow.objective_name": result["objective_name"],
                        "pgmflow.objective_direction": result.get("objective_direction", "minimize"),
                    }
                )
            if ctx.summary:
                tracker.set_description("\n".join(ctx.summary))
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                status, message = "KILLED", f"interrupted; continue with resume={tracker.run_id}"
            elif isinstance(exc, ConfigError):
                status, message = "FAILED", exc.message
            else:
                status, message = "FAILED", f"{type(exc).__name__}: {exc}"
            detail = None if isinstance(exc, (KeyboardInterrupt, ConfigError)) else _traceback(exc)
            with contextlib.suppress(Exception):
                tracker.end(status, message, detail)
            record.ended = True
            raise
        tracker.end("FINISHED")
        result["run_id"] = tracker.run_id
        print(f"pgmflow: finished. {tracker.ui_hint}", file=stream, flush=True)
        return result


def _traceback(exc: BaseException) -> str:
    """The traceback of an unexpected error, kept in the failed run's ``error.txt`` below its message."""
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


MAX_RECONNECTS = 20  # a run that lost its scheduler this often is not on a network that works: it fails


def _run_reconnecting(ctx: RunContext, plan, threads) -> dict:
    """The workload's ``run``; when the driver loses the scheduler (every pending result cancelled with
    ``scheduler-connection-lost``: the connection was dead for longer than ``comm.timeouts.tcp``), wait up to
    ``cluster.reconnect_limit`` seconds for it, then run the workload again on the reconnected client as a
    resumed run: it starts from the run's own newest checkpoint and submits the same graphs (deterministic keys
    and tasks), so the run ends with the same bits as an undisturbed one, and the tracker logs no metric twice
    at one step. Past the limit, :class:`SchedulerLost`: one line that says how to resume."""
    limit = float((ctx.cfg.get("cluster") or {}).get("reconnect_limit", 600) or 0)
    run = registry.get(ctx.cfg["pipeline"]["name"]).load_run()
    reconnects, made = 0, []
    try:
        while True:
            try:
                if reconnects:  # a scheduler started again has no plugins; registered here, so that a connection
                    # lost again while it registers is one more reconnection
                    _pin_worker_blas(ctx.executor.client, threads)
                # a client opened after a reconnect is made the current one (Dask's default client, which
                # the cluster's own `with Client(...)` had set to the lost one)
                current = made[-1].as_current() if made else contextlib.nullcontext()
                with current, threads.pinned_blas():  # the same bits on any scheduler: tasks/threads.py
                    return run(ctx, plan)
            except Exception as exc:
                client = _reconnect(ctx, exc, limit, reconnects)
                if client is not ctx.executor.client:
                    made.append(client)
                reconnects += 1
                ctx.cluster = dataclasses.replace(ctx.cluster, client=client) if ctx.cluster is not None else None
                ctx.executor = Executor(client)
                ctx.resumed = True
    finally:
        for c in made:
            with contextlib.suppress(Exception):
                c.close()


def _reconnect(ctx: RunContext, exc: Exception, limit: float, reconnects: int):
    """The client to go on with after ``exc``: the scheduler's, once it answers again (within ``limit``
    seconds); raises ``exc`` again when it is not a lost scheduler, :class:`SchedulerLost` past the limit."""
    from pgmflow.core.graph import SchedulerLost, await_scheduler, connection_lost

    client = ctx.executor.client
    if client is None or reconnects >= MAX_RECONNECTS or not connection_lost(exc, client):
        raise
    t0 = time.monotonic()
    ctx.say(f"lost the Dask scheduler ({type(exc).__name__}); waiting up to {limit:.0f} s for it")
    address = getattr(ctx.cluster, "address", None)
    try:
        client = await_scheduler(client, address, limit)
    except SchedulerLost:
        raise SchedulerLost(
            f"the Dask scheduler {address} did not come back within cluster.reconnect_limit={limit:.0f} s; "
            f"fix: start the scheduler and its workers again, then continue with pgmflow "
            f"resume={ctx.tracker.run_id} (the same tracking.uri and cluster settings)"
        ) from exc
    ctx.say(
        f"reconnected to the scheduler after {time.monotonic() - t0:.1f} s; continuing from the run's newest "
        f"checkpoint (reconnect {reconnects + 1})"
    )
    with contextlib.suppress(Exception):
        ctx.tracker.set_tags({"pgmflow.reconnects": reconnects + 1})
    return client
