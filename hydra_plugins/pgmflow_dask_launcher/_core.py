"""The body of ``DaskLauncher.launch`` (imported only when a sweep starts)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf, open_dict

log = logging.getLogger(__name__)


class JobFailed(CompactHydraException):
    """A sweep job's error, as one line (what Hydra prints if a sweeper re-raises it)."""


def job_failure(ret) -> BaseException | None:
    """The exception a failed Hydra ``JobReturn`` holds, through its public ``return_value`` (which raises
    it, after writing a line of its own to stderr: kept out of the sweep's output)."""
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            ret.return_value  # noqa: B018 - the property raises the job's exception
        except BaseException as exc:  # noqa: BLE001 - whatever the job raised is its failure
            return exc
    return None


def _one_line(text: str, limit: int = 2000) -> str:
    return " ".join(str(text).split())[:limit]


# Job runners: Python processes, each running one job at a time, kept by the Dask worker process
# that started them and reused for its later jobs (a job pays Python's, MLflow's and numba's
# start-up once per runner, not once per job). Hydra's global state is restored for each job.
_IDLE_RUNNERS: list = []
_RUNNERS_LOCK = threading.Lock()


class _Runner:
    """One job-runner process (``python -m hydra_plugins.pgmflow_dask_launcher._job``), spoken to
    over its stdin and stdout with length-prefixed pickles. Started with subprocess, because Dask's
    worker processes are daemonic and multiprocessing refuses them children."""

    def __init__(self):
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hydra_plugins.pgmflow_dask_launcher._job", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, payload: bytes, env: dict, timeout: float | None) -> tuple:
        import select
        import struct

        msg = pickle.dumps((payload, env))
        self.proc.stdin.write(struct.pack("<Q", len(msg)) + msg)
        self.proc.stdin.flush()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        fd = self.proc.stdout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], 1.0 if left is None else min(left, 1.0))
            if ready:
                break
            if self.proc.poll() is not None:
                raise EOFError(f"exit code {self.proc.returncode}")
        head = fd.read(8)
        if len(head) < 8:
            raise EOFError(f"exit code {self.proc.wait()}")
        (n,) = struct.unpack("<Q", head)
        body = fd.read(n)
        if len(body) < n:
            raise EOFError(f"exit code {self.proc.wait()}")
        return pickle.loads(body)

    def kill(self):
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=5)


def _take_runner() -> _Runner:
    with _RUNNERS_LOCK:
        while _IDLE_RUNNERS:
            r = _IDLE_RUNNERS.pop()
            if r.alive():
                return r
    return _Runner()


def _give_back(runner: _Runner):
    with _RUNNERS_LOCK:
        _IDLE_RUNNERS.append(runner)


def run_job_task(payload: bytes, env: dict, timeout: float | None) -> tuple:
    """A Dask task: run one Hydra job in a job-runner process; returns (result pickle or None,
    exit code, the job's output).

    The task secedes from the worker's thread pool while the job runs, so the job's own tasks can
    use every worker slot, and rejoins before returning.
    """
    from distributed import get_worker, rejoin, secede

    env = dict(env)
    with contextlib.suppress(Exception):
        env["PGMFLOW_SWEEP_SCHEDULER"] = get_worker().scheduler.address
    secede()
    try:
        for attempt in (1, 2):
            runner = _take_runner()
            try:
                result = runner.run(payload, env, timeout)
            except TimeoutError:
                runner.kill()
                return None, -1, f"job timed out after {timeout} s (hydra.launcher.job_timeout)"
            except (EOFError, OSError) as exc:  # the runner died (killed, out of memory)
                runner.kill()
                if attempt == 2:
                    return None, -9, f"the job's process died ({exc})"
                continue
            _give_back(runner)
            return result
    finally:
        rejoin()


def _resolved_task_config(job_cfg) -> dict:
    """The job's config as its task function will see it: resolved, without the hydra node."""
    from hydra.core.hydra_config import HydraConfig

    from pgmflow.core.config import resolved

    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(job_cfg)  # for ${hydra:...} interpolations
    try:
        return resolved(job_cfg)
    finally:
        HydraConfig.instance().cfg = saved


