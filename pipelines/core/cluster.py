"""Open the Dask cluster that ``dask_cluster.yaml`` names.

``open_cluster(cluster_cfg)`` is a context manager yielding a :class:`ClusterHandle`: a
``distributed.Client`` (or None for the synchronous scheduler), the profile, the worker count.
Optional extras (dask-jobqueue, dask-kubernetes, dask-cuda) are imported only for their profile; a
missing extra, an unreachable scheduler, a mistyped profile key or an unusable TLS certificate is a
:class:`ConfigError` (one line, exit code 2).

TLS: a ``tls:`` block in a ``local`` or ``address`` profile (``ca_file``, ``cert``, ``key``,
optional ``require_encryption``) becomes a ``distributed.security.Security``
(:func:`security_for`): a local cluster then listens on ``tls://127.0.0.1`` and every connection
(client, scheduler, workers) presents a certificate signed by ``ca_file``. Relative certificate
paths are taken from the directory of the cluster file.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import logging
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pgmflow.core import smallwork
from pgmflow.core.errors import ConfigError
from pgmflow.core.internals import KilledWorkerLogFilter
from pgmflow.core.tls import check_tls, make_security  # noqa: F401  (check_tls: part of this module's API)

TYPES = ("local", "address", "slurm", "pbs", "kubernetes", "local_cuda", "synchronous")
EXTRAS = {
    "slurm": ("dask_jobqueue", "slurm"),
    "pbs": ("dask_jobqueue", "pbs"),
    "kubernetes": ("dask_kubernetes", "kubernetes"),
    "local_cuda": ("dask_cuda", "gpu"),
}
PACKAGED_FILE = Path(__file__).resolve().parents[2] / "dask_cluster.yaml"
# Used when no dask_cluster.yaml exists (an installed pgmflow run outside the source tree).
BUILTIN_PROFILES = {
    "local": {"type": "local", "n_workers": None, "threads_per_worker": 1, "dashboard_address": "127.0.0.1:8787"},
    "address": {"type": "address", "address": "tcp://127.0.0.1:8786", "timeout": 10},
    "synchronous": {"type": "synchronous"},
}
TLS_TYPES = ("local", "address")
ADDRESS_KEYS = ("type", "address", "timeout", "tls", "dask_config")
SCHEMES = ("tcp://", "tls://", "ucx://", "inproc://", "ws://", "wss://")


@dataclass
class ClusterHandle:
    """client: distributed.Client or None (synchronous); profile; type; n_workers; address."""

    client: object
    profile: str
    type: str
    n_workers: int
    address: str | None = None
    tags: dict = field(default_factory=dict)  # for the MLflow run: SLURM job ids, the resolved options
    want: object = None  # adaptive clusters: want(n) asks for n jobs (a sweep with n jobs waiting)


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
    if not p.is_file():
        problem = f"file not found (looked at {p})" if not p.exists() else f"{p} is not a regular file"
        raise ConfigError(
            "cluster.file", str(path), problem, "point cluster.file at a dask_cluster.yaml or remove the override"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise ConfigError(
            "cluster.file", str(p), f"is not valid YAML{where}", "fix the YAML syntax (indentation, colons, quotes)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            "cluster.file", str(p), f"cannot be read ({type(exc).__name__})", "make it a readable UTF-8 text file"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("profiles"), dict) or not data["profiles"]:
        raise ConfigError(
            "cluster.file",
            str(p),
            "has no 'profiles:' mapping",
            "start the file with 'profiles:' and one entry per profile, each with a 'type'",
        )
    for name, prof in data["profiles"].items():
        if not isinstance(prof, dict) or prof.get("type") not in TYPES:
            t = prof.get("type") if isinstance(prof, dict) else prof
            raise ConfigError(
                f"{p.name}:profiles.{name}.type", t, f"unknown cluster type in {p}", f"use one of {', '.join(TYPES)}"
            )
    return p, data["profiles"]


def _field(path: Path, name: str, key: str) -> str:
    """How an error names a key of a profile: ``<file name>:profiles.<profile>.<key>``."""
    return f"{path.name}:profiles.{name}.{key}"


def _unknown(field_prefix: str, key: str, value, known, listed=None) -> ConfigError:
    near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
    hint = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(map(str, listed or sorted(known)))}"
    return ConfigError(f"{field_prefix}.{key}", value, "unknown key", hint)


def _positive_int_or_null(field: str, v, fix: str):
    if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
        raise ConfigError(field, v, "must be a positive integer or null", fix)


# the usual keys of a local profile; any other option of LocalCluster or its Nanny/Worker is allowed too
LOCAL_KEYS = (
    "type",
    "tls",
    "n_workers",
    "threads_per_worker",
    "memory_limit",
    "dashboard_address",
    "processes",
    "host",
    "protocol",
    "scheduler_port",
    "local_directory",
    "resources",
    "lifetime",
    "env",
    "dask_config",
)


# glibc's malloc in the worker processes of a local cluster. Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536,
# which also freezes the mmap threshold at 128 KiB: every array of 128 KiB or more is a fresh mmap, returned at
# once when freed, and its pages are faulted in again by the next task (a sparse-GP chunk task makes several MiB
# of such temporaries). With both thresholds at 4 MiB, arrays below 4 MiB come from the heap and are reused;
# a worker keeps at most 4 MiB of freed memory that Dask's monitor counts as unmanaged. Larger arrays are still
# mapped and returned as before. A profile's env: may set either variable to something else. Measured effect:
# benchmarks/results/local-cluster-settings-cpu-2core-epyc.md.
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 20)}


@contextlib.contextmanager
def worker_malloc(env: dict | None = None):
    """While worker processes are started in this block, their malloc thresholds are
    :data:`WORKER_MALLOC_ENV` (values in ``env`` win). Dask's nanny applies
    ``distributed.nanny.pre-spawn-environ`` before it starts a worker process, as glibc needs; it
    prefers a value already in this process's environment (a nanny started earlier in the process
    leaves its own there), so the variables are set here too, and left set after the block: glibc reads them
    only when a process starts, so they reach nothing but processes started later, and putting them back would
    edit the environment while the new cluster's threads run (docs/reliability.md, "The process environment").
    A variable that already has its value is not written again."""
    import dask
    import distributed  # noqa: F401  (loads distributed's config defaults, which are kept)

    values = dict(WORKER_MALLOC_ENV)
    values.update({k: str(v) for k, v in (env or {}).items() if k in WORKER_MALLOC_ENV})
    pre = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    pre.update(values)
    for k, v in values.items():
        if os.environ.get(k) != v:
            os.environ[k] = v
    with dask.config.set({"distributed.nanny.pre-spawn-environ": pre}):
        yield


# Dask's periodic housekeeping in a local cluster: the scheduler and the nannies run in this process, the workers
# beside it, all on the cores the tasks use, so every wake-up of an event loop preempts a task thread. With Dask's
# defaults each worker wakes ~200 times a second (the statistical profiler, the loop's health check, the system
# monitor); these values wake it a tenth as often, and the dashboard keeps every page (its profile at a tenth of
# the samples). The memory monitor (each worker, and each nanny in this process, reads the worker's memory from
# /proc every interval) runs every 500 ms: a worker still spills at its target, pauses at 80 % and is restarted at
# 95 % of memory_limit, half a second later at most. Measured effect on the sparse GP's evaluations:
# benchmarks/results/local-cluster-settings-cpu-2core-epyc.md. A value set in the user's own Dask configuration
# (a file, DASK_* variables) is kept; a profile's dask_config: sets any key for its cluster.
LOCAL_DASK_CONFIG = {
    "distributed.worker.profile.interval": "100ms",  # Dask: 10ms
    "distributed.admin.tick.interval": "500ms",  # Dask: 20ms (a blocked loop is still reported after tick.limit, 3s)
    "distributed.admin.system-monitor.interval": "2s",  # Dask: 500ms
    "distributed.worker.memory.monitor-interval": "500ms",  # Dask: 100ms
}


# How long a network fault may last before Dask gives up on a peer, for every profile with a scheduler: the
# client of each (driver, sweep jobs), and the scheduler and workers that pgmflow starts itself (local, slurm,
# pbs). The daemons of an `address` profile are started by someone else: start them with the same values
# (DASK_DISTRIBUTED__... variables, docs/clusters.md). Chosen, not Dask's defaults left as they were:
# - comm.timeouts.tcp (Dask: 30s): an unanswered connection is declared dead after this long (the kernel's
#   TCP_USER_TIMEOUT and keepalive). A partition shorter than it costs nothing; a longer one removes the cut-off
#   worker (its results are recomputed elsewhere) or cuts the driver off (it reconnects: cluster.reconnect_limit).
#   Kept at 30 s: lower makes a busy or briefly congested worker look dead; Dask needs at least 11 s.
# - comm.timeouts.connect (Dask: 30s): how long one attempt to open a connection may take (Dask retries a refused or
#   lost connect within it). 10 s, with the retries below (4 attempts), is still more patience than Dask's 30 s
#   without them, and the network tests' daemons run with it under loss, latency and partitions. At 30 s, a worker
#   that died while its results were being gathered (a checkpoint; a SLURM job cancelled or preempted) held the run
#   up for 4 x 30 s: Dask's gather keeps reconnecting to the gone worker before it recomputes the results elsewhere
#   (tests/slurm/test_slurm.py's scancel test took 88-98 s instead of 12-15 s in 3 runs of 6; at 10 s, 13-16 s in 7
#   runs of 8 and 48 s in one). The driver's own patience with a lost scheduler is cluster.reconnect_limit, not this.
# - scheduler.worker-ttl (Dask: 5 minutes): a worker that sends no heartbeat for this long is removed and its
#   tasks go to the others. A paused (SIGSTOP) or hung worker keeps its TCP connections up, so only this catches
#   it: with 60 s it is removed within 2 x 60 s (the scheduler checks every worker-ttl), not 10 minutes.
# - comm.retry.count (Dask: 0): an RPC that fails on a dropped connection (a lost packet burst, a reset) is
#   tried again 3 times, 1 s to 20 s apart, before the caller sees the error.
# A value from the user's own Dask configuration is kept; a profile's dask_config: wins over both.
NETWORK_DASK_CONFIG = {
    "distributed.comm.timeouts.tcp": "30s",
    "distributed.comm.timeouts.connect": "10s",
    "distributed.scheduler.worker-ttl": "60s",
    "distributed.comm.retry.count": 3,
    "distributed.comm.retry.delay.min": "1s",
    "distributed.comm.retry.delay.max": "20s",
}


@contextlib.contextmanager
def network_timeouts(overrides: dict | None = None):
    """While this block runs (the whole of a run: the client reads the TCP timeout whenever it connects),
    Dask's network settings are :data:`NETWORK_DASK_CONFIG`, except where the user's Dask configuration already
    differs from Dask's default; ``overrides`` (a profile's ``dask_config:``) win over both."""
    import dask
    import distributed  # noqa: F401  (loads distributed's config defaults)

    values = {k: v for k, v in NETWORK_DASK_CONFIG.items() if dask.config.get(k, default=None) == _dask_default(k)}
    values.update({str(k): v for k, v in (overrides or {}).items()})
    with dask.config.set(values):
        yield


def _dask_default(key: str):
    """The value Dask itself ships for a dotted configuration key (None when it has none)."""
    import dask
    import distributed  # noqa: F401  (registers distributed's defaults)

    return dask.config.get(key, default=None, config=dask.config.merge(*dask.config.defaults))


@contextlib.contextmanager
def local_housekeeping(overrides: dict | None = None):
    """While a local cluster starts in this block (its scheduler and nannies read their intervals when made;
    each nanny hands its workers the configuration it was made with, restarts included), Dask's
    housekeeping intervals are :data:`LOCAL_DASK_CONFIG`, except where the user's Dask configuration already
    differs from Dask's default; ``overrides`` (a profile's ``dask_config:``) win over both."""
    import dask
    import distributed  # noqa: F401  (loads distributed's config defaults)

    values = {k: v for k, v in LOCAL_DASK_CONFIG.items() if dask.config.get(k, default=None) == _dask_default(k)}
    values.update({str(k): v for k, v in (overrides or {}).items()})
    with dask.config.set(values):
        yield


@contextlib.contextmanager
def local_start(env: dict | None = None, dask_config: dict | None = None):
    """How pgmflow starts a local cluster (``open_cluster``, and the benchmarks that measure its workers):
    :func:`worker_malloc` with ``env`` and :func:`local_housekeeping` with ``dask_config`` around the start."""
    with worker_malloc(env), local_housekeeping(dask_config):
        yield


@functools.lru_cache(maxsize=1)
def _local_keys() -> frozenset[str]:
    """Keys a ``local`` profile may hold: options of LocalCluster and of its Nanny/Worker processes
    (imports distributed, so it is asked only about keys outside LOCAL_KEYS)."""
    import inspect

    from distributed import LocalCluster, Nanny, Worker

    keys = set()
    for cls in (LocalCluster, Nanny, Worker):
        keys |= {
            n
            for n, prm in inspect.signature(cls.__init__).parameters.items()
            if prm.kind not in (prm.VAR_KEYWORD, prm.VAR_POSITIONAL) and n != "self"
        }
    return frozenset(keys | {"type", "tls"})


def _check_memory_limit(field: str, v, name: str):
    if v is None or v == "auto":
        return
    if isinstance(v, bool):
        ok = False
    elif isinstance(v, numbers.Real):
        ok = math.isfinite(v) and v > 0
    elif isinstance(v, str):
        from dask.utils import parse_bytes

        try:
            ok = parse_bytes(v) > 0
        except (ValueError, TypeError):
            ok = False
    else:
        ok = False
    if not ok:
        raise ConfigError(
            field,
            v,
            "must be 'auto', null, a size such as 4GB, a number of bytes, or a fraction "
            "of the machine's memory (0 < x <= 1)",
            f"set memory_limit: auto or e.g. 4GB in profile {name}",
        )


def _check_address(field: str, address, fix: str):
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(field, address, "must be a scheduler address such as tcp://HOST:8786", fix)
    rest = address
    for scheme in SCHEMES:
        if address.startswith(scheme):
            rest = address[len(scheme) :]
            break
    else:
        if "://" in address:
            raise ConfigError(field, address, f"unknown protocol; expected one of {', '.join(SCHEMES)}", fix)
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(field, address, "must end in :PORT (a number between 1 and 65535)", fix)


def _check_dask_config(path: Path, name: str, prof: dict):
    dcfg = prof.get("dask_config", {})
    if dcfg is None:
        return
    if not isinstance(dcfg, dict) or not all(isinstance(k, str) and "." in k for k in dcfg):
        raise ConfigError(
            _field(path, name, "dask_config"),
            dcfg,
            "must be a mapping of dotted Dask configuration keys to values",
            "write dask_config: {distributed.worker.profile.interval: 10ms}",
        )


def _check_profile(path: Path, name: str, prof: dict, ccfg: dict):
    """Key names and types of the selected profile (the cluster classes would fail later, less clearly)."""
    kind = prof["type"]
    fix_n = f"set n_workers: null (one per core) or e.g. 2 in profile {name} of {path}"
    if kind == "local":
        for key, value in prof.items():
            if key not in LOCAL_KEYS and key not in _local_keys():
                raise _unknown(
                    f"{path.name}:profiles.{name}",
                    key,
                    value,
                    _local_keys(),
                    listed=[*LOCAL_KEYS[2:], "(or any option of distributed.LocalCluster)"],
                )
        _positive_int_or_null(_field(path, name, "n_workers"), prof.get("n_workers"), fix_n)
        _positive_int_or_null(
            _field(path, name, "threads_per_worker"),
            prof.get("threads_per_worker"),
            f"set threads_per_worker: 1 in profile {name} of {path}",
        )
        _check_memory_limit(_field(path, name, "memory_limit"), prof.get("memory_limit"), name)
        if prof.get("processes", True) is not True:
            raise ConfigError(
                _field(path, name, "processes"),
                prof["processes"],
                "pgmflow runs its workers as processes (numba kernels hold the GIL)",
                "drop the key, or use cluster.profile=synchronous to run everything in this process",
            )
        if not isinstance(prof.get("env", {}), dict):
            raise ConfigError(
                _field(path, name, "env"),
                prof["env"],
                "must be a mapping of environment variables for the workers",
                "write env: {NAME: value}",
            )
        _check_dask_config(path, name, prof)
    elif kind == "address":
        for key, value in prof.items():
            if key not in ADDRESS_KEYS:
                raise _unknown(f"{path.name}:profiles.{name}", key, value, ADDRESS_KEYS)
        _check_dask_config(path, name, prof)
        t = prof.get("timeout", 10)
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t <= 0:
            raise ConfigError(
                _field(path, name, "timeout"),
                t,
                "must be a positive number of seconds",
                f"set timeout: 10 in profile {name} of {path}",
            )
        if ccfg.get("address") is not None:
            _check_address("cluster.address", ccfg["address"], "set cluster.address=tcp://HOST:PORT")
        else:
            _check_address(
                _field(path, name, "address"),
                prof.get("address"),
                f"set address: tcp://HOST:8786 in profile {name}, or cluster.address=tcp://HOST:PORT",
            )
    if "tls" in prof and kind not in TLS_TYPES:
        raise ConfigError(
            _field(path, name, "tls"),
            prof["tls"],
            f"TLS is configured here for the {', '.join(TLS_TYPES)} types only, not {kind}",
            "configure TLS in the cluster class's own options, or use a local or address profile",
        )
    if kind == "address":
        address = ccfg.get("address") or prof.get("address")
        field = "cluster.address" if ccfg.get("address") else _field(path, name, "address")
        if prof.get("tls") is not None and not address.startswith("tls://"):
            raise ConfigError(
                field,
                address,
                f"profile {name} has a tls: block, so the scheduler speaks TLS",
                f"use the tls:// address of the scheduler (tls://{address.split('://')[-1]})",
            )
        if address.startswith("tls://") and prof.get("tls") is None and not _dask_tls_configured():
            raise ConfigError(
                field,
                address,
                f"a tls:// scheduler needs certificates and profile {name} has none",
                f"add a tls: block (ca_file, cert, key) to profile {name} of {path}",
            )


def _dask_tls_configured() -> bool:
    """Certificates given through Dask's own configuration (DASK_DISTRIBUTED__COMM__TLS__...)."""
    import dask
    import distributed  # noqa: F401  (loads distributed's config defaults)

    return bool(
        dask.config.get("distributed.comm.tls.ca-file", None)
        and dask.config.get("distributed.comm.tls.client.cert", None)
    )


