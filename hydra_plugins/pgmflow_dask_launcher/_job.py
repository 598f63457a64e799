"""The job-runner process: ``python -m hydra_plugins.pgmflow_dask_launcher._job PARENT_PID``.

It reads (payload, env) requests from stdin and writes (result, code, output) replies to stdout,
each a length-prefixed pickle, one job at a time, until stdin closes or the worker process that
started it (PARENT_PID) is gone. See ``_core.run_job_task``.

The payload holds what the launching process knew (Hydra's Singleton state, the sweep config, the
job's overrides and index, the task function). Hydra's state is restored as the joblib and Ray
launchers restore it (``Singleton.set_state``, ``load_sweep_config``, ``run_job``); the job's
environment variables are set for the job and put back after it; everything the job writes to
stdout and stderr (file descriptors 1 and 2) is captured and returned with its ``JobReturn``.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile


def _run(payload: bytes):
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
    from omegaconf import open_dict

    from hydra_plugins.pgmflow_dask_launcher._core import JobFailed, _one_line, job_failure

    p = pickle.loads(payload)
    setup_globals()
    Singleton.set_state(p["singleton_state"])
    ctx, idx = p["hydra_context"], p["idx"]
    try:
        sweep_config = ctx.config_loader.load_sweep_config(p["config"], list(p["overrides"]))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        ret = run_job(
            hydra_context=ctx,
            config=sweep_config,
            task_function=p["task_function"],
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    except BaseException as exc:  # SystemExit from a task function that exits, for instance
        ret = JobReturn(overrides=list(p["overrides"]), task_name="pgmflow")
        ret.status = JobStatus.FAILED
        ret.return_value = exc
    if ret.status == JobStatus.FAILED:
        exc = job_failure(ret)
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        ret.return_value = JobFailed(_one_line(message))
    return ret


def apply_env(target: dict) -> None:
    """Make os.environ equal ``target``, writing only the variables that differ: the runner serves one job after
    another, and a job's threads may outlive it, so every putenv/unsetenv is a chance to race glibc's getenv in
    one of them (docs/reliability.md, "The process environment"). ``clear()`` then ``update()`` wrote all of them."""
    for k in [k for k in os.environ if k not in target]:
        del os.environ[k]
    for k, v in target.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


def run_payload(payload: bytes, env: dict) -> tuple:
    """Run one job here: returns (pickled JobReturn or None, 0 or -1, captured output)."""
    import cloudpickle

    saved_env = dict(os.environ)
    cwd = os.getcwd()
    apply_env({**saved_env, **{k: str(v) for k, v in env.items()}})
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    blob, code = None, 0
    with tempfile.TemporaryFile(mode="w+b") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            blob = cloudpickle.dumps(_run(payload))
        except BaseException as exc:  # pragma: no cover - a failure outside run_job
            print(f"pgmflow job runner: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = -1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            os.chdir(cwd)
            apply_env(saved_env)
        out.seek(0)
        output = out.read().decode(errors="replace")
    return blob, code, output


def serve(parent_pid: int) -> int:  # pragma: no cover - runs in the runner process
    import struct
    import threading
    import time

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="pgmflow-runner-watchdog").start()
    inp = sys.stdin.buffer
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints between jobs must not corrupt the replies
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return 0
        (n,) = struct.unpack("<Q", head)
        payload, env = pickle.loads(inp.read(n))
        msg = pickle.dumps(run_payload(payload, env))
        reply.write(struct.pack("<Q", len(msg)) + msg)
        reply.flush()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