def _failed(overrides, cfg, hydra_cfg, message: str) -> JobReturn:
    ret = JobReturn(
        overrides=list(overrides), cfg=cfg, hydra_cfg=hydra_cfg, working_dir=os.getcwd(), task_name="pgmflow"
    )
    ret.status = JobStatus.FAILED
    ret.return_value = JobFailed(message)
    return ret


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    import cloudpickle

    from pgmflow.core import stagekey, tracking
    from pgmflow.core import sweep as sweep_mod

    setup_globals()
    config = launcher.config
    ctx = launcher.hydra_context
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)

    cluster_cfg = OmegaConf.to_container(config.cluster, resolve=True)
    tracking_cfg = OmegaConf.to_container(config.tracking, resolve=True)
    tracking_cfg["uri"] = tracking._absolute_uri(tracking_cfg["uri"])
    task_overrides = list(OmegaConf.to_container(config.hydra.overrides.task))
    sweeper = OmegaConf.to_container(config.hydra.sweeper, resolve=False)
    sweeper.pop("_target_", None)
    from pgmflow.core.errors import EXIT_BAD_INPUT, ConfigError

    try:
        session = sweep_mod.open_session(
            cluster_cfg, tracking_cfg, task_overrides, sweeper, resume=bool(getattr(launcher, "resume", True))
        )
    except ConfigError as exc:  # refused before any job: one line, exit code 2
        import sys

        print(f"pgmflow: error: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_BAD_INPUT) from None
    if cluster_cfg.get("profile") == "synchronous":
        raise JobFailed(
            "hydra/launcher=dask needs a Dask cluster, not cluster.profile=synchronous; fix: pick "
            "another cluster profile, or run the sweep with hydra/launcher=basic"
        )

    singleton_state = Singleton.get_state()
    returns: dict[int, JobReturn] = {}
    todo = []  # (idx, overrides, run_id, payload, env)
    first_of_hash: dict[str, int] = {}
    same_as: dict[int, int] = {}
    for i, overrides in enumerate(job_overrides):
        idx = initial_job_idx + i
        overrides = list(overrides)
        shown = list(filter_overrides(overrides))
        row = sweep_mod.JobRow(job=idx, overrides=shown)
        try:
            job_cfg = ctx.config_loader.load_sweep_config(config, overrides)
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = f"{job_cfg.hydra.job.name}_{idx}"
                job_cfg.hydra.job.num = idx
            resolved_cfg = _resolved_task_config(job_cfg)
            h = stagekey.job_key(resolved_cfg)
            reuse = (resolved_cfg.get("cache") or {}).get("mode", "auto") in ("auto", "readonly")
            error = None
        except Exception as exc:
            reuse = True
            job_cfg, h = None, "overrides-" + hashlib.sha256(" ".join(overrides).encode()).hexdigest()[:16]
            error = _one_line(f"the job's config cannot be composed: {exc}")
        row.config_hash = h
        if h in first_of_hash:  # the same resolved config twice in one batch: run it once
            same_as[idx] = first_of_hash[h]
            row.run_id = session.rows[first_of_hash[h]].run_id if first_of_hash[h] in session.rows else None
            session.record(row)
            continue
        first_of_hash[h] = idx
        run_id, finished, objective = session.child_run(idx, shown, h, reuse=reuse)
        row.run_id = run_id
        if finished:
            row.status, row.objective = "SKIPPED", objective
            log.info(f"\t#{idx} : {' '.join(shown)} (FINISHED before in run {run_id}; skipped)")
            ret = JobReturn(overrides=overrides, cfg=None, hydra_cfg=None, working_dir=os.getcwd(), task_name="pgmflow")
            ret.status = JobStatus.COMPLETED
            ret.return_value = objective
            returns[idx] = ret
        elif error is not None:
            row.status, row.error = "FAILED", error
            session.fail_child(run_id, error)
            returns[idx] = _failed(overrides, None, None, f"job {idx} ({' '.join(shown)}): {error}")
        else:
            log.info(f"\t#{idx} : {' '.join(shown)}")
            payload = cloudpickle.dumps(
                {
                    "idx": idx,
                    "overrides": overrides,
                    "hydra_context": ctx,
                    "config": config,
                    "task_function": launcher.task_function,
                    "singleton_state": singleton_state,
                }
            )
            env = {
                "PGMFLOW_SWEEP_JOB": "1",
                "PGMFLOW_SWEEP_RUN_ID": run_id,
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                "PGMFLOW_SWEEP_PARENT_ID": session.parent_id,
                "PGMFLOW_ORIG_CWD": os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd()),
                "PGMFLOW_TRACKING_URI": tracking_cfg["uri"],
                tracking.ATTEMPT_ENV: tracking.attempt_id(),  # the job's claims name this launcher's attempt
            }
            todo.append((idx, overrides, run_id, payload, env))
        session.record(row)

    try:
        if todo:
            _run_jobs(launcher, session, todo, returns)
        session.tracker.fence()
    except tracking.Superseded as exc:  # a newer attempt of this sweep (a requeued batch job) owns it now
        import sys

        print(f"pgmflow: superseded: {exc}", file=sys.stderr, flush=True)
        sweep_mod.drop_session()
        raise SystemExit(1) from None
    for idx, first in same_as.items():
        src = returns[first]
        session.rows[idx].status = session.rows[first].status
        session.rows[idx].objective = session.rows[first].objective
        session.rows[idx].run_id = session.rows[first].run_id
        returns[idx] = src
    with _quiet():
        session.write_summary()
    return [returns[initial_job_idx + i] for i in range(len(job_overrides))]