def _options(ccfg: dict) -> dict:
    """``cluster.options.*``: profile options set on the command line (null: the profile's value)."""
    options = ccfg.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(
            "cluster.options",
            options,
            "must be a mapping of profile options",
            "set single options, e.g. cluster.options.cores=2 (+cluster.options.KEY=VALUE for others)",
        )
    if options.get("type") is not None:
        raise ConfigError(
            "cluster.options.type",
            options["type"],
            "the type belongs to the profile",
            "choose another profile with cluster.profile=NAME",
        )
    return {str(k): v for k, v in options.items() if v is not None}


def check_cluster_config(ccfg: dict) -> dict:
    """Validate the cluster section; returns the selected profile (dict; a tls block with resolved paths)."""
    file = ccfg.get("file") or "dask_cluster.yaml"
    if not isinstance(file, str):
        raise ConfigError("cluster.file", file, "must be the path of a cluster file", "set cluster.file=PATH.yaml")
    path, profiles = load_profiles(file)
    name = ccfg.get("profile") or "local"
    if name not in profiles:
        raise ConfigError(
            "cluster.profile",
            name,
            f"no such profile in {path}",
            f"use one of {', '.join(map(str, profiles))} or add it to the file",
        )
    limit = ccfg.get("reconnect_limit", 600)
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not math.isfinite(limit) or limit < 0:
        raise ConfigError(
            "cluster.reconnect_limit",
            limit,
            "must be a number of seconds, 0 or more",
            "set cluster.reconnect_limit=600 (0: a run that loses its scheduler fails at once)",
        )
    smallwork.mode(ccfg)  # cluster.in_process: auto | false
    n = ccfg.get("n_workers")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(
            "cluster.n_workers",
            n,
            "must be a positive integer or null",
            "set cluster.n_workers=null (one per core) or e.g. cluster.n_workers=2",
        )
    prof = dict(profiles[name])
    options = _options(ccfg)
    prof.update(options)
    extra = EXTRAS.get(prof["type"])
    if extra and importlib.util.find_spec(extra[0]) is None:
        raise ConfigError(
            "cluster.profile",
            name,
            f"needs the optional package {extra[0].replace('_', '-')}, which is not installed",
            f"pip install 'pgmflow[{extra[1]}]'",
        )
    if prof["type"] in ("slurm", "pbs"):
        from pgmflow.core import slurm

        slurm.check_profile(path, name, prof, options)
    else:
        try:
            _check_profile(path, name, prof, ccfg)
        except ConfigError as exc:  # name a value set on the command line as it was set there
            key = exc.field.rsplit(".", 1)[-1]
            if key in options and exc.field == _field(path, name, key):
                raise ConfigError(f"cluster.options.{key}", exc.value, exc.problem, exc.fix) from None
            raise
    if prof.get("tls") is not None:
        prof["tls"] = check_tls(path, name, prof["tls"])
    return prof


