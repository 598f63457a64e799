"""``pgmflow cluster start|status|stop``: a local Dask cluster that outlives one run (docs/clusters.md).

Every run on the ``local`` profile starts a ``distributed.LocalCluster`` and stops it at the end: 1-2 s on a
2-core machine (benchmarks/startup.py, the "local" against the "sync" column), which is most of a small
run's own time. ``pgmflow cluster start`` starts that same cluster (the ``local`` profile of the cluster file,
with pgmflow's worker environment and Dask settings: ``pgmflow.core.cluster.open_cluster``) in a background
process that keeps it until ``pgmflow cluster stop``; runs use it through the ``address`` profile::

    pgmflow cluster start                       # or: pgmflow cluster start --workers 2
    pgmflow debug=default cluster.profile=address cluster.address=tcp://127.0.0.1:PORT
    pgmflow cluster stop

The cluster's address, process id and worker count are kept in ``.pgmflow/cluster.json`` of the working
directory (a project's cluster; the workers import from that directory, as a local run's do). The results
are those of a run on a fresh local cluster with the same workers: pgmflow's tasks depend on their
identity only, never on a worker's history.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pgmflow.core.errors import EXIT_BAD_INPUT
from pgmflow.core.warm_base import _alive  # (one check of a background process, shared with the warm server)

USAGE = "usage: pgmflow cluster start [--workers N] | pgmflow cluster status | pgmflow cluster stop"
START_TIMEOUT_S = 120.0


def state_path() -> Path:
    return Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd())) / ".pgmflow" / "cluster.json"


def read_state() -> dict | None:
    """The running cluster's record, or None (no record, or its process is gone: the stale record is removed)."""
    path = state_path()
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not _alive(int(state.get("pid", -1))):
        path.unlink(missing_ok=True)
        return None
    return state


def _use_line(state: dict) -> str:
    return f"cluster.profile=address cluster.address={state['address']}"


def _start(workers: int | None) -> int:
    state = read_state()
    if state:
        print(f"pgmflow: a cluster is already running: {state['workers']} workers at {state['address']}")
        print(f"pgmflow: runs use it with: {_use_line(state)}")
        return 0
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.with_name("cluster.log")
    cmd = [sys.executable, "-m", "pgmflow.core.cluster_cli", "--serve", str(path)]
    if workers:
        cmd += ["--workers", str(workers)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state()
        if state and state.get("pid") == proc.pid:
            print(
                f"pgmflow: local cluster of {state['workers']} workers at {state['address']} (process {proc.pid},"
                f" dashboard {state.get('dashboard') or 'off'})"
            )
            print(f"pgmflow: runs use it with: {_use_line(state)}; stop it with: pgmflow cluster stop")
            return 0
        if proc.poll() is not None:
            tail = log.read_text()[-2000:].strip().splitlines()
            last = tail[-1] if tail else "no output"
            print(f"pgmflow: error: the cluster did not start: {last} (log: {log})", file=sys.stderr)
            return 1
        time.sleep(0.1)
    proc.terminate()
    print(f"pgmflow: error: the cluster did not start within {START_TIMEOUT_S:.0f} s (log: {log})", file=sys.stderr)
    return 1


def _status() -> int:
    state = read_state()
    if not state:
        print("pgmflow: no cluster running (start one with: pgmflow cluster start)")
        return 1
    up = time.time() - float(state.get("started", time.time()))
    print(
        f"pgmflow: {state['workers']} workers at {state['address']}, process {state['pid']}, up {up:.0f} s;"
        f" runs use it with: {_use_line(state)}"
    )
    return 0


def _stop() -> int:
    state = read_state()
    if not state:
        print("pgmflow: no cluster running")
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    state_path().unlink(missing_ok=True)
    print(f"pgmflow: stopped the cluster at {state['address']} (process {pid})")
    return 0


def _serve(path: Path, workers: int | None) -> int:
    """The background process: the local profile's cluster, kept until SIGTERM or SIGINT."""
    import threading

    from pgmflow.core import cluster as cluster_mod

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ccfg = {"file": "dask_cluster.yaml", "profile": "local", "n_workers": workers}
    with cluster_mod.open_cluster(ccfg) as ch:
        info = ch.client.scheduler_info()
        dashboard = ch.client.dashboard_link if info.get("services", {}).get("dashboard") else None
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "address": info["address"],
                    "workers": len(info.get("workers", {})),
                    "dashboard": dashboard,
                    "started": time.time(),
                }
            )
        )
        tmp.replace(path)
        while not stop.wait(1.0):
            pass
    path.unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    args = list(argv[1:]) if argv and argv[0] == "cluster" else list(argv)
    if args and args[0] == "--serve":
        workers = int(args[3]) if len(args) > 3 and args[2] == "--workers" else None
        return _serve(Path(args[1]), workers)
    if not args or args[0] not in ("start", "status", "stop"):
        what = repr(args[0]) if args else "no command"
        print(f"pgmflow: error: cluster: {what} is not a command; {USAGE}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args[0] == "start":
        rest = args[1:]
        workers = None
        if rest:
            if len(rest) != 2 or rest[0] != "--workers" or not rest[1].isdigit() or int(rest[1]) < 1:
                print(
                    f"pgmflow: error: cluster start: {' '.join(rest)!r} is not --workers N (N >= 1); {USAGE}",
                    file=sys.stderr,
                )
                return EXIT_BAD_INPUT
            workers = int(rest[1])
        return _start(workers)
    if len(args) > 1:
        print(
            f"pgmflow: error: cluster {args[0]} takes no arguments, got {' '.join(args[1:])!r}; {USAGE}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return _status() if args[0] == "status" else _stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