def _run_jobs(launcher, session, todo, returns):
    """Run the jobs of ``todo`` on the sweep's cluster: at most ``max_concurrent_jobs`` at once, or
    (null) one per worker that has joined, counted again whenever a job finishes and every 2 s, so a
    worker that joins late (a SLURM job that started late, an adaptive cluster that grew) takes jobs.
    An adaptive cluster is told how many jobs are waiting (``ClusterHandle.want``)."""
    from distributed import wait

    cluster = session.open_cluster()
    client = cluster.client
    want = getattr(cluster, "want", None)
    pending = list(reversed(todo))
    running = {}  # future -> job
    state = {"limit": None}

    def submit_next():
        session.tracker.fence()  # no job is started for a sweep that another attempt has taken over
        idx, overrides, run_id, payload, env = item = pending.pop()
        fut = client.submit(
            run_job_task,
            payload,
            env,
            launcher.job_timeout,
            pure=False,
            key=f"pgmflow-sweep-job-{session.parent_id[:8]}-{idx}-{time.monotonic_ns()}",
        )
        running[fut] = item
        session.rows[idx].status = "RUNNING"
        session.rows[idx].seconds = time.monotonic()
        session.rows[idx].started = time.time()

    def fill():
        if want is not None:
            with _quiet():
                want(len(running) + len(pending))
        limit = int(launcher.max_concurrent_jobs or max(len(client.nthreads()), 1))
        if limit != state["limit"]:
            how = "max_concurrent_jobs" if launcher.max_concurrent_jobs else "one per joined worker"
            log.info(
                f"Dask launcher: {len(pending) + len(running)} jobs to run, at most {limit} at once ({how}), "
                f"on {cluster.profile}"
            )
            state["limit"] = limit
        while pending and len(running) < limit:
            submit_next()

    fill()
    while running:
        try:
            done, _ = wait(list(running), timeout=2, return_when="FIRST_COMPLETED")
        except TimeoutError:
            done = ()
        for fut in done:
            _finished(session, fut, running.pop(fut), returns)
        fill()


def _finished(session, fut, item, returns):
    """Record one finished job (its future ``fut``): its row, its child run, its JobReturn."""
    idx, overrides, run_id, _, _ = item
    row = session.rows[idx]
    row.seconds = time.monotonic() - row.seconds
    row.finished = time.time()
    try:
        blob, code, output = fut.result()
        session.log_job_output(run_id, output)
        if blob is None:
            tail = _one_line(output[-1500:]) or "no output"
            raise RuntimeError(f"the job's process exited with code {code} before reporting: {tail}")
        ret = pickle.loads(blob)
    except Exception as exc:  # KilledWorker, a crashed job process, a lost connection
        message = _one_line(f"{type(exc).__name__}: {exc}")
        with _quiet():
            session.fail_child(run_id, message)
        ret = _failed(overrides, None, None, f"job {idx} ({' '.join(row.overrides)}): {message}")
    if ret.status == JobStatus.COMPLETED:
        row.status = "FINISHED"
        value = ret.return_value
        row.objective = float(value) if isinstance(value, (int, float)) else None
    else:
        row.status = "FAILED"
        row.error = _one_line(str(job_failure(ret)))
        with _quiet():
            session.fail_child(run_id, row.error)  # no-op when the job ended its run itself
    returns[idx] = ret
    log.info(f"\t#{idx} {row.status}" + (f": {row.error[:200]}" if row.error else ""))


class _quiet:
    """Swallow tracking errors in bookkeeping that must not stop the sweep."""

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is not None and not isinstance(ev, Exception):
            return False
        if ev is not None:
            log.warning(f"sweep bookkeeping: {type(ev).__name__}: {_one_line(str(ev), 300)}")
        return True
