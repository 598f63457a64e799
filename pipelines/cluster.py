"""Open the Dask cluster that ``dask_cluster.yaml`` names.

``open_cluster(cluster_cfg)`` is a context manager yielding a :class:`ClusterHandle`: a
``distributed.Client`` (or None for the synchronous scheduler), the profile, the worker count.
Optional extras (dask-jobqueue, dask-kubernetes, dask-cuda) are imported only for their profile; a
missing extra or an unreachable scheduler is a :class:`ConfigError` (one line, exit code 2).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipelines.errors import ConfigError

TYPES = ("local", "address", "slurm", "pbs", "kubernetes", "local_cuda", "synchronous")
EXTRAS = {"slurm": ("dask_jobqueue", "slurm"), "pbs": ("dask_jobqueue", "pbs"),
          "kubernetes": ("dask_kubernetes", "kubernetes"), "local_cuda": ("dask_cuda", "gpu")}
PACKAGED_FILE = Path(__file__).resolve().parent.parent / "dask_cluster.yaml"
# Used when no dask_cluster.yaml exists (an installed pgmflow run outside the source tree).
BUILTIN_PROFILES = {"local": {"type": "local", "n_workers": None, "threads_per_worker": 1},
                    "address": {"type": "address", "address": "tcp://127.0.0.1:8786", "timeout": 10},
                    "synchronous": {"type": "synchronous"}}


@dataclass
class ClusterHandle:
    """client: distributed.Client or None (synchronous); profile; type; n_workers; address."""

    client: object
    profile: str
    type: str
    n_workers: int
    address: str | None = None


def _resolve_file(path: str) -> Path:
    p = Path(os.path.expanduser(str(path)))
    if not p.is_absolute():
        cwd = Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd()))
        p = cwd / p
    if not p.exists() and str(path) == "dask_cluster.yaml" and PACKAGED_FILE.exists():
        return PACKAGED_FILE
    return p


def load_profiles(path: str) -> tuple[Path, dict]:
    """Parse a cluster file; every problem is a ConfigError naming cluster.file."""
    p = _resolve_file(path)
    if not p.exists() and str(path) == "dask_cluster.yaml":
        return Path("<built-in>"), {k: dict(v) for k, v in BUILTIN_PROFILES.items()}
    if not p.exists():
        raise ConfigError("cluster.file", str(path), f"file not found (looked at {p})",
                          "point cluster.file at a dask_cluster.yaml or remove the override")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise ConfigError("cluster.file", str(p), f"is not valid YAML{where}",
                          "fix the YAML syntax (indentation, colons, quotes)") from None
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), dict) or not data["profiles"]:
        raise ConfigError("cluster.file", str(p), "has no 'profiles:' mapping",
                          "start the file with 'profiles:' and one entry per profile, each with a 'type'")
    for name, prof in data["profiles"].items():
        if not isinstance(prof, dict) or prof.get("type") not in TYPES:
            t = prof.get("type") if isinstance(prof, dict) else prof
            raise ConfigError(f"cluster.file:profiles.{name}.type", t, f"unknown cluster type in {p.name}",
                              f"use one of {', '.join(TYPES)}")
    return p, data["profiles"]


def check_cluster_config(ccfg: dict) -> dict:
    """Validate the cluster section; returns the selected profile (dict)."""
    path, profiles = load_profiles(ccfg.get("file") or "dask_cluster.yaml")
    name = ccfg.get("profile") or "local"
    if name not in profiles:
        raise ConfigError("cluster.profile", name, f"no such profile in {path}",
                          f"use one of {', '.join(profiles)} or add it to the file")
    n = ccfg.get("n_workers")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError("cluster.n_workers", n, "must be a positive integer or null",
                          "set cluster.n_workers=null (one per core) or e.g. cluster.n_workers=2")
    prof = dict(profiles[name])
    extra = EXTRAS.get(prof["type"])
    if extra and importlib.util.find_spec(extra[0]) is None:
        raise ConfigError("cluster.profile", name, f"needs the optional package {extra[0].replace('_', '-')}, "
                          "which is not installed", f"pip install 'pgmflow[{extra[1]}]'")
    return prof


def _quiet_logs():
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.worker",
                 "distributed.core", "distributed.batched", "distributed.http.proxy", "bokeh", "tornado"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def open_cluster(ccfg: dict):
    """Yield a ClusterHandle for the configured profile; closes what it started."""
    prof = check_cluster_config(ccfg)
    name = ccfg.get("profile") or "local"
    kind = prof.pop("type")
    n_override = ccfg.get("n_workers")
    if kind == "synchronous":
        yield ClusterHandle(client=None, profile=name, type=kind, n_workers=1)
        return

    _quiet_logs()
    from distributed import Client

    with contextlib.ExitStack() as stack:
        cluster = None
        if kind == "local":
            from distributed import LocalCluster

            n = n_override or prof.pop("n_workers", None) or os.cpu_count() or 1
            prof.pop("n_workers", None)
            tpw = prof.pop("threads_per_worker", 1) or 1
            env = {"NUMBA_NUM_THREADS": str(tpw), "OMP_NUM_THREADS": str(tpw), "MKL_NUM_THREADS": str(tpw),
                   "OPENBLAS_NUM_THREADS": str(tpw)}
            cwd = os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd())
            env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
            cluster = stack.enter_context(LocalCluster(n_workers=int(n), threads_per_worker=int(tpw), processes=True,
                                                       silence_logs=logging.ERROR, env=env, **prof))
            client = stack.enter_context(Client(cluster))
        elif kind == "address":
            address = ccfg.get("address") or prof.get("address")
            timeout = prof.get("timeout", 10)
            try:
                client = stack.enter_context(Client(address, timeout=timeout))
            except (OSError, TimeoutError) as exc:
                raise ConfigError("cluster.address", address, f"no Dask scheduler answered within {timeout} s "
                                  f"({type(exc).__name__})", "start one with `dask scheduler` and `dask worker "
                                  "<address>`, or set cluster.address=tcp://HOST:PORT") from None
        elif kind in ("slurm", "pbs"):
            import dask_jobqueue

            n_jobs = n_override or prof.pop("n_jobs", 1)
            prof.pop("n_jobs", None)
            wait_n = prof.pop("wait_for_workers", 1)
            wait_t = prof.pop("wait_timeout", 600)
            cls = dask_jobqueue.SLURMCluster if kind == "slurm" else dask_jobqueue.PBSCluster
            cluster = stack.enter_context(cls(**{k: v for k, v in prof.items() if v is not None}))
            cluster.scale(jobs=int(n_jobs))
            client = stack.enter_context(Client(cluster))
            client.wait_for_workers(int(wait_n), timeout=wait_t)
        elif kind == "kubernetes":
            from dask_kubernetes.operator import KubeCluster

            wait_t = prof.pop("wait_timeout", 600)
            if n_override:
                prof["n_workers"] = n_override
            cluster = stack.enter_context(KubeCluster(**prof))
            client = stack.enter_context(Client(cluster))
            client.wait_for_workers(1, timeout=wait_t)
        elif kind == "local_cuda":
            from dask_cuda import LocalCUDACluster

            cluster = stack.enter_context(LocalCUDACluster(**{k: v for k, v in prof.items() if v is not None}))
            client = stack.enter_context(Client(cluster))
        else:  # pragma: no cover - TYPES is checked above
            raise ConfigError("cluster.profile", name, f"unknown type {kind}", f"use one of {', '.join(TYPES)}")
        n_workers = len(client.scheduler_info().get("workers", {}))
        yield ClusterHandle(client=client, profile=name, type=kind, n_workers=max(n_workers, 1),
                            address=getattr(client.scheduler, "address", None))