def security_for(ccfg: dict):
    """The Security of the configured profile (None without a tls block): what a client of the cluster
    that :func:`open_cluster` opened (e.g. a sweep job) needs to connect."""
    return make_security(check_cluster_config(ccfg).get("tls"))


_FILTER = KilledWorkerLogFilter()


def _quiet_logs():
    for name in (
        "distributed",
        "distributed.nanny",
        "distributed.scheduler",
        "distributed.worker",
        "distributed.core",
        "distributed.batched",
        "distributed.http.proxy",
        "bokeh",
        "tornado",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    if _FILTER not in logging.getLogger("distributed.scheduler").filters:
        logging.getLogger("distributed.scheduler").addFilter(_FILTER)


def _address_error(name: str, address: str, timeout, exc: BaseException) -> ConfigError:
    """One line for a failed connection to an existing scheduler: why, and what to change."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    field = "cluster.address"
    if "certificate" in low or "ssl" in low or "tls" in low:
        return ConfigError(
            field,
            address,
            f"the scheduler refused the TLS handshake ({' '.join(text.split())[:160]})",
            f"use certificates signed by the scheduler's CA in the tls: block of profile {name}",
        )
    if "reset by peer" in low or "stream is closed" in low:
        return ConfigError(
            field,
            address,
            "the scheduler closed the connection (it may require TLS)",
            f"if the scheduler uses TLS, use its tls:// address and add a tls: block to profile {name}",
        )
    return ConfigError(
        field,
        address,
        f"no Dask scheduler answered within {timeout} s ({type(exc).__name__})",
        "start one with `dask scheduler` and `dask worker <address>`, or set cluster.address=tcp://HOST:PORT",
    )


def in_process_handle(ccfg: dict) -> ClusterHandle:
    """The handle of a run whose small work runs in this process (``pgmflow.core.smallwork``): no client,
    the configured profile's name, type ``in_process``, one worker (this process)."""
    return ClusterHandle(client=None, profile=ccfg.get("profile") or "local", type="in_process", n_workers=1)


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

    security = make_security(prof.pop("tls", None))
    tags, want = {}, None
    with contextlib.ExitStack() as stack:
        # the network settings hold for the whole run (every connection the client makes reads them); a local
        # profile's dask_config: is applied again over its housekeeping below
        stack.enter_context(network_timeouts(prof.get("dask_config") if kind in ("local", "address") else None))
        if kind == "address":
            prof.pop("dask_config", None)
        cluster = None
        if kind == "local":
            from distributed import LocalCluster

            n = n_override or prof.pop("n_workers", None) or os.cpu_count() or 1
            prof.pop("n_workers", None)
            tpw = prof.pop("threads_per_worker", 1) or 1
            env = {
                "NUMBA_NUM_THREADS": str(tpw),
                "OMP_NUM_THREADS": str(tpw),
                "MKL_NUM_THREADS": str(tpw),
                "OPENBLAS_NUM_THREADS": str(tpw),
            }
            cwd = os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd())
            env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
            env.update({str(k): str(v) for k, v in (prof.pop("env", None) or {}).items()})
            prof.pop("processes", None)
            prof.pop("silence_logs", None)
            if security is not None:
                prof.setdefault("protocol", "tls://")
                prof.setdefault("host", "127.0.0.1")
                prof["security"] = security
            with local_start(env, prof.pop("dask_config", None)):
                cluster = stack.enter_context(
                    LocalCluster(
                        n_workers=int(n),
                        threads_per_worker=int(tpw),
                        processes=True,
                        silence_logs=logging.ERROR,
                        env=env,
                        **prof,
                    )
                )
            client = stack.enter_context(Client(cluster, security=security))
        elif kind == "address":
            address = ccfg.get("address") or prof.get("address")
            timeout = prof.get("timeout", 10)
            try:
                client = stack.enter_context(Client(address, timeout=timeout, security=security))
            except (OSError, TimeoutError) as exc:
                raise _address_error(name, address, timeout, exc) from None
        elif kind in ("slurm", "pbs"):
            from pgmflow.core import slurm

            client, tags, want = slurm.open_jobqueue(
                stack, name, kind, prof, n_override, ccfg.get("file"), _options(ccfg)
            )
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
        yield ClusterHandle(
            client=client,
            profile=name,
            type=kind,
            n_workers=max(n_workers, 1),
            address=getattr(client.scheduler, "address", None),
            tags=tags,
            want=want,
        )
